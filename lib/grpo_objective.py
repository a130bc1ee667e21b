"""
GRPO's variants, built once at set-up from train_grpo.py's flags, so that its rollout and its update read top to
bottom with no flag of their own (the math: core/objectives.py).

  Reward     what a rollout's completions earn: the detector's P(natural) (of the sequence, or per token from a
             per-position head), its log-ratio (--reward logit), or the ideal detector's log-ratio of a trunk LM to
             the reference (--reward trunk_ratio); then shaped, in this order: the degeneracy guard, the null
             arm's shuffle within groups, the KL to the reference inside the reward (--kl_in_reward, β = --beta)
  LossTerms  the update's loss: the clipped policy gradient with its k3 leash (β = --beta, or 0 when the KL is
             in the reward), the entropy floor, the MLE term on natural windows (ptx)

and the policy's forward under DistributedDataParallel (TokenLogProbs), and the detector's score on fixed prompts.
"""
from dataclasses import dataclass
from typing import NamedTuple, Optional

import numpy as np
import torch
import torch.nn as nn

from core.objectives import (degenerate_mask, entropy_floor_penalty, group_advantages, grpo_loss, guard_degenerate,
                             kl_penalised_rewards, logit_rewards, shuffle_within_groups, token_rewards,
                             trunk_ratio_rewards)
from engine import Engine


class Rollout(NamedTuple):
    """One step's sampled sequences, as the reward reads them."""
    seqs: torch.Tensor  # (B, seq_len) prompt + completion
    plen: int  # the step's prompt length
    step: int
    ref_logp: torch.Tensor  # (B, seq_len - plen) the reference's log-probs of the completion
    micro: int  # rows per forward chunk


def completion_logprobs(gpt, seqs, plen, micro, temperature, entropy=False):
    """log-probs (B, seq_len - plen) of the completion tokens at `temperature` (and the entropies
    there, or None), in chunks of `micro` rows."""
    inp, tgt = seqs[:, :-1], seqs[:, 1:]
    # column t predicts token t+1: the completion tokens are columns plen-1 .., the only ones through the head
    out = [gpt.token_logprobs(inp[s:s + micro], tgt[s:s + micro], return_entropy=entropy, temperature=temperature,
                              start=plen - 1) for s in range(0, seqs.size(0), micro)]
    if not entropy:
        return torch.cat(out).float(), None
    return torch.cat([o[0] for o in out]).float(), torch.cat([o[1] for o in out]).float()


@dataclass(frozen=True)
class Reward:
    """--reward at --reward_level, shaped by the guard, the shuffle and the KL (see the module's docstring)."""
    kind: str  # p_natural, logit or trunk_ratio
    per_token: bool  # --reward_level token: the advantages are per completion token
    temperature: float  # the rollouts' (the log-probs of the KL and of the trunk are taken at it)
    group_size: int
    rows: int  # prompts_per_step x group_size: the step's rows over every process (the shuffle's draw)
    seed: int
    guard: bool  # a degenerate completion (degenerate_mask's defaults, as the frontier's degenerate share) pays nothing
    shuffle: bool  # the null arm
    kl_beta: Optional[float]  # β of the KL inside the reward, or None: the KL is the loss's leash
    scale_std: bool  # --advantage std: (r - group mean) / group std (GRPO); mean: r - group mean (Dr. GRPO)

    @classmethod
    def from_args(cls, args):
        return cls(args.reward, args.reward_level == "token", args.temperature, args.group_size,
                   args.prompts_per_step * args.group_size, args.seed,
                   not args.no_degeneracy_guard, args.shuffle_rewards, args.beta if args.kl_in_reward else None,
                   args.advantage == "std")

    def score(self, scorer, roll, detector_len):
        """(sequence rewards (B,), the rewards the advantages are taken of: (B,) or per completion token
        (B, seq_len - plen), the completion reward (B,)). `scorer`: the detector, or the trunk LM for trunk_ratio.
        The completion reward is the run's logged signal: the prompt's positions are natural text whatever the
        policy does, and their share of P(natural) moves with each step's prompt length; the log-ratio rewards
        already count the completion alone."""
        seqs, plen = roll.seqs, roll.plen
        level = "token" if self.per_token else "sequence"
        if self.kind == "trunk_ratio":
            trunk_logp, _ = completion_logprobs(scorer, seqs, plen, roll.micro, self.temperature)
            rewards = trunk_ratio_rewards(trunk_logp, roll.ref_logp)
            per = trunk_ratio_rewards(trunk_logp, roll.ref_logp, level) if self.per_token else rewards
            return rewards, per, rewards
        if self.kind == "logit":
            logits = scorer.position_logits(seqs).float()
            logits = logits[..., 0] - logits[..., 1]  # log D / (1 - D), without forming D
            rewards = logit_rewards(logits, plen, detector_len)
            return rewards, logit_rewards(logits, plen, detector_len, level) if self.per_token else rewards, rewards
        if scorer.config.reward_per_position:
            pos_p = scorer.position_probs(seqs).float()
            rewards = pos_p.mean(dim=1)  # what scorer(seqs) gives
            return rewards, token_rewards(pos_p, plen) if self.per_token else rewards, pos_p[:, plen:].mean(dim=1)
        rewards = scorer(seqs)[0][:, 0].float()  # the last-token head: the last (generated) token
        return rewards, rewards, rewards

    def shape(self, rewards, roll, dist, policy_model):
        """The rewards the advantages are taken of, shaped: a degenerate completion gets P(natural)'s 0, or a
        log-ratio's lowest in its group (before any shuffle); the null arm's rewards are permuted within each
        group (drawn for every process's rows at once and sliced, as the prompts are: the same run on any number
        of processes); the KL to the reference, under the sampling policy's own log-probs, comes off the reward."""
        if self.guard:
            degenerate = degenerate_mask(roll.seqs[:, roll.plen:])
            floor = 0.0 if self.kind == "p_natural" else None
            rewards = guard_degenerate(rewards, degenerate, self.group_size, floor)
        if self.shuffle:
            rng = np.random.default_rng([self.seed, roll.step, 3])
            everyone = shuffle_within_groups(self.rows, self.group_size, rng)
            rewards = rewards[(dist.my_slice(everyone) - dist.rank * roll.seqs.size(0)).to(rewards.device)]
        if self.kl_beta is not None:
            logp, _ = completion_logprobs(policy_model, roll.seqs, roll.plen, roll.micro, self.temperature)
            rewards = kl_penalised_rewards(rewards, logp, roll.ref_logp, self.kl_beta)
        return rewards

    def advantages(self, rewards):
        """Group-relative advantages of the shaped rewards: (B,), or (B, completion length) per token."""
        return group_advantages(rewards, self.group_size, scale_std=self.scale_std)


@dataclass(frozen=True)
class LossTerms:
    """The update's loss on a chunk of rows (see the module's docstring)."""
    clip_eps: float
    kl_coef: float  # β of the k3 leash in the loss (0 when the KL is in the reward)
    entropy_floor: float  # 0: off
    ptx_coef: float  # 0: off
    ptx_rows: int  # natural windows a step for the ptx term (0 when off)

    @classmethod
    def from_args(cls, args):
        return cls(args.clip_eps, 0.0 if args.kl_in_reward else args.beta, args.entropy_floor, args.ptx_coef,
                   (args.ptx_rows or args.prompts_per_step) if args.ptx_coef > 0 else 0)

    def wants_entropy(self, update):
        """Whether the policy's entropies are needed on this update of a batch: the first (logged), or every one
        under the entropy floor."""
        return update == 0 or self.entropy_floor > 0

    def policy_loss(self, logp, old_logp, ref_logp, adv, ent, ref_ent):
        """(loss, stats) of a chunk: GRPO's clipped objective with its leash, plus the entropy floor's penalty
        (stats["entropy_penalty"]) where it is on."""
        loss, stats = grpo_loss(logp, old_logp, ref_logp, adv, self.clip_eps, self.kl_coef)
        if self.entropy_floor > 0:
            pen = entropy_floor_penalty(ent.float(), ref_ent)
            loss = loss + self.entropy_floor * pen
            stats = {**stats, "entropy_penalty": pen.item()}
        return loss, stats


# ---------------------------------------------------------------- the policy's forward, the detector's eval score

class TokenLogProbs(nn.Module):
    """forward() = GPT.token_logprobs, as (log-probs, entropies or None) either way, so DistributedDataParallel
    (which hooks forward) all-reduces the gradients of the GRPO loss."""

    def __init__(self, gpt):
        super().__init__()
        self.gpt = gpt

    def forward(self, idx, targets, return_entropy=False, temperature=1.0, start=0):
        out = self.gpt.token_logprobs(idx, targets, return_entropy=return_entropy, temperature=temperature,
                                      start=start)
        return out if return_entropy else (out, None)


@torch.no_grad()
def detector_score(policy, reward_model, prompts, seq_len, uniforms, batch_size=64, temperature=1.0):
    """Mean P(natural) the reward model gives to the policy's completions of `prompts`, sampled at
    `temperature` (the rollouts') with the fixed `uniforms`, so the score only moves when the policy does."""
    was = policy.training
    policy.eval()
    total, engine = 0.0, Engine(policy)  # one engine: its decoders serve every batch
    for s in range(0, prompts.size(0), batch_size):
        seqs = engine.generate(prompts[s:s + batch_size], seq_len - prompts.size(1), temperature=temperature,
                               uniforms=uniforms[s:s + batch_size])
        total += reward_model(seqs)[0][:, 0].float().sum().item()
    policy.train(was)
    return total / prompts.size(0)
