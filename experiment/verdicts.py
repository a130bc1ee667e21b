"""
Every arm judged against both MLE controls on the quality-coverage frontier (experiment/frontier.py's
verdicts), cycle by cycle and over replicates: the frontier report summary.json keeps, and the verdict
section of summary.md (its table, what the controls cost, the sentences, the figures).
"""
import os

from experiment import frontier as fr, power
from experiment.markdown import wrap
from experiment.presets import START_POINT, arm_text

# the arms judged against the controls' frontiers
JUDGED = ("more_data", "ensemble", "ensemble_kd", "adversarial", "heldout", "null", "spin", "ddo", "sir", "logit", "ptx",
          "ratio")
# the arms rewarded by (or resampling with) the cycle's detector, whose words count only where it beats chance; an arm
# with a detector of its own (summary.json's own_detector: unfrozen, heldout) is checked on that one
CYCLE_DETECTOR_ARMS = ("adversarial", "sir", "logit", "ptx")
NOT_ARMS = ("base", "trunk", "control", "compute")  # cycle 0's generator and the controls
# the data-limited test's positive controls (issue 76), judged as arms are: MLE at its limit on twice the data (the
# margin's yardstick), the ensemble of MLE models on the same data (a reference) and its distilled student
POSITIVE = ("more_data", "ensemble", "ensemble_kd")


def judged_arms(gens):
    """The arms of gens judged against the controls: the built-in ones in JUDGED's order, then the others (a user's
    arms, run_cycles --arm, compare.py) in their order of appearance."""
    present = list(dict.fromkeys(g["arm"] for g in gens if g["arm"] not in NOT_ARMS))
    return [a for a in JUDGED if a in present] + [a for a in present if a not in JUDGED]



# the controls every arm is judged against, by summary.json's arm name: each named for what it is (the trunk
# had 0.43x the default preset's adversarial arm's FLOPs, which pays for the trunk and for all it builds on it)
CONTROLS = {"control": "the same-budget MLE control", "trunk": "the longer-trained MLE control (the detector trunk)",
            "compute": "the compute-matched MLE control (the base recipe on the adversarial arm's FLOPs)",
            "strongest": "the strongest control (the ensemble's student, beyond MLE at its limit)"}
# which A/A null each control's one-seed verdicts take their training noise from (aa_test.py): the same-budget
# control continues the arm's own base, the trunk is another model
NOISE_KIND = {"control": "continuation", "trunk": "base", "compute": "base", "strongest": "base"}



def entering_entry(gens, g):
    """The generator g started from: its recorded entering generator (the density-ratio arms), else its
    own arm's previous cycle (the base after cycle 0's)."""
    c, arm = g.get("entering") or (g["cycle"] - 1, g["arm"] if g["cycle"] > 1 else "base")
    found = [e for e in gens if e["cycle"] == c and e["arm"] == arm]
    # (a summary of before every replicate had its own cycle 0 holds replicate 0's alone)
    return next((e for e in found if e.get("replicate", 0) == g.get("replicate", 0)),
                next((e for e in found if c == 0 and not e.get("replicate")), None))


def rep_curves(gens, cycle, arm):
    """{replicate: frontier sweep} of one arm's generators after `cycle`, in replicate order."""
    found = sorted((g for g in gens if g["cycle"] == cycle and g["arm"] == arm and g.get("frontier")),
                   key=lambda g: g.get("replicate", 0))
    return {g.get("replicate", 0): {float(t): row for t, row in g["frontier"].items()} for g in found}


def arm_curves(gens, cycle, arm):
    """The frontier sweeps of one arm's generators after `cycle`, one per replicate in replicate order."""
    return list(rep_curves(gens, cycle, arm).values())



def mean_curve(curves):
    """The replicates' mean of every number at every T (the item lists are left out)."""
    out = {}
    for t in sorted(curves[0]):
        keys = [k for k, v in curves[0][t].items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
        out[f"{t:g}"] = {k: sum(c[t][k] for c in curves) / len(curves) for k in keys}
    return out



def mean_compute(gens, cycle, arm):
    vals = [g["compute_flops"] for g in gens if g["cycle"] == cycle and g["arm"] == arm
            and g.get("compute_flops") is not None]
    return sum(vals) / len(vals) if vals else None



def judge_arm(curves, controls, arm, noise=None, margin=None):
    """One arm's verdicts against every control: at T = 1 (both matched axes) and along its curve. noise: the
    A/A test's one-seed training noise per kind of null ({"continuation": {"quality", "coverage"}, "base": ...});
    margin: the row's equivalence margin per matching (power's words), None for the threshold's."""
    out = {}
    for cname, ccurves in controls.items():
        if len(ccurves) != len(curves):
            continue
        tn = (noise or {}).get(NOISE_KIND[cname])
        v = fr.verdict([c[1.0] for c in curves], ccurves, arm_text(arm), CONTROLS[cname], train_noise=tn,
                       margin=margin)
        along = {f"{t:g}": fr.verdict([c[t] for c in curves], ccurves, point_t=t, train_noise=tn,
                                      margin=margin)["verdict"] for t in sorted(curves[0])}
        out[cname] = {**v, "along_curve": along}
    return out


def beats_trunk(gens, n, arm, trunk, margin=None):
    """arm's T = 1 verdict against MLE at its limit (the trunk), over the replicates both have; None without them."""
    curves = rep_curves(gens, n, arm)
    if not curves or not trunk or not all(r in trunk for r in curves):
        return None
    return fr.verdict([c[1.0] for c in curves.values()], [trunk[r] for r in curves], margin=margin)


def row_margin(gens, n, trunk, design):
    """The row's margin (issue 76): the more-data control against MLE at its limit (the trunk) gives delta,
    design["margin_fraction"] of what doubling the data bought, per matching; None without the control. (The row is
    powered only where that control is itself beyond under the margin: frontier_report reads its verdict.)"""
    v = beats_trunk(gens, n, design["positive"], trunk)
    return None if v is None else power.margin_from(v, design["margin_fraction"])


def arm_detector(gens, n, arm):
    """power.detector_check, over the seeds, of the detector that rewarded the arm's cycle-n generators (its own, else
    the cycle's); None for an arm without one (the controls, DDO, SPIN, the null arm, the ideal detector) or where a
    seed's AUROC is unrecorded."""
    found = [g for g in gens if g["cycle"] == n and g["arm"] == arm]
    aurocs = []
    for g in found:
        if g.get("own_detector"):
            aurocs.append((g["own_detector"].get("auroc"), g["own_detector"].get("auroc_se")))
        elif arm in CYCLE_DETECTOR_ARMS:
            e = entering_entry(gens, g) or {}
            aurocs.append((e.get("det_auroc"), e.get("det_auroc_se")))
    if not aurocs or any(a is None for a, _ in aurocs):
        return None
    return power.detector_check(aurocs)


def tuned_to_start(gens, n, arm):
    """Whether every seed of a tuned arm (experiment/tuning.py) took its 0-step point: the arm is then the generator it
    starts from, and its word says nothing of its method but that no point of its grid helped on the dev slice."""
    found = [g for g in gens if g["cycle"] == n and g["arm"] == arm]
    return bool(found) and all((g.get("tuned") or {}).get("settings") == START_POINT for g in found)


def qualify_words(report):
    """Every verdict keeps its word; an arm whose detector failed (arm_detector) gets "void": why the word does not
    count; an arm tuned to its start (tuned_to_start) gets "start": what its word is about."""
    for r in report.values():
        for a in r["arms"].values():
            if a.get("tuned_to_start"):
                for v in a["verdicts"].values():
                    v["start"] = ("tuned to 0 steps: no point of its grid beat its start on the dev slice, so this is "
                                  "its start generator's word, not its method's")
            d = a.get("detector")
            if d and d["failed"]:
                for v in a["verdicts"].values():
                    v["void"] = (f"its detector failed (val AUROC {d['auroc']:.3f}, 95 % [{d['ci95'][0]:.3f}, "
                                 f"{d['ci95'][1]:.3f}], not above chance): the word does not count")
    return report


DIRECTIONAL = ("beyond", "inside", "mixed", "degenerate")  # the words that claim a difference


def holm_words(report, alpha=0.05, primary=None):
    """Holm's step-down at alpha over a family of T = 1 comparisons (their p: frontier.comparison_p): every
    (cycle, arm, control) of the report, or with `primary` (the pre-registered (arm, control) pairs) those alone, the
    others marked exploratory and left uncorrected. Each record gets "family" (its size; 0: exploratory) and
    "run_verdict": its word, with ", not past Holm" where a word that claims a difference does not survive (never
    turned into another word). A run's verdict is read from these."""
    recs = [(arm, c, v) for r in report.values() for arm, a in r["arms"].items() for c, v in a["verdicts"].items()]
    family = [v for arm, c, v in recs if primary is None or (arm, c) in primary]
    for v, k in zip(family, fr.holm([fr.comparison_p(v) for v in family], alpha)):
        v["run_verdict"] = v["verdict"] + ("" if k or v["verdict"] not in DIRECTIONAL else ", not past Holm")
        v["family"] = len(family)
    for arm, c, v in recs:
        if "family" not in v:
            v.update(run_verdict=v["verdict"], family=0)
    return report



def frontier_report(gens, noise=None, design=None):
    """Per cycle with a judged arm: the controls' and each arm's mean curve, each arm's compute and
    its verdicts against the same-budget MLE control (the control arm of the same replicate) and the
    longer-trained one (the replicate's detector trunk), with the run's Holm correction (holm_words), and
    the matched temperatures samples.md shows (matched_temperature: control -> the T* of matched quality
    with the adversarial arm). noise: judge_arm's. design: the data-limited test's pre-registration (presets'
    "design": the positive control that sets each row's margin, the margin's fraction, the primary comparisons,
    the arm that becomes the strongest control where it is beyond MLE at its limit). {cycle: record}."""
    trunk = rep_curves(gens, 0, "trunk")  # one per replicate (a summary of older runs: replicate 0's alone)
    out = {}
    judged = judged_arms(gens)
    for n in sorted({g["cycle"] for g in gens if g["arm"] in judged}):
        adv = rep_curves(gens, n, "adversarial") or rep_curves(gens, n, "null")
        controls = {"control": rep_curves(gens, n, "control"),
                    "trunk": trunk if len(trunk) == len(adv) or not trunk else {r: trunk[min(trunk)] for r in adv},
                    "compute": rep_curves(gens, 0, "compute")}
        controls = {k: v for k, v in controls.items() if v}
        if not controls:
            continue
        margin = row_margin(gens, n, controls.get("trunk"), design) if design else None
        student = margin and beats_trunk(gens, n, design["strongest"], controls.get("trunk"), margin)
        if student and student["verdict"] == "beyond":  # every arm is compared with it too
            controls["strongest"] = rep_curves(gens, n, design["strongest"])
        rec = {"replicates": len(adv), "controls": {}, "arms": {}, "matched_temperature": {},
               **({"margin": margin} if design else {})}
        for cname, ccurves in controls.items():
            where = {"control": (n, cname), "strongest": (n, design and design["strongest"])}.get(cname, (0, cname))
            rec["controls"][cname] = {"curve": mean_curve(list(ccurves.values())),
                                      "compute_flops": mean_compute(gens, *where)}
        for arm in judged:
            curves = rep_curves(gens, n, arm)
            if not curves:
                continue
            # each replicate of the arm against the same replicate's controls (compare.py may bring fewer)
            paired = {c: [cc[r] for r in curves] for c, cc in controls.items() if all(r in cc for r in curves)
                      and not (c == "strongest" and arm == design["strongest"])}
            rec["arms"][arm] = {"curve": mean_curve(list(curves.values())), "compute_flops": mean_compute(gens, n, arm),
                                "verdicts": judge_arm(list(curves.values()), paired, arm, noise,
                                                      (margin or {}) if design else None),
                                **({"detector": det} if (det := arm_detector(gens, n, arm)) else {}),
                                **({"tuned_to_start": True} if tuned_to_start(gens, n, arm) else {}),
                                **({"replicates": len(curves)} if len(curves) != len(adv) else {})}
        # samples.md: each control at the T* where it matched the adversarial arm's quality (the
        # verdict table's T* of matched quality), so its samples are those the verdict compares
        for cname, v in rec["arms"].get("adversarial", {}).get("verdicts", {}).items():
            if v["at_quality"]["verdict"] != "out of range":
                rec["matched_temperature"][cname] = v["at_quality"]["t_star"]
        if design:  # a row says nothing of the arms unless its more-data control is itself beyond MLE at its limit
            pos = rec["arms"].get(design["positive"], {}).get("verdicts", {}).get("trunk")
            rec["powered"] = None if pos is None else pos["verdict"] == "beyond"
        if rec["arms"]:
            out[n] = rec
    return qualify_words(holm_words(out, primary=design and {(a, "trunk") for a in design["primary"]}))



def seeds_label(n_seeds, provisional=False):
    """How a verdict's seeds are named wherever it appears."""
    if n_seeds == 1:
        return "1 seed" + (", provisional" if provisional else "")
    return f"{n_seeds} seeds, cycle 0 retrained per seed"


def flops_ratio(report, n, arm, cname):
    """The control's FLOPs as a multiple of the arm's (None where either is unknown)."""
    a, c = report[n]["arms"][arm]["compute_flops"], report[n]["controls"][cname]["compute_flops"]
    return c / a if a and c is not None else None


def frontier_lines(report):
    """summary.md's headline: each arm against each control, one sentence each, with its seeds, the
    control's FLOPs beside the arm's and the run's Holm-corrected word."""
    out = []
    for n, r in report.items():
        for arm, a in r["arms"].items():
            for cname, v in a["verdicts"].items():
                ratio = flops_ratio(report, n, arm, cname)
                prov = any(v[m].get("provisional") for m in ("at_quality", "at_coverage"))
                seeds = seeds_label(a.get("replicates", r["replicates"]), prov)
                out.append(f"cycle {n} ({seeds}), T = 1: {v['sentence']}"
                           + (f"; the control had {ratio:.2f}x the arm's FLOPs" if ratio is not None else "")
                           + (f"; over the run's {v['family']} comparisons (Holm, 5 %): **{v['run_verdict']}**"
                              if "run_verdict" in v else "") + (f"; {v['void']}" if v.get("void") else "")
                           + (f"; {v['start']}" if v.get("start") else "")
                           + ". Along its curve: " + ", ".join(f"{t}: {x}" for t, x in v["along_curve"].items()))
    return out



def flops_cell(x):
    return "-" if x is None else f"{x:.3g}"



AXIS_NAMES = {key: name for key, _, name in fr.AXES.values()}  # "val_loss" -> "val NLL"


def verdict_table(report):
    """One row per (cycle, arm, control): compute, T*, the matched differences (each named by the axis it
    compares: a "past" match compares val NLL at the control's best coverage) and the verdicts, the run's
    Holm-corrected word last."""
    how = "diff [95 %], MDE" if any(r.get("margin") for r in report.values()) else "diff +- threshold"
    head = ("| cycle | seeds | arm | its FLOPs | control | its FLOPs (x the arm's) | judge NLL (arm, T = 1) | "
            f"matched quality: T*, {how} | verdict | matched coverage: T*, {how} | verdict | "
            "overall | over the run (Holm) |\n|" + "---|" * 13)
    rows = []
    for n, r in report.items():
        for arm, a in r["arms"].items():
            for cname, v in a["verdicts"].items():
                cells = []
                for m in ("at_quality", "at_coverage"):
                    c = v[m]
                    cells += (["out of range", c["verdict"]] if c["verdict"] == "out of range" else
                              [f"{c['t_star']:.2f}{' (past)' if c.get('past') else ''}, "
                               f"{AXIS_NAMES.get(c.get('axis'), '')} {c['diff']:+.4f} " + (
                                   f"+- {c['threshold']:.4f}" if "delta" not in c else  # (under a margin: power's)
                                   f"[{c['ci95'][0]:+.4f}, {c['ci95'][1]:+.4f}], MDE {c['mde']:.4f}"), c["verdict"]])
                ratio = flops_ratio(report, n, arm, cname)
                prov = any(v[m].get("provisional") for m in ("at_quality", "at_coverage"))
                seeds = seeds_label(a.get("replicates", r["replicates"]), prov)
                rows.append(f"| {n} | {seeds} | {arm} | {flops_cell(a['compute_flops'])} | "
                            f"{cname} | {flops_cell(r['controls'][cname]['compute_flops'])}"
                            f"{f' ({ratio:.2f}x)' if ratio is not None else ''} | {a['curve']['1']['judge_nll']:.4f} | "
                            + " | ".join(cells) + f" | **{v['verdict']}** | {v.get('run_verdict', '-')}"
                            + (" (void: its detector failed)" if v.get("void") else "")
                            + (" (tuned to 0 steps)" if v.get("start") else "") + " |")
    return "\n".join([head] + rows)



def plot_frontiers(out_dir, report, gens, reference):
    """frontier_cycle_N.png: the cycle's arms, its controls and the cycle-0 generator over the temperature."""
    base = arm_curves(gens, 0, "base")
    paths = []
    as_curve = lambda c: {float(t): p for t, p in c.items()}  # noqa: E731
    for n, r in report.items():
        arms = {"cycle 0 base (MLE)": base[0]} if base else {}
        for cname, c in r["controls"].items():
            arms[f"{cname}: {CONTROLS[cname].replace('the ', '', 1)}"] = as_curve(c["curve"])
        for arm, a in r["arms"].items():
            arms[f"cycle {n} {arm_text(arm).replace('the ', '', 1)}"] = as_curve(a["curve"])
        path = os.path.join(out_dir, f"frontier_cycle_{n}.png")
        fr.plot_frontier(arms, path, natural=reference,
                         title=f"{os.path.basename(os.path.abspath(out_dir))}, cycle {n}: quality-coverage frontier "
                               f"over T ({r['replicates']} replicate(s), means)")
        paths.append(os.path.basename(path))
    return paths



THRESHOLD_WORDS = (
    "The verdict in words: **beyond** = the arm lies beyond the control's frontier (the arm wins); **inside** = the "
    "arm lies inside the control's frontier (the control wins); each past the threshold (paired noise: over S seeds "
    "t(0.975, S-1) x SE, the between-seed variance included, each seed retraining cycle 0; within one run 2 SE of "
    "per-item differences on the same prompts, noise and val windows, widened by the training noise the A/A test "
    "measured for the preset, else provisional; plus the interpolation error). The overall word needs both matchings "
    "to agree: beyond or inside where both say it, tie where one says a word and the other ties, mixed where one says "
    "beyond and the other inside; degenerate: a win whose samples are degenerate (repeated text, which a judge scores "
    "as likely) more often than the control's at T*, past 2 binomial SE: not a win. Over the run, Holm's correction "
    "at 5 % over all its comparisons keeps a word only where that comparison survives it (the last column).")
# the preset's design (issue 76): words under the row's margin, Holm over the primary comparisons alone
MARGIN_WORDS = (
    "The words, under the row's margin delta (a quarter of what twice the data buys MLE at its limit, per matching): "
    "**beyond** / **inside** where the 95 % interval lies below / above 0 (the arm / the control wins); "
    "**equivalent** where the 90 % interval at matched quality lies inside +-delta (two one-sided tests) and matched "
    "coverage claims no direction; **inconclusive** otherwise, never a tie. Each interval: over S seeds t(S-1) x SE, "
    "the between-seed variance and each run's paired SE (the same prompts, noise and val windows), plus the "
    "interpolation error; MDE: the smallest difference found four times in five. The overall word needs both "
    "matchings to agree (mixed where they point apart; degenerate: a win on repeated text). A row is powered only "
    "where the more-data control is beyond. Holm's correction at 5 % covers the design's primary comparisons alone "
    "(the last column); every other comparison is exploratory, uncorrected, and a word Holm does not keep stays, "
    "marked.")


def frontier_section(report, headline):
    """summary.md's verdict section: how it is judged, the table, what the controls cost, the
    sentences, the figures."""
    if not headline:
        return ""
    note = compute_note(report)
    unmatched = sorted({f"cycle {n} {arm}" for n, r in report.items() for arm, a in r["arms"].items()
                        if a["verdicts"].get("trunk", {}).get("run_verdict") == "beyond" and "compute" not in r["controls"]})
    if unmatched:  # the trunk had a fraction of the arm's FLOPs: beyond it is no claim until a true compute match
        note += (" **Unconfirmed:** " + ", ".join(unmatched) + " lie(s) beyond the longer-trained control, which had "
                 "less compute than the arm; the claim needs a control trained on the arm's whole FLOPs: rerun the "
                 "same command with --compute_control.")
    return ("## Verdict on the quality-coverage frontier\n\n" + wrap(
        "A lower sampling temperature makes any model's samples "
        "score better under a judge and cover the val text worse, so each arm is compared with each MLE control's "
        "temperature curve. Quality: the mean per-token NLL of the samples under an independent judge model; "
        "coverage: val NLL of the temperature-scaled model (both nats/token, lower is better). At matched "
        "quality, the control at the T* where its judge NLL equals the arm's, the arm's val NLL minus the "
        "control's; at matched coverage (the control's low-T branch), the judge NLL difference. Negative is "
        "the arm's win. " + (MARGIN_WORDS if any(r.get("margin") for r in report.values()) else THRESHOLD_WORDS)
        + " Controls: the same-budget MLE control (GRPO's updates and tokens) and the longer-trained MLE control "
        "(the detector trunk, an MLE model of the same data trained longer, that the detector arms' detectors "
        "are built on), each with its FLOPs as a multiple of the arm's. FLOPs: everything each arm's "
        "generator cost to make (experiment/flops.py).") + "\n\n" + verdict_table(report) + "\n\n"
            + (wrap(note) + "\n\n" if note else "")
            + "\n".join(wrap(v, bullet=True) for v in headline) + "\n\n"
            + "".join(f"![frontier, cycle {n}](frontier_cycle_{n}.png)\n" for n in report) + "\n")



def compute_note(report):
    """Why the longer-trained control (the detector trunk) had less compute than the arm it is compared
    with, with the ratio: the arm paid for the trunk and for everything built on it, so the comparison
    favours the arm. "" without a trunk on the frontier."""
    cycles = {n: r for n, r in report.items() if "trunk" in r["controls"] and r["arms"]}
    if any(r["controls"]["trunk"]["compute_flops"] is None for r in cycles.values()):
        return ("The detector trunk was given (--detector_trunk_ckpt): its training cost is unknown and no arm's "
                "FLOPs count it, so how its compute compares with the arms' is not known here.")
    ratios = []
    for n, r in cycles.items():
        arm = "adversarial" if "adversarial" in r["arms"] else next(iter(r["arms"]))
        t, a = r["controls"]["trunk"]["compute_flops"], r["arms"][arm]["compute_flops"]
        if a:
            ratios.append(f"after cycle {n} it cost {t:.3g} FLOPs, {t / a:.2f} times what {arm_text(arm)} "
                          f"cost ({a:.3g})")
    if not ratios:
        return ""
    return ("Compute: every arm that uses the detector pays for the detector trunk (the detector reads its "
            "features), and also for the base generator, the reward data, the detector and its own training, so "
            "the longer-trained control had less compute than the arm: "
            + "; ".join(ratios) + ". The comparison therefore favours the arm: where the trunk still wins, it "
            "wins with that fraction of the arm's compute. (The same-budget control matches GRPO's updates and "
            "tokens, not its FLOPs.)")


DETECTOR_ARMS = ("adversarial", "null", "sir", "logit", "ptx")  # the arms built on a trained detector


def ideal_fractions(gens):
    """Per cycle with the ideal-detector arm (ratio): each detector arm's gain at matched quality over the
    generator it entered the cycle with (its val NLL at the T* where that generator's judge NLL equals the
    arm's, negated: positive = the arm covers the val text better), beside the ideal arm's, and its fraction
    of it: what training a detector loses. {cycle: {"ideal": (gain, threshold), arm: (gain, threshold, fraction
    or None)}}; the fraction is None where the ideal arm gains nothing past its threshold."""
    out = {}
    for n in sorted({g["cycle"] for g in gens if g["arm"] == "ratio"}):
        gains = {}
        for arm in ("ratio",) + DETECTOR_ARMS:
            found = sorted((g for g in gens if g["cycle"] == n and g["arm"] == arm and g.get("frontier")),
                           key=lambda g: g.get("replicate", 0))
            pairs = [(g, entering_entry(gens, g)) for g in found]
            if not pairs or any(e is None or not e.get("frontier") for _, e in pairs):
                continue
            curves = [{float(t): row for t, row in e["frontier"].items()} for _, e in pairs]
            c = fr.verdict([g["frontier"]["1"] for g, _ in pairs], curves)["at_quality"]
            if c["verdict"] != "out of range":
                gains[arm] = (-c["diff"], c["threshold"])
        if "ratio" not in gains:
            continue
        ideal, t_ideal = gains.pop("ratio")
        out[n] = {"ideal": (ideal, t_ideal),
                  **{arm: (g, t, g / ideal if ideal > t_ideal else None) for arm, (g, t) in gains.items()}}
    return out


def ideal_section(fractions):
    """summary.md's paragraph and table of ideal_fractions ("" without the ideal-detector arm)."""
    if not fractions:
        return ""
    lines = ["| cycle | arm | gain over its entering generator at matched quality, val NLL +- threshold | "
             "of the ideal arm's |", "|---|---|---|---|"]
    for n, r in fractions.items():
        gains = r["ideal"][0] > r["ideal"][1]
        lines.append(f"| {n} | ratio (the ideal detector) | {r['ideal'][0]:+.4f} +- {r['ideal'][1]:.4f} | "
                     f"{'1' if gains else '-'} |")
        for arm in DETECTOR_ARMS:
            if arm in r:
                g, t, f = r[arm]
                lines.append(f"| {n} | {arm} | {g:+.4f} +- {t:.4f} | {'-' if f is None else f'{f:.2f}'} |")
    return ("## What training a detector loses\n\n" + wrap(
        "The ideal-detector arm (--arms ratio) is GRPO on the detector trunk's own log-ratio to the generator: the "
        "most any detector built on that trunk can hand the generator. Each arm's gain is measured against the "
        "generator it entered the cycle with, at matched quality (that generator's curve at the T* where its judge "
        "NLL equals the arm's; positive = the arm covers the val text better); the fraction is of the ideal arm's "
        "gain ('-' where the ideal arm gains nothing past its threshold).") + "\n\n" + "\n".join(lines) + "\n\n")
