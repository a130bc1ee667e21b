"""
The A/A test of run_cycles.py's verdict: how often it says anything but *tie* when nothing differs
(experiment/aa.py). With a run's judge, prompts, sampling noise, val windows and settings, it trains null pairs
of MLE generators that differ only in their seeds, sweeps each over the run's temperatures and judges the first
of each pair as an arm against the second as a control, at both matchings:

  continuation  --pairs pairs of same-budget MLE continuations of the run's base (the same-budget control's
                train.py settings, from the run's cycle-1 control record)
  base          --pairs pairs of base generators, the run's base recipe (as its checkpoint records it) from
                fresh seeds

It writes OUT/aa.json (every pair's differences and words, the training noise, each rule's false-positive
rate) and OUT/aa.md (the table docs/design.md section 4 shows). Every model and sweep is kept, so the same
command resumes.

    python run_cycles.py                                    # the run whose verdicts are tested
    python aa_test.py --run runs/shakespeare_char_default --pairs 8
"""
import argparse
import json
import os
import time

from core.cli import check_flag_ranges, run_cli
from core.devices import resolve_device
from core.errors import ProjectError
from core.files import atomic_write_text
from core.plots import plot_null_p
from experiment import aa, frontier
from experiment.budget import continuation_settings
from experiment.presets import argv
from experiment.runner import StepRunner
from experiment.steps import generator_block_size
from lib.checkpoint import load_model, read_checkpoint
from lib.corpus import Corpus

KINDS = ("continuation", "base")


def parse_args(argv_=None):
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--run", required=True,
                    help="a run_cycles.py run directory past its first cycle (its summary.json, cycle_0's base and "
                         "judge, cycle_1's control and GRPO records): its settings, judge and budget are the test's")
    ap.add_argument("--pairs", type=int, default=30, help="null pairs of each kind (30: none of 30 bounds the rate below 10 %%)")
    ap.add_argument("--kinds", default=",".join(KINDS), help="comma-separated kinds of null pair: continuation, base")
    ap.add_argument("--out_dir", default=None, help="where the pairs, sweeps and results go (default: RUN/aa)")
    ap.add_argument("--seed", type=int, default=900_000,
                    help="the pairs' first training seed; model k of a kind trains with seed + k (far from every "
                         "run_cycles seed)")
    ap.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps (training and sweeps)")
    return ap.parse_args(argv_)


def run_record(run_dir, rel, step=None):
    """A record of the run (RUN/rel as JSON, or the done record `step` of directory RUN/rel): each part of the
    test reads what it needs when it needs it, so the base pairs can train while the run is still in its cycles."""
    path = os.path.join(run_dir, rel, f"{step}.done.json") if step else os.path.join(run_dir, rel)
    if not os.path.exists(path):
        raise ProjectError(f"--run {run_dir}: no {os.path.relpath(path, run_dir)} yet",
                           "pass a run_cycles.py run directory past its first cycle, its control arm on (or wait "
                           "for the run to get there and rerun the same command: what is done is kept)")
    with open(path) as f:
        return json.load(f)


# train.py settings of the run's base that are not its recipe
NOT_RECIPE = {"config_files", "config", "out_dir", "seed", "tensorboard_dir", "wandb_log", "wandb_project",
              "wandb_run_name", "wandb_group", "init_from", "meta_path", "dataset", "device", "dtype"}


def base_recipe(base_ckpt):
    """The run's base generator's train.py settings as its checkpoint records them (every value, resolved from its
    config file, preset and --extra_base alike), less where it went and its seed: a base of the same recipe."""
    config = read_checkpoint(base_ckpt).get("config") or {}
    if not config:
        raise ProjectError(f"{base_ckpt} records no train.py settings (a checkpoint given to run_cycles, not trained by "
                           f"it)", "run the A/A test on a run whose cycle 0 trained its base: --kinds continuation")
    return {k: (str(v) if isinstance(v, bool) else v) for k, v in config.items() if k not in NOT_RECIPE}


def commands(kind, args, out):
    """{model directory: train.py's words} of one kind's 2 x --pairs models."""
    dev = argv({"device": args.device})
    cmds = {}
    for k in range(2 * args.pairs):
        d, seed = os.path.join(out, kind, f"model_{k}"), args.seed + k
        base = run_record(args.run, "cycle_0", "base")["generator"]
        if kind == "base":
            settings = base_recipe(base)
        else:
            c = run_record(args.run, os.path.join("cycle_1", "control"), "mle")
            budget = run_record(args.run, "cycle_1", "grpo")["budget"]
            settings = {"data_dir": base_recipe(base)["data_dir"], "init_from": base,
                        **continuation_settings(budget, c["learning_rate"], c["block_size"], c["batch_size"])}
        cmds[d] = ["train.py"] + argv({"out_dir": d, "seed": seed, "tensorboard_dir": "none", **settings}) + dev
    return cmds


def trained(runner, cmds, kind):
    """Each model's checkpoint (the base's best, a continuation's last, as run_cycles takes them), trained
    where missing."""
    out = []
    for d, cmd in cmds.items():
        if not os.path.exists(os.path.join(d, "train_summary.json")):
            runner.run(f"A/A {kind} {os.path.basename(d)}", cmd)
        out.append(os.path.abspath(os.path.join(d, "ckpt.pt" if kind == "base" else "last.pt")))
    return out


def swept(ckpt, st, judge, corpus, device):
    """The model's sweep over the run's temperatures with its judge and noise (st: the settings of the run's own
    sweeps), {T: point}, kept beside it."""
    path = os.path.join(os.path.dirname(ckpt), "sweep.json")
    if os.path.exists(path):
        with open(path) as f:
            return {float(t): p for t, p in json.load(f).items()}
    t0 = time.time()
    model, _, _ = load_model(ckpt, device=device, require_mode="generator")
    curve = frontier.sweep(model, corpus, st["temps"], st["quality_samples"], st["sample_len"], st["seed"], device,
                           eval_block_size=st["eval_block_size"], judge=judge)
    atomic_write_text(path, json.dumps({f"{t:g}": p for t, p in curve.items()}) + "\n")
    print(f"swept {ckpt} in {time.time() - t0:.0f} s", flush=True)
    return curve


def main(argv_=None):
    args = parse_args(argv_)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    check_flag_ranges(args, "aa_test.py", rules=[("pairs", args.pairs >= 2, ">= 2 (a noise estimate needs two)"),
                                                 ("kinds", set(kinds) <= set(KINDS) and kinds,
                                                  f"a comma-separated subset of {', '.join(KINDS)}")])
    run_record(args.run, "cycle_0", "base")  # a run at all, before anything is written
    out = args.out_dir or os.path.join(args.run, "aa")
    os.makedirs(out, exist_ok=True)
    device = resolve_device(args.device)
    # each continuation forks from a warm launcher where run_cycles' steps do (a fresh Python: seconds each)
    runner = StepRunner(os.path.join(out, "steps.log"), warm=StepRunner.warm_on(device))
    try:
        ckpts = {kind: trained(runner, commands(kind, args, out), kind) for kind in kinds}
    finally:
        runner.close()
    base = run_record(args.run, "cycle_0", "base")
    ev = run_record(args.run, "cycle_0", "eval")  # the base's sweep: the run's samples, length, seed and temperatures
    settings = {"quality_samples": ev["samples"], "sample_len": ev["sample_len"], "seed": ev["seed"],
                "temps": ev["temps"], "eval_block_size": generator_block_size(base["generator"])}
    corpus = Corpus(base_recipe(base["generator"])["data_dir"])
    judge_rec = run_record(args.run, "cycle_0", "judge")
    if ev["judge"] != judge_rec["checkpoint"]:
        raise ProjectError(f"--run {args.run}: its base was swept with the judge {ev['judge']}, not its "
                           f"cycle_0 judge {judge_rec['checkpoint']}", "rerun the run's command to finish it first")
    judge, _, _ = load_model(judge_rec["checkpoint"], device=device, require_mode="generator")
    reports = {}
    for kind in kinds:
        sweeps = [swept(c, settings, judge, corpus, device) for c in ckpts[kind]]
        reports[kind] = {**aa.null_report(list(zip(sweeps[0::2], sweeps[1::2]))), "models": ckpts[kind]}
    rec = {"run": os.path.abspath(args.run), "base_config": read_checkpoint(base["generator"])["config"].get("config"),
           "settings": settings,
           "judge": judge_rec["checkpoint"], "pairs": args.pairs, "seed": args.seed, "reports": reports,
           "aa_noise": {k: r["training_noise"] for k, r in reports.items()}}
    atomic_write_text(os.path.join(out, "aa.json"), json.dumps(rec, indent=2) + "\n")
    md = (f"# A/A test of {args.run} ({args.pairs} pairs of each kind, with its judge)\n\n"
          + aa.rates_table(reports) + "\n")
    atomic_write_text(os.path.join(out, "aa.md"), md)
    null_ps = {k: r["null_p"] for k, r in reports.items() if r.get("null_p")}
    if null_ps:  # (issue 76) a valid test's null p are uniform: the histogram beside its KS test
        plot_null_p(null_ps, os.path.join(out, "null_p.png"), f"A/A test of {args.run}: null p against uniform")
    print(md + f"\nthe presets' aa_noise: {json.dumps(rec['aa_noise'])}\nwritten: {out}/aa.json, aa.md"
          + (", null_p.png" if null_ps else ""))


if __name__ == "__main__":
    run_cli(main)
