"""NaN/inf: train.py, train_reward_model.py and train_grpo.py stop with a clear
`error: ... became nan/inf ...` and exit 2, and leave no checkpoint of the broken state.

The non-finite values are real: an absurd learning rate (1e20) that overflows the weights
within a step or two, or a checkpoint with a NaN planted in one weight. Whatever
checkpoint is left afterwards must be from before the blow-up: finite weights, and a
finite loss / reward on real data when loaded."""
import contextlib
import io
import os
import re

import numpy as np
import pytest
import torch

import prepare_reward_data as prd
from core.files import atomic_torch_save
from helpers import make_text, prepare_char_data, run_script, train_tiny_checkpoint
from lib.checkpoint import load_model, make_checkpoint, read_checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ERROR = re.compile(r"^error: (.+) became (nan|inf|-inf) at step (\d+)", re.M)  # on a line of its own


# each test runs a script to a non-finite value and back: end to end
pytestmark = pytest.mark.slow

@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("nonfinite")
    _, data_dir = prepare_char_data(str(root / "corpus"), text=make_text(8000, seed=2))
    base = train_tiny_checkpoint(data_dir, str(root / "base.pt"), steps=20)
    rd = str(root / "reward_data")
    argv = ["--model_path", base, "--input_mode", "binary", "--train_bin", os.path.join(data_dir, "train.bin"),
            "--val_bin", os.path.join(data_dir, "val.bin"), "--output_dir", rd, "--samples_per_chunk", "1",
            "--max_blocks_per_split", "16", "--device", "cpu"]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        prd.main(argv)
    # a reward model whose scores differ between completions (a random output layer), so
    # GRPO's advantages, and with them its updates, are not zero
    torch.manual_seed(0)
    rm, ck, _ = load_model(base, mode="reward")
    torch.nn.init.normal_(rm.reward_head[2].weight, std=1.0)
    reward = str(root / "reward.pt")
    atomic_torch_save(make_checkpoint(rm, None, data=ck["data"], tokenization=ck["tokenization"]), reward)
    x = torch.from_numpy(np.fromfile(os.path.join(data_dir, "val.bin"), dtype=np.uint16)[:8 * 33]
                         .astype(np.int64).reshape(8, 33))
    return {"root": root, "data_dir": data_dir, "base": base, "reward_data": rd, "reward": reward, "batch": x}


def run(script, *args):
    return run_script([script, *args], cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"))


def assert_stopped_on_nonfinite(r):
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    m = ERROR.search(r.stderr)
    assert m, r.stderr[-2000:]
    assert "Traceback" not in r.stderr and "without writing a checkpoint" in r.stderr
    return int(m.group(3))


def assert_sound(path, batch, nan_step):
    """A checkpoint left behind is from before the blow-up and still works."""
    ckpt = read_checkpoint(path)
    assert ckpt["iter_num"] is None or ckpt["iter_num"] <= nan_step, (path, ckpt["iter_num"], nan_step)
    for k, v in ckpt["model"].items():
        assert torch.isfinite(v).all(), f"{path}: {k} is not finite"
    model, _, _ = load_model(path)
    model.eval()
    with torch.no_grad():
        if model.config.mode == "reward":
            out = model(batch[:, :32].contiguous())[0]
        else:
            out = model(batch[:, :-1].contiguous(), batch[:, 1:].contiguous())[1]
    assert torch.isfinite(out).all(), f"{path} gives nan/inf on real data"


TINY = ["--device", "cpu", "--n_layer", "2", "--n_head", "2", "--n_embd", "32", "--block_size", "32",
        "--batch_size", "8", "--eval_iters", "2", "--max_iters", "30", "--patience", "0",
        "--learning_rate", "1e20", "--decay_lr", "False"]


@pytest.mark.parametrize("log_interval,eval_interval", [(1, 5), (1000, 2)])
def test_train_stops_on_nan(setup, tmp_path, log_interval, eval_interval):
    """Caught by the per-step loss check (log_interval 1) or, between logs, by the
    evaluation that precedes every save."""
    out = tmp_path / "out"
    r = run("train.py", "--data_dir", setup["data_dir"], "--out_dir", str(out), *TINY,
            "--log_interval", str(log_interval), "--eval_interval", str(eval_interval))
    step = assert_stopped_on_nonfinite(r)
    assert step < 30
    left = [out / n for n in ("ckpt.pt", "last.pt") if (out / n).exists()]
    assert left, "the evaluation at step 0 writes ckpt.pt and last.pt"
    for path in left:
        assert_sound(path, setup["batch"], step)
        assert read_checkpoint(path)["iter_num"] < step  # nothing newer than the last sound state


def test_train_resumed_from_a_nan_checkpoint_stops(setup, tmp_path):
    out = tmp_path / "out"
    model, ckpt, _ = load_model(setup["base"])
    with torch.no_grad():
        model.transformer.h[0].mlp.c_fc.weight[0, 0] = float("nan")
    last = make_checkpoint(model, None, iter_num=5, best_val_loss=9.0, data=ckpt["data"],
                           tokenization=ckpt["tokenization"])
    os.makedirs(out)
    atomic_torch_save(last, str(out / "last.pt"))
    digest = (out / "last.pt").read_bytes()
    tiny = [a if a != "1e20" else "1e-3" for a in TINY]
    r = run("train.py", "--data_dir", setup["data_dir"], "--out_dir", str(out), *tiny, "--init_from", "resume",
            "--log_interval", "1", "--eval_interval", "5")
    assert assert_stopped_on_nonfinite(r) == 5
    assert (out / "last.pt").read_bytes() == digest and not (out / "ckpt.pt").exists()


def test_reward_model_stops_on_nan(setup, tmp_path):
    out = tmp_path / "rm"
    r = run("train_reward_model.py", "--model_path", setup["base"], "--data_dir", setup["reward_data"],
            "--out_dir", str(out), "--device", "cpu", "--learning_rate", "1e20", "--max_iters", "20",
            "--eval_interval", "1", "--batch_size", "4", "--log_interval", "1")
    step = assert_stopped_on_nonfinite(r)
    for name in ("reward_ckpt.pt", "reward_last.pt"):  # written by the evaluation of the untrained head
        assert_sound(out / name, setup["batch"], step)
        assert read_checkpoint(out / name)["iter_num"] < step
    assert not (out / "reward_summary.json").exists()


def test_reward_model_from_a_nan_generator_writes_nothing(setup, tmp_path):
    model, ckpt, _ = load_model(setup["base"])
    with torch.no_grad():
        model.transformer.h[1].attn.c_attn.weight[3, 3] = float("nan")
    bad = str(tmp_path / "nan_base.pt")
    atomic_torch_save(make_checkpoint(model, None, data=ckpt["data"], tokenization=ckpt["tokenization"]), bad)
    out = tmp_path / "rm"
    r = run("train_reward_model.py", "--model_path", bad, "--data_dir", setup["reward_data"],
            "--out_dir", str(out), "--device", "cpu", "--max_iters", "5", "--eval_interval", "1",
            "--batch_size", "4")
    assert_stopped_on_nonfinite(r)  # at the evaluation of the untrained head, before any save
    assert not any(n.endswith(".pt") for n in os.listdir(out)), os.listdir(out)


def test_grpo_stops_on_nan(setup, tmp_path):
    out = tmp_path / "grpo"
    r = run("train_grpo.py", "--model_path", setup["base"], "--reward_model_path", setup["reward"],
            "--out_dir", str(out), "--device", "cpu", "--learning_rate", "1e20", "--max_steps", "6",
            "--prompts_per_step", "2", "--group_size", "4", "--save_interval", "1", "--eval_interval", "100",
            "--eval_max_batches", "1")
    step = assert_stopped_on_nonfinite(r)
    if (out / "ckpt.pt").exists():
        assert_sound(out / "ckpt.pt", setup["batch"], step)
    assert not (out / "grpo_summary.json").exists()


def test_grpo_with_a_nan_reward_model_writes_nothing(setup, tmp_path):
    rm, ck, _ = load_model(setup["reward"])
    with torch.no_grad():
        rm.reward_head[0].weight[0, 0] = float("nan")
    bad = str(tmp_path / "nan_reward.pt")
    atomic_torch_save(make_checkpoint(rm, None, data=ck["data"], tokenization=ck["tokenization"]), bad)
    out = tmp_path / "grpo"
    r = run("train_grpo.py", "--model_path", setup["base"], "--reward_model_path", bad, "--out_dir", str(out),
            "--device", "cpu", "--max_steps", "3", "--prompts_per_step", "2", "--group_size", "4",
            "--save_interval", "1", "--eval_interval", "100", "--eval_max_batches", "1")
    assert assert_stopped_on_nonfinite(r) == 0
    assert not (out / "ckpt.pt").exists()
