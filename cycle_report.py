"""
run_cycles.py's records and report: one summary.json entry per generator, the verdicts that
compare the arms, and summary.md / summary.json / summary.png.
"""
import json
import math
import os

from common import ProjectError, atomic_write_text


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


DET_KEYS = ("det_val_mae", "det_val_mae_se", "det_const_mae", "det_val_corr", "det_val_loss", "det_auroc",
            "det_auroc_se", "det_lexicon_mae", "det_iters", "det_curve")


def generator_entry(cycle, arm, ev, replicate=0):
    """summary.json's record of one generator; its det_* fields stay None until a fresh detector
    has measured it (det_skipped says why when that was skipped)."""
    keep = ("generator", "val_loss", "val_ppl", "real_word_rate", "words", "distinct_2", "bigrams",
            "degenerate_share", "samples", "examples", "frontier")
    return {"cycle": cycle, "arm": arm, "replicate": replicate, **{k: ev[k] for k in keep},
            "mauve": (ev.get("mauve") or {}).get("mauve"),  # run_cycles --mauve_features, else None
            "detector": None, "det_final_stage": None, "det_skipped": "not measured yet",
            **dict.fromkeys(DET_KEYS)}


def attach_detector(entry, det, where, final_stage):
    entry.update({"detector": where, "det_final_stage": final_stage, "det_skipped": None,
                  "det_val_mae": det["val_mae"], "det_val_mae_se": det["val_mae_se"],
                  "det_const_mae": det["const_mae"], "det_val_corr": det["val_corr"],
                  "det_val_loss": det["val_loss"], "det_auroc": det["auroc"], "det_auroc_se": det["auroc_se"],
                  "det_lexicon_mae": det["lexicon_mae"],
                  "det_iters": det["iters"], "det_curve": det["curve"]})


GEN_COLUMNS = [("cycle", "cycle", "{}"), ("arm", "arm", "{}"), ("replicate", "seed", "{}"),
               ("val_ppl", "val ppl", "{:.3f}"),
               ("real_word_rate", "real-word rate", "{:.3f}"),
               ("distinct_2", "distinct-2", "{:.3f}"),
               ("degenerate_share", "degenerate", "{:.3f}"),
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


def md_table(rows, columns):
    def cell(v, f):
        return "-" if v is None else f.format(v)
    lines = ["| " + " | ".join(h for _, h, _ in columns) + " |", "|" + "---|" * len(columns)]
    return "\n".join(lines + ["| " + " | ".join(cell(r.get(k), f) for k, _, f in columns) + " |" for r in rows])


def verdicts(gens, reference):
    """One line per measure: the two arms' last generators compared (see cycle_metrics.verdict)."""
    from cycle_metrics import binomial_noise, verdict
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


JUDGED = ("adversarial", "spin")  # the arms judged against the control's frontier


def arm_curves(gens, cycle, arm):
    """The frontier sweeps of one arm's generators after `cycle`, one per replicate: [{T: row}]."""
    return [{float(t): row for t, row in g["frontier"].items()} for g in gens
            if g["cycle"] == cycle and g["arm"] == arm and g.get("frontier")]


def jsonable(curve):
    return {f"{t:g}": row for t, row in curve.items()}


def frontier_report(gens):
    """Per cycle with both arms: each arm's frontier (mean and standard error over the replicates,
    or within-run for one), the verdict of the adversarial arm's T = 1 point against the control's
    curve (frontier.frontier_verdict), the verdict at every temperature of its curve, and the
    matched temperatures samples.md shows. {cycle: record}."""
    import frontier as fr
    out = {}
    for n in sorted({g["cycle"] for g in gens if g["arm"] in JUDGED}):
        ctl = arm_curves(gens, n, "control")
        if not ctl:
            continue
        cm, cse, kind = fr.aggregate(ctl)
        rec = {"replicates": len(ctl), "se_kind": kind, "control": jsonable(cm), "control_se": jsonable(cse),
               "arms": {}, "matched_temperature": {}}
        for arm in JUDGED:
            curves = arm_curves(gens, n, arm)
            if len(curves) != len(ctl):
                continue
            am, ase, _ = fr.aggregate(curves)
            name = f"the {arm} arm"
            v = fr.frontier_verdict(am[1.0], ase[1.0], cm, cse, point_t=1.0, arm=name, se_kind=kind)
            along = {f"{t:g}": fr.frontier_verdict(am[t], ase[t], cm, cse, point_t=t, arm=name, se_kind=kind)["verdict"]
                     for t in sorted(am)}
            # samples.md: the control at this arm's T = 1 quality, and this arm at the control's
            back = fr.interpolate(am, cm[1.0]["real_word_rate"], ase, near_t=1.0)
            rec["arms"][arm] = {"verdict": v, "along_curve": along, "curve": jsonable(am), "se": jsonable(ase),
                                "matched_temperature": back and back["t_star"]}
            rec["matched_temperature"].setdefault("control", v["t_star"])
            rec["matched_temperature"][arm] = back and back["t_star"]
        if rec["arms"]:
            out[n] = rec
    return out


def frontier_lines(report):
    """summary.md's headline: where the adversarial arm lies against the MLE control's frontier."""
    lines = []
    for n, r in report.items():
        for arm, a in r["arms"].items():
            v = a["verdict"]
            along = ", ".join(f"{t}: {x}" for t, x in a["along_curve"].items())
            lines.append(f"cycle {n}, {arm} arm at T = 1 against the control's temperature curve "
                         f"({r['replicates']} replicate(s)): **{v['verdict']}**: {v['sentence']}. "
                         f"Every temperature of its curve against the control's: {along}.")
    return lines


def plot_frontiers(out_dir, report, gens, reference):
    """frontier_cycle_N.png: the cycle's arms and the cycle-0 generator over the temperature."""
    import frontier as fr
    base = arm_curves(gens, 0, "base")
    paths = []
    for n, r in report.items():
        arms = {"cycle 0 base (MLE)": (base[0], None)} if base else {}
        arms[f"cycle {n} control (MLE, same budget)"] = ({float(t): p for t, p in r["control"].items()},
                                                         {float(t): p for t, p in r["control_se"].items()})
        for arm, a in r["arms"].items():
            arms[f"cycle {n} {arm} ({'GRPO' if arm == 'adversarial' else 'SPIN'})"] = (
                {float(t): p for t, p in a["curve"].items()}, {float(t): p for t, p in a["se"].items()})
        path = os.path.join(out_dir, f"frontier_cycle_{n}.png")
        fr.plot_frontier(arms, path, natural=reference,
                         title=f"{os.path.basename(os.path.abspath(out_dir))}, cycle {n}: quality-diversity "
                               f"frontier over T (error bars: 1 SE, {r['se_kind'].split(' (')[0]})")
        paths.append(os.path.basename(path))
    return paths


def write_summary(out_dir, rows, gens, reference, meta):
    order = {"base": 0, "adversarial": 1, "control": 2, "spin": 3}
    gens = sorted(gens, key=lambda g: (g["cycle"], order.get(g["arm"], 4)))
    lines = verdicts(gens, reference) if reference else []
    report = frontier_report(gens)
    headline = frontier_lines(report)
    ref_line = ("" if not reference else
                f"Natural val text (the same {reference['samples']} windows of {reference['sample_len']} tokens): "
                f"real-word rate {reference['real_word_rate']:.3f}, distinct-2 {reference['distinct_2']:.3f}, "
                f"degenerate share {reference['degenerate_share']:.3f}.\n\n")
    steps = []
    for r in rows:
        ctl = next((g for g in gens if g["cycle"] == r["cycle"] and g["arm"] == "control"), {})
        steps.append({**r, **{f"control_mle_{k}": ctl.get(f"mle_{k}") for k in ("iters", "tokens", "learning_rate")}})
    md = (f"# Adversarial cycles: {out_dir}\n\n"
          "One row per generator: cycle 0 is the base generator both arms start from; after cycle n, the\n"
          "adversarial arm's generator is the GRPO result and the control arm's the plain-MLE result.\n"
          "Val ppl: full val split. Sample measures: the same prompts (one natural val token) and sampling\n"
          "noise for every generator. Detector: a FRESH reward model trained on that generator's samples\n"
          "(the next cycle's, or the final stage's): its val MAE of P(natural) against K/N (higher = harder\n"
          "to detect), the constant 0.5's MAE, the lexicon baseline's MAE on the same reward data, and the\n"
          "AUROC of P(natural) between natural val blocks and the generator's blocks (0.5 = chance).\n\n"
          + ("Samples of every generator on the same prompts: [samples.md](samples.md).\n\n"
             if os.path.exists(os.path.join(out_dir, "samples.md")) else "")
          + ref_line + md_table(gens, gen_columns(gens)) + "\n\n"
          "Per cycle, what each arm's training step used (the control matches GRPO's updates and tokens):\n\n"
          + md_table(steps, STEP_COLUMNS) + "\n\n"
          + ("## Verdict on the quality-diversity frontier\n\nA lower sampling temperature raises any model's "
             "real-word rate and lowers its diversity, so each arm is compared with the MLE control at the "
             "temperature where the control's real-word rate is the same (interpolated in T). Beyond: higher "
             "distinct-2 and val ppl no worse, by more than 2 SE; inside: lower distinct-2 or worse val ppl by "
             "more than 2 SE; else a tie.\n\n" + "\n".join(f"- {v}" for v in headline) + "\n\n"
             + "".join(f"![frontier, cycle {n}](frontier_cycle_{n}.png)\n" for n in report) + "\n"
             if headline else "")
          + ("## Verdicts at T = 1 (secondary)\n\nEvery generator sampled at T = 1 only"
             + (" (replicate 0)" if any(g.get("replicate") for g in gens) else "")
             + ": a sharper generator wins real-word rate here for free. A difference below the stated noise "
             "threshold is called a tie.\n\n"
             + "\n".join(f"- {v}" if i else v for i, v in enumerate(lines)) + "\n\n" if lines else "")
          + (f"**Note:** {meta['base_data_note']}\n\n" if meta.get("base_data_note") else "")
          + f"stopped: {meta.get('stop_reason', 'running')}\n")
    summary = {"schema_version": 3, "cycles": rows, "generators": gens, "natural_reference": reference,
               "frontier": {f"cycle_{n}": r for n, r in report.items()}, "frontier_verdicts": headline,
               "verdicts": lines, **meta}
    check_finite_tree(summary)
    atomic_write_text(os.path.join(out_dir, "summary.md"), md)
    atomic_write_text(os.path.join(out_dir, "summary.json"), json.dumps(summary, indent=2, allow_nan=False) + "\n")
    plot_frontiers(out_dir, report, gens, reference)
    if gens:
        from plots import plot_cycle_summary
        plot_cycle_summary([g for g in gens if not g.get("replicate")], os.path.join(out_dir, "summary.png"),
                           reference,
                           title=f"adversarial cycles: {os.path.basename(os.path.abspath(out_dir))}")
    return md


def md_cell(text):
    """Text as one markdown table cell: line breaks kept as <br>, pipes and markup escaped."""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")
    return text.replace("\r", "").replace("\n", "<br>") or " "


def write_samples(path, prompts, natural, columns):
    """samples.md: for each fixed val prompt, the natural continuation and every generator's, one
    table per prompt. columns: [(label, temperature, [continuation text per prompt])]."""
    out = ["# Samples", "",
           "The same val prompts and sampling noise for every generator; the prompt is shown once, each row "
           "is what follows it. T is the sampling temperature (T = 1: the model as trained; a matched T: the "
           "temperature at which the control arm's real-word rate equals that arm's at T = 1, see summary.md).",
           ""]
    for i, prompt in enumerate(prompts):
        out += [f"## Prompt {i + 1}", "", "```", prompt, "```", "",
                "| source | T | continuation |", "|---|---|---|",
                f"| natural text | - | {md_cell(natural[i])} |"]
        out += [f"| {label} | {t:.2f} | {md_cell(texts[i])} |" for label, t, texts in columns]
        out.append("")
    atomic_write_text(path, "\n".join(out) + "\n")


def data_source(corpus):
    """Which text the corpus was prepared from, for the results' stamp (tiny-shakespeare's input.txt
    and the offline fallback plays are different corpora)."""
    info = corpus.prepare_info or {}
    if not info.get("input"):
        return None
    return (f"{os.path.basename(info['input'])} ({info.get('source', '?')}, {info.get('input_chars', 0):,} characters, "
            f"train split sha256 {str(info.get('train_sha256'))[:12]})")
