"""
Self-play fine-tuning of a generator against its own samples, two objectives on one data path:

  SPIN (Self-Play Fine-Tuning, Chen et al. 2024; --objective spin): DPO where the chosen
      continuation of a prompt is the NATURAL one from the train split and the rejected one is the
      reference's own sample of the same prompt (objectives.spin_loss).
  DDO (Direct Discriminative Optimization, Zheng et al. 2025; --objective ddo): the model's own
      sequence log-likelihood ratio to the reference, --ddo_beta * (log p_theta - log p_ref) over
      the continuation, is a GAN discriminator's logit: natural continuations should score high, the
      reference's samples low (objectives.ddo_loss; --ddo_alpha weighs the sample term).

Each step takes --prompts_per_step natural train windows of seq_len tokens and one random prompt
length P_len in [1, seq_len/2] for the whole step (as train_grpo.py does): the first P_len tokens
are the prompt, the rest the natural continuation; the reference samples a continuation of the same
prompt to the same length. Both objectives read the summed log-probs of the continuation tokens
under the policy and under the reference.

Self-play rounds (--rounds): --max_steps is split into rounds of consecutive steps. A round's
reference is the policy at its start (the first round's: --model_path itself), so each round moves
the reference to the current model; when a round starts, all its steps' pairs are drawn from that
reference (batched, KV-cached generate calls) and scored by it once, and the round's steps read
those cached log-probs. --rounds 1 (the default) is one SPIN iteration; run_cycles runs one per
cycle, so the next cycle's iterate is this run's result.

    python train_spin.py --model_path out/ckpt.pt --out_dir out-spin
    python train_spin.py --model_path out/ckpt.pt --objective ddo --rounds 3 --out_dir out-ddo

Writes out_dir/ckpt.pt (a normal generator checkpoint every other script accepts, plus the
self-play state for --resume, the current round's cached pairs included), metrics.jsonl and
spin_summary.json or ddo_summary.json (with the budget run_cycles matches: updates,
completion_tokens, natural_tokens, seq_len and the optimizer settings). One process (no torchrun).
"""
import dataclasses
import json
import math
import os
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from core.cli import run_cli
from core.devices import clip_and_step
from core.errors import CheckpointError, DataError, ProjectError, check_finite
from core.files import atomic_write_text
from core.objectives import ddo_loss, spin_loss
from core.training import finish, kept_records, open_run
from engine import Engine
from lib import finetune
from lib.checkpoint import model_from_checkpoint, model_shape, own_checkpoint_to_resume, read_checkpoint
from lib.finetune import FinetuneRun, FinetuneState
from lib.heldout import evaluate_loss, make_eval_loader
from lib.hf_interop import source_sha256
from lib.rl_data import prompt_corpus, sample_prompts, step_prompt_len
from lib.rl_settings import OBJECTIVES, spin_args as get_args  # noqa: F401 (train_spin.OBJECTIVES)

CKPT_NAME = "ckpt.pt"
METRICS_NAME = "metrics.jsonl"
def summary_name(objective):
    """The run's summary record: spin_summary.json or ddo_summary.json."""
    return f"{objective}_summary.json"


# ----------------------------------------------------------------------------- state

@dataclass
class Pairs:
    """prompt + chosen and prompt + rejected sequences (P, seq_len) sharing one prompt length,
    with the frozen reference's completion log-probs (2P, seq_len - plen), chosen rows first.
    (For DDO: the natural continuations and the reference's samples of the same prompts.)"""
    chosen: torch.Tensor
    rejected: torch.Tensor
    plen: int
    ref_logp: torch.Tensor

    def to_dict(self):
        return {"chosen": self.chosen.cpu(), "rejected": self.rejected.cpu(), "plen": self.plen,
                "ref_logp": self.ref_logp.cpu()}

    @classmethod
    def from_dict(cls, d, device):
        return cls(d["chosen"].to(device), d["rejected"].to(device), int(d["plen"]), d["ref_logp"].to(device))


@dataclass
class SPINState(FinetuneState):
    """Everything the training loop changes, passed explicitly to evaluate() and save(): the step, stop
    reason, val history and finished flag of every fine-tuning loop (lib/finetune.py) and self-play's own.
    Step i's inputs come from (--seed, i) and the round's reference alone (step_pairs), so `step`
    is the RNG state; `pool` holds the current round's pairs, steps pool_start.., which a
    checkpoint keeps from the next step on (the round's reference itself is not kept)."""
    updates: int = 0  # optimizer steps: the budget run_cycles matches
    completion_tokens: int = 0  # rejected-continuation tokens generated
    natural_tokens: int = 0  # natural (prompt + chosen) tokens read from train.bin
    margins: list = field(default_factory=list)  # training margin per step (summary)
    round_starts: list = field(default_factory=list)  # the step each self-play round began at
    pool: list = field(default_factory=list)  # the current round's Pairs, one per step
    pool_start: int = 0  # the step pool[0] belongs to

    def to_dict(self):
        rest = self.pool[self.step - self.pool_start:] if self.pool_start <= self.step else []
        return {**super().to_dict(), "updates": self.updates, "completion_tokens": self.completion_tokens,
                "natural_tokens": self.natural_tokens, "margins": self.margins, "round_starts": self.round_starts,
                "pool_start": self.step, "pool": [p.to_dict() for p in rest]}

    @classmethod
    def from_dict(cls, d, device="cpu"):
        return cls(**cls.fields_from_dict(d), updates=int(d["updates"]), completion_tokens=int(d["completion_tokens"]),
                   natural_tokens=int(d["natural_tokens"]), margins=list(d.get("margins", [])),
                   round_starts=list(d.get("round_starts", [0])),
                   pool=[Pairs.from_dict(p, device) for p in d.get("pool", [])],
                   pool_start=int(d.get("pool_start", d["step"])))


@dataclass(frozen=True, eq=False)
class SPINRun(FinetuneRun):
    """What set-up builds and the loop only reads (lib/finetune.py's FinetuneRun: flags, context, policy,
    optimizer, base checkpoint, probe, seq_len, ckpt_path) and self-play's own; the loop's changes all go
    to SPINState. `ref`'s weights are the one thing a loop moves in place, at each round's start
    (start_round), since a round's reference is the policy at that step and checkpoints do not keep it."""
    ref: torch.nn.Module  # the current round's frozen reference
    train_data: np.ndarray  # the base model's train split: prompts and natural continuations
    val_loader: object  # the val split at the policy's block size
    ref_engine: Engine  # the reference's one Engine: its decoders (CUDA graphs) serve every round's pairs
    eval_pairs: Pairs = None  # the starting model's fixed val pairs (None: --eval_pairs 0)


# ----------------------------------------------------------------------------- set-up

def load_models(args, device):
    """(base checkpoint, frozen reference on device, policy, own checkpoint or None, seq_len)."""
    base_ckpt = read_checkpoint(args.model_path)
    ref, _ = model_from_checkpoint(base_ckpt, "generator", path=args.model_path, require_mode="generator",
                                   dropout=0.0)
    seq_len = ref.config.block_size if args.seq_len is None else args.seq_len
    if not 2 <= seq_len <= ref.config.block_size:
        raise ProjectError(f"--seq_len {seq_len} must be in [2, {ref.config.block_size}] (the model's block_size)",
                           "choose a smaller --seq_len")
    ckpt_path = os.path.join(args.out_dir, CKPT_NAME)
    own = own_checkpoint_to_resume(ckpt_path, "spin", "self-play", args.model_path) if args.resume else None
    if own is not None and own["spin"].get("objective", "spin") != args.objective:
        raise CheckpointError(f"{ckpt_path} is a {own['spin'].get('objective', 'spin')} run, not {args.objective}",
                              f"resume it with --objective {own['spin'].get('objective', 'spin')}, or use a fresh "
                              f"--out_dir")
    policy, _ = model_from_checkpoint(own or base_ckpt, "generator", path=ckpt_path if own else args.model_path,
                                      require_mode="generator", dropout=0.0)
    for m in (ref, policy):
        m.to(device).eval()  # no dropout: the policy's log-probs are those of the model it becomes
    for p_ in ref.parameters():
        p_.requires_grad_(False)
    return base_ckpt, ref, policy, own, seq_len


@torch.no_grad()
def make_pairs(run, windows, plen, uniforms):
    """Natural windows (P, seq_len) -> Pairs: run.ref samples the rejected continuation of each
    window's first plen tokens (noise `uniforms`) and scores both continuations."""
    args, ref, device = run.args, run.ref, run.ctx.device
    windows = windows.to(device)
    seq_len = windows.size(1)
    with run.ctx.amp:
        rejected = run.ref_engine.generate(windows[:, :plen], seq_len - plen, temperature=args.temperature,
                                           top_k=args.top_k, uniforms=uniforms.to(device))
        seqs = torch.cat([windows, rejected])
        micro = 2 * (args.micro_batch_size or windows.size(0))
        ref_logp = torch.cat([ref.token_logprobs(seqs[s:s + micro, :-1], seqs[s:s + micro, 1:])
                              for s in range(0, seqs.size(0), micro)])[:, plen - 1:].float()
    return Pairs(windows, rejected, plen, ref_logp)


def load_data(args, ctx, base_ckpt, seq_len, block_size):
    """(train split, val loader at the policy's block_size, the probe sequence save() checks, the
    inputs of the fixed eval Pairs (val windows, prompt length, noise) or None)."""
    if args.data_dir is not None and not os.path.isdir(args.data_dir):
        raise DataError(f"--data_dir {args.data_dir} is not a directory",
                        "pass the directory with the base model's train.bin/val.bin (prepare_data.py writes them), "
                        "or omit --data_dir to use the one recorded in --model_path")
    corpus = prompt_corpus(base_ckpt.get("data"), args.data_dir)
    train_data, val_data = corpus.train, corpus.val
    for path, data in ((corpus.train_bin, train_data), (corpus.val_bin, val_data)):
        if len(data) < seq_len + 1:
            raise DataError(f"{path} has {len(data)} tokens, fewer than --seq_len {seq_len} + 1",
                            "use a smaller --seq_len")
    val_loader = make_eval_loader(corpus.val_bin, block_size, args.eval_batch_size)
    eval_inputs = None
    if args.eval_pairs > 0:  # fixed val windows and noise: the reference's samples are fixed too
        windows = sample_prompts(val_data, seq_len, args.eval_pairs, np.random.default_rng([args.seed, 7]))
        U = torch.rand((args.eval_pairs, seq_len), generator=torch.Generator().manual_seed(args.seed + 7))
        eval_inputs = (windows, max(1, seq_len // 4), U)
    probe = torch.from_numpy(train_data[:seq_len].astype(np.int64))[None].to(ctx.device)
    return train_data, val_loader, probe, eval_inputs


# ----------------------------------------------------------------------------- self-play rounds

def round_bounds(step, max_steps, rounds):
    """(first step, end) of the round that step `step` falls in: --max_steps split into --rounds
    rounds of consecutive steps, the k-th starting at k * max_steps // rounds."""
    starts = sorted({k * max_steps // rounds for k in range(rounds)})
    first = max(b for b in starts if b <= step)
    return first, min([b for b in starts if b > step] + [max(max_steps, step + 1)])


def start_round(state, run):
    """The self-play move at a round's first step: the reference becomes the current policy, draws
    every step of the round's continuations and scores them and the natural ones, once, into
    state.pool. A resumed run whose round began earlier either still has its starting model as the
    reference (the first round) or no longer has that round's reference (--max_steps or --rounds
    moved the rounds): then a new round begins at this step."""
    args = run.args
    first, end = round_bounds(state.step, args.max_steps, args.rounds)
    anchor = 0 if first == 0 else state.step  # the step whose policy is the reference: ref holds step 0's until moved
    if anchor == state.step:
        if first != state.step:
            print(f"note: step {state.step} lies inside a round that began at step {first}, whose reference this "
                  f"run no longer holds (--max_steps or --rounds changed): a new round begins here")
        run.ref.load_state_dict(run.model.state_dict())  # the round's reference: the policy now
        state.round_starts.append(state.step)
    t0 = time.time()
    print(f"round {len(state.round_starts)}: the reference (the policy at step {anchor}) samples steps "
          f"{state.step + 1}..{end}, {args.prompts_per_step} continuations each", flush=True)
    state.pool = [step_pairs(run, i) for i in range(state.step, end)]
    state.pool_start = state.step
    print(f"round {len(state.round_starts)}: {len(state.pool)} steps' pairs drawn and scored in "
          f"{time.time() - t0:.1f} s", flush=True)
    if run.ctx.logger is not None:
        run.ctx.logger.log(kind="round", step=state.step, round=len(state.round_starts), end=end)


def round_pairs(state, run):
    """This step's Pairs from the round's pool, starting a round first where the pool has none."""
    if not 0 <= state.step - state.pool_start < len(state.pool):
        start_round(state, run)
    return state.pool[state.step - state.pool_start]


# ----------------------------------------------------------------------------- one step

def step_pairs(run, step):
    """Step `step`'s Pairs, from (--seed, step) and the round's reference alone: one prompt length,
    natural windows and sampling noise."""
    args, seq_len = run.args, run.seq_len
    plen = step_prompt_len(args.seed, step, seq_len)
    windows = sample_prompts(run.train_data, seq_len, args.prompts_per_step, np.random.default_rng([args.seed, step, 1]))
    noise = torch.Generator().manual_seed(int(np.random.default_rng([args.seed, step, 2]).integers(2 ** 62)))
    U = torch.rand((args.prompts_per_step, seq_len), generator=noise)
    return make_pairs(run, windows, plen, U)


def pair_loss(model, pairs, s, e, args, amp):
    """--objective's loss of pairs s..e: the policy's continuation log-probs (with grad) against the
    stored reference ones, natural rows first (spin_loss: chosen/rejected; ddo_loss: data/samples)."""
    P, plen = pairs.chosen.size(0), pairs.plen
    seqs = torch.cat([pairs.chosen[s:e], pairs.rejected[s:e]])
    with amp:
        logp = model.token_logprobs(seqs[:, :-1], seqs[:, 1:])[:, plen - 1:].float()
    n = e - s
    ref = torch.cat([pairs.ref_logp[s:e], pairs.ref_logp[P + s:P + e]])
    if args.objective == "ddo":
        return ddo_loss(logp[:n], logp[n:], ref[:n], ref[n:], args.ddo_alpha, args.ddo_beta, nll_coef=args.nll_coef)
    return spin_loss(logp[:n], logp[n:], ref[:n], ref[n:], args.beta, nll_coef=args.nll_coef)


def train_step(state, run, pairs):
    """One optimizer update on step state.step's Pairs (gradient accumulation over --micro_batch_size
    pairs, through run.ctx's float16 gradient scaler) -> stats averaged over the pairs, and the gradient
    norm before clipping."""
    args, model, optimizer, amp, scaler = run.args, run.model, run.optimizer, run.ctx.amp, run.ctx.scaler
    P = pairs.chosen.size(0)
    micro = args.micro_batch_size or P
    optimizer.zero_grad(set_to_none=True)
    sums = dict(loss=0.0, margin=0.0, accuracy=0.0, reward_chosen=0.0, reward_rejected=0.0, nll_chosen=0.0)
    for s in range(0, P, micro):
        e = min(P, s + micro)
        loss, st = pair_loss(model, pairs, s, e, args, amp)
        scaler.scale(loss * (e - s) / P).backward()  # the mean over all pairs
        check_finite(loss.item(), f"{args.objective.upper()} loss", state.step)
        for k, v in {"loss": loss.item(), **st}.items():
            sums[k] += v * (e - s) / P
    grad_norm = clip_and_step(scaler, optimizer, model.parameters(), args.grad_clip)
    return {**sums, "grad_norm": float(grad_norm)}


def record_step(state, pairs, stats, dt):
    """Advance the state's counters; the step's metrics record."""
    P, seq_len = pairs.chosen.shape
    state.step += 1
    state.updates += 1
    state.completion_tokens += P * (seq_len - pairs.plen)
    state.natural_tokens += P * seq_len
    state.margins.append(stats["margin"])
    return dict(kind="step", step=state.step, prompt_len=pairs.plen, **stats,
                tokens_per_s=2 * P * seq_len / max(dt, 1e-9), step_time_s=dt)


# ----------------------------------------------------------------------------- evaluate, save, report

@torch.no_grad()
def evaluate(state, run):
    """Val loss/perplexity and the objective's loss, margin and accuracy on the fixed val pairs
    (against the starting model's log-probs); appended to state.val_hist and logged. Returns the
    eval record."""
    args, model, eval_pairs, ctx = run.args, run.model, run.eval_pairs, run.ctx
    val_loss, _ = evaluate_loss(model, run.val_loader, ctx.device, args.eval_max_batches, ctx.dtype)
    rec = dict(kind="eval", step=state.step, val_loss=val_loss, val_ppl=math.exp(val_loss))
    if eval_pairs is not None:
        was = model.training
        model.eval()
        loss, st = pair_loss(model, eval_pairs, 0, eval_pairs.chosen.size(0), args, ctx.amp)
        model.train(was)
        rec.update(eval_loss=loss.item(), eval_margin=st["margin"], eval_accuracy=st["accuracy"])
    if ctx.logger is not None:
        ctx.logger.log(**rec)
    state.val_hist.append({k: v for k, v in rec.items() if k != "kind"})
    print(f"step {state.step}: val loss {val_loss:.4f}, perplexity {rec['val_ppl']:.2f}"
          + (f", {args.objective.upper()} margin on fixed val pairs {rec['eval_margin']:.4f} (accuracy "
             f"{rec['eval_accuracy']:.3f})"
             if eval_pairs is not None else ""))
    return rec


def save(state, run):
    """Write run.ckpt_path (finetune.save: a plain generator checkpoint) with state.to_dict() under "spin"
    for --resume (the self-play state of either objective, the round's remaining pairs included)."""
    finetune.save(state, run, "spin", {**state.to_dict(), "objective": run.args.objective,
                                       "base_model": os.path.abspath(run.args.model_path),
                                       "base_sha256": run.base_sha, "seq_len": run.seq_len})


def restore_state(run, own):
    """A fresh SPINState, or the --resume checkpoint's with run's optimizer restored."""
    if own is None:
        return SPINState()
    return finetune.restore(run, own, "spin", lambda d: SPINState.from_dict(d, run.ctx.device))


def write_summary(state, run):
    """spin_summary.json or ddo_summary.json: the budget (the keys run_cycles matches), the run's result,
    its objective's settings and (with the policy's model_shape) what a FLOPs count needs."""
    args, seq_len, ckpt_path = run.args, run.seq_len, run.ckpt_path
    vh, m = state.val_hist, state.margins
    summary = {
        "stop_reason": state.stop_reason, "steps": state.step,
        "updates": state.updates, "completion_tokens": state.completion_tokens,
        "natural_tokens": state.natural_tokens, "seq_len": seq_len,
        "tokens_per_step": state.completion_tokens / state.step if state.step else 0.0,
        **{k: getattr(args, k) for k in ("learning_rate", "weight_decay", "beta1", "beta2", "grad_clip",
                                         "prompts_per_step", "objective", "beta", "ddo_alpha", "ddo_beta",
                                         "nll_coef", "rounds")},
        "round_starts": state.round_starts,
        "margin_start": float(np.mean(m[:5])) if m else None, "margin_end": float(np.mean(m[-5:])) if m else None,
        "eval_margin_start": vh[0].get("eval_margin") if vh else None,
        "eval_margin_end": vh[-1].get("eval_margin") if vh else None,
        **finetune.val_summary(vh),
        "checkpoint": os.path.abspath(ckpt_path),
        # what a FLOPs count of the run needs (experiment/flops.py): its evaluations and the model's shape
        **{k: getattr(args, k) for k in ("eval_interval", "eval_max_batches", "eval_batch_size", "eval_pairs")},
        **model_shape(run.model),
    }
    atomic_write_text(os.path.join(args.out_dir, summary_name(args.objective)), json.dumps(summary, indent=2) + "\n")
    print(f"stopped after {state.step} steps ({state.stop_reason}); {state.completion_tokens:,} generated and "
          f"{state.natural_tokens:,} natural tokens; wrote {ckpt_path}")
    return summary


# ----------------------------------------------------------------------------- main

def main(argv=None):
    args = get_args(argv)
    ctx = open_run(args, distributed=False)  # one process: its pairs are drawn per round, not sharded
    device = ctx.device
    torch.manual_seed(args.seed)
    ckpt_path = os.path.join(args.out_dir, CKPT_NAME)

    base_ckpt, ref, model, own, seq_len = load_models(args, device)
    train_data, val_loader, probe, eval_inputs = load_data(args, ctx, base_ckpt, seq_len, ref.config.block_size)
    optimizer = model.configure_optimizers(args.weight_decay, args.learning_rate, (args.beta1, args.beta2),
                                           device.split(":")[0])
    base_sha = own["spin"]["base_sha256"] if own is not None else source_sha256(args.model_path)
    run = SPINRun(args, ctx, model, optimizer, base_ckpt, base_sha, probe, seq_len, ckpt_path, ref=ref,
                  train_data=train_data, val_loader=val_loader, ref_engine=Engine(ref))
    if eval_inputs is not None:  # the starting reference's samples of fixed val prompts, made through the run
        run = dataclasses.replace(run, eval_pairs=make_pairs(run, *eval_inputs))
    state = restore_state(run, own)
    kept = None if own is None else kept_records(state.step, finetune.relogged(state))
    ctx.open_log(args, os.path.join(args.out_dir, METRICS_NAME), kept,
                 purge_step=None if own is None else state.step + 1)
    print(f"{args.objective.upper()} on {args.model_path} ({sum(p.numel() for p in model.parameters()) / 1e6:.2f}M "
          f"params), device {device}; seq_len {seq_len}, prompt length 1..{seq_len // 2}, {args.prompts_per_step} "
          f"pairs per step, {args.rounds} self-play round(s)")

    while True:
        if state.stop_reason is None and state.step >= args.max_steps:
            state.stop_reason = "max_steps"
        if (state.step % args.eval_interval == 0 or state.stop_reason) and not state.finished:
            evaluate(state, run)
        if state.stop_reason:
            break
        pairs = round_pairs(state, run)
        t0 = time.time()  # the update's time (a round's sampling is timed when it starts)
        stats = train_step(state, run, pairs)
        rec = record_step(state, pairs, stats, time.time() - t0)
        ctx.logger.log(**rec)
        print(f"step {rec['step']}: loss {rec['loss']:.4f}, margin {rec['margin']:.4f}, "
              f"accuracy {rec['accuracy']:.3f}, grad norm {rec['grad_norm']:.3f}")
        if state.step % args.save_interval == 0 and state.step < args.max_steps:
            save(state, run)

    if not state.finished:
        state.finished = True
        save(state, run)
    write_summary(state, run)
    finish(ctx)


if __name__ == "__main__":
    run_cli(main, report_peak=True)
