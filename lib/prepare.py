"""
Preparing a corpus: prepare_corpus streams a text file, or a directory of documents, into train.bin /
val.bin / meta.pkl / prepare_info.json, in chunks tokenized by a pool of processes, memory bounded whatever
the corpus' size. prepare_data.py is its command line; data/*/prepare.py call it after fetching their text
(data/shakespeare_text.py). Nothing here imports torch: the pool's processes never load it.
"""
import collections
import contextlib
import hashlib
import json
import multiprocessing
import os
import pickle
import re
import sys
import time
from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional

import numpy as np
from tqdm import tqdm

from core.errors import DataError, ProjectError
from core.files import atomic_output, atomic_write_text, check_writable_dir
from core.process import die_with_parent
from lib.corpus import DEFAULT_GLOB, INFO_NAME, check_train_split, not_utf8, text_files, to_uint16
from tokenization_manager import TokenizationInfo, TokenizationManager, build_char_meta

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
    job = PrepareJob(input_path, out_dir, tokenization, train_split, pattern, source, num_proc, chunk_bytes,
                     progress, log)
    t0 = time.time()
    per_doc, nonblank, chars = scan_documents(docs, sizes, chunk_bytes, tokenization == "char", num_proc, progress)
    t_scan = time.time() - t0
    if not nonblank:
        what = docs[0] if len(docs) == 1 else f"{input_path} ({len(docs)} files matching {pattern!r})"
        raise DataError(f"{what} is empty", "pass a file that contains text")
    info, segments = plan_split(job, Scan(docs, sizes, per_doc))
    if input_label is not None:
        info["input"] = os.path.abspath(input_label)
    check_writable_dir(out_dir, "--out_dir")
    encoding = corpus_tokenization(tokenization, meta_path, chars, out_dir, input_path, info["split_rule"])
    tok_info = encoding.info
    info["tokenization"] = tok_info.to_dict()

    t1 = time.time()
    tokens, hashes = write_token_files(job, segments, encoding, total_bytes)
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


@dataclass(frozen=True)
class PrepareJob:
    """prepare_corpus's settings, checked (check_prepare_args; num_proc resolved), as its passes read them."""
    input_path: str
    out_dir: str
    tokenization: str
    train_split: float
    pattern: str
    source: Optional[str]
    num_proc: int
    chunk_bytes: int
    progress: Optional[bool]
    log: Callable


class Scan(NamedTuple):
    """The first pass's record of the documents: their paths, byte sizes and per-chunk character counts
    (scan_documents' per_doc)."""
    docs: list
    sizes: list
    per_doc: list


class Encoding(NamedTuple):
    """The tokenizer of a preparation (corpus_tokenization)."""
    meta: Optional[dict]  # the char vocabulary, or None (bpe)
    separator: bytes  # what ends each document (bpe documents: GPT-2's end-of-text token)
    meta_out: Optional[str]  # the meta.pkl to write, or None
    info: TokenizationInfo


def plan_split(job, scan):
    """The train/val split of the scanned documents: (the prepare_info dict so far, the segments
    [(split, path, start byte, end byte, ends a document)] to tokenize, in order)."""
    input_path, train_split, log = job.input_path, job.train_split, job.log
    docs, sizes, per_doc = scan
    doc_chars = [sum(n for *_, n in ranges) for ranges in per_doc]
    kept = [i for i, n in enumerate(doc_chars) if n > 0]  # empty files are no documents
    n_chars = sum(doc_chars)
    info = {"input": os.path.abspath(input_path), "source": job.source or "user file", "input_chars": n_chars,
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
    info.update({"split_rule": "documents", "glob": job.pattern, "documents": len(kept), "train_documents": k,
                 "val_documents": len(kept) - k, "train_chars": train_chars, "val_chars": n_chars - train_chars,
                 "first_val_document": os.path.relpath(docs[kept[k]], input_path).replace(os.sep, "/"),
                 "document_separator": "<|endoftext|>" if job.tokenization == "bpe" else None})
    log(f"{len(kept):,} documents: the first {k:,} are train ({train_chars / n_chars:.2%} of the characters), "
        f"the last {len(kept) - k:,} val, from {info['first_val_document']}")
    return info, segments


def corpus_tokenization(tokenization, meta_path, chars, out_dir, input_path, split_rule):
    """The tokenizer of a preparation: an Encoding (char meta dict or None, the document separator bytes,
    the meta.pkl path to write or None, its TokenizationInfo). A given char vocabulary must hold
    every character of the text, known before anything is written."""
    meta, separator, meta_out = None, b"", None
    if tokenization == "char":
        if meta_path is None:  # a vocabulary built from this text encodes all of it
            meta = build_char_meta(chars)
            meta_out = os.path.join(out_dir, "meta.pkl")
            return Encoding(meta, separator, meta_out, TokenizationInfo("char", meta["vocab_size"],
                                                                        os.path.abspath(meta_out)))
        tok = TokenizationManager("char", meta_path=meta_path)
        missing = [c for c in chars if c not in tok.stoi]
        if missing:
            raise DataError(f"{len(missing)} distinct character(s) of {input_path} are not in the char "
                            f"vocabulary of {meta_path}: {', '.join(repr(c) for c in missing[:5])}",
                            "use the text the vocabulary was built from, remove those characters, "
                            "or rebuild meta.pkl from your text")
        meta = {"vocab_size": tok.vocab_size, "itos": tok.itos, "stoi": tok.stoi}
        return Encoding(meta, separator, meta_out, tok.info)
    tok = TokenizationManager("bpe")  # loaded once here; pool processes inherit it
    if split_rule == "documents":  # each document ends with GPT-2's end-of-text token
        separator = np.array([tok.enc.eot_token], dtype=np.uint16).tobytes()
    return Encoding(meta, separator, meta_out, tok.info)


def write_token_files(job, segments, encoding, total_bytes):
    """Second pass: tokenize the segments into out_dir/{train,val}.bin (+ meta.pkl) with an Encoding, on
    job.num_proc processes in chunks of job.chunk_bytes (total_bytes of them, for the bar), all written
    to temporary files renamed into place only if all went well; an old prepare_info.json is
    removed with them. Returns ({split: tokens}, {split: sha256 object})."""
    out_dir, chunk_bytes, (meta, separator, meta_out, _) = job.out_dir, job.chunk_bytes, encoding
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
        with byte_bar(total_bytes, "tokenize", job.progress) as bar:
            for task, results in run_in_order(_encode, tasks, job.num_proc, (job.tokenization, meta)):
                for (split, _, a, b, eot), data in zip(task, results):
                    for piece in (data, separator) if eot else (data,):
                        files[split].write(piece)
                        hashes[split].update(piece)
                        tokens[split] += len(piece) // 2
                    bar.update(b - a)
        if os.path.exists(info_path):  # it describes the files about to be replaced
            os.remove(info_path)
    return tokens, hashes
