"""experiment/frontier.py and cycle_metrics' temperature-scaled val perplexity and judge NLL: interpolation on
a control's temperature curve, paired standard errors, the verdict at matched quality and matched
coverage (beyond / inside / tie / mixed / degenerate / out of range) on synthetic curves, the plot, and a sweep
of a tiny trained model."""
import math
import os

import numpy as np
import pytest
import torch

from core.logprobs import logprobs_at_temperatures
from experiment import frontier as fr, measures as cm
from helpers import prepare_char_data, train_tiny_checkpoint

GRID = (0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.5, 1.7)
E = np.random.default_rng(0).normal(0, 0.3, 200)  # per-sample judge noise, shared: paired items
U = np.random.default_rng(1).normal(0, 0.2, 64)  # per-val-group noise, shared


def q_of(t):  # quality (judge NLL) rises with T
    return 2.0 + math.log(t)


def c_of(t):  # coverage (val NLL) is convex in log T with its best at T = 1
    return 2.0 + 0.5 * math.log(t) ** 2


def point(q, c, jitter=0.0, seed=2):
    """A point with the shared per-item noise (plus a little of its own)."""
    rng = np.random.default_rng(seed)
    ji = q + E + rng.normal(0, jitter, E.size)
    vi = c + U + rng.normal(0, jitter, U.size)
    return {"judge_nll": float(ji.mean()), "judge_items": ji.tolist(), "val_loss": float(vi.mean()),
            "val_items": vi.tolist(), "val_ppl": math.exp(vi.mean())}


def control():
    return {t: point(q_of(t), c_of(t)) for t in GRID}


# ----------------------------------------------------------------------------- interpolation

def test_locate_is_exact_on_curves_quadratic_in_log_t():
    curve = control()
    loc = fr.locate(curve, "judge_nll", q_of(0.85) + float(E.mean()))
    assert loc["t_star"] == pytest.approx(0.85, rel=1e-9)
    cv = np.array([curve[t]["val_loss"] for t in sorted(curve)])
    # the parabola in log T is exact for this coverage curve; the chord overstates a convex curve
    assert loc["w"] @ cv == pytest.approx(c_of(0.85) + float(U.mean()), abs=1e-9)
    assert loc["w_lin"] @ cv > loc["w"] @ cv
    assert fr.locate(curve, "judge_nll", 9.0) is None  # outside the curve: no extrapolation


def test_paired_se_by_hand():
    """T* on a grid point: the SE is the spread of the per-item differences there; the matched axis
    has no noise (equal items), so nothing moves T*."""
    ctl = {t: {"judge_nll": t, "judge_items": [t] * 4, "val_loss": 2.5, "val_items": [1.5, 1.5, 3.5, 3.5]}
           for t in (0.5, 1.0, 1.5)}
    arm = {"judge_nll": 1.0, "judge_items": [1.0] * 4, "val_loss": 2.5, "val_items": [1, 2, 3, 4]}
    r = fr.paired(arm, ctl, "quality")
    # differences -0.5, 0.5, -0.5, 0.5: sd (n-1) = sqrt(1/3), SE = sqrt(1/3) / 2
    assert r["t_star"] == pytest.approx(1.0) and r["diff"] == pytest.approx(0.0, abs=1e-9)
    assert r["se"] == pytest.approx(math.sqrt(1 / 3) / 2, rel=1e-6)


def test_combine_over_seeds_uses_student_t():
    res = [{"diff": d, "se": 0.0, "interp_err": 0.0, "t_star": 1.0, "past": False, "axis": "val_loss",
            "control": {"judge_nll": 0.0, "val_loss": 0.0}} for d in (0.1, 0.2, 0.3)]
    c = fr.combine(res)
    assert c["diff"] == pytest.approx(0.2) and c["se"] == pytest.approx(0.1 / math.sqrt(3))
    assert c["threshold"] == pytest.approx(4.303 * 0.1 / math.sqrt(3), rel=1e-3)
    assert fr.combine(res[:1] + [None]) is None


# ----------------------------------------------------------------------------- verdicts

def test_coverage_only_win_is_beyond():
    """The control's quality at T = 1, with better coverage than the control reaches at any T."""
    v = fr.verdict([point(q_of(1.0), c_of(1.0) - 0.05, 0.01)], [control()])
    assert v["at_quality"]["verdict"] == "beyond" and v["at_quality"]["t_star"] == pytest.approx(1.0, abs=0.01)
    assert v["at_coverage"]["verdict"] == "beyond" and v["at_coverage"]["past"]
    assert v["verdict"] == "beyond"


def test_worse_coverage_at_equal_quality_is_inside_and_a_control_point_ties():
    v = fr.verdict([point(q_of(0.8), c_of(0.8) + 0.05, 0.01)], [control()])
    assert v["at_quality"]["verdict"] == v["at_coverage"]["verdict"] == v["verdict"] == "inside"
    assert v["at_quality"]["diff"] == pytest.approx(0.05, abs=0.01)
    v = fr.verdict([point(q_of(0.8), c_of(0.8), 0.01)], [control()])
    assert v["verdict"] == "tie", v["sentence"]


def test_a_difference_of_float_rounding_ties_whatever_the_threshold():
    """A model against itself differs by float rounding (1e-15 nats/token after interpolation), and with one
    seed its paired SE, and so the threshold, can be smaller still: that is a tie, not a verdict."""
    rec = {"diff": 1.8e-15, "threshold": 2.5e-16, "degenerate": None}
    assert fr._label(rec) == fr._label({**rec, "diff": -1.8e-15}) == "tie"
    assert fr._label({**rec, "diff": 1e-6}) == "inside" and fr._label({**rec, "diff": -1e-6}) == "beyond"


def test_mixed_is_named_mixed():
    """Better coverage than the control at its own quality (T* = 1.3, past the best coverage), but the
    control's low-T branch reaches that coverage with much better quality."""
    v = fr.verdict([point(q_of(1.3), c_of(1.3) - 0.02, 0.005)], [control()])
    assert v["at_quality"]["verdict"] == "beyond"
    assert v["at_coverage"]["verdict"] == "inside" and v["at_coverage"]["t_star"] < 1.0
    assert v["verdict"] == "mixed" and "**mixed**" in v["sentence"]


def test_out_of_range_and_the_overall_word():
    v = fr.verdict([point(q_of(0.3), c_of(0.3) + 1.0, 0.01)], [control()])
    assert v["at_quality"]["verdict"] == "out of range" and "out of range" in v["sentence"]
    # matched coverage looks on the low-T branch only, and the sentence names that branch's range
    assert v["at_coverage"]["verdict"] == "out of range"
    assert "over T = 0.5-1, its branch at or below its best val NLL" in v["sentence"], v["sentence"]
    assert fr.overall("out of range", "out of range") == "out of range"


@pytest.mark.parametrize("q, c, word", [
    # a word needs both matchings: under the OR of before, each of these first four said beyond or inside
    ("beyond", "tie", "tie"), ("tie", "beyond", "tie"), ("inside", "tie", "tie"), ("tie", "inside", "tie"),
    ("beyond", "beyond", "beyond"), ("inside", "inside", "inside"), ("tie", "tie", "tie"),
    ("beyond", "inside", "mixed"), ("inside", "beyond", "mixed"),
    # a matching out of range is no evidence: the other's word stands alone
    ("out of range", "beyond", "beyond"), ("inside", "out of range", "inside"), ("out of range", "tie", "tie"),
    ("out of range", "out of range", "out of range"),
    # a win on degenerate samples is never beyond, whatever the other matching says
    ("degenerate", "beyond", "degenerate"), ("inside", "degenerate", "degenerate"), ("tie", "degenerate", "degenerate"),
    ("out of range", "degenerate", "degenerate")])
def test_the_overall_word_at_each_edge_of_the_rule(q, c, word):
    assert fr.overall(q, c) == word


def test_one_seed_takes_the_aa_tests_training_noise_or_says_provisional():
    """A one-seed difference past its evaluation noise alone (2 paired SE) is provisional; the A/A test's
    training noise widens the threshold in quadrature, and a difference inside it ties."""
    pt = point(q_of(0.8), c_of(0.8) + 0.03, 0.01)
    bare = fr.verdict([pt], [control()])
    assert bare["verdict"] == "inside" and bare["at_quality"]["provisional"]
    assert "provisional" in bare["sentence"] and bare["at_quality"]["seeds"] == 1
    se = bare["at_quality"]["se"]
    noisy = fr.verdict([pt], [control()], train_noise={"quality": 0.02, "coverage": 0.05})
    assert noisy["at_quality"]["se"] == pytest.approx(math.hypot(se, 0.02))
    assert not noisy["at_quality"]["provisional"] and noisy["verdict"] == "tie", noisy["sentence"]
    # over seeds the between-seed variance is the training noise: none is added, nothing is provisional
    three = fr.verdict([pt] * 3, [control()] * 3, train_noise={"quality": 9.0, "coverage": 9.0})
    assert three["at_quality"]["se"] == pytest.approx(se, rel=1e-3) and not three["at_quality"]["provisional"]


def test_p_values_match_the_threshold_and_holm_steps_down():
    """p < 0.05 exactly where a matching's word over seeds is not tie; Holm over m comparisons keeps only
    those whose p passes alpha / (m - k) in order, and stops at the first kept null."""
    for d in (0.05, 0.2):
        res = [{"diff": d + e, "se": 0.0, "interp_err": 0.01, "t_star": 1.0, "past": False, "axis": "val_loss",
                "control": {"judge_nll": 0.0, "val_loss": 0.0}} for e in (-0.05, 0.0, 0.05)]
        c = fr.combine(res)
        assert (c["p"] < 0.05) == (fr._label(c) != "tie")
    assert fr.holm([0.01, 0.04, 0.03, 0.5]) == [True, False, False, False]  # 0.03 > 0.05 / 3
    assert fr.holm([0.01, 0.02, 0.012]) == [True, True, True]  # 0.01 <= 0.05/3, 0.012 <= 0.05/2, 0.02 <= 0.05
    assert fr.holm([0.2, 0.001]) == [False, True] and fr.holm([]) == []
    v = {"at_quality": {"verdict": "beyond", "p": 0.001}, "at_coverage": {"verdict": "tie", "p": 0.3}}
    assert fr.comparison_p(v) == 0.3
    assert fr.comparison_p({**v, "at_coverage": {"verdict": "out of range"}}) == 0.001


def test_a_win_on_degenerate_samples_is_named_degenerate():
    """A judge scores repeated text as likely: an arm whose judge NLL beats the control's at matched coverage
    while its samples are mostly degenerate (the control's are not) is no win. On the H100 run of the gpu
    preset the GRPO arm was called beyond both controls this way, with 90 % degenerate samples."""
    ctl = {t: {**p, "degenerate_share": 0.0, "samples": 200} for t, p in control().items()}
    win = point(q_of(0.7) - 0.3, c_of(0.7), 0.01)  # much better quality at the coverage of T = 0.7
    assert fr.verdict([{**win, "degenerate_share": 0.0, "samples": 200}], [ctl])["verdict"] == "beyond"
    v = fr.verdict([{**win, "degenerate_share": 0.9, "samples": 200}], [ctl])
    assert v["at_coverage"]["verdict"] == "degenerate" and v["verdict"] == "degenerate", v["sentence"]
    assert "a win on degenerate samples: 0.900 of the arm's against 0.000" in v["sentence"]
    # within binomial noise of the control's share (1 of 200 against 0): still a win
    assert fr.verdict([{**win, "degenerate_share": 0.005, "samples": 200}], [ctl])["verdict"] == "beyond"
    # points without the share (older summaries) are judged as before
    assert fr.verdict([win], [control()])["verdict"] == "beyond"


def test_seeds_widen_the_threshold():
    """Three seeds whose differences scatter: the t(0.975, 2) threshold covers a difference one seed
    would call significant."""
    pts = [point(q_of(0.8), c_of(0.8) + d, 0.01, seed=s) for s, d in enumerate((0.0, 0.04, 0.08))]
    one = fr.verdict(pts[1:2], [control()])
    three = fr.verdict(pts, [control()] * 3)
    assert one["at_quality"]["verdict"] == "inside"
    assert three["at_quality"]["verdict"] == "tie" and three["at_quality"]["per_seed"][0] < 0.01


def test_the_threshold_multiplier_is_students_t_at_any_number_of_seeds():
    """2 within one run; over S seeds t(0.975, S - 1), also past 10 degrees of freedom (a table there
    stopped and fell back to 2.0)."""
    assert fr.quantile(1) == 2.0
    assert fr.quantile(3) == pytest.approx(4.303, abs=1e-3) and fr.quantile(11) == pytest.approx(2.228, abs=1e-3)
    assert fr.quantile(12) == pytest.approx(2.201, abs=1e-3)  # 11 degrees of freedom
    assert fr.quantile(16) == pytest.approx(2.131, abs=1e-3)  # 15 degrees of freedom
    assert fr.quantile(1001) == pytest.approx(1.962, abs=1e-3)


def test_plot_frontier_writes_a_png(tmp_path, monkeypatch):
    """A curve's ends and T = 1 are labelled, not each of its temperatures (eleven a curve here)."""
    from core import plots
    ctl = control()
    for t in GRID:
        ctl[t].update(real_word_rate=0.9 - 0.1 * t, distinct_2=0.5 + 0.2 * t)
    labels, figs, real = [], [], plots.save_figure
    monkeypatch.setattr(plots, "save_figure", lambda fig, p, inputs=None: labels.extend(
        [t.get_text() for ax in fig.axes for t in ax.texts]) or figs.append(fig) or real(fig, p, inputs))
    quality_only = {t: {k: ctl[t][k] for k in ("judge_nll", "val_ppl")} for t in (0.5, 1.0)}  # the left panel only
    path = fr.plot_frontier({"control (MLE)": ctl, "arm": {1.0: ctl[1.0]}, "left only": quality_only},
                            str(tmp_path / "f.png"), natural={"real_word_rate": 0.9, "distinct_2": 0.8})
    assert (tmp_path / "f.png").stat().st_size > 5000 and path.endswith("f.png")
    ends = [f"T={min(GRID):g}", "T=1", f"T={max(GRID):g}"]
    assert len(GRID) > 3 and sorted(labels) == sorted(ends * 2 + ["T=1"] * 2 + ["T=0.5", "T=1"]), labels
    # one legend, every curve and the star in it, over neither panel (each panel's own hid its curves)
    fig, = figs
    legend, = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == ["control (MLE)", "arm", "left only",
                                                           "natural val text"]
    assert all(ax.get_legend() is None for ax in fig.axes)
    box = legend.get_window_extent()
    assert all(not box.overlaps(ax.get_window_extent()) for ax in fig.axes)


def test_a_figure_is_redrawn_only_when_what_it_shows_changes(tmp_path, monkeypatch):
    """A rerun of a finished or resumed run writes its summary again: a figure drawn from the same inputs
    by the same code is kept (the file is not rewritten); new inputs, or a PNG without the digest (an older
    run's, or another program's), are drawn anew."""
    from core import plots
    ctl = control()
    for t in GRID:
        ctl[t].update(real_word_rate=0.9 - 0.1 * t, distinct_2=0.5 + 0.2 * t)
    path, drawn = str(tmp_path / "f.png"), []
    real = plots.save_figure
    monkeypatch.setattr(plots, "save_figure", lambda fig, p, inputs=None: drawn.append(p) or real(fig, p, inputs))
    natural = {"real_word_rate": 0.9, "distinct_2": 0.8}
    draw = lambda arms, **k: fr.plot_frontier(arms, path, natural=natural, **k)  # noqa: E731
    draw({"control (MLE)": ctl})
    inode = os.stat(path).st_ino
    draw({"control (MLE)": ctl})
    assert len(drawn) == 1 and os.stat(path).st_ino == inode  # kept
    draw({"control (MLE)": ctl}, title="another title")
    other = {t: dict(p) for t, p in ctl.items()}
    other[1.0]["judge_nll"] += 0.01
    draw({"control (MLE)": other})
    assert len(drawn) == 3
    gens = [{"cycle": 0, "arm": "base", "val_ppl": 5.0}, {"cycle": 1, "arm": "adversarial", "val_ppl": 4.0}]
    summary = str(tmp_path / "summary.png")
    plots.save_figure(plots.cycle_summary_figure(gens)[0], summary)  # no digest: drawn again
    plots.plot_cycle_summary(gens, summary)
    plots.plot_cycle_summary(gens, summary)
    assert drawn[3:] == [summary, summary]
    assert plots.drawn_from(summary, plots.cycle_summary_figure, gens, None, "adversarial cycles")[0]


# ----------------------------------------------------------------------------- temperature-scaled ppl

def test_temperature_logprobs_by_hand():
    # logits = x @ W.T = [2, 0, 0] at the one position
    x = torch.tensor([[[1.0, 0.0]]])
    w = torch.tensor([[2.0, 0.0], [0.0, 1.0], [0.0, -1.0]])
    lp = logprobs_at_temperatures(x, w, torch.tensor([[0]]), [2.0, 1.0])
    # T=2: logits/T = [1, 0, 0] -> 1 - log(e + 2) = -0.551445; T=1: 2 - log(e^2 + 2) = 2 - 2.239545 = -0.239545
    assert lp[:, 0, 0].tolist() == pytest.approx([-0.551445, -0.239545], abs=1e-6)
    lp = logprobs_at_temperatures(x, w, torch.tensor([[1]]), [0.5])
    # T=0.5: [4, 0, 0] -> 0 - log(e^4 + 2) = -4.035976
    assert lp[0, 0, 0].item() == pytest.approx(-4.035976, abs=1e-6)


@pytest.mark.parametrize("per_chunk", [1, 5, 12])  # 5: chunk boundaries inside rows
def test_temperature_logprobs_chunked_equal_unchunked(per_chunk):
    g = torch.Generator().manual_seed(0)
    V, temps = 17, [0.7, 1.0, 1.5]
    x, w = torch.randn(4, 6, 8, generator=g), torch.randn(V, 8, generator=g)
    targets = torch.randint(0, V, (4, 6), generator=g)
    lp = logprobs_at_temperatures(x, w, targets, temps, max_elements=per_chunk * V)
    logits = x @ w.T
    for i, t in enumerate(temps):
        ref = torch.log_softmax(logits / t, -1).gather(-1, targets[..., None]).squeeze(-1)
        assert torch.allclose(lp[i], ref, atol=1e-5)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("fr")
    _, data_dir = prepare_char_data(str(root))
    ckpt = train_tiny_checkpoint(data_dir, str(root / "gen.pt"), steps=30)
    from lib.checkpoint import load_model
    model, _, _ = load_model(ckpt)
    return data_dir, ckpt, model


def test_val_ppl_at_temperature_matches_the_full_logits_and_t1_the_existing_path(tiny):
    from lib.heldout import TokenWindows
    data_dir, ckpt, model = tiny
    res = cm.val_perplexity_at_temperatures(model, data_dir, "cpu", 8, temps=(0.7, 1.0, 1.5))
    loss, ppl = cm._val_perplexity(model, data_dir, "cpu", 8, None, ckpt)
    assert res[1.0]["val_loss"] == pytest.approx(loss, rel=1e-9)
    assert res[1.0]["val_ppl"] == pytest.approx(ppl, rel=1e-9)
    # brute force: the full (B, T, V) logits, every window of evaluate.py
    ds = TokenWindows(f"{data_dir}/val.bin", model.config.block_size)
    xs, ys = map(torch.stack, zip(*[ds[i] for i in range(len(ds))]))
    with torch.no_grad():
        logits = model.lm_head(model.hidden_states(xs))
    keep = ys != -1
    for t in (0.7, 1.5):
        nll = -torch.log_softmax(logits.double() / t, -1).gather(-1, ys.clamp(min=0)[..., None])[..., 0][keep]
        assert res[t]["val_loss"] == pytest.approx(nll.mean().item(), rel=1e-5)
        assert res[t]["val_tokens"] == int(keep.sum())
        assert res[t]["val_nll_sd"] == pytest.approx(nll.std(unbiased=False).item(), rel=1e-4)
    # a sharper model fits worse at a low T and better at a high one: not all equal
    assert len({round(r["val_ppl"], 6) for r in res.values()}) == 3


def test_val_ppl_at_every_temperature_is_the_vocab_size_for_uniform_logits(tiny):
    import copy
    data_dir, _, model = tiny
    flat = copy.deepcopy(model)
    with torch.no_grad():
        flat.lm_head.weight.zero_()  # every logit 0: uniform at any T, ppl = V
    res = cm.val_perplexity_at_temperatures(flat, data_dir, "cpu", 8, temps=(0.5, 1.0, 2.0))
    for r in res.values():
        assert r["val_ppl"] == pytest.approx(model.config.vocab_size, rel=1e-6)


# ----------------------------------------------------------------------------- sweep

def test_sweep_tiny_model_finite_and_the_same_draw_for_every_generator(tiny):
    data_dir, ckpt, model = tiny
    temps = (0.7, 1.0, 1.3)
    a = fr.sweep(model, data_dir, temps, n_samples=16, sample_len=24, seed=0)
    assert sorted(a) == list(temps)
    for t, p in a.items():
        for k in ("real_word_rate", "distinct_2", "degenerate_share", "val_ppl", "val_loss"):
            assert math.isfinite(p[k]), (t, k)
        assert p["samples"] == 16 and p["words"] > 0
    # the same draw: a second sweep of the same model is identical, and T=1 is exactly what
    # measures.evaluate_generator measures (same prompts, same uniforms), so run_cycles takes
    # a generator's own numbers from the sweep; keep_examples adds the decoded samples, nothing else
    kept = fr.sweep(model, data_dir, [1.0], n_samples=16, sample_len=24, seed=0, keep_examples=True)[1.0]
    assert kept.pop("examples") and kept == a[1.0]
    assert fr.sweep(model, data_dir, temps, n_samples=16, sample_len=24, seed=0) == a
    ev = cm.evaluate_generator(ckpt, data_dir, n_samples=16, sample_len=24, seed=0, eval_batch_size=8)
    for k in ("real_word_rate", "distinct_2", "degenerate_share", "words", "bigrams"):
        assert a[1.0][k] == ev[k], k
    assert a[1.0]["val_ppl"] == pytest.approx(ev["val_ppl"], rel=1e-9)
    # lower T sharpens: the val fit at T=0.7 and T=1.3 differs from T=1
    assert a[0.7]["val_ppl"] != a[1.0]["val_ppl"] != a[1.3]["val_ppl"]
    # the coverage items: one mean NLL per group of val windows (here fewer windows than VAL_ITEMS)
    assert 2 <= len(a[1.0]["val_items"]) <= fr.VAL_ITEMS
    assert np.mean(a[1.0]["val_items"]) == pytest.approx(a[1.0]["val_loss"], rel=0.02)
    # with a judge (here the model itself): its NLL of its own samples rises with T
    j = fr.sweep(model, data_dir, temps, n_samples=16, sample_len=24, seed=0, judge=model)
    assert j[0.7]["judge_nll"] < j[1.0]["judge_nll"] < j[1.3]["judge_nll"] and len(j[1.0]["judge_items"]) == 16
    v = fr.verdict([j[1.0]], [j])
    assert v["verdict"] == "tie" and v["at_quality"]["t_star"] == pytest.approx(1.0)  # a model against itself


def test_judge_nll_by_hand(tiny):
    import copy
    _, _, model = tiny
    rows = torch.randint(0, model.config.vocab_size, (5, 12), generator=torch.Generator().manual_seed(0))
    flat = copy.deepcopy(model)
    with torch.no_grad():
        flat.lm_head.weight.zero_()  # uniform: every token costs log V
    assert cm.judge_nll(flat, rows) == pytest.approx([math.log(model.config.vocab_size)] * 5, rel=1e-6)
    # the trained model: the mean of -log softmax(logits)[next token] over tokens 1..11 of each row
    with torch.no_grad():
        logits = model.lm_head(model.hidden_states(rows))
    ref = -torch.log_softmax(logits[:, :-1].double(), -1).gather(-1, rows[:, 1:, None])[..., 0].mean(1)
    assert cm.judge_nll(model, rows, batch_size=2) == pytest.approx(ref.numpy(), rel=1e-5)
    too_long = torch.zeros((1, model.config.block_size + 1), dtype=torch.long)
    with pytest.raises(cm.ProjectError, match="judge"):
        cm.judge_nll(model, too_long)


def test_a_past_match_is_labelled_by_the_axis_it_compares():
    """An arm whose coverage beats the control's at every T is compared on val NLL at the control's best
    coverage ("past"), under matched coverage, whose other rows compare judge NLL: the cell names its axis."""
    from experiment.verdicts import holm_words, verdict_table
    v = fr.verdict([point(q_of(1.0), c_of(1.0) - 0.05, 0.01)], [control()])
    assert v["at_coverage"]["past"] and v["at_coverage"]["axis"] == "val_loss"
    report = holm_words({1: {"replicates": 1, "controls": {"control": {"compute_flops": 2.0}},
                             "arms": {"adversarial": {"compute_flops": 4.0, "curve": {"1": {"judge_nll": 2.0}},
                                                      "verdicts": {"control": v}}}}})
    table = verdict_table(report)
    assert "1.00 (past), val NLL -0.05" in table and ", judge NLL " not in table.split("\n")[-1].split("(past)")[1]
    assert "| control | 2 (0.50x) |" in table and table.endswith("| **beyond** | beyond |")
