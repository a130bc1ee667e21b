"""frontier.py and cycle_metrics' temperature-scaled val perplexity: interpolation on the control's
temperature curve, the beyond / inside / tie / out-of-range verdict, seed aggregation, the plot,
and a sweep of a tiny trained model."""
import math

import pytest
import torch

import cycle_metrics as cm
import frontier as fr
from helpers import prepare_char_data, train_tiny_checkpoint
from model import logprobs_at_temperatures

TEMPS = (0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2)


def control_curve():
    """Quality falls linearly with T (0.95 at 0.6, -0.3 per unit T), diversity rises (0.5, +0.6),
    ppl rises linearly (6 + 2 T): at quality 0.875, T* = 0.85, distinct-2 0.65, ppl 7.7."""
    curve = {t: {"real_word_rate": 0.95 - 0.3 * (t - 0.6), "distinct_2": 0.5 + 0.6 * (t - 0.6),
                 "val_ppl": 6.0 + 2.0 * t} for t in TEMPS}
    se = {t: {"real_word_rate": 0.005, "distinct_2": 0.005, "val_ppl": 0.02} for t in TEMPS}
    return curve, se


POINT_SE = {"real_word_rate": 0.005, "distinct_2": 0.005, "val_ppl": 0.02}


# ----------------------------------------------------------------------------- interpolation

def test_interpolate_linear_between_bracketing_points():
    curve, se = control_curve()
    m = fr.interpolate(curve, 0.875, se)
    assert m["t_star"] == pytest.approx(0.85) and m["crossings"] == 1 and not m["clamped"]
    assert m["point"]["distinct_2"] == pytest.approx(0.65)
    assert m["point"]["val_ppl"] == pytest.approx(7.7)
    assert m["slope"]["distinct_2"] == pytest.approx(-2.0)  # d distinct-2 / d quality = 0.6 / -0.3
    assert m["se"]["distinct_2"] == pytest.approx(0.005)
    # a sweep point itself: T* is that temperature
    assert fr.interpolate(curve, curve[0.7]["real_word_rate"])["t_star"] == pytest.approx(0.7)


def test_interpolate_out_of_range_and_clamp():
    curve, se = control_curve()
    assert fr.interpolate(curve, 0.99, se) is None  # above the best quality (0.95 at T=0.6)
    assert fr.interpolate(curve, 0.70, se) is None  # below the worst (0.77 at T=1.2)
    m = fr.interpolate(curve, 0.955, se, clamp_se=0.01)  # 0.005 past the end: clamped, no extrapolation
    assert m["clamped"] and m["t_star"] == 0.6 and m["point"]["distinct_2"] == pytest.approx(0.5)
    assert fr.interpolate(curve, 0.975, se, clamp_se=0.01) is None


def test_interpolate_non_monotone_prefers_falling_pair_nearest_the_points_temperature():
    q = {0.6: 0.95, 0.7: 0.90, 0.8: 0.92, 0.9: 0.86, 1.0: 0.84}  # a wiggle at T = 0.8
    curve = {t: (v, 0.5 + t / 10, 6 + t) for t, v in q.items()}
    m = fr.interpolate(curve, 0.91)
    # crossed in (0.6, 0.7) falling, (0.7, 0.8) rising, (0.8, 0.9) falling: the falling pair nearest T=1
    assert m["crossings"] == 3
    assert m["t_star"] == pytest.approx(0.8 + 0.1 * (0.91 - 0.92) / (0.86 - 0.92))
    assert fr.interpolate(curve, 0.91, near_t=0.6)["t_star"] == pytest.approx(0.6 + 0.1 * 0.04 / 0.05)


# ----------------------------------------------------------------------------- verdict

def combined_2se_d2():
    # point SE 0.005, control SE at T* 0.005, slope -2 times both quality SEs (0.005 each)
    return 2 * math.sqrt(0.005 ** 2 + 0.005 ** 2 + 4 * (0.005 ** 2 + 0.005 ** 2))


@pytest.mark.parametrize("d2, ppl, want", [
    (0.70, 7.7, "beyond"),   # +0.05 distinct-2 at equal ppl (2 SE = 0.032)
    (0.60, 7.7, "inside"),   # -0.05 distinct-2
    (0.66, 7.7, "tie"),      # +0.01 < 2 SE
    (0.70, 8.5, "inside"),   # more diverse, but val ppl worse by 0.8 (2 SE ~ 0.11)
])
def test_frontier_verdict_on_synthetic_curves(d2, ppl, want):
    curve, se = control_curve()
    v = fr.frontier_verdict({"real_word_rate": 0.875, "distinct_2": d2, "val_ppl": ppl}, POINT_SE, curve, se)
    assert v["verdict"] == want, v["sentence"]
    assert v["t_star"] == pytest.approx(0.85)
    assert v["d2_diff"] == pytest.approx(d2 - 0.65)
    assert v["d2_2se"] == pytest.approx(combined_2se_d2())
    assert "T* = 0.85" in v["sentence"] and "distinct-2 0.650 vs" in v["sentence"]
    if want == "inside" and d2 < 0.65:
        assert f"inside the MLE frontier by {0.65 - d2:.3f} distinct-2 (2 SE = {combined_2se_d2():.3f})" \
            in v["sentence"]


def test_frontier_verdict_out_of_range_says_so():
    curve, se = control_curve()
    v = fr.frontier_verdict((0.99, 0.9, 7.0), POINT_SE, curve, se)
    assert v["verdict"] == "out of range" and v["t_star"] is None
    assert "outside the control's range 0.770-0.950" in v["sentence"]


# ----------------------------------------------------------------------------- aggregation

def sweep_point(q, d2, ppl):
    return {"real_word_rate": q, "words": 400, "distinct_2": d2, "bigrams": 300, "degenerate_share": 0.0,
            "samples": 16, "val_loss": math.log(ppl), "val_ppl": ppl, "val_tokens": 10_000, "val_nll_sd": 1.0}


def test_aggregate_across_seeds_is_mean_and_standard_error():
    sweeps = [{0.8: sweep_point(q, d, p), 1.0: sweep_point(q - 0.1, d + 0.1, p + 1)}
              for q, d, p in [(0.90, 0.60, 7.0), (0.92, 0.62, 7.2), (0.94, 0.70, 7.1)]]
    mean, se, kind = fr.aggregate(sweeps)
    assert kind.startswith("across 3 seeds")
    assert mean[0.8]["real_word_rate"] == pytest.approx(0.92)
    assert se[0.8]["real_word_rate"] == pytest.approx(0.02 / math.sqrt(3))  # sample sd 0.02
    assert mean[1.0]["val_ppl"] == pytest.approx(8.1)
    assert se[1.0]["val_ppl"] == pytest.approx(0.1 / math.sqrt(3))
    with pytest.raises(ValueError):
        fr.aggregate([sweeps[0], {0.8: sweeps[1][0.8]}])


def test_aggregate_one_sweep_uses_within_run_standard_errors():
    mean, se, kind = fr.aggregate([{1.0: sweep_point(0.9, 0.6, 7.0)}])
    assert kind.startswith("within-run")
    assert se[1.0]["real_word_rate"] == pytest.approx(math.sqrt(0.9 * 0.1 / 400))
    assert se[1.0]["distinct_2"] == pytest.approx(math.sqrt(0.6 * 0.4 / 300))
    # token-level SE 1/sqrt(10000) = 0.01 > the 0.25 % floor: ppl SE = 7 * 0.01
    assert se[1.0]["val_ppl"] == pytest.approx(0.07)
    p = sweep_point(0.9, 0.6, 7.0) | {"val_tokens": 10 ** 8}
    assert fr.within_run_se(p)["val_ppl"] == pytest.approx(7.0 * fr.PPL_REL_SE_FLOOR)


# ----------------------------------------------------------------------------- plot

def test_plot_frontier_writes_a_png(tmp_path):
    curve, se = control_curve()
    adv = {1.0: {"real_word_rate": 0.875, "distinct_2": 0.60, "val_ppl": 7.9}}
    path = fr.plot_frontier({"control (MLE)": (curve, se), "adversarial": (adv, {1.0: POINT_SE})},
                            str(tmp_path / "frontier.png"),
                            natural={"real_word_rate": 0.97, "distinct_2": 0.9})
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


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
    from checkpoint import load_model
    model, _, _ = load_model(ckpt)
    return data_dir, ckpt, model


def test_val_ppl_at_temperature_matches_the_full_logits_and_t1_the_existing_path(tiny):
    from corpus import TokenWindows
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
    # cycle_metrics.evaluate_generator measures (same prompts, same uniforms), so run_cycles takes
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
    mean, se, _ = fr.aggregate([a])
    assert all(math.isfinite(v) for t in temps for v in se[t].values())
    v = fr.frontier_verdict(mean[1.0], se[1.0], mean, se)
    assert v["verdict"] == "tie" and v["t_star"] == pytest.approx(1.0)  # a model against itself
