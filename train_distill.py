"""
Distil an ensemble of generators into one generator of the base's shape (Kim, Kotha, Liang, Hashimoto 2025,
"Pre-training under infinite compute": with limited data an ensemble of K models beats one, and a student
distilled from it keeps most of the gain). Per train token the student minimises

    alpha * KL(ensemble || student) + (1 - alpha) * cross-entropy(next token)

the ensemble being the mean of the teachers' probabilities (lib/ensemble.py; eval mode, no gradients), with
train.py's recipe: AdamW, warmup + cosine, random windows, and an evaluation every --eval_interval whose val NLL
picks ckpt.pt and stops the run after --patience evaluations without improvement (val KL logged beside it).

$ python train_distill.py --teachers a/ckpt.pt,b/ckpt.pt --init_config_from a/ckpt.pt --out_dir out-distill
$ python train_distill.py ...the same flags... --resume      # continue out_dir/last.pt exactly

Recipe flags left out take the base checkpoint's (its train.py flags), else train.py's defaults. Writes what
train.py writes: ckpt.pt (best val NLL), last.pt (latest state), metrics.jsonl, train_summary.json (train.py's
fields, the student's cost by experiment/flops.step_train, plus teacher_flops, the teachers' forward passes, and
flops, the total).
"""
import argparse
import json
import math
import os
import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Optional

import numpy as np
import torch

from core.cli import check_flag_ranges, run_cli
from core.devices import add_dtype_arg, clip_and_step
from core.errors import ProjectError, check_finite
from core.files import atomic_torch_save, atomic_write_text, read_jsonl
from core.schedule import EarlyStopping, cosine_lr
from core.training import finish, open_run
from lib.checkpoint import (checkpoint_config, checkpoint_mode, checkpoint_train_config, make_checkpoint,
                            model_from_checkpoint, model_shape, read_checkpoint)
from lib.corpus import Corpus, check_token_bin, describe_split
from lib.ensemble import distillation_loss, forward_flops, load_ensemble, split_paths
from lib.hf_interop import source_sha256
from model import GPT
from tokenization_manager import check_tokenization_match

# train.py's defaults of the recipe flags (where neither a flag nor the base checkpoint gives one)
RECIPE = dict(learning_rate=6e-4, min_lr=6e-5, warmup_iters=2000, lr_decay_iters=600000, max_iters=600000,
              batch_size=12, weight_decay=0.1, dropout=0.0, beta1=0.9, beta2=0.95, grad_clip=1.0,
              eval_interval=2000, eval_iters=200, patience=5, min_delta=0.001, log_interval=1)


def build_parser():
    p = argparse.ArgumentParser(description="Distil an ensemble of generator checkpoints into one generator.")
    a = p.add_argument
    a("--teachers", required=True, help="the ensemble: K >= 2 generator checkpoints, comma-separated")
    a("--init_config_from", default=None, help="base checkpoint: the student takes its shape, fresh weights")
    a("--init_from", default=None, help="checkpoint whose weights the student starts from (instead)")
    a("--data_dir", default="data/shakespeare_char", help="prepared corpus (train.bin, val.bin)")
    a("--out_dir", required=True, help="where ckpt.pt, last.pt, metrics.jsonl and train_summary.json go")
    a("--alpha", type=float, default=0.5, help="weight of KL(ensemble || student); 1 - alpha weighs the CE")
    a("--resume", action="store_true", help="continue the run in --out_dir (its last.pt)")
    for name, v in RECIPE.items():
        a(f"--{name}", type=type(v), default=None, help=f"train.py's --{name} (default: the base's, else {v})")
    a("--seed", type=int, default=1337, help="seed of the student's weights, batches and dropout")
    a("--device", default="auto", help="auto | cpu | cuda | cuda:N | mps")
    add_dtype_arg(p)
    a("--tensorboard_dir", default="auto", help="TensorBoard events ('auto': OUT_DIR/tb if installed; 'none')")
    return p


def parse_args(argv=None):
    args = build_parser().parse_args(argv)
    k = len(split_paths(args.teachers))
    if k < 2:
        raise ProjectError(f"--teachers names {k} checkpoint(s); an ensemble needs K >= 2",
                           "pass two or more generator checkpoints, comma-separated: --teachers a/ckpt.pt,b/ckpt.pt")
    if not 0 <= args.alpha <= 1:
        raise ProjectError(f"--alpha must be in [0, 1], got {args.alpha}", "1: distillation alone, 0: plain MLE")
    if (args.init_from is None) == (args.init_config_from is None):
        raise ProjectError("pass exactly one of --init_config_from and --init_from",
                           "--init_config_from CKPT: fresh weights of its shape; --init_from CKPT: its weights")
    args.base_flag = "--init_from" if args.init_from else "--init_config_from"
    args.base = args.init_from or args.init_config_from
    if not os.path.isfile(args.base):
        raise ProjectError(f"{args.base_flag} {args.base}: no such checkpoint file", "pass the base run's ckpt.pt")
    return args


def resolve_recipe(args, base):
    """Each recipe flag left out: the base checkpoint's train.py flag, else train.py's default; then checked."""
    cfg = checkpoint_train_config(base)
    for name, v in RECIPE.items():
        if getattr(args, name) is None:
            setattr(args, name, type(v)(cfg[name]) if isinstance(cfg.get(name), (int, float)) else v)
    check_flag_ranges(args, "train_distill.py", [
        *((n, getattr(args, n) >= 1, ">= 1") for n in ("eval_interval", "eval_iters", "batch_size", "log_interval")),
        *((n, getattr(args, n) >= 0, ">= 0") for n in ("max_iters", "patience")),
        # the schedule always decays from --learning_rate to --min_lr (a base trained at a constant rate, train.py's
        # --decay_lr False, records a min_lr it never used)
        ("min_lr", args.min_lr <= args.learning_rate, f"<= --learning_rate ({args.learning_rate:g})")])


# ----------------------------------------------------------------------------- set-up

def build_student(args, base, resumed, device):
    """The student: a resumed run's, the --init_from weights, or fresh weights of --init_config_from's shape."""
    if checkpoint_mode(resumed or base) != "generator":
        raise ProjectError(f"{args.base_flag} {args.base} is a reward model", "pass a generator checkpoint")
    torch.manual_seed(args.seed)  # fresh weights, then dropout noise (a resumed run restores its RNG)
    if resumed is not None or args.init_from:
        return model_from_checkpoint(resumed or base, path=args.base, dropout=args.dropout)[0].to(device)
    config = checkpoint_config(base, args.base)
    config.dropout = args.dropout
    return GPT(config).to(device)


def open_corpus(args, student, teachers):
    """--data_dir checked against the student's block and vocabulary and against the teachers."""
    if not os.path.isdir(args.data_dir):
        raise ProjectError(f"--data_dir {args.data_dir} does not exist",
                           "prepare one: python prepare_data.py --input your.txt --out_dir DIR")
    corpus = Corpus(args.data_dir)
    for p in (corpus.train_bin, corpus.val_bin):
        check_token_bin(p, min_tokens=student.config.block_size + 1, vocab_size=corpus.tokenizer.vocab_size)
    if teachers.tokenization is not None:
        check_tokenization_match(corpus.tokenizer.info, teachers.tokenization, what=f"--data_dir {args.data_dir}")
    for field in ("vocab_size", "block_size"):
        t, s = getattr(teachers.config, field), getattr(student.config, field)
        if t != s:
            raise ProjectError(f"--teachers have {field} {t} but the student ({args.base_flag} {args.base}) has {s}",
                               f"distil teachers of the student's {field}: trained on this corpus like the base")
    return corpus


def existing_run(args):
    """The run in --out_dir to resume (its checkpoint, read), or None for a new run; never overwrites one."""
    found = [p for p in (os.path.join(args.out_dir, n) for n in ("last.pt", "ckpt.pt")) if os.path.exists(p)]
    if not args.resume:
        if found:
            raise ProjectError(f"--out_dir {args.out_dir} already holds a run ({os.path.basename(found[0])})",
                               "pass --resume to continue it, or choose another --out_dir")
        return None
    if not found:
        raise ProjectError(f"--resume: no last.pt or ckpt.pt in {args.out_dir}", "drop --resume to start a new run")
    ckpt = read_checkpoint(found[0])
    if "distill" not in ckpt:
        raise ProjectError(f"{found[0]} was not written by train_distill.py", "choose another --out_dir")
    return ckpt


def setup(args, ctx):
    """What the loop reads (one namespace), the state it changes (resumed or new), and whether it was resumed."""
    base, resumed = read_checkpoint(args.base), existing_run(args)
    resolve_recipe(args, base)
    teachers = load_ensemble(args.teachers, ctx.device, flag="--teachers").requires_grad_(False)
    model = build_student(args, base, resumed, ctx.device)
    corpus = open_corpus(args, model, teachers)
    data = describe_split(corpus.train_bin, corpus.val_bin, corpus.tokenizer.info, args.data_dir)
    distill = {"alpha": args.alpha, "train_sha256": data["train_sha256"], "base": os.path.abspath(args.base),
               "teachers": [{**s, "sha256": source_sha256(s["path"])} for s in teachers.sources]}
    optimizer = model.configure_optimizers(args.weight_decay, args.learning_rate, (args.beta1, args.beta2),
                                           ctx.device_type)
    state = State(EarlyStopping(args.patience, args.min_delta, "min"), torch.Generator().manual_seed(args.seed))
    if resumed is not None:
        resume(state, resumed, optimizer, distill, ctx.device)
    ctx.lock_out_dir(args)
    keep = None if resumed is None else (lambda r: r["step"] < state.step or (r["step"] == state.step
                                                                               and "val_loss" in r))
    logger = ctx.open_log(args, os.path.join(args.out_dir, "metrics.jsonl"), keep,
                          purge_step=None if resumed is None else state.step + 1)
    record = dict(data=data, tokenization=corpus.tokenizer.info.to_dict(), distill=distill,
                  init_from={"path": os.path.abspath(args.base), "format": "checkpoint",
                             "iter_num": base.get("iter_num")} if args.init_from else None)
    torch.backends.cuda.matmul.allow_tf32 = True
    return SimpleNamespace(args=args, ctx=ctx, corpus=corpus, model=model, teachers=teachers, optimizer=optimizer,
                           logger=logger, record=record, t_start=time.time()), state, resumed is not None


@dataclass
class State:
    """What the loop changes; a checkpoint holds it to continue exactly (with the optimizer and torch's RNG)."""
    early: EarlyStopping
    batch_gen: torch.Generator  # the train batches' stream
    step: int = 0
    best_val_loss: float = float("inf")
    best_step: Optional[int] = None
    stop_reason: Optional[str] = None


def resume(state, ckpt, optimizer, distill, device):
    """The state of a resumed run, refused where its teachers, alpha or train split differ from this command's."""
    def identity(d):
        return d["alpha"], d["train_sha256"], [t["sha256"] for t in d["teachers"]]
    if identity(ckpt["distill"]) != identity(distill):
        raise ProjectError("--resume: the run in --out_dir had other --teachers, --alpha or --data_dir",
                           "resume with the run's own flags, or start a new run in another --out_dir")
    optimizer.load_state_dict(ckpt["optimizer"])
    state.step, state.best_step = int(ckpt["iter_num"]), ckpt.get("best_iter")
    state.best_val_loss = float(ckpt.get("best_val_loss") or float("inf"))
    state.early.load_state_dict(ckpt["early_stopping"])
    state.batch_gen.set_state(ckpt["rng"]["batch"])
    rng = ckpt["rng"]["states"][0]
    torch.set_rng_state(rng["torch"])
    if str(device).startswith("cuda") and "cuda" in rng:
        torch.cuda.set_rng_state(rng["cuda"], device)
    print(f"resuming at iter {state.step} (best val loss {state.best_val_loss:.4f})")


# ----------------------------------------------------------------------------- the loop

def get_batch(run, split, generator):
    """nanoGPT's batch: random windows of a split (offsets from generator), inputs and next-token targets."""
    B, T = run.args.batch_size, run.model.config.block_size
    ix = torch.randint(run.corpus.num_tokens(split) - T, (B,), generator=generator).numpy()
    win = torch.from_numpy(run.corpus.fresh_tokens(split)[ix[:, None] + np.arange(T + 1)].astype(np.int64))
    return win[:, :-1].contiguous().to(run.ctx.device), win[:, 1:].contiguous().to(run.ctx.device)


def losses(run, X, Y, alpha, scale=None):
    """distillation_loss of the student on a batch (its backward too where grad is on), teachers without grad."""
    with torch.no_grad(), run.ctx.amp:
        th = run.teachers.member_states(X)
    with run.ctx.amp:
        x = run.model.hidden_states(X)
    return distillation_loss(x, run.model.lm_head.weight, th, run.teachers.heads, Y, alpha, scale)


@torch.no_grad()
def evaluate(state, run):
    """train.py's estimate on the same fixed batches every time: {"train", "val"} NLL and the val KL."""
    out = {}
    run.model.eval()
    for split, offset in (("train", 1), ("val", 2)):
        g = torch.Generator().manual_seed(run.args.seed + 1_000_003 * offset)
        rs = [losses(run, *get_batch(run, split, g), 1.0) for _ in range(run.args.eval_iters)]
        out[split], out[f"{split}_kl"] = (float(np.mean([r[k] for r in rs])) for k in ("ce", "kl"))
        check_finite(out[split], f"{split} loss", state.step)
    run.model.train()
    return out


def after_eval(state, run, ev, lr):
    """Log an evaluation, track the best val loss and the early stopper, save. Returns whether to stop."""
    improved = ev["val"] < state.best_val_loss
    if improved:
        state.best_val_loss, state.best_step = ev["val"], state.step
    state.early.step(ev["val"])
    print(f"step {state.step}: train loss {ev['train']:.4f}, val loss {ev['val']:.4f}, val KL {ev['val_kl']:.4f}")
    run.logger.log(step=state.step, train_loss=ev["train"], val_loss=ev["val"], val_ppl=math.exp(ev["val"]),
                   train_kl=ev["train_kl"], val_kl=ev["val_kl"], best_val_loss=state.best_val_loss, lr=lr,
                   elapsed_s=time.time() - run.t_start)
    rng = {"torch": torch.get_rng_state()}
    if run.ctx.device.startswith("cuda"):
        rng["cuda"] = torch.cuda.get_rng_state(run.ctx.device)
    ckpt = make_checkpoint(run.model, run.optimizer, iter_num=state.step, best_val_loss=state.best_val_loss,
                           best_iter=state.best_step, early_stopping=state.early.state_dict(),
                           train_config={k: v for k, v in vars(run.args).items() if k != "resume"},
                           rng={"world_size": 1, "batch": state.batch_gen.get_state(), "states": [rng]}, **run.record)
    for name in ("ckpt.pt",) * improved + ("last.pt",):  # ckpt.pt first, as train.py: last.pt is never ahead
        atomic_torch_save(ckpt, os.path.join(run.args.out_dir, name))
    if state.early.should_stop:
        state.stop_reason = f"early stopping (val loss did not improve for {run.args.patience} evaluations)"
    return state.early.should_stop


def train_loop(state, run, resumed):
    """train.py's loop: evaluate at every eval_interval (not again at a resumed step), then one AdamW step."""
    args, start = run.args, state.step
    while True:
        lr = cosine_lr(state.step, args.learning_rate, args.min_lr, args.warmup_iters, args.lr_decay_iters)
        for group in run.optimizer.param_groups:
            group["lr"] = lr
        at_eval = state.step % args.eval_interval == 0 or state.step >= args.max_iters
        if at_eval and not (resumed and state.step == start) and after_eval(state, run, evaluate(state, run), lr):
            break
        if state.step >= args.max_iters or state.early.should_stop:
            state.stop_reason = state.stop_reason or ("max_iters reached" if state.step >= args.max_iters
                                                      else "early stopping (already reached before this resume)")
            break
        r = losses(run, *get_batch(run, "train", state.batch_gen), args.alpha, run.ctx.scaler.scale)
        clip_and_step(run.ctx.scaler, run.optimizer, run.model.parameters(), args.grad_clip)
        run.optimizer.zero_grad(set_to_none=True)
        if state.step % args.log_interval == 0:
            check_finite(r["loss"], "training loss", state.step)
            print(f"iter {state.step}: loss {r['loss']:.4f} (KL {r['kl']:.4f}, CE {r['ce']:.4f}), lr {lr:.2e}")
            run.logger.log(step=state.step, loss=r["loss"], kl=r["kl"], ce=r["ce"], lr=lr,
                           elapsed_s=time.time() - run.t_start)
        state.step += 1


def write_summary(state, run):
    """train_summary.json: train.py's fields (experiment/flops.step_train counts the student from them) plus the
    teachers' forward passes on every train and evaluation token (teacher_flops) and the total (flops)."""
    args, T = run.args, run.model.config.block_size
    train_losses = [r["loss"] for r in read_jsonl(run.logger.path) if "loss" in r]
    evals = state.step // args.eval_interval + 1 + (state.step % args.eval_interval != 0)
    train_tokens, eval_tokens = state.step * args.batch_size * T, evals * 2 * args.eval_iters * args.batch_size * T
    f_student = forward_flops(model_shape(run.model)["model_args"], T)
    f_teachers = sum(forward_flops(t["model_args"], T) for t in run.record["distill"]["teachers"])
    teacher_flops = f_teachers * (train_tokens + eval_tokens)
    summary = {"iters": state.step, "stop_reason": state.stop_reason, "batch_size": args.batch_size,
               "gradient_accumulation_steps": 1, "block_size": T, "eval_interval": args.eval_interval,
               "eval_iters": args.eval_iters, "log_interval": args.log_interval, "max_iters": args.max_iters,
               **model_shape(run.model), "train_loss_final": train_losses[-1] if train_losses else None,
               "best_val_loss": state.best_val_loss if math.isfinite(state.best_val_loss) else None,
               "best_iter": state.best_step, **run.record["distill"],
               "teacher_forward_flops_per_token": f_teachers, "teacher_flops": float(teacher_flops),
               "flops": float(3 * f_student * train_tokens + f_student * eval_tokens + teacher_flops)}
    atomic_write_text(os.path.join(args.out_dir, "train_summary.json"), json.dumps(summary, indent=2) + "\n")


def main(argv=None):
    args = parse_args(argv)
    ctx = open_run(args, distributed=False, lock=False)
    run, state, resumed = setup(args, ctx)
    print(f"distilling {len(run.teachers.members)} teachers into a {run.model.get_num_params() / 1e6:.2f}M student, "
          f"alpha {args.alpha}, on {args.data_dir}")
    train_loop(state, run, resumed)
    run.logger.close()
    write_summary(state, run)
    print(f"done: best val loss {state.best_val_loss:.4f} at iter {state.best_step}; stopped: {state.stop_reason}")
    finish(ctx)


if __name__ == "__main__":
    run_cli(main, report_peak=True)
