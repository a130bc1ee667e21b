"""Every command-line script on bad input: a table of cases, each run through the script's
real main() and run_cli (in this process, for speed; a few as `python script.py`, forked warm).

Each case must end with a non-zero exit, an `error:` line (prepare_reward_data.py's
validate() prints `ERROR:`) naming the offending file or flag, a `suggestion:` line where
one helps, no traceback, no output that looks complete (ckpt.pt, *_x.bin, train.bin, ...)
in the output directory, and no output directory that the run made and left holding nothing
but its lock. Malicious pickles (meta.pkl and .pt files whose loading would
run `touch MARKER`) must be refused without the marker ever appearing.

docs/design.md (section 7) states these guarantees. To see every case's messages:
    BAD_INPUTS_DUMP=/tmp/msgs.jsonl python -m pytest -q tests/test_bad_inputs.py
"""
import contextlib
import importlib
import io
import json
import os
import pickle
import re
import shlex
import shutil
import sys
import traceback
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from core.cli import run_cli  # noqa: E402
from core.errors import ProjectError  # noqa: E402
from helpers import (make_reward_checkpoint, make_text, prepare_char_data, strip_to_nanogpt,  # noqa: E402
                     run_script, train_tiny_checkpoint)
from lib.checkpoint import read_checkpoint  # noqa: E402
from lib.prepare import prepare_corpus  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N = 32  # block size of the tiny models

# files whose presence would make a failed run look finished
COMPLETE = re.compile(r"^(ckpt\.pt|last\.pt|reward_ckpt\.pt|reward_last\.pt|\w+_[xy]\.bin|\w+_metadata\.txt|"
                      r"train\.bin|val\.bin|meta\.pkl|prepare_info\.json|.*\.done\.json|summary\.(md|json)|"
                      r"grpo_summary\.json|reward_summary\.json|(spin|ddo)_summary\.json|train_summary\.json|"
                      r"reward_data_summary\.json)$")
ERROR_LINE = re.compile(r"^(?:\S+: )?error: (.*)$", re.I)  # run_cli, argparse ("prog: error:"), validate ("ERROR:")
SUGGESTION_LINE = re.compile(r"^suggestion: (.*)$", re.I)


# ----------------------------------------------------------------------------- shared inputs

class Evil:
    """Unpickling this runs a shell command that creates `marker`."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {shlex.quote(self.marker)}",))


def evil_meta(path, marker):
    with open(path, "wb") as f:
        pickle.dump({"vocab_size": 1, "itos": {0: "a"}, "stoi": {"a": 0}, "x": Evil(marker)}, f)
    return path


def evil_checkpoint(path, marker):
    torch.save({"model": {}, "x": Evil(marker)}, path)
    return path


@pytest.fixture(scope="module")
def w(tmp_path_factory):
    """One tiny corpus (char and bpe), a trained generator, a reward checkpoint, a reward
    dataset, and the unsafe/corrupt files every case may use."""
    root = tmp_path_factory.mktemp("bad_inputs")
    text, data = prepare_char_data(str(root / "corpus"))
    gen = train_tiny_checkpoint(data, str(root / "gen.pt"), steps=3, block_size=N)
    reward = make_reward_checkpoint(gen, str(root / "reward.pt"))
    bpe = str(root / "corpus" / "tiny_bpe")
    prepare_corpus(text, bpe, "bpe", log=lambda *a: None)
    rd = str(root / "rd")
    import prepare_reward_data
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        prepare_reward_data.main(["--model_path", gen, "--data_path", text, "--output_dir", rd,
                                  "--meta_path", os.path.join(data, "meta.pkl"), "--samples_per_chunk", "1",
                                  "--max_samples_per_split", "8", "--device", "cpu"])
    marker = str(root / "PWNED")
    x = SimpleNamespace(root=str(root), text=text, data=data, meta=os.path.join(data, "meta.pkl"), gen=gen,
                        reward=reward, bpe=bpe, rd=rd, marker=marker,
                        evil_pt=evil_checkpoint(str(root / "evil.pt"), marker),
                        evil_meta=evil_meta(str(root / "evil_meta.pkl"), marker))
    x.tokens = {s: np.fromfile(os.path.join(data, f"{s}.bin"), dtype=np.uint16) for s in ("train", "val")}
    # not-quite checkpoints
    rng = np.random.default_rng(0)
    x.random_pt = str(root / "random.pt")
    with open(x.random_pt, "wb") as f:
        f.write(rng.integers(0, 256, 4096, dtype=np.uint8).tobytes())
    x.truncated_pt = str(root / "truncated.pt")
    with open(gen, "rb") as src, open(x.truncated_pt, "wb") as f:
        f.write(src.read()[: os.path.getsize(gen) // 2])
    x.tensor_pt = str(root / "tensor.pt")
    torch.save(torch.zeros(3), x.tensor_pt)
    x.nomodel_pt = str(root / "nomodel.pt")
    torch.save({"weights": {"w": torch.zeros(3)}, "iter_num": 3}, x.nomodel_pt)
    # a reward checkpoint that claims the GPT-2 BPE tokenization
    ck = read_checkpoint(reward)
    ck["tokenization"] = {"method": "bpe", "vocab_size": 50257, "meta_path": None}
    x.reward_bpe = str(root / "reward_bpe.pt")
    torch.save(ck, x.reward_bpe)
    # a generator whose recorded vocabulary (meta.pkl) is gone: as if copied from another machine
    ck = read_checkpoint(gen)
    ck["tokenization"] = dict(ck["tokenization"], meta_path=str(root / "gone" / "meta.pkl"))
    ck["data"] = dict(ck["data"], data_dir=str(root / "gone"))
    x.moved_gen = str(root / "moved_gen.pt")
    torch.save(ck, x.moved_gen)
    # a local Hugging Face GPT-2 directory (config.json + model.safetensors), written without transformers
    from safetensors.torch import save_file

    from lib.hf_interop import generator_to_hf
    from model import GPT, GPTConfig
    x.hf_dir = str(root / "gpt2-tiny")
    os.makedirs(x.hf_dir)
    tensors, config = generator_to_hf(GPT(GPTConfig(block_size=N, vocab_size=50257, n_layer=1, n_head=1,
                                                    n_embd=16)), 50257)
    save_file(tensors, os.path.join(x.hf_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(x.hf_dir, "config.json"), "w") as f:
        json.dump(config, f)
    yield x
    assert not os.path.exists(marker), "a malicious pickle was executed"


# ----------------------------------------------------------------------------- bad-file makers
# Each returns the path it made inside the case directory d.

ODD = lambda t: t.tobytes()[:-1]  # noqa: E731  truncated: not a whole number of uint16
EMPTY = lambda t: b""  # noqa: E731
FLOAT32 = lambda t: t.astype(np.float32).tobytes()  # noqa: E731  ids written with the wrong dtype
INT64 = lambda t: t.astype(np.int64).tobytes()  # noqa: E731


def OOV(t):  # noqa: N802  one token id outside the small char vocabulary
    t = t.copy()
    t[5] = 200
    return t.tobytes()


def data_copy(w, d, files=None, name="data_char", info=True, evil=False):
    """Copy of the prepared char data in d/name; files: {'train.bin': maker or None (delete)}."""
    dst = os.path.join(d, name)
    if not os.path.exists(dst):
        shutil.copytree(w.data, dst)
    for fname, make in (files or {}).items():
        path = os.path.join(dst, fname)
        if make is None:
            os.remove(path)
        else:
            with open(path, "wb") as f:
                f.write(make(w.tokens[fname.split(".")[0]]))
    if not info:
        os.remove(os.path.join(dst, "prepare_info.json"))
    if evil:
        evil_meta(os.path.join(dst, "meta.pkl"), w.marker)
    return dst


def bin_file(w, d, make, name="val.bin", split="val"):
    path = os.path.join(d, name)
    with open(path, "wb") as f:
        f.write(make(w.tokens[split]))
    return path


def text_file(d, content, name="input.txt"):
    path = os.path.join(d, name)
    with open(path, "wb") as f:
        f.write(content if isinstance(content, bytes) else content.encode("utf-8"))
    return path


def pickle_file(d, obj, name="list.pkl"):
    path = os.path.join(d, name)
    with open(path, "wb") as f:
        pickle.dump(obj, f)
    return path


def short_corpus(w, d):
    """A real prepared corpus of 30 characters: 27 train and 3 val tokens."""
    _, data = prepare_char_data(os.path.join(d, "short"), text=make_text(30), name="short_char")
    return data


def rd_copy(w, d, x=None, y=None, meta=None, split="train"):
    """Copy of the reward dataset; x/y: bytes -> bytes; meta: {key: value or None (drop)} or raw
    bytes; split: the split(s) to change."""
    dst = os.path.join(d, "rd")
    shutil.copytree(w.rd, dst)
    for sp in ([split] if isinstance(split, str) else split):
        for kind, fn in (("x", x), ("y", y)):
            if fn is not None:
                p = os.path.join(dst, f"{sp}_{kind}.bin")
                with open(p, "rb") as f:
                    raw = f.read()
                with open(p, "wb") as f:
                    f.write(fn(raw))
        p = os.path.join(dst, f"{sp}_metadata.txt")
        if isinstance(meta, bytes):
            with open(p, "wb") as f:
                f.write(meta)
        elif meta is not None:
            with open(p, encoding="utf-8") as f:
                lines = f.read().splitlines()
            kept = [ln for ln in lines if ln.split(":", 1)[0] not in meta]
            kept += [f"{k}: {v}" for k, v in meta.items() if v is not None]
            with open(p, "w", encoding="utf-8") as f:
                f.write("\n".join(kept) + "\n")
    return dst


def rd_oov(raw):
    x = np.frombuffer(raw, dtype=np.uint16).copy()
    x[3] = 300
    return x.tobytes()


def empty_dir(d, name="empty"):
    os.makedirs(os.path.join(d, name))
    return os.path.join(d, name)


def file_at(d, name="afile"):
    return text_file(d, "not a directory\n", name)


def unwritable(d):
    ro = os.path.join(d, "ro")
    os.makedirs(ro)
    os.chmod(ro, 0o555)
    return os.path.join(ro, "out")


def hf_copy(w, d, drop=None, config=None, cut=False):
    """Copy of the Hugging Face directory in d/hf: without the file `drop`, with config.json keys
    changed, or with model.safetensors cut short."""
    dst = os.path.join(d, "hf")
    shutil.copytree(w.hf_dir, dst)
    if drop:
        os.remove(os.path.join(dst, drop))
    if config:
        p = os.path.join(dst, "config.json")
        with open(p) as f:
            cfg = json.load(f)
        with open(p, "w") as f:
            json.dump({**cfg, **config}, f)
    if cut:
        p = os.path.join(dst, "model.safetensors")
        os.truncate(p, os.path.getsize(p) // 2)
    return dst


def with_file(d, name="out", file="notes.txt"):
    """A directory d/name holding one file of the user's."""
    os.makedirs(os.path.join(d, name))
    text_file(os.path.join(d, name), "mine\n", file)
    return os.path.join(d, name)


def ckpt_dir(d, src, name="ckpt.pt"):
    """An out_dir holding `src` as `name` (for --init_from resume / --resume)."""
    out = os.path.join(d, "out")
    os.makedirs(out, exist_ok=True)
    shutil.copy(src, os.path.join(out, name))
    return out


# ----------------------------------------------------------------------------- base command lines

def prep(w, d, *extra, text=None, out=None):
    return ["--input", text or w.text, "--out_dir", out or os.path.join(d, "out"), *extra]


def train(w, d, *extra, data=None, out=None):
    return ["--data_dir", data or w.data, "--out_dir", out or os.path.join(d, "out"), "--n_layer", "1",
            "--n_head", "1", "--n_embd", "16", "--block_size", "16", "--batch_size", "2", "--max_iters", "0",
            "--eval_iters", "1", "--device", "cpu", *extra]


def sample(w, d, *extra, ckpt=None):
    return ["--ckpt", ckpt or w.gen, "--num_samples", "1", "--max_new_tokens", "2", "--device", "cpu", *extra]


def evaluate(w, d, *extra, ckpt=None):
    return ["--ckpt", ckpt or w.gen, "--max_batches", "1", "--device", "cpu", *extra]


def prd(w, d, *extra, model=None, text=True, out=None):
    src = ["--data_path", w.text, "--meta_path", w.meta] if text else []
    return ["--model_path", model or w.gen, *src, "--output_dir", out or os.path.join(d, "out"),
            "--samples_per_chunk", "1", "--max_samples_per_split", "4", "--device", "cpu", *extra]


def prd_text(w, d, text, *extra):
    """prepare_reward_data.py on the text file `text` (with the base model's meta.pkl)."""
    return prd(w, d, *extra, text=False) + ["--data_path", text, "--meta_path", w.meta]


def prd_bin(w, d, train_bin, val_bin=None, *extra, model=None):
    return prd(w, d, "--input_mode", "binary", "--train_bin", train_bin,
               "--val_bin", val_bin or os.path.join(w.data, "val.bin"), *extra, model=model, text=False)


def trm(w, d, *extra, model=None, data=None, out=None):
    return ["--model_path", model or w.gen, "--data_dir", data or w.rd, "--out_dir", out or os.path.join(d, "out"),
            "--max_iters", "1", "--batch_size", "4", "--device", "cpu", *extra]


def grpo(w, d, *extra, model=None, reward=None, out=None):
    return ["--model_path", model or w.gen, "--reward_model_path", reward or w.reward,
            "--out_dir", out or os.path.join(d, "out"), "--max_steps", "0", "--prompts_per_step", "1",
            "--group_size", "2", "--eval_max_batches", "1", "--device", "cpu", *extra]


def export(w, d, *extra, ckpt=None, out=None):
    return ["--ckpt", ckpt or w.gen, "--out_dir", out or os.path.join(d, "out"), "--skip_check", *extra]


def cycles(w, d, *extra, base=None, data=None, out=None):
    return ["--data_dir", data or w.data, "--out_dir", out or os.path.join(d, "out"),
            "--base_ckpt", base or w.gen, "--max_cycles", "0", "--device", "cpu", *extra]


# ----------------------------------------------------------------------------- the table

@dataclass
class Case:
    id: str
    script: str
    args: object  # (w, d) -> argv
    expect: str  # regex searched in the error line(s)
    names: tuple = ()  # strings the error line(s) must contain; {d} is the case dir, {w.x} a shared input
    suggestion: bool = True  # a `suggestion:` line is required
    out: str = "{d}/out"  # gains no file that looks like finished output (planted inputs stay unchanged)
    marker: bool = False  # a file that would run code when loaded is involved
    needs_non_root: bool = False


C = Case
CASES = [
    # --- prepare_data.py: text -> train.bin / val.bin / meta.pkl
    C("prepare_data-missing-input", "prepare_data.py", lambda w, d: prep(w, d, text=f"{d}/nope.txt"),
      r"text file not found", ("{d}/nope.txt", "--input")),
    C("prepare_data-empty-input", "prepare_data.py", lambda w, d: prep(w, d, text=text_file(d, "")),
      r"is empty", ("{d}/input.txt",)),
    C("prepare_data-non-utf8", "prepare_data.py",
      lambda w, d: prep(w, d, text=text_file(d, "caf\xe9 au lait\n".encode("latin-1"))),
      r"not valid UTF-8", ("{d}/input.txt",)),
    C("prepare_data-too-short-to-split", "prepare_data.py", lambda w, d: prep(w, d, text=text_file(d, "a")),
      r"is too short to split with train_split=0\.9", ("{d}/input.txt",)),
    C("prepare_data-chars-missing-from-meta", "prepare_data.py",
      lambda w, d: prep(w, d, "--meta_path", w.meta, text=text_file(d, make_text(2000) + "\n\u00e9t\u00e9 \u20ac\n")),
      r"not in the char vocabulary", ("{w.meta}",)),
    C("prepare_data-malicious-meta", "prepare_data.py", lambda w, d: prep(w, d, "--meta_path", w.evil_meta),
      r"unsafe or invalid meta\.pkl", ("{w.evil_meta}",), marker=True),
    C("prepare_data-meta-not-a-vocabulary", "prepare_data.py",
      lambda w, d: prep(w, d, "--meta_path", pickle_file(d, ["a", "b"])), r"not a char meta\.pkl", ("{d}/list.pkl",)),
    C("prepare_data-meta-with-bpe", "prepare_data.py",
      lambda w, d: prep(w, d, "--tokenization", "bpe", "--meta_path", w.meta),
      r"--meta_path is a char vocabulary, but --tokenization is bpe", ()),
    C("prepare_data-train-split-1", "prepare_data.py", lambda w, d: prep(w, d, "--train_split", "1"),
      r"--train_split must be in \(0, 1\), got 1\.0", ()),
    C("prepare_data-out-dir-is-file", "prepare_data.py", lambda w, d: prep(w, d, out=file_at(d)),
      r"is a file", ("{d}/afile", "--out_dir"), out="{d}"),
    C("prepare_data-out-dir-unwritable", "prepare_data.py", lambda w, d: prep(w, d, out=unwritable(d)),
      r"cannot be created or written", ("{d}/ro/out",), out="{d}/ro", needs_non_root=True),

    # --- train.py
    C("train-data-dir-missing", "train.py", lambda w, d: train(w, d, data=f"{d}/nowhere"),
      r"does not exist", ("{d}/nowhere", "--data_dir")),
    C("train-train-bin-missing", "train.py", lambda w, d: train(w, d, data=data_copy(w, d, {"train.bin": None})),
      r"token file not found", ("{d}/data_char/train.bin",)),
    C("train-train-bin-empty", "train.py", lambda w, d: train(w, d, data=data_copy(w, d, {"train.bin": EMPTY})),
      r"is empty", ("{d}/data_char/train.bin",)),
    C("train-train-bin-odd-size", "train.py", lambda w, d: train(w, d, data=data_copy(w, d, {"train.bin": ODD})),
      r"odd size", ("{d}/data_char/train.bin",)),
    C("train-val-bin-int64", "train.py", lambda w, d: train(w, d, data=data_copy(w, d, {"val.bin": INT64})),
      r"holds 4,000 uint16 tokens but prepare_info\.json beside it records 1,000", ("{d}/data_char/val.bin",)),
    C("train-train-bin-float32-no-info", "train.py",
      lambda w, d: train(w, d, data=data_copy(w, d, {"train.bin": FLOAT32}, info=False)),
      r"token id \d+, outside the vocabulary of size \d+", ("{d}/data_char/train.bin",)),
    C("train-token-id-out-of-vocab", "train.py", lambda w, d: train(w, d, data=data_copy(w, d, {"train.bin": OOV})),
      r"token id 200, outside the vocabulary of size \d+", ("{d}/data_char/train.bin",)),
    C("train-corpus-shorter-than-block", "train.py", lambda w, d: train(w, d, data=short_corpus(w, d)),
      r"3 tokens, fewer than the 17 needed", ("{d}/short/short_char/val.bin",)),
    C("train-malicious-meta", "train.py", lambda w, d: train(w, d, data=data_copy(w, d, evil=True)),
      r"unsafe or invalid meta\.pkl", ("{d}/data_char/meta.pkl",), marker=True),
    C("train-bpe-flag-on-char-data", "train.py", lambda w, d: train(w, d, "--tokenization", "bpe"),
      r"Tokenization method mismatch", ("{w.data}",)),
    C("train-meta-path-with-bpe", "train.py", lambda w, d: train(w, d, "--tokenization", "bpe", "--meta_path", w.meta),
      r"--meta_path is a char vocabulary, but --tokenization is bpe", ()),
    C("train-resume-without-run", "train.py", lambda w, d: train(w, d, "--init_from", "resume"),
      r"no last\.pt or ckpt\.pt", ("{d}/out",)),
    C("train-resume-reward-checkpoint", "train.py",
      lambda w, d: train(w, d, "--init_from", "resume", out=ckpt_dir(d, w.reward)),
      r"is a reward checkpoint, but a generator checkpoint is needed", ("{d}/out/ckpt.pt",)),
    C("train-resume-corrupt-last", "train.py",
      lambda w, d: train(w, d, "--init_from", "resume", out=ckpt_dir(d, w.random_pt, "last.pt")),
      r"is not a PyTorch checkpoint \(neither a torch.save zip archive nor a pickle\)", ("{d}/out/last.pt",),),
    C("train-resume-malicious-last", "train.py",
      lambda w, d: train(w, d, "--init_from", "resume", out=ckpt_dir(d, w.evil_pt, "last.pt")),
      r"refused by the safe loader", ("{d}/out/last.pt",), marker=True),
    C("train-resume-other-tokenization", "train.py",
      lambda w, d: train(w, d, "--init_from", "resume", data=w.bpe, out=ckpt_dir(d, w.gen)),
      r"has vocab_size \d+ but the data in .* needs 50304", ("{d}/out/ckpt.pt", "{w.bpe}"),),
    C("train-init-from-hub-name", "train.py", lambda w, d: train(w, d, "--init_from", "gpt2"),
      r"^--init_from gpt2 is not a local model directory or checkpoint file, and models are never downloaded$", ()),
    C("train-init-from-gpt2-on-char-data", "train.py", lambda w, d: train(w, d, "--init_from", w.hf_dir),
      r"holds a bpe model \(vocab_size 50257\) but --data_dir .* is tokenized char", ("{w.hf_dir}", "{w.data}")),
    C("train-init-from-dir-without-config", "train.py", lambda w, d: train(w, d, "--init_from", empty_dir(d)),
      r"is a directory without a config\.json", ("{d}/empty",)),
    C("train-out-dir-is-file", "train.py", lambda w, d: train(w, d, out=file_at(d)),
      r"is a file", ("{d}/afile", "--out_dir"), out="{d}"),
    C("train-out-dir-unwritable", "train.py", lambda w, d: train(w, d, out=unwritable(d)),
      r"cannot be created or written", ("{d}/ro/out",), out="{d}/ro", needs_non_root=True),
    C("train-n-embd-not-divisible", "train.py", lambda w, d: train(w, d, "--n_head", "3"),
      r"--n_embd 16 is not divisible by --n_head 3", (), suggestion=False),
    C("train-dtype-not-a-choice", "train.py", lambda w, d: train(w, d, "--dtype", "float64"),
      r"argument --dtype: invalid choice: 'float64'", (), suggestion=False),
    C("train-config-with-code", "train.py",
      lambda w, d: train(w, d, "--config", text_file(d, f"batch_size = __import__('os').system('touch {w.marker}')\n",
                                                      "evil_config.py")),
      r"cannot evaluate the value of batch_size \(it calls a function\)", ("{d}/evil_config.py",), marker=True),

    # --- sample.py
    C("sample-ckpt-missing", "sample.py", lambda w, d: sample(w, d, ckpt=f"{d}/none.pt"),
      r"checkpoint not found", ("{d}/none.pt",)),
    C("sample-ckpt-hub-name", "sample.py", lambda w, d: sample(w, d, ckpt="gpt2-medium"),
      r"^gpt2-medium is not a local model directory or checkpoint file, and models are never downloaded$", ()),
    C("sample-ckpt-dir-without-weights", "sample.py", lambda w, d: sample(w, d, ckpt=hf_copy(w, d, "model.safetensors")),
      r"has a config\.json but no weights", ("{d}/hf",)),
    C("sample-ckpt-dir-not-gpt2", "sample.py", lambda w, d: sample(w, d, ckpt=hf_copy(w, d, config={"model_type": "llama"})),
      r"model_type is 'llama', only 'gpt2' models can be loaded", ("{d}/hf/config.json",)),
    C("sample-ckpt-dir-other-activation", "sample.py",
      lambda w, d: sample(w, d, ckpt=hf_copy(w, d, config={"activation_function": "relu"})),
      r"cannot reproduce activation_function 'relu'", ("{d}/hf/config.json",)),
    C("sample-ckpt-dir-truncated-safetensors", "sample.py", lambda w, d: sample(w, d, ckpt=hf_copy(w, d, cut=True)),
      r"is not a readable safetensors file", ("{d}/hf/model.safetensors",)),
    C("sample-ckpt-random-bytes", "sample.py", lambda w, d: sample(w, d, ckpt=w.random_pt),
      r"is not a PyTorch checkpoint", ("{w.random_pt}",)),
    C("sample-ckpt-truncated-zip", "sample.py", lambda w, d: sample(w, d, ckpt=w.truncated_pt),
      r"damaged checkpoint: its zip archive is truncated", ("{w.truncated_pt}",)),
    C("sample-ckpt-plain-tensor", "sample.py", lambda w, d: sample(w, d, ckpt=w.tensor_pt),
      r"not a model checkpoint", ("{w.tensor_pt}",)),
    C("sample-ckpt-dict-without-model", "sample.py", lambda w, d: sample(w, d, ckpt=w.nomodel_pt),
      r"not a model checkpoint", ("{w.nomodel_pt}",)),
    C("sample-ckpt-malicious", "sample.py", lambda w, d: sample(w, d, ckpt=w.evil_pt),
      r"refused by the safe loader", ("{w.evil_pt}",), marker=True),
    C("sample-reward-checkpoint", "sample.py", lambda w, d: sample(w, d, ckpt=w.reward),
      r"is a reward checkpoint, but a generator checkpoint is needed", ("{w.reward}",)),
    C("sample-meta-malicious", "sample.py", lambda w, d: sample(w, d, "--meta_path", w.evil_meta),
      r"unsafe or invalid meta\.pkl", ("{w.evil_meta}",), marker=True),
    C("sample-vocabulary-moved", "sample.py", lambda w, d: sample(w, d, ckpt=w.moved_gen),
      r"char vocabulary of .* was not found", ("{w.moved_gen}", "gone/meta.pkl")),
    C("sample-bpe-on-char-model", "sample.py", lambda w, d: sample(w, d, "--tokenization", "bpe"),
      r"50257 tokens but the model", ("{w.gen}",)),
    C("sample-prompt-chars-not-in-vocab", "sample.py", lambda w, d: sample(w, d, "--start", "caf\u00e9 \u20ac"),
      r"not in the char vocabulary", ("'\u00e9'",)),
    C("sample-prompt-file-non-utf8", "sample.py",
      lambda w, d: sample(w, d, "--start", "FILE:" + text_file(d, b"ROMEO:\n\xff\xfe\n", "prompt.txt")),
      r"not valid UTF-8", ("{d}/prompt.txt",)),
    C("sample-prompt-file-missing", "sample.py", lambda w, d: sample(w, d, "--start", f"FILE:{d}/none.txt"),
      r"^text file not found: .* \(--start FILE:\)$", ("{d}/none.txt",)),
    C("sample-prompt-file-is-empty-directory", "sample.py",
      lambda w, d: sample(w, d, "--start", "FILE:" + empty_dir(d)),
      r"^text file not found: .* \(--start FILE:\)$", ("{d}/empty/input.txt",)),
    C("sample-meta-path-is-directory", "sample.py", lambda w, d: sample(w, d, "--meta_path", empty_dir(d)),
      r"^meta file .* is a directory$", ("{d}/empty",)),
    C("sample-top-k-negative", "sample.py", lambda w, d: sample(w, d, "--top_k", "-1"),
      r"--top_k must not be negative, got -1", ()),
    C("sample-num-samples-0", "sample.py", lambda w, d: sample(w, d, "--num_samples", "0"),
      r"--num_samples", (), suggestion=False),
    C("sample-device-unavailable", "sample.py", lambda w, d: sample(w, d, "--device", "cuda:99"),
      r"--device cuda:99 is not available", ()),

    # --- evaluate.py
    C("evaluate-reward-checkpoint", "evaluate.py", lambda w, d: evaluate(w, d, ckpt=w.reward),
      r"is a reward checkpoint, but a generator checkpoint is needed", ("{w.reward}",)),
    C("evaluate-ckpt-malicious", "evaluate.py", lambda w, d: evaluate(w, d, ckpt=w.evil_pt),
      r"refused by the safe loader", ("{w.evil_pt}",), marker=True),
    C("evaluate-block-size-too-large", "evaluate.py", lambda w, d: evaluate(w, d, "--block_size", "64"),
      r"--block_size must be in \[1, 32\]", ()),
    C("evaluate-bin-missing", "evaluate.py", lambda w, d: evaluate(w, d, "--bin", f"{d}/none.bin"),
      r"token file not found", ("{d}/none.bin",)),
    C("evaluate-bin-is-directory", "evaluate.py", lambda w, d: evaluate(w, d, "--bin", empty_dir(d)),
      r"^token file .* is a directory$", ("{d}/empty",)),
    C("evaluate-bin-empty", "evaluate.py", lambda w, d: evaluate(w, d, "--bin", bin_file(w, d, EMPTY)),
      r"is empty", ("{d}/val.bin",)),
    C("evaluate-bin-odd-size", "evaluate.py", lambda w, d: evaluate(w, d, "--bin", bin_file(w, d, ODD)),
      r"odd size", ("{d}/val.bin",)),
    C("evaluate-bin-float32", "evaluate.py", lambda w, d: evaluate(w, d, "--bin", bin_file(w, d, FLOAT32)),
      r"outside the vocabulary of size \d+", ("{d}/val.bin",)),
    C("evaluate-bin-token-out-of-vocab", "evaluate.py", lambda w, d: evaluate(w, d, "--bin", bin_file(w, d, OOV)),
      r"token id 200", ("{d}/val.bin",)),
    C("evaluate-val-bin-int64", "evaluate.py",
      lambda w, d: evaluate(w, d, "--data_dir", data_copy(w, d, {"val.bin": INT64})),
      r"holds 4,000 uint16 tokens but prepare_info\.json beside it records 1,000", ("{d}/data_char/val.bin",)),
    C("evaluate-bpe-data-for-char-model", "evaluate.py", lambda w, d: evaluate(w, d, "--data_dir", w.bpe),
      r"Tokenization method mismatch: data in .* uses 'bpe' but expected 'char'", ("{w.bpe}",)),
    C("evaluate-malicious-meta-beside-data", "evaluate.py",
      lambda w, d: evaluate(w, d, "--data_dir", data_copy(w, d, info=False, evil=True)),
      r"unsafe or invalid meta\.pkl", ("{d}/data_char/meta.pkl",), marker=True),
    C("evaluate-gpt2-dir-on-char-data", "evaluate.py", lambda w, d: evaluate(w, d, "--data_dir", w.data, ckpt=w.hf_dir),
      r"Tokenization method mismatch: data in .* uses 'char' but expected 'bpe'", ("{w.data}",)),
    C("evaluate-data-dir-missing", "evaluate.py", lambda w, d: evaluate(w, d, "--data_dir", f"{d}/nowhere"),
      r"data directory not found", ("{d}/nowhere",)),
    C("evaluate-batch-size-0", "evaluate.py", lambda w, d: evaluate(w, d, "--batch_size", "0"),
      r"--batch_size", (), suggestion=False),

    # --- prepare_reward_data.py (validate() prints all problems as ERROR:/SUGGESTION: lines)
    C("prepare_reward_data-model-missing", "prepare_reward_data.py", lambda w, d: prd(w, d, model=f"{d}/none.pt"),
      r"Model file not found", ("{d}/none.pt",)),
    C("prepare_reward_data-model-hub-name", "prepare_reward_data.py", lambda w, d: prd(w, d, model="gpt2"),
      r"--model_path gpt2 is not a local model directory", ()),
    C("prepare_reward_data-model-corrupt", "prepare_reward_data.py", lambda w, d: prd(w, d, model=w.truncated_pt),
      r"damaged checkpoint: its zip archive is truncated", ("{w.truncated_pt}",)),
    C("prepare_reward_data-model-not-a-checkpoint", "prepare_reward_data.py",
      lambda w, d: prd(w, d, model=w.nomodel_pt),
      r"not a model checkpoint", ("{w.nomodel_pt}",)),
    C("prepare_reward_data-model-malicious", "prepare_reward_data.py", lambda w, d: prd(w, d, model=w.evil_pt),
      r"refused by the safe loader", ("{w.evil_pt}",), marker=True),
    C("prepare_reward_data-reward-checkpoint", "prepare_reward_data.py", lambda w, d: prd(w, d, model=w.reward),
      r"is a reward checkpoint, but the base model must be a generator", ("{w.reward}",)),
    C("prepare_reward_data-block-size-too-large", "prepare_reward_data.py",
      lambda w, d: prd(w, d, "--block_size", "64"),
      r"--block_size 64 exceeds the model's block_size 32", ()),
    C("prepare_reward_data-text-missing", "prepare_reward_data.py",
      lambda w, d: prd_text(w, d, f"{d}/none.txt"),
      r"Data file not found", ("{d}/none.txt",)),
    C("prepare_reward_data-text-empty", "prepare_reward_data.py",
      lambda w, d: prd_text(w, d, text_file(d, "")),
      r"Data file is empty", ("{d}/input.txt",)),
    C("prepare_reward_data-text-non-utf8", "prepare_reward_data.py",
      lambda w, d: prd_text(w, d, text_file(d, b"ROMEO:\n\xe9t\xe9\n" * 50)),
      r"not valid UTF-8", ("{d}/input.txt",)),
    C("prepare_reward_data-text-shorter-than-block", "prepare_reward_data.py",
      lambda w, d: prd_text(w, d, text_file(d, make_text(20))),
      r"shorter than one block", ("{d}/input.txt",)),
    C("prepare_reward_data-chars-missing-from-meta", "prepare_reward_data.py",
      lambda w, d: prd_text(w, d, text_file(d, make_text(3000) + "\u00e9t\u00e9\n")),
      r"not in the char vocabulary", ("{w.meta}", "'\u00e9'")),
    C("prepare_reward_data-malicious-meta", "prepare_reward_data.py",
      lambda w, d: prd(w, d, text=False) + ["--data_path", w.text, "--meta_path", w.evil_meta],
      r"unsafe or invalid meta\.pkl", ("{w.evil_meta}",), marker=True),
    C("prepare_reward_data-bpe-flag-on-char-model", "prepare_reward_data.py",
      lambda w, d: prd(w, d, text=False) + ["--data_path", w.text, "--tokenization", "bpe"],
      r"vocab_size 50257 exceeds the model's vocab_size \d+", ()),
    C("prepare_reward_data-bpe-bins-for-char-model", "prepare_reward_data.py",
      lambda w, d: prd_bin(w, d, f"{w.bpe}/train.bin", f"{w.bpe}/val.bin"),
      r"Tokenization method mismatch|exceeds the model's vocab_size", ()),
    C("prepare_reward_data-binary-mode-with-data-path", "prepare_reward_data.py",
      lambda w, d: prd(w, d, "--input_mode", "binary"),
      r"--data_path is ignored in binary mode", ("data_path", "train_bin")),
    C("prepare_reward_data-text-mode-with-train-bin", "prepare_reward_data.py",
      lambda w, d: prd(w, d, "--train_bin", f"{w.data}/train.bin"),
      r"--train_bin/--val_bin are ignored in text mode", ()),
    C("prepare_reward_data-bins-shorter-than-block", "prepare_reward_data.py",
      lambda w, d: prd_bin(w, d, f"{short_corpus(w, d)}/train.bin", f"{d}/short/short_char/val.bin"),
      r"holds 27 tokens, fewer than one block of 32", ("{d}/short/short_char/train.bin",)),
    C("prepare_reward_data-malicious-meta-beside-bins", "prepare_reward_data.py",
      lambda w, d: prd_bin(w, d, f"{data_copy(w, d, evil=True)}/train.bin", f"{d}/data_char/val.bin"),
      r"unsafe or invalid meta\.pkl", ("{d}/data_char/meta.pkl",), marker=True),
    C("prepare_reward_data-train-bin-missing", "prepare_reward_data.py",
      lambda w, d: prd_bin(w, d, f"{d}/none.bin"), r"^Train binary file not found: \S+$",  # and nothing else
      ("{d}/none.bin",)),
    C("prepare_reward_data-train-bin-odd", "prepare_reward_data.py",
      lambda w, d: prd_bin(w, d, f"{data_copy(w, d, {'train.bin': ODD})}/train.bin", f"{d}/data_char/val.bin"),
      r"not a whole number of uint16 tokens", ("{d}/data_char/train.bin",)),
    C("prepare_reward_data-train-bin-empty", "prepare_reward_data.py",
      lambda w, d: prd_bin(w, d, f"{data_copy(w, d, {'train.bin': EMPTY})}/train.bin", f"{d}/data_char/val.bin"),
      r"has 0 bytes", ("{d}/data_char/train.bin",)),
    C("prepare_reward_data-train-bin-float32", "prepare_reward_data.py",
      lambda w, d: prd_bin(w, d, f"{data_copy(w, d, {'train.bin': FLOAT32})}/train.bin", f"{d}/data_char/val.bin"),
      r"outside the vocabulary of size \d+", ("{d}/data_char/train.bin",)),
    C("prepare_reward_data-val-bin-token-out-of-vocab", "prepare_reward_data.py",
      lambda w, d: prd_bin(w, d, f"{data_copy(w, d, {'val.bin': OOV})}/train.bin", f"{d}/data_char/val.bin"),
      r"token id 200, outside the vocabulary", ("{d}/data_char/val.bin",)),
    C("prepare_reward_data-val-bin-int64", "prepare_reward_data.py",
      lambda w, d: prd_bin(w, d, f"{data_copy(w, d, {'val.bin': INT64})}/train.bin", f"{d}/data_char/val.bin"),
      r"split does not match the base model's", ("val:",)),
    C("prepare_reward_data-temperature-0", "prepare_reward_data.py", lambda w, d: prd(w, d, "--temperature", "0"),
      r"--temperature must be > 0", ()),
    C("prepare_reward_data-top-k-0", "prepare_reward_data.py", lambda w, d: prd(w, d, "--top_k", "0"),
      r"--top_k must be >= 1", ()),
    C("prepare_reward_data-train-split-0", "prepare_reward_data.py", lambda w, d: prd(w, d, "--train_split", "0"),
      r"--train_split must be in \(0, 1\)", ()),
    C("prepare_reward_data-out-dir-is-file", "prepare_reward_data.py", lambda w, d: prd(w, d, out=file_at(d)),
      r"exists and is a file", ("{d}/afile",), out="{d}"),
    C("prepare_reward_data-out-dir-unwritable", "prepare_reward_data.py", lambda w, d: prd(w, d, out=unwritable(d)),
      r"not writable", ("{d}/ro/out",), out="{d}/ro", needs_non_root=True),

    # --- train_reward_model.py
    C("train_reward_model-reward-checkpoint-as-base", "train_reward_model.py", lambda w, d: trm(w, d, model=w.reward),
      r"is a reward checkpoint, but a generator checkpoint is needed", ("{w.reward}",)),
    C("train_reward_model-base-malicious", "train_reward_model.py", lambda w, d: trm(w, d, model=w.evil_pt),
      r"refused by the safe loader", ("{w.evil_pt}",), marker=True),
    C("train_reward_model-base-plain-tensor", "train_reward_model.py", lambda w, d: trm(w, d, model=w.tensor_pt),
      r"not a model checkpoint", ("{w.tensor_pt}",)),
    C("train_reward_model-dataset-missing", "train_reward_model.py", lambda w, d: trm(w, d, data=f"{d}/nowhere"),
      r"metadata not found", ("{d}/nowhere/train_metadata.txt",)),
    C("train_reward_model-x-not-whole-rows", "train_reward_model.py",
      lambda w, d: trm(w, d, data=rd_copy(w, d, x=lambda b: b[:-2 * 5])),
      r"is truncated", ("{d}/rd/train_x.bin",)),
    C("train_reward_model-y-not-whole-rows", "train_reward_model.py",
      lambda w, d: trm(w, d, data=rd_copy(w, d, y=lambda b: b + b"\0" * 4, split="val")),
      r"is too large", ("{d}/rd/val_y.bin",)),
    C("train_reward_model-metadata-num-samples", "train_reward_model.py",
      lambda w, d: trm(w, d, data=rd_copy(w, d, meta={"num_samples": "9"})),
      r"disagree with num_samples 9", ("{d}/rd/train_metadata.txt",)),
    C("train_reward_model-metadata-shapes-num-samples", "train_reward_model.py",
      lambda w, d: trm(w, d, data=rd_copy(w, d, meta={"num_samples": "9", "x_shape": "(9, 32)", "y_shape": "(9, 2)"})),
      r"is truncated", ("{d}/rd/train_x.bin",)),
    C("train_reward_model-metadata-block-size", "train_reward_model.py",
      lambda w, d: trm(w, d, data=rd_copy(w, d, meta={"block_size": "16"}, split="val")),
      r"disagree with num_samples 8 and block_size 16", ("{d}/rd/val_metadata.txt",)),
    C("train_reward_model-metadata-dtype", "train_reward_model.py",
      lambda w, d: trm(w, d, data=rd_copy(w, d, meta={"x_dtype": "int32"})),
      r"expected uint16 X", ("{d}/rd/train_metadata.txt",)),
    C("train_reward_model-metadata-vocab", "train_reward_model.py",
      lambda w, d: trm(w, d, data=rd_copy(w, d, meta={"vocab_size": "70"})),
      r"Vocabulary size mismatch", ("{d}/rd/train_metadata.txt",)),
    C("train_reward_model-metadata-bpe", "train_reward_model.py",
      lambda w, d: trm(w, d, data=rd_copy(w, d, meta={"tokenization_method": "bpe", "vocab_size": "50257"})),
      r"Tokenization method mismatch: .*uses 'bpe' but expected 'char'", ("{d}/rd/train_metadata.txt",)),
    C("train_reward_model-metadata-missing-key", "train_reward_model.py",
      lambda w, d: trm(w, d, data=rd_copy(w, d, meta={"block_size": None})),
      r"lacks block_size", ("{d}/rd/train_metadata.txt",)),
    C("train_reward_model-metadata-not-text", "train_reward_model.py",
      lambda w, d: trm(w, d, data=rd_copy(w, d, meta=b"\x80\x81\xff" * 10)),
      r"not valid UTF-8", ("{d}/rd/train_metadata.txt",)),
    C("train_reward_model-block-size-larger-than-model", "train_reward_model.py",
      lambda w, d: trm(w, d, data=rd_copy(w, d, y=lambda b: b[:len(b) // 2], split=("train", "val"),
                                          meta={"num_samples": "4", "block_size": "64", "x_shape": "(4, 64)",
                                                "y_shape": "(4, 2)"})),
      r"64 tokens, more than the model's block_size 32", ()),
    C("train_reward_model-token-id-out-of-vocab", "train_reward_model.py",
      lambda w, d: trm(w, d, data=rd_copy(w, d, x=rd_oov)), r"token id 300", ("{d}/rd/train_x.bin",)),
    C("train_reward_model-out-dir-is-file", "train_reward_model.py", lambda w, d: trm(w, d, out=file_at(d)),
      r"is a file", ("{d}/afile", "--out_dir"), out="{d}"),
    C("train_reward_model-out-dir-unwritable", "train_reward_model.py", lambda w, d: trm(w, d, out=unwritable(d)),
      r"cannot be created or written", ("{d}/ro/out",), out="{d}/ro", needs_non_root=True),
    C("train_reward_model-unfreeze-more-blocks-than-model", "train_reward_model.py",
      lambda w, d: trm(w, d, "--unfreeze_last_n_blocks", "5"), r"--unfreeze_last_n_blocks 5 exceeds", ()),
    C("train_reward_model-resume-foreign-last", "train_reward_model.py",
      lambda w, d: trm(w, d, "--resume", out=ckpt_dir(d, w.gen, "reward_last.pt")),
      r"no training state", ("{d}/out/reward_last.pt",),),

    # --- train_grpo.py
    C("train_grpo-reward-checkpoint-as-policy", "train_grpo.py", lambda w, d: grpo(w, d, model=w.reward),
      r"is a reward checkpoint, but a generator checkpoint is needed", ("{w.reward}",)),
    C("train_grpo-generator-as-reward-model", "train_grpo.py", lambda w, d: grpo(w, d, reward=w.gen),
      r"is a generator checkpoint, but a reward checkpoint is needed", ("{w.gen}",)),
    C("train_grpo-reward-model-malicious", "train_grpo.py", lambda w, d: grpo(w, d, reward=w.evil_pt),
      r"refused by the safe loader", ("{w.evil_pt}",), marker=True),
    C("train_grpo-policy-random-bytes", "train_grpo.py", lambda w, d: grpo(w, d, model=w.random_pt),
      r"is not a PyTorch checkpoint", ("{w.random_pt}",)),
    C("train_grpo-reward-model-bpe", "train_grpo.py", lambda w, d: grpo(w, d, reward=w.reward_bpe),
      r"Tokenization method mismatch: reward model .* uses 'bpe' but expected 'char'", ("{w.reward_bpe}",)),
    C("train_grpo-seq-len-too-large", "train_grpo.py", lambda w, d: grpo(w, d, "--seq_len", "64"),
      r"--seq_len 64 must be in \[2, 32\]", ()),
    C("train_grpo-seq-len-zero", "train_grpo.py", lambda w, d: grpo(w, d, "--seq_len", "0"),
      r"--seq_len 0 must be in \[2, 32\]", ()),  # not the default length
    C("train_grpo-data-dir-missing", "train_grpo.py", lambda w, d: grpo(w, d, "--data_dir", f"{d}/nowhere"),
      r"train split not found", ("{d}/nowhere/train.bin",)),
    C("train_grpo-data-dir-other-split", "train_grpo.py", lambda w, d: grpo(w, d, "--data_dir", w.bpe),
      r"is not the train split the policy was trained on", ("{w.bpe}/train.bin",)),
    C("train_grpo-top-k-unknown", "train_grpo.py", lambda w, d: grpo(w, d, "--top_k", "5"),
      r"unrecognized arguments: --top_k 5", (), suggestion=False),  # argparse: the flag is gone
    C("train_grpo-group-size-1", "train_grpo.py", lambda w, d: grpo(w, d, "--group_size", "1"),
      r"--group_size must be >= 2", ()),
    C("train_grpo-out-dir-is-file", "train_grpo.py", lambda w, d: grpo(w, d, out=file_at(d)),
      r"is a file", ("{d}/afile", "--out_dir"), out="{d}"),
    C("train_grpo-out-dir-unwritable", "train_grpo.py", lambda w, d: grpo(w, d, out=unwritable(d)),
      r"cannot be created or written", ("{d}/ro/out",), out="{d}/ro", needs_non_root=True),
    C("train_grpo-resume-foreign-checkpoint", "train_grpo.py",
      lambda w, d: grpo(w, d, "--resume", out=ckpt_dir(d, w.gen)),
      r"holds no GRPO state", ("{d}/out/ckpt.pt",),),

    # --- run_cycles.py (checks its own inputs before starting any step)
    C("run_cycles-base-ckpt-missing", "run_cycles.py", lambda w, d: cycles(w, d, base=f"{d}/none.pt"),
      r"--base_ckpt .* not found", ("{d}/none.pt",)),
    C("run_cycles-base-ckpt-hub-name", "run_cycles.py", lambda w, d: cycles(w, d, base="gpt2-xl"),
      r"--base_ckpt gpt2-xl is not a local model directory", ()),
    C("run_cycles-base-ckpt-reward", "run_cycles.py", lambda w, d: cycles(w, d, base=w.reward),
      r"is a reward checkpoint, but a generator checkpoint is needed", ("{w.reward}",)),
    C("run_cycles-base-ckpt-malicious", "run_cycles.py", lambda w, d: cycles(w, d, base=w.evil_pt),
      r"refused by the safe loader", ("{w.evil_pt}",), marker=True),
    C("run_cycles-base-ckpt-truncated", "run_cycles.py", lambda w, d: cycles(w, d, base=w.truncated_pt),
      r"damaged checkpoint: its zip archive is truncated", ("{w.truncated_pt}",)),
    C("run_cycles-data-dir-empty", "run_cycles.py", lambda w, d: cycles(w, d, data=empty_dir(d)),
      r"no train\.bin/val\.bin", ("{d}/empty",)),
    C("run_cycles-val-bin-odd", "run_cycles.py", lambda w, d: cycles(w, d, data=data_copy(w, d, {"val.bin": ODD})),
      r"odd size", ("{d}/data_char/val.bin",)),
    C("run_cycles-out-dir-is-file", "run_cycles.py", lambda w, d: cycles(w, d, out=file_at(d)),
      r"is a file", ("{d}/afile", "--out_dir"), out="{d}"),
    C("run_cycles-out-dir-unwritable", "run_cycles.py", lambda w, d: cycles(w, d, out=unwritable(d)),
      r"cannot be created or written", ("{d}/ro/out",), out="{d}/ro", needs_non_root=True),
    C("run_cycles-max-cycles-negative", "run_cycles.py", lambda w, d: cycles(w, d, "--max_cycles", "-1"),
      r"--max_cycles must be >= 0", (), suggestion=False),
    C("run_cycles-device-unavailable", "run_cycles.py", lambda w, d: cycles(w, d, "--device", "cuda:99"),
      r"--device cuda:99 is not available", ()),
    C("run_cycles-base-config-missing", "run_cycles.py",
      lambda w, d: cycles(w, d, "--base_config", f"{d}/none.py"), r"--base_config .* not found", ("{d}/none.py",)),
    C("run_cycles-base-config-directory", "run_cycles.py", lambda w, d: cycles(w, d, "--base_config", d),
      r"--base_config .* is a directory", ("{d}",)),
    C("run_cycles-base-config-syntax-error", "run_cycles.py",
      lambda w, d: cycles(w, d, "--base_config", text_file(d, "n_layer = = 2\n", "bad.py")),
      r"--base_config .*bad\.py: syntax error on line 1", ("{d}/bad.py",), suggestion=False),
    C("run_cycles-base-config-unknown-setting", "run_cycles.py",
      lambda w, d: cycles(w, d, "--base_config", text_file(d, "n_layr = 2\n", "typo.py")),
      r"--base_config .*typo\.py: .*unknown setting 'n_layr'", ("{d}/typo.py",)),
    C("run_cycles-base-config-wrong-type", "run_cycles.py",
      lambda w, d: cycles(w, d, "--base_config", text_file(d, "n_layer = 'two'\n", "typed.py")),
      r"--base_config .*typed\.py: .*n_layer = 'two' has the wrong type", ("{d}/typed.py",)),

    # --- export_hf.py (checks before it writes; the export is built aside and renamed into place)
    C("export_hf-ckpt-missing", "export_hf.py", lambda w, d: export(w, d, ckpt=f"{d}/none.pt"),
      r"checkpoint not found", ("{d}/none.pt",)),
    C("export_hf-ckpt-malicious", "export_hf.py", lambda w, d: export(w, d, ckpt=w.evil_pt),
      r"refused by the safe loader", ("{w.evil_pt}",), marker=True),
    C("export_hf-nanogpt-without-tokenization", "export_hf.py",
      lambda w, d: export(w, d, ckpt=strip_to_nanogpt(w.gen, os.path.join(d, "nano.pt"))),
      r"does not record its tokenization", ("{d}/nano.pt",)),
    C("export_hf-bpe-flag-on-char-model", "export_hf.py", lambda w, d: export(w, d, "--tokenization", "bpe"),
      r"50257 tokens but the model", ("{w.gen}",)),
    C("export_hf-out-dir-holds-other-files", "export_hf.py", lambda w, d: export(w, d, out=with_file(d)),
      r"holds files an export does not write \(notes\.txt\)", ("{d}/out",)),
    C("export_hf-out-dir-is-file", "export_hf.py", lambda w, d: export(w, d, out=file_at(d)),
      r"exists and is a file", ("{d}/afile", "--out_dir"), out="{d}"),

    # --- a text flag set to '' (it fell back to a default, named no file, or crashed), and output paths that
    # are of the wrong kind, refused before any work
    C("prepare_data-out-dir-empty", "prepare_data.py", lambda w, d: prep(w, d, "--out_dir", ""),
      r"^--out_dir is empty$", ()),
    C("train-config-empty", "train.py", lambda w, d: train(w, d, "--config", ""), r"^--config is empty$", ()),
    C("sample-ckpt-empty", "sample.py", lambda w, d: sample(w, d, "--ckpt", ""), r"^--ckpt is empty$", ()),
    C("evaluate-data-dir-empty", "evaluate.py", lambda w, d: evaluate(w, d, "--data_dir", ""),
      r"^--data_dir is empty$", ()),
    C("prepare_reward_data-model-path-empty", "prepare_reward_data.py", lambda w, d: prd(w, d, "--model_path", ""),
      r"^--model_path is empty$", ()),
    C("train_reward_model-init-trunk-from-empty", "train_reward_model.py",
      lambda w, d: trm(w, d, "--init_trunk_from", ""), r"^--init_trunk_from is empty$", ()),
    C("train_grpo-tensorboard-dir-is-file", "train_grpo.py", lambda w, d: grpo(w, d, "--tensorboard_dir", file_at(d)),
      r"^--tensorboard_dir .* exists and is a file", ("{d}/afile",)),
    C("run_cycles-temps-empty", "run_cycles.py", lambda w, d: cycles(w, d, "--temps", ""), r"^--temps is empty$", ()),
    C("export_hf-out-dir-empty", "export_hf.py", lambda w, d: export(w, d, "--out_dir", ""),
      r"^--out_dir is empty$", ()),
    C("train_spin-out-dir-empty", "train_spin.py",
      lambda w, d: ["--model_path", w.gen, "--out_dir", "", "--max_steps", "0", "--device", "cpu"],
      r"^--out_dir is empty$", ()),
    C("measure_residual-out-is-directory", "measure_residual.py",
      lambda w, d: ["--model_path", w.gen, "--reward_model_path", w.reward, "--out", empty_dir(d)],
      r"^--out .* is a directory, not a file$", ("{d}/empty",)),
    C("human_eval-score-out-is-directory", "human_eval.py",
      lambda w, d: ["score", "--key", f"{d}/key.json", "--ratings", f"{d}/r.json", "--out", empty_dir(d)],
      r"^--out .* is a directory, not a file$", ("{d}/empty",)),
    C("human_eval-make-out-dir-is-file", "human_eval.py",
      lambda w, d: ["make", "--gen", f"a={w.gen}", "--gen", f"b={w.gen}", "--data_dir", w.data, "--n_items", "1",
                    "--prompt_len", "4", "--sample_len", "4", "--device", "cpu", "--out_dir", file_at(d)],
      r"^--out_dir .* exists and is a file", ("{d}/afile",), out="{d}"),
]

# a few cases also go through the real command line (`python script.py ...`), one per script
SUBPROCESS = ["prepare_data-non-utf8", "train-train-bin-odd-size", "sample-ckpt-malicious",
              "evaluate-bin-float32", "prepare_reward_data-reward-checkpoint",
              "train_reward_model-x-not-whole-rows", "train_grpo-generator-as-reward-model",
              "run_cycles-base-ckpt-malicious", "export_hf-out-dir-holds-other-files", "train_spin-out-dir-empty",
              "measure_residual-out-is-directory", "human_eval-score-out-is-directory"]
BY_ID = {c.id: c for c in CASES}


# ----------------------------------------------------------------------------- checks

def fmt(s, w, d):
    return s.format(d=d, w=w)


def complete_looking(out):
    """{relative path: (size, mtime)} of the files in `out` whose names mark finished output."""
    if out is None or not os.path.isdir(out):
        return {}
    found = {}
    for r, _, files in os.walk(out):
        for f in files:
            if COMPLETE.match(f):
                st = os.stat(os.path.join(r, f))
                found[os.path.relpath(os.path.join(r, f), out)] = (st.st_size, st.st_mtime_ns)
    return found


def check_failure(case, code, err, w, d, before, fresh):
    dump = os.environ.get("BAD_INPUTS_DUMP")
    if dump:
        with open(dump, "a") as f:
            f.write(json.dumps({"id": case.id, "script": case.script, "code": code, "stderr": err,
                                "d": d, "root": w.root}) + "\n")
    assert code not in (0, None), f"exit code {code!r}; stderr:\n{err}"
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    first = next((i for i, ln in enumerate(lines) if ERROR_LINE.match(ln)), None)
    assert first is not None, f"no `error:` line in stderr:\n{err}"
    for ln in lines[first:]:  # one line per cause: nothing but error/suggestion lines after the first
        assert ERROR_LINE.match(ln) or SUGGESTION_LINE.match(ln), f"stray line {ln!r} in:\n{err}"
    errors = " | ".join(ERROR_LINE.match(ln).group(1) for ln in lines[first:] if ERROR_LINE.match(ln))
    assert re.search(case.expect, errors), f"{case.expect!r} not in {errors!r}"
    for name in case.names:
        assert fmt(name, w, d) in errors, f"{fmt(name, w, d)!r} not named in {errors!r}"
    if case.suggestion:
        assert any(SUGGESTION_LINE.match(ln) for ln in lines), f"no `suggestion:` line in:\n{err}"
    after = complete_looking(fmt(case.out, w, d))
    left = sorted(k for k, v in after.items() if before.get(k) != v)  # new or rewritten
    assert not left, f"complete-looking output left behind: {left}"
    out = fmt(case.out, w, d)
    if fresh and os.path.isdir(out):  # the run made it: not an empty directory holding only its lock
        assert set(os.listdir(out)) - {".lock", "run.lock"}, f"an empty output directory left behind: {out}"
    if case.marker:
        assert not os.path.exists(w.marker), "the malicious pickle ran"


def case_dir(w, case, kind):
    d = os.path.join(w.root, kind, case.id)
    os.makedirs(d)
    return d


def chmod_restricts(root):
    """False when running as root (with CAP_DAC_OVERRIDE): a 0o555 directory is writable then."""
    probe = os.path.join(root, "chmod_probe")
    os.makedirs(probe, exist_ok=True)
    os.chmod(probe, 0o555)
    try:
        open(os.path.join(probe, "x"), "w").close()
        os.remove(os.path.join(probe, "x"))
        return False
    except OSError:
        return True
    finally:
        os.chmod(probe, 0o755)


def skip_if_root(case, w):
    if case.needs_non_root and not chmod_restricts(w.root):
        pytest.skip("running as root: chmod 0o555 does not stop root from writing")


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case, w, monkeypatch, capsys):
    skip_if_root(case, w)
    d = case_dir(w, case, "inproc")
    argv = [str(a) for a in case.args(w, d)]
    before, fresh = complete_looking(fmt(case.out, w, d)), not os.path.exists(fmt(case.out, w, d))
    module = importlib.import_module(case.script[:-3])
    monkeypatch.setattr(sys, "argv", [case.script] + argv)
    capsys.readouterr()
    try:
        run_cli(module.main)
        code = 0
    except SystemExit as e:
        code = e.code
    except Exception:
        pytest.fail(f"{case.script} would print a traceback:\n{traceback.format_exc()}")
    check_failure(case, code, capsys.readouterr().err, w, d, before, fresh)


@pytest.fixture(scope="module")
def subprocess_runs(w):
    """Each command-line case run once, as `python script.py ARGS` (forked warm: helpers.run_script)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    results = {}
    for cid in SUBPROCESS:
        case = BY_ID[cid]
        if case.needs_non_root and not chmod_restricts(w.root):
            continue
        d = case_dir(w, case, "subproc")
        argv = [str(a) for a in case.args(w, d)]
        before, fresh = complete_looking(fmt(case.out, w, d)), not os.path.exists(fmt(case.out, w, d))
        p = run_script([case.script] + argv, cwd=ROOT, env=env, timeout=120)
        results[cid] = (d, before, fresh, p.returncode, p.stderr)
    return results


@pytest.mark.slow
@pytest.mark.parametrize("cid", SUBPROCESS)
def test_bad_input_command_line(cid, w, subprocess_runs):
    d, before, fresh, code, err = subprocess_runs[cid]
    check_failure(BY_ID[cid], code, err, w, d, before, fresh)


def test_malicious_payload_is_live(w, tmp_path):
    """The planted pickles really would run code if loaded unsafely (so the cases above can fail)."""
    m1, m2 = str(tmp_path / "m1"), str(tmp_path / "m2")
    with open(evil_meta(str(tmp_path / "meta.pkl"), m1), "rb") as f:
        pickle.load(f)
    torch.load(evil_checkpoint(str(tmp_path / "e.pt"), m2), weights_only=False)
    assert os.path.exists(m1) and os.path.exists(m2)
    assert not os.path.exists(w.marker)


def test_table_covers_every_script():
    scripts = {c.script for c in CASES}
    assert scripts == {"prepare_data.py", "train.py", "sample.py", "evaluate.py", "prepare_reward_data.py",
                       "train_reward_model.py", "train_grpo.py", "run_cycles.py", "export_hf.py", "train_spin.py",
                       "measure_residual.py", "human_eval.py"}
    assert {BY_ID[c].script for c in SUBPROCESS} == scripts
    assert len({c.id for c in CASES}) == len(CASES)


# ----------------------------------------------------------------------------- shared numeric flags

FLOATS = {"learning_rate", "min_lr", "weight_decay", "beta1", "beta2", "grad_clip", "dropout", "min_delta"}
SHARED_FLAGS = [  # (script, a command line its parser accepts, its flags of core.cli.SHARED_FLAG_RANGES)
    ("train.py", ["--data_dir", "d"], ["learning_rate", "min_lr", "weight_decay", "beta1", "beta2", "grad_clip",
                                       "dropout", "warmup_iters", "lr_decay_iters", "seed", "min_delta"]),
    ("train_grpo.py", ["--model_path", "m", "--reward_model_path", "r"],
     ["learning_rate", "weight_decay", "beta1", "beta2", "grad_clip", "dropout", "seed", "eval_batch_size",
      "eval_max_batches", "min_delta"]),
    ("train_spin.py", ["--model_path", "m"], ["learning_rate", "weight_decay", "beta1", "beta2", "grad_clip",
                                              "seed", "eval_batch_size", "eval_max_batches"]),
    ("train_reward_model.py", ["--model_path", "m"], ["learning_rate", "weight_decay", "grad_clip", "dropout", "seed",
                                                      "eval_max_batches", "min_delta", "num_workers"]),
    ("run_cycles.py", [], ["seed", "eval_batch_size", "min_delta"]),
    ("measure_residual.py", ["--model_path", "m", "--reward_model_path", "r"], ["seed"]),
    ("sample.py", [], ["seed"]),
    ("human_eval.py", ["make", "--gen", "a=a.pt", "--gen", "b=b.pt", "--data_dir", "d", "--out_dir", "o"], ["seed"]),
]


@pytest.mark.parametrize("script,argv,flags", SHARED_FLAGS, ids=[s for s, _, _ in SHARED_FLAGS])
def test_shared_numeric_flags_are_refused_when_parsed(script, argv, flags, monkeypatch, tmp_path):
    """A value out of range (or NaN) is named with its flag before any work starts: before, several went
    on to a bare ValueError from torch or numpy (AdamW's betas, a DataLoader's batch size, a negative
    seed, NaN dropout) or were taken as they were (NaN --min_delta)."""
    monkeypatch.chdir(tmp_path)  # nothing the parsers might create lands in the repository
    module = importlib.import_module(script[:-3])
    for flag in flags:
        for bad in ["-1"] + (["nan"] if flag in FLOATS else []):
            args = argv + [f"--{flag}", bad]
            monkeypatch.setattr(sys, "argv", [script] + args)
            with pytest.raises(ProjectError, match=f"^--{flag} must be .*, got {bad}(\\.0)?$"):
                parse_only(script, module, args)


def parse_only(script, module, args):
    """The script's own checks of its command line, without the run."""
    if script == "train.py":
        return module.parse_args(args)
    if script == "run_cycles.py":
        return module.check_args(module.parse_args(args))
    if hasattr(module, "get_args"):
        return module.get_args(args)
    return module.main() if script == "sample.py" else module.main(args)  # sample.py reads sys.argv
