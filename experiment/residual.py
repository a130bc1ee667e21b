"""
The detector as a residual energy model (Deng et al., ICLR 2020), and sampling-importance-resampling.

Given a generator P_gen and a score s(c, x) of a continuation x of a natural prefix c, the
residual model is

    P_res(x | c) = P_gen(x | c) * exp(s(c, x)) / Z(c),     Z(c) = E_{x ~ P_gen(.|c)}[exp(s(c, x))].

With s = log p_data / P_gen exactly, P_res = p_data and Z = 1. Z(c) is estimated from n of the
generator's own continuations x_1..x_n of c:

    log Z_n(c) = logsumexp_i s(c, x_i) - log n.

Z_n is unbiased, but log Z_n is biased LOW (Jensen: E log Z_n <= log E Z_n = log Z), and the bias
shrinks as n grows. A low log Z overstates the residual model's likelihood, so the residual NLL
computed with it is a LOWER bound on the true one in expectation (a perplexity too good); we report
it for n = 1, 2, 4, ..., n_max so the bias is visible as the numbers rise with n.

The residual NLL per token of a natural continuation x of c is -(log P_gen(x|c) + s(c, x) - log Z(c)) / |x|.
Its gain over the generator alone (nats per token) needs no P_gen at all: (s(c, x) - log Z(c)) / |x|.
That gain bounds what any use of this detector can add to this generator.

The score of a per-position detector is the sum over the continuation's positions of the per-token
log-ratios its logits give under the crossover labels (objectives.log_ratio_increments; docs/design.md
section 3): the same quantity as train_grpo.py --reward logit.
"""
import math
from dataclasses import dataclass

import numpy as np
import torch

from core.errors import ProjectError
from core.objectives import logit_rewards
from engine import Engine
from experiment.measures import natural_blocks
from lib.checkpoint import load_model, sequence_length

# ----------------------------------------------------------------------------- the estimator (pure tensors)

def sample_counts(n):
    """1, 2, 4, ... up to n, and n itself."""
    ms = [1 << k for k in range(max(1, n).bit_length()) if 1 << k <= n]
    return ms + ([n] if ms[-1] != n else [])


def log_normaliser(sample_scores, m):
    """log Z_m(c) = logsumexp of the first m scores of each row - log m: sample_scores (C, n) -> (C,)."""
    return torch.logsumexp(sample_scores[:, :m].double(), dim=1) - math.log(m)


def residual_gain(data_scores, sample_scores, n_tokens, gen_logp=None, counts=None):
    """The residual model's likelihood of natural continuations, for each m in `counts` (default
    sample_counts(n)).

    data_scores (C,): s(c, x) of each prefix's natural continuation; sample_scores (C, n): s(c, x_i)
    of n generator continuations of the same prefix; n_tokens (C,) or an int: |x|; gen_logp (C,):
    log P_gen(x | c) of the natural continuation (optional).

    Returns {m: {"log_z": mean log Z_m, "gain": nats per token gained over the generator,
    "gain_se": its standard error over prefixes, ["nll_gen", "nll_residual": nats per token]}},
    each a float, the per-token ones pooled over all tokens (sum over prefixes / total tokens)."""
    n_tok = torch.as_tensor(n_tokens, dtype=torch.float64).expand(data_scores.shape)
    total = n_tok.sum().item()
    C = data_scores.numel()
    out = {}
    for m in counts or sample_counts(sample_scores.size(1)):
        log_z = log_normaliser(sample_scores, m)
        per_prefix = data_scores.double() - log_z
        gain = per_prefix.sum().item() / total
        # a ratio of sums: the SE of the mean of per_prefix - gain * n_tok, over the mean length
        resid = per_prefix - gain * n_tok
        se = resid.std().item() / math.sqrt(C) / (total / C) if C > 1 else float("nan")
        rec = {"log_z": log_z.mean().item(), "gain": gain, "gain_se": se}
        if gen_logp is not None:
            rec["nll_gen"] = -gen_logp.double().sum().item() / total
            rec["nll_residual"] = rec["nll_gen"] - gain
        out[m] = rec
    return out


def sir_choice(sample_scores, generator=None):
    """Sampling-importance-resampling: for each row of sample_scores (C, n), the index of one
    candidate drawn with probability softmax(scores) (proportional to exp(s)). As n grows the chosen
    continuation's law tends to P_res = P_gen * exp(s) / Z."""
    probs = torch.softmax(sample_scores.double(), dim=1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(1)


# ----------------------------------------------------------------------------- with project models

def load_detector(path, device="cpu", trunk=False):
    """A trained per-position detector checkpoint (train_reward_model.py --per_position) in eval mode,
    and the length N of its reward data's blocks (checkpoint.sequence_length): (model, N), ready for
    detector_scores. trunk: also the path its trunk came from (train_reward_model.py --init_trunk_from,
    None when it is the generator's own): (model, N, path)."""
    model, ckpt, _ = load_model(path, device=device, require_mode="reward")
    if not model.config.reward_per_position:
        raise ProjectError(f"{path} has a last-token head; the residual score needs a per-position detector",
                           "train one with train_reward_model.py --per_position")
    out = (model.eval(), sequence_length(ckpt, path))
    return out + (((ckpt.get("reward_training") or {}).get("init_trunk_from") or {}).get("path"),) if trunk else out


@torch.no_grad()
def detector_scores(reward_model, seqs, prompt_len, n_train):
    """s(c, x) of sequences (B, T) = prefix c (prompt_len natural tokens) + continuation x, from a
    per-position detector: the summed per-token log-ratios of the continuation (objectives.logit_rewards),
    n_train = the block size the detector's crossovers were drawn over."""
    if not reward_model.config.reward_per_position:
        raise ValueError("the residual score needs a per-position detector (train_reward_model.py --per_position)")
    logits = reward_model.position_logits(seqs).float()
    return logit_rewards(logits[..., 0] - logits[..., 1], prompt_len, n_train)


@torch.no_grad()
def continuation_logprob(gen, seqs, prompt_len, temperature=1.0):
    """log P_gen(x | c) (B,) of each sequence's continuation (positions prompt_len..)."""
    return gen.token_logprobs(seqs[:, :-1], seqs[:, 1:], temperature=temperature)[:, prompt_len - 1:].float().sum(1)


@torch.no_grad()
def sample_scored(gen, reward_model, prefixes, length, n, n_train, temperature=1.0, generator=None):
    """n continuations of `length` tokens of every prefix (C, P) sampled from gen at `temperature`,
    and their detector_scores: (sequences (C, n, P + length), scores (C, n))."""
    C, P = prefixes.shape
    seqs = Engine(gen).generate(prefixes.repeat_interleave(n, dim=0), length, temperature=temperature,
                                generator=generator)
    return seqs.view(C, n, -1), detector_scores(reward_model, seqs, P, n_train).view(C, n)


def residual_report(gen, reward_model, natural, prompt_len, n, n_train, temperature=1.0, generator=None):
    """residual_gain of natural sequences (C, T): prefix natural[:, :prompt_len], continuation the
    rest, Z from n of gen's own continuations of each prefix (sampled at `temperature`, which is then
    the generator P_gen whose gain is measured)."""
    _, scores = sample_scored(gen, reward_model, natural[:, :prompt_len], natural.size(1) - prompt_len, n,
                              n_train, temperature, generator)
    data = detector_scores(reward_model, natural, prompt_len, n_train)
    gen_logp = continuation_logprob(gen, natural, prompt_len, temperature)
    return residual_gain(data, scores, natural.size(1) - prompt_len, gen_logp)


def sir_generate(gen, reward_model, prefixes, length, n, n_train, temperature=1.0, generator=None):
    """The SIR arm: n continuations per prefix from gen, one kept per prefix with probability
    proportional to exp(s) -> (C, P + length). Costs n generations and n detector passes per prefix."""
    seqs, scores = sample_scored(gen, reward_model, prefixes, length, n, n_train, temperature, generator)
    pick = sir_choice(scores, generator)
    return seqs[torch.arange(seqs.size(0)), pick.to(seqs.device)]


# ----------------------------------------------------------------------------- on the frontier's own val windows

def window_gains(data_scores, sample_scores, counts=None):
    """Per window, the nats the residual model gains over the generator on its continuation, for each
    m in `counts` (default sample_counts(n)): {m: (upper (W,), lower (W,))}, float64.

    upper: s(x) - log Z_m, with Z_m the mean of exp(s) over m generator continuations (log Z_m is
    biased low, so this gain is biased high). lower: s(x) - log((exp s(x) + m Z_m) / (m + 1)), the data
    continuation counted among the m + 1 (bounded by log(m + 1); for a detector that is the true
    log-ratio it is biased low, by about chi^2(p_data || P_gen) / 2m, as the upper one is biased high
    by about as much). Both tend to the true gain as m grows."""
    s = data_scores.double()
    out = {}
    for m in counts or sample_counts(sample_scores.size(1)):
        upper = s - log_normaliser(sample_scores, m)
        both = torch.cat([s[:, None], sample_scores[:, :m].double()], dim=1)
        lower = s - (torch.logsumexp(both, dim=1) - math.log(m + 1))
        out[m] = (upper, lower)
    return out


@dataclass(frozen=True)
class Scorer:
    """A generator and the detector that scores its text: gen samples, reward_model (trained on blocks of n_train
    tokens) scores; batch_size rows at a time."""
    gen: object
    reward_model: object
    n_train: int
    batch_size: int = 256


@torch.no_grad()
def scored_continuations(scorer, prompts, length, n, seed):
    """n continuations to `length` tokens of every one-token prompt (C, 1), the j-th drawn with the
    uniforms of torch seed `seed + 104729 * j` (so j = 0 is measures.generated_blocks' sample
    of the same prompts and seed), and their detector scores: (rows (C, n, length), scores (C, n))."""
    gen, reward_model, n_train, batch_size = scorer.gen, scorer.reward_model, scorer.n_train, scorer.batch_size
    C = prompts.size(0)
    device = next(gen.parameters()).device
    rows, scores, engine = [], [], Engine(gen)  # one engine: its decoders serve every batch
    for j in range(n):
        U = torch.rand((C, length), generator=torch.Generator().manual_seed(seed + 104729 * j))
        for s in range(0, C, batch_size):
            r = engine.generate(prompts[s:s + batch_size].to(device), length - 1,
                                uniforms=U[s:s + batch_size].to(device))
            rows.append(r.cpu())
            scores.append(detector_scores(reward_model, r, 1, n_train).double().cpu())
    rows = torch.cat(rows).view(n, C, length).transpose(0, 1)
    return rows, torch.cat(scores).view(n, C).T


@torch.no_grad()
def val_residual(scorer, val, block_size, n, seed):
    """The residual model of every full val window of the frontier's coverage axis (evaluate.py's
    windows: window i holds tokens [i B, i B + B + 1)). Its first token is the prefix c, its next
    B - 1 targets the continuation x that exp(s(c, x)) / Z(c) reweights (the last target keeps the
    generator's own probability), so P_res is a normalised model of the whole window.

    Returns {"windows": W, "n": n, "data": s of the natural continuations (W,), "samples": s of n
    generator continuations of each c (W, n)} (float64 tensors)."""
    gen, reward_model, n_train, batch_size = scorer.gen, scorer.reward_model, scorer.n_train, scorer.batch_size
    B = block_size
    W = (len(val) - 1) // B
    if W < 1:
        raise ValueError(f"the val split holds no full window of {B} + 1 tokens")
    win = torch.from_numpy(np.asarray(val[:W * B], dtype=np.int64).reshape(W, B))
    device = next(gen.parameters()).device
    data = torch.cat([detector_scores(reward_model, win[s:s + batch_size].to(device), 1, n_train).double().cpu()
                      for s in range(0, W, batch_size)])
    _, samples = scored_continuations(scorer, win[:, :1], B, n, seed)
    return {"windows": W, "n": n, "data": data, "samples": samples}


def residual_point(point, res, block_size, groups):
    """The residual model's coverage at T = 1 from the generator's own sweep point (val_loss, val_items,
    val_tokens over the same windows): the generator's val NLL minus the lower gain of every window at
    the largest n, per group of windows (`groups`: frontier.VAL_ITEMS, as the sweep's), so the
    residual model's val items pair with every other generator's."""
    _, lower = window_gains(res["data"], res["samples"], [res["n"]])[res["n"]]
    n_windows = math.ceil((point["val_tokens"]) / block_size)  # the sweep's windows, the last one short
    gain = np.zeros(n_windows)
    gain[:res["windows"]] = lower.numpy()
    tokens = np.full(n_windows, float(block_size))
    tokens[-1] = point["val_tokens"] - block_size * (n_windows - 1)
    split = np.array_split(np.arange(n_windows), min(groups, n_windows))
    items = [v - gain[g].sum() / tokens[g].sum() for v, g in zip(point["val_items"], split)]
    val_loss = point["val_loss"] - gain.sum() / point["val_tokens"]
    return {"val_loss": val_loss, "val_ppl": math.exp(val_loss), "val_items": items,
            "val_tokens": point["val_tokens"]}


def information(res, block_size, val_tokens):
    """The detector's information about its generator, per n in sample_counts: nats per val token
    (the sweep's token count) gained by the residual model, upper and lower, with the lower one's SE
    over windows: {m: {"upper", "lower", "se"}}."""
    out = {}
    for m, (upper, lower) in window_gains(res["data"], res["samples"]).items():
        out[m] = {"upper": upper.sum().item() / val_tokens, "lower": lower.sum().item() / val_tokens,
                  "se": (lower.std().item() * math.sqrt(lower.numel()) / val_tokens) if lower.numel() > 1 else 0.0}
    return out


def sir_rows(scorer, val, n_samples, length, n, seed, noise_seed=None):
    """The SIR arm's samples on the frontier: for each of the sweep's n_samples one-token prompts
    (measures.natural_blocks with `seed`), n continuations to `length` tokens at T = 1
    (scored_continuations, drawn with noise_seed, default `seed`), one kept with probability proportional to
    exp(s): int64 (n_samples, length)."""
    noise_seed = seed if noise_seed is None else noise_seed
    prompts = torch.from_numpy(natural_blocks(val, n_samples, length, seed)[:, :1])
    rows, scores = scored_continuations(scorer, prompts, length, n, noise_seed)
    pick = sir_choice(scores, torch.Generator().manual_seed(noise_seed + 1))
    return rows[torch.arange(n_samples), pick].numpy()
