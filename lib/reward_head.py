"""
The reward head beside model.py's GPT: the detector that also reads its generator (Detector), and
the head at training time: the forward that training runs
(RewardLogits, head_logits; with frozen_features / cached_head_logits on the cached output
of frozen blocks), the loss (reward_loss), P(natural) of a sequence (sequence_p_natural),
which parameters train and in which mode (set_trainable, set_modes), and the optimizer
(make_optimizer).

train_reward_model.py trains with these (and re-exports them); bench/bench_detector.py
times them.
"""
import torch
import torch.nn as nn
from torch.nn import functional as F

from core.errors import ProjectError
from model import GPT, GPTConfig, adamw_param_groups, fused_optimizer_kwargs, with_running_means
from reward_dataset_loader import position_labels


class Detector(GPT):
    """A reward-mode GPT whose head also reads its generator's judgement of each token
    (GPTConfig.reward_gen_features): the generator's surprisal and the trunk's log-ratio to it,
    with their running means. The generator is a frozen copy (gen_lm), a feature extractor that
    never trains and never drops out. lib/checkpoint.load_model builds one from a checkpoint."""

    def add_head_inputs(self, config):
        self.gen_lm = GPT(GPTConfig(**{**config.reward_gen_features, "mode": "generator"}))
        self.gen_lm.requires_grad_(False)

    def train(self, mode=True):
        super().train(mode)
        self.gen_lm.eval()  # frozen: no dropout in the generator's features, whatever the head does
        return self

    def gen_features(self, idx, trunk_surprisal):
        """(B, T, 4): the generator's surprisal of token t, the trunk's log-ratio to it at t,
        log p_trunk(x_t) - log p_gen(x_t) (trunk_surprisal: lm_features' first column), zeros
        at t = 0, and the running means of both over positions 1..t."""
        with torch.no_grad():
            gen = -self.gen_lm.token_logprobs(idx[:, :-1], idx[:, 1:]).float()
        return with_running_means(torch.stack([gen, gen - trunk_surprisal[:, 1:].float()], dim=-1))

    def head_input(self, idx, x):
        lm = self.lm_features(idx, x)
        return torch.cat([x, lm.to(x.dtype), self.gen_features(idx, lm[..., 0]).to(x.dtype)], dim=-1)


def build_reward_model(config):
    """GPT(config), or a Detector when the head reads the generator too."""
    return (Detector if config.mode == "reward" and config.reward_gen_features else GPT)(config)


class RewardLogits(nn.Module):
    """forward() = the head's logits, so DistributedDataParallel (which hooks forward) sees
    the pass: (B, 2) for a last-token head, (B, T, 2) for a per-position one.

    first_block=None: the input is token ids. first_block=k: the input is the cached output
    of the frozen blocks 0..k-1 (frozen_features), and only blocks k.., ln_f and the head run."""

    def __init__(self, gpt, first_block=None):
        super().__init__()
        self.gpt = gpt
        self.first_block = first_block

    def forward(self, inp):
        if self.first_block is None:
            return head_logits(self.gpt, inp)
        return cached_head_logits(self.gpt, inp, self.first_block)


def head_logits(model, idx):
    if model.config.reward_per_position:
        return model.position_logits(idx)
    return model.reward_logits(idx)


# With --unfreeze_last_n_blocks n >= 0 the embeddings and the first L - n blocks are frozen
# and in eval mode, so their output for a sample never changes: train_reward_model.py's
# --cache_frozen computes frozen_features once per sample and trains the rest on it.

def frozen_features(model, idx, first_block, last_only=False):
    """The input of block first_block (embeddings + blocks 0..first_block-1), (B, T, C);
    (B, 1, C) with last_only (a last-token head on a frozen trunk needs nothing else).
    With LM features (only on a wholly frozen trunk) it is the head's whole input instead:
    ln_f's output plus the features, (B, T, C + N_LM_FEATURES)."""
    x = model.trunk(idx, first_block)
    if model.config.reward_lm_features:
        x = model.head_input(idx, model.transformer.ln_f(x))
    return x[:, -1:] if last_only else x


def cached_head_logits(model, x, first_block):
    """head_logits(model, idx) from x = frozen_features(model, idx, first_block)."""
    if not model.config.reward_lm_features:  # else x is already the head's input
        for block in model.transformer.h[first_block:]:
            x = block(x)
        x = model.transformer.ln_f(x)
    return model.head_logits(x if model.config.reward_per_position else x[:, -1, :])


def sequence_p_natural(logits):
    """P(natural) of each sequence from head_logits: the last-token head's softmax, or the
    mean over positions of the per-position softmax (what GPT.forward returns)."""
    p = F.softmax(logits.float(), dim=-1)[..., 0]
    return p.mean(dim=1) if p.dim() == 2 else p


def reward_loss(logits, y, kind):
    """Per-position logits (B, T, 2): cross-entropy against the exact per-position labels
    (natural iff t < K), averaged over every position of the batch. Last-token logits
    (B, 2): mse on the probabilities (as GPT.forward in reward mode), or ce, the soft-label
    cross-entropy -sum_c y_c log p_c (minimised at p = y, like mse, but with gradients that
    do not vanish when the softmax saturates)."""
    if logits.dim() == 3:
        labels = position_labels(y, logits.size(1))
        return F.cross_entropy(logits.float().reshape(-1, 2), labels.reshape(-1))
    if kind == "mse":
        return F.mse_loss(F.softmax(logits.float(), dim=-1), y)
    return -(y * F.log_softmax(logits.float(), dim=-1)).sum(-1).mean()


# ADA (Karras et al. 2020), brought to tokens: every token of a training batch is, with probability p, replaced by a
# uniform draw from the vocabulary, natural and generated tokens alike (so the change is never a class cue), and
# p adapts to keep r = E[sign(logit_natural - logit_synthetic)] over the natural positions at a target: up while
# the detector is surer of its natural examples than that (it memorises them), down otherwise.
ADA_INTERVAL = 4  # optimizer steps between two adjustments of p (ADA's 4 minibatches)
ADA_STEP = 0.01  # the change of p per adjustment: 0 to 0.75 in 300 steps, the data-limited detector's run
ADA_MAX_P = 0.8


def augment_tokens(x, p, vocab_size, generator):
    """x (B, T) with each token, independently with probability p, replaced by a uniform draw from [0, vocab_size).
    It never reads the labels: natural and generated positions are augmented alike."""
    if p <= 0:
        return x
    swap = torch.rand(x.shape, generator=generator) < p
    return torch.where(swap, torch.randint(0, vocab_size, x.shape, generator=generator), x)


def natural_sign(logits, y):
    """(the sum of sign(logit_natural - logit_synthetic) over the batch's natural positions, their count), as 0-dim
    tensors on the logits' device (a mask, no indexing: no host sync; the caller reads them once per ADA_INTERVAL): a
    per-position head's positions t < K, a last-token head's rows whose natural share K/N is over one half."""
    margin = (logits[..., 0] - logits[..., 1]).detach().float()
    natural = position_labels(y, logits.size(1)) == 0 if logits.dim() == 3 else y[:, 0] > 0.5
    return (torch.sign(margin) * natural).sum(), natural.sum()


def ada_adjust(p, signs, count, target):
    """ADA's rule: p + ADA_STEP if the natural positions' mean sign is over the target, - ADA_STEP if under,
    within [0, ADA_MAX_P]; p unchanged when there were no natural positions."""
    if count == 0:
        return p
    r = signs / count
    return min(max(p + ADA_STEP * (1 if r > target else -1 if r < target else 0), 0.0), ADA_MAX_P)


def set_trainable(model, n_blocks):
    """Freeze the trunk, then unfreeze the last n blocks (+ ln_f), or all of it for n = -1;
    returns trainable names."""
    n_layer = len(model.transformer.h)
    if n_blocks < 0:
        for p in model.parameters():
            p.requires_grad_(True)
        if isinstance(model, Detector):  # the generator's copy is a feature extractor: never trained
            model.gen_lm.requires_grad_(False)
        return [n for n, p in model.named_parameters() if p.requires_grad]
    if n_blocks > n_layer:
        raise ProjectError(f"--unfreeze_last_n_blocks {n_blocks} exceeds the model's {n_layer} blocks",
                           f"use a value in 0..{n_layer}")
    for p in model.transformer.parameters():
        p.requires_grad_(False)
    if n_blocks > 0:
        for block in model.transformer.h[n_layer - n_blocks:]:
            for p in block.parameters():
                p.requires_grad_(True)
        for p in model.transformer.ln_f.parameters():
            p.requires_grad_(True)
    for p in model.reward_head.parameters():
        p.requires_grad_(True)
    return [n for n, p in model.named_parameters() if p.requires_grad]


def set_modes(model, n_blocks):
    """Frozen parts in eval() (no dropout: they are fixed feature extractors); the head
    and unfrozen blocks in train()."""
    if n_blocks < 0:
        model.train()
        return
    model.eval()
    model.reward_head.train()
    if n_blocks > 0:
        for block in model.transformer.h[len(model.transformer.h) - n_blocks:]:
            block.train()


def make_optimizer(model, args):
    params = [p for p in model.parameters() if p.requires_grad]
    fused = fused_optimizer_kwargs(params[0].device.type)
    if args.optimizer == "adam":
        return torch.optim.Adam(params, lr=args.learning_rate, **fused)
    return torch.optim.AdamW(adamw_param_groups(params, args.weight_decay), lr=args.learning_rate, **fused)
