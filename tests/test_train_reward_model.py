"""train_reward_model.py on a tiny reward dataset where synthetic text is easy to tell
apart (natural positions use tokens 0..7, synthetic positions are all token 15)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from common import TokenizationMismatchError, atomic_torch_save, read_jsonl
from model import GPT, GPTConfig, load_model, make_checkpoint
from tokenization_manager import TokenizationInfo

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
V, N = 16, 32


def write_reward_split(data_dir, split, x, y, info):
    """The reward dataset format of prepare_reward_data.py: {split}_x.bin uint16 (n, N),
    {split}_y.bin float32 (n, 2), {split}_metadata.txt of `key: value` lines."""
    os.makedirs(data_dir, exist_ok=True)
    x = np.ascontiguousarray(x, dtype=np.uint16)
    y = np.ascontiguousarray(y, dtype=np.float32)
    x.tofile(os.path.join(data_dir, f"{split}_x.bin"))
    y.tofile(os.path.join(data_dir, f"{split}_y.bin"))
    meta = {"num_samples": x.shape[0], "block_size": x.shape[1], "x_shape": f"({x.shape[0]}, {x.shape[1]})",
            "y_shape": f"({y.shape[0]}, 2)", "x_dtype": "uint16", "y_dtype": "float32",
            "tokenization_method": info.method, "vocab_size": info.vocab_size, "meta_path": info.meta_path}
    with open(os.path.join(data_dir, f"{split}_metadata.txt"), "w") as f:
        f.writelines(f"{k}: {v}\n" for k, v in meta.items())


def easy_samples(n, seed):
    rng = np.random.default_rng(seed)
    k = rng.integers(1, N, size=n)  # crossover K in [1, N-1]
    x = rng.integers(0, 8, size=(n, N))
    x[np.arange(N)[None, :] >= k[:, None]] = 15  # the "generated" part
    y = np.stack([k / N, (N - k) / N], 1)
    return x, y


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rm")
    info = TokenizationInfo("char", V, str(tmp / "meta.pkl"))
    torch.manual_seed(0)
    gen = GPT(GPTConfig(block_size=N, vocab_size=V, n_layer=2, n_head=2, n_embd=32))
    gen_path = tmp / "gen.pt"
    atomic_torch_save(make_checkpoint(gen, None, iter_num=0, tokenization=info.to_dict()), gen_path)
    data_dir = tmp / "rdata"
    for split, n, seed in (("train", 512, 0), ("val", 128, 1)):
        write_reward_split(str(data_dir), split, *easy_samples(n, seed), info)
    return dict(tmp=tmp, gen=gen_path, data=data_dir, info=info)


def run(setup, out, *extra):
    import train_reward_model
    train_reward_model.main(["--model_path", str(setup["gen"]), "--data_dir", str(setup["data"]),
                             "--out_dir", str(out), "--reward_head_hidden_dim", "32",
                             "--batch_size", "32", "--learning_rate", "3e-3", "--eval_interval", "20",
                             *extra])


def test_reward_training_beats_constant_and_checkpoint_loads(setup):
    out = setup["tmp"] / "out"
    run(setup, out, "--max_iters", "60")
    evals = [r for r in read_jsonl(str(out / "metrics.jsonl")) if r["kind"] == "eval"]
    assert [e["iter"] for e in evals] == [0, 20, 40, 60]
    first, last = evals[0], evals[-1]
    # the fresh head predicts exactly 0.5: the constant predictor
    assert first["val_mae"] == pytest.approx(first["const_mae"], abs=1e-6)
    assert last["val_loss"] < 0.5 * first["val_loss"]
    assert last["val_mae"] < 0.6 * last["const_mae"]
    summary = json.loads((out / "reward_summary.json").read_text())
    assert summary["val_mae"] < 0.6 * summary["const_mae"]
    for name in ("calibration.png", "loss_curves.png"):
        assert (out / name).stat().st_size > 1000

    # a reward checkpoint: safe load, the documented usage, and the trunk left untouched
    ck = torch.load(out / "reward_ckpt.pt", weights_only=True)
    assert ck["mode"] == "reward" and ck["reward_data"]["block_size"] == N
    model, _, new = load_model(str(out / "reward_ckpt.pt"))
    assert new == [] and model.config.mode == "reward" and model.config.reward_head_hidden_dim == 32
    x, y = easy_samples(64, 5)
    model.eval()
    with torch.no_grad():
        probs, _ = model(torch.from_numpy(x).long())
    assert probs.shape == (64, 2) and torch.allclose(probs.sum(1), torch.ones(64))
    assert (probs[:, 0] - torch.from_numpy(y[:, 0]).float()).abs().mean() < 0.6 * np.abs(0.5 - y[:, 0]).mean()
    base = torch.load(setup["gen"], weights_only=True)["model"]
    for k, v in ck["model"].items():
        if k.startswith("transformer."):
            assert torch.equal(v, base[k]), f"frozen trunk tensor {k} changed"


def test_unfreeze_ce_and_resume(setup):
    out = setup["tmp"] / "unfrozen"
    run(setup, out, "--max_iters", "20", "--unfreeze_last_n_blocks", "1", "--loss", "ce",
        "--optimizer", "adam")
    run(setup, out, "--max_iters", "40", "--unfreeze_last_n_blocks", "1", "--loss", "ce",
        "--optimizer", "adam", "--resume")
    evals = [r for r in read_jsonl(str(out / "metrics.jsonl")) if r["kind"] == "eval"]
    assert [e["iter"] for e in evals] == [0, 20, 40]
    assert evals[-1]["val_mae"] < evals[0]["val_mae"]
    ck = torch.load(out / "reward_ckpt.pt", weights_only=True)
    base = torch.load(setup["gen"], weights_only=True)["model"]
    assert not torch.equal(ck["model"]["transformer.h.1.mlp.c_fc.weight"], base["transformer.h.1.mlp.c_fc.weight"])
    assert torch.equal(ck["model"]["transformer.h.0.mlp.c_fc.weight"], base["transformer.h.0.mlp.c_fc.weight"])


def test_tokenization_mismatch_is_refused(setup, tmp_path):
    bad = tmp_path / "bpe_data"
    info = TokenizationInfo("bpe", 50257)
    for split in ("train", "val"):
        write_reward_split(str(bad), split, *easy_samples(8, 0), info)
    import train_reward_model
    with pytest.raises(TokenizationMismatchError, match="Tokenization method mismatch"):
        train_reward_model.main(["--model_path", str(setup["gen"]), "--data_dir", str(bad),
                                 "--out_dir", str(tmp_path / "o")])


def test_wrong_mode_exits_2(setup):
    rm = GPT(GPTConfig(block_size=N, vocab_size=V, n_layer=2, n_head=2, n_embd=32, mode="reward"))
    path = setup["tmp"] / "a_reward.pt"
    atomic_torch_save(make_checkpoint(rm, None, tokenization=setup["info"].to_dict()), path)
    p = subprocess.run([sys.executable, "train_reward_model.py", "--model_path", str(path),
                        "--data_dir", str(setup["data"]), "--out_dir", str(setup["tmp"] / "bad")],
                       cwd=ROOT, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert p.returncode == 2
    assert "Traceback" not in p.stderr
    assert "is a reward checkpoint, but a generator checkpoint is needed here" in p.stderr
