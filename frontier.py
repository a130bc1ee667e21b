"""
The quality-diversity frontier over the sampling temperature (Caccia et al., "Language GANs
Falling Short"): GRPO against a detector mostly sharpens a generator, i.e. lowers its effective
temperature, which a plain-MLE model gets for free by sampling at a lower T. So an adversarial
generator is only better if its point lies BEYOND the MLE control's temperature curve.

  sweep             one generator at every T: real-word rate, distinct-2, degenerate share (the
                    same prompts and the same uniforms for every T and every generator:
                    cycle_metrics.generated_blocks with one seed) and val ppl under
                    softmax(logits / T) (one forward pass over val for all T)
  aggregate         sweeps of several seeds -> mean and standard error per T (one sweep: a
                    within-run standard error, see within_run_se)
  interpolate       the control's curve at the temperature T* where its real-word rate equals
                    a point's (linear in T between the bracketing sweep points)
  frontier_verdict  "beyond" / "inside" / "tie" / "out of range", with one sentence
  plot_frontier     real-word rate vs distinct-2 and real-word rate vs val ppl at T, one curve
                    per arm with T labels and error bars, natural text as a star

Curves are {T: {"real_word_rate", "distinct_2", "val_ppl", ...}}; standard errors have the
same shape. A (quality, diversity, ppl) tuple is accepted wherever a point dict is.
"""
import math

import numpy as np

import cycle_metrics as cm

TEMPS = (0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2)
KEYS = ("real_word_rate", "distinct_2", "val_ppl")
# val ppl of one run has no sampling noise we can see from inside it: besides the token-level
# standard error, at least this share of the ppl counts as one SE, so that 2 SE = 0.5 %, the tie
# threshold run_cycles uses (two base-model seeds differed by 0.35 %)
PPL_REL_SE_FLOOR = 0.0025


# ----------------------------------------------------------------------------- sweep

def sweep(model, data, temps=TEMPS, n_samples=256, sample_len=None, seed=0, device="cpu",
          vocab=None, tok=None, eval_batch_size=64, eval_block_size=None, keep_examples=False):
    """The generator's point at every temperature: {T: {real_word_rate, words, distinct_2,
    bigrams, degenerate_share, samples, val_loss, val_ppl, val_tokens, val_nll_sd}}.

    Every T (and every generator swept with the same seed) continues the same n_samples
    one-token prompts with the same uniforms, so differences are the model's and T's, not
    the draw's. vocab/tok default to the corpus' (pass them to reuse across generators);
    keep_examples keeps each point's first decoded samples under "examples"."""
    temps = sorted(float(t) for t in temps)
    L = sample_len or model.config.block_size
    if not 2 <= L <= model.config.block_size:
        raise cm.ProjectError(f"samples of {L} tokens do not fit the block_size {model.config.block_size}",
                              "use a shorter sample length")
    data = cm.as_corpus(data)  # a Corpus or a data directory; opened once for every T
    vocab = cm.train_vocabulary(data) if vocab is None else vocab
    tok = cm.corpus_tokenizer(data) if tok is None else tok
    val = cm.val_tokens(data)
    ppl = cm.val_perplexity_at_temperatures(model, data, device, eval_batch_size, eval_block_size, temps)
    out = {}
    for t in temps:
        rows = cm.generated_blocks(model, val, n_samples, L, seed, device, temperature=t)
        stats = cm.sample_stats(rows, tok, vocab)
        if not keep_examples:
            stats.pop("examples")
        out[t] = {**stats, **ppl[t], "sample_len": L, "seed": seed}
    return out


def _as_point(p):
    return dict(zip(KEYS, p)) if isinstance(p, (tuple, list)) else p


def _binomial_se(p, n):
    # the same clipping as cycle_metrics.binomial_noise: a share of 0 or 1 keeps some uncertainty
    n = max(int(n), 1)
    p = min(max(float(p), 0.5 / n), 1 - 0.5 / n)
    return math.sqrt(p * (1 - p) / n)


def within_run_se(point):
    """Standard errors of one sweep point from its own samples: binomial over words (real-word
    rate), over bigrams (distinct-2, as run_cycles' verdicts) and over samples (degenerate share);
    val ppl by the delta method on the token-level SE of the mean NLL, floored at
    PPL_REL_SE_FLOOR * ppl. Rates treat words / bigrams as independent, so they are optimistic."""
    se = {"real_word_rate": _binomial_se(point["real_word_rate"], point["words"]),
          "distinct_2": _binomial_se(point["distinct_2"], point["bigrams"]),
          "degenerate_share": _binomial_se(point["degenerate_share"], point["samples"])}
    token_se = point["val_nll_sd"] / math.sqrt(max(point["val_tokens"], 1))
    se["val_ppl"] = point["val_ppl"] * max(token_se, PPL_REL_SE_FLOOR)
    return se


def aggregate(sweeps):
    """Several sweeps of one arm (one per seed, same temperatures) -> (mean curve, SE curve,
    how the SE was estimated). Mean +- standard error (sample std / sqrt(n)) across seeds;
    a single sweep gets within_run_se."""
    sweeps = list(sweeps)
    if not sweeps:
        raise ValueError("aggregate needs at least one sweep")
    temps = sorted(sweeps[0])
    if any(sorted(s) != temps for s in sweeps):
        raise ValueError("every sweep must cover the same temperatures")
    if len(sweeps) == 1:
        only = sweeps[0]
        return ({t: dict(only[t]) for t in temps}, {t: within_run_se(only[t]) for t in temps},
                "within-run (binomial over words/bigrams/samples; val ppl token-level, >= 0.25 %)")
    n = len(sweeps)
    keys = [k for k in sweeps[0][temps[0]] if isinstance(sweeps[0][temps[0]][k], (int, float))]
    mean, se = {}, {}
    for t in temps:
        vals = np.array([[s[t][k] for k in keys] for s in sweeps], dtype=np.float64)
        mean[t] = dict(zip(keys, vals.mean(0).tolist()))
        se[t] = dict(zip(keys, (vals.std(0, ddof=1) / math.sqrt(n)).tolist()))
    return mean, se, f"across {n} seeds (mean +- standard error)"


# ----------------------------------------------------------------------------- interpolation

def _brackets(temps, q, target):
    """Adjacent sweep pairs (i, i+1) whose quality brackets target, falling-with-T pairs first."""
    pairs = [i for i in range(len(temps) - 1) if min(q[i], q[i + 1]) <= target <= max(q[i], q[i + 1])]
    return sorted(pairs, key=lambda i: q[i + 1] > q[i])  # stable: rising (unexpected) pairs last


def interpolate(curve, quality, se=None, near_t=1.0, clamp_se=None):
    """The control's curve where its real-word rate equals `quality`.

    Returns {"t_star", "crossings", "clamped", "point": {key: value}, "se": {key: se},
    "slope": d value / d quality at T* per key} or None when `quality` is outside the control's
    range. Linear in T between the two bracketing sweep points; with several crossings (a curve
    that is not monotone in T, e.g. sampling noise on a flat stretch) the falling-with-T pair is
    preferred, then the T* nearest `near_t` (the point's own temperature).

    No extrapolation: a quality beyond the control's end points by at most clamp_se (the
    caller's 2 SE of the difference) is matched to that end point (T* clamped to the end of the
    sweep, `clamped` True); further out the answer is None ("out of range").
    The SE at T* is (1-w) se_lo + w se_hi: the two sweep points share prompts and uniforms, so
    they are positively correlated and this upper bound is the honest choice."""
    temps = sorted(curve)
    pts = [_as_point(curve[t]) for t in temps]
    ses = [_as_point(se[t]) if se else {k: 0.0 for k in KEYS} for t in temps]
    q = [p["real_word_rate"] for p in pts]
    pairs = _brackets(temps, q, quality)
    clamped = False
    if not pairs:
        lo, hi = min(q), max(q)
        gap = lo - quality if quality < lo else quality - hi
        if clamp_se is None or gap > clamp_se:
            return None
        clamped = True
        i = int(np.argmin(q) if quality < lo else np.argmax(q))
        cands = [(temps[i], i, i, 0.0)]
    else:
        cands = []
        for i in pairs:
            dq = q[i + 1] - q[i]
            w = 0.5 if dq == 0 else (quality - q[i]) / dq
            cands.append((temps[i] + w * (temps[i + 1] - temps[i]), i, i + 1, w))
        falling = [c for c in cands if q[c[2]] <= q[c[1]]]
        cands = sorted(falling or cands, key=lambda c: abs(c[0] - near_t))
    t_star, i, j, w = cands[0]
    point = {k: (1 - w) * pts[i][k] + w * pts[j][k] for k in KEYS}
    point_se = {k: (1 - w) * ses[i][k] + w * ses[j][k] for k in KEYS}
    dq = q[j] - q[i]
    slope = {k: (pts[j][k] - pts[i][k]) / dq if dq else 0.0 for k in KEYS}
    return {"t_star": t_star, "crossings": len(pairs), "clamped": clamped, "point": point, "se": point_se,
            "slope": slope}


# ----------------------------------------------------------------------------- verdict

def _combined_2se(key, point_se, match):
    """2 SE of (point - control at T*) on `key`: both SEs, plus the shift of T* that the noise
    of both real-word rates causes (delta method through d key / d quality at T*)."""
    q_var = point_se["real_word_rate"] ** 2 + match["se"]["real_word_rate"] ** 2
    var = point_se[key] ** 2 + match["se"][key] ** 2 + match["slope"][key] ** 2 * q_var
    return 2.0 * math.sqrt(var)


def frontier_verdict(point, point_se, control_curve, control_se, point_t=1.0, arm="the adversarial arm",
                     se_kind="within-run"):
    """Is `point` (one generator at one temperature) beyond, inside or on the control's
    temperature frontier? Compared with the control at T*, where its real-word rate equals the
    point's (interpolate):

      beyond        distinct-2 higher by more than 2 SE and val ppl not worse by more than 2 SE
      inside        distinct-2 lower or val ppl worse, by more than 2 SE
      tie           neither (the sentence states the noise)
      out of range  the point's real-word rate is outside the control's sweep by more than
                    2 SE: no T* without extrapolating, so no verdict

    Returns {"verdict", "sentence", "t_star", "control": {...}, "d2_diff", "d2_2se", "ppl_diff",
    "ppl_2se", "se_kind"}; diffs are point - control."""
    point, point_se = _as_point(point), _as_point(point_se)
    q = point["real_word_rate"]
    q_2se = 2.0 * math.sqrt(point_se["real_word_rate"] ** 2 +
                            max(_as_point(s)["real_word_rate"] for s in control_se.values()) ** 2)
    match = interpolate(control_curve, q, control_se, near_t=point_t, clamp_se=q_2se)
    if match is None:
        qs = [_as_point(p)["real_word_rate"] for p in control_curve.values()]
        temps = sorted(control_curve)
        return {"verdict": "out of range", "t_star": None, "se_kind": se_kind,
                "sentence": f"{arm}'s real-word rate {q:.3f} is outside the control's range "
                            f"{min(qs):.3f}-{max(qs):.3f} over T = {temps[0]:g}-{temps[-1]:g} by more than "
                            f"2 SE ({q_2se:.3f}): no equal-quality control point without extrapolating; "
                            "sweep the control over a wider temperature range"}
    c = match["point"]
    d2_diff, ppl_diff = point["distinct_2"] - c["distinct_2"], point["val_ppl"] - c["val_ppl"]
    d2_2se, ppl_2se = _combined_2se("distinct_2", point_se, match), _combined_2se("val_ppl", point_se, match)
    lower_d2, worse_ppl = d2_diff < -d2_2se, ppl_diff > ppl_2se
    if lower_d2 or worse_ppl:
        label = "inside"
        why = ([f"{-d2_diff:.3f} distinct-2 (2 SE = {d2_2se:.3f})"] if lower_d2 else []) + \
              ([f"{ppl_diff:.2f} val ppl (2 SE = {ppl_2se:.2f})"] if worse_ppl else [])
        tail = f"{arm} is inside the MLE frontier by " + " and ".join(why)
    elif d2_diff > d2_2se:
        label = "beyond"
        tail = (f"{arm} is beyond the MLE frontier by {d2_diff:.3f} distinct-2 (2 SE = {d2_2se:.3f}), "
                f"val ppl within {ppl_2se:.2f} (2 SE) or better")
    else:
        label = "tie"
        tail = (f"{arm} is on the MLE frontier within the noise: distinct-2 differs by {d2_diff:+.3f} "
                f"(2 SE = {d2_2se:.3f}), val ppl by {ppl_diff:+.2f} (2 SE = {ppl_2se:.2f})")
    where = (f"at the end of the control's sweep (T* = {match['t_star']:.2f}, clamped: the real-word rate "
             f"is past the sweep by less than 2 SE)" if match["clamped"] else
             f"at the control's temperature with the same real-word rate (T* = {match['t_star']:.2f}"
             + (f", one of {match['crossings']} crossings of a non-monotone curve" if match["crossings"] > 1 else "")
             + ")")
    sentence = (f"{where}, the control has distinct-2 {c['distinct_2']:.3f} vs {point['distinct_2']:.3f} and "
                f"val ppl {c['val_ppl']:.2f} vs {point['val_ppl']:.2f}: {tail} [SE {se_kind}]")
    return {"verdict": label, "sentence": sentence, "t_star": match["t_star"], "control": c,
            "clamped": match["clamped"], "crossings": match["crossings"], "d2_diff": d2_diff, "d2_2se": d2_2se,
            "ppl_diff": ppl_diff, "ppl_2se": ppl_2se, "se_kind": se_kind}


# ----------------------------------------------------------------------------- plot

def plot_frontier(arms, path, natural=None, title="quality-diversity frontier over the sampling temperature"):
    """Two panels, one curve per arm through its temperatures (each point labelled with T,
    error bars = 1 SE both ways): real-word rate (x) vs distinct-2 (y), up-right is better; and
    real-word rate (x) vs val ppl at T (y), down-right is better. `arms`: {name: (curve, se)}
    (se may be None; a curve of one temperature is drawn as one point); `natural`: the natural
    text's sample_stats, drawn as a star on the first panel (natural text has no ppl)."""
    import plots  # sets the Agg backend
    plt = plots.plt
    fig, axes = plt.subplots(1, 2, figsize=(12, 5), layout="constrained")
    for (name, (curve, se)), color in zip(arms.items(), plt.rcParams["axes.prop_cycle"].by_key()["color"]):
        temps = sorted(curve)
        pts = [_as_point(curve[t]) for t in temps]
        ses = [_as_point(se[t]) if se else {k: 0.0 for k in KEYS} for t in temps]
        x = [p["real_word_rate"] for p in pts]
        xerr = [s["real_word_rate"] for s in ses]
        for ax, key in zip(axes, ("distinct_2", "val_ppl")):
            y = [p[key] for p in pts]
            ax.errorbar(x, y, xerr=xerr, yerr=[s[key] for s in ses], fmt="o-", color=color, ms=4,
                        capsize=2, lw=1.2, label=name)
            for t, xi, yi in zip(temps, x, y):
                ax.annotate(f"T={t:g}", (xi, yi), textcoords="offset points", xytext=(4, 4), fontsize=7,
                            color=color)
    if natural is not None:
        axes[0].plot([natural["real_word_rate"]], [natural["distinct_2"]], "*", color="k", ms=14,
                     label="natural val text")
    axes[0].set(xlabel="real-word rate (quality, higher is better)",
                ylabel="distinct-2 (diversity, higher is better)", title="better: up and right")
    axes[1].set(xlabel="real-word rate (quality, higher is better)",
                ylabel="val perplexity at T (lower is better)", title="better: down and right")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    plots._save(fig, path)
    return path
