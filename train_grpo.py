"""
GRPO fine-tuning of a generator against a frozen reward model (reward = P(natural), or with
--reward logit the detector's log-ratio log p_data / p_generator; see docs/design.md section 3).

Each step takes --prompts_per_step prompts of one random length P_len in
[1, seq_len/2] from the base model's TRAIN split, samples --group_size completions
per prompt in one batched, KV-cached generate call up to seq_len tokens (so every
sequence in the step has the same length and the reward model cannot be gamed by
length), scores them with the reward model and takes a clipped policy-gradient step
with group-relative advantages and a k3 KL penalty towards the frozen starting
model (see core/objectives.py for the math).

    python train_grpo.py --model_path out/ckpt.pt \
        --reward_model_path out-reward/reward_ckpt.pt --out_dir out-grpo

Writes out_dir/ckpt.pt (a normal generator checkpoint every other script accepts,
plus the GRPO state for --resume), metrics.jsonl, grpo_curves.png and
grpo_summary.json. DDP: torchrun --nproc_per_node=N train_grpo.py ...
"""
import collections
import contextlib
import json
import math
import os
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from tqdm import tqdm

from core.cli import progress_bar, run_cli
from core.devices import all_mean, clip_and_step, synchronize, wrap_ddp
from core.errors import CheckpointError, DataError, ProjectError, check_finite
from core.files import atomic_write_text, read_jsonl
from core.objectives import degenerate_mask, zero_spread_fraction
from core.plots import plot_grpo_curves
from core.schedule import EarlyStopping
from core.training import finish, kept_records, open_run
from engine import Engine, decode_status
from lib import finetune
from lib.checkpoint import (checkpoint_tokenization, load_model, model_from_checkpoint, model_shape,
                            own_checkpoint_to_resume, read_checkpoint, sequence_length)
from lib.grpo_objective import LossTerms, Reward, Rollout, TokenLogProbs, completion_logprobs, detector_score
from lib.heldout import evaluate_loss, make_eval_loader
from lib.hf_interop import source_sha256
from lib.finetune import FinetuneRun, FinetuneState
from lib.rl_data import prompt_corpus, sample_prompts, step_prompt_len
from lib.rl_settings import grpo_args as get_args
from tokenization_manager import TokenizationManager, check_tokenization_match

CKPT_NAME = "ckpt.pt"
METRICS_NAME = "metrics.jsonl"
SUMMARY_NAME = "grpo_summary.json"
PLOT_NAME = "grpo_curves.png"


# ----------------------------------------------------------------------------- state

@dataclass
class GRPOState(FinetuneState):
    """Everything the training loop changes, passed explicitly to evaluate() and save(): the step, stop
    reason, val history and finished flag of every fine-tuning loop (lib/finetune.py) and GRPO's own.

    There is no RNG state to carry: step i's prompt length, prompts and sampling noise are
    drawn from (--seed, i) alone (see step_inputs), so `step` is the RNG state and a
    resumed run repeats the straight one exactly."""
    rewards_hist: list = field(default_factory=list)  # global mean reward per step (window, summary)
    stopper: EarlyStopping = None  # the reward-plateau rule
    updates: int = 0  # optimizer steps so far: the budget run_cycles' MLE control arm matches
    completion_tokens: int = 0  # completion tokens generated so far, over all processes
    last_batch: tuple = None  # (seqs, prompt_len, rewards) of the last step, for eval samples; not saved

    def to_dict(self):
        return {**super().to_dict(), "rewards": self.rewards_hist, "stopper": self.stopper.state_dict(),
                "updates": self.updates, "completion_tokens": self.completion_tokens}

    @classmethod
    def from_dict(cls, d, stopper, num_updates_per_batch=1):
        """The state a checkpoint's "grpo" record holds. Checkpoints written before the budget
        counters were saved: updates = steps x --num_updates_per_batch, and completion_tokens
        None (write_summary then counts them from metrics.jsonl, as it used to)."""
        stopper.load_state_dict(d.get("stopper", {}))
        step = int(d["step"])
        return cls(**cls.fields_from_dict(d), rewards_hist=list(d.get("rewards", [])), stopper=stopper,
                   updates=int(d.get("updates", step * num_updates_per_batch)),
                   completion_tokens=d.get("completion_tokens"))


@dataclass
class EvalSet:
    """What evaluate() measures the policy on, fixed for the whole run: the val split (at the
    policy's block size) and fixed val prompts with fixed sampling noise for the reward model."""
    val_loader: object
    prompts: torch.Tensor  # (eval_reward_samples, seq_len // 4) val prompts
    uniforms: torch.Tensor  # (eval_reward_samples, seq_len) sampling noise
    seq_len: int


@dataclass
class Batch:
    """One step's rollout on this process: B = prompts x group_size sequences of seq_len."""
    seqs: torch.Tensor  # (B, seq_len) prompt + completion
    plen: int  # the step's prompt length
    rewards: torch.Tensor  # (B,) the reward model's P(natural), as the advantages use it
    comp_rewards: torch.Tensor  # (B,) P(natural) over the completion's positions only (the step's signal)
    adv: torch.Tensor  # (B,) or (B, seq_len - plen) advantages
    ref_logp: torch.Tensor  # (B, seq_len - plen) log-probs of the completion under the reference
    gen_s: float  # seconds spent sampling
    ref_ent: torch.Tensor = None  # (B, seq_len - plen) the reference's entropies there (--entropy_floor)
    ptx: torch.Tensor = None  # (rows, seq_len) natural train windows for the MLE term (--ptx_coef)
    score_s: float = 0.0  # seconds spent scoring the rollouts (detector, reference) and their advantages


@dataclass(frozen=True, eq=False)
class GRPORun(FinetuneRun):
    """What set-up builds and the loop only reads (lib/finetune.py's FinetuneRun: flags, context, policy,
    optimizer, base checkpoint, probe, seq_len, ckpt_path) and GRPO's own models and data; the loop's
    changes all go to GRPOState."""
    ref: torch.nn.Module  # the frozen starting model: the KL's reference
    reward_model: torch.nn.Module  # the frozen detector (--reward trunk_ratio: the trunk LM)
    policy: torch.nn.Module  # TokenLogProbs of model (under torchrun: in DDP): what updates run
    train_data: np.ndarray  # the base model's train split: the step prompts
    tok: object  # TokenizationManager of the eval samples, or None
    evalset: EvalSet
    detector_len: int  # the block size the detector was trained on
    engine: Engine  # the policy's one Engine: its decoders (CUDA graphs) serve every rollout
    reward: Reward  # what a rollout earns (--reward, --reward_level, the guard, the shuffle, the KL in the reward)
    terms: LossTerms  # the update's loss (the KL leash, the entropy floor, ptx)


# ----------------------------------------------------------------------------- set-up

def load_models(args, device):
    """The base checkpoint, the frozen reference, the frozen reward model (with --reward trunk_ratio the
    trunk LM that stands in its place), the policy's tokenization record and the sequence length, checked
    against each other."""
    base_ckpt = read_checkpoint(args.model_path)
    ref, _ = model_from_checkpoint(base_ckpt, "generator", path=args.model_path,
                                   require_mode="generator", dropout=0.0)
    path = args.trunk_path if args.reward == "trunk_ratio" else args.reward_model_path
    reward_model, reward_ckpt, _ = load_model(path, device=device, require_mode="generator" if args.trunk_path
                                              else "reward")
    for need, flag in ((args.reward_level == "token" and not args.trunk_path, "--reward_level token"),
                       (args.reward == "logit", "--reward logit")):
        if need and not reward_model.config.reward_per_position:
            raise ProjectError(f"{flag} needs a per-position reward model, but {args.reward_model_path} has a "
                               f"last-token head", "train one with train_reward_model.py --per_position")
    tok_policy = checkpoint_tokenization(base_ckpt)
    tok_reward = checkpoint_tokenization(reward_ckpt)
    if tok_policy is not None and tok_reward is not None:
        check_tokenization_match(tok_reward, tok_policy, what=f"reward model {path}")
    if reward_model.config.vocab_size != ref.config.vocab_size:
        raise CheckpointError(f"the reward model's vocab_size ({reward_model.config.vocab_size}) differs "
                              f"from the policy's ({ref.config.vocab_size})",
                              "train the reward model from this generator (or one with its tokenization)")
    # the block size the detector's crossover labels were drawn over (its prior; objectives.log_ratio_increments);
    # the trunk's own context for trunk_ratio
    detector_len = sequence_length(reward_ckpt, path)
    seq_len = int(min(detector_len, ref.config.block_size)) if args.seq_len is None else args.seq_len
    max_len = min(ref.config.block_size, reward_model.config.block_size)
    if not 2 <= seq_len <= max_len:
        raise ProjectError(f"--seq_len {seq_len} must be in [2, {max_len}] (the block sizes of the "
                           f"policy and the reward model)", "choose a smaller --seq_len")
    return base_ckpt, ref, reward_model, tok_policy, seq_len, detector_len


def load_policy(args, base_ckpt, ckpt_path):
    """The policy to train: the base model, or with --resume (and out_dir/ckpt.pt present)
    the run's own checkpoint. Returns (model, own checkpoint or None)."""
    own = own_checkpoint_to_resume(ckpt_path, "grpo", "GRPO", args.model_path) if args.resume else None
    model, _ = model_from_checkpoint(own or base_ckpt, "generator", path=ckpt_path if own else args.model_path,
                                     require_mode="generator", dropout=args.dropout)
    return model, own


def load_data(args, ctx, base_ckpt, tok_policy, seq_len, block_size):
    """(train split, decoder or None, the probe sequence save() checks, the EvalSet) for the run of
    RunContext ctx."""
    corpus = prompt_corpus(base_ckpt.get("data"), args.data_dir)
    train_data, val_data = corpus.train, corpus.val
    if len(train_data) < seq_len:
        raise DataError(f"{corpus.train_bin} has {len(train_data)} tokens, fewer than --seq_len {seq_len}")
    probe = torch.from_numpy(train_data[:seq_len].astype(np.int64))[None].to(ctx.device)  # see save()
    tok = None
    if tok_policy is not None:
        try:
            tok = TokenizationManager(tok_policy.method, meta_path=tok_policy.meta_path)
        except ProjectError as e:
            if ctx.master:
                print(f"warning: samples will not be decoded ({e.message})")
    # val loss at the policy's own block size, comparable with train.py's numbers
    val_loader = make_eval_loader(corpus.val_bin, block_size, args.eval_batch_size)
    # fixed prompts (a quarter of the sequence, from val) and noise for the eval-time detector score
    eval_plen = max(1, seq_len // 4)
    eval_prompts = sample_prompts(val_data, eval_plen, args.eval_reward_samples,
                                  np.random.default_rng([args.seed, 7])).to(ctx.device)
    eval_uniforms = torch.rand((args.eval_reward_samples, seq_len),
                               generator=torch.Generator().manual_seed(args.seed + 7)).to(ctx.device)
    return train_data, tok, probe, EvalSet(val_loader, eval_prompts, eval_uniforms, seq_len)


def restore_state(run, own):
    """A fresh GRPOState, or the one in `own` (the --resume checkpoint) with run's optimizer restored."""
    stopper = EarlyStopping(run.args.patience, run.args.min_delta, mode="max")
    if own is None:
        return GRPOState(stopper=stopper)
    return finetune.restore(run, own, "grpo",
                            lambda d: GRPOState.from_dict(d, stopper, run.args.num_updates_per_batch))


# ----------------------------------------------------------------------------- one step

def step_inputs(run, step):
    """Step `step`'s prompt length, this rank's prompts and this rank's sampling noise."""
    args, seq_len, dist = run.args, run.seq_len, run.ctx.dist
    # one prompt length for the whole step on every rank (equal lengths -> no length games,
    # and equal token counts per rank keep DDP's gradient average token-level)
    plen = step_prompt_len(args.seed, step, seq_len)
    # the step's prompts and sampling noise are drawn for every rank's rows at once and
    # each rank takes its slice: step i is the same for any number of processes
    prompts = dist.my_slice(sample_prompts(run.train_data, plen, args.prompts_per_step,
                                           np.random.default_rng([args.seed, step, 1])))
    noise = torch.Generator().manual_seed(int(np.random.default_rng([args.seed, step, 2]).integers(2 ** 62)))
    U = dist.my_slice(torch.rand((args.prompts_per_step * args.group_size, seq_len), generator=noise))
    return plen, prompts, U


def rollout(state, run):
    """Sample a group of completions per prompt of step state.step, score them, and compute the
    advantages and the reference log-probs of the completion tokens -> Batch."""
    t0 = time.time()
    args, step, seq_len = run.args, state.step, run.seq_len
    amp, dist, device = run.ctx.amp, run.ctx.dist, run.ctx.device
    G = args.group_size
    plen, prompts, U = step_inputs(run, step)
    with amp:
        seqs = run.engine.generate(prompts.to(device).repeat_interleave(G, dim=0), seq_len - plen,
                                   temperature=args.temperature, uniforms=U.to(device))
    synchronize(device)  # the timings split at the GPU's pace
    gen_s = time.time() - t0
    micro = args.micro_batch_size or seqs.size(0)
    with torch.no_grad(), amp:
        ref_logp, ref_ent = completion_logprobs(run.ref, seqs, plen, micro, args.temperature,
                                                run.terms.entropy_floor > 0)
        roll = Rollout(seqs, plen, step, ref_logp, micro)
        rewards, adv_rewards, comp_rewards = run.reward.score(run.reward_model, roll, run.detector_len or seq_len)
        # a nan reward would silently become a zero advantage (no spread): stop instead
        check_finite(rewards.sum().item(), f"reward (the reward model's {run.reward.kind})", step)
        adv_rewards = run.reward.shape(adv_rewards, roll, dist, run.model)
    adv = run.reward.advantages(adv_rewards)  # (B,), or (B, completion length) per token
    ptx = None
    if run.terms.ptx_rows:  # natural train windows for the MLE term, drawn for every rank at once and sliced
        ptx = dist.my_slice(sample_prompts(run.train_data, seq_len, run.terms.ptx_rows,
                                           np.random.default_rng([args.seed, step, 4]))).to(device)
    synchronize(device)
    return Batch(seqs, plen, rewards, comp_rewards, adv, ref_logp, gen_s, ref_ent, ptx, time.time() - t0 - gen_s)


def train_step(state, run, batch):
    """--num_updates_per_batch optimizer steps on step state.step's Batch (gradient accumulation over
    --micro_batch_size chunks, through run.ctx's float16 gradient scaler) -> this rank's stats (loss,
    clip_frac, ratio_mean averaged over the updates; kl and entropy of the first pass; the last grad_norm)."""
    args, policy, optimizer, terms = run.args, run.policy, run.optimizer, run.terms
    dist, amp, scaler = run.ctx.dist, run.ctx.amp, run.ctx.scaler
    inp, tgt, plen = batch.seqs[:, :-1], batch.seqs[:, 1:], batch.plen
    B, n = batch.seqs.size(0), args.num_updates_per_batch
    chunks = list(range(0, B, args.micro_batch_size or B))
    old_logp = [None] * len(chunks)
    sums = collections.defaultdict(float)
    for upd in range(n):
        optimizer.zero_grad(set_to_none=True)
        for ci, s in enumerate(chunks):
            e = min(B, s + (args.micro_batch_size or B))
            w = (e - s) / B
            sync_ctx = policy.no_sync() if dist.enabled and ci < len(chunks) - 1 else contextlib.nullcontext()
            with sync_ctx:
                with amp:  # the completion's columns only (plen - 1 ..): the prompt's get no gradient
                    logp, ent = policy(inp[s:e], tgt[s:e], return_entropy=terms.wants_entropy(upd),
                                       temperature=args.temperature, start=plen - 1)
                logp = logp.float()
                if upd == 0:  # the policy has not moved yet: it IS the sampling policy
                    old_logp[ci] = logp.detach()
                    sums["entropy"] += ent.float().mean().item() * (e - s) / B
                ref_ent = None if batch.ref_ent is None else batch.ref_ent[s:e]
                loss, st = terms.policy_loss(logp, old_logp[ci], batch.ref_logp[s:e], batch.adv[s:e], ent, ref_ent)
                # token-level mean over the whole batch: every row has seq_len-plen tokens
                total = loss * (e - s) / B
                if batch.ptx is not None and ci == 0:  # once per update, in a chunk DDP does not sync yet
                    with amp:
                        nll = -policy(batch.ptx[:, :-1], batch.ptx[:, 1:])[0].float().mean()
                    total = total + terms.ptx_coef * nll
                    sums["ptx_loss"] += nll.item() / n
                scaler.scale(total).backward()
            check_finite(loss.item(), "GRPO loss", state.step)
            sums["loss"] += loss.item() * w
            sums["clip_frac"] += st["clip_frac"] * w
            sums["ratio_mean"] += st["ratio_mean"] * w
            if "entropy_penalty" in st:
                sums["entropy_penalty"] += st["entropy_penalty"] * w / n
            if upd == 0:
                sums["kl"] += st["kl"] * w
        grad_norm = clip_and_step(scaler, optimizer, run.model.parameters(), args.grad_clip)
    return {**sums, **{k: sums[k] / n for k in ("loss", "clip_frac", "ratio_mean")}, "grad_norm": float(grad_norm)}


def record_step(state, run, batch, stats, dt):
    """Average the step's numbers over ranks, advance the state (step, reward history,
    budget, last batch) and return the step's metrics record."""
    args, dist, device = run.args, run.ctx.dist, run.ctx.device
    G = args.group_size
    rewards = batch.rewards
    comp = batch.comp_rewards
    degen = degenerate_mask(batch.seqs[:, batch.plen:])
    r_mean, r_sq, c_mean, c_sq, zero_spread, degen_frac, kl, clip, ent, lossv, ratio_m = all_mean([
        rewards.mean().item(), (rewards ** 2).mean().item(), comp.mean().item(), (comp ** 2).mean().item(),
        zero_spread_fraction(rewards, G), degen.float().mean().item(), stats["kl"],
        stats["clip_frac"], stats["entropy"], stats["loss"], stats["ratio_mean"]], dist, device)
    n_tok = batch.seqs.size(0) * (run.seq_len - batch.plen) * dist.world_size
    state.step += 1
    state.updates += args.num_updates_per_batch
    if state.completion_tokens is not None:
        state.completion_tokens += n_tok
    state.rewards_hist.append(c_mean)  # the completion reward: the windows and stop rules use it
    state.last_batch = (batch.seqs.cpu(), batch.plen, rewards.cpu())
    window = state.rewards_hist[-args.reward_window:]
    return dict(kind="step", step=state.step, prompt_len=batch.plen, reward_mean=r_mean,
                reward_std=math.sqrt(max(0.0, r_sq - r_mean ** 2)), reward_completion=c_mean,
                reward_completion_std=math.sqrt(max(0.0, c_sq - c_mean ** 2)), reward_window=sum(window) / len(window),
                zero_spread_frac=zero_spread, kl=kl, clip_frac=clip, entropy=ent, loss=lossv,
                ratio_mean=ratio_m, grad_norm=stats["grad_norm"], degenerate_frac=degen_frac,
                tokens_per_s=n_tok / dt, gen_tokens_per_s=n_tok / max(batch.gen_s, 1e-9), step_time_s=dt,
                # where the step's time went: sampling, scoring (detector, reference, advantages), the update
                rollout_s=batch.gen_s, score_s=batch.score_s, update_s=max(0.0, dt - batch.gen_s - batch.score_s),
                **({"entropy_penalty": all_mean([stats["entropy_penalty"]], dist, device)[0]}
                   if "entropy_penalty" in stats else {}),
                **({"ptx_loss": all_mean([stats["ptx_loss"]], dist, device)[0]} if "ptx_loss" in stats else {}))


def stop_reason(state, args, rec):
    """Why to stop after the step `rec` describes, or None. Identical on every rank (all
    inputs are all-reduced); advances the plateau rule in state.stopper."""
    r_window, kl = rec["reward_window"], rec["kl"]
    if len(state.rewards_hist) >= args.reward_window:
        if args.reward_threshold > 0 and r_window >= args.reward_threshold:
            return f"reward_threshold (windowed mean {r_window:.4f} >= {args.reward_threshold})"
        state.stopper.step(r_window)
        if state.stopper.should_stop:
            return (f"reward_plateau (windowed mean not improved by {args.min_delta} "
                    f"for {args.patience} steps; best {state.stopper.best:.4f})")
    if args.kl_cap > 0 and kl > args.kl_cap:
        return f"kl_cap (KL {kl:.4f} > {args.kl_cap})"
    return None


# ----------------------------------------------------------------------------- evaluate, save, report

def bar_text(rec, state, args):
    """The progress bar's words after step `rec`: two rewards under their own names, this step's mean
    over whole sequences (what the advantages use; the natural prompt's positions count too) and the
    generated positions' mean over the last --reward_window steps (the windowed value the stop rules
    and the closing line report), the KL and the speed."""
    return (f"sequence reward (this step) {rec['reward_mean']:.3f}, completion reward (last "
            f"{min(len(state.rewards_hist), args.reward_window)} steps) {rec['reward_window']:.3f}, KL "
            f"{rec['kl']:.4f}, {rec['tokens_per_s']:.0f} tok/s")


def should_evaluate(state, args):
    """Every --eval_interval steps and at the end; a resumed finished run logged its last one."""
    return bool(state.step % args.eval_interval == 0 or state.stop_reason) and not state.finished


def evaluate(state, run):
    """Val loss/perplexity, the frozen reward model's mean P(natural) on the EvalSet's fixed
    prompts and noise, and decoded samples of the last step's batch (state.last_batch).
    Appends to state.val_hist and logs on the master; every rank waits for it. Returns the
    eval record (None on other ranks)."""
    args, ctx, evalset, tok = run.args, run.ctx, run.evalset, run.tok
    rec = None
    if ctx.master:
        val_loss, _ = evaluate_loss(run.model, evalset.val_loader, ctx.device, args.eval_max_batches, ctx.dtype)
        val_ppl = math.exp(val_loss)
        with ctx.amp:  # the rollouts' precision: their decoder and detector pass
            eval_reward = (detector_score(run.model, run.reward_model, evalset.prompts, evalset.seq_len,
                                          evalset.uniforms, temperature=args.temperature)
                           if args.eval_reward_samples > 0 else None)
        samples = []
        if state.last_batch is not None and tok is not None:
            seqs, plen, rew = state.last_batch
            for i in range(min(args.num_show, seqs.size(0) // args.group_size)):
                row = i * args.group_size  # first completion of each of the first prompts
                samples.append({"prompt": tok.decode(seqs[row, :plen]),
                                "completion": tok.decode(seqs[row, plen:]),
                                "reward": round(float(rew[row]), 4)})
        rec = dict(kind="eval", step=state.step, val_loss=val_loss, val_ppl=val_ppl, eval_reward=eval_reward,
                   samples=samples)
        if ctx.logger is not None:
            ctx.logger.log(**rec)
        state.val_hist.append({"step": state.step, "val_loss": val_loss, "val_ppl": val_ppl,
                               "eval_reward": eval_reward})
        tqdm.write(f"step {state.step}: val loss {val_loss:.4f}, perplexity {val_ppl:.2f}"
                   + ("" if eval_reward is None else f", reward-model P(natural) on fixed prompts "
                                                     f"{eval_reward:.4f}"))
        for s in samples:
            tqdm.write(f"  [reward {s['reward']:.3f}] {s['prompt']!r} -> {s['completion']!r}")
    if ctx.dist.enabled:
        torch.distributed.barrier()
    return rec


def save(state, run):
    """Write run.ckpt_path (finetune.save: a plain generator checkpoint) with state.to_dict() and the
    run's identity under "grpo" for --resume."""
    args, reward_path = run.args, run.args.trunk_path or run.args.reward_model_path
    d = state.to_dict()
    counters = {k: d.pop(k) for k in ("updates", "completion_tokens")}
    finetune.save(state, run, "grpo", {**d, "base_model": os.path.abspath(args.model_path),
                                       "base_sha256": run.base_sha, "reward_model": os.path.abspath(reward_path),
                                       "reward_sha256": source_sha256(reward_path), "seq_len": run.seq_len,
                                       **counters})


def write_summary(state, run):
    """grpo_summary.json and grpo_curves.png in --out_dir, and the run's result printed; the summary
    carries the policy's and the detector's model_shape for a FLOPs count."""
    args, seq_len, ckpt_path = run.args, run.seq_len, run.ckpt_path
    metrics_path = os.path.join(args.out_dir, METRICS_NAME)
    w = args.reward_window
    steps_done = [r for r in read_jsonl(metrics_path) if r.get("kind") == "step"]
    completion_tokens = state.completion_tokens
    if completion_tokens is None:  # resumed from a checkpoint without the counter
        completion_tokens = int(sum(args.prompts_per_step * args.group_size * (seq_len - r["prompt_len"])
                                    for r in steps_done))
    hist, vh = state.rewards_hist, state.val_hist
    summary = {
        "stop_reason": state.stop_reason, "steps": state.step, "reward_level": args.reward_level,
        "shuffle_rewards": args.shuffle_rewards, "prompt_split": "train",
        "reward": args.reward, "kl_in_reward": args.kl_in_reward, "advantage": args.advantage,
        "ptx_coef": args.ptx_coef, "ptx_rows": run.terms.ptx_rows,
        # the generator-side budget, which run_cycles' MLE control arm matches
        "updates": state.updates, "completion_tokens": completion_tokens, "seq_len": seq_len,
        # the mean completion reward (P(natural) over the generated positions) of the first/last steps
        "reward_start": float(np.mean(hist[:w])) if hist else None,
        "reward_end": float(np.mean(hist[-w:])) if hist else None,
        "kl_final": steps_done[-1]["kl"] if steps_done else None,
        # the frozen reward model's mean P(natural) on completions of fixed val prompts
        "eval_reward_start": vh[0].get("eval_reward") if vh else None,
        "eval_reward_end": vh[-1].get("eval_reward") if vh else None,
        **finetune.val_summary(vh),
        "checkpoint": None if args.no_save else os.path.abspath(ckpt_path),
        # the decoder the rollouts ran (a compile that failed decoded uncompiled: bench/bench_grpo_step.py says so)
        "decode": decode_status(),
        # what a FLOPs count of the run needs (experiment/flops.py), beside the budget above
        "rows_per_step": args.prompts_per_step * args.group_size,
        **model_shape(run.model), "detector": model_shape(run.reward_model),
    }
    atomic_write_text(os.path.join(args.out_dir, SUMMARY_NAME), json.dumps(summary, indent=2) + "\n")
    plot_grpo_curves(read_jsonl(metrics_path), os.path.join(args.out_dir, PLOT_NAME),
                     title=f"GRPO: {os.path.basename(os.path.abspath(args.out_dir))}")
    fmt = lambda v, f: "n/a" if v is None else format(v, f)  # noqa: E731
    print(f"stopped after {state.step} steps: {state.stop_reason}")
    k = min(w, len(hist))  # the window of the progress bar's 'completion reward (last k steps)'
    print(f"completion reward (the detector's reward of the generated positions, mean over steps): "
          f"{fmt(summary['reward_start'], '.4f')} (first {k} steps) -> {fmt(summary['reward_end'], '.4f')} (last {k} "
          f"steps); final KL {fmt(summary['kl_final'], '.4f')}")
    print(f"reward-model P(natural) on fixed val prompts {fmt(summary['eval_reward_start'], '.4f')} -> "
          f"{fmt(summary['eval_reward_end'], '.4f')}")
    print(f"val loss {fmt(summary['val_loss_before'], '.4f')} -> {fmt(summary['val_loss_after'], '.4f')}, "
          f"perplexity {fmt(summary['val_ppl_before'], '.2f')} -> {fmt(summary['val_ppl_after'], '.2f')}")
    print(f"wrote {'' if args.no_save else ckpt_path + ', '}{metrics_path}, {os.path.join(args.out_dir, PLOT_NAME)}")
    return summary


# ----------------------------------------------------------------------------- main

def main(argv=None):
    args = get_args(argv)
    ctx = open_run(args)
    dist, device, master = ctx.dist, ctx.device, ctx.master
    P = dist.share(args.prompts_per_step, "--prompts_per_step")  # this rank's prompts
    if args.ptx_coef > 0:
        dist.share(args.ptx_rows or args.prompts_per_step, "--ptx_rows")  # every rank its share of the windows
    torch.manual_seed(args.seed + dist.rank)
    ckpt_path = os.path.join(args.out_dir, CKPT_NAME)

    base_ckpt, ref, reward_model, tok_policy, seq_len, detector_len = load_models(args, device)
    model, own = load_policy(args, base_ckpt, ckpt_path)
    # the policy stays in eval mode: dropout would make the sampling distribution differ
    # from the one the ratios are computed under; eval() does not stop gradients
    model.to(device).eval()
    ref.to(device).eval().requires_grad_(False)
    reward_model.eval().requires_grad_(False)
    train_data, tok, probe, evalset = load_data(args, ctx, base_ckpt, tok_policy, seq_len, ref.config.block_size)
    policy = wrap_ddp(TokenLogProbs(model), dist, device)
    optimizer = model.configure_optimizers(args.weight_decay, args.learning_rate,
                                           (args.beta1, args.beta2), device.split(":")[0])
    base_sha = own["grpo"]["base_sha256"] if own is not None else source_sha256(args.model_path)
    run = GRPORun(args, ctx, model, optimizer, base_ckpt, base_sha, probe, seq_len, ckpt_path, ref=ref,
                  reward_model=reward_model, policy=policy, train_data=train_data, tok=tok, evalset=evalset,
                  detector_len=detector_len, engine=Engine(model), reward=Reward.from_args(args),
                  terms=LossTerms.from_args(args))
    state = restore_state(run, own)
    # every metrics row also goes to TensorBoard / W&B; a resumed run's later events are dropped
    kept = None if own is None else kept_records(state.step, finetune.relogged(state))
    ctx.open_log(args, os.path.join(args.out_dir, METRICS_NAME), kept,
                 purge_step=None if own is None else state.step + 1)
    if master:
        n_params = sum(p.numel() for p in model.parameters())
        print(f"policy {args.model_path}: {n_params / 1e6:.2f}M params, tokenization "
              f"{tok_policy or 'unknown'}; " + (f"reward: the log-ratio of {args.trunk_path} to it" if args.trunk_path
                                                  else f"reward model {args.reward_model_path}"))
        print(f"device {device}, world size {dist.world_size}; seq_len {seq_len}, prompt length "
              f"1..{seq_len // 2}; {args.prompts_per_step} prompts x {args.group_size} completions per step "
              f"({P} prompts per process)")

    # ---------------------------------------------------------------- loop
    bar = progress_bar(total=args.max_steps, initial=min(state.step, args.max_steps), desc="grpo",
                       disable=not master, dynamic_ncols=True)
    while True:
        if state.stop_reason is None and state.step >= args.max_steps:
            state.stop_reason = "max_steps"
        if should_evaluate(state, args):
            evaluate(state, run)
        if state.stop_reason:
            break
        t0 = time.time()
        batch = rollout(state, run)
        stats = train_step(state, run, batch)
        rec = record_step(state, run, batch, stats, time.time() - t0)
        ctx.logger.log(**rec)
        bar.update(1)
        bar.set_postfix_str(bar_text(rec, state, args))
        state.stop_reason = stop_reason(state, args, rec)
        if master and state.step % args.save_interval == 0 and not state.stop_reason and not args.no_save:
            save(state, run)
    bar.close()

    # ---------------------------------------------------------------- end
    if not state.finished:
        state.finished = True
        if master and not args.no_save:
            save(state, run)
    if master:
        write_summary(state, run)
    finish(ctx)


if __name__ == "__main__":
    run_cli(main, report_peak=True)
