"""
What a comparison could have said: its intervals, its minimum detectable effect, an equivalence test against a
margin, and the seeds a margin needs (issue 76). The frontier's verdicts (experiment/frontier.py) give each matching a
difference (arm minus control, nats/token, negative = the arm better), its SE and its degrees of freedom (S - 1 over
S seeds; None within one run: the normal law); these turn them into words a reader can bet on:

  beyond        the 95 % interval lies below 0 (the arm better)
  inside        the 95 % interval lies above 0 (the control better)
  equivalent    the 90 % interval lies inside (-delta, +delta): two one-sided tests at 5 % (TOST)
  inconclusive  anything else: the test could not tell, said as such (never "tie")

frontier.overall joins the two matchings' words (a direction needs both; equivalence is matched quality's).

The interpolation error of a matched T* widens every interval, as it widens the verdict's threshold.
"""
import math

# the minimum detectable effect's power and level: a true difference this large is called beyond or inside
# (two-sided 5 %) four times in five
POWER, ALPHA = 0.8, 0.05


def t_quantile(p, df):
    """Student's t quantile at df degrees of freedom; the normal's where df is None (one run's paired items)."""
    from scipy import special  # scipy.stats' own kernels, without its 1.5 s import (every run_cycles start paid it)
    return float(special.ndtri(p) if df is None else special.stdtrit(df, p))


def interval(diff, se, df, interp=0.0, level=0.95):
    """The two-sided `level` interval of a difference: diff -+ t((1 + level) / 2, df) x SE, widened by interp."""
    half = t_quantile(0.5 + level / 2, df) * se + interp
    return (diff - half, diff + half)


def mde(se, df, interp=0.0, alpha=ALPHA, power=POWER):
    """The smallest true difference a two-sided test at alpha finds with the given power: (t(1 - alpha/2) +
    t(power)) x SE, plus interp."""
    return (t_quantile(1 - alpha / 2, df) + t_quantile(power, df)) * se + interp


def equivalent(diff, se, df, delta, interp=0.0):
    """TOST at 5 %: the 90 % interval inside (-delta, +delta)."""
    lo, hi = interval(diff, se, df, interp, 0.90)
    return delta is not None and -delta < lo and hi < delta


def word(diff, se, df, interp=0.0, delta=None):
    """One matching's word under a margin (this module's doc); without one, never "equivalent"."""
    lo, hi = interval(diff, se, df, interp, 0.95)
    if hi < 0:
        return "beyond"
    if lo > 0:
        return "inside"
    return "equivalent" if equivalent(diff, se, df, delta, interp) else "inconclusive"


def seeds_needed(between_sd, within_se, target, interp=0.0, most=200):
    """The fewest seeds (>= 2) whose minimum detectable effect is at most target, with between_sd the SD of a
    per-seed difference and within_se each seed's own paired SE (frontier.pooled's law); None past `most`."""
    if target is None or target <= interp:
        return None
    for s in range(2, most + 1):
        if mde(math.sqrt(between_sd ** 2 / s + within_se ** 2), s - 1, interp) <= target:
            return s
    return None


def unreachable_floor(c):
    """Why no seed count reaches comparison c's margin, where that is so: the MDE of the evaluation's own noise (its
    within_se and interp_err), which every seed shares (all are scored on the same items, paired), when it lies at or
    past the margin; else None (and for an older record without within_se)."""
    floor = mde(c["within_se"], None, c["interp_err"]) if "within_se" in c else None
    return floor if floor is not None and floor >= c["delta"] else None


def margin_from(positive, fraction=0.25):
    """The equivalence margin of a row from its more-data control's verdict against MLE at its limit (a
    frontier.verdict record): `fraction` of what doubling the data bought MLE, per matching ({"quality": delta,
    "coverage": delta}; a matching out of range or gaining nothing: None)."""
    out = {}
    for m in ("quality", "coverage"):
        c = positive[f"at_{m}"]
        out[m] = fraction * -c["diff"] if c.get("diff") is not None and c["diff"] < 0 else None
    return out


def detector_check(aurocs):
    """Whether the detector an arm was rewarded by knew anything (issue 78): its val AUROC (natural against the
    generator's samples), the mean over seeds with its 95 % interval (over S > 1 seeds the t interval of their spread,
    over one its own SE). Failed unless that interval lies above 0.5 (chance): a detector at or below chance rewards
    nothing the verdict can blame on the method, so its arm's word does not count. aurocs: [(auroc, se)] per seed."""
    vals = [a for a, _ in aurocs]
    s, m = len(vals), sum(vals) / len(vals)
    if s > 1:
        se, df = math.sqrt(sum((v - m) ** 2 for v in vals) / (s - 1) / s), s - 1
    else:
        se, df = aurocs[0][1] or 0.0, None
    lo, hi = interval(m, se, df)
    return {"auroc": m, "ci95": [lo, hi], "seeds": s, "failed": not lo > 0.5}
