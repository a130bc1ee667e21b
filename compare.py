"""
Generators trained anywhere (with TRL, nanoGPT, a loop of your own), placed on a finished run_cycles.py run's
frontier: each is swept like the run's arms (its judge, prompts, sampling noise, val windows and temperatures) and
judged against both of its MLE controls at one of its cycles, by its rule (both matchings, the A/A training noise
for one seed, Holm over the run's comparisons and these). The run's own records are not touched: everything goes to
RUN/compare/ (each sweep kept, so the same command resumes).

    python compare.py --run runs/shakespeare_char_default mine=out-mine/ckpt.pt hf=my-hf-dir
    python compare.py --run runs/shakespeare_char_default mine=s0/ckpt.pt,s1/ckpt.pt,s2/ckpt.pt   # one per seed

A checkpoint is this project's or nanoGPT's (ckpt.pt) or a Hugging Face directory, with the run's tokenizer and
context (refused otherwise, saying which); its FLOPs are read from flops.json beside it ({"flops": N}), else unknown.
"""
import argparse
import json
import os
import time

from core.cli import run_cli
from core.devices import resolve_device
from core.errors import ProjectError
from core.files import atomic_write_text, sha256_file
from experiment import external, frontier
from experiment.report import generator_entry
from experiment.verdicts import frontier_report, verdict_table
from lib.checkpoint import load_model
from lib.corpus import Corpus


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--run", required=True, help="a finished run_cycles.py run directory (its summary.json)")
    ap.add_argument("generators", nargs="+", metavar="NAME=PATH[,PATH...]",
                    help="a generator to judge, by a name of its own: one checkpoint (the run's first seed), or one "
                         "per seed of the run, comma-separated, each judged against that seed's controls")
    ap.add_argument("--cycle", type=int, default=None,
                    help="the cycle whose same-budget control it is judged against (default: the run's last)")
    ap.add_argument("--out_dir", default=None, help="where the sweeps and compare.json/.md go (default: RUN/compare)")
    ap.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps")
    return ap.parse_args(argv)


def read_summary(run_dir):
    path = os.path.join(run_dir, "summary.json")
    if not os.path.exists(path):
        raise ProjectError(f"--run {run_dir}: no summary.json", "pass a finished run_cycles.py run directory (or "
                           "rerun its command to finish it)")
    with open(path) as f:
        summary = json.load(f)
    if summary.get("stop_reason") == "running":
        raise ProjectError(f"--run {run_dir} has not finished", "rerun its run_cycles.py command to finish it")
    return summary


def parse_generators(specs, summary):
    """{name: [path per replicate]}, each name new to the run, no more paths than the run has seeds."""
    seeds = summary["settings"].get("seeds", 1)
    out = {}
    for spec in specs:
        name, paths = external.split_named(spec, "NAME=PATH[,PATH...]", "mine=out-mine/ckpt.pt",
                                           {g["arm"] for g in summary["generators"]} | set(out))
        out[name] = [p for p in paths.split(",") if p]
        if len(out[name]) > seeds:
            raise ProjectError(f"{name}: {len(out[name])} checkpoints, and the run has {seeds} seed(s)",
                               "give at most one checkpoint per seed of the run")
    return out


def swept(path, what, ctx):
    """The sweep record of one checkpoint with the run's settings (ctx), kept in ctx["out"]/<what>/eval.json and
    reused while the checkpoint and the settings are the same."""
    st = ctx["settings"]
    d = os.path.join(ctx["out"], what.replace(" ", "_"))
    key = {"checkpoint": os.path.abspath(path), "sha256": sha256_file(path) if os.path.isfile(path) else None,
           "settings": {k: st[k] for k in ("quality_samples", "sample_len", "seed", "temps", "eval_block_size")},
           "judge": ctx["judge_path"]}
    rec_path = os.path.join(d, "eval.json")
    if os.path.exists(rec_path):
        with open(rec_path) as f:
            rec = json.load(f)
        if rec.get("key") == key:
            return rec["eval"]
    print(f"{what}: sweeping {path} at T = {', '.join(f'{t:g}' for t in st['temps'])}", flush=True)
    t0 = time.time()
    model, _, _ = load_model(path, device=ctx["device"], require_mode="generator")
    curve = frontier.sweep(model, ctx["corpus"], st["temps"], st["quality_samples"], st["sample_len"], st["seed"],
                           ctx["device"], eval_batch_size=st.get("eval_batch_size", 64),
                           eval_block_size=st["eval_block_size"], keep_examples=True, judge=ctx["judge"])
    ev = {"generator": os.path.abspath(path), **frontier.eval_fields(curve), "temps": st["temps"],
          "judge": ctx["judge_path"], "seconds": round(time.time() - t0, 1)}
    os.makedirs(d, exist_ok=True)
    atomic_write_text(rec_path, json.dumps({"key": key, "eval": ev}) + "\n")
    return ev


def entries(name, paths, cycle, ctx):
    """summary.json-like entries of one generator's checkpoints (replicate r: the r-th)."""
    out = []
    for r, path in enumerate(paths):
        what = f"{name} seed {r}"
        external.check_generator(path, ctx["corpus"], ctx["settings"]["eval_block_size"], what)
        ev = swept(path, what, ctx)
        beside = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
        out.append({**generator_entry(cycle, name, ev, r), "det_skipped": "a compared generator's detectability is "
                    "not measured", "compute_flops": external.reported_flops(beside, what), "external": path})
    return out


def main(argv=None):
    args = parse_args(argv)
    summary = read_summary(args.run)
    gens = summary["generators"]
    cycles = sorted({g["cycle"] for g in gens if g["arm"] == "control"})
    if not cycles:
        raise ProjectError(f"--run {args.run} has no same-budget control", "compare against a run with its control arm")
    cycle = cycles[-1] if args.cycle is None else args.cycle
    if cycle not in cycles:
        raise ProjectError(f"--cycle {cycle}: the run's same-budget controls are at cycle(s) "
                           f"{', '.join(map(str, cycles))}", "pick one of those")
    wanted = parse_generators(args.generators, summary)
    device = resolve_device(args.device)
    judge_path = summary["settings"]["judge"]["checkpoint"]
    ctx = {"settings": summary["settings"], "corpus": Corpus(summary["data_dir"]), "device": device,
           "judge_path": judge_path, "out": args.out_dir or os.path.join(args.run, "compare"),
           "judge": load_model(judge_path, device=device, require_mode="generator")[0]}
    new = [e for name, paths in wanted.items() for e in entries(name, paths, cycle, ctx)]
    report = frontier_report(gens + new, summary.get("train_noise"), summary.get("design"))
    mine = {n: {**r, "arms": {a: v for a, v in r["arms"].items() if a in wanted}} for n, r in report.items()
            if n == cycle}
    arms = mine[cycle]["arms"] if cycle in mine else {}
    rec = {"run": os.path.abspath(args.run), "cycle": cycle, "generators": new, "frontier": report,
           "verdicts": {a: {c: {"verdict": v["verdict"], "run_verdict": v.get("run_verdict"),
                                "sentence": v["sentence"]} for c, v in a_rec["verdicts"].items()}
                        for a, a_rec in arms.items()}}
    os.makedirs(ctx["out"], exist_ok=True)
    atomic_write_text(os.path.join(ctx["out"], "compare.json"), json.dumps(rec, indent=2) + "\n")
    md = (f"# {', '.join(wanted)} on the frontier of {args.run}, cycle {cycle}\n\n" + verdict_table(mine) + "\n\n"
          + "\n".join(f"- {a} against {c}: {v['sentence']} (over the run's comparisons and these, Holm: "
                      f"**{v['run_verdict']}**)" for a, cs in rec["verdicts"].items() for c, v in cs.items()) + "\n")
    atomic_write_text(os.path.join(ctx["out"], "compare.md"), md)
    print("\n" + md + f"\nwritten: {ctx['out']}/compare.json, compare.md")


if __name__ == "__main__":
    run_cli(main)
