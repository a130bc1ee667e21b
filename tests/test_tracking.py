"""Experiment tracking (core/tracking.py): TensorBoard event files read back with tensorboard's own
EventAccumulator, an offline W&B run, and the errors when a package a flag asks for is missing."""
import argparse
import glob
import importlib
import os
import sys

import pytest

from core import tracking
from core.errors import ProjectError
from core.files import read_jsonl
from helpers import make_reward_checkpoint, prepare_alphabet_data, train_tiny_checkpoint

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

TRAIN_TINY = ["--device", "cpu", "--dtype", "float32", "--n_layer", "1", "--n_head", "2", "--n_embd", "16",
              "--block_size", "16", "--batch_size", "4", "--eval_iters", "1", "--log_interval", "2",
              "--eval_interval", "4", "--warmup_iters", "1", "--lr_decay_iters", "8", "--max_iters", "8",
              "--patience", "0"]


def scalars(tb_dir):
    """{tag: [(step, value), ...]} of every event file under tb_dir."""
    acc = EventAccumulator(str(tb_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


@pytest.fixture(scope="module")
def alphabet(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tracking")
    return tmp, prepare_alphabet_data(tmp)


def run_train(monkeypatch, *args):
    import train
    monkeypatch.setattr(sys, "argv", ["train.py", *args])
    train.main()


def test_train_writes_tensorboard_events_by_default(alphabet, tmp_path, monkeypatch):
    _, data_dir = alphabet
    out = tmp_path / "out"
    run_train(monkeypatch, *TRAIN_TINY, "--data_dir", data_dir, "--out_dir", str(out))
    got = scalars(out / "tb")  # the default: OUT_DIR/tb
    rows = read_jsonl(str(out / "metrics.jsonl"))
    # every metrics row, with its iteration as the step
    assert [s for s, _ in got["loss"]] == [r["step"] for r in rows if "loss" in r] == [0, 2, 4, 6]
    assert [s for s, _ in got["val_loss"]] == [0, 4, 8]
    assert [v for _, v in got["val_loss"]] == pytest.approx([r["val_loss"] for r in rows if "val_loss" in r])
    assert {"lr", "tokens_per_s", "val_ppl", "best_val_loss"} <= set(got)
    assert "step" not in got and "time" not in got


def test_tensorboard_off_and_elsewhere(alphabet, tmp_path, monkeypatch):
    _, data_dir = alphabet
    run_train(monkeypatch, *TRAIN_TINY, "--data_dir", data_dir, "--out_dir", str(tmp_path / "a"),
              "--tensorboard_dir", "none", "--max_iters", "2")
    assert not (tmp_path / "a" / "tb").exists()
    run_train(monkeypatch, *TRAIN_TINY, "--data_dir", data_dir, "--out_dir", str(tmp_path / "b"),
              "--tensorboard_dir", str(tmp_path / "tb_b"), "--max_iters", "2")
    assert [s for s, _ in scalars(tmp_path / "tb_b")["val_loss"]] == [0, 2]


def test_missing_package_is_a_clear_error(monkeypatch, tmp_path):
    real = importlib.import_module

    def no_such(name, *a, **k):
        if name in ("tensorboard", "wandb"):
            raise ImportError(f"No module named {name!r}")
        return real(name, *a, **k)

    monkeypatch.setattr(tracking.importlib, "import_module", no_such)
    monkeypatch.setattr(tracking.importlib.util, "find_spec", lambda name, *a: None)
    parser = argparse.ArgumentParser()
    tracking.add_tracking_args(parser)
    args = parser.parse_args([])
    args.wandb_log = True
    args.tensorboard_dir = "none"
    with pytest.raises(ProjectError, match=r"--wandb_log needs the Python package 'wandb'") as e:
        tracking.open_tracker(args, str(tmp_path))
    assert "pip install wandb" in e.value.suggestion
    args.wandb_log, args.tensorboard_dir = False, str(tmp_path / "tb")
    with pytest.raises(ProjectError, match=r"--tensorboard_dir needs the Python package 'tensorboard'"):
        tracking.open_tracker(args, str(tmp_path))
    args.tensorboard_dir = "auto"  # the default adapts: no package, no events, no error
    t = tracking.open_tracker(args, str(tmp_path))
    assert t.tb is None and t.wandb is None and not (tmp_path / "tb").exists()


def test_tensorboard_dir_that_is_a_file_is_refused_at_set_up(tmp_path):
    """A file where the event directory should be: the flag is named, not SummaryWriter's FileExistsError."""
    parser = argparse.ArgumentParser()
    tracking.add_tracking_args(parser)
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(ProjectError, match=r"^--tensorboard_dir .*afile exists and is a file"):
        tracking.open_tracker(parser.parse_args(["--tensorboard_dir", str(afile)]), str(tmp_path))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "tb").write_text("x")  # the default's OUT_DIR/tb, the same
    with pytest.raises(ProjectError, match=r"^--tensorboard_dir .*tb exists and is a file"):
        tracking.open_tracker(parser.parse_args([]), str(tmp_path / "out"))
    t = tracking.open_tracker(parser.parse_args(["--tensorboard_dir", str(tmp_path / "new" / "tb")]), str(tmp_path))
    t.close()
    assert (tmp_path / "new" / "tb").is_dir()


@pytest.mark.slow  # W&B starts a service process
def test_wandb_offline_run_of_train(alphabet, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    _, data_dir = alphabet
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "out"
    # nanoGPT's spelling (--key=value), as its config files and command lines set them
    run_train(monkeypatch, *TRAIN_TINY, "--data_dir", data_dir, "--out_dir", str(out), "--max_iters", "4",
              "--wandb_log=True", "--wandb_project=tiny", "--wandb_run_name=r1", "--wandb_group", "g")
    runs = glob.glob(str(out / "wandb" / "offline-run-*"))
    assert len(runs) == 1, os.listdir(out)
    assert glob.glob(os.path.join(runs[0], "run-*.wandb")), os.listdir(runs[0])


def test_grpo_logs_what_a_researcher_watches(alphabet, tmp_path):
    """The RL curves (reward mean and std, KL, entropy, clip fraction, zero-spread share, grad
    norm, tokens/s) and GRPO's val loss, as run_cycles' steps write them."""
    import train_grpo
    tmp, data_dir = alphabet
    gen = train_tiny_checkpoint(data_dir, str(tmp_path / "gen.pt"), steps=2, block_size=16, n_layer=1, n_embd=16)
    rm = make_reward_checkpoint(gen, str(tmp_path / "rm.pt"))
    out, tb = tmp_path / "grpo", tmp_path / "tb" / "1_grpo"
    train_grpo.main(["--device", "cpu", "--model_path", gen, "--reward_model_path", rm, "--out_dir", str(out),
                     "--prompts_per_step", "2", "--group_size", "2", "--max_steps", "3", "--eval_interval", "3",
                     "--patience", "0", "--kl_cap", "0", "--eval_reward_samples", "2",
                     "--tensorboard_dir", str(tb)])
    got = scalars(tb)
    for name in ("reward_mean", "reward_std", "kl", "entropy", "clip_frac", "zero_spread_frac", "grad_norm",
                 "tokens_per_s"):
        assert [s for s, _ in got[f"step/{name}"]] == [1, 2, 3], name
    rows = [r for r in read_jsonl(str(out / "metrics.jsonl")) if r["kind"] == "step"]
    assert [v for _, v in got["step/kl"]] == pytest.approx([r["kl"] for r in rows])
    assert [s for s, _ in got["eval/val_loss"]] == [0, 3]


def test_run_cycles_gives_each_step_a_tensorboard_dir_and_the_run_one_wandb_group(tmp_path):
    from types import SimpleNamespace

    import run_cycles
    from experiment.run import Run
    args = run_cycles.parse_args(["--out_dir", str(tmp_path / "run"), "--wandb_log", "--wandb_project", "p"])
    run = SimpleNamespace(out_dir=str(tmp_path / "run"), args=args, tb_root=str(tmp_path / "run" / "tb"),
                          wandb_group="run")
    flags = Run.track(run, str(tmp_path / "run" / "cycle_1" / "control" / "mle"))
    assert flags == ["--tensorboard_dir", str(tmp_path / "run" / "tb" / "cycle_1_control_mle"), "--wandb_log", "True",
                     "--wandb_project", "p", "--wandb_group", "run", "--wandb_run_name", "cycle_1_control_mle"]
    run.tb_root, args.wandb_log = None, False  # --tensorboard_dir none: the steps write none either
    assert Run.track(run, str(tmp_path / "run" / "cycle_1" / "grpo")) == ["--tensorboard_dir", "none"]
