"""
The whole adversarial process in one command.

  cycle 0   train the base generator (train.py, early stopping) or take --base_ckpt
  cycle n   1. reward dataset from the current generator      (prepare_reward_data.py)
            2. a fresh reward model on it                      (train_reward_model.py)
            3. GRPO of the generator against that reward model (train_grpo.py)
            4. held-out val loss / perplexity of the new generator

It stops after --max_cycles, or when the val perplexity has not improved by
--min_delta for --patience cycles. Everything lands in --out_dir, one
subdirectory per cycle; every finished step leaves a `<step>.done.json`, so
rerunning the same command resumes after the last finished step (and an
interrupted step resumes through that script's own resume option).

    python run_cycles.py                      # Shakespeare characters, ~15 min on 2 CPU cores
    python run_cycles.py --preset quick       # a few minutes, a much smaller setting

Outputs: OUT/summary.md, OUT/summary.json and OUT/summary.png (per cycle: generator
val loss/perplexity, reward-model val MAE = how detectable that generator is, GRPO
mean reward at start and end, final KL).
"""
import argparse
import codecs
import json
import math
import os
import subprocess
import sys
import time

import torch

from common import (EarlyStopping, ProjectError, atomic_write_text, check_writable_dir, hold_dir_lock,
                    resolve_device, run_cli)

ROOT = os.path.dirname(os.path.abspath(__file__))

# Settings per preset. Flags given on the command line override single entries
# (--base_config, --max_cycles, ...); `extra_*` flags append raw arguments per step.
PRESETS = {
    # ~15 minutes on 2 CPU cores: nanoGPT's CPU model (4x128, block 64), two cycles
    "default": dict(
        base_config="config/train_shakespeare_char_cpu.py",
        max_cycles=2,
        reward_data=["--samples_per_chunk", "2", "--max_blocks_per_split", "2500",
                     "--gen_batch_size", "128"],
        reward_model=["--max_iters", "1500", "--batch_size", "64", "--eval_interval", "100",
                      "--learning_rate", "1e-3", "--patience", "5"],
        grpo=["--max_steps", "60", "--prompts_per_step", "8", "--group_size", "8",
              "--learning_rate", "2e-5", "--eval_interval", "20", "--save_interval", "20",
              "--eval_max_batches", "20"],  # run_cycles scores the full val set itself
    ),
    # a few minutes: the tiny 2x64 model and small step counts
    "quick": dict(
        base_config="config/train_shakespeare_char_tiny.py",
        max_cycles=2,
        reward_data=["--samples_per_chunk", "1", "--max_blocks_per_split", "600",
                     "--gen_batch_size", "128"],
        reward_model=["--max_iters", "300", "--batch_size", "64", "--eval_interval", "50",
                      "--learning_rate", "1e-3", "--patience", "3"],
        grpo=["--max_steps", "20", "--prompts_per_step", "4", "--group_size", "8",
              "--learning_rate", "2e-5", "--eval_interval", "10", "--save_interval", "10",
              "--eval_max_batches", "10"],
    ),
}


def parse_args():
    ap = argparse.ArgumentParser(
        description="Run the generator / reward-model / GRPO cycle end to end, resumably.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="default",
                    help="step settings: 'default' (~15 min on 2 CPU cores) or 'quick' (a few minutes)")
    ap.add_argument("--out_dir", default=None,
                    help="run directory (default: runs/shakespeare_char_<preset>)")
    ap.add_argument("--data_dir", default="data/shakespeare_char",
                    help="prepared corpus (train.bin, val.bin, meta.pkl for char); the built-in "
                         "Shakespeare directories are prepared automatically when missing")
    ap.add_argument("--base_ckpt", default=None,
                    help="start from this generator checkpoint (a .pt file, or a local Hugging Face GPT-2 "
                         "directory with a BPE --data_dir) instead of training cycle 0")
    ap.add_argument("--base_config", default=None,
                    help="train.py preset for cycle 0 (default: the preset's)")
    ap.add_argument("--max_cycles", type=int, default=None,
                    help="number of reward-model + GRPO cycles after cycle 0 (default: the preset's)")
    ap.add_argument("--patience", type=int, default=2,
                    help="stop when val perplexity has not improved by --min_delta for this many cycles")
    ap.add_argument("--min_delta", type=float, default=0.0,
                    help="smallest val-perplexity decrease that counts as an improvement")
    ap.add_argument("--seed", type=int, default=1337, help="base seed; each cycle and step derives its own")
    ap.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps (passed to every step)")
    ap.add_argument("--eval_batch_size", type=int, default=64, help="batch size of the val perplexity evaluation")
    ap.add_argument("--nproc_per_node", type=int, default=1,
                    help="run the four heavy steps under torchrun with this many processes (1: plain python); "
                         "results do not depend on it, except in cycle 0: train.py's --batch_size counts per "
                         "process and its --gradient_accumulation_steps must be divisible by it (set both with "
                         "--extra_base, e.g. '--gradient_accumulation_steps 2 --batch_size 6' for 2 processes)")
    for step in ("base", "reward_data", "reward_model", "grpo"):
        ap.add_argument(f"--extra_{step}", default="",
                        help=f"extra arguments appended to the {step} step's command line "
                             f"(one quoted string; use the = form because it starts with --, "
                             f"e.g. --extra_{step}='--seed 3')")
    return ap.parse_args()


# ----------------------------------------------------------------------------- steps

RUN_LOCK_FD = None  # held for the whole run and inherited by the steps


def run_step(name, cmd, log_path, nproc=1):
    """Run one script (under torchrun when nproc > 1), streaming its output to the console
    and to a log file."""
    if nproc > 1:
        cmd = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"] + cmd
    print(f"\n=== {name}: {' '.join(cmd)}", flush=True)
    t0 = time.time()
    with open(log_path, "a") as log:
        log.write(f"\n$ {' '.join(cmd)}\n")
        log.flush()
        # unbuffered: output streams as it comes, and a step orphaned by `kill -9` of this
        # process fails at its next line (broken pipe) instead of running on unseen
        proc = subprocess.Popen([sys.executable] + cmd, cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, bufsize=0,
                                env=dict(os.environ, PYTHONUNBUFFERED="1"),
                                pass_fds=() if RUN_LOCK_FD is None else (RUN_LOCK_FD,))
        # the console gets the raw stream (progress bars redraw in place with \r); the log
        # and the error tail get each line's final state, not every redraw of a bar
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        pending, tail = "", []
        while True:
            chunk = proc.stdout.read(65536)
            text = decoder.decode(chunk, final=not chunk)
            sys.stdout.write(text)
            sys.stdout.flush()
            *lines, pending = (pending + text).split("\n")
            pending = "\r".join(pending.split("\r")[-2:])  # a bar's older redraws are not needed
            for line in lines:
                line = line.rstrip("\r").rsplit("\r", 1)[-1] + "\n"
                log.write(line)
                tail = (tail + [line])[-20:]
            if not chunk:
                break
        if pending:
            log.write(pending.rsplit("\r", 1)[-1] + "\n")
        rc = proc.wait()
    if rc != 0:
        raise ProjectError(f"step '{name}' failed (exit {rc}); its output is in {log_path}:\n"
                           + "".join(tail).rstrip(),
                           "fix the cause and rerun the same command: finished steps are skipped")
    return time.time() - t0


def fmt(v, spec=".4f"):
    return "-" if v is None else format(v, spec)


def done_path(d, step):
    return os.path.join(d, f"{step}.done.json")


def read_done(d, step):
    p = done_path(d, step)
    if os.path.exists(p):
        with open(p) as f:
            return json.load(f)
    return None


def mark_done(d, step, record):
    atomic_write_text(done_path(d, step), json.dumps(record, indent=2) + "\n")
    return record


def read_json(path):
    with open(path) as f:
        return json.load(f)


@torch.no_grad()
def val_perplexity(ckpt_path, data_dir, device, batch_size):
    """Full pass over data_dir/val.bin: (loss, perplexity)."""
    from evaluate import evaluate_loss, make_eval_loader
    from model import load_model
    model, _, _ = load_model(ckpt_path, device=device, require_mode="generator")
    model.eval()
    loader = make_eval_loader(os.path.join(data_dir, "val.bin"), model.config.block_size, batch_size)
    loss, _ = evaluate_loss(model, loader, device)
    return float(loss), float(math.exp(loss))


def ensure_data(data_dir, log_path):
    if os.path.exists(os.path.join(data_dir, "train.bin")) and os.path.exists(os.path.join(data_dir, "val.bin")):
        return
    prep = os.path.join(data_dir, "prepare.py")
    if not os.path.exists(prep):
        raise ProjectError(f"--data_dir {data_dir} has no train.bin/val.bin and no prepare.py",
                           "prepare it first: python prepare_data.py --input TEXT --out_dir DIR")
    run_step("prepare data", [os.path.relpath(prep, ROOT)], log_path)


# ----------------------------------------------------------------------------- summary

COLUMNS = [("cycle", "cycle", "{}"),
           ("gen_val_loss", "generator val loss", "{:.4f}"),
           ("gen_val_ppl", "generator val ppl", "{:.3f}"),
           ("rm_val_mae", "RM val MAE", "{:.4f}"),
           ("rm_const_mae", "const-0.5 MAE", "{:.4f}"),
           ("grpo_reward_start", "GRPO reward start", "{:.4f}"),
           ("grpo_reward_end", "GRPO reward end", "{:.4f}"),
           ("grpo_kl_final", "final KL", "{:.4f}"),
           ("new_val_loss", "new val loss", "{:.4f}"),
           ("new_val_ppl", "new val ppl", "{:.3f}"),
           ("grpo_stop", "GRPO stop", "{}")]


def write_summary(out_dir, rows, meta):
    def cell(v, fmt):
        return "-" if v is None else fmt.format(v)
    lines = ["| " + " | ".join(h for _, h, _ in COLUMNS) + " |",
             "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell(r.get(k), f) for k, _, f in COLUMNS) + " |" for r in rows]
    md = (f"# Adversarial cycles: {out_dir}\n\n"
          "Per cycle: the generator that enters it (val loss/ppl on the held-out val split), the\n"
          "fresh reward model's val MAE of P(natural) against K/N on that generator's samples\n"
          "(lower = easier to detect; the constant 0.5 predictor is shown for reference), the\n"
          "GRPO mean reward at the start and end, the final KL to the reference, and the val\n"
          "loss/ppl of the generator GRPO produced.\n\n" + "\n".join(lines) + "\n\n"
          f"stopped: {meta.get('stop_reason', 'running')}\n")
    atomic_write_text(os.path.join(out_dir, "summary.md"), md)
    atomic_write_text(os.path.join(out_dir, "summary.json"), json.dumps({"cycles": rows, **meta}, indent=2) + "\n")
    if rows:
        from plots import plot_loss_curves
        recs = [dict(r) for r in rows]
        plot_loss_curves(recs, os.path.join(out_dir, "summary.png"), title="adversarial cycles", x_key="cycle",
                         panels=[("generator val perplexity", [("gen_val_ppl", "entering cycle", "o-"),
                                                               ("new_val_ppl", "after GRPO", "s--")]),
                                 ("detectability (RM val MAE)", [("rm_val_mae", "reward model", "o-"),
                                                                 ("rm_const_mae", "constant 0.5", "--")]),
                                 ("GRPO mean reward", [("grpo_reward_start", "start", "o-"),
                                                       ("grpo_reward_end", "end", "s-")]),
                                 ("final KL to reference", [("grpo_kl_final", "KL", "o-")])])
    return md


# ----------------------------------------------------------------------------- main

def main():
    args = parse_args()
    preset = PRESETS[args.preset]
    out_dir = args.out_dir or os.path.join("runs", f"shakespeare_char_{args.preset}")
    max_cycles = preset["max_cycles"] if args.max_cycles is None else args.max_cycles
    base_config = args.base_config or preset["base_config"]
    if max_cycles < 0:
        raise ProjectError(f"--max_cycles must be >= 0, got {max_cycles}")
    if args.nproc_per_node < 1:
        raise ProjectError(f"--nproc_per_node must be >= 1, got {args.nproc_per_node}")
    if args.base_ckpt is not None and not os.path.exists(args.base_ckpt):
        from hf_interop import hub_name_error  # 'gpt2': nothing is downloaded
        raise hub_name_error(args.base_ckpt, "--base_ckpt") or ProjectError(
            f"--base_ckpt {args.base_ckpt} not found", "pass an existing generator checkpoint")
    check_writable_dir(out_dir, "--out_dir")
    # The steps inherit the lock, so a step orphaned by kill -9 of this process keeps the
    # directory locked until it exits, and a rerun cannot write beside it.
    global RUN_LOCK_FD
    RUN_LOCK_FD = hold_dir_lock(out_dir, "--out_dir", "run.lock",
                                "another run_cycles.py, or by a step of an interrupted one that is still running")
    resolve_device(args.device)
    log_path = os.path.join(out_dir, "steps.log")
    data_dir = args.data_dir
    extra = {s: getattr(args, f"extra_{s}").split() for s in ("base", "reward_data", "reward_model", "grpo")}
    dev = ["--device", args.device]
    t_start = time.time()

    ensure_data(data_dir, log_path)

    # cycle 0: the base generator
    c0 = os.path.join(out_dir, "cycle_0")
    os.makedirs(c0, exist_ok=True)
    base = read_done(c0, "base")
    if base is None:
        if args.base_ckpt:
            gen = os.path.abspath(args.base_ckpt)
        else:
            bdir = os.path.join(c0, "base")
            cmd = ["train.py", "--config", base_config, "--out_dir", bdir, "--data_dir", data_dir,
                   "--seed", str(args.seed)] + dev + extra["base"]
            if os.path.exists(os.path.join(bdir, "last.pt")) or os.path.exists(os.path.join(bdir, "ckpt.pt")):
                cmd += ["--init_from", "resume"]
            run_step("cycle 0: base model", cmd, log_path, args.nproc_per_node)
            gen = os.path.abspath(os.path.join(bdir, "ckpt.pt"))
        loss, ppl = val_perplexity(gen, data_dir, resolve_device(args.device), args.eval_batch_size)
        base = mark_done(c0, "base", {"generator": gen, "val_loss": loss, "val_ppl": ppl})
    print(f"cycle 0 generator: val loss {base['val_loss']:.4f}, ppl {base['val_ppl']:.3f}")

    rows = []
    stopper = EarlyStopping(patience=args.patience, min_delta=args.min_delta, mode="min")
    stopper.step(base["val_ppl"])
    gen, gen_loss, gen_ppl = base["generator"], base["val_loss"], base["val_ppl"]
    stop_reason = f"max_cycles ({max_cycles}) reached"
    for n in range(1, max_cycles + 1):
        cdir = os.path.join(out_dir, f"cycle_{n}")
        os.makedirs(cdir, exist_ok=True)
        seed = str(args.seed + 1000 * n)

        rd_dir = os.path.join(cdir, "reward_data")
        if read_done(cdir, "reward_data") is None:
            cmd = ["prepare_reward_data.py", "--model_path", gen, "--input_mode", "binary",
                   "--train_bin", os.path.join(data_dir, "train.bin"), "--val_bin", os.path.join(data_dir, "val.bin"),
                   "--output_dir", rd_dir, "--seed", seed] + dev + preset["reward_data"] + extra["reward_data"]
            if os.path.isdir(rd_dir) and os.listdir(rd_dir):
                cmd.append("--resume")
            secs = run_step(f"cycle {n}: reward dataset", cmd, log_path, args.nproc_per_node)
            mark_done(cdir, "reward_data", {"dir": rd_dir, "seconds": secs})

        rm_dir = os.path.join(cdir, "reward_model")
        rm = read_done(cdir, "reward_model")
        if rm is None:
            cmd = ["train_reward_model.py", "--model_path", gen, "--data_dir", rd_dir, "--out_dir", rm_dir,
                   "--seed", seed] + dev + preset["reward_model"] + extra["reward_model"]
            if os.path.exists(os.path.join(rm_dir, "reward_last.pt")):
                cmd.append("--resume")
            secs = run_step(f"cycle {n}: reward model", cmd, log_path, args.nproc_per_node)
            rm = mark_done(cdir, "reward_model", {**read_json(os.path.join(rm_dir, "reward_summary.json")),
                                                  "seconds": secs})

        g_dir = os.path.join(cdir, "grpo")
        gr = read_done(cdir, "grpo")
        if gr is None:
            cmd = ["train_grpo.py", "--model_path", gen, "--reward_model_path", rm["checkpoint"],
                   "--out_dir", g_dir, "--data_dir", data_dir, "--seed", seed] + dev + preset["grpo"] + extra["grpo"]
            if os.path.exists(os.path.join(g_dir, "ckpt.pt")):
                cmd.append("--resume")
            secs = run_step(f"cycle {n}: GRPO", cmd, log_path, args.nproc_per_node)
            gr = mark_done(cdir, "grpo", {**read_json(os.path.join(g_dir, "grpo_summary.json")), "seconds": secs})

        ev = read_done(cdir, "eval")
        if ev is None:
            loss, ppl = val_perplexity(gr["checkpoint"], data_dir, resolve_device(args.device), args.eval_batch_size)
            ev = mark_done(cdir, "eval", {"generator": gr["checkpoint"], "val_loss": loss, "val_ppl": ppl})

        rows.append({"cycle": n, "generator": gen, "gen_val_loss": gen_loss, "gen_val_ppl": gen_ppl,
                     "rm_val_mae": rm.get("val_mae"), "rm_const_mae": rm.get("const_mae"),
                     "rm_val_loss": rm.get("val_loss"),
                     "grpo_reward_start": gr.get("reward_start"), "grpo_reward_end": gr.get("reward_end"),
                     "grpo_kl_final": gr.get("kl_final"), "grpo_stop": gr.get("stop_reason"),
                     "grpo_steps": gr.get("steps"),
                     "new_generator": ev["generator"], "new_val_loss": ev["val_loss"], "new_val_ppl": ev["val_ppl"]})
        print(f"\ncycle {n}: RM val MAE {fmt(rm.get('val_mae'))} (constant 0.5: {fmt(rm.get('const_mae'))}), "
              f"GRPO reward {fmt(gr.get('reward_start'))} -> {fmt(gr.get('reward_end'))}, "
              f"val ppl {gen_ppl:.3f} -> {ev['val_ppl']:.3f}")
        if rm.get("val_mae") is not None and rm["val_mae"] >= rm["const_mae"] - 1e-4:
            print(f"WARNING: cycle {n}'s reward model is no better than the constant 0.5 predictor, so "
                  f"GRPO had no real signal; try more reward data (--extra_reward_data='--samples_per_chunk 10'), "
                  f"a stronger detector (--extra_reward_model='--unfreeze_last_n_blocks 2') or a larger base model")
        write_summary(out_dir, rows, {"base": base, "stop_reason": "running"})
        gen, gen_loss, gen_ppl = ev["generator"], ev["val_loss"], ev["val_ppl"]
        stopper.step(gen_ppl)
        if stopper.should_stop and n < max_cycles:
            stop_reason = (f"val perplexity did not improve by {args.min_delta} for {args.patience} "
                           f"cycle(s) (best {stopper.best:.3f})")
            break

    meta = {"base": base, "stop_reason": stop_reason, "final_generator": gen,
            "final_val_ppl": gen_ppl, "preset": args.preset, "data_dir": os.path.abspath(data_dir),
            "seconds_this_invocation": round(time.time() - t_start, 1)}
    md = write_summary(out_dir, rows, meta)
    print("\n" + md)
    print(f"final generator: {gen}\nsummary: {os.path.join(out_dir, 'summary.md')}, summary.json, summary.png")


if __name__ == "__main__":
    run_cli(main)
