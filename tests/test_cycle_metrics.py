"""experiment/measures.py: AUROC, words, real-word rate, distinct-2, the lexicon baseline, the shared
samples, and plots.cycle_summary_figure's integer cycle ticks."""
import json
import math
import os

import numpy as np
import pytest
import torch

from experiment import detection as dt, measures as cm

# ----------------------------------------------------------------------------- AUROC

def test_auroc_perfect_reversed_and_ties():
    assert dt.auroc([0.9, 0.8, 0.7], [0.1, 0.2]) == 1.0
    assert dt.auroc([0.1, 0.2], [0.9, 0.8, 0.7]) == 0.0
    assert dt.auroc([0.5, 0.5, 0.5], [0.5, 0.5]) == 0.5
    # one tie between classes counts 1/2: pairs (0.9>0.1, 0.9>0.5, 0.5=0.5 -> .5, 0.5>0.1) = 3.5 / 4
    assert dt.auroc([0.9, 0.5], [0.5, 0.1]) == pytest.approx(3.5 / 4)


def test_auroc_matches_pair_counting_on_random_scores_with_ties():
    rng = np.random.default_rng(0)
    pos, neg = rng.integers(0, 5, 40) / 4, rng.integers(0, 5, 30) / 4  # many ties
    pairs = (pos[:, None] > neg[None, :]).mean() + 0.5 * (pos[:, None] == neg[None, :]).mean()
    assert dt.auroc(pos, neg) == pytest.approx(pairs)


def test_auroc_refuses_empty_or_nan():
    with pytest.raises(ValueError):
        dt.auroc([], [0.1])
    with pytest.raises(ValueError):
        dt.auroc([float("nan")], [0.1])


def test_auroc_se_shrinks_with_more_blocks_and_is_zero_at_perfection():
    assert dt.auroc_se(0.75, 100, 100) < dt.auroc_se(0.75, 25, 25)
    assert dt.auroc_se(1.0, 50, 50) == 0.0


# ----------------------------------------------------------------------------- words

def test_block_words_drop_the_words_cut_by_the_block_ends():
    assert cm.block_words("ing the King's lov'd o'er 'tis ki") == ["the", "king's", "lov'd", "o'er", "tis"]
    assert cm.block_words(" The king, 3 men_x. ") == ["the", "king", "men", "x"]
    assert cm.block_words("word") == []


def test_real_word_rate_and_distinct_2_on_hand_made_texts():
    vocab = {"the", "king", "is", "dead"}
    texts = [". the king is dead .", ". the kign is deda ."]
    rate, n = cm.real_word_rate(texts, vocab)
    assert (rate, n) == (6 / 8, 8)
    d2, n_bi = cm.distinct_2(texts)
    # bigrams: (the,king) (king,is) (is,dead) | (the,kign) (kign,is) (is,deda): 6 distinct of 6
    assert (d2, n_bi) == (1.0, 6)
    d2, n_bi = cm.distinct_2([". a b a b a b ."])  # (a,b) (b,a) (a,b) (b,a) (a,b): 2 distinct of 5
    assert (d2, n_bi) == (2 / 5, 5)
    assert cm.real_word_rate(["..."], vocab) == (0.0, 0)
    assert cm.distinct_2(["... x ..."]) == (0.0, 0)


def test_lexicon_baseline_fit_on_a_hand_made_case():
    # y0 = 1 - feature exactly on train: the fit finds a = 1, b = -1
    mae, a, b = dt.fit_lexicon_baseline([0.0, 0.5, 1.0], [1.0, 0.5, 0.0], [0.25, 0.2], [0.75, 0.5])
    assert (a, b) == (pytest.approx(1.0), pytest.approx(-1.0))
    assert mae == pytest.approx((0.0 + 0.3) / 2)
    # predictions are clipped to [0, 1]: y0 = 2 - 2f predicts 2 at f = 0 -> clipped to 1
    mae, a, b = dt.fit_lexicon_baseline([0.5, 1.0], [1.0, 0.0], [0.0], [1.0])
    assert (a, b, mae) == (pytest.approx(2.0), pytest.approx(-2.0), pytest.approx(0.0))
    assert cm.non_word_share(". the kign is .", {"the", "is"}) == pytest.approx(1 / 3)
    assert cm.non_word_share("...", {"the"}) == 0.0


def test_verdict_lines_name_the_better_arm_or_no_difference_never_a_tie():
    v = cm.verdict("val perplexity", 6.5, 6.8, "lower", 0.03, "0.5 %")
    assert v.startswith("val perplexity: adversarial arm better by 0.3000")
    v = cm.verdict("real-word rate", 0.50, 0.51, "higher", 0.02, "2 SE")
    assert v.startswith("real-word rate: no difference past noise") and "tie" not in v
    v = cm.verdict("AUROC", 0.9, 0.6, "closer", 0.05, "2 SE", target=0.5)
    assert v.startswith("AUROC: control arm better by 0.3000")
    # equal shares of 0 (or 1) show no difference, not a win by 0.000
    v = cm.verdict("degenerate share", 0.0, 0.0, "lower", cm.binomial_noise(0.0, 16, 0.0, 16), "2 SE")
    assert "no difference past noise" in v
    assert cm.binomial_noise(0.5, 100, 0.5, 100) == pytest.approx(2 * math.sqrt(0.005))
    assert cm.binomial_noise(0.0, 10, 1.0, 10) == pytest.approx(2 * math.sqrt(2 * 0.05 * 0.95 / 10))


# ----------------------------------------------------------------------------- samples and measures

@pytest.fixture(scope="module")
def tiny(tiny_char_ckpt):
    return tiny_char_ckpt["data_dir"], tiny_char_ckpt["ckpt"]


def test_samples_are_fixed_and_start_from_the_natural_blocks(tiny):
    from lib.checkpoint import load_model
    data_dir, ckpt = tiny
    model, _, _ = load_model(ckpt)
    val = cm.val_tokens(data_dir)
    nat = cm.natural_blocks(val, 10, 16, seed=3)
    a = cm.generated_blocks(model, val, 10, 16, seed=3, batch_size=4)
    b = cm.generated_blocks(model, val, 10, 16, seed=3, batch_size=10)
    assert a.shape == (10, 16) and (a == b).all()  # the same samples however they are batched
    assert (a[:, 0] == nat[:, 0]).all()
    assert not (a == nat).all()
    assert not (cm.generated_blocks(model, val, 10, 16, seed=4) == a).all()


def test_evaluate_generator_and_reference(tiny):
    data_dir, ckpt = tiny
    ev = cm.evaluate_generator(ckpt, data_dir, n_samples=16, sample_len=24, seed=0)
    ref = cm.natural_reference(data_dir, 16, 24, seed=0)
    for d in (ev, ref):
        for k in ("real_word_rate", "distinct_2", "degenerate_share"):
            assert 0.0 <= d[k] <= 1.0 and math.isfinite(d[k]), k
        assert d["samples"] == 16 and d["words"] > 0
    # the natural val text (made of a 21-word vocabulary) is all real words
    assert ref["real_word_rate"] == 1.0
    assert ev["real_word_rate"] < ref["real_word_rate"]
    assert ev["val_ppl"] == pytest.approx(math.exp(ev["val_loss"]))
    loss, _ = cm.val_perplexity(ckpt, data_dir, "cpu", 8)
    assert loss == ev["val_loss"]
    with pytest.raises(Exception, match="evaluation window"):
        cm.evaluate_generator(ckpt, data_dir, n_samples=4, eval_block_size=64)


def test_one_corpus_serves_every_measurement(tiny, monkeypatch):
    """A Corpus opened once gives the same numbers as the data directory path, and opens its
    tokenizer and each split once for all the measurements of an evaluation."""
    from lib import corpus as corpus_module
    from lib.corpus import Corpus
    data_dir, ckpt = tiny
    ev_path = cm.evaluate_generator(ckpt, data_dir, n_samples=8, sample_len=24, seed=1)
    ref_path = cm.natural_reference(data_dir, 8, 24, seed=1)
    opened = []
    real = corpus_module.TokenizationManager  # the name Corpus.tokenizer calls
    monkeypatch.setattr(corpus_module, "TokenizationManager",
                        lambda *a, **k: opened.append(a) or real(*a, **k))
    corpus = Corpus(data_dir)
    ev = cm.evaluate_generator(ckpt, corpus, n_samples=8, sample_len=24, seed=1)
    ref = cm.natural_reference(corpus, 8, 24, seed=1)
    assert ev == ev_path and ref == ref_path
    assert len(opened) == 1 and set(corpus._memmaps) == {"val"}
    assert cm.train_vocabulary(corpus) is corpus.cache["train_vocabulary"] and cm.val_tokens(corpus) is corpus.val


def test_train_vocabulary_is_the_train_splits_words(tiny, monkeypatch):
    data_dir, _ = tiny
    vocab = cm.train_vocabulary(data_dir)
    # the tiny corpus: lower-case train words, speaker names included
    assert {"the", "king", "romeo", "doth"} <= vocab
    assert all(w == w.lower() for w in vocab)
    assert cm.train_vocabulary(data_dir) is vocab  # cached
    # read in chunks, a word cut at a chunk's end is carried into the next: the same set
    tok = cm.corpus_tokenizer(data_dir)
    whole = set(cm.text_words(tok.decode(np.fromfile(os.path.join(data_dir, "train.bin"), np.uint16).tolist())))
    assert vocab == whole
    monkeypatch.setattr(cm, "VOCAB_CHUNK", 7)
    cm._vocab_cached.cache_clear()
    try:
        assert cm.train_vocabulary(data_dir) == whole
    finally:
        cm._vocab_cached.cache_clear()


# ----------------------------------------------------------------------------- the figure

@pytest.mark.parametrize("cycles", [1, 2, 12])
def test_cycle_summary_figure_has_integer_cycle_ticks(cycles):
    """Whole cycles only on the cycle axes, also for a panel with one point (the GRPO panels of a
    one-cycle run) and for many cycles."""
    import matplotlib.pyplot as plt

    from core.plots import cycle_summary_figure
    gens = [{"cycle": 0, "arm": "base", "val_ppl": 6.7, "real_word_rate": 0.5, "distinct_2": 0.8,
             "degenerate_share": 0.0, "det_val_mae": 0.24, "det_const_mae": 0.25, "det_lexicon_mae": 0.16,
             "det_auroc": 0.55, "det_curve": [[0, 0.25, 0.25], [100, 0.24, 0.25]]}]
    for n in range(1, cycles + 1):
        for arm in ("adversarial", "control"):
            gens.append({**gens[0], "cycle": n, "arm": arm, "val_ppl": 6.7 + 0.1 * n,
                         "grpo_reward_start": 0.5, "grpo_reward_end": 0.52, "grpo_kl_final": 0.01})
    fig, axes = cycle_summary_figure(gens, {"real_word_rate": 0.94, "distinct_2": 0.9, "degenerate_share": 0.0})
    fig.canvas.draw()
    assert len(axes) == 8
    for ax in axes:
        lo, hi = ax.get_xlim()
        ticks = [t for t in ax.get_xticks() if lo <= t <= hi]
        assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks), ticks
    plt.close(fig)


def test_measure_detector_reuses_known_samples_and_the_reward_models_val_predictions(tiny, tmp_path):
    """run_cycles hands measure_detector the generator's sweep samples (T = 1) and train_reward_model.py
    writes its best checkpoint's val P(natural): the same figures as sampling and scoring again."""
    import train_reward_model
    from helpers import write_reward_split
    from lib.checkpoint import load_model
    from reward_dataset_loader import RewardDataset
    from tokenization_manager import TokenizationInfo
    data_dir, ckpt = tiny
    model, _, _ = load_model(ckpt)
    val, N, n = cm.val_tokens(data_dir), 32, 12
    info = TokenizationInfo("char", model.config.vocab_size, os.path.join(data_dir, "meta.pkl"))
    rd = str(tmp_path / "rd")
    for split, seed in (("train", 5), ("val", 6)):  # natural blocks with a generated tail after K = 8 or 24
        rows = np.concatenate([cm.generated_blocks(model, val, 20, N, seed, prompt_len=k) for k in (8, 24)])
        write_reward_split(rd, split, rows, np.repeat([[0.25, 0.75], [0.75, 0.25]], 20, axis=0), info)
    rm = str(tmp_path / "rm")
    # pinned to CPU float32: the bits of the cached-feature path and the full forward agree there (on a GPU,
    # or under autocast, other batch shapes choose other kernels)
    flags = ["--model_path", ckpt, "--data_dir", rd, "--out_dir", rm, "--max_iters", "4", "--eval_interval", "2",
             "--batch_size", "16", "--per_position", "--lm_features", "--unfreeze_last_n_blocks", "0",
             "--tensorboard_dir", "none", "--device", "cpu"]
    train_reward_model.main(flags + ["--dtype", "float32"])
    det, _, _ = load_model(os.path.join(rm, "reward_ckpt.pt"))
    saved = np.load(os.path.join(rm, "val_predictions.npy"))
    scored = dt.detector_scores(det, RewardDataset(rd, "val").x)
    assert saved.dtype == np.float32 and saved.shape == (40,)
    np.testing.assert_allclose(saved, scored, rtol=0, atol=1e-6)
    syn = cm.generated_blocks(model, val, n, N, 0)
    reused = dt.measure_detector(rm, rd, ckpt, data_dir, n_blocks=n, known_blocks={(n, N, 0): syn})
    # the file is what is read (predictions of 0 give errors K/N), unless it is of other val samples
    np.save(os.path.join(rm, "val_predictions.npy"), np.zeros(40, np.float32))
    zeros = dt.measure_detector(rm, rd, ckpt, data_dir, n_blocks=n, known_blocks={(n, N, 0): syn})
    assert zeros["val_mae_se"] == pytest.approx(np.std([0.25] * 20 + [0.75] * 20, ddof=1) / math.sqrt(40))
    path = os.path.join(rm, "reward_summary.json")
    summary = json.loads(open(path).read())
    with open(path, "w") as f:
        json.dump({**summary, "val_predictions_x_sha256": "0" * 64}, f)
    other = dt.measure_detector(rm, rd, ckpt, data_dir, n_blocks=n, known_blocks={(n, N, 0): syn})
    assert other["val_mae_se"] == pytest.approx(reused["val_mae_se"], rel=1e-5)
    os.remove(os.path.join(rm, "val_predictions.npy"))
    fresh = dt.measure_detector(rm, rd, ckpt, data_dir, n_blocks=n, known_blocks={(n + 1, N, 0): syn})
    assert reused["val_mae_se"] == pytest.approx(fresh["val_mae_se"], rel=1e-5)
    # predictions made at another precision are not this measurement's: a float32 one scores the split
    # itself, one under the same autocast reuses them (the GPU's default: bfloat16 training)
    bf16 = str(tmp_path / "rm_bf16")
    train_reward_model.main([*flags[:5], bf16, *flags[6:], "--dtype", "bfloat16"])
    assert json.loads(open(os.path.join(bf16, "reward_summary.json")).read())["dtype"] == "bfloat16"
    np.save(os.path.join(bf16, "val_predictions.npy"), np.zeros(40, np.float32))  # what reuse would read
    at32 = dt.measure_detector(bf16, rd, ckpt, data_dir, n_blocks=n, known_blocks={(n, N, 0): syn})
    with torch.autocast("cpu", dtype=torch.bfloat16):
        at16 = dt.measure_detector(bf16, rd, ckpt, data_dir, n_blocks=n, known_blocks={(n, N, 0): syn})
    assert at16["val_mae_se"] == pytest.approx(zeros["val_mae_se"]) != at32["val_mae_se"]
    assert {k: v for k, v in reused.items() if k != "val_mae_se"} == {k: v for k, v in fresh.items() if k != "val_mae_se"}
    # detectors on one frozen trunk share the head's input for the natural blocks: the same AUROC
    cache = {}
    for _ in range(2):
        shared = dt.measure_detector(rm, rd, ckpt, data_dir, n_blocks=n, feature_cache=cache)
        assert shared["auroc"] == fresh["auroc"] and len(cache) == 1
    det, _, _ = load_model(os.path.join(rm, "reward_ckpt.pt"))
    nat = cm.natural_blocks(val, n, N, 0)
    assert (dt.natural_scores(det, nat, cache=cache, key=("natural", n, N, 0)) == dt.detector_scores(det, nat)).all()
    with torch.no_grad():
        det.transformer.wte.weight.mul_(1.5)  # another trunk: features of its own, not the cached ones
    assert (dt.natural_scores(det, nat, cache=cache, key=("natural", n, N, 0)) == dt.detector_scores(det, nat)).all()
    assert len(cache) == 1 and next(iter(cache))[1] == dt.trunk_digest(det)  # only the latest trunk's are kept
    # the known blocks are what the AUROC reads: natural text in their place changes it
    other = dt.measure_detector(rm, rd, ckpt, data_dir, n_blocks=n,
                                known_blocks={(n, N, 0): cm.natural_blocks(val, n, N, 0)})
    assert other["auroc"] == 0.5
    # the mechanism: the generator's own train text (the lexicon's corpus' train split), not the val blocks
    from lib.corpus import Corpus
    det, _, _ = load_model(os.path.join(rm, "reward_ckpt.pt"))
    seen, mech = cm.natural_blocks(Corpus(data_dir).train, n, N, 0), fresh["mechanism"]
    assert mech["train"]["surprisal"] == pytest.approx(dt.block_surprisal(model, seen).mean())
    assert mech["val"]["surprisal"] == pytest.approx(dt.block_surprisal(model, nat).mean())
    assert mech["generated"]["surprisal"] == pytest.approx(dt.block_surprisal(model, syn).mean())
    assert mech["train"]["surprisal"] != mech["val"]["surprisal"]
    assert mech["memorised_auroc"] == dt.auroc(dt.detector_scores(det, seen), dt.detector_scores(det, nat))
    assert len(mech["val"]["points"]) == n
    # the heldout arm's generator trained on a part of the train split: its mechanism's train text is that part
    from experiment import cycle0
    fit = cycle0.heldout_dirs(data_dir, str(tmp_path / "run"), 0.5)[0]
    part = dt.measure_detector(rm, rd, ckpt, data_dir, n_blocks=n, known_blocks={(n, N, 0): syn}, seen_data=fit)
    mine = cm.natural_blocks(Corpus(fit).train, n, N, 0)
    assert part["seen_text"] == os.path.abspath(fit) and fresh["seen_text"] == os.path.abspath(data_dir)
    assert part["mechanism"]["train"]["surprisal"] == pytest.approx(dt.block_surprisal(model, mine).mean())
    assert part["mechanism"]["train"]["surprisal"] != mech["train"]["surprisal"]
    assert part["mechanism"]["val"] == mech["val"] and part["auroc"] == fresh["auroc"]


def test_the_mechanism_shows_a_detector_that_rewards_memorised_text():
    """A detector whose P(natural) falls with the generator's surprisal, where the generator knows its train text
    better than val text: memorised_auroc near 1 (it calls the memorised text more natural), a negative
    correlation over natural text; one that scores train and val text alike reads 0.5."""
    rng = np.random.default_rng(0)
    s = {"train": rng.normal(1.2, 0.1, 200), "val": rng.normal(2.0, 0.1, 200), "generated": rng.normal(2.3, 0.1, 200)}
    m = dt.mechanism({k: (1 / (1 + np.exp(4 * (v - 1.8))), v) for k, v in s.items()})
    assert m["memorised_auroc"] > 0.99 and m["corr_natural"] < -0.9
    assert m["train"]["p_natural"] > m["val"]["p_natural"] > m["generated"]["p_natural"]
    assert m["train"]["surprisal"] == pytest.approx(s["train"].mean()) and len(m["train"]["points"]) == 64
    flat = dt.mechanism({k: (np.full(200, 0.5), v) for k, v in s.items()})
    assert flat["memorised_auroc"] == 0.5 and flat["corr_natural"] == 0.0
