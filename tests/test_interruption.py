"""Interruption and recovery: kill -9 at seeded random points, rerun, same result as one run.

train.py and run_cycles.py run as real processes and are SIGKILLed at moments drawn from a
seeded generator. train.py: once each, in random order, after a random delay (imports, data
checks, model loading), at a random later write of a checkpoint (the n-th *.tmp file), while
the best model ckpt.pt is being written, and once metrics.jsonl has grown by a random number
of records (mid-training). run_cycles.py: once per stage of the pipeline, a random 0-0.3 s
after a randomly chosen progress file of that stage appears; the kill hits the whole process
group or only run_cycles itself (`kill -9 PID`); either way its current step, in a process group of
its own, dies with run_cycles. After every kill, whatever carries a final name must be
complete; rerunning the same command (with resume) until it finishes must give exactly
what one uninterrupted run gives. prepare_reward_data.py is killed at start-up, mid-generation
and during a split's final rename, alone and as a step of run_cycles.py; its resumed output
must be byte-identical.
"""
import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from core.files import read_jsonl, sha256_file
from helpers import REWARD_FILES, live_processes, make_text, prepare_char_data, run_script, tiny_train_config
from lib.checkpoint import read_checkpoint

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, OMP_NUM_THREADS="1")
TIMING_KEYS = {"time", "elapsed_s", "tokens_per_s", "samples_per_s", "gen_tokens_per_s", "step_time_s",
               "rollout_s", "score_s", "update_s", "seconds", "seconds_this_invocation"}


# ----------------------------------------------------------------------------- killing

def tmp_files(root):
    return {os.path.join(d, f) for d, _, files in os.walk(root) for f in files if f.endswith(".tmp")}


def n_lines(path):
    try:
        with open(path, "rb") as f:
            return f.read().count(b"\n")
    except OSError:
        return 0


def run_alive(pgid, out):
    """True while a process of group pgid, or one writing under `out` (a step of run_cycles, in a
    process group of its own), is still running."""
    return any(g == pgid or out in cmd for _, g, cmd in live_processes())


def out_dir_of(args):
    """The directory a command writes (its --out_dir or --output_dir)."""
    return next(args[i + 1] for i, a in enumerate(args) if a in ("--out_dir", "--output_dir"))


def run_and_kill(args, rng, triggers, log_path, parent_only_share=0.0, timeout=180):
    """Run `python args...`; SIGKILL it when a trigger drawn with `rng` fires.

    triggers: {name: make(rng) -> fire(elapsed_s) -> bool}. The kill hits the whole process
    group (a crash, the OOM killer on the job), or with probability parent_only_share only
    the started process (`kill -9 PID`): its orphaned children then end on their own (or at
    their next output line, on the broken pipe) and we wait for them before going on.
    Returns a description of the kill if it landed, None if the process finished first
    (it must have succeeded then)."""
    name = rng.choice(sorted(triggers))
    fire = triggers[name](rng)
    parent_only = rng.random() < parent_only_share
    what = f"{name}, {'parent only' if parent_only else 'process group'}"
    with open(log_path, "a") as log:
        log.write(f"\n$ {' '.join(args)}  [kill: {what}]\n")
        log.flush()
        p = subprocess.Popen([sys.executable, *args], cwd=ROOT, env=ENV, stdout=log,
                             stderr=subprocess.STDOUT, start_new_session=True)
        t0 = time.time()
        try:
            while p.poll() is None:
                if fire(time.time() - t0):
                    (os.kill if parent_only else os.killpg)(p.pid, signal.SIGKILL)
                    p.wait()
                    break
                assert time.time() - t0 < timeout, f"{args[0]} did not finish in {timeout}s"
                time.sleep(0.001)
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
            t1 = time.time()
            while run_alive(p.pid, out_dir_of(args)):  # no process of the run may still be writing
                assert time.time() - t1 < 60, "an orphaned step kept running after its parent was killed"
                time.sleep(0.01)
    if p.returncode == -signal.SIGKILL:
        return what
    assert p.returncode == 0, open(log_path).read()[-3000:]
    return None


def start_reference(args, log_path):
    """The uninterrupted run, in the background alongside the interrupted one (its own
    directory, one thread each)."""
    with open(log_path, "w") as log:
        return subprocess.Popen([sys.executable, *args], cwd=ROOT, env=ENV, stdout=log, stderr=subprocess.STDOUT)


def run_to_end(args, log_path, timeout=300):
    """The last run, uninterrupted (forked warm: helpers.run_script; the killed ones start fresh, to land in
    their imports too)."""
    r = run_script(args, cwd=ROOT, env=ENV, timeout=timeout)
    with open(log_path, "a") as log:
        log.write(f"\n$ {' '.join(args)}\n{r.stdout}{r.stderr}")
    assert r.returncode == 0, open(log_path).read()[-3000:]


def after_delay(lo, hi, progress=None):
    """Kill after a random delay: lands in imports, data checks, model loading or early work. With
    `progress` (a metrics.jsonl), at its first new record if that comes sooner: a resumed run may have
    less than the delay left to do (train.py's whole training here is under a second, its start-up
    two), and a delay past its end would kill nothing."""
    def make(rng):
        t, start = rng.uniform(lo, hi), n_lines(progress) if progress else 0
        return lambda elapsed: elapsed >= t or (progress is not None and n_lines(progress) > start)
    return make


def during_write(root, max_nth=1):
    """Kill as soon as the n-th new *.tmp file (n random) shows up: in the middle of an atomic write."""
    def make(rng):
        before, nth, seen = tmp_files(root), rng.randint(1, max_nth), set()

        def fire(elapsed):
            seen.update(tmp_files(root) - before)
            return len(seen) >= nth
        return fire
    return make


def during_best_write(out, lo, hi):
    """Kill while ckpt.pt (the best model) is being written, at a random later evaluation."""
    def make(rng):
        metrics = os.path.join(out, "metrics.jsonl")
        before, target = tmp_files(out), n_lines(metrics) + rng.randint(lo, hi)
        return lambda elapsed: n_lines(metrics) >= target and any(
            os.path.basename(f).startswith("ckpt.pt.") for f in tmp_files(out) - before)
    return make


def after_records(path, lo, hi):
    """Kill once `path` (a metrics.jsonl) has grown by a random number of lines."""
    def make(rng):
        target = n_lines(path) + rng.randint(lo, hi)
        return lambda elapsed: n_lines(path) >= target
    return make


def after_file(root, names, max_extra=0.3):
    """Kill a random short while after a randomly chosen, not yet written progress file appears."""
    def make(rng):
        todo = [n for n in names if not os.path.exists(os.path.join(root, n))] or names[-1:]
        path, extra = os.path.join(root, rng.choice(todo)), rng.uniform(0, max_extra)
        seen = []

        def fire(elapsed):
            if not seen and os.path.exists(path):
                seen.append(elapsed)
            return bool(seen) and elapsed >= seen[0] + extra
        return fire
    return make


# ----------------------------------------------------------------------------- checks

def assert_finite_weights(ckpt, path):
    for k, v in ckpt["model"].items():
        assert torch.isfinite(v).all(), f"{path}: {k} holds nan/inf"


def assert_same_tensors(a, b, what):
    assert a.keys() == b.keys(), what
    for k in a:
        assert torch.equal(a[k], b[k]), f"{what}: {k} differs"


def assert_same_optimizer(a, b, what):
    assert a["param_groups"] == b["param_groups"], what
    assert a["state"].keys() == b["state"].keys(), what
    for i in a["state"]:
        assert_same_tensors(a["state"][i], b["state"][i], f"{what} state {i}")


def check_jsonl(path):
    """Every complete line parses; only a last line without its newline may be torn (and
    read_jsonl skips it)."""
    if not os.path.exists(path):
        return
    with open(path, "rb") as f:
        text = f.read().decode()
    *complete, _last = text.split("\n")
    for line in complete:
        json.loads(line)
    parsed = read_jsonl(path)
    assert len(parsed) in (len(complete), len(complete) + 1), path


def without(rec, keys):
    if isinstance(rec, dict):
        return {k: without(v, keys) for k, v in rec.items() if k not in keys}
    if isinstance(rec, list):
        return [without(v, keys) for v in rec]
    return rec


# ----------------------------------------------------------------------------- train.py

TRAIN_FLAGS = ["--device", "cpu", "--dtype", "float32", "--n_layer", "2", "--n_head", "2", "--n_embd", "32",
               "--block_size", "32", "--batch_size", "8", "--max_iters", "300", "--lr_decay_iters", "300",
               "--warmup_iters", "10", "--learning_rate", "3e-3", "--min_lr", "3e-4", "--eval_interval", "10",
               "--eval_iters", "2", "--log_interval", "1", "--patience", "2", "--min_delta", "0.05",
               "--seed", "5"]


def check_train_dir(out):
    """What a kill may leave: final names only for complete checkpoints, maybe *.tmp files."""
    names = set(os.listdir(out)) if os.path.isdir(out) else set()
    allowed = {"ckpt.pt", "last.pt", "metrics.jsonl", "train_summary.json", ".lock", "tb"}
    assert {n for n in names if not n.endswith(".tmp")} <= allowed, names
    tb = os.path.join(out, "tb")  # TensorBoard's event files (core/tracking.py), nothing else
    assert not os.path.isdir(tb) or all(n.startswith("events.out.tfevents.") for n in os.listdir(tb)), os.listdir(tb)
    ckpts = {n: read_checkpoint(os.path.join(out, n)) for n in ("ckpt.pt", "last.pt") if n in names}
    for n, c in ckpts.items():
        assert_finite_weights(c, n)
        assert c["iter_num"] % 10 == 0, (n, c["iter_num"])
    if "ckpt.pt" in ckpts:
        assert ckpts["ckpt.pt"]["iter_num"] == ckpts["ckpt.pt"]["best_iter"]
    if len(ckpts) == 2:  # the best-model file is never behind what last.pt records as the best
        assert ckpts["ckpt.pt"]["iter_num"] >= ckpts["last.pt"]["best_iter"], (
            ckpts["ckpt.pt"]["iter_num"], ckpts["last.pt"]["best_iter"])
    check_jsonl(os.path.join(out, "metrics.jsonl"))


def train_args(data_dir, out, resume):
    return ["train.py", "--data_dir", data_dir, "--out_dir", out,
            "--init_from", "resume" if resume else "scratch"] + TRAIN_FLAGS


def has_ckpt(out):
    return any(os.path.exists(os.path.join(out, n)) for n in ("last.pt", "ckpt.pt"))


def test_train_kill_9_at_random_points_then_resume_equals_one_run(tmp_path):
    _, data_dir = prepare_char_data(str(tmp_path / "corpus"), text=make_text(20000, seed=1))
    ref, out, log = str(tmp_path / "ref"), str(tmp_path / "killed"), str(tmp_path / "train.log")
    ref_run = start_reference(train_args(data_dir, ref, False), tmp_path / "ref.log")

    rng = random.Random(3)
    triggers = {"delay": after_delay(0.2, 3.0, os.path.join(out, "metrics.jsonl")),
                "checkpoint write": during_write(out, 12),
                "best-model write": during_best_write(out, 1, 80),
                "mid-training": after_records(os.path.join(out, "metrics.jsonl"), 1, 150)}
    landed = []
    for name in rng.sample(sorted(triggers), len(triggers)):  # each kind once, in random order
        landed.append(run_and_kill(train_args(data_dir, out, has_ckpt(out)), rng, {name: triggers[name]}, log))
        check_train_dir(out)
    assert sum(x is not None for x in landed) >= 2, landed
    run_to_end(train_args(data_dir, out, True), log)  # finish (or find it finished)
    check_train_dir(out)
    assert ref_run.wait(timeout=300) == 0, (tmp_path / "ref.log").read_text()[-3000:]

    for name in ("ckpt.pt", "last.pt"):
        a, b = read_checkpoint(os.path.join(ref, name)), read_checkpoint(os.path.join(out, name))
        for key in ("iter_num", "best_iter", "best_val_loss", "early_stopping"):
            assert a[key] == b[key], (name, key, a[key], b[key])
        assert_same_tensors(a["model"], b["model"], name)  # resume is bit-exact by design
        assert_same_optimizer(a["optimizer"], b["optimizer"], name)
    recs_ref = without(read_jsonl(os.path.join(ref, "metrics.jsonl")), TIMING_KEYS)
    recs = without(read_jsonl(os.path.join(out, "metrics.jsonl")), TIMING_KEYS)
    assert [r for r in recs if "val_loss" in r] == [r for r in recs_ref if "val_loss" in r]
    assert recs == recs_ref  # the per-iteration training losses too

    # the finished run (here: stopped early) resumed once more changes nothing
    last = read_checkpoint(os.path.join(out, "last.pt"))
    assert last["iter_num"] < 300, "choose settings where early stopping ends the run"
    digests = {n: sha256_file(os.path.join(out, n)) for n in ("ckpt.pt", "last.pt")}
    run_to_end(train_args(data_dir, out, True), log)
    assert {n: sha256_file(os.path.join(out, n)) for n in digests} == digests
    assert without(read_jsonl(os.path.join(out, "metrics.jsonl")), TIMING_KEYS) == recs_ref


# ----------------------------------------------------------------------------- prepare_reward_data.py

def done_bits(path):
    try:
        with open(path, "rb") as f:
            return int(np.unpackbits(np.frombuffer(f.read(), dtype=np.uint8)).sum())
    except OSError:
        return 0


def mid_generation(out, split, total):
    """Kill once a random number of further samples of a split is done (the bitmap of
    finished samples grows)."""
    def make(rng):
        path = os.path.join(out, f"{split}_done.tmp")
        now = done_bits(path)
        target = now + rng.randint(1, max(1, total - now - 1))
        return lambda elapsed: done_bits(path) >= target
    return make


def finalizing(out):
    """Kill as soon as a random split's X file is renamed into place: between the renames,
    before the metadata that declares the split complete."""
    def make(rng):
        path = os.path.join(out, f"{rng.choice(['train', 'val'])}_x.bin")
        return lambda elapsed: os.path.exists(path)
    return make


def test_prepare_reward_data_kill_9_in_random_phases_then_resume_is_byte_identical(tmp_path):
    """Beyond test_prepare_reward_data's two kills mid-generation: also during start-up and
    while a finished split is being renamed into place and described."""
    import prepare_reward_data as prd
    from helpers import train_tiny_checkpoint
    text, data_dir = prepare_char_data(str(tmp_path / "corpus"), text=make_text(10000, seed=4))
    ckpt = train_tiny_checkpoint(data_dir, str(tmp_path / "base.pt"), steps=20, block_size=32)
    out = str(tmp_path / "killed")

    def argv(o):
        return ["--model_path", ckpt, "--input_mode", "binary", "--train_bin", os.path.join(data_dir, "train.bin"),
                "--val_bin", os.path.join(data_dir, "val.bin"), "--output_dir", o, "--samples_per_chunk", "8",
                "--gen_batch_size", "16", "--device", "cpu"]
    S_train = (9000 // 32) * 8
    rng = random.Random(11)
    triggers = {"delay": after_delay(0.3, 2.5), "mid-generation": mid_generation(out, "train", S_train),
                "finalizing": finalizing(out)}
    log, landed = str(tmp_path / "prd.log"), []
    for name in ("delay", "mid-generation", "finalizing"):  # the phases in order, each at a random point
        resume = ["--resume"] if os.path.isdir(out) and os.listdir(out) else []
        landed.append(run_and_kill(["prepare_reward_data.py", *argv(out), *resume], rng, {name: triggers[name]}, log))
        for split in ("train", "val"):  # a split with metadata is complete and matches it
            meta_path = os.path.join(out, f"{split}_metadata.txt")
            if os.path.exists(meta_path):
                meta = dict(line.split(": ", 1) for line in open(meta_path).read().splitlines())
                for kind in ("x", "y"):
                    assert sha256_file(os.path.join(out, f"{split}_{kind}.bin")) == meta[f"{kind}_sha256"]
    assert sum(x is not None for x in landed) >= 2, landed
    run_to_end(["prepare_reward_data.py", *argv(out), "--resume"], log)
    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null), contextlib.redirect_stderr(null):
        prd.main(argv(str(tmp_path / "straight")))
    for f in ("train_x.bin", "train_y.bin", "val_x.bin", "val_y.bin"):
        with open(os.path.join(out, f), "rb") as a, open(os.path.join(tmp_path, "straight", f), "rb") as b:
            assert a.read() == b.read(), f
    # no progress file of an unfinished split is left; a kill inside an atomic write may leave
    # that write's own temporary `<name>.<8 random chars>.tmp` (never read by anything)
    for path in tmp_files(out):
        assert re.fullmatch(r".+\.[a-z0-9_]{8}\.tmp", os.path.basename(path)), path


# ----------------------------------------------------------------------------- run_cycles.py

CHECKPOINTS = ("cycle_0/base/ckpt.pt", "cycle_0/base/last.pt", "cycle_1/reward_model/reward_ckpt.pt",
               "cycle_1/reward_model/reward_last.pt", "cycle_1/grpo/ckpt.pt")
# kill k waits for a random one of STAGES[k] to appear, then a random 0-0.3 s more: so the kills
# spread over the pipeline (base training; reward data and reward model; GRPO and the end)
STAGES = [["cycle_0/base/ckpt.pt", "cycle_0/base/last.pt", "cycle_0/base/metrics.jsonl", "cycle_0/base.done.json"],
          ["cycle_1/reward_data/train_done.tmp", "cycle_1/reward_data/val_done.tmp", "cycle_1/reward_data.done.json",
           "cycle_1/reward_model/metrics.jsonl", "cycle_1/reward_model/reward_last.pt"],
          ["cycle_1/reward_model.done.json", "cycle_1/grpo/metrics.jsonl", "cycle_1/grpo/ckpt.pt",
           "cycle_1/grpo.done.json"]]


def cycles_args(data_dir, cfg, out):
    return ["run_cycles.py", "--preset", "quick", "--out_dir", out, "--data_dir", data_dir,
            "--base_config", cfg, "--max_cycles", "1", "--device", "cpu", "--eval_batch_size", "16",
            "--detector", "frozen_last_token",  # no detector trunk to train: the kills target the cycle
            # the later detectors repeat cycle 1's steps; the control arm stays
            "--no_control_detector", "--no_final_detector", "--quality_samples", "32", "--detect_blocks", "32",
            "--extra_reward_data=--max_blocks_per_split 40 --samples_per_chunk 4 --gen_batch_size 32",
            # a detector that gets better than the constant 0.5, so GRPO's rewards (and updates) are not all equal
            "--extra_reward_model=--max_iters 40 --eval_interval 5 --batch_size 16 --log_interval 5 "
            "--learning_rate 3e-3 --unfreeze_last_n_blocks 2 --patience 0 --min_delta 0",
            "--extra_grpo=--max_steps 8 --prompts_per_step 2 --group_size 4 --learning_rate 1e-3 "
            "--eval_interval 2 --save_interval 1 --eval_max_batches 2"]


def check_cycles_dir(out):
    """Everything under a final name is complete: checkpoints load, done records parse,
    a split of the reward dataset with metadata matches the hashes the metadata records."""
    for name in CHECKPOINTS:
        path = os.path.join(out, name)
        if os.path.exists(path):
            assert_finite_weights(read_checkpoint(path), name)
    for d, _, files in os.walk(out):
        for f in files:
            if f.endswith(".json"):
                with open(os.path.join(d, f)) as fh:
                    json.load(fh)
            if f == "metrics.jsonl":
                check_jsonl(os.path.join(d, f))
    rd = os.path.join(out, "cycle_1", "reward_data")
    for split in ("train", "val"):
        meta_path = os.path.join(rd, f"{split}_metadata.txt")
        if os.path.exists(meta_path):
            meta = dict(line.split(": ", 1) for line in open(meta_path).read().splitlines())
            for kind in ("x", "y"):
                assert sha256_file(os.path.join(rd, f"{split}_{kind}.bin")) == meta[f"{kind}_sha256"]


def normalised_json(path, out):
    with open(path) as f:
        text = f.read().replace(os.path.abspath(out), "<OUT>").replace(out, "<OUT>")
    return without(json.loads(text), TIMING_KEYS)


def test_run_cycles_kill_9_at_random_points_then_rerun_equals_one_run(tmp_path):
    _, data_dir = prepare_char_data(str(tmp_path / "corpus"), text=make_text(6000, seed=3))
    cfg = tmp_path / "tiny.py"
    cfg.write_text(tiny_train_config(max_iters=40, log_interval=5, patience=0))
    ref, out, log = str(tmp_path / "ref"), str(tmp_path / "killed"), str(tmp_path / "cycles.log")
    ref_run = start_reference(cycles_args(data_dir, str(cfg), ref), tmp_path / "ref.log")

    rng = random.Random(6)  # draws: prepare_reward_data starting, reward model training, GRPO training
    landed = []
    for k, stage in enumerate(STAGES):
        triggers = {f"stage {k}": after_file(out, stage, max_extra=0.3)}
        landed.append(run_and_kill(cycles_args(data_dir, str(cfg), out), rng, triggers, log, parent_only_share=0.4))
        check_cycles_dir(out)
    assert sum(x is not None for x in landed) >= 2, landed
    run_to_end(cycles_args(data_dir, str(cfg), out), log)
    check_cycles_dir(out)
    assert ref_run.wait(timeout=300) == 0, (tmp_path / "ref.log").read_text()[-3000:]

    for name in CHECKPOINTS:
        a, b = read_checkpoint(os.path.join(ref, name)), read_checkpoint(os.path.join(out, name))
        assert a.get("iter_num") == b.get("iter_num"), name
        assert_same_tensors(a["model"], b["model"], name)
    for f in REWARD_FILES:
        with open(os.path.join(ref, "cycle_1/reward_data", f), "rb") as fa, \
                open(os.path.join(out, "cycle_1/reward_data", f), "rb") as fb:
            assert fa.read() == fb.read(), f
    # the same metadata too, but for the base model's path (and so its file's hash) and the time
    differ = ("created:", "model_path:", "model_sha256:")
    for split in ("train", "val"):
        a, b = ([x for x in open(os.path.join(d, "cycle_1/reward_data", f"{split}_metadata.txt")).read().splitlines()
                 if not x.startswith(differ)] for d in (ref, out))
        assert a == b, split
    for f in ("cycle_0/base/metrics.jsonl", "cycle_1/reward_model/metrics.jsonl", "cycle_1/grpo/metrics.jsonl"):
        # (GRPO's eval records show decoded samples of the step before, which a resumed run has not got)
        a, b = (without(read_jsonl(os.path.join(d, f)), TIMING_KEYS | {"samples"}) for d in (ref, out))
        assert a == b, f
    for f in ("summary.json", "cycle_1/reward_model/reward_summary.json", "cycle_1/grpo/grpo_summary.json",
              "cycle_0/base.done.json", "cycle_1/reward_model.done.json", "cycle_1/grpo.done.json",
              "cycle_1/eval.done.json"):
        assert normalised_json(os.path.join(out, f), out) == normalised_json(os.path.join(ref, f), ref), f


# ----------------------------------------------------------------------------- a clean stop

STEP = """
import os, signal, subprocess, sys, time
here = os.path.dirname(os.path.abspath(__file__))
if os.path.exists(os.path.join(here, "again")):  # the rerun: the step starts again, then fails at once
    print("the step again", flush=True)
    sys.exit(3)
# a process of the step's own, as prepare.py's pip download is; a stubborn one ignores the stop signal
code = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); signal.signal(signal.SIGINT, "
        "signal.SIG_IGN); print('child', flush=True); time.sleep(300)") if sys.argv[1:] == ["stubborn"] else (
        "import time; print('child', flush=True); time.sleep(300)")
child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
child.stdout.readline()  # its signal dispositions are set
with open(os.path.join(here, "pids"), "w") as f:
    f.write(f"{os.getpid()} {child.pid}")
print("preparing", flush=True)
time.sleep(300)
"""


@pytest.mark.parametrize("sig, stubborn", [(signal.SIGINT, False), (signal.SIGTERM, True)])
def test_a_stopped_run_cycles_ends_the_steps_process_group_and_resumes(tmp_path, sig, stubborn):
    """Ctrl-C (SIGINT) or SIGTERM to run_cycles.py alone while a step runs (here the corpus'
    prepare.py, with a process of its own as its pip download has): the step's whole process group
    ends, a process that ignores the signal by SIGKILL after the grace period, and run_cycles exits
    with the interrupted message, no traceback; the same command then takes the directory again and
    reruns the step."""
    from experiment.runner import StepRunner
    data = tmp_path / "corpus"
    data.mkdir()
    (data / "prepare.py").write_text(STEP.replace("sys.argv[1:] == [\"stubborn\"]", repr(stubborn)))
    args = [sys.executable, "run_cycles.py", "--data_dir", str(data), "--out_dir", str(tmp_path / "run"),
            "--device", "cpu"]
    # Ctrl-C's handler even when this test runs with SIGINT ignored (a background job)
    p = subprocess.Popen(args, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        t0 = time.time()
        while not (data / "pids").exists():
            assert p.poll() is None and time.time() - t0 < 120, p.communicate()
            time.sleep(0.05)
        step, child = map(int, (data / "pids").read_text().split())
        t_signal = time.time()  # the stop is timed from the signal, not from the run's start (a slow start is no stop)
        os.kill(p.pid, sig)  # run_cycles alone: `kill PID`, or a terminal's Ctrl-C (the step has a group of its own)
        out, err = p.communicate(timeout=60)
        took = time.time() - t_signal
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == 128 + sig, (out, err)
    assert err.strip().endswith("interrupted; rerun with the same command (and --resume where offered) to "
                                 "continue") and "Traceback" not in err, err
    assert f"--- prepare data: stopped by {signal.Signals(sig).name} after " in out
    alive = {pid for pid, _, _ in live_processes()} & {step, child}
    for pid in alive:  # no litter when it fails
        os.kill(pid, signal.SIGKILL)
    assert not alive, "a process of the step outlived the stop"
    grace = StepRunner("unused").stop_grace
    assert (took >= grace) == stubborn  # the stubborn one waited for its SIGKILL
    (data / "again").write_text("")
    r = subprocess.run(args, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "in use" not in r.stderr, r.stderr
    assert "=== prepare data" in r.stdout and "the step again" in r.stdout
