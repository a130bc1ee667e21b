"""Every training script's step under mixed precision, on CPU: an explicit --dtype bfloat16 or float16
autocasts there too (common.autocast_context), float16 with its gradient scaler, which runs the same
dtype logic as CUDA autocast. Each case runs a few steps at --dtype float32 and at the lower
precision from the same seed: the low-precision run must finish with finite figures within that
precision's rounding of the float32 run's, and must differ from it (autocast really ran)."""
import math
import os
import sys

import numpy as np
import pytest
import torch

from core.files import read_jsonl
from helpers import write_reward_split
from lib.checkpoint import load_model
from reward_dataset_loader import RewardDataset
from tokenization_manager import TokenizationInfo

LOW = ["bfloat16", pytest.param("float16", marks=pytest.mark.slow)]  # the unit tier runs bfloat16
TOL = {"bfloat16": 0.05, "float16": 0.01}  # relative: a few of that precision's rounding steps


@pytest.fixture(scope="module")
def pipeline(tiny_char_ckpt, tmp_path_factory):
    """The session's tiny generator, a reward dataset of its own samples (crossovers at K = 8 and
    24 of 32, made in float32), and a per-position and a last-token reward model briefly trained on it."""
    import train_reward_model
    from experiment.measures import generated_blocks, val_tokens
    tmp = tmp_path_factory.mktemp("amp")
    gen, data_dir = tiny_char_ckpt["ckpt"], tiny_char_ckpt["data_dir"]
    model, _, _ = load_model(gen)
    info = TokenizationInfo("char", model.config.vocab_size, tiny_char_ckpt["meta"])
    rd, val = str(tmp / "rd"), val_tokens(data_dir)
    for split, seed in (("train", 5), ("val", 6)):
        rows = np.concatenate([generated_blocks(model, val, 24, 32, seed, prompt_len=k) for k in (8, 24)])
        write_reward_split(rd, split, rows, np.repeat([[0.25, 0.75], [0.75, 0.25]], 24, axis=0), info)
    rm = str(tmp / "rm")
    train_reward_model.main(["--model_path", gen, "--data_dir", rd, "--out_dir", rm, "--max_iters", "6",
                             "--eval_interval", "6", "--batch_size", "16", "--per_position", "--device", "cpu",
                             "--dtype", "float32", "--tensorboard_dir", "none"])
    rm_last = str(tmp / "rm_last")
    train_reward_model.main(["--model_path", gen, "--data_dir", rd, "--out_dir", rm_last, "--max_iters", "6",
                             "--eval_interval", "6", "--batch_size", "16", "--learning_rate", "3e-2", "--device", "cpu",
                             "--dtype", "float32", "--tensorboard_dir", "none"])
    return dict(tmp=tmp, gen=gen, data_dir=data_dir, rd=rd, rm=os.path.join(rm, "reward_ckpt.pt"),
                rm_last=os.path.join(rm_last, "reward_ckpt.pt"))


def close(a, b, tol):
    return math.isfinite(a) and abs(a - b) <= tol * max(abs(b), 1e-3)


def records(out, kind):
    """metrics.jsonl's rows of one kind (train.py's rows have none: 'train' rows carry a loss, 'eval' ones a val_loss)."""
    rows = read_jsonl(os.path.join(out, "metrics.jsonl"))
    own = {"train": "loss", "eval": "val_loss"}
    return [r for r in rows if r.get("kind", kind if own.get(kind) in r else None) == kind]


def runs(tmp, name, dtype, run):
    """run(out_dir, dtype) at float32 and at dtype, once each per module -> {dtype: out_dir}."""
    outs = {}
    for d in ("float32", dtype):
        outs[d] = str(tmp / f"{name}-{d}")
        if not os.path.exists(os.path.join(outs[d], "done")):
            run(outs[d], d)
            open(os.path.join(outs[d], "done"), "w").close()
    return outs


def assert_near(low, ref, keys, tol):
    for k in keys:
        assert close(low[k], ref[k], tol), (k, low[k], ref[k])


FIGURES = ("loss", "train_loss", "val_loss", "val_mae", "reward_mean", "eval_reward", "entropy", "kl", "grad_norm",
           "margin")  # what a run computes (not its timings)


def assert_finite_and_not_float32(outs, dtype, name):
    """The low-precision run's checkpoint `name` is finite, and its logged figures are not all the
    float32 run's (the best checkpoint may be the untrained one in either)."""
    ck = torch.load(os.path.join(outs[dtype], name), weights_only=True, map_location="cpu")["model"]
    assert all(torch.isfinite(v).all() for v in ck.values() if v.is_floating_point())
    low, ref = ([{k: v for k, v in r.items() if k in FIGURES} for r in read_jsonl(os.path.join(outs[d], "metrics.jsonl"))]
                for d in (dtype, "float32"))
    assert low != ref, "the float32 run's figures: autocast did not run"


@pytest.mark.parametrize("dtype", LOW)
def test_train_py(pipeline, monkeypatch, dtype):
    import train

    def run(out, d):
        monkeypatch.setattr(sys, "argv", [
            "train.py", "--data_dir", pipeline["data_dir"], "--out_dir", out, "--device", "cpu", "--dtype", d,
            "--n_layer", "2", "--n_head", "2", "--n_embd", "32", "--block_size", "32", "--batch_size", "8",
            "--max_iters", "4", "--eval_interval", "4", "--eval_iters", "2", "--log_interval", "1",
            "--warmup_iters", "1", "--lr_decay_iters", "4", "--learning_rate", "3e-3", "--patience", "0",
            "--seed", "3", "--tensorboard_dir", "none"])
        train.main()
    outs = runs(pipeline["tmp"], "train", dtype, run)
    low, ref = (records(outs[d], "train") for d in (dtype, "float32"))
    assert [r["step"] for r in low] == [r["step"] for r in ref] == [0, 1, 2, 3]
    assert all(math.isfinite(r["loss"]) for r in low)
    assert_near(low[0], ref[0], ["loss"], TOL[dtype])
    assert_near(records(outs[dtype], "eval")[0], records(outs["float32"], "eval")[0], ["train_loss", "val_loss"],
                TOL[dtype])
    assert_finite_and_not_float32(outs, dtype, "last.pt")


DETECTORS = {"frozen_last_token": ["--unfreeze_last_n_blocks", "0"],
             "per_position": ["--per_position", "--unfreeze_last_n_blocks", "-1"],
             "strong_trunk": ["--per_position", "--lm_features", "--unfreeze_last_n_blocks", "0"]}


@pytest.mark.parametrize("detector", DETECTORS)
@pytest.mark.parametrize("dtype", LOW)
def test_train_reward_model(pipeline, detector, dtype):
    import train_reward_model

    def run(out, d):
        train_reward_model.main(["--model_path", pipeline["gen"], "--data_dir", pipeline["rd"], "--out_dir", out,
                                 "--max_iters", "4", "--eval_interval", "2", "--batch_size", "16",
                                 "--learning_rate", "3e-3", "--device", "cpu", "--dtype", d,
                                 "--tensorboard_dir", "none", *DETECTORS[detector]])
    outs = runs(pipeline["tmp"], f"rm-{detector}", dtype, run)
    low, ref = (records(outs[d], "eval") for d in (dtype, "float32"))
    assert [r["step"] for r in low] == [r["step"] for r in ref] == [0, 2, 4]
    assert all(math.isfinite(r["val_loss"]) for r in low)
    assert_near(low[0], ref[0], ["val_loss", "val_mae"], TOL[dtype])
    assert_finite_and_not_float32(outs, dtype, "reward_ckpt.pt")
    pred = np.load(os.path.join(outs[dtype], "val_predictions.npy"))
    assert pred.shape == (len(RewardDataset(pipeline["rd"], "val")),) and np.isfinite(pred).all()


GRPO_OPTIONS = {
    "default": [],
    "logit_kl_in_reward_mean": ["--reward", "logit", "--kl_in_reward", "--advantage", "mean", "--beta", "0.5"],
    "token_level": ["--reward_level", "token"],
    "ptx": ["--ptx_coef", "0.5"],
    "entropy_floor": ["--entropy_floor", "1.0"],
    "null_arm": ["--shuffle_rewards"],
    "two_updates_micro_batches": ["--num_updates_per_batch", "2", "--micro_batch_size", "4", "--temperature", "0.8"],
    "last_token_detector": ["--reward_model_path", "RM_LAST"],
}


@pytest.mark.parametrize("option", GRPO_OPTIONS)
@pytest.mark.parametrize("dtype", LOW)
def test_train_grpo(pipeline, option, dtype):
    """Each reward, advantage and loss option: GRPO's loss reads the completion only, so backward
    takes LinearLogprob's live-row path, which crashed under autocast."""
    import train_grpo
    extra = [pipeline["rm_last"] if a == "RM_LAST" else a for a in GRPO_OPTIONS[option]]

    def run(out, d):
        train_grpo.main(["--model_path", pipeline["gen"], "--reward_model_path", pipeline["rm"], "--out_dir", out,
                         "--prompts_per_step", "2", "--group_size", "4", "--max_steps", "2", "--learning_rate", "1e-3",
                         "--eval_interval", "2", "--eval_max_batches", "2", "--eval_reward_samples", "8",
                         "--patience", "0", "--reward_threshold", "0", "--kl_cap", "0", "--device", "cpu",
                         "--dtype", d, "--tensorboard_dir", "none", *extra])
    outs = runs(pipeline["tmp"], f"grpo-{option}", dtype, run)
    low, ref = (records(outs[d], "step") for d in (dtype, "float32"))
    assert [r["step"] for r in low] == [r["step"] for r in ref] == [1, 2]
    for r in low:
        assert all(math.isfinite(r[k]) for k in ("loss", "reward_mean", "kl", "entropy", "grad_norm")), r
        # where the step's time went (sampling, scoring, update) adds up to the step
        assert min(r["rollout_s"], r["score_s"], r["update_s"]) >= 0
        assert r["rollout_s"] + r["score_s"] + r["update_s"] == pytest.approx(r["step_time_s"], abs=1e-6)
    # step 1: the same prompts and noise; the policy has not moved, so its entropy and the rewards
    # of (almost always the same) samples agree to the precision's rounding
    assert close(low[0]["entropy"], ref[0]["entropy"], TOL[dtype])
    assert abs(low[0]["reward_mean"] - ref[0]["reward_mean"]) <= 0.1 * (1 + abs(ref[0]["reward_mean"]))
    evals = [records(outs[d], "eval")[0] for d in (dtype, "float32")]
    assert_near(evals[0], evals[1], ["val_loss", "eval_reward"], TOL[dtype])
    assert_finite_and_not_float32(outs, dtype, "ckpt.pt")


def test_grpo_scores_its_eval_samples_under_the_runs_autocast(pipeline, monkeypatch, tmp_path):
    """The eval's decoding and detector pass run at the rollouts' precision (8bd02d5 ran them in float32:
    on a GPU a second, float32 decoder with its cache, beside the bfloat16 one)."""
    import train_grpo
    seen, real = [], train_grpo.detector_score

    def recording(*a, **k):
        seen.append(torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None)
        return real(*a, **k)
    monkeypatch.setattr(train_grpo, "detector_score", recording)
    train_grpo.main(["--model_path", pipeline["gen"], "--reward_model_path", pipeline["rm"], "--out_dir",
                     str(tmp_path / "out"), "--prompts_per_step", "2", "--group_size", "4", "--max_steps", "1",
                     "--eval_interval", "1", "--eval_max_batches", "1", "--eval_reward_samples", "4", "--patience", "0",
                     "--reward_threshold", "0", "--kl_cap", "0", "--device", "cpu", "--dtype", "bfloat16",
                     "--tensorboard_dir", "none"])
    assert seen and all(d == torch.bfloat16 for d in seen), seen


@pytest.mark.parametrize("dtype", LOW)
def test_train_spin(pipeline, dtype):
    import train_spin

    def run(out, d):
        train_spin.main(["--model_path", pipeline["gen"], "--out_dir", out, "--device", "cpu", "--dtype", d,
                         "--prompts_per_step", "4", "--max_steps", "2", "--eval_interval", "2",
                         "--eval_max_batches", "2", "--eval_pairs", "8", "--learning_rate", "1e-3",
                         "--tensorboard_dir", "none"])
    outs = runs(pipeline["tmp"], "spin", dtype, run)
    low, ref = (records(outs[d], "step") for d in (dtype, "float32"))
    assert [r["step"] for r in low] == [r["step"] for r in ref] == [1, 2]
    for r in low:
        assert all(math.isfinite(r[k]) for k in ("loss", "margin", "grad_norm")), r
    # before any update the policy is the reference: the same log 2 loss at any precision
    assert low[0]["loss"] == pytest.approx(math.log(2), abs=1e-3)
    evals = [records(outs[d], "eval")[0] for d in (dtype, "float32")]
    assert_near(evals[0], evals[1], ["val_loss"], TOL[dtype])
    assert_finite_and_not_float32(outs, dtype, "ckpt.pt")


@pytest.mark.parametrize("dtype", LOW)
def test_the_temperature_sweep_and_the_detector_measurement(pipeline, dtype):
    """run_cycles' own measurements under autocast (its --dtype): the frontier's sweep (val NLL at every
    temperature through logprobs_at_temperatures, samples, the judge's NLL) and a detector's measurement,
    finite and within the precision's rounding of float32's where no sample changed (val NLL, the judge on
    the same samples)."""
    from experiment import detection as dt, frontier, measures as cm
    model, _, _ = load_model(pipeline["gen"])
    ref = frontier.sweep(model, pipeline["data_dir"], [0.7, 1.0], 16, 32, 0, judge=model, keep_examples=True)
    ptdtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    with torch.autocast("cpu", dtype=ptdtype):
        low = frontier.sweep(model, pipeline["data_dir"], [0.7, 1.0], 16, 32, 0, judge=model, keep_examples=True)
        same = cm.judge_nll(model, cm.generated_blocks(model, cm.val_tokens(pipeline["data_dir"]), 16, 32, 0,
                                                       temperature=1.0), "cpu")
        det = dt.measure_detector(os.path.dirname(pipeline["rm"]), pipeline["rd"], pipeline["gen"],
                                  pipeline["data_dir"], n_blocks=8)
    for t in (0.7, 1.0):
        assert close(low[t]["val_loss"], ref[t]["val_loss"], TOL[dtype]) and low[t]["val_loss"] != ref[t]["val_loss"]
        assert all(math.isfinite(v) for v in low[t]["judge_items"]) and 0 <= low[t]["real_word_rate"] <= 1
    assert np.isfinite(same).all() and abs(float(same.mean()) - low[1.0]["judge_nll"]) < 1e-9
    assert 0 <= det["auroc"] <= 1 and math.isfinite(det["val_mae_se"])
