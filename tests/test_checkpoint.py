"""lib/checkpoint.py: the nanoGPT layout (read back by a nanoGPT loader written here), the old
layout of this project, and the one tokenization reader."""
import math
import os
import pickle
from dataclasses import dataclass, fields

import pytest
import torch
import torch.nn as nn
from torch.nn import functional as F

from core.files import atomic_torch_save
from helpers import prepare_char_data, run_train_main
from lib.checkpoint import (checkpoint_config, checkpoint_tokenization, load_model, make_checkpoint, read_checkpoint,
                            training_config, upgrade_layout)
from model import GPT, GPTConfig
from tokenization_manager import TokenizationInfo

NANOGPT_KEYS = {"n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size", "dropout"}


# ----------------------------------------------------------------------------- nanoGPT's model, minimal
# The architecture and names of nanoGPT's model.py (flash-attention path), nothing of this project.

@dataclass
class NanoGPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True


class NanoLayerNorm(nn.Module):
    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class NanoAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_attn = nn.Linear(c.n_embd, 3 * c.n_embd, bias=c.bias)
        self.c_proj = nn.Linear(c.n_embd, c.n_embd, bias=c.bias)
        self.n_head, self.n_embd = c.n_head, c.n_embd

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class NanoMLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc = nn.Linear(c.n_embd, 4 * c.n_embd, bias=c.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * c.n_embd, c.n_embd, bias=c.bias)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class NanoBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1, self.attn = NanoLayerNorm(c.n_embd, c.bias), NanoAttention(c)
        self.ln_2, self.mlp = NanoLayerNorm(c.n_embd, c.bias), NanoMLP(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class NanoGPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.config = c
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(c.vocab_size, c.n_embd), wpe=nn.Embedding(c.block_size, c.n_embd),
            drop=nn.Dropout(c.dropout), h=nn.ModuleList([NanoBlock(c) for _ in range(c.n_layer)]),
            ln_f=NanoLayerNorm(c.n_embd, c.bias)))
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight

    def forward(self, idx):
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
        for _ in range(max_new_tokens):
            logits = self(idx[:, -self.config.block_size:])[:, -1, :] / temperature
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float("Inf")
            idx = torch.cat((idx, torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)), dim=1)
        return idx


def nanogpt_load(path):
    """nanoGPT's sample.py, init_from='resume': the exact steps it takes."""
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    gptconf = NanoGPTConfig(**checkpoint["model_args"])
    model = NanoGPT(gptconf)
    state_dict = checkpoint["model"]
    unwanted_prefix = "_orig_mod."
    for k, v in list(state_dict.items()):
        if k.startswith(unwanted_prefix):
            state_dict[k[len(unwanted_prefix):]] = state_dict.pop(k)
    model.load_state_dict(state_dict)  # strict, as nanoGPT
    return model, checkpoint


# ----------------------------------------------------------------------------- train.py's checkpoint

@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A generator checkpoint written by train.py itself (a few iterations)."""
    root = tmp_path_factory.mktemp("ck")
    _, data_dir = prepare_char_data(str(root), name="tiny_char")
    out = root / "out"
    run_train_main("--device", "cpu", "--dtype", "float32", "--n_layer", "2", "--n_head", "2", "--n_embd", "32",
                   "--block_size", "32", "--batch_size", "4", "--eval_iters", "1", "--eval_interval", "2",
                   "--max_iters", "2", "--warmup_iters", "1", "--lr_decay_iters", "2", "--data_dir", data_dir,
                   "--out_dir", str(out))
    return str(out / "ckpt.pt"), data_dir


def test_train_checkpoint_loads_in_nanogpt(trained):
    path, data_dir = trained
    raw = torch.load(path, map_location="cpu", weights_only=True)  # plain types only: no allowlist needed
    assert set(raw["model_args"]) == NANOGPT_KEYS == {f.name for f in fields(NanoGPTConfig)}
    assert raw["model_extra"]["mode"] == "generator" and raw["model_extra"]["activation"] == "gelu"
    assert isinstance(raw["config"], dict) and raw["config"]["dataset"] == "tiny_char"
    assert raw["config"]["data_dir"] == data_dir and raw["config"]["max_iters"] == 2
    assert raw["iter_num"] == 2 and isinstance(raw["best_val_loss"], float)

    # the state dict is exactly what nanoGPT's GPT expects: names and shapes, nothing else
    c = NanoGPTConfig(**raw["model_args"])
    expected = {k: tuple(v.shape) for k, v in NanoGPT(c).state_dict().items()}
    assert {k: tuple(v.shape) for k, v in raw["model"].items()} == expected
    names = set(expected)
    for i in range(c.n_layer):
        for part in ("ln_1.weight", "attn.c_attn.weight", "attn.c_proj.weight", "ln_2.weight",
                     "mlp.c_fc.weight", "mlp.c_proj.weight"):
            assert f"transformer.h.{i}.{part}" in names
    assert {"transformer.wte.weight", "transformer.wpe.weight", "transformer.ln_f.weight", "lm_head.weight"} <= names
    assert not any(k.startswith("reward_head") or k.endswith("attn.bias") for k in raw["model"])

    nano, ckpt = nanogpt_load(path)
    nano.eval()
    ours, _, _ = load_model(path)
    ours.eval()
    idx = torch.randint(0, c.vocab_size, (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(nano(idx), ours(idx, idx)[0], atol=1e-5)

    # and samples text, decoded with nanoGPT's rule: data/<config['dataset']>/meta.pkl
    meta_path = os.path.join(os.path.dirname(data_dir), ckpt["config"]["dataset"], "meta.pkl")
    with open(meta_path, "rb") as f:
        meta = pickle.load(f)
    stoi, itos = meta["stoi"], meta["itos"]
    torch.manual_seed(1337)
    start = torch.tensor([[stoi["\n"]]])
    y = nano.generate(start, 30, temperature=0.8, top_k=200)
    text = "".join(itos[int(i)] for i in y[0])
    assert len(text) == 31


def test_old_layout_still_loads(tmp_path):
    """A checkpoint as this project wrote it before: the GPTConfig object under `config`, our
    fields inside model_args, the flags under `train_config`."""
    torch.manual_seed(0)
    cfg = GPTConfig(block_size=16, vocab_size=11, n_layer=1, n_head=2, n_embd=16, activation="gelu_tanh")
    model = GPT(cfg)
    old = {"model": model.state_dict(), "optimizer": None,
           "model_args": {f.name: getattr(cfg, f.name) for f in fields(GPTConfig)},
           "config": GPTConfig(**{f.name: getattr(cfg, f.name) for f in fields(GPTConfig)}),
           "mode": "generator", "iter_num": 7, "best_val_loss": 1.5,
           "train_config": {"max_iters": 7, "data_dir": "data/x"},
           "tokenization": {"method": "char", "vocab_size": 11, "meta_path": None}}
    torch.save(old, tmp_path / "old.pt")
    with pytest.raises(Exception):  # the class is refused by a plain safe load ...
        torch.load(tmp_path / "old.pt", weights_only=True, map_location="cpu")
    ck = read_checkpoint(str(tmp_path / "old.pt"))  # ... and allowed while read_checkpoint reads
    assert set(ck["model_args"]) == NANOGPT_KEYS and ck["model_extra"]["activation"] == "gelu_tanh"
    assert ck["config"] == {"max_iters": 7, "data_dir": "data/x"} and "train_config" not in ck
    assert checkpoint_config(old).activation == "gelu_tanh"  # the unconverted dict is read too
    loaded, _, new = load_model(str(tmp_path / "old.pt"))
    assert new == [] and loaded.config.activation == "gelu_tanh"
    x = torch.randint(0, 11, (2, 9))
    assert torch.equal(loaded.eval()(x, x)[0], model.eval()(x, x)[0])
    # written again, it is in the new layout
    atomic_torch_save(make_checkpoint(loaded, None, train_config=ck["config"]), tmp_path / "new.pt")
    again = torch.load(tmp_path / "new.pt", weights_only=True, map_location="cpu")
    assert set(again["model_args"]) == NANOGPT_KEYS and again["config"]["dataset"] == "x"
    # old model_args with our fields but no GPTConfig object (no `config` at all)
    mixed = upgrade_layout({"model": {}, "model_args": dict(old["model_args"], mode="reward")})
    assert set(mixed["model_args"]) == NANOGPT_KEYS and mixed["model_extra"]["mode"] == "reward"


def test_training_config_is_plain():
    class Odd(str):
        pass
    cfg = training_config({"a": (1, 2), "b": Odd("x"), "c": object, "dataset": None, "data_dir": "d/e/"})
    assert cfg["a"] == [1, 2] and type(cfg["b"]) is str and isinstance(cfg["c"], str) and cfg["dataset"] == "e"
    assert training_config(None) == {}


def test_checkpoint_tokenization():
    rec = {"method": "char", "vocab_size": 11, "meta_path": "m.pkl"}
    assert checkpoint_tokenization({"tokenization": rec}) == TokenizationInfo.from_dict(rec)
    assert checkpoint_tokenization({"data": {"tokenization": rec}}) == TokenizationInfo.from_dict(rec)
    assert checkpoint_tokenization({"tokenization": {"method": "char"}}) is None  # incomplete
    nano = {"model": {}, "model_args": dict(n_layer=1, n_head=1, n_embd=8, block_size=8, vocab_size=65)}
    assert checkpoint_tokenization(nano) is None
    assert checkpoint_tokenization(nano, guess=True) == TokenizationInfo("char", 65)
    nano["model_args"]["vocab_size"] = 50304
    assert checkpoint_tokenization(nano, guess=True).method == "bpe"
    assert math.isfinite(checkpoint_config(nano).dropout)
