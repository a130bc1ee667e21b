"""experiment/aa.py, the A/A test's arithmetic, on synthetic null pairs: curves of one law whose training noise
is known (each model's whole curve shifted by its own draw), so the noise estimate can be checked against it
and the rules' false-positive rates against what they must be."""
import math

import numpy as np
import pytest

from experiment import aa, frontier as fr

GRID = (0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.4, 1.7)


def model(shift, rng, items=200, groups=64):
    """A generator's sweep: quality log T + 2, coverage 2 + 0.5 log^2 T, both moved by its training draw
    `shift` (quality, coverage), with per-item evaluation noise shared by every model (paired items) plus a
    little of its own."""
    e_q = np.random.default_rng(0).normal(0, 0.3, items)
    e_c = np.random.default_rng(1).normal(0, 0.2, groups)
    out = {}
    for t in GRID:
        ji = 2.0 + math.log(t) + shift[0] + e_q + rng.normal(0, 0.01, items)
        vi = 2.0 + 0.5 * math.log(t) ** 2 + shift[1] + e_c + rng.normal(0, 0.01, groups)
        out[t] = {"judge_nll": float(ji.mean()), "judge_items": ji.tolist(), "val_loss": float(vi.mean()),
                  "val_items": vi.tolist(), "val_ppl": math.exp(vi.mean())}
    return out


def pairs(n, sd, seed=0):
    rng = np.random.default_rng(seed)
    return [(model(rng.normal(0, sd, 2), rng), model(rng.normal(0, sd, 2), rng)) for _ in range(n)]


def test_the_or_of_before_is_what_8a2b55b_said():
    assert aa.overall_or("beyond", "tie") == "beyond" and aa.overall_or("tie", "inside") == "inside"
    assert aa.overall_or("beyond", "inside") == "mixed" and aa.overall_or("degenerate", "inside") == "inside"
    assert aa.overall_or("out of range", "out of range") == "out of range"


def test_training_noise_is_recovered_and_widens_the_one_seed_threshold():
    """Each model's curve moves by N(0, 0.03) per axis: a difference of two carries sqrt(2) x 0.03 of
    training noise on the coverage axis at matched quality. The paired SE alone (evaluation noise) calls many
    pairs inside or beyond; with the estimated noise the rule keeps the false-positive rate near 5 %."""
    rep = aa.null_report(pairs(12, 0.03))
    noise = rep["training_noise"]["quality"]  # the val NLL difference at matched quality
    assert noise == pytest.approx(math.sqrt(2) * 0.03, rel=0.5)
    bare, loo = rep["rates"]["quality_alone_1_seed"], rep["rates"]["both_noise_loo"]
    assert bare[1] == loo[1] == 12 and bare[0] >= 6  # evaluation noise alone: a word for half or more
    assert loo[0] <= 2 and rep["rates"]["both_1_seed"][0] <= bare[0]
    assert rep["rates"]["both_3_seeds"][1] == math.comb(12, 3)
    for row in rep["pairs"]:
        assert row["both_1_seed"] == fr.overall(row["words"]["quality"], row["words"]["coverage"])


def test_no_training_noise_estimates_near_zero_and_the_table_names_each_rule():
    rep = aa.null_report(pairs(8, 0.0))
    assert rep["training_noise"]["quality"] < 0.01
    md = aa.rates_table({"continuation": rep, "base": rep})
    assert md.count("\n") == 3 + len(aa.RULES) and "/ 8 (" in md and "training noise SD" in md and "KS against uniform" in md
    assert aa.rate(["tie", "out of range", "inside", "mixed"]) == (2, 4)  # out of range is no word
