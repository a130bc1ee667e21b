"""
PNG plots shared by the training scripts (matplotlib, Agg backend: no display needed).
Every function takes plain lists / arrays and writes one PNG atomically.
"""
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from common import atomic_output  # noqa: E402


def _save(fig, path):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with atomic_output(path, "wb") as f:
        fig.savefig(f, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)


def _series(records, x_key, y_key):
    pts = [(r[x_key], r[y_key]) for r in records
           if r.get(x_key) is not None and isinstance(r.get(y_key), (int, float))]
    return [p[0] for p in pts], [p[1] for p in pts]


def plot_loss_curves(records, path, title="loss", x_key="iter", panels=None):
    """One panel per entry of `panels`: (panel title, [(record key, label, style), ...]).

    `records` are metrics.jsonl dicts; a key missing from a record is skipped, so
    train and eval records can be mixed in one list.
    """
    panels = panels or [("loss", [("train_loss", "train", "-"), ("val_loss", "val", "o-")])]
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
    _save(fig, path)


def plot_calibration(pred, true, path, title="calibration", n_bins=10, max_points=5000, seed=0):
    """Predicted P(natural) vs the true natural fraction K/N, with the diagonal and
    the mean prediction per bin of K/N."""
    pred = np.asarray(pred, dtype=np.float64)
    true = np.asarray(true, dtype=np.float64)
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
    _save(fig, path)


def plot_grpo_curves(records, path, title="GRPO"):
    """Reward (mean and windowed mean), KL to the reference, val loss, and the
    degenerate / clip fractions against the GRPO step."""
    steps = [r for r in records if r.get("kind") == "step"]
    evals = [r for r in records if r.get("kind") == "eval"]
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
    _save(fig, path)
