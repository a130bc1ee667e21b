"""sample.py and evaluate.py on real (tiny) checkpoints written to disk."""
import math
import os
import sys

import numpy as np
import pytest
import torch

import evaluate
import sample
from core.errors import CheckpointError, TokenizationMismatchError
from core.files import atomic_torch_save
from helpers import run_script
from lib import heldout
from lib.checkpoint import make_checkpoint
from lib.corpus import describe_split
from lib.prepare import prepare_corpus
from model import GPT, GPTConfig
from tokenization_manager import TokenizationManager

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TEXT = "".join(f"line {i}: to be or not to be, that is the question.\n" for i in range(300))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A char dataset and a generator checkpoint that records it (a few real training steps)."""
    d = tmp_path_factory.mktemp("se")
    (d / "input.txt").write_text(TEXT)
    data_dir = str(d / "tiny_char")
    prepare_corpus(str(d / "input.txt"), data_dir, "char", 0.9, log=lambda *a: None)
    tok = TokenizationManager("char", meta_path=os.path.join(data_dir, "meta.pkl"))
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=32, vocab_size=tok.vocab_size, n_layer=2, n_head=2, n_embd=32))
    opt = model.configure_optimizers(0.0, 3e-3, (0.9, 0.99), "cpu")
    data = torch.from_numpy(np.fromfile(os.path.join(data_dir, "train.bin"), dtype=np.uint16).astype(np.int64))
    for _ in range(30):  # enough to make the model clearly better than uniform
        ix = torch.randint(len(data) - 33, (16,))
        x = torch.stack([data[i:i + 32] for i in ix])
        y = torch.stack([data[i + 1:i + 33] for i in ix])
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    ckpt_path = str(d / "ckpt.pt")
    atomic_torch_save(make_checkpoint(
        model, opt, iter_num=30, best_val_loss=loss.item(), tokenization=tok.info.to_dict(),
        data=describe_split(os.path.join(data_dir, "train.bin"), os.path.join(data_dir, "val.bin"),
                            tok.info, data_dir)), ckpt_path)
    return {"dir": d, "data_dir": data_dir, "ckpt": ckpt_path, "model": model.eval(), "tok": tok}


def run(script, *args):
    return run_script([script, *args], cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"))


@pytest.mark.slow  # a command line run in a subprocess
def test_sample_prints_batched_samples(setup):
    r = run("sample.py", "--ckpt", setup["ckpt"], "--start", "to be", "--num_samples", "3",
            "--max_new_tokens", "20", "--device", "cpu", "--seed", "3")
    assert r.returncode == 0, r.stderr
    samples = r.stdout.split("---------------\n")[:-1]
    assert len(samples) == 3
    for s in samples:
        assert s.startswith("to be") and len(s) == len("to be") + 20 + 1  # + the newline of print
    assert len(set(samples)) > 1  # each row draws its own tokens


def test_sample_tokenizer_from_file_prompt(setup, monkeypatch, capsys, tmp_path):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("line 7:")
    monkeypatch.setattr(sys, "argv", ["sample.py", "--ckpt", setup["ckpt"], "--start", f"FILE:{prompt}",
                                      "--num_samples", "2", "--max_new_tokens", "5", "--device", "cpu",
                                      "--temperature", "0"])
    from engine import Engine
    calls, generate = [], Engine.generate
    monkeypatch.setattr(Engine, "generate", lambda self, *a, **kw: calls.append(kw) or generate(self, *a, **kw))
    # the engine's choice on CUDA by default (GPT_DECODE=compiled), made here on the CPU
    monkeypatch.setattr(Engine, "decoder", lambda self, device, decoder=None: decoder or "compiled")
    sample.main()
    out = capsys.readouterr().out.split("---------------\n")[:-1]
    assert len(out) == 2 and out[0] == out[1] and out[0].startswith("line 7:")  # greedy: identical
    # sampling runs uncompiled, as its ignored --compile says: a few hundred tokens repay no compile on CUDA
    assert [kw.get("decoder") for kw in calls] == ["static"]
    # a directory holding one text file stands for that file, as wherever one text file is read
    monkeypatch.setattr(sys, "argv", [a.replace(f"FILE:{prompt}", f"FILE:{tmp_path}") for a in sys.argv])
    sample.main()
    assert capsys.readouterr().out.split("---------------\n")[:-1] == out


def test_sample_refuses_reward_checkpoint(setup, monkeypatch):
    reward = GPT(GPTConfig(block_size=32, vocab_size=setup["tok"].vocab_size, n_layer=2, n_head=2,
                           n_embd=32, mode="reward", reward_head_hidden_dim=8))
    path = str(setup["dir"] / "reward.pt")
    atomic_torch_save(make_checkpoint(reward, None, tokenization=setup["tok"].info.to_dict()), path)
    monkeypatch.setattr(sys, "argv", ["sample.py", "--ckpt", path, "--device", "cpu"])
    with pytest.raises(CheckpointError, match="reward checkpoint"):
        sample.main()


def test_calculate_perplexity_matches_hand_computation(setup):
    model, val_bin = setup["model"], os.path.join(setup["data_dir"], "val.bin")
    loader = heldout.make_eval_loader(val_bin, block_size=16, batch_size=4)
    ppl = heldout.calculate_perplexity(model, loader, "cpu")

    # by hand: consecutive windows, every token after the first predicted once
    data = torch.from_numpy(np.fromfile(val_bin, dtype=np.uint16).astype(np.int64))
    total, count = 0.0, 0
    with torch.no_grad():
        for s in range(0, len(data) - 1, 16):
            x, y = data[s:s + 16], data[s + 1:s + 17]
            x = x[:len(y)]
            logits = model.lm_head(model.hidden_states(x[None]))[0]
            total += torch.nn.functional.cross_entropy(logits, y, reduction="sum").item()
            count += len(y)
    assert count == len(data) - 1
    assert ppl == pytest.approx(math.exp(total / count), rel=1e-5)
    assert 1.0 < ppl < setup["tok"].vocab_size  # a trained model beats the uniform guess
    loss, n = heldout.evaluate_loss(model, loader, "cpu")
    assert n == len(data) - 1 and math.exp(loss) == pytest.approx(ppl)
    # a partial evaluation really stops early
    _, n2 = heldout.evaluate_loss(model, loader, "cpu", max_batches=1)
    assert n2 == 4 * 16


@pytest.mark.slow  # a command line run in a subprocess
def test_evaluate_cli(setup):
    r = run("evaluate.py", "--ckpt", setup["ckpt"], "--device", "cpu", "--batch_size", "8")
    assert r.returncode == 0, r.stderr
    loader = heldout.make_eval_loader(os.path.join(setup["data_dir"], "val.bin"), 32, 8)
    expected = heldout.calculate_perplexity(setup["model"], loader, "cpu")
    line = [l for l in r.stdout.splitlines() if "perplexity" in l][0]
    assert float(line.split("perplexity")[1]) == pytest.approx(expected, rel=1e-3)


def test_evaluate_refuses_other_tokenization(setup, monkeypatch):
    bpe_dir = str(setup["dir"] / "tiny_bpe")
    prepare_corpus(str(setup["dir"] / "input.txt"), bpe_dir, "bpe", 0.9, log=lambda *a: None)
    monkeypatch.setattr(sys, "argv", ["evaluate.py", "--ckpt", setup["ckpt"], "--data_dir", bpe_dir,
                                      "--device", "cpu"])
    with pytest.raises(TokenizationMismatchError, match="uses 'bpe' but expected 'char'"):
        evaluate.main()
