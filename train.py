"""
Train the base GPT (a generator) on a tokenized corpus, in the style of nanoGPT.

Single process (CPU, one GPU or Apple MPS):
$ python train.py --config config/train_shakespeare_char_cpu.py
$ python train.py --config config/train_shakespeare_char.py --max_iters 2000   # flags override the preset
$ python train.py config/train_shakespeare_char.py --max_iters=10 --compile=False   # nanoGPT's form
(config files are read, never executed: see configurator.py for what they may contain)

Fine-tune pretrained weights (a local Hugging Face GPT-2 directory, or a .pt checkpoint):
$ python train.py --init_from gpt2-local --data_dir data/shakespeare --block_size 256 --learning_rate 3e-5

DDP on 4 GPUs of one node (gloo is used instead of nccl on CPU):
$ torchrun --standalone --nproc_per_node=4 train.py --config config/train_shakespeare_char.py

Outputs in --out_dir:
  ckpt.pt        the checkpoint with the best val loss so far (what later steps load)
  last.pt        the latest full training state, for --resume (nanoGPT's --init_from resume also works)
  metrics.jsonl  one JSON record per logged iteration and per evaluation (printed too: on a terminal every
                 --log_interval, elsewhere about 100 lines per run)
  train_summary.json  the run's record at its end: iterations, batch and eval settings, model shape, losses

main() reads top to bottom: set-up (setup_device, setup_data, init_resume / init_pretrained,
build_optimizer, wrap_model, the metrics log), the loop, the end. Everything the loop changes is one
TrainState (step, best val loss, early stopper, batch stream, RNG states, loss tally); what set-up built
and the loop only reads is one TrainRun (as train_reward_model.py's RMState and RMRun): the loop's steps
are after_eval(state, run, ...), train_step(state, run) and log_training(state, run, lr).
"""
import argparse
import json
import math
import os
import shutil
import sys
import time
from dataclasses import dataclass
from typing import Optional

import torch

from core.cli import run_cli
from core.devices import clip_and_step, gather_rng_states, wrap_ddp
from core.errors import ProjectError, check_finite
from core.files import JsonlLogger, atomic_output, atomic_torch_save, atomic_write_text, read_jsonl
from core.schedule import EarlyStopping, cosine_lr
from core.training import RunContext, finish, kept_records, open_run
from lib.checkpoint import load_pretrained, make_checkpoint, model_from_checkpoint, model_shape, read_checkpoint
from lib.corpus import Corpus, check_token_bin, describe_split
from lib.heldout import batch_at, get_batch, step_offsets
from lib.settings import train_args as parse_args, train_parser as build_parser  # noqa: F401 (train.build_parser)
from model import GPT, GPTConfig
from tokenization_manager import TokenizationInfo, check_tokenization_match

BPE_PADDED_VOCAB = 50304  # GPT-2's 50257 padded to a multiple of 64 (faster matmuls)
SUMMARY_NAME = "train_summary.json"  # the run's record, written at its end (write_run_summary)
MODEL_FLAGS = ("n_layer", "n_head", "n_embd", "block_size", "bias")


# ----------------------------------------------------------------------------- the state the loop changes

@dataclass
class TrainState:
    """Everything the training loop changes: what a checkpoint holds to continue the run exactly
    (step, best val loss, early stopper, random streams), and the training-loss tally between two
    log lines. The set-up (model, optimizer, data, args) is the TrainRun."""
    early: EarlyStopping
    batch_gen: torch.Generator  # the training batch stream: seeded alike on every process (see step_offsets)
    world_size: int = 1  # processes of this run, one torch random state each
    step: int = 0  # optimizer steps done (the checkpoint's iter_num, nanoGPT's name)
    best_val_loss: float = float("inf")
    best_step: Optional[int] = None  # the checkpoint's and train_summary.json's best_iter
    rng_states: Optional[list] = None  # every process's torch random state at the last evaluation (rank 0)
    stop_reason: Optional[str] = None
    loss_sum: Optional[torch.Tensor] = None  # training loss summed since the last log line...
    step_log: int = 0  # ...from this step
    t_log: float = 0.0  # ...and this time (evaluations excluded: tokens/s counts training time only)


def new_state(args, world_size):
    return TrainState(early=EarlyStopping(args.patience, args.min_delta, "min"),
                      batch_gen=torch.Generator().manual_seed(args.seed), world_size=world_size)


# ----------------------------------------------------------------------------- set-up

def setup_device(args, ctx):
    """This process's micro-steps (--gradient_accumulation_steps is the total over processes), and nanoGPT's
    --compile default on the run's device (core/training.py's context)."""
    if args.compile is None:  # nanoGPT compiles by default; on CPU it does not pay
        args.compile = ctx.device_type == "cuda"
    return ctx.dist.share(args.gradient_accumulation_steps, "--gradient_accumulation_steps")


def setup_data(args):
    """--data_dir as a Corpus: its token files found (cheap checks first), its tokenization checked."""
    data_dir = args.data_dir
    if not os.path.isdir(data_dir):
        named = args.dataset is not None and data_dir == os.path.join("data", args.dataset)
        what = f"--dataset {args.dataset} means --data_dir {data_dir}, which" if named else f"--data_dir {data_dir}"
        raise ProjectError(f"{what} does not exist; run prepare.py to create it",
                           "e.g. python data/shakespeare_char/prepare.py, or python prepare_data.py "
                           "--input your.txt --out_dir DIR")
    meta_path = args.meta_path
    if args.tokenization == "char" and meta_path is None:
        meta_path = os.path.join(data_dir, "meta.pkl")
    corpus = Corpus(data_dir, args.tokenization, meta_path)
    for path in (corpus.train_bin, corpus.val_bin):
        check_token_bin(path)  # existence and size first, before anything slow
    prep = corpus.prepare_info
    if prep and prep.get("tokenization"):
        check_tokenization_match(TokenizationInfo.from_dict(prep["tokenization"]), corpus.tokenizer.info,
                                 what=f"dataset {data_dir}")
    return corpus


def checkpoint_paths(out_dir):
    """(ckpt.pt: the best val loss, last.pt: the latest state) in out_dir."""
    return os.path.join(out_dir, "ckpt.pt"), os.path.join(out_dir, "last.pt")


def init_pretrained(args, data, master):
    """--init_from PATH: the pretrained model, cropped to --block_size; the architecture flags in
    `args` become the weights'. Returns (model, where the weights came from, the model's vocab_size)."""
    model, pretrained = load_pretrained(args.init_from, data.tokenizer, data.data_dir, args.dropout)
    if args.block_size < model.config.block_size:  # as nanoGPT: a shorter context crops the positions
        model.crop_block_size(args.block_size)
    elif args.block_size > model.config.block_size and master:
        print(f"note: the pretrained model has {model.config.block_size} positions; --block_size "
              f"{args.block_size} becomes {model.config.block_size}")
    for name in MODEL_FLAGS:  # the architecture comes from the weights
        setattr(args, name, getattr(model.config, name))
    return model, pretrained, model.config.vocab_size  # kept (GPT-2: 50257, no padding)


def init_resume(args, data, vocab_size):
    """--init_from resume: the model of out_dir/last.pt (or ckpt.pt); the architecture flags in `args`
    become the checkpoint's. Returns (model, checkpoint, its path, the model's vocab_size)."""
    ckpt_path, last_path = checkpoint_paths(args.out_dir)
    resume_path = last_path if os.path.exists(last_path) else ckpt_path
    if not os.path.exists(resume_path):
        raise ProjectError(f"--init_from resume: no last.pt or ckpt.pt in {args.out_dir}",
                           "check --out_dir, or start with --init_from scratch")
    resume_ckpt = read_checkpoint(resume_path)
    model, _ = model_from_checkpoint(resume_ckpt, path=resume_path, require_mode="generator",
                                     dropout=args.dropout)
    if resume_ckpt.get("init_from") and model.config.vocab_size >= data.tokenizer.vocab_size:
        vocab_size = model.config.vocab_size  # a fine-tuning run keeps its pretrained vocabulary
    if model.config.vocab_size != vocab_size:
        raise ProjectError(f"{resume_path} has vocab_size {model.config.vocab_size} but the data in "
                           f"{data.data_dir} needs {vocab_size}", "resume with the data it was trained on")
    for name in MODEL_FLAGS:  # the architecture comes from the checkpoint (as in nanoGPT)
        setattr(args, name, getattr(model.config, name))
    return model, resume_ckpt, resume_path, vocab_size


def describe_data(args, data, vocab_size, grad_accum, dist):
    """Check the token files against the final block and vocabulary sizes and print the batch arithmetic.
    Returns (tokens per iteration, the data record for the checkpoints: None off rank 0)."""
    for path in (data.train_bin, data.val_bin):
        check_token_bin(path, min_tokens=args.block_size + 1, vocab_size=data.tokenizer.vocab_size)
    tokens_per_iter = grad_accum * dist.world_size * args.batch_size * args.block_size
    data_record = None
    if dist.master:
        print(f"data: {data.data_dir} | tokenization {data.tokenizer.info} | model vocab_size {vocab_size}")
        print(f"tokens per iteration: {tokens_per_iter:,} (batch_size {args.batch_size} x block_size "
              f"{args.block_size} x grad_accum {grad_accum} x {dist.world_size} process(es))")
        data_record = describe_split(data.train_bin, data.val_bin, data.tokenizer.info, data.data_dir)
    return tokens_per_iter, data_record


def resume_state(state, resume_ckpt, resume_path, data_record, data_dir, master):
    """The counters and the early stopper of a resumed run (its random streams: restore_rng)."""
    rec = resume_ckpt.get("data") or {}
    if master and rec.get("train_sha256") not in (None, data_record["train_sha256"]):
        raise ProjectError(f"{resume_path} was trained on different data ({rec.get('data_dir')}) "
                           f"than {data_dir}", "resume on the same data, or start a new run "
                           "with --init_from scratch and another --out_dir")
    state.step = int(resume_ckpt["iter_num"])
    state.best_val_loss = float(resume_ckpt.get("best_val_loss", float("inf")))
    state.best_step = resume_ckpt.get("best_iter")
    if resume_ckpt.get("early_stopping"):
        state.early.load_state_dict(resume_ckpt["early_stopping"])
    if master:
        print(f"resuming from {resume_path} at iter {state.step} (best val loss {state.best_val_loss:.4f})")


def build_optimizer(model, args, resume_ckpt, device_type):
    """AdamW (with a resumed run's moments)."""
    optimizer = model.configure_optimizers(args.weight_decay, args.learning_rate,
                                           (args.beta1, args.beta2), device_type)
    if resume_ckpt is not None and resume_ckpt.get("optimizer"):
        optimizer.load_state_dict(resume_ckpt["optimizer"])
    return optimizer


def wrap_model(model, args, dist, device):
    """Print the model's size, then torch.compile and DDP-wrap it as asked.
    Returns (the model to train, the model rank 0 evaluates: never the DDP wrapper)."""
    if dist.master:
        print(f"model: {model.get_num_params() / 1e6:.2f}M parameters, {args.n_layer} layers, "
              f"{args.n_head} heads, {args.n_embd} wide, block {args.block_size}")
    if args.compile:
        if dist.master:
            print("compiling the model (takes a minute)...")
        model = torch.compile(model)
    eval_model = model  # rank 0 evaluates alone, so never through the DDP wrapper
    model = wrap_ddp(model, dist, device)
    return model, eval_model


def restore_rng(state, resume_ckpt, args, dist, device):
    """A resumed run's random streams. Training batches come from one generator, seeded alike on
    every process and saved in checkpoints (see step_offsets): the data stream does not depend on
    the process count, and a resumed run draws exactly the batches the uninterrupted run would have
    drawn. torch's own generator (dropout) is seeded per process, and restored with as many processes."""
    rng = resume_ckpt.get("rng") or {}
    if rng.get("batch") is not None:
        state.batch_gen.set_state(rng["batch"])
    else:
        state.batch_gen.manual_seed(args.seed + state.step)
        if dist.master:
            print("note: the checkpoint holds no batch-stream state; batches are re-seeded")
    states = rng.get("states") or []
    if rng.get("world_size") == dist.world_size and len(states) == dist.world_size:
        mine = states[dist.rank]
        torch.set_rng_state(mine["torch"])
        if device.startswith("cuda") and "cuda" in mine:
            torch.cuda.set_rng_state(mine["cuda"], device)
    elif dist.master:
        print(f"note: the checkpoint was written by {rng.get('world_size')} process(es), this run has "
              f"{dist.world_size}; the batch stream continues unchanged, dropout noise is re-seeded")


@dataclass
class Outputs:
    """What a run writes to: the checkpoints, the metrics log, and the checkpoint fields fixed for the run."""
    ckpt_path: str
    last_path: str
    logger: JsonlLogger
    record: dict  # train_config, data (None off rank 0), tokenization, init_from: see save()


@dataclass(frozen=True)
class TrainRun:
    """What set-up builds and the loop only reads: the run's context (core/training.py: ranks, device,
    autocast, scaler), the corpus, the models, the optimizer (its moments and learning rate are the
    optimizer's own to change) and the outputs; the loop's changes all go to TrainState."""
    args: argparse.Namespace
    ctx: RunContext
    corpus: Corpus
    model: torch.nn.Module  # what trains: compiled and in DDP as asked
    eval_model: torch.nn.Module  # what rank 0 evaluates: never the DDP wrapper
    raw_model: torch.nn.Module  # what the checkpoints hold
    optimizer: torch.optim.Optimizer
    out: Outputs
    grad_accum: int  # this process's micro-steps per optimizer step
    tokens_per_iter: int
    t_start: float  # when the loop started (elapsed_s)
    print_every: int  # console_log_interval


def open_outputs(ctx, args, resumed_at, record):
    """--out_dir locked (once the model's source has been read: a refused --init_from leaves no directory; with
    --eval_only nothing is written) and metrics.jsonl started: a new run replaces an old one, a resumed one
    (resumed_at: its step) drops what was logged after its checkpoint (and TensorBoard what follows it)
    and logs it again. Every row goes to TensorBoard / W&B too (core/tracking.py)."""
    ctx.lock_out_dir(args)
    logger = ctx.open_log(args, os.path.join(args.out_dir, "metrics.jsonl"),
                          # the resumed run evaluates its step again, not its training rows
                          None if resumed_at is None else kept_records(resumed_at, lambda r: "val_loss" not in r),
                          f"note: starting a new run in {args.out_dir}; its old metrics.jsonl is replaced",
                          None if resumed_at is None else resumed_at + 1)
    return Outputs(*checkpoint_paths(args.out_dir), logger, record)


# ----------------------------------------------------------------------------- steps of the loop

def lr_at(it, args):
    if not args.decay_lr:
        return args.learning_rate
    return cosine_lr(it, args.learning_rate, args.min_lr, args.warmup_iters, args.lr_decay_iters)


@torch.no_grad()
def evaluate(state, run):
    """Mean train and val loss of run.eval_model over args.eval_iters batches each: {"train": ..., "val": ...}.
    The same eval batches every time (fixed seeds): evaluations differ only because the model
    changed, which keeps early stopping from reacting to sampling noise."""
    args, model, device = run.args, run.eval_model, run.ctx.device
    out = {}
    model.eval()
    for split, offset in (("train", 1), ("val", 2)):
        g = torch.Generator().manual_seed(args.seed + 1_000_003 * offset)
        losses = torch.zeros(args.eval_iters)
        for k in range(args.eval_iters):
            X, Y = get_batch(run.corpus, split, args.batch_size, args.block_size, g, device)
            with run.ctx.amp:
                _, loss = model(X, Y)
            losses[k] = loss.item()
        out[split] = losses.mean().item()
    model.train()
    check_finite(out["train"], "train loss", state.step)
    check_finite(out["val"], "val loss", state.step)
    return out


def save(state, run, best, last):
    """Write the training state of run.raw_model and its optimizer to ckpt.pt (best) and/or last.pt (last),
    atomically, with run.out.record (the checkpoint fields fixed for the run: train_config, data,
    tokenization, init_from); state.rng_states must hold every process's random state (gather_rng_states)."""
    record = run.out.record
    path_best, path_last = run.out.ckpt_path if best else None, run.out.last_path if last else None
    ckpt = make_checkpoint(run.raw_model, run.optimizer, iter_num=state.step, best_val_loss=state.best_val_loss,
                           best_iter=state.best_step, early_stopping=state.early.state_dict(),
                           train_config=record["train_config"], data=record["data"],
                           tokenization=record["tokenization"], init_from=record["init_from"],
                           rng={"world_size": state.world_size, "batch": state.batch_gen.get_state(),
                                "states": state.rng_states})
    # ckpt.pt first: a kill between the two writes leaves last.pt one evaluation behind,
    # so a resume redoes this evaluation and writes ckpt.pt again (the other order would
    # resume past it and never write this best model)
    first = path_best or path_last
    atomic_torch_save(ckpt, first)
    if path_last and path_best:  # same content: copy the file instead of serialising twice
        with open(path_best, "rb") as src, atomic_output(path_last, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 22)


def after_eval(state, run, losses, lr):
    """Rank 0 after an evaluation: print it and, when training, track the best val loss and the
    early stopper, log it and write the checkpoints. Returns whether the run stops here."""
    args, out = run.args, run.out
    val_ppl = math.exp(losses["val"])
    line = (f"step {state.step}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}, "
            f"val ppl {val_ppl:.2f}")
    if args.eval_only:
        print(line)
        state.stop_reason = "eval_only"
        return True
    improved = losses["val"] < state.best_val_loss
    if improved:
        state.best_val_loss, state.best_step = losses["val"], state.step
    early = state.early
    early.step(losses["val"])
    if early.bad_checks and args.patience:  # a new best by less than min_delta counts too
        what = "new best, but by less than" if improved else "no improvement of"
        line += f" ({what} {args.min_delta}: {early.bad_checks}/{args.patience} toward early stopping)"
    print(line)
    out.logger.log(step=state.step, train_loss=losses["train"], val_loss=losses["val"],
                   val_ppl=val_ppl, best_val_loss=state.best_val_loss, lr=lr, elapsed_s=time.time() - run.t_start)
    write_last = args.always_save_checkpoint or early.should_stop or state.step >= args.max_iters
    if improved or write_last:
        save(state, run, improved, write_last)
    if improved:
        print(f"saved {out.ckpt_path} (best val loss so far)")
    if early.should_stop:
        state.stop_reason = (f"early stopping (val loss did not improve by >= {args.min_delta} for "
                             f"{args.patience} evaluations)")
    return early.should_stop


def broadcast_stop(stop, dist, device):
    """Rank 0's decision to stop, on every process: they must leave the loop together."""
    if not dist.enabled:
        return stop
    flag = torch.tensor([int(stop)], device=device)
    torch.distributed.broadcast(flag, src=0)
    return bool(flag.item())


def train_step(state, run):
    """One optimizer step over run.grad_accum micro-batches; the loss is added to state.loss_sum."""
    args, model, grad_accum, dist, device = run.args, run.model, run.grad_accum, run.ctx.dist, run.ctx.device
    offsets = step_offsets(run.corpus, grad_accum, args.batch_size, args.block_size, state.batch_gen, dist)
    X, Y = batch_at(run.corpus, "train", offsets[0], args.block_size, device)
    for micro_step in range(grad_accum):
        if dist.enabled:  # all-reduce the gradients only on the last micro-step
            model.require_backward_grad_sync = micro_step == grad_accum - 1
        with run.ctx.amp:
            _, loss = model(X, Y)
            loss = loss / grad_accum
        if micro_step < grad_accum - 1:  # fetch the next batch while the GPU works
            X, Y = batch_at(run.corpus, "train", offsets[micro_step + 1], args.block_size, device)
        state.loss_sum += loss.detach()
        run.ctx.scaler.scale(loss).backward()
    clip_and_step(run.ctx.scaler, run.optimizer, model.parameters(), args.grad_clip)
    run.optimizer.zero_grad(set_to_none=True)


def log_training(state, run, lr):
    """Log the mean training loss of the steps since the last log line (and print it when the
    step is a multiple of run.print_every: console_log_interval), then reset the tally."""
    dist, tokens_per_iter = run.ctx.dist, run.tokens_per_iter
    if dist.enabled:  # log the loss of the whole step, not rank 0's share of it
        torch.distributed.all_reduce(state.loss_sum)
        state.loss_sum /= dist.world_size
    steps = state.step - state.step_log + 1
    lossf = state.loss_sum.item() / steps
    check_finite(lossf, "training loss", state.step)
    now = time.time()
    dt = (now - state.t_log) / steps
    if dist.master:
        if state.step % run.print_every == 0:
            print(f"iter {state.step}: loss {lossf:.4f}, lr {lr:.2e}, time {dt * 1000:.1f}ms, "
                  f"{tokens_per_iter / dt:,.0f} tok/s")
        run.out.logger.log(step=state.step, loss=lossf, lr=lr, tokens_per_s=tokens_per_iter / dt,
                           elapsed_s=now - run.t_start)
    state.t_log, state.step_log = now, state.step + 1
    state.loss_sum.zero_()


def console_log_interval(args, tty):
    """Iterations between two printed training lines: --log_interval on a terminal; elsewhere (a log
    file, a pipe, a step of run_cycles.py) the multiple of it that prints at most about 100 lines
    per run. metrics.jsonl keeps a row every --log_interval either way."""
    if tty:
        return args.log_interval
    return args.log_interval * max(1, math.ceil(args.max_iters / (100 * args.log_interval)))


def write_run_summary(state, args, model, metrics_path):
    """out_dir/train_summary.json, the run's record for what builds on it (run_cycles' FLOPs count and
    control arm): iterations, the batch and evaluation settings, the model's shape, the last logged
    train loss (metrics.jsonl, a resumed run's earlier rows included) and the best val loss."""
    losses = [r["loss"] for r in read_jsonl(metrics_path) if "loss" in r]
    summary = {"iters": state.step, "stop_reason": state.stop_reason,
               **{k: getattr(args, k) for k in ("batch_size", "gradient_accumulation_steps", "block_size",
                                                "eval_interval", "eval_iters", "log_interval", "max_iters")},
               **model_shape(model), "train_loss_final": losses[-1] if losses else None,
               "best_val_loss": state.best_val_loss if math.isfinite(state.best_val_loss) else None,
               "best_iter": state.best_step}
    atomic_write_text(os.path.join(args.out_dir, SUMMARY_NAME), json.dumps(summary, indent=2) + "\n")


def print_summary(state, args, start_step, t_start, ckpt_path):
    wall = time.time() - t_start
    if args.eval_only:
        print(f"eval only: nothing was written (wall time {wall:.1f}s)")
    elif state.best_step is None:
        print(f"done: no evaluation was run; {state.step - start_step} iterations in {wall:.1f}s; "
              f"stopped: {state.stop_reason}")
    else:
        print(f"done: best val loss {state.best_val_loss:.4f} (ppl {math.exp(state.best_val_loss):.2f}) at iter "
              f"{state.best_step}; {state.step - start_step} iterations (iter_num {state.step}) in "
              f"{wall:.1f}s; stopped: {state.stop_reason}; best checkpoint {ckpt_path}")


# ----------------------------------------------------------------------------- the script

def main():
    args = parse_args()
    ctx = open_run(args, backend=args.backend, writes=not args.eval_only, lock=False)  # open_outputs locks
    dist, device, device_type, master = ctx.dist, ctx.device, ctx.device_type, ctx.master
    grad_accum = setup_device(args, ctx)
    data = setup_data(args)
    vocab_size = data.tokenizer.vocab_size if data.tokenizer.method == "char" else BPE_PADDED_VOCAB
    model = resume_ckpt = pretrained = None
    if args.init_from == "resume":
        model, resume_ckpt, resume_path, vocab_size = init_resume(args, data, vocab_size)
        pretrained = resume_ckpt.get("init_from")
    elif args.init_from != "scratch":
        model, pretrained, vocab_size = init_pretrained(args, data, master)
    tokens_per_iter, data_record = describe_data(args, data, vocab_size, grad_accum, dist)

    torch.manual_seed(args.seed + dist.rank)  # a new model's weights, then dropout noise
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    state = new_state(args, dist.world_size)
    if resume_ckpt is not None:
        resume_state(state, resume_ckpt, resume_path, data_record, data.data_dir, master)
    elif pretrained is not None and master:
        print(f"initialised from {pretrained['path']} ({pretrained['format']}); training starts at iter 0")
    if model is None:
        model = GPT(GPTConfig(block_size=args.block_size, vocab_size=vocab_size, n_layer=args.n_layer,
                              n_head=args.n_head, n_embd=args.n_embd, dropout=args.dropout, bias=args.bias))
    raw_model = model.to(device)
    optimizer = build_optimizer(raw_model, args, resume_ckpt, device_type)
    model, eval_model = wrap_model(raw_model, args, dist, device)
    if resume_ckpt is not None:
        restore_rng(state, resume_ckpt, args, dist, device)
    out = open_outputs(ctx, args, state.step if resume_ckpt else None,
                       dict(train_config=vars(args), data=data_record, tokenization=data.tokenizer.info.to_dict(),
                            init_from=pretrained))
    run = TrainRun(args, ctx, data, model, eval_model, raw_model, optimizer, out, grad_accum, tokens_per_iter,
                   time.time(), console_log_interval(args, sys.stdout.isatty()))
    start_step = state.step
    train_loop(state, run, resumed=resume_ckpt is not None)

    if master:
        print_summary(state, args, start_step, run.t_start, out.ckpt_path)
    out.logger.close()
    if master and not args.eval_only:
        write_run_summary(state, args, raw_model, out.logger.path)
    finish(ctx)


def train_loop(state, run, resumed):
    """The loop, from state.step until max_iters or a stop: evaluate (rank 0) at every eval_interval (not
    again at a resumed run's first step, its checkpoint's evaluation), then one optimizer step."""
    args, dist, device = run.args, run.ctx.dist, run.ctx.device
    start_step = state.step
    state.t_log, state.step_log = time.time(), state.step
    state.loss_sum = torch.zeros((), device=device)
    while True:
        lr = lr_at(state.step, args)
        for group in run.optimizer.param_groups:
            group["lr"] = lr

        at_eval = state.step % args.eval_interval == 0 or state.step >= args.max_iters
        if args.eval_only or (at_eval and not (resumed and state.step == start_step)):
            t_eval = time.time()
            state.rng_states = gather_rng_states(dist, device)
            stop = False
            if dist.master:
                losses = evaluate(state, run)
                stop = after_eval(state, run, losses, lr)
            if broadcast_stop(stop, dist, device):
                break
            state.t_log += time.time() - t_eval  # tokens/s counts training time only
        if state.step >= args.max_iters:
            state.stop_reason = state.stop_reason or "max_iters reached"
            break
        if state.early.should_stop:  # resumed from a run that had already stopped early: train no further
            state.stop_reason = state.stop_reason or "early stopping (already reached before this resume)"
            break

        train_step(state, run)
        if state.step % args.log_interval == 0:
            log_training(state, run, lr)
        state.step += 1


if __name__ == "__main__":
    run_cli(main, report_peak=True)
