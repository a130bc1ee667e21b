"""train_spin.py end to end on a tiny trained char model, both objectives (SPIN and DDO): outputs,
self-play rounds, learning direction, bit-exact resume and bad inputs."""
import json
import math
import os

import pytest
import torch

from core.cli import run_cli
from core.files import read_jsonl
from engine import Engine
from helpers import make_reward_checkpoint, prepare_char_data, run_script, train_tiny_checkpoint
from lib.checkpoint import load_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("spin")
    _, data_dir = prepare_char_data(str(tmp / "corpus"))
    ckpt = train_tiny_checkpoint(data_dir, str(tmp / "gen.pt"), steps=30, block_size=32)
    return {"tmp": tmp, "data_dir": data_dir, "gen": ckpt}


def argv_for(base, out, *extra):
    return ["--model_path", base["gen"], "--out_dir", str(out), "--device", "cpu", "--prompts_per_step", "8",
            "--eval_max_batches", "2", "--eval_pairs", "16", "--learning_rate", "1e-3", *extra]


@pytest.mark.slow
def test_three_steps_write_a_generator_checkpoint_and_summary(base):
    import train_spin
    out = base["tmp"] / "three"
    train_spin.main(argv_for(base, out, "--max_steps", "3", "--eval_interval", "2", "--micro_batch_size", "3"))
    model, ck, _ = load_model(str(out / "ckpt.pt"), require_mode="generator")
    assert ck["data"] == torch.load(base["gen"], weights_only=True, map_location="cpu")["data"] and ck["tokenization"]
    assert ck["config"]["beta"] == 0.1 and ck["spin"]["finished"] and ck["iter_num"] == 3
    seqs = Engine(model).generate(torch.zeros((2, 1), dtype=torch.long), 8, seed=0)  # a working generator
    assert seqs.shape == (2, 9)
    s = json.loads((out / "spin_summary.json").read_text())
    assert s["steps"] == s["updates"] == 3 and s["stop_reason"] == "max_steps" and s["seq_len"] == 32
    recs = read_jsonl(str(out / "metrics.jsonl"))
    steps = [r for r in recs if r["kind"] == "step"]
    # the budget: generated tokens are the rejected continuations, natural ones whole windows
    assert s["completion_tokens"] == sum(8 * (32 - r["prompt_len"]) for r in steps)
    assert s["natural_tokens"] == 3 * 8 * 32
    for k in ("learning_rate", "weight_decay", "beta1", "beta2", "grad_clip", "val_loss_after",
              "eval_margin_end", "margin_end"):
        assert isinstance(s[k], (int, float)) and math.isfinite(s[k]), k
    for k in ("loss", "margin", "accuracy", "reward_chosen", "reward_rejected", "grad_norm"):
        assert all(math.isfinite(r[k]) for r in steps), k
    assert all(1 <= r["prompt_len"] <= 16 for r in steps)
    assert [r["step"] for r in recs if r["kind"] == "eval"] == [0, 2, 3]
    # before any update the policy is the reference: margin 0, loss log 2
    assert steps[0]["margin"] == pytest.approx(0.0, abs=1e-5) and steps[0]["loss"] == pytest.approx(math.log(2))


@pytest.mark.slow
def test_spin_moves_the_policy_toward_natural_continuations(base):
    import train_spin
    out = base["tmp"] / "learn"
    train_spin.main(argv_for(base, out, "--max_steps", "6", "--eval_interval", "6", "--learning_rate", "3e-3"))
    s = json.loads((out / "spin_summary.json").read_text())
    # on fixed val pairs the policy now prefers the natural continuation more than the reference does
    assert s["eval_margin_start"] == pytest.approx(0.0, abs=1e-5)
    assert s["eval_margin_end"] > 0.05, s
    steps = [r for r in read_jsonl(str(out / "metrics.jsonl")) if r["kind"] == "step"]
    assert steps[-1]["margin"] > steps[0]["margin"] + 0.05 and steps[-1]["loss"] < math.log(2)


@pytest.mark.slow
def test_ddo_rounds_move_the_reference_to_the_policy_and_draw_fresh_pairs(base):
    import train_spin
    out = base["tmp"] / "ddo"
    train_spin.main(argv_for(base, out, "--objective", "ddo", "--rounds", "3", "--max_steps", "7",
                             "--eval_interval", "7", "--ddo_alpha", "2", "--ddo_beta", "0.5"))
    s = json.loads((out / "ddo_summary.json").read_text())
    assert not (out / "spin_summary.json").exists()
    assert s["objective"] == "ddo" and s["rounds"] == 3 and s["ddo_alpha"] == 2.0 and s["ddo_beta"] == 0.5
    assert s["round_starts"] == [0, 2, 4] and s["updates"] == 7 and s["natural_tokens"] == 7 * 8 * 32
    recs = read_jsonl(str(out / "metrics.jsonl"))
    assert [(r["step"], r["end"]) for r in recs if r["kind"] == "round"] == [(0, 2), (2, 4), (4, 7)]
    steps = [r for r in recs if r["kind"] == "step"]
    for r in steps:
        if r["step"] - 1 in s["round_starts"]:
            # a round's first update sees the policy as its own reference: every logit 0, so the
            # loss is (1 + alpha) log 2 (the reference was moved to the policy, its samples fresh)
            assert r["loss"] == pytest.approx(3 * math.log(2), abs=1e-5) and r["margin"] == pytest.approx(0, abs=1e-5)
        else:
            assert abs(r["loss"] - 3 * math.log(2)) > 1e-4
    ck = torch.load(out / "ckpt.pt", weights_only=True, map_location="cpu")
    assert ck["spin"]["objective"] == "ddo" and ck["spin"]["finished"] and ck["spin"]["pool"] == []
    assert s["completion_tokens"] == sum(8 * (32 - r["prompt_len"]) for r in steps)


@pytest.mark.slow
def test_ddo_moves_the_policy_toward_natural_continuations(base):
    """Each step's loss is taken on fresh pairs before its update: from the first step on, a
    held-out test of the discriminator the policy has become. One round: the reference stays."""
    import train_spin
    out = base["tmp"] / "ddo_learn"
    train_spin.main(argv_for(base, out, "--objective", "ddo", "--max_steps", "6", "--eval_interval", "6"))
    steps = [r for r in read_jsonl(str(out / "metrics.jsonl")) if r["kind"] == "step"]
    assert steps[0]["margin"] == pytest.approx(0.0, abs=1e-5)
    late = steps[-3:]
    assert min(r["margin"] for r in late) > 0.5 and max(r["loss"] for r in late) < 2 * math.log(2)
    assert sum(r["accuracy"] for r in late) / 3 > 0.6


# (name, flags, steps, killed at this update, the round's pairs the checkpoint keeps): it resumes from
# the save at step kill - 1. SPIN (one round); DDO at a round's start (the new round's reference is
# the restored policy) and inside a round (its pairs come from the checkpoint: its reference is gone)
DDO2 = ["--objective", "ddo", "--rounds", "2"]
RESUMES = [("spin", [], 4, 3, 2), ("ddo at a round's start", DDO2, 4, 3, 0), ("ddo inside a round", DDO2, 6, 5, 2)]


@pytest.mark.slow
@pytest.mark.parametrize("name,flags,steps,kill,pool_left", RESUMES, ids=[r[0] for r in RESUMES])
def test_interrupted_and_resumed_equals_straight_run_bit_exact(base, monkeypatch, name, flags, steps, kill, pool_left):
    import train_spin
    a, b = base["tmp"] / f"straight {name}", base["tmp"] / f"resumed {name}"
    common = ["--max_steps", str(steps), "--eval_interval", "3", "--save_interval", "2", *flags]
    train_spin.main(argv_for(base, a, *common))
    real, calls = train_spin.train_step, {"n": 0}

    def killed(*args, **kw):
        calls["n"] += 1
        if calls["n"] == kill:
            raise KeyboardInterrupt
        return real(*args, **kw)

    monkeypatch.setattr(train_spin, "train_step", killed)
    with pytest.raises(KeyboardInterrupt):
        train_spin.main(argv_for(base, b, *common))
    monkeypatch.setattr(train_spin, "train_step", real)
    saved = torch.load(b / "ckpt.pt", weights_only=True, map_location="cpu")["spin"]
    assert saved["step"] == kill - 1
    assert len(saved["pool"]) == pool_left  # the round's remaining pairs, and only those
    train_spin.main(argv_for(base, b, *common, "--resume"))
    sa, sb = (torch.load(d / "ckpt.pt", weights_only=True, map_location="cpu") for d in (a, b))
    assert sa["spin"]["step"] == sb["spin"]["step"] == steps
    assert sa["spin"]["round_starts"] == sb["spin"]["round_starts"] == ([0, steps // 2] if flags else [0])
    for k, v in sa["model"].items():
        assert torch.equal(v, sb["model"][k]), k
    ma, mb = ([{k: v for k, v in r.items() if k not in ("time", "tokens_per_s", "step_time_s")}
               for r in read_jsonl(str(d / "metrics.jsonl"))] for d in (a, b))
    assert ma == mb
    summary = "ddo_summary.json" if flags else "spin_summary.json"
    assert json.loads((a / summary).read_text())["completion_tokens"] == \
        json.loads((b / summary).read_text())["completion_tokens"]


@pytest.mark.slow
def test_a_larger_max_steps_continues_in_the_rounds_it_now_splits_into(base, capsys):
    import train_spin

    # one round: the reference stays the starting model, so 3 steps continued to 5 are 5 straight steps
    a, b = base["tmp"] / "five", base["tmp"] / "three then five"
    common = ["--eval_interval", "10", "--eval_pairs", "0"]
    train_spin.main(argv_for(base, a, "--max_steps", "5", *common))
    train_spin.main(argv_for(base, b, "--max_steps", "3", *common))
    train_spin.main(argv_for(base, b, "--max_steps", "5", "--resume", *common))
    sa, sb = (torch.load(d / "ckpt.pt", weights_only=True, map_location="cpu") for d in (a, b))
    assert sb["spin"]["step"] == 5 and sb["spin"]["round_starts"] == [0]
    for k, v in sa["model"].items():
        assert torch.equal(v, sb["model"][k]), k
    # DDO, 2 rounds of 4 steps continued to 6: step 4 lies inside the round [3, 6), whose reference
    # (the policy at step 3) is gone: a new round begins at step 4, and says so
    d = base["tmp"] / "ddo four then six"
    ddo = ["--objective", "ddo", "--rounds", "2", *common]
    train_spin.main(argv_for(base, d, "--max_steps", "4", *ddo))
    capsys.readouterr()
    train_spin.main(argv_for(base, d, "--max_steps", "6", "--resume", *ddo))
    assert "step 4 lies inside a round that began at step 3" in capsys.readouterr().out
    assert json.loads((d / "ddo_summary.json").read_text())["round_starts"] == [0, 2, 4]


@pytest.mark.slow  # a command line in a subprocess
def test_bad_inputs_give_clear_errors(base, capsys):
    rm = make_reward_checkpoint(base["gen"], str(base["tmp"] / "reward.pt"))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = run_script(["train_spin.py", "--model_path", rm, "--out_dir", str(base["tmp"] / "bad")], cwd=ROOT, env=env)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "is a reward checkpoint, but a generator checkpoint is needed here" in p.stderr
    import train_spin
    with pytest.raises(SystemExit) as e:
        run_cli(lambda: train_spin.main(argv_for(base, base["tmp"] / "bad2", "--data_dir",
                                                 str(base["tmp"] / "no_such_dir"))))
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--data_dir" in err and "no_such_dir is not a directory" in err and "train.bin/val.bin" in err
    with pytest.raises(SystemExit) as e:
        run_cli(lambda: train_spin.main(argv_for(base, base["tmp"] / "bad3", "--rounds", "5", "--max_steps", "4")))
    assert e.value.code == 2 and "--rounds must be in [1, --max_steps]" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:  # 0 is not the default length
        run_cli(lambda: train_spin.main(argv_for(base, base["tmp"] / "bad5", "--seq_len", "0")))
    assert e.value.code == 2 and "--seq_len 0 must be in [2, " in capsys.readouterr().err
    # a run's checkpoint resumes with its own objective only
    train_spin.main(argv_for(base, base["tmp"] / "bad4", "--max_steps", "1", "--eval_pairs", "0"))
    with pytest.raises(SystemExit) as e:
        run_cli(lambda: train_spin.main(argv_for(base, base["tmp"] / "bad4", "--max_steps", "2", "--objective", "ddo",
                                                 "--resume")))
    err = capsys.readouterr().err
    assert e.value.code == 2 and "is a spin run, not ddo" in err and "--objective spin" in err
