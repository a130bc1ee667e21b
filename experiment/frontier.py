"""
The quality-coverage frontier over the sampling temperature (Caccia et al., "Language GANs Falling
Short"). GRPO against a detector mostly sharpens a generator, which a plain-MLE model gets for free
by sampling at a lower T; so an arm is only better if it lies BEYOND an MLE control's temperature
curve. Two axes that do not saturate, both lower-is-better, in nats per token:

  quality   judge NLL: the mean per-token NLL of a generator's samples under an independent judge
            (a language model of the train split that no arm trains on, starts from or is rewarded
            by); per-sample values are the paired items
  coverage  val NLL at T: the val split scored under softmax(logits / T) (val ppl = exp); the items
            are VAL_ITEMS contiguous groups of val windows

  sweep     one generator at every T (the same prompts and uniforms for every T and generator)
  locate    where a control's curve takes a value: T* by quadratic (3-point Lagrange) interpolation
            in log T between the bracketing sweep points, as weights over the grid, plus the chord
            (linear in log T) whose disagreement is the stated interpolation error
  paired    one seed: the arm's point minus the control at the matched T*, with the standard error
            of per-item differences (same prompts, noise and val windows), plus the shift of T*
            that the matching axis' own paired noise causes (delta method)
  verdict   over seeds: mean difference, SE = sqrt(between-seed var / S + mean within-run var),
            threshold t(0.975, S-1) * SE + interpolation error; one seed: 2 SE, the SE widened by the
            training noise the A/A test measured for the preset (aa_test.py), else the verdict is
            provisional (evaluation noise alone); at matched quality AND at matched coverage
  the rule  overall(): a word needs both matchings to agree (beyond / inside / tie), mixed where one
            says beyond and the other inside, degenerate where a win rides on samples more often
            degenerate (repeated text) than the control's at T*, past binomial noise (a judge scores
            repetition as likely: an H100 run's GRPO arm won by 0.44 nats with 90 % degenerate
            samples against the control's 0 %); one matching in range: its word alone; else tie.
            Over a run's many comparisons, holm() keeps a word only where Holm's step-down at 5 %
            over all of them rejects that comparison's null (its p: the larger of its matchings')
  plot_frontier   judge NLL vs val ppl at T per arm, and the descriptive real-word rate vs distinct-2

Curves are {T: point}; a point holds judge_nll, judge_items, val_loss, val_items, val_ppl and the
descriptive real_word_rate / distinct_2 / degenerate_share.
"""
import math

import numpy as np

from core import plots
from experiment import measures as cm, power

TEMPS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.4, 1.7, 2.0)
VAL_ITEMS = 128  # groups of val windows: the paired items of the coverage axis
AXES = {"quality": ("judge_nll", "judge_items", "judge NLL"), "coverage": ("val_loss", "val_items", "val NLL")}
AXES_ITEMS = {key: items for key, items, _ in AXES.values()}  # an axis' value -> its paired items


# ----------------------------------------------------------------------------- sweep

def eval_fields(curve):
    """An eval record's sweep fields (Run.sweep's, compare.py's): the T = 1 point, the temperatures and the frontier
    (each T's point without its example texts)."""
    return {**curve[1.0], "temps": sorted(curve),
            "frontier": {f"{t:g}": {k: v for k, v in row.items() if k != "examples"} for t, row in curve.items()}}


def sweep(model, data, temps=TEMPS, n_samples=256, sample_len=None, seed=0, device="cpu", vocab=None, tok=None,
          eval_batch_size=64, eval_block_size=None, keep_examples=False, judge=None, rows=None):
    """The generator's point at every temperature: {T: {real_word_rate, words, distinct_2, bigrams,
    degenerate_share, samples, val_loss, val_ppl, val_tokens, val_nll_sd, val_items, judge_nll,
    judge_items}} (judge_*: only with a judge model). Every T, and every generator swept with the same
    seed, continues the same n_samples one-token prompts with the same uniforms. rows: a dict that
    receives each T's samples, {T: measures.generated_blocks(model, val, n_samples, L, seed, T)}."""
    temps = sorted(float(t) for t in temps)
    L = sample_len or model.config.block_size
    if not 2 <= L <= model.config.block_size:
        raise cm.ProjectError(f"samples of {L} tokens do not fit the block_size {model.config.block_size}",
                              "use a shorter sample length")
    data = cm.as_corpus(data)  # a Corpus or a data directory; opened once for every T
    vocab = cm.train_vocabulary(data) if vocab is None else vocab
    tok = cm.corpus_tokenizer(data) if tok is None else tok
    val = cm.val_tokens(data)
    ppl = cm.val_perplexity_at_temperatures(model, data, device, eval_batch_size, eval_block_size, temps,
                                            items=VAL_ITEMS)
    out = {}
    for t in temps:
        blocks = cm.generated_blocks(model, val, n_samples, L, seed, device, temperature=t)
        if rows is not None:
            rows[t] = blocks
        stats = cm.sample_stats(blocks, tok, vocab)
        if not keep_examples:
            stats.pop("examples")
        if judge is not None:
            items = cm.judge_nll(judge, blocks, device)
            stats.update(judge_nll=float(items.mean()), judge_items=items.tolist())
        out[t] = {**stats, **ppl[t], "sample_len": L, "seed": seed}
    return out


# ----------------------------------------------------------------------------- interpolation

def _lagrange(lt, idx, x):
    """Weights over the grid of the Lagrange polynomial through the points idx, at log T = x."""
    w = np.zeros(len(lt))
    pts = [float(lt[a]) for a in idx]  # plain floats: a bisection calls this ~60 times per match
    for j, a in enumerate(idx):
        p = 1.0
        for k, b in enumerate(pts):
            if k != j:
                p *= (x - b) / (pts[j] - b)
        w[a] = p
    return w


def _weights(lt, i, x, quadratic=True):
    """A curve's value at log T = x in [lt[i], lt[i+1]] as weights over the grid: the chord, or the
    parabola through the bracket and its nearer neighbour."""
    if not quadratic or len(lt) < 3:
        return _lagrange(lt, (i, i + 1), x)
    k = i if i == 0 or (i + 2 < len(lt) and lt[i + 2] - x < x - lt[i - 1]) else i - 1
    return _lagrange(lt, (k, k + 1, k + 2), x)


def _solve(lt, v, i, target, quadratic):
    """log T in [lt[i], lt[i+1]] where the interpolated curve v equals target (bisection; the ends
    are the grid values, which bracket the target)."""
    lo, hi = lt[i], lt[i + 1]
    f_lo = v[i] - target
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        f = float(_weights(lt, i, mid, quadratic) @ v) - target
        if (f <= 0) == (f_lo <= 0):
            lo, f_lo = mid, f
        else:
            hi = mid
    return 0.5 * (lo + hi)


def locate(curve, key, target, near_t=1.0, upto=None):
    """Where the control's curve[key] equals target: {"t_star", "w" (grid weights), "w_lin" (the
    chord's)} or None when target is outside the
    curve's range. upto: only the grid points up to this index (a branch of a curve that is not
    monotone). Of several crossings, the one nearest near_t."""
    temps = sorted(curve)[:None if upto is None else upto + 1]
    lt = np.log(temps)
    v = np.array([curve[t][key] for t in temps])
    pairs = [i for i in range(len(temps) - 1) if min(v[i], v[i + 1]) <= target <= max(v[i], v[i + 1])]
    if not pairs:
        return None
    sols = [(i, _solve(lt, v, i, target, True)) for i in pairs]
    i, x = min(sols, key=lambda s: abs(s[1] - math.log(near_t)))
    full = len(curve)
    pad = lambda w: np.concatenate([w, np.zeros(full - len(w))])  # noqa: E731
    x_lin = _solve(lt, v, i, target, False)
    return {"t_star": float(math.exp(x)), "w": pad(_weights(lt, i, x)), "w_lin": pad(_weights(lt, i, x_lin, False))}


# ----------------------------------------------------------------------------- paired differences

def _grid(curve, name):
    temps = sorted(curve)
    return (np.array([curve[t][name] for t in temps], dtype=np.float64),
            np.array([curve[t][AXES_ITEMS[name]] for t in temps], dtype=np.float64))



def _se(d):
    return float(np.std(d, ddof=1) / math.sqrt(len(d))) if len(d) > 1 else 0.0


def _weights_at(curve, key, target, near_t, upto):
    """locate()'s weights, or past the curve's range those of its nearest end (within the branch)."""
    loc = locate(curve, key, target, near_t, upto)
    if loc is not None:
        return loc["w"]
    temps = sorted(curve)[:None if upto is None else upto + 1]
    i = int(np.argmin([abs(curve[t][key] - target) for t in temps]))
    return np.eye(len(curve))[i]


def paired(point, curve, match, near_t=1.0, q=2.0):
    """One seed: the arm's `point` against the control `curve` at the T* where the control's
    `match` axis ("quality" or "coverage") equals the point's; the other axis compared.

    Matched coverage uses the curve's low-T branch (T at or below its best val NLL), where quality
    is best; a point whose coverage is better than the control's at every T is compared on coverage
    at that best T ("past": True). The SE combines the paired SE of the compared axis with how far
    the control's compared value moves when the matched value moves by q of its own paired SEs,
    divided by q: a secant at the scale of the verdict's threshold (q, the quantile it uses), not a
    tangent, since near the best val NLL the curve is flat and a tangent understates it. Returns {"t_star", "diff" (point - control, negative = the arm is
    better), "se", "interp_err", "control", "past", "axis"} or None (out of the control's range)."""
    m_key, c_key = AXES[match][0], AXES["coverage" if match == "quality" else "quality"][0]
    upto = int(np.argmin([curve[t]["val_loss"] for t in sorted(curve)])) if match == "coverage" else None
    loc = locate(curve, m_key, point[m_key], near_t, upto)
    mv, mi = _grid(curve, m_key)
    cv, ci = _grid(curve, c_key)
    se_m = None
    if loc is None and match == "coverage" and point[m_key] < mv[upto]:
        w = np.eye(len(curve))[upto]
        se_m = _se(np.asarray(point[AXES_ITEMS[m_key]]) - w @ mi)
        return {"t_star": sorted(curve)[upto], "diff": float(point[m_key] - w @ mv), "se": se_m, "interp_err": 0.0,
                "past": True, "axis": m_key, "control": {k: float(w @ _grid(curve, k)[0]) for k in ("judge_nll", "val_loss")},
                "degenerate": _degenerate(point, curve, w)}
    if loc is None:
        return None
    w = loc["w"]
    se_c = _se(np.asarray(point[AXES_ITEMS[c_key]]) - w @ ci)
    se_m = _se(np.asarray(point[AXES_ITEMS[m_key]]) - w @ mi)
    shift = max(abs((_weights_at(curve, m_key, point[m_key] + d, near_t, upto) - w) @ cv) for d in (-q * se_m, q * se_m))
    return {"t_star": loc["t_star"], "diff": float(point[c_key] - w @ cv), "se": math.sqrt(se_c ** 2 + (shift / q) ** 2),
            "interp_err": float(abs((w - loc["w_lin"]) @ cv)), "past": False, "axis": c_key,
            "control": {k: float(w @ _grid(curve, k)[0]) for k in ("judge_nll", "val_loss")},
            "degenerate": _degenerate(point, curve, w)}


def _degenerate(point, curve, w):
    """The degenerate share of the arm's samples and of the control's at T* (the matching weights, clipped to
    a share), with their sample counts; None where the points do not carry it."""
    temps = sorted(curve)
    if "degenerate_share" not in point or any("degenerate_share" not in curve[t] for t in temps):
        return None
    ctl = float(np.clip(w @ np.array([curve[t]["degenerate_share"] for t in temps]), 0.0, 1.0))
    return {"arm": float(point["degenerate_share"]), "control": ctl, "n_arm": int(point.get("samples", 1)),
            "n_control": int(min(curve[t].get("samples", 1) for t in temps))}


def quantile(seeds):
    """The verdict's multiplier of the SE: 2 within one run, Student's t(0.975, S-1) over S seeds."""
    if seeds == 1:
        return 2.0
    return power.t_quantile(0.975, seeds - 1)


def pooled(diffs, ses):
    """Mean of per-seed differences and its SE: sqrt(between-seed variance / S + mean within-run
    variance) over S seeds, the run's own paired SE for one seed."""
    d, w = np.asarray(diffs, dtype=np.float64), np.asarray(ses, dtype=np.float64)
    if len(d) == 1:
        return float(d[0]), float(w[0])
    return float(d.mean()), math.sqrt(np.var(d, ddof=1) / len(d) + float(np.mean(w ** 2)))


def combine(results, train_noise=None):
    """Per-seed paired results -> mean difference, its SE and the verdict threshold (see the module
    doc). train_noise: with one seed, the SD of a difference between two trainings that differ only in
    their seeds (the A/A test's, for this matching and kind of control), added to the SE in quadrature;
    without it a one-seed record is provisional. None when any seed is out of range."""
    if not results or any(r is None for r in results):
        return None
    d = np.array([r["diff"] for r in results])
    S = len(results)
    q = quantile(S)
    mean, se = pooled(d, [r["se"] for r in results])
    provisional = S == 1 and train_noise is None
    if S > 1:
        how = f"t(0.975, {S - 1}) x SE over {S} seeds (between-seed + within-run)"
    elif provisional:
        how = "2 paired SE within the run (1 seed, provisional: evaluation noise only)"
    else:
        se = math.sqrt(se ** 2 + train_noise ** 2)
        how = f"2 x SE within the run, with the A/A test's training noise {train_noise:.4f} (1 seed)"
    interp = float(np.mean([r["interp_err"] for r in results]))
    degen = [r.get("degenerate") for r in results]
    degen = None if any(d is None for d in degen) else {
        "arm": float(np.mean([d["arm"] for d in degen])), "control": float(np.mean([d["control"] for d in degen])),
        "n_arm": sum(d["n_arm"] for d in degen), "n_control": sum(d["n_control"] for d in degen)}
    df = S - 1 if S > 1 else None  # one run: its paired items' normal law
    w = np.array([r["se"] for r in results])
    spread = {"between_sd": float(np.std(d, ddof=1)) if S > 1 else 0.0, "within_se": float(np.sqrt(np.mean(w ** 2)))}
    return {"degenerate": degen, "diff": mean, "se": se, "threshold": q * se + interp, "interp_err": interp, "noise": how,
            "df": df, "ci95": power.interval(mean, se, df, interp, 0.95), "ci90": power.interval(mean, se, df, interp, 0.90),
            "mde": power.mde(se, df, interp), **spread,
            "seeds": S, "provisional": provisional, "p": p_value(mean, se, interp, S),
            "t_star": float(np.mean([r["t_star"] for r in results])), "past": any(r["past"] for r in results),
            "axis": results[0]["axis"], "per_seed": d.tolist(),
            "control": {k: float(np.mean([r["control"][k] for r in results])) for k in ("judge_nll", "val_loss")}}


def p_value(diff, se, interp, seeds):
    """Two-sided p of a difference past its interpolation error, in units of its SE: normal within one run,
    Student's t(S - 1) over S seeds (the laws of quantile(): p < 0.05 about where the matching's word is not
    tie; exactly there over seeds, at 1.96 rather than 2 SE within one run)."""
    from scipy import special  # (power.t_quantile): the upper tails of the normal and of Student's t
    z = max(abs(diff) - interp, 0.0) / se if se > 0 else (math.inf if abs(diff) > interp + ROUNDING else 0.0)
    return float(2 * (special.ndtr(-z) if seeds == 1 else special.stdtr(seeds - 1, -z)))


def more_degenerate(d):
    """Whether the arm's samples are degenerate more often than the control's at T*, past 2 binomial SE."""
    return d is not None and d["arm"] - d["control"] > cm.binomial_noise(d["arm"], d["n_arm"], d["control"],
                                                                         d["n_control"])


# nats/token: a difference this small is float rounding (an arm against itself, interpolated), never a verdict;
# with one seed the threshold can be as small (2 x a paired SE of ~1e-16)
ROUNDING = 1e-9


def _label(c, delta=None, margin=False):
    """One matching's word: under a margin (margin=True; delta that matching's, None where unknown) power.word's,
    a win on degenerate samples named so; else the threshold's beyond / inside / tie."""
    if c is None:
        return "out of range"
    if margin:
        w = power.word(c["diff"], c["se"], c["df"], c["interp_err"], delta)
        return "degenerate" if w == "beyond" and more_degenerate(c.get("degenerate")) else w
    threshold = c["threshold"] + ROUNDING
    if c["diff"] < -threshold:
        return "degenerate" if more_degenerate(c.get("degenerate")) else "beyond"
    return "inside" if c["diff"] > threshold else "tie"


def overall(at_quality, at_coverage, margin=False):
    """One word from the two matched verdicts, by the rule the A/A test measured (docs/design.md section 4):
    beyond, inside or tie where both matchings say it; mixed where one says beyond and the other inside;
    degenerate where a win at either rides on degenerate samples (never counted as beyond); a matching out of
    range gives no evidence, so the other's word stands alone; any other pair (one word beside a tie) is a tie:
    a word needs both matchings (an OR of the two said something at about twice the rate of either).
    margin: power's words, where "inconclusive" takes tie's place and equivalence is matched quality's where
    matched coverage claims no direction (near its best val NLL a control's curve is flat, so matched coverage
    places T* loosely and its judge-NLL interval is rarely narrow enough for any margin)."""
    labels = [w for w in (at_quality, at_coverage) if w != "out of range"]
    if not labels:
        return "out of range"
    if "degenerate" in labels:
        return "degenerate"
    if {"beyond", "inside"} <= set(labels):
        return "mixed"
    if len(set(labels)) == 1:
        return labels[0]
    if not margin:
        return "tie"
    no_direction = at_coverage in ("equivalent", "inconclusive", "out of range")
    return "equivalent" if at_quality == "equivalent" and no_direction else "inconclusive"


def comparison_p(v):
    """The p of one comparison's word (a verdict() record): a word needs both matchings, so the larger of
    their p (an intersection-union test); one matching in range: its p; none: 1."""
    ps = [v[m]["p"] for m in ("at_quality", "at_coverage") if v[m]["verdict"] != "out of range"]
    return max(ps) if ps else 1.0


def holm(ps, alpha=0.05):
    """Holm's step-down over m p-values: whether each null is rejected at family-wise level alpha (the
    smallest p against alpha / m, the next against alpha / (m - 1), ..., stopping at the first kept)."""
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    out = [False] * len(ps)
    for k, i in enumerate(order):
        if ps[i] > alpha / (len(ps) - k):
            break
        out[i] = True
    return out


def verdict(points, curves, arm="the arm", control="the control", point_t=1.0, train_noise=None, margin=None):
    """Is an arm's point (one per seed, each paired with its seed's control curve) beyond, inside or
    on the control's frontier? train_noise: {"quality", "coverage"}: the one-seed training noise of each
    matching (combine). margin: {"quality": delta, "coverage": delta} (a value may be None): the words of
    experiment/power.py (beyond, inside, equivalent, inconclusive) in place of the threshold's. {"verdict",
    "at_quality", "at_coverage" (each combine()'s record plus "verdict", and "delta" under a margin), "sentence"}."""
    rec = {}
    for match in ("quality", "coverage"):
        c = combine([paired(p, cv, match, point_t, quantile(len(points))) for p, cv in zip(points, curves)],
                    (train_noise or {}).get(match))
        delta = (margin or {}).get(match)
        rec[f"at_{match}"] = {**(c or {}), "verdict": _label(c, delta, margin is not None),
                              **({"delta": delta, "seeds_for_margin": _seeds_for(c, delta)} if margin is not None
                                 else {})}
    word = overall(rec["at_quality"]["verdict"], rec["at_coverage"]["verdict"], margin is not None)
    return {"verdict": word, **rec, "sentence": _sentence(word, rec, points, curves, arm, control)}


def _seeds_for(c, delta):
    """The seeds whose minimum detectable effect reaches the margin, from this run's spreads (power.seeds_needed;
    the pre-registration states them before more seeds run); None with one seed, no margin, or where no count up to
    200 reaches it (_reach says which)."""
    if c is None or delta is None or c["seeds"] < 2:
        return None
    return power.seeds_needed(c["between_sd"], c["within_se"], delta, c["interp_err"])


def _sentence(word, rec, points, curves, arm, control):
    parts = []
    for match, other in (("quality", "coverage"), ("coverage", "quality")):
        c = rec[f"at_{match}"]
        if c["verdict"] == "out of range":
            temps = sorted(curves[0])
            if match == "coverage":  # matched on the low-T branch only (paired)
                temps = temps[:int(np.argmin([curves[0][t]["val_loss"] for t in temps])) + 1]
            rng = [curves[0][t][AXES[match][0]] for t in temps]
            parts.append(f"at matched {match}: out of range (the arm's {AXES[match][2]} "
                         f"{np.mean([p[AXES[match][0]] for p in points]):.3f} is outside {control}'s "
                         f"{min(rng):.3f}-{max(rng):.3f} over T = {temps[0]:g}-{temps[-1]:g}"
                         + (", its branch at or below its best val NLL" if match == "coverage" else "") + ")")
            continue
        where = (f"past {control}'s best coverage (T = {c['t_star']:.2f})" if c["past"] else
                 f"{control} at T* = {c['t_star']:.2f}")
        how = (f"95 % interval {c['ci95'][0]:+.4f} to {c['ci95'][1]:+.4f}, minimum detectable effect {c['mde']:.4f}, "
               + (f"margin +-{c['delta']:.4f}{_reach(c)};" if c["delta"] is not None else "no margin;")
               if "delta" in c else
               f"threshold {c['threshold']:.4f} =")
        parts.append(f"at matched {match}, {where}: {AXES[other if not c['past'] else match][2]} "
                     f"{c['diff']:+.4f} nats/token ({c['verdict']}; {how} {c['noise']} "
                     f"+ interpolation {c['interp_err']:.4f}"
                     + (f"; a win on degenerate samples: {c['degenerate']['arm']:.3f} of the arm's against "
                        f"{c['degenerate']['control']:.3f} of {control}'s at T*" if c["verdict"] == "degenerate" else "")
                     + ")")
    return f"{arm} vs {control}: **{word}**; " + "; ".join(parts)


def _reach(c):
    """Where the minimum detectable effect exceeds the margin: the seeds that would reach it."""
    if c["mde"] <= c["delta"] or c["seeds"] < 2:
        return ""
    n, floor = c.get("seeds_for_margin"), power.unreachable_floor(c)
    if n:
        return f" (reached at {n} seeds)"
    return (f" (out of reach by seeds: the evaluation's own noise floors the MDE at {floor:.4f})" if floor is not None
            else " (out of reach within 200 seeds)")


# ----------------------------------------------------------------------------- plot

def plot_frontier(arms, path, natural=None, title="quality-coverage frontier over the sampling temperature"):
    """Two panels, one curve per arm through its temperatures (its ends and T = 1 labelled): judge NLL (x)
    vs val ppl at T (y), both lower-is-better (down-left is better; the frontier); and the descriptive
    real-word rate vs distinct-2 with natural text as a star. `arms`: {name: curve}. Not redrawn where
    unchanged."""
    same, digest = plots.drawn_from(path, plot_frontier, arms, natural, title)
    if same:
        return path
    plt = plots.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 5.5 + 0.12 * len(arms)), layout="constrained")
    panels = (("judge_nll", "val_ppl"), ("real_word_rate", "distinct_2"))
    for (name, curve), color in zip(arms.items(), plt.rcParams["axes.prop_cycle"].by_key()["color"]):
        temps = sorted(curve)
        for ax, (kx, ky) in zip(axes, panels):
            if any(kx not in curve[t] for t in temps):
                continue
            x, y = [curve[t][kx] for t in temps], [curve[t][ky] for t in temps]
            ax.plot(x, y, "o-", color=color, ms=4, lw=1.2, label=name)
            for t, xi, yi in zip(temps, x, y):  # the ends and T = 1 (every point's label was unreadable, and slow)
                if t in (temps[0], temps[-1], 1.0):
                    ax.annotate(f"T={t:g}", (xi, yi), textcoords="offset points", xytext=(4, 4), fontsize=7,
                                color=color)
    if natural is not None:
        axes[1].plot([natural["real_word_rate"]], [natural["distinct_2"]], "*", color="k", ms=14,
                     label="natural val text")
    axes[0].set(xlabel="judge NLL of the samples (quality, nats/token, lower is better)",
                ylabel="val perplexity at T (coverage, lower is better; log scale)", yscale="log",
                title="the frontier: better is down-left")
    axes[1].set(xlabel="real-word rate (descriptive)", ylabel="distinct-2 (descriptive; natural text: the star)",
                title="descriptive: closer to the star is more like text")
    for ax in axes:
        ax.grid(alpha=0.3)
    # one legend for both panels, below them (nine long arm names in each panel hid its curves); a curve may be
    # drawn in one panel only (the keys it lacks), so it takes the entries of both
    entries = {label: h for ax in axes for h, label in zip(*ax.get_legend_handles_labels())}
    fig.legend(entries.values(), entries.keys(), loc="outside lower center", ncol=2, fontsize=8)
    fig.suptitle(title)
    plots.save_figure(fig, path, digest)
    return path
