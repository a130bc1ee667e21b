"""
A prepared data directory, opened once: the library side of evaluate.py, the trainers and run_cycles.py.

    corpus = Corpus(data_dir)          # train.bin / val.bin memmaps, meta.pkl / tokenizer, prepare_info
    corpus.tokenizer, corpus.train, corpus.val, corpus.train_vocabulary()

Also the functions every script shares for text and token files (read_text, split_text,
check_token_bin, describe_split, read_prepare_info, ...). Scripts import these from here,
never from each other. Nothing here imports torch, so neither prepare_data.py nor the processes its pool
forks load it (the held-out loss over a token file, which needs torch, is lib/heldout.py's). Preparing
such a directory is lib/prepare.py's.
"""
import fnmatch
import json
import os

import numpy as np

from core.errors import BinaryFileError, DataError, ProjectError
from core.files import atomic_output, atomic_write_text, sha256_bytes, sha256_file
from tokenization_manager import TokenizationManager

INFO_NAME = "prepare_info.json"
OUTPUT_NAMES = ("train.bin", "val.bin", "meta.pkl", INFO_NAME)  # never read as documents
DEFAULT_GLOB = "*.txt"


# ----------------------------------------------------------------------------- text files

def text_files(directory, pattern=DEFAULT_GLOB):
    """The documents of a directory corpus: every file below `directory` (recursively; links to
    directories are not followed) whose name matches `pattern` (fnmatch, case-sensitive), except
    hidden names (starting with '.'), prepare_data's own outputs and *.tmp files, sorted by
    their path relative to `directory` ('/'-separated, compared as strings), so the order does
    not depend on the file system."""
    found = []
    for root, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            if (name.startswith(".") or name in OUTPUT_NAMES or name.endswith(".tmp")
                    or not fnmatch.fnmatchcase(name, pattern)):
                continue
            path = os.path.join(root, name)
            if os.path.isfile(path):
                found.append((os.path.relpath(path, directory).replace(os.sep, "/"), path))
    return [path for _, path in sorted(found)]


def resolve_text_file(path, flag="--input"):
    """For scripts that read ONE text file: a directory holding exactly one non-empty text file
    (*.txt, e.g. data/shakespeare_char/ with its input.txt) stands for that file, as it does for
    prepare_corpus. A directory of several is a corpus of documents, which only prepare_data.py
    splits; anything else is returned as it is (a missing dir/input.txt is reported by the caller)."""
    if path is None or not os.path.isdir(path):
        return path
    files = text_files(path)
    texts = [f for f in files if os.path.getsize(f) > 0]
    if len(texts) > 1:
        raise DataError(f"{flag} {path} is a directory of {len(texts)} text files, but one text file is "
                        f"read here", "pass one file; a directory of documents is split by prepare_data.py "
                        "--input DIR --out_dir OUT, then use OUT/train.bin and OUT/val.bin "
                        "(prepare_reward_data.py: --input_mode binary)")
    return (texts or files or [os.path.join(path, "input.txt")])[0]


def read_text(path, flag="--input"):
    """Read a UTF-8 text file with clear errors for missing, empty or non-UTF-8 files."""
    path = resolve_text_file(path, flag)
    if path is None or not os.path.exists(path):
        raise DataError(f"text file not found: {path} ({flag})", f"check the path given to {flag}")
    with open(path, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise not_utf8(path, e.start, raw[e.start]) from None
    if not text.strip():
        raise DataError(f"{path} is empty", "pass a file that contains text")
    return text


def not_utf8(path, offset, byte):
    return DataError(f"{path} is not valid UTF-8 (byte 0x{byte:02x} at offset {offset})",
                     "convert the file to UTF-8, e.g. iconv -f latin1 -t utf-8 in.txt > out.txt")


def check_train_split(train_split):
    if not 0.0 < train_split < 1.0:
        raise ProjectError(f"--train_split must be in (0, 1), got {train_split}",
                           "use the fraction of the text that is train, e.g. --train_split 0.9")


def split_text(text, train_split):
    """nanoGPT's rule: the first int(n * train_split) characters are train."""
    check_train_split(train_split)
    n = int(len(text) * train_split)
    return text[:n], text[n:]


def to_uint16(ids, what="tokens"):
    ids = np.asarray(ids)
    if ids.size and int(ids.max()) > 65535:
        raise DataError(f"{what} contain ids up to {int(ids.max())}, beyond the uint16 range of the .bin format",
                        "use a tokenizer with a vocabulary of at most 65536 tokens")
    return ids.astype(np.uint16)


# ----------------------------------------------------------------------------- token files

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


def open_tokens(path):
    """The one way a uint16 token file (train.bin, val.bin) is opened: a read-only np.memmap, nothing read
    until it is indexed (check_token_bin checks a file first, where a script takes it from the user)."""
    return np.memmap(path, dtype=np.uint16, mode="r")


def check_token_bin(path, min_tokens=1, vocab_size=None, chunk=1 << 24):
    """Validate a uint16 token .bin before it is used; returns its number of tokens.

    A missing file, an odd byte size, fewer than `min_tokens` tokens, or a token id
    >= vocab_size (the max is taken once, chunk by chunk over a memmap, so large
    files are fine) raise BinaryFileError.
    """
    if os.path.isdir(path):
        raise BinaryFileError(f"token file {path} is a directory", "pass a .bin file, e.g. DIR/val.bin")
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
        check_token_ids(open_tokens(path), vocab_size, path, chunk=chunk)
    return n


def max_token(tokens, chunk=1 << 24):
    """The largest id of a (memmapped) token array, -1 for none: read chunk by chunk, so a large file is
    never in memory at once."""
    return max((int(tokens[i:i + chunk].max()) for i in range(0, len(tokens), chunk)), default=-1)


def check_token_ids(tokens, vocab_size, what, hint="run prepare.py again or pass the matching --tokenization / "
                    "--meta_path", chunk=1 << 24):
    """BinaryFileError unless every id of `tokens` (named `what` in the message) is < vocab_size: the range
    check of check_token_bin and data_loader.load_token_data."""
    top = max_token(tokens, chunk)
    if top >= vocab_size:
        raise BinaryFileError(f"{what} contains token id {top}, outside the vocabulary of size {vocab_size}",
                              f"the data was prepared with another tokenization; {hint}")


def write_train_slice(data_dir, out_dir, start, stop, why, dev=None):
    """A prepared directory whose train split is data_dir's train tokens [start, stop) and whose val split and
    tokenizer are data_dir's own (val.bin and meta.pkl copied): the text a part of an experiment may see. dev:
    (a, b), its val split is the train tokens [a, b) instead, a dev slice every choice is made on, the real val
    split left to the verdict. Its prepare_info.json records the slices and `why`. Done once: a directory already
    holding these slices of this source is kept (the source's train sha256 and the bounds are compared)."""
    src = Corpus(data_dir)
    info_path = os.path.join(out_dir, "prepare_info.json")
    want = {"sliced_from": os.path.abspath(data_dir), "source_train_sha256": sha256_file(src.train_bin),
            "train_start": int(start), "train_stop": int(stop), **({"dev_from_train": [int(dev[0]), int(dev[1])]}
                                                                   if dev else {})}
    old = read_prepare_info(out_dir) if os.path.exists(info_path) else None
    if old and all(old.get(k) == v for k, v in want.items()):
        return out_dir
    for a, b in [(start, stop)] + ([dev] if dev else []):
        if not 0 <= a < b <= len(src.train):
            raise DataError(f"{data_dir}'s train split holds {len(src.train):,} tokens: no slice [{a}, {b})",
                            "choose bounds inside it")
    os.makedirs(out_dir, exist_ok=True)
    train = np.ascontiguousarray(src.train[start:stop])
    with atomic_output(os.path.join(out_dir, "train.bin")) as f:
        f.write(train.tobytes())
    dev_tokens = np.ascontiguousarray(src.train[dev[0]:dev[1]]) if dev else None
    if dev:
        with atomic_output(os.path.join(out_dir, "val.bin")) as f:
            f.write(dev_tokens.tobytes())
    for name in ("meta.pkl",) + (() if dev else ("val.bin",)):
        if os.path.exists(os.path.join(data_dir, name)):
            with open(os.path.join(data_dir, name), "rb") as f, atomic_output(os.path.join(out_dir, name)) as g:
                g.write(f.read())
    info = {**(src.prepare_info or {}), **want, "why": why, "train_tokens": len(train),
            "train_sha256": sha256_bytes(train.tobytes())}
    if dev:
        info.update(val_tokens=len(dev_tokens), val_sha256=sha256_bytes(dev_tokens.tobytes()))
    if info.get("tokenization", {}).get("meta_path"):
        info["tokenization"] = {**info["tokenization"], "meta_path": os.path.abspath(os.path.join(out_dir, "meta.pkl"))}
    atomic_write_text(info_path, json.dumps(info, indent=2) + "\n")  # last: its presence marks the slice done
    return out_dir


# ----------------------------------------------------------------------------- a data directory, opened once

class Corpus:
    """A prepared data directory (prepare_data.py's train.bin, val.bin, meta.pkl,
    prepare_info.json) opened once: each part is read on first use and kept, so the several
    measurements of one evaluation (experiment/measures.py) share one tokenizer, one memmap per split
    and one train-split vocabulary.

        corpus = Corpus("data/shakespeare_char")
        corpus.val[:10], corpus.tokenizer.decode(...), corpus.prepare_info
    """

    def __init__(self, data_dir, tokenization="auto", meta_path=None):
        self.data_dir = data_dir
        self.tokenization = tokenization
        self.meta_path = meta_path  # a char vocabulary other than data_dir/meta.pkl (train.py's --meta_path)
        self.train_bin = os.path.join(data_dir, "train.bin")
        self.val_bin = os.path.join(data_dir, "val.bin")
        self._memmaps = {}
        self._tokenizer = None
        self._prepare_info = False  # not read yet (None: the directory has none)
        self.cache = {}  # what users compute from the corpus once (cycle_metrics: the train vocabulary)

    def __repr__(self):
        return f"Corpus({self.data_dir!r})"

    def path(self, split):
        """train.bin or val.bin of the directory."""
        return self.train_bin if split == "train" else self.val_bin

    def tokens(self, split):
        """The uint16 tokens of split 'train' or 'val' (a read-only memmap, opened once)."""
        if split not in self._memmaps:
            path = self.path(split)
            if not os.path.exists(path):
                raise DataError(f"{path} not found", "pass the prepared corpus the generators were trained on")
            self._memmaps[split] = open_tokens(path)
        return self._memmaps[split]

    def fresh_tokens(self, split):
        """A new memmap of a split at every call, for a trainer's batches: nanoGPT reopens its memmap per batch,
        as the pages a long-lived one has read pile up in the process's memory."""
        return open_tokens(self.path(split))

    def num_tokens(self, split):
        """The split's length in tokens, from its size (nothing opened)."""
        return os.path.getsize(self.path(split)) // 2

    @property
    def train(self):
        return self.tokens("train")

    @property
    def val(self):
        return self.tokens("val")

    @property
    def tokenizer(self):
        """The corpus's TokenizationManager (meta.pkl -> char, else GPT-2 BPE, for 'auto')."""
        if self._tokenizer is None:
            self._tokenizer = TokenizationManager(self.tokenization, meta_path=self.meta_path, data_path=self.data_dir)
        return self._tokenizer

    @property
    def prepare_info(self):
        """prepare_info.json (a dict), or None if the directory has none (e.g. nanoGPT data)."""
        if self._prepare_info is False:
            self._prepare_info = read_prepare_info(self.data_dir)
        return self._prepare_info


def as_corpus(data):
    """`data` as a Corpus: a Corpus is returned as it is, a data directory path is opened."""
    return data if isinstance(data, Corpus) else Corpus(os.fspath(data))
