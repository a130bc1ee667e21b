"""
The A/A test of the verdict (aa_test.py): pairs of MLE generators that differ only in their training seeds,
each judged as an arm against a control by experiment/frontier.py's verdict, at both matchings. Nothing differs
between the two, so every word but *tie* is a false positive. Two kinds of null pair:

  continuation  two same-budget MLE continuations of one base (the null of an arm against the same-budget
                control, which continues the arm's own base)
  base          two bases trained from different seeds (the null of an arm against another model: the trunk)

From the pairs' one-seed differences it estimates each matching's training noise (the SD of a difference
between two trainings, past the evaluation noise the paired SE already holds), which one-seed verdicts then add
(frontier.combine's train_noise), and it reports each rule's false-positive rate:

  OR, 1 seed       8a2b55b's overall word (either matching's word stands) on the paired SE alone
  both, 1 seed     a word needs both matchings (frontier.overall), paired SE alone (the provisional verdict)
  both + noise     the same with the training noise, estimated from the other pairs (leave one out) and from all
  both, 3 seeds    every 3 pairs pooled as 3 seeds (t(0.975, 2), between-seed variance): C(P, 3) overlapping
                   triples, so its rate is an estimate from correlated draws
"""
import itertools
import math

import numpy as np

from experiment import frontier as fr

MATCHINGS = ("quality", "coverage")


def overall_or(at_quality, at_coverage):
    """The overall word before the A/A test (8a2b55b): either matching's word stood, inside first."""
    labels = {at_quality, at_coverage} - {"out of range"}
    if not labels:
        return "out of range"
    if {"beyond", "inside"} <= labels:
        return "mixed"
    return next((w for w in ("inside", "degenerate", "beyond") if w in labels), "tie")


def pair_verdict(arm, control, train_noise=None):
    """One null pair at one seed: the arm's T = 1 point against the control's curve (sweeps {T: point})."""
    return fr.verdict([arm[1.0]], [control], train_noise=train_noise)


def training_noise(verdicts):
    """Per matching, the SD of the one-seed difference that training adds to the evaluation noise: the
    pairs' variance of their differences less their mean squared paired SE (floored at 0). verdicts: the
    pairs' pair_verdict records without noise."""
    out = {}
    for m in MATCHINGS:
        recs = [v[f"at_{m}"] for v in verdicts if v[f"at_{m}"]["verdict"] != "out of range"]
        d = np.array([r["diff"] for r in recs])
        se2 = np.array([r["se"] ** 2 for r in recs])
        out[m] = float(math.sqrt(max(0.0, np.var(d, ddof=1) - se2.mean()))) if len(d) > 1 else None
    return out


def rate(words):
    """(how many say a word: beyond, inside, mixed or degenerate; how many there are). Out of range is no
    word (the control's curve does not reach the arm's point): counted among the pairs, never as a false
    positive, and listed in the pairs' rows."""
    words = list(words)
    return sum(w not in ("tie", "out of range") for w in words), len(words)


def null_report(pairs):
    """pairs: [(arm sweep, control sweep)], P >= 2. Per pair its differences and words under each rule, the
    training noise, and each rule's false-positive rate (rate())."""
    plain = [pair_verdict(a, c) for a, c in pairs]
    noise = training_noise(plain)
    loo = [pair_verdict(a, c, training_noise(plain[:i] + plain[i + 1:])) for i, (a, c) in enumerate(pairs)]
    with_all = [pair_verdict(a, c, noise) for a, c in pairs]
    rows = [{"diff": {m: v[f"at_{m}"].get("diff") for m in MATCHINGS},
             "se": {m: v[f"at_{m}"].get("se") for m in MATCHINGS},
             "words": {m: v[f"at_{m}"]["verdict"] for m in MATCHINGS},
             "or_1_seed": overall_or(v["at_quality"]["verdict"], v["at_coverage"]["verdict"]),
             "both_1_seed": v["verdict"], "both_noise_loo": lo["verdict"], "both_noise_all": al["verdict"]}
            for v, lo, al in zip(plain, loo, with_all)]
    triples = [fr.verdict([pairs[i][0][1.0] for i in t], [pairs[i][1] for i in t])["verdict"]
               for t in itertools.combinations(range(len(pairs)), 3)] if len(pairs) >= 3 else []
    rates = {"or_1_seed": rate(r["or_1_seed"] for r in rows), "both_1_seed": rate(r["both_1_seed"] for r in rows),
             "both_noise_loo": rate(r["both_noise_loo"] for r in rows),
             "both_noise_all": rate(r["both_noise_all"] for r in rows),
             **{f"{m}_alone_1_seed": rate(r["words"][m] for r in rows) for m in MATCHINGS},
             "both_3_seeds": rate(triples)}
    return {"pairs": rows, "training_noise": noise, "rates": rates, "null_p": null_p([fr.comparison_p(v) for v in loo])}


def upper_bound(n, m, level=0.95):
    """Clopper-Pearson's one-sided `level` upper bound on a rate seen n times in m (issue 76: 0 of 8 bounds a false-
    positive rate at 31 %, 0 of 30 at 9.5 %)."""
    from scipy import stats  # (frontier.quantile: a start need not pay for scipy)
    return 1.0 if n >= m else float(stats.beta.ppf(level, n + 1, m - n))


def null_p(ps):
    """The null pairs' p (one seed, both matchings, training noise from the other pairs): a valid test's are
    uniform on [0, 1]. Their decile counts (the histogram) and the KS test against uniform."""
    from scipy import stats
    ps = [p for p in ps if p is not None]
    if len(ps) < 2:
        return None
    return {"p": ps, "deciles": np.histogram(ps, bins=10, range=(0, 1))[0].tolist(),
            "ks": float(stats.kstest(ps, "uniform").statistic), "ks_p": float(stats.kstest(ps, "uniform").pvalue)}


RULES = (("or_1_seed", "1 seed, the OR of before (8a2b55b): either matching's word"),
         ("quality_alone_1_seed", "1 seed, matched quality alone"),
         ("coverage_alone_1_seed", "1 seed, matched coverage alone"),
         ("both_1_seed", "1 seed, both matchings, evaluation noise only (provisional)"),
         ("both_noise_loo", "1 seed, both matchings + training noise (from the other pairs)"),
         ("both_noise_all", "1 seed, both matchings + training noise (from all pairs)"),
         ("both_3_seeds", "3 seeds pooled, both matchings (C(P, 3) overlapping triples)"))


def rates_table(reports):
    """Markdown: one row per rule, one column per kind of null pair ({kind: null_report})."""
    kinds = list(reports)
    lines = ["| rule | " + " | ".join(f"{k} pairs: a word (not tie)" for k in kinds) + " |",
             "|---|" + "---|" * len(kinds)]
    for key, text in RULES:
        cells = []
        for k in kinds:
            n, m = reports[k]["rates"][key]
            cells.append(f"{n} / {m} ({100 * n / m:.0f} %; 95 % upper bound {100 * upper_bound(n, m):.0f} %)" if m else "-")
        lines.append(f"| {text} | " + " | ".join(cells) + " |")
    lines.append("| training noise SD, matched quality / coverage (nats/token) | " + " | ".join(
        " / ".join("-" if reports[k]["training_noise"][m] is None else f"{reports[k]['training_noise'][m]:.4f}"
                   for m in MATCHINGS) for k in kinds) + " |")
    lines.append("| null p (1 seed, both matchings, noise from the other pairs): KS against uniform; decile counts | "
                 + " | ".join("-" if not reports[k].get("null_p") else
                              f"D {reports[k]['null_p']['ks']:.2f}, p {reports[k]['null_p']['ks_p']:.2f}; "
                              + " ".join(map(str, reports[k]["null_p"]["deciles"])) for k in kinds) + " |")
    return "\n".join(lines)
