"""Every heavy script under torchrun with 2 CPU processes (gloo), against the same job in
one process: identical files for reward-data generation, the same loss trajectory for the
three training scripts (each step sees the same data whatever the process count)."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from helpers import (REWARD_FILES, live_processes, prepare_alphabet_data, run_script, train_gameable_reward,
                     train_tiny_checkpoint)

pytestmark = pytest.mark.slow
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")


def torchrun(script, *argv, nproc=2, timeout=300):
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc_per_node={nproc}", script, *map(str, argv)],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout)


def single(script, *argv, timeout=300):
    """The one-process reference, forked warm (helpers.run_script); torchrun's processes start fresh."""
    return run_script([script, *argv], cwd=ROOT, env=ENV, timeout=timeout)


def survivors(marker):
    """pids of running processes whose command line mentions `marker`."""
    return [pid for pid, _, cmd in live_processes() if marker in cmd]


def ok(r):
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


def records(path, kind_key=None):
    with open(path) as f:
        return [json.loads(line) for line in f]


def close(a, b, rel=1e-4, abs_=1e-6):
    return abs(a - b) <= abs_ + rel * abs(b)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dist")
    data_dir = prepare_alphabet_data(tmp)
    ckpt = train_tiny_checkpoint(data_dir, str(tmp / "base.pt"), steps=30)
    return dict(tmp=tmp, data=data_dir, ckpt=ckpt)


# ----------------------------------------------------------------------------- train.py

def test_train_two_processes_match_one_and_resume_across_world_sizes(base, tmp_path):
    args = ["--data_dir", base["data"], "--n_layer", 2, "--n_head", 2, "--n_embd", 32, "--block_size", 32,
            "--batch_size", 4, "--gradient_accumulation_steps", 2, "--eval_interval", 5, "--eval_iters", 4,
            "--log_interval", 1, "--learning_rate", 1e-2, "--warmup_iters", 2, "--lr_decay_iters", 20,
            "--patience", 0, "--device", "cpu"]
    ok(single("train.py", *args, "--max_iters", 20, "--out_dir", tmp_path / "one"))
    r = ok(torchrun("train.py", *args, "--max_iters", 10, "--out_dir", tmp_path / "two"))
    assert "2 process(es)" in r.stdout and r.stdout.count("tokens per iteration") == 1  # rank 0 logs alone
    # the 2-process run's checkpoint, continued by 1 process, ends where the 1-process run ends
    ok(single("train.py", *args, "--max_iters", 20, "--out_dir", tmp_path / "two", "--init_from", "resume"))

    one, two = records(tmp_path / "one" / "metrics.jsonl"), records(tmp_path / "two" / "metrics.jsonl")
    key = lambda r: (r["step"], "val_loss" in r)  # noqa: E731
    assert [key(r) for r in one] == [key(r) for r in two]  # every record once: only rank 0 writes
    for a, b in zip(one, two):
        for k in ("loss", "train_loss", "val_loss"):
            if k in a:
                assert close(a[k], b[k]), (a, b)
    w1 = torch.load(tmp_path / "one" / "last.pt", weights_only=True, map_location="cpu")
    w2 = torch.load(tmp_path / "two" / "last.pt", weights_only=True, map_location="cpu")
    assert w1["iter_num"] == w2["iter_num"] == 20
    for k, v in w1["model"].items():
        torch.testing.assert_close(w2["model"][k], v, rtol=1e-4, atol=1e-5)
    # tb/: the TensorBoard events rank 0 writes by default (test_tracking checks their contents)
    assert sorted(os.listdir(tmp_path / "two")) == [".lock", "ckpt.pt", "last.pt", "metrics.jsonl", "tb",
                                                    "train_summary.json"]


@pytest.mark.parametrize("script,flag", [("train.py", "--gradient_accumulation_steps"),
                                         ("train_reward_model.py", "--batch_size"),
                                         ("train_grpo.py", "--prompts_per_step")])
def test_totals_not_divisible_by_processes_are_refused(base, tmp_path, script, flag):
    out = tmp_path / "x"
    common = ["--device", "cpu", "--out_dir", out, flag, 3]
    if script == "train.py":
        argv = ["--data_dir", base["data"], "--n_layer", 1, "--n_head", 1, "--n_embd", 16, "--block_size", 16,
                "--max_iters", 1]
    elif script == "train_reward_model.py":
        argv = ["--model_path", base["ckpt"], "--data_dir", base["tmp"] / "checked_later"]
    else:
        argv = ["--model_path", base["ckpt"], "--reward_model_path", base["ckpt"], "--data_dir", base["data"]]
    r = torchrun(script, *argv, *common)
    assert r.returncode != 0
    assert f"error: {flag} 3 is not divisible by the 2 processes (it is the total per step)" in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr.split("error:")[0]
    assert not [f for f in os.listdir(out) if f.endswith((".pt", ".json", ".jsonl"))] if out.exists() else True


# ----------------------------------------------------------------------------- prepare_reward_data.py

def reward_args(base, out, *extra):
    return ["--model_path", base["ckpt"], "--input_mode", "binary",
            "--train_bin", os.path.join(base["data"], "train.bin"), "--val_bin", os.path.join(base["data"], "val.bin"),
            "--samples_per_chunk", 4, "--gen_batch_size", 16, "--device", "cpu", "--output_dir", out, *extra]


def read_reward(out):
    return {f: (out / f).read_bytes() for f in REWARD_FILES}


@pytest.fixture(scope="module")
def reward_one(base):
    out = base["tmp"] / "reward_one"
    ok(single("prepare_reward_data.py", *reward_args(base, out)))
    return out


def test_sharded_reward_data_is_byte_identical(base, reward_one, tmp_path):
    out = tmp_path / "two"
    r = ok(torchrun("prepare_reward_data.py", *reward_args(base, out)))
    assert r.stdout.count("=== Reward dataset complete ===") == 1
    assert read_reward(out) == read_reward(reward_one)
    for split in ("train", "val"):  # metadata too, except its time stamp
        strip = lambda p: [ln for ln in p.read_text().splitlines() if not ln.startswith("created:")]  # noqa: E731
        assert strip(out / f"{split}_metadata.txt") == strip(reward_one / f"{split}_metadata.txt")


def _bits(path):
    try:
        return int(np.unpackbits(np.frombuffer(path.read_bytes(), dtype=np.uint8)).sum())
    except OSError:
        return 0


def test_sharded_reward_data_killed_then_resumed_is_byte_identical(base, reward_one, tmp_path):
    """kill -9 the whole torchrun job mid-split, finish with --resume under 2 processes,
    then once more with 1 process after a second kill: the files equal the 1-process run."""
    out = tmp_path / "killed"
    argv = reward_args(base, out, "--gen_batch_size", 4)
    done = out / "train_done.tmp"
    for attempt, extra in enumerate(([], ["--resume"])):
        p = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                              "prepare_reward_data.py", *map(str, argv), *extra], cwd=ROOT, env=ENV,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        start, t0 = _bits(done), time.time()
        while p.poll() is None and _bits(done) < start + 40 and time.time() - t0 < 120:
            time.sleep(0.01)
        os.killpg(p.pid, signal.SIGKILL)  # the launcher; its workers live in sessions of their own
        p.wait()
        t0 = time.time()
        while survivors(str(out)) and time.time() - t0 < 1:  # the kernel's SIGKILL: at once
            time.sleep(0.05)
        assert not survivors(str(out)), "torchrun workers outlived their killed launcher"
        assert not (out / "train_metadata.txt").exists(), "killed before train finished, yet it looks complete"
        assert 0 < _bits(done) < (5400 // 32) * 4, f"attempt {attempt}: not interrupted mid-split"
    ok(single("prepare_reward_data.py", *argv, "--resume"))  # another world size finishes the job
    assert read_reward(out) == read_reward(reward_one)


# ----------------------------------------------------------------------------- train_reward_model.py

def test_reward_model_two_processes_match_one(base, reward_one, tmp_path):
    args = ["--model_path", base["ckpt"], "--data_dir", reward_one, "--max_iters", 12, "--eval_interval", 6,
            "--log_interval", 1, "--learning_rate", 3e-3, "--batch_size", 16, "--device", "cpu"]
    ok(single("train_reward_model.py", *args, "--out_dir", tmp_path / "one"))
    r = ok(torchrun("train_reward_model.py", *args, "--out_dir", tmp_path / "two"))
    assert "world size 2" in r.stdout
    # the frozen trunk is cached under torchrun too (every process its own copy of the train split, rank 0,
    # which evaluates, the val split), not recomputed every step; only rank 0 shows the progress bars
    bars = [r.stderr.count(f"caching the frozen blocks ({s}) (0 MiB in memory): 100%") for s in ("train", "val")]
    assert "cached once" in r.stdout and bars == [1, 1], (bars, r.stderr[-2000:])
    one, two = records(tmp_path / "one" / "metrics.jsonl"), records(tmp_path / "two" / "metrics.jsonl")
    assert [(r["kind"], r["step"]) for r in one] == [(r["kind"], r["step"]) for r in two]
    for a, b in zip(one, two):
        for k in ("train_loss", "val_loss", "val_mae"):
            if k in a:
                assert close(a[k], b[k]), (a, b)
    assert len({r["train_loss"] for r in one if r["kind"] == "train"}) > 5  # it really trained on varied batches
    s1 = json.loads((tmp_path / "one" / "reward_summary.json").read_text())
    s2 = json.loads((tmp_path / "two" / "reward_summary.json").read_text())
    assert s1["best_iter"] == s2["best_iter"] and close(s1["val_loss"], s2["val_loss"])


# ----------------------------------------------------------------------------- train_grpo.py

def test_grpo_two_processes_match_one(base, tmp_path):
    reward = train_gameable_reward(base["data"], str(tmp_path / "reward.pt"))
    args = ["--model_path", base["ckpt"], "--reward_model_path", reward, "--data_dir", base["data"],
            "--max_steps", 6, "--group_size", 4, "--eval_interval", 3, "--eval_max_batches", 2,
            "--learning_rate", 3e-3, "--beta", 0.01, "--patience", 0, "--kl_cap", 0, "--prompts_per_step", 4,
            "--device", "cpu"]
    ok(single("train_grpo.py", *args, "--out_dir", tmp_path / "one"))
    ok(torchrun("train_grpo.py", *args, "--out_dir", tmp_path / "two"))
    one, two = records(tmp_path / "one" / "metrics.jsonl"), records(tmp_path / "two" / "metrics.jsonl")
    assert [(r["kind"], r["step"]) for r in one] == [(r["kind"], r["step"]) for r in two]
    steps = [(a, b) for a, b in zip(one, two) if a["kind"] == "step"]
    assert len({round(a["reward_mean"], 6) for a, _ in steps}) > 1  # a non-trivial reward
    for a, b in steps:
        assert a["prompt_len"] == b["prompt_len"]
        for k in ("reward_mean", "reward_std", "kl", "loss"):
            assert close(a[k], b[k], rel=1e-3, abs_=1e-5), (k, a, b)
    for a, b in zip(one, two):
        if a["kind"] == "eval":
            assert close(a["val_loss"], b["val_loss"], rel=1e-4)
    # only rank 0 tracks: one TensorBoard event file under torchrun, as with one process
    assert len(os.listdir(tmp_path / "two" / "tb")) == len(os.listdir(tmp_path / "one" / "tb")) == 1


# ----------------------------------------------------------------------------- run_cycles.py

def test_run_cycles_under_torchrun_matches_one_process(base, tmp_path):
    def run(out, nproc):
        return ok(single("run_cycles.py", "--preset", "quick", "--out_dir", out, "--data_dir", base["data"],
                         "--base_ckpt", base["ckpt"], "--judge_ckpt", base["ckpt"], "--max_cycles", 1, "--device", "cpu",
                         "--nproc_per_node", nproc, "--detector", "frozen_last_token",
                         # cycle 1's steps, the control MLE among them, are what runs under torchrun;
                         # the later detectors are the same scripts again
                         "--no_control_detector", "--no_final_detector", "--quality_samples", 16,
                         "--detect_blocks", 16, "--temps", "0.8,1.0",
                         "--extra_reward_data=--max_blocks_per_split 8 --samples_per_chunk 2 --gen_batch_size 16",
                         "--extra_reward_model=--max_iters 8 --eval_interval 4 --batch_size 4",
                         "--extra_grpo=--max_steps 2 --prompts_per_step 2 --group_size 4 --eval_interval 2"))
    run(tmp_path / "one", 1)
    r = run(tmp_path / "two", 2)
    assert "torch.distributed.run --standalone --nproc_per_node=2 prepare_reward_data.py" in r.stdout
    rd = "cycle_1/reward_data"
    assert read_reward(tmp_path / "one" / rd) == read_reward(tmp_path / "two" / rd)
    c1 = json.loads((tmp_path / "one" / "summary.json").read_text())["cycles"][0]
    c2 = json.loads((tmp_path / "two" / "summary.json").read_text())["cycles"][0]
    for k, v in c1.items():
        if isinstance(v, float) and "second" not in k and "time" not in k:
            # abs 1e-4: a correlation near 0 (a chance-level detector) differs by rounding in absolute terms
            assert close(v, c2[k], rel=1e-3, abs_=1e-4), (k, v, c2[k])
