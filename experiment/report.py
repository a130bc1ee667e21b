"""
run_cycles.py's records and report: one summary.json entry per generator, the verdicts that
compare the arms, summary.md / summary.json / summary.png, samples.md, the run's settings and
stamp (run_meta), and the run's figures in TensorBoard / W&B (track_summary).
"""
import argparse
import json
import math
import os
import subprocess
import sys
import time

import numpy as np

from core.devices import device_name, resolve_dtype
from core.errors import ProjectError
from core.files import atomic_write_text
from core.plots import plot_cycle_summary
from core.tracking import open_tracker
from experiment import frontier as fr, power
from experiment.markdown import md_table, wrap
from experiment.measures import binomial_noise, verdict
from experiment.presets import RATIO_ARMS
from experiment.verdicts import (entering_entry, frontier_lines, frontier_report, frontier_section, ideal_fractions,
                                 ideal_section, plot_frontiers)
from lib.corpus import read_prepare_info

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the checkout whose commit stamps the results


def check_finite_tree(obj, where="summary"):
    """summary.json holds only finite numbers (None marks a skipped step)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        raise ProjectError(f"{where} is {obj}, not a finite number",
                           "a measurement broke; check the step's output in steps.log")
    if isinstance(obj, dict):
        for k, v in obj.items():
            check_finite_tree(v, f"{where}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            check_finite_tree(v, f"{where}[{i}]")


DET_KEYS = ("det_val_mae", "det_train_mae", "det_val_mae_se", "det_const_mae", "det_val_corr", "det_val_loss", "det_auroc",
            "det_auroc_se", "det_lexicon_mae", "det_iters", "det_curve")


def generator_entry(cycle, arm, ev, replicate=0):
    """summary.json's record of one generator; its det_* fields stay None until a fresh detector
    has measured it (det_skipped says why when that was skipped)."""
    keep = ("generator", "val_loss", "val_ppl", "judge_nll", "real_word_rate", "words", "distinct_2", "bigrams",
            "degenerate_share", "samples", "examples", "frontier")
    return {"cycle": cycle, "arm": arm, "replicate": replicate, **{k: ev[k] for k in keep},
            "mauve": (ev.get("mauve") or {}).get("mauve"),  # run_cycles --mauve_features, else None
            "copy_rate": ev.get("copy_rate"),  # T = 1 samples' windows found verbatim in the arms' train text
            "detector": None, "det_final_stage": None, "det_skipped": "not measured yet",
            **dict.fromkeys(DET_KEYS)}


def attach_detector(entry, det, where, final_stage):
    entry.update({"detector": where, "det_final_stage": final_stage, "det_skipped": None,
                  "det_val_mae": det["val_mae"], "det_train_mae": det.get("train_mae"), "det_val_mae_se": det["val_mae_se"],
                  "det_const_mae": det["const_mae"], "det_val_corr": det["val_corr"],
                  "det_val_loss": det["val_loss"], "det_auroc": det["auroc"], "det_auroc_se": det["auroc_se"],
                  "det_lexicon_mae": det["lexicon_mae"],
                  "det_iters": det["iters"], "det_curve": det["curve"]})


GEN_COLUMNS = [("cycle", "cycle", "{}"), ("arm", "arm", "{}"), ("replicate", "seed", "{}"),
               ("compute_flops", "FLOPs", "{:.3g}"),
               ("val_ppl", "val ppl", "{:.3f}"),
               ("judge_nll", "judge NLL", "{:.4f}"),
               ("real_word_rate", "real-word rate", "{:.3f}"),
               ("distinct_2", "distinct-2", "{:.3f}"),
               ("distinct_2_gap", "distinct-2 - natural", "{:+.3f}"),
               ("degenerate_share", "degenerate", "{:.3f}"),
               ("copy_rate", "copy rate", "{:.3f}"),
               ("det_val_mae", "detector MAE", "{:.4f}"),
               ("det_const_mae", "const-0.5 MAE", "{:.4f}"),
               ("det_lexicon_mae", "lexicon MAE", "{:.4f}"),
               ("det_auroc", "AUROC", "{:.3f}"),
               ("detector", "detector run", "{}")]

STEP_COLUMNS = [("cycle", "cycle", "{}"),
                ("grpo_eval_reward_start", "RM P(natural), fixed prompts, start", "{:.4f}"),
                ("grpo_eval_reward_end", "... end", "{:.4f}"),
                ("grpo_reward_start", "GRPO step reward start", "{:.4f}"),
                ("grpo_reward_end", "GRPO step reward end", "{:.4f}"),
                ("grpo_kl_final", "final KL", "{:.4f}"),
                ("grpo_updates", "GRPO updates", "{}"),
                ("grpo_completion_tokens", "GRPO tokens", "{}"),
                ("grpo_stop", "GRPO stop", "{}"),
                ("control_mle_iters", "MLE updates", "{}"),
                ("control_mle_tokens", "MLE tokens", "{}"),
                ("control_mle_learning_rate", "MLE lr", "{:g}")]


def gen_columns(gens):
    """GEN_COLUMNS, with MAUVE beside the sample measures when the run measured it (--mauve_features)."""
    if all(g.get("mauve") is None for g in gens):
        return GEN_COLUMNS
    at = [k for k, _, _ in GEN_COLUMNS].index("degenerate_share") + 1
    return GEN_COLUMNS[:at] + [("mauve", "MAUVE (T = 1)", "{:.3f}")] + GEN_COLUMNS[at:]


def verdicts(gens, reference):
    """One line per measure: the two arms' last generators compared (see measures.verdict)."""
    last = max((g["cycle"] for g in gens), default=0)
    a = next((g for g in gens if g["cycle"] == last and g["arm"] == "adversarial"), None)
    c = next((g for g in gens if g["cycle"] == last and g["arm"] == "control"), None)
    if a is None or c is None:
        return ["no verdicts: the run has no cycle with both arms (see --no_control, --max_cycles)"]
    head = f"Both arms' generators after cycle {last}, compared:"
    out = [head,
           verdict("val perplexity", a["val_ppl"], c["val_ppl"], "lower",
                   0.005 * (a["val_ppl"] + c["val_ppl"]) / 2,
                   "0.5 % of the perplexity (two base-model seeds differed by 0.35 %)", "{:.3f}"),
           verdict("real-word rate", a["real_word_rate"], c["real_word_rate"], "higher",
                   binomial_noise(a["real_word_rate"], a["words"], c["real_word_rate"], c["words"]),
                   "2 standard errors, binomial over words", "{:.3f}"),
           verdict("distinct-2", a["distinct_2"], c["distinct_2"], "closer",
                   binomial_noise(a["distinct_2"], a["bigrams"], c["distinct_2"], c["bigrams"]),
                   "2 standard errors, binomial over bigrams", "{:.3f}", target=reference["distinct_2"]),
           verdict("degenerate share", a["degenerate_share"], c["degenerate_share"], "lower",
                   binomial_noise(a["degenerate_share"], a["samples"], c["degenerate_share"], c["samples"]),
                   "2 standard errors, binomial over samples", "{:.3f}")]
    if a.get("det_val_mae") is None or c.get("det_val_mae") is None:
        out.append("detectability: not compared (a fresh detector was skipped: "
                   f"{a.get('det_skipped') or c.get('det_skipped')})")
    else:
        out.append(verdict("fresh detector's val MAE (higher = harder to detect)", a["det_val_mae"],
                           c["det_val_mae"], "higher",
                           2 * math.hypot(a["det_val_mae_se"], c["det_val_mae_se"]),
                           "2 standard errors over the val samples"))
        out.append(verdict("fresh detector's AUROC (closer to 0.5 = harder to detect)", a["det_auroc"],
                           c["det_auroc"], "closer", 2 * math.hypot(a["det_auroc_se"], c["det_auroc_se"]),
                           "2 standard errors, Hanley-McNeil", "{:.3f}", target=0.5))
    return out


# the information table's columns
TAKERS = ("sir", "logit", "ptx", "ratio", "spin", "ddo", "adversarial", "null", "control")


def information_report(rows, gens):
    """Per cycle: what the cycle's detector knows about the generator that made its negatives (the
    residual model's gain, nats per val token: at n = 1, and the lower and upper estimates at the
    largest n), and how much each arm took: its T = 1 val NLL minus its entering generator's, with the
    paired SE over the val windows' groups (negative = the arm gained). {cycle: record}."""
    out = {}
    for n in sorted({r["cycle"] for r in rows if r.get("detector_information")}):
        infos = [r["detector_information"] for r in rows if r["cycle"] == n and r.get("detector_information")]
        top = str(max(int(m) for m in infos[0]))
        rec = {"replicates": len(infos), "n": int(top),
               "gain_n1": float(np.mean([i["1"]["upper"] for i in infos])),
               "upper": float(np.mean([i[top]["upper"] for i in infos])),
               "lower": fr.pooled([i[top]["lower"] for i in infos], [i[top]["se"] for i in infos]),
               "took": {}}
        # per replicate, the generator the detector was made against (the density-ratio arms' start)
        entering = {g.get("replicate", 0): entering_entry(gens, g) for g in gens if g["cycle"] == n and g.get("entering")}
        trunks = {g.get("replicate", 0): g for g in gens if g["arm"] == "trunk"}  # each replicate's own
        for arm in TAKERS + ("trunk",):
            pairs = ([(trunks.get(r, trunks.get(0)), e) for r, e in entering.items()] if arm == "trunk" and trunks else
                     [(g, entering_entry(gens, g)) for g in gens if g["cycle"] == n and g["arm"] == arm])
            diffs, ses = [], []
            for g, e in pairs:
                if e is None:
                    continue
                a, b = np.array(g["frontier"]["1"]["val_items"]), np.array(e["frontier"]["1"]["val_items"])
                diffs.append(g["val_loss"] - e["val_loss"])
                ses.append(float(np.std(a - b, ddof=1) / math.sqrt(len(a))))
            if diffs:
                rec["took"][arm] = fr.pooled(diffs, ses)
        out[n] = rec
    return out


def information_table(info):
    """The detector's information and what each arm took of it, as a markdown table."""
    if not info:
        return ""
    arms = [a for a in TAKERS + ("trunk",) if any(a in r["took"] for r in info.values())]
    head = ("| cycle | seeds | detector information, nats/token: n = 1 | lower (n) | upper (n) | "
            + " | ".join("trunk (longer-trained MLE) minus that generator" if a == "trunk" else f"{a}: val NLL change"
                         for a in arms) + " |\n|" + "---|" * (5 + len(arms)))
    lines = [head]
    for n, r in info.items():
        cells = [f"{r['took'][a][0]:+.4f} +- {r['took'][a][1]:.4f}" if a in r["took"] else "-" for a in arms]
        lines.append(f"| {n} | {r['replicates']} | {r['gain_n1']:.4f} | {r['lower'][0]:.4f} +- {r['lower'][1]:.4f} "
                     f"({r['n']}) | {r['upper']:.4f} ({r['n']}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def information_section(info):
    if not info:
        return ""
    return ("## What the detector knows, and what each arm took\n\n" + wrap(
        "The cycle's detector, read as a log-ratio s, "
        "defines the residual model P_gen exp(s) / Z over the generator that made its negatives (Deng et al. "
        "2020). Its val NLL gain over that generator, in nats per val token, bounds what any use of the "
        "detector can add. Z comes from n of the generator's own continuations of each val window's first token: "
        "the upper estimate uses them alone (log Z_n is biased low), the lower one counts the natural "
        "continuation among them; both tend to the gain as n grows. Each arm's column: its val NLL at T = 1 "
        "minus that of the generator it started from (negative = it gained; SE of paired differences over the "
        "val windows' groups, and over seeds). The SIR arm's val NLL is the residual model's (lower estimate); "
        "sir, logit and ptx start from the generator that made the detector's negatives, the other arms "
        "from their own previous generator; the last column is the longer-trained control's (the detector "
        "trunk's) val NLL minus that generator's, the knowledge the detector's trunk holds.")
        + "\n\n" + information_table(info) + "\n\n")


def lexicon_note(gens):
    """The sentence beside the generators' table on the lexicon baseline against the trained
    detector: which generators a word list tells from natural text better (lower val MAE) than the
    detector does. "" when no detector measured a generator."""
    measured = [g for g in gens if g.get("det_val_mae") is not None and g.get("det_lexicon_mae") is not None]
    if not measured:
        return ""
    beaten = [g for g in measured if g["det_lexicon_mae"] < g["det_val_mae"]]
    if not beaten:
        return "The trained detector beats the lexicon baseline (a lower val MAE) on every generator it measured."
    # a base or adversarial generator's detector outside the final stage is a cycle's reward model: GRPO's
    rewarded = [g for g in beaten if g["arm"] in ("base", "adversarial") and not g.get("det_final_stage")]
    names = [f"cycle {g['cycle']} {g['arm']}" + (f", seed {g['replicate']}" if g.get("replicate") else "")
             + f" ({g['det_lexicon_mae']:.3f} vs {g['det_val_mae']:.3f}"
             + (", the detector GRPO trained against)" if g in rewarded else ")") for g in beaten]
    return (f"The lexicon baseline detects better than the trained detector: its val MAE is lower for "
            f"{len(beaten)} of the {len(measured)} generators measured, {', '.join(names)}. A word list (the "
            "share of a block's words never seen in the train split, fitted linearly) tells their text from "
            "natural text better than the detector does" + (", the one GRPO trains against included" if rewarded
                                                             else "") + " (docs/detector.md).")


def saturation(gens, delta=None):
    """Whether MLE is at its limit (--data_chars): the same-budget continuation's change of dev NLL and val NLL from
    the base (T = 1; each replicate's cycle-1 control against its base). Saturated iff the one-sided 95 % upper bound
    on the continuation's gain in dev NLL (over the seeds: mean + t(0.95, S - 1) SD / sqrt S) lies below delta / 2,
    delta the row's margin (issue 76; without one, below 0), and no seed's MLE stopped at its schedule's cap (its dev
    minimum strictly inside). One seed gives no interval: not saturated. None where the generators carry no dev loss
    (a run without a dev slice)."""
    pairs = []
    for b in (g for g in gens if g["arm"] == "base" and g.get("dev_loss") is not None):
        c = next((g for g in gens if g["arm"] == "control" and g["cycle"] == 1
                  and g.get("replicate", 0) == b.get("replicate", 0) and g.get("dev_loss") is not None), None)
        if c is not None:
            pairs.append({"replicate": b.get("replicate", 0), "dev_change": c["dev_loss"] - b["dev_loss"],
                          "val_change": c["val_loss"] - b["val_loss"]})
    if not pairs:
        return None
    dev, val = (sum(p[k] for p in pairs) / len(pairs) for k in ("dev_change", "val_change"))
    gains = np.array([-p["dev_change"] for p in pairs])
    bound = None if len(gains) < 2 else float(gains.mean() + power.t_quantile(0.95, len(gains) - 1)
                                             * gains.std(ddof=1) / np.sqrt(len(gains)))
    at_cap = sorted(g.get("replicate", 0) for g in gens if g["arm"] == "base" and g.get("at_cap"))
    limit = 0.0 if delta is None else delta / 2
    return {"dev_change": dev, "val_change": val, "per_seed": pairs, "gain_bound": bound, "limit": limit,
            "at_cap": at_cap, "saturated": bound is not None and bound < limit and not at_cap}


def saturation_section(sat):
    if sat is None:
        return ""
    bound = ("one seed: no interval" if sat.get("gain_bound") is None else
             f"the one-sided 95 % bound on its dev gain {sat['gain_bound']:+.4f} against {sat['limit']:.4f}")
    cap = (f"; seed(s) {', '.join(map(str, sat['at_cap']))} stopped at the schedule's cap" if sat.get("at_cap") else "")
    why = ("more MLE may still gain here" if sat.get("gain_bound") is None or sat["gain_bound"] >= sat["limit"] else
           "the continuation gained nothing past the bound, but the base's dev minimum may lie past its schedule")
    return ("## MLE at its limit?\n\n" + wrap(
        f"The same-budget continuation of the base (MLE at its limit) changed dev NLL by {sat['dev_change']:+.4f} and "
        f"val NLL by {sat['val_change']:+.4f} nats/token (T = 1, the mean of {len(sat['per_seed'])} seed(s); "
        f"{bound}{cap}): "
        + ("saturated." if sat["saturated"] else f"**not saturated**: {why}, so no arm's word in this run counts for "
           "or against the method (docs/results.md, the data-limited test's criteria).")) + "\n\n")


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def game_section(rows, gens, report):
    """The game cycle by cycle (replicate 0): the cycle's detector's AUROC on the generator it was trained
    against (the adversarial arm's current one), that arm's new generator's degenerate share at T = 1, and its
    verdict against both MLE controls (over the replicates); the last row, the final stage's detector on the last
    generator. "" for a run of one cycle without a final-stage detector."""
    cycles = [r for r in rows if not r.get("replicate")]
    adv = {g["cycle"]: g for g in gens if g["arm"] == "adversarial" and not g.get("replicate")}
    last = adv.get(max(adv, default=0))
    if len(cycles) < 2 and not (last and last.get("det_auroc") is not None):
        return ""
    lines = ["| cycle | its detector's AUROC on the generator entering it | adversarial arm's degenerate share after "
             "it | vs the same-budget control | vs the detector trunk |", "|---|---|---|---|---|"]
    for r in cycles:
        v = (report.get(r["cycle"]) or {}).get("arms", {}).get("adversarial", {}).get("verdicts", {})
        g = adv.get(r["cycle"], {})
        cells = [fmt(r.get("rm_auroc"), ".3f"), fmt(g.get("degenerate_share"), ".3f")]
        lines.append(f"| {r['cycle']} | " + " | ".join(cells + [v[c]["verdict"] if c in v else "-"
                                                               for c in ("control", "trunk")]) + " |")
    if last and last.get("det_auroc") is not None:
        lines.append(f"| final stage | {last['det_auroc']:.3f} | - | - | - |")
    return ("## The game, cycle by cycle\n\n" + wrap(
        "Each cycle's detector learns the adversarial arm's current generator; the next GRPO step plays against "
        "it. AUROC 0.5: the detector cannot tell that generator's text from natural text. Degenerate: one token "
        "over half a sample, or its 4-grams repeating (core.objectives.degenerate_mask).") + "\n\n" + "\n".join(lines)
            + "\n\n")


def run_line(meta):
    """summary.md's first line, never wrapped: the commit, preset, device, precision and run time that
    summary.json holds (the time of this invocation: a resumed run's last part); "" in a summary
    written while the run goes on."""
    if not meta.get("preset"):
        return ""
    s, secs = meta.get("settings") or {}, meta.get("seconds_this_invocation")
    took = "-" if secs is None else (f"{secs:.0f} s" if secs < 60 else f"{int(secs // 60)} min {secs % 60:.0f} s")
    device = s.get("device", "?") + (f" ({s['device_name']})" if s.get("device_name") else "")
    return (f"Run: commit `{meta.get('commit') or 'unknown'}`, preset {meta['preset']}, device {device}, "
            f"precision {s.get('dtype', '?')}, run time {took} (this invocation).\n\n")


def write_summary(out_dir, rows, gens, reference, meta, figures=True):
    order = {"base": 0, "trunk": 1, "compute": 1.5, "adversarial": 2, "null": 3, "control": 4, "spin": 5, "ddo": 6, "sir": 7,
             "logit": 8, "ptx": 9, "ratio": 10}
    # distinct-2 is descriptive: shown as its distance to natural text's (on copies: the entries are the run's own
    # replicate records, and a summary is also written mid-run)
    gens = [{**g, "distinct_2_gap": None if not reference else g["distinct_2"] - reference["distinct_2"]}
            for g in sorted(gens, key=lambda g: (g["cycle"], order.get(g["arm"], len(order))))]
    lines = verdicts(gens, reference) if reference else []
    report = frontier_report(gens, meta.get("train_noise"), meta.get("design"))
    margin = next((r.get("margin") for r in report.values() if r.get("margin")), None) or {}
    sat = saturation(gens, margin.get("quality"))
    headline = frontier_lines(report)
    info = information_report(rows, gens)
    ideal = ideal_fractions(gens)
    ref_line = ("" if not reference else wrap(
                f"Natural val text (the same {reference['samples']} windows of {reference['sample_len']} tokens): "
                f"real-word rate {reference['real_word_rate']:.3f}, distinct-2 {reference['distinct_2']:.3f}, "
                f"degenerate share {reference['degenerate_share']:.3f}.") + "\n\n")
    steps = []
    for r in rows:
        ctl = next((g for g in gens if g["cycle"] == r["cycle"] and g["arm"] == "control"), {})
        steps.append({**r, **{f"control_mle_{k}": ctl.get(f"mle_{k}") for k in ("iters", "tokens", "learning_rate")}})
    lexicon = lexicon_note(gens)
    md = (f"# Adversarial cycles: {out_dir}\n\n"
          + run_line(meta) + corpus_line(meta) + wrap(
              "One row per generator: cycle 0 is the base generator every arm starts from, and the detector trunk "
              "(an MLE model of the same data trained longer, the longer-trained control); after cycle n, the adversarial arm's "
              "generator is the GRPO result, the null arm's the same GRPO with shuffled rewards and the control "
              "arm's the plain-MLE result. FLOPs: what the generator cost to make, everything included "
              "(experiment/flops.py). Judge NLL: its T = 1 samples' NLL under the independent judge (nats/token, "
              "lower is better). Val ppl: full val split. Sample measures: the same prompts (one natural val "
              "token) and sampling noise for every generator. Detector: a FRESH reward model trained on that "
              "generator's samples (the next cycle's, or the final stage's): its val MAE of P(natural) against "
              "K/N (higher = harder to detect), the constant 0.5's MAE, the lexicon baseline's MAE on the same "
              "reward data, and the AUROC of P(natural) between natural val blocks and the generator's blocks "
              "(0.5 = chance).") + "\n\n"
          + ("Samples of every generator on the same prompts: [samples.md](samples.md).\n\n"
             if os.path.exists(os.path.join(out_dir, "samples.md")) else "")
          + ref_line + md_table(gens, gen_columns(gens)) + "\n\n"
          + (wrap(lexicon) + "\n\n" if lexicon else "")
          + "Per cycle, what each arm's training step used (the control matches GRPO's updates and tokens):\n\n"
          + md_table(steps, STEP_COLUMNS) + "\n\n"
          + game_section(rows, gens, report)
          + frontier_section(report, headline)
          + saturation_section(sat)
          + ideal_section(ideal)
          + information_section(info)
          + ("## Verdicts at T = 1 (secondary)\n\n" + wrap(
              "Every generator sampled at T = 1 only"
              + (" (replicate 0)" if any(g.get("replicate") for g in gens) else "")
              + ": a sharper generator wins real-word rate here for free. A difference within the stated noise "
              "threshold shows no difference, which is not equivalence (no margin is set here).") + "\n\n"
             + "\n".join(wrap(v, bullet=bool(i)) for i, v in enumerate(lines)) + "\n\n" if lines else "")
          + (wrap(f"**Note:** {meta['base_data_note']}") + "\n\n" if meta.get("base_data_note") else "")
          + f"stopped: {meta.get('stop_reason', 'running')}\n")
    summary = {"schema_version": 4, "cycles": rows, "generators": gens, "natural_reference": reference,
               "frontier": {f"cycle_{n}": r for n, r in report.items()}, "frontier_verdicts": headline,
               "information": {f"cycle_{n}": r for n, r in info.items()},
               "ideal_fractions": {f"cycle_{n}": r for n, r in ideal.items()},
               **({"saturation": sat} if sat is not None else {}),
               "verdicts": lines, **meta}
    check_finite_tree(summary)
    atomic_write_text(os.path.join(out_dir, "summary.md"), md)
    atomic_write_text(os.path.join(out_dir, "summary.json"), json.dumps(summary, indent=2, allow_nan=False) + "\n")
    if figures:
        plot_frontiers(out_dir, report, gens, reference)
        if gens:
            plot_cycle_summary([g for g in gens if not g.get("replicate")], os.path.join(out_dir, "summary.png"),
                               reference, title=f"adversarial cycles: {os.path.basename(os.path.abspath(out_dir))}")
    return md


def corpus_line(meta):
    """summary.md's line naming the corpus the run measured on: its directory and the text it was prepared
    from (data_source: tiny-shakespeare's input.txt and the offline fallback plays are different corpora)."""
    if not meta.get("data_dir"):
        return ""
    source = f", prepared from {meta['data_source']}" if meta.get("data_source") else ""
    judge = f" The judge's text: {meta['judge_data']['what']}." if meta.get("judge_data") else ""
    return wrap(f"Corpus: {meta['data_dir']}{source}.{judge}") + "\n\n"


def data_source(corpus):
    """Which text the corpus was prepared from, for the results' stamp (tiny-shakespeare's input.txt
    and the offline fallback plays are different corpora)."""
    info = corpus.prepare_info or {}
    if not info.get("input"):
        return None
    return (f"{os.path.basename(info['input'])} ({info.get('source', '?')}, {info.get('input_chars', 0):,} characters, "
            f"train split sha256 {str(info.get('train_sha256'))[:12]})")


def code_commit():
    """The commit of the code that ran (with '+dirty' for uncommitted changes), for the results'
    stamp. $CODE_COMMIT, where the copier of a checkout recorded it (bench/gpu_check.sh sets it from
    .gpu/COMMIT), comes first: a copy may come without .git, or with a stale one (the GPU machine's stamped
    an H100 run with the session's first commit, two behind); else git's HEAD, else None."""
    if os.environ.get("CODE_COMMIT"):
        return os.environ["CODE_COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        head = None
    if head is None or head.returncode != 0:
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def run_meta(run, state, base, trunk, t_start):
    """The run's settings and outcome, for summary.json (run: its Run, experiment/steps.py; state: replicate 0's RunState)."""
    args = run.args
    return {"base": base, "stop_reason": state.stop_reason, "final_generator": state.gen,
            "final_val_ppl": state.gen_ppl, "control_final_generator": state.arms["control"].gen if run.control else None,
            "preset": args.preset, "smoke": args.smoke, "detector": run.detector_name, "detector_trunk": trunk,
            "data_dir": os.path.abspath(run.eval_data_dir),
            **({"arms_data_dir": os.path.abspath(args.data_dir), "data_chars": args.data_chars,
                "data_slices": {k: (read_prepare_info(d) or {}).get(k) for d in (args.data_dir,) for k in
                                ("train_start", "train_stop", "dev_from_train", "train_tokens", "val_tokens")}}
               if run.eval_data_dir != args.data_dir else {}),
            **({"heldout": {"share": run.preset["heldout_share"], "generator_dir": os.path.abspath(args.heldout_dirs[0]),
                            "natural_dir": os.path.abspath(args.heldout_dirs[1])}}
               if getattr(args, "heldout_dirs", None) else {}),
            "settings": {"quality_samples": run.quality_samples, "detect_blocks": run.detect_blocks,
                         "sample_len": run.sample_len, "eval_block_size": run.eval_block_size,
                         "eval_batch_size": run.args.eval_batch_size,
                         "seed": args.seed, "seeds": args.seeds, "control": run.control,
                         "decode": os.environ.get("GPT_DECODE"), "parallel_cycle0": run.parallel_cycle0,
                         "parallel_arms": run.parallel_arms,
                         "control_detector": run.control and not run.skip_control_detector,
                         "final_detector": not run.skip_final_detector,
                         "control_learning_rate": run.control_lr, "replay": args.replay, "spin_arm": "spin" in args.arms,
                         **({k: getattr(args, k) for k in ("spin_beta", "spin_learning_rate", "spin_nll_coef")}
                            if "spin" in args.arms else {}),
                         **({k: getattr(args, k) for k in ("ddo_alpha", "ddo_beta", "ddo_rounds", "ddo_learning_rate")}
                            if "ddo" in args.arms else {}),
                         "null_arm": run.null, "judge": run.judge_rec, "arms": args.arms,
                         **({k: getattr(args, k) for k in ("sir_n", "logit_beta", "logit_learning_rate", "ptx_coef")}
                            if set(args.arms) & RATIO_ARMS else {}),
                         "temps": args.temps, "extra": run.extra,
                         # the device and precision every step and measurement ran at
                         "device": run.device, "device_name": device_name(run.device),
                         "dtype": resolve_dtype(args.dtype, run.device)},
            "train_noise": run.train_noise, "design": run.preset.get("design"),
            "judge_data": {"holdout": args.judge_holdout, "dir": run.judge_data_dir and os.path.abspath(run.judge_data_dir),
                           "what": (f"given (--judge_ckpt {args.judge_ckpt})" if args.judge_ckpt else
                                    f"the train split past its first {run.preset['judge_after'] or args.data_chars:,} tokens (less its "
                                    f"dev slice), which no arm, control or detector saw at any --data_chars"
                                    if run.judge_data_dir and args.data_chars else
                                    f"the last {args.judge_holdout:g} of the train split, which no arm, control or "
                                    f"detector saw" if run.judge_data_dir else
                                    "the twin judge: the same train split as every arm (the trunk's recipe, another "
                                    "seed): it may favour what the trunk favours")},
            "base_data_note": run.base_data_note, "commit": code_commit(), "data_source": data_source(run.corpus),
            "command": " ".join(["python", "run_cycles.py"] + sys.argv[1:]),
            "seconds_this_invocation": round(time.time() - t_start, 1)}


def track_summary(run, gens):
    """The run's figures in TensorBoard (tb/summary) and its W&B group (run 'summary'): each arm's val
    ppl, judge NLL and real-word rate by cycle (replicate 0), each arm's matched-quality val NLL
    difference to each control, and the frontier verdicts as text."""
    tb_dir = "none" if run.tb_root is None else os.path.join(run.tb_root, "summary")
    args = argparse.Namespace(**{**vars(run.args), "tensorboard_dir": tb_dir, "wandb_group": run.wandb_group,
                                 "wandb_run_name": run.args.wandb_run_name or "summary"})
    tracker = open_tracker(args, run.out_dir)
    for g in gens:
        if g["replicate"] == 0:
            tracker.log({"kind": g["arm"], "step": g["cycle"], "val_ppl": g["val_ppl"], "judge_nll": g["judge_nll"],
                         "real_word_rate": g["real_word_rate"]})
    report = frontier_report(gens, run.train_noise, run.preset.get("design"))
    for n, r in report.items():
        for arm, a in r["arms"].items():
            tracker.log({"kind": f"verdict_{arm}", "step": n,
                         **{f"val_nll_diff_vs_{c}": v["at_quality"]["diff"] for c, v in a["verdicts"].items()
                            if v["at_quality"]["verdict"] != "out of range"}})
    tracker.log_text("verdict", "\n\n".join(frontier_lines(report)) or "no verdict (no control arm)")
    tracker.close()
