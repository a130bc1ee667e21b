"""
PNG plots shared by the training scripts (matplotlib, Agg backend: no display needed).
Every function takes plain lists / arrays and writes one PNG atomically.
"""
import hashlib
import json
import os
import sys

import numpy as np

from core.files import atomic_output

INPUTS_KEY = "inputs-sha256"  # a PNG text chunk: what the figure was drawn from (drawn_from)


def pyplot():
    """pyplot on the Agg backend, imported at the first plot: the import costs about 0.4 s, and most
    processes that import this module (every step of a run) plot at their end, or never."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save_figure(fig, path, inputs=None):
    """Write `fig` as a PNG, atomically; `inputs`: the digest drawn_from gave, kept in the file."""
    plt = pyplot()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with atomic_output(path, "wb") as f:  # every figure lays itself out (constrained)
        fig.savefig(f, format="png", dpi=110, metadata={INPUTS_KEY: inputs} if inputs else None)
    plt.close(fig)


def drawn_from(path, function, *inputs):
    """(up to date, digest): whether the PNG at `path` was drawn from these inputs by this code (the
    source of `function`'s module and of this one), and the digest to save with a new one. A summary's
    figures take seconds each to draw, and a resumed or finished run's rerun writes the same ones again."""
    h = hashlib.sha256()
    for module in {sys.modules[function.__module__], sys.modules[__name__]}:
        with open(module.__file__, "rb") as f:
            h.update(f.read())
    h.update(json.dumps(inputs, sort_keys=True, default=repr).encode())
    digest = h.hexdigest()
    try:
        with open(path, "rb") as f:
            head = f.read(1 << 12)  # text chunks come before the image data
    except OSError:
        return False, digest
    return f"{INPUTS_KEY}\0{digest}".encode() in head, digest


def _series(records, x_key, y_key):
    pts = [(r[x_key], r[y_key]) for r in records
           if r.get(x_key) is not None and isinstance(r.get(y_key), (int, float))]
    return [p[0] for p in pts], [p[1] for p in pts]


def plot_loss_curves(records, path, title="loss", x_key="step", panels=None):
    """One panel per entry of `panels`: (panel title, [(record key, label, style), ...]).

    `records` are metrics.jsonl dicts; a key missing from a record is skipped, so
    train and eval records can be mixed in one list.
    """
    panels = panels or [("loss", [("train_loss", "train", "-"), ("val_loss", "val", "o-")])]
    plt = pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False,
                             layout="constrained")
    for ax, (ptitle, lines) in zip(axes[0], panels):
        for key, label, style in lines:
            xs, ys = _series(records, x_key, key)
            if xs:
                ax.plot(xs, ys, style, label=label, markersize=3)
        ax.set_title(ptitle)
        ax.set_xlabel(x_key)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    fig.suptitle(title)
    save_figure(fig, path)


def plot_calibration(pred, true, path, title="calibration", n_bins=10, max_points=5000, seed=0):
    """Predicted P(natural) vs the true natural fraction K/N, with the diagonal and
    the mean prediction per bin of K/N."""
    pred = np.asarray(pred, dtype=np.float64)
    true = np.asarray(true, dtype=np.float64)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 5), layout="constrained")
    idx = np.arange(len(pred))
    if len(idx) > max_points:
        idx = np.random.default_rng(seed).choice(idx, max_points, replace=False)
    ax.scatter(true[idx], pred[idx], s=4, alpha=0.25, label="val samples")
    edges = np.linspace(0, 1, n_bins + 1)
    which = np.clip(np.digitize(true, edges) - 1, 0, n_bins - 1)
    centers, means = [], []
    for b in range(n_bins):
        sel = which == b
        if sel.any():
            centers.append(true[sel].mean())
            means.append(pred[sel].mean())
    ax.plot(centers, means, "o-", color="C3", label="mean per bin")
    ax.plot([0, 1], [0, 1], "k--", lw=1, label="perfect")
    ax.axhline(0.5, color="gray", lw=1, ls=":", label="constant 0.5")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("true natural fraction K/N")
    ax.set_ylabel("predicted P(natural)")
    ax.set_title(title)
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)
    save_figure(fig, path)


def plot_grpo_curves(records, path, title="GRPO"):
    """Reward (mean and windowed mean), KL to the reference, val loss, and the
    degenerate / clip fractions against the GRPO step."""
    steps = [r for r in records if r.get("kind") == "step"]
    evals = [r for r in records if r.get("kind") == "eval"]
    plt = pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), layout="constrained")
    ax = axes[0][0]
    for key, label, style in (("reward_mean", "mean reward", "-"),
                              ("reward_window", "windowed mean", "-")):
        xs, ys = _series(steps, "step", key)
        if xs:
            ax.plot(xs, ys, style, label=label)
    ax.set_title("reward P(natural)")
    ax = axes[0][1]
    xs, ys = _series(steps, "step", "kl")
    if xs:
        ax.plot(xs, ys, label="k3 KL to reference")
    ax.set_title("KL to reference (per token)")
    ax = axes[1][0]
    xs, ys = _series(evals, "step", "val_loss")
    if xs:
        ax.plot(xs, ys, "o-", label="val loss")
    ax.set_title("held-out val loss of the policy")
    ax = axes[1][1]
    for key, label in (("degenerate_frac", "degenerate completions"),
                       ("clip_frac", "clipped tokens"),
                       ("zero_spread_frac", "groups with no reward spread")):
        xs, ys = _series(steps, "step", key)
        if xs:
            ax.plot(xs, ys, label=label)
    ax.set_title("fractions")
    for ax in axes.flat:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle(title)
    save_figure(fig, path)


def _cycle_series(gens, arm, key):
    """(cycles, values) of one arm's generators; the cycle-0 base generator starts every arm."""
    pts = [(g["cycle"], g[key]) for g in gens
           if g["arm"] in (arm, "base") and isinstance(g.get(key), (int, float))]
    pts.sort()
    return [p[0] for p in pts], [p[1] for p in pts]


ARM_STYLE = {"adversarial": ("C3", "o-"), "control": ("C0", "s--")}


def cycle_summary_figure(gens, reference=None, title="adversarial cycles"):
    """run_cycles' summary figure: one panel per measure against the cycle (integer ticks), and
    the detectors' learning curves. `gens` are summary.json's generator entries, `reference`
    the natural text's statistics. Returns (figure, the axes whose x axis is the cycle)."""
    plt = pyplot()
    from matplotlib.ticker import MaxNLocator
    fig, axes = plt.subplots(3, 3, figsize=(16, 12), layout="constrained")
    panels = [("val perplexity (full val split)", [("val_ppl", "")], None),
              ("real-word rate of samples", [("real_word_rate", "")], "real_word_rate"),
              ("distinct word bigrams (distinct-2)", [("distinct_2", "")], "distinct_2"),
              ("degenerate share of samples", [("degenerate_share", "")], "degenerate_share"),
              ("fresh detector's val MAE (higher = harder to detect)",
               [("det_val_mae", "detector"), ("det_lexicon_mae", "lexicon baseline")], None),
              ("fresh detector's AUROC natural vs generated (0.5 = chance)", [("det_auroc", "")], None)]
    cycle_axes = []
    for ax, (ptitle, keys, ref_key) in zip(axes.flat, panels):
        for arm, (color, style) in ARM_STYLE.items():
            for i, (key, what) in enumerate(keys):
                xs, ys = _cycle_series(gens, arm, key)
                if xs:
                    ax.plot(xs, ys, style if i == 0 else ":", color=color, markersize=4,
                            label=f"{arm} {what}".strip())
        if ptitle.startswith("fresh detector's val MAE"):
            xs, ys = _cycle_series(gens, "adversarial", "det_const_mae")
            if xs:
                ax.plot(xs, ys, "--", color="gray", label="constant 0.5")
        if ptitle.startswith("fresh detector's AUROC"):
            ax.axhline(0.5, color="gray", ls="--", lw=1, label="chance")
        if ref_key and reference and isinstance(reference.get(ref_key), (int, float)):
            ax.axhline(reference[ref_key], color="k", ls="--", lw=1, label="natural val text")
        ax.set_title(ptitle, fontsize=10)
        cycle_axes.append(ax)
    # the adversarial arm's own training signal
    ax = axes[2][0]
    for key, label, style in (("grpo_eval_reward_start", "fixed prompts, start", "o-"),
                              ("grpo_eval_reward_end", "fixed prompts, end", "s-"),
                              ("grpo_reward_start", "training steps, start", "o:"),
                              ("grpo_reward_end", "training steps, end", "s:")):
        xs, ys = _cycle_series(gens, "adversarial", key)
        if xs:
            ax.plot(xs, ys, style, label=label, markersize=4)
    ax.set_title("GRPO reward P(natural) (adversarial arm)", fontsize=10)
    cycle_axes.append(ax)
    ax = axes[2][1]
    xs, ys = _cycle_series(gens, "adversarial", "grpo_kl_final")
    if xs:
        ax.plot(xs, ys, "o-", color="C3", label="final KL to reference", markersize=4)
    ax.set_title("GRPO final KL (adversarial arm)", fontsize=10)
    cycle_axes.append(ax)
    last = max((g["cycle"] for g in gens), default=0)
    for ax in cycle_axes:  # the same cycle range on every panel, whole cycles only
        ax.set_xlabel("cycle")
        ax.set_xlim(-0.3, last + 0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    # learning curves of every fresh detector
    ax = axes[2][2]
    for g in gens:
        curve = g.get("det_curve") or []
        if curve:
            color = ARM_STYLE.get(g["arm"], ("k", "-"))[0]
            ax.plot([c[0] for c in curve], [c[1] for c in curve], "-", color=color, markersize=3,
                    alpha=0.4 + 0.6 * (g["cycle"] + 1) / (1 + max(x["cycle"] for x in gens)),
                    label=f"{g['arm']} cycle {g['cycle']}")
            ax.axhline(curve[0][2], color="gray", ls=":", lw=0.8)
    ax.set_title("detector learning curves: val MAE (dotted: constant 0.5)", fontsize=10)
    ax.set_xlabel("reward-model iteration")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.suptitle(title)
    return fig, cycle_axes


MECHANISM_KINDS = (("train", "natural, the generator's train text", "C2"), ("val", "natural, val text", "C0"),
                   ("generated", "the generator's samples", "C3"))


def plot_mechanism(mech, path, title="what the detector rewards"):
    """P(natural) of each block against the generator's mean surprisal of it, for the three kinds of text of
    experiment/detection.mechanism (its points, and each kind's mean with 2 SE bars)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4.5), layout="constrained")
    for kind, label, color in MECHANISM_KINDS:
        m = mech[kind]
        pts = np.asarray(m["points"], dtype=np.float64).reshape(-1, 2)
        ax.scatter(pts[:, 0], pts[:, 1], s=10, alpha=0.35, color=color)
        ax.errorbar(m["surprisal"], m["p_natural"], xerr=2 * m["surprisal_se"], yerr=2 * m["p_natural_se"],
                    fmt="o", ms=8, color=color, mec="k", label=f"{label}: P(natural) {m['p_natural']:.3f}")
    ax.set_xlabel("the generator's surprisal of the block (nats/token)")
    ax.set_ylabel("the detector's P(natural)")
    ax.set_title(f"{title}\nmemorised text vs val text, AUROC of P(natural) {mech['memorised_auroc']:.3f} "
                 f"± {2 * mech['memorised_auroc_se']:.3f}", fontsize=10)
    ax.legend(fontsize=8, loc="best")
    ax.grid(alpha=0.3)
    save_figure(fig, path)


def plot_null_p(null_ps, path, title="A/A: the null pairs' p against uniform"):
    """The A/A test's null p-values (experiment/aa.null_p's records, {kind: record}), one panel per kind: their decile
    counts against the uniform count a valid test gives, with the KS test in the panel's title."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(null_ps), figsize=(4.5 * len(null_ps), 3.5), layout="constrained", squeeze=False)
    for ax, (kind, rec) in zip(axes[0], null_ps.items()):
        ax.bar(np.arange(10) / 10 + 0.05, rec["deciles"], width=0.09, color="tab:blue", label="null pairs' p")
        ax.axhline(len(rec["p"]) / 10, color="k", ls="--", label="uniform")
        ax.set_xlim(0, 1)
        ax.set_xlabel("p (1 seed, both matchings)")
        ax.set_ylabel("pairs")
        ax.set_title(f"{kind} pairs (n = {len(rec['p'])}): KS D {rec['ks']:.2f}, p {rec['ks_p']:.2f}", fontsize=10)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    save_figure(fig, path)


def plot_cycle_summary(gens, path, reference=None, title="adversarial cycles"):
    same, digest = drawn_from(path, cycle_summary_figure, gens, reference, title)
    if not same:
        fig, _ = cycle_summary_figure(gens, reference, title)
        save_figure(fig, path, digest)
