"""train.py end to end on a tiny corpus: checkpoint contents, resume, early stopping, errors, presets."""
import argparse
import contextlib
import json
import math
import os
import sys
import types

import numpy as np
import pytest
import torch

import train
from core.devices import DistInfo
from core.errors import BinaryFileError, ProjectError
from core.files import read_jsonl, sha256_file
from helpers import run_script, run_train_main
from lib.checkpoint import model_from_checkpoint, read_checkpoint
from lib.corpus import Corpus, check_token_bin
from lib.prepare import prepare_corpus
from model import GPT, GPTConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


TINY = ["--device", "cpu", "--dtype", "float32", "--compile", "False", "--n_layer", "2", "--n_head", "2",
        "--n_embd", "32", "--block_size", "32", "--batch_size", "8", "--eval_iters", "2",
        "--log_interval", "1", "--eval_interval", "5", "--warmup_iters", "2", "--lr_decay_iters", "10",
        "--learning_rate", "3e-3", "--min_lr", "3e-4", "--patience", "0", "--seed", "7"]


def make_text(n_lines=400, seed=0):
    rng = np.random.default_rng(seed)
    words = ["the", "king", "queen", "doth", "speak", "of", "love", "and", "war", "my", "lord",
             "good", "night", "sweet", "prince", "hath", "thou", "art", "fair", "to", "be"]
    lines = []
    for i in range(n_lines):
        who = ["ROMEO", "JULIET", "KING"][i % 3]
        lines.append(f"{who}:\n" + " ".join(rng.choice(words, size=8)).capitalize() + ".\n")
    return "\n".join(lines)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    (d / "input.txt").write_text(make_text())
    out = d / "tiny_char"
    prepare_corpus(str(d / "input.txt"), str(out), "char", 0.9, log=lambda *a: None)
    return str(out)


def run_train(*args):
    # one thread: these models are tiny, and spinning threads crawl on a busy 2-core machine
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return run_script(["train.py", *args], cwd=ROOT, env=env)


def kinds(records):
    """(iter, kind) pairs of metrics.jsonl records: 'eval' or 'train'."""
    return [(r["step"], "eval" if "val_loss" in r else "train") for r in records]


@pytest.fixture(scope="module")
def straight_run(data_dir, tmp_path_factory):
    """10 iterations in one go (the reference for the resume test) -> (out_dir, what it printed)."""
    out = str(tmp_path_factory.mktemp("straight"))
    return out, run_train_main(*TINY, "--data_dir", data_dir, "--out_dir", out, "--max_iters", "10")


def test_checkpoint_contents(data_dir, straight_run):
    out, stdout = straight_run
    assert "done: best val loss" in stdout and "stopped: max_iters reached" in stdout
    last = torch.load(os.path.join(out, "last.pt"), map_location="cpu", weights_only=True)
    best = torch.load(os.path.join(out, "ckpt.pt"), map_location="cpu", weights_only=True)
    for key in ("model", "optimizer", "model_args", "model_extra", "config", "iter_num", "best_val_loss", "data",
                "tokenization", "early_stopping", "rng"):
        assert key in last and key in best, key
    assert last["config"]["max_iters"] == 10 and last["config"]["data_dir"] == data_dir  # the run's flags
    assert last["iter_num"] == 10
    assert last["model_args"]["n_layer"] == 2 and last["model_args"]["vocab_size"] == last["tokenization"]["vocab_size"]
    assert last["data"]["train_sha256"] == sha256_file(os.path.join(data_dir, "train.bin"))
    assert last["data"]["val_tokens"] * 2 == os.path.getsize(os.path.join(data_dir, "val.bin"))
    assert last["data"]["train_split"] == 0.9 and last["tokenization"]["method"] == "char"

    records = read_jsonl(os.path.join(out, "metrics.jsonl"))
    evals = [r for r in records if "val_loss" in r]
    assert [r["step"] for r in evals] == [0, 5, 10]
    assert sorted(r["step"] for r in records if "loss" in r) == list(range(10))
    assert all(abs(r["val_ppl"] - np.exp(r["val_loss"])) < 1e-6 * r["val_ppl"] for r in evals)
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] - 0.1  # it learned something
    # ckpt.pt is the best evaluation
    assert best["best_val_loss"] == pytest.approx(min(r["val_loss"] for r in evals))
    assert best["iter_num"] == min(evals, key=lambda r: r["val_loss"])["step"]


def test_train_summary_carries_what_the_flops_count_and_the_control_arm_read(straight_run):
    """out_dir/train_summary.json: the run's iterations, batch and eval settings and model shape, as
    last.pt records them (experiment/flops.py counts from it alone), and the last logged train loss."""
    out, _ = straight_run
    summary = json.loads(open(os.path.join(out, "train_summary.json")).read())
    last = torch.load(os.path.join(out, "last.pt"), map_location="cpu", weights_only=True)
    assert summary["iters"] == last["iter_num"] == 10 and summary["model_args"] == last["model_args"]
    for k in ("batch_size", "gradient_accumulation_steps", "block_size", "eval_interval", "eval_iters"):
        assert summary[k] == last["config"][k], k
    losses = [x["loss"] for x in read_jsonl(os.path.join(out, "metrics.jsonl")) if "loss" in x]
    assert summary["train_loss_final"] == losses[-1] and summary["best_val_loss"] == last["best_val_loss"]
    assert summary["stop_reason"] == "max_iters reached"


@pytest.mark.slow  # a command line in a subprocess
def test_off_a_terminal_about_100_iteration_lines_per_run(data_dir, tmp_path):
    """--log_interval 1 on 300 iterations: a pipe gets every 3rd iteration's line (the run's output in
    run_cycles' steps.log stays short), metrics.jsonl still every iteration's loss."""
    args = argparse.Namespace(log_interval=1, max_iters=300)
    assert train.console_log_interval(args, tty=True) == 1 and train.console_log_interval(args, tty=False) == 3
    args = argparse.Namespace(log_interval=7, max_iters=5000)  # a multiple of --log_interval: every line is logged
    assert train.console_log_interval(args, tty=False) == 56
    assert train.console_log_interval(argparse.Namespace(log_interval=10, max_iters=50), tty=False) == 10
    out = str(tmp_path / "run")
    r = run_train(*TINY, "--data_dir", data_dir, "--out_dir", out, "--max_iters", "300", "--eval_interval", "300",
                  "--lr_decay_iters", "300")
    assert r.returncode == 0, r.stderr
    printed = [line for line in r.stdout.splitlines() if line.startswith("iter ")]
    assert printed[0].startswith("iter 0: ") and printed[-1].startswith("iter 297: ") and len(printed) == 100
    assert [x["step"] for x in read_jsonl(os.path.join(out, "metrics.jsonl")) if "loss" in x] == list(range(300))


def test_resume_continues_the_same_run(data_dir, straight_run, tmp_path):
    out = str(tmp_path / "resumed")
    run_train_main(*TINY, "--data_dir", data_dir, "--out_dir", out, "--max_iters", "5")
    # records a crashed run may have written after the checkpoint at iter 5
    with open(os.path.join(out, "metrics.jsonl"), "a") as f:
        f.write(json.dumps({"step": 5, "loss": 9.0}) + "\n" + json.dumps({"step": 7, "loss": 9.0}) + "\n")
    stdout = run_train_main(*TINY, "--data_dir", data_dir, "--out_dir", out, "--max_iters", "10",
                            "--init_from", "resume")
    assert "resuming from" in stdout and "iter_num 10" in stdout
    last = torch.load(os.path.join(out, "last.pt"), map_location="cpu", weights_only=True)
    assert last["iter_num"] == 10
    pairs = kinds(read_jsonl(os.path.join(out, "metrics.jsonl")))
    assert len(pairs) == len(set(pairs)), "duplicate iterations in metrics.jsonl"
    assert sorted(i for i, k in pairs if k == "train") == list(range(10))
    assert sorted(i for i, k in pairs if k == "eval") == [0, 5, 10]
    assert all(r["loss"] != 9.0 for r in read_jsonl(os.path.join(out, "metrics.jsonl")) if "loss" in r)
    # same batches, optimizer state and schedule: identical to the uninterrupted run
    ref = torch.load(os.path.join(straight_run[0], "last.pt"), map_location="cpu", weights_only=True)
    for k, v in ref["model"].items():
        assert torch.equal(v, last["model"][k]), k


def test_early_stopping(data_dir, tmp_path):
    out = str(tmp_path / "es")
    # learning rate 0: the val loss can never improve, so it stops after `patience` evaluations
    stdout = run_train_main(*TINY, "--data_dir", data_dir, "--out_dir", out, "--max_iters", "200",
                            "--learning_rate", "0", "--decay_lr", "False", "--eval_interval", "2", "--patience", "2")
    assert "stopped: early stopping" in stdout
    last = torch.load(os.path.join(out, "last.pt"), map_location="cpu", weights_only=True)
    best = torch.load(os.path.join(out, "ckpt.pt"), map_location="cpu", weights_only=True)
    assert last["iter_num"] == 4 and best["iter_num"] == 0
    assert last["early_stopping"]["bad_checks"] == 2
    assert max(r["step"] for r in read_jsonl(os.path.join(out, "metrics.jsonl"))) == 4


def tiny_setup(data_dir):
    """train.py's pieces without running main(): args, data, a new tiny model and a new state."""
    args = train.parse_args([*TINY, "--data_dir", data_dir])
    data = train.setup_data(args)
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=args.block_size, vocab_size=data.tokenizer.vocab_size, n_layer=args.n_layer,
                          n_head=args.n_head, n_embd=args.n_embd, dropout=0.0, bias=False))
    return args, data, model, train.new_state(args, world_size=1)


def tiny_run(args, data, model, optimizer=None, out_dir=None, record=None):
    """The read-only run context evaluate() and save() take, with what they read of it (main builds the rest)."""
    ctx = types.SimpleNamespace(device="cpu", amp=contextlib.nullcontext())
    out = out_dir and train.Outputs(*train.checkpoint_paths(str(out_dir)), None, record)
    return train.TrainRun(args, ctx, data, model, model, model, optimizer, out, 1, 0, 0.0, 1)


def test_the_corpus_serves_train_pys_batches(data_dir, tmp_path):
    """train.py reads --data_dir through lib/corpus.Corpus: nanoGPT's batches (offsets from the generator,
    inputs and next-token targets) from a fresh memmap per batch, the split's length from its size, and the
    char vocabulary of --meta_path."""
    args, corpus, _, _ = tiny_setup(data_dir)
    assert isinstance(corpus, Corpus) and corpus.tokenizer.meta_path == os.path.join(data_dir, "meta.pkl")
    raw = np.fromfile(os.path.join(data_dir, "val.bin"), dtype=np.uint16).astype(np.int64)
    assert corpus.num_tokens("val") == len(raw)
    X, Y = train.get_batch(corpus, "val", 3, 8, torch.Generator().manual_seed(5), "cpu")
    ix = torch.randint(len(raw) - 8, (3,), generator=torch.Generator().manual_seed(5)).numpy()
    assert torch.equal(X, torch.from_numpy(np.stack([raw[i:i + 8] for i in ix])))
    assert torch.equal(Y, torch.from_numpy(np.stack([raw[i + 1:i + 9] for i in ix])))
    assert corpus.fresh_tokens("val") is not corpus.fresh_tokens("val") and corpus.val is corpus.val
    other = tmp_path / "other_meta.pkl"
    other.write_bytes(open(os.path.join(data_dir, "meta.pkl"), "rb").read())
    assert Corpus(data_dir, "char", str(other)).tokenizer.meta_path == str(other)


def test_evaluate_on_its_own(data_dir):
    args, data, model, state = tiny_setup(data_dir)
    run = tiny_run(args, data, model)
    losses = train.evaluate(state, run)
    assert set(losses) == {"train", "val"} and model.training  # back in training mode
    assert abs(losses["val"] - math.log(data.tokenizer.vocab_size)) < 0.5  # an untrained model: about uniform
    # fixed eval batches: the same model gives the same numbers, and nothing in `state` moves
    assert train.evaluate(state, run) == losses
    assert state.step == 0 and state.best_step is None
    state.step = 3
    with torch.no_grad():
        model.lm_head.weight.fill_(float("nan"))
    with pytest.raises(ProjectError, match="train loss became nan at step 3"):
        train.evaluate(state, run)


def test_save_then_load_the_checkpoint(data_dir, tmp_path, capsys):
    args, data, model, state = tiny_setup(data_dir)
    optimizer = model.configure_optimizers(args.weight_decay, args.learning_rate, (args.beta1, args.beta2), "cpu")
    state.step, state.best_val_loss, state.best_step = 5, 2.5, 5
    state.early.step(2.5)
    state.early.step(2.6)
    torch.randint(10, (7,), generator=state.batch_gen)  # the batch stream has moved on
    state.rng_states = train.gather_rng_states(DistInfo(), "cpu")
    record = dict(train_config=vars(args), data={"train_sha256": "abc", "data_dir": data.data_dir},
                  tokenization=data.tokenizer.info.to_dict(), init_from=None)
    best, last = str(tmp_path / "ckpt.pt"), str(tmp_path / "last.pt")
    train.save(state, tiny_run(args, data, model, optimizer, tmp_path, record), best=True, last=True)
    assert open(best, "rb").read() == open(last, "rb").read()

    ckpt = read_checkpoint(last)
    assert (ckpt["iter_num"], ckpt["best_val_loss"], ckpt["best_iter"]) == (5, 2.5, 5)
    assert ckpt["early_stopping"]["bad_checks"] == 1 and ckpt["tokenization"]["method"] == "char"
    assert ckpt["config"]["n_layer"] == 2 and ckpt["rng"]["world_size"] == 1
    loaded, _ = model_from_checkpoint(ckpt, path=last, require_mode="generator")
    for k, v in model.state_dict().items():
        assert torch.equal(v, loaded.state_dict()[k]), k
    # a resumed run's state: the same counters, early stopper and batch stream
    again = train.new_state(args, world_size=1)
    train.resume_state(again, ckpt, last, record["data"], data.data_dir, master=True)
    train.restore_rng(again, ckpt, args, DistInfo(), "cpu")
    assert "resuming from" in capsys.readouterr().out
    assert (again.step, again.best_val_loss, again.best_step) == (5, 2.5, 5)
    assert again.early.state_dict() == state.early.state_dict()
    assert torch.equal(again.batch_gen.get_state(), state.batch_gen.get_state())
    with pytest.raises(ProjectError, match="was trained on different data"):
        train.resume_state(train.new_state(args, 1), ckpt, last, {"train_sha256": "other"}, data.data_dir, master=True)

    # only last.pt (no new best): ckpt.pt is left alone
    only = tmp_path / "only"
    only.mkdir()
    train.save(state, tiny_run(args, data, model, optimizer, only, record), best=False, last=True)
    assert os.listdir(only) == ["last.pt"]


@pytest.mark.slow  # a command line in a subprocess
def test_missing_data_is_a_clean_error(tmp_path):
    r = run_train("--data_dir", str(tmp_path / "nope"), "--out_dir", str(tmp_path / "o"), "--device", "cpu")
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    first = r.stderr.splitlines()[0]
    assert first.startswith("error: ") and "nope" in first and "prepare.py" in first
    assert not os.path.exists(tmp_path / "o" / "ckpt.pt")


def test_missing_val_bin(data_dir, tmp_path, monkeypatch):
    d = tmp_path / "only_train"
    d.mkdir()
    (d / "train.bin").write_bytes(open(os.path.join(data_dir, "train.bin"), "rb").read())
    monkeypatch.setattr(sys, "argv", ["train.py", "--data_dir", str(d), "--out_dir", str(tmp_path / "o"),
                                      "--device", "cpu"])
    with pytest.raises(BinaryFileError, match="val.bin.*run prepare.py"):
        train.main()


def test_token_file_checks(tmp_path):
    p = str(tmp_path / "x.bin")
    np.arange(100, dtype=np.uint16).tofile(p)
    assert check_token_bin(p, min_tokens=33, vocab_size=100) == 100
    with pytest.raises(BinaryFileError, match="token id 99"):
        check_token_bin(p, vocab_size=65)
    with pytest.raises(BinaryFileError, match="fewer than"):
        check_token_bin(p, min_tokens=101)
    with open(p, "ab") as f:
        f.write(b"\x00")
    with pytest.raises(BinaryFileError, match="odd size"):
        check_token_bin(p)


def test_presets_and_flag_overrides(tmp_path):
    args = train.parse_args(["--config", "config/train_shakespeare_char_cpu.py", "--max_iters", "7"])
    assert args.max_iters == 7  # explicit flag wins
    # nanoGPT's CPU command on top of its shakespeare_char preset
    expect = dict(device="cpu", compile=False, eval_iters=20, log_interval=1, block_size=64, batch_size=12,
                  n_layer=4, n_head=4, n_embd=128, lr_decay_iters=2000, dropout=0.0, learning_rate=1e-3,
                  min_lr=1e-4, beta2=0.99, warmup_iters=100, eval_interval=250,
                  data_dir="data/shakespeare_char")
    assert {k: getattr(args, k) for k in expect} == expect
    gpu = train.parse_args(["--config", "config/train_shakespeare_char.py"])
    assert (gpu.n_layer, gpu.n_head, gpu.n_embd, gpu.block_size, gpu.batch_size, gpu.dropout,
            gpu.max_iters) == (6, 6, 384, 256, 64, 0.2, 5000)
    tiny = train.parse_args(["--config", "config/train_shakespeare_char_tiny.py"])
    assert tiny.n_layer == 2 and tiny.device == "cpu"

    bad = tmp_path / "bad.py"
    bad.write_text("for n in (1, 2):\n    n_layer = n\n")
    with pytest.raises(ProjectError, match="only `name = value`"):
        train.parse_args(["--config", str(bad)])
    bad.write_text("n_layer = __import__('os').getpid()\n")
    with pytest.raises(ProjectError, match=r"cannot evaluate the value of n_layer \(it calls a function\)"):
        train.parse_args(["--config", str(bad)])
    bad.write_text("n_layers = 3\n")
    with pytest.raises(ProjectError, match="unknown setting 'n_layers'"):
        train.parse_args(["--config", str(bad)])
    bad.write_text("n_layer = '3'\n")
    with pytest.raises(ProjectError, match="wrong type"):
        train.parse_args(["--config", str(bad)])


def test_compile_defaults_to_on_for_cuda_only(data_dir, tmp_path):
    """nanoGPT compiles by default; here --compile unset means on for CUDA and off elsewhere (CPU: it
    does not pay), and the resolved choice is what the checkpoint records."""
    import contextlib
    from argparse import Namespace

    from core.devices import DistInfo
    from core.training import RunContext
    args = Namespace(compile=None, gradient_accumulation_steps=1)
    assert train.setup_device(args, RunContext(DistInfo(), "cpu", "float32", contextlib.nullcontext(), None, False)) == 1
    assert args.compile is False
    args.compile = None
    train.setup_device(args, RunContext(DistInfo(), "cuda:0", "bfloat16", contextlib.nullcontext(), None, False))
    assert args.compile is True
    assert train.build_parser().parse_args([]).compile is None
    out = tmp_path / "out"
    flags = [f for f in TINY if f not in ("--compile", "False")]
    run_train_main(*flags, "--data_dir", data_dir, "--out_dir", str(out), "--max_iters", "2")
    assert read_checkpoint(str(out / "ckpt.pt"))["config"]["compile"] is False
