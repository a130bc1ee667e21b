"""Streaming prepare_data.py: the chunked, multi-process preparation gives byte for byte what
the whole-text rule gives (cut the TEXT at int(len * train_split) characters, encode both parts
whole), for tiny chunk sizes that put chunk boundaries everywhere; directory corpora; errors;
and a killed run leaves the previous output complete and no process behind."""
import json
import os
import pickle
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from core.errors import DataError  # noqa: E402
from core.files import sha256_file  # noqa: E402
from data_loader import load_token_data  # noqa: E402
from helpers import live_processes, make_text  # noqa: E402
from lib.corpus import read_text, text_files  # noqa: E402
from lib.prepare import chunk_ranges, list_documents, prepare_corpus  # noqa: E402
from reward_data_config import RewardDataConfig  # noqa: E402
from tokenization_manager import TokenizationManager, build_char_meta  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUIET = dict(log=lambda *a: None)

# Everything that GPT-2's pre-tokenizer treats specially: runs of newlines, spaces before
# newlines, CRLF, tabs, leading spaces, contractions, numbers, multi-byte characters (2, 3 and
# 4 bytes) and Unicode whitespace (NBSP, ideographic space, line separator, NEL), \x1c (a space
# to Python's isspace but not to the tokenizer), long stretches without whitespace (letters,
# digits and punctuation mixed, and a single class), and text ending in spaces.
BLOCK = ("First line\nSecond  line \n\n\nThird\tline\r\nCRLF line\r\n\r\nword  \n  indented\n"
         "caf\u00e9 \u4e2d\u6587\u3000\u5b57 emoji \U0001F600\U0001F600 nbsp\u00a0x sep\u2028y nel\x85z fs\x1cw\n"
         "don't it's we'll 'quoted' 123 4567 x1y2 3.14 a+b==c !!?? \n   \n"
         + "abc123def!!!ghi" * 20 + "\n" + "a" * 200 + " \u00e9\u00e9\u00e9" * 5 + " tail   ")
TRICKY = BLOCK * 2


def old_rule(text, tokenization, train_split):
    """prepare_data.py before streaming: the whole text in memory, cut, both parts encoded."""
    n = int(len(text) * train_split)
    if tokenization == "char":
        meta = build_char_meta(text)
        tok = TokenizationManager("char", meta=meta)
        meta_bytes = pickle.dumps(meta)
    else:
        tok, meta_bytes = TokenizationManager("bpe"), None
    return tok.encode(text[:n]), tok.encode(text[n:]), meta_bytes


def read_out(out):
    out = str(out)
    ids = {s: np.fromfile(os.path.join(out, f"{s}.bin"), dtype=np.uint16).tolist() for s in ("train", "val")}
    meta = os.path.join(out, "meta.pkl")
    with open(os.path.join(out, "prepare_info.json")) as f:
        info = json.load(f)
    return ids, (open(meta, "rb").read() if os.path.exists(meta) else None), info


def test_every_cut_keeps_the_tokens_of_the_whole_text(tmp_path):
    """The cut rule itself: at each place chunk_ranges cuts (chunk size 1: as often as it can),
    encoding the two sides separately gives exactly the tokens of the whole text."""
    path = tmp_path / "t.txt"
    raw = TRICKY.encode("utf-8")
    path.write_bytes(raw)
    cuts = [b for _, b in chunk_ranges(str(path), 0, len(raw), 1)][:-1]
    bpe = TokenizationManager("bpe")
    whole = bpe.encode(TRICKY)
    for c in cuts:
        assert bpe.encode(raw[:c].decode()) + bpe.encode(raw[c:].decode()) == whole, (raw[c - 8:c], raw[c:c + 8])
    # both kinds of cut occur: before whitespace, and inside the long stretches without any
    assert any(raw[c:c + 1].isspace() for c in cuts) and any(raw[c - 1:c + 1] == b"c1" for c in cuts)
    assert len(cuts) > len(TRICKY.split()) // 2
    # the text is tricky enough for the rule to matter: cutting after a whole whitespace run, or
    # between a space and the word it starts, does change the tokens
    for naive in ("word  \n  ", "Second  "):
        c = TRICKY.index(naive) + len(naive)
        assert bpe.encode(TRICKY[:c]) + bpe.encode(TRICKY[c:]) != whole, naive


@pytest.mark.parametrize("tokenization", ["char", "bpe"])
@pytest.mark.parametrize("chunk_bytes,num_proc", [(1, 1), (7, 2), (64, 1), (64, 2)])
def test_streamed_equals_the_whole_text_rule(tmp_path, tokenization, chunk_bytes, num_proc):
    path = tmp_path / "input.txt"
    path.write_text(TRICKY, encoding="utf-8", newline="")
    for split in (0.9, 0.37):
        out = tmp_path / f"out{split}"
        info = prepare_corpus(str(path), str(out), tokenization, split, num_proc=num_proc,
                              chunk_bytes=chunk_bytes, **QUIET)
        train, val, meta = old_rule(TRICKY, tokenization, split)
        ids, meta_on_disk, on_disk = read_out(out)
        assert ids["train"] == train and ids["val"] == val
        assert meta_on_disk == meta  # char: the same vocabulary, pickled the same
        assert on_disk == info
        assert list(info) == ["input", "source", "input_chars", "train_split", "split_rule", "tokenization",
                              "train_tokens", "train_sha256", "val_tokens", "val_sha256"]
        assert info["input_chars"] == len(TRICKY) and info["split_rule"] == "text_chars"
        assert info["train_tokens"] == len(train) and info["val_sha256"] == sha256_file(out / "val.bin")
        assert sorted(os.listdir(out)) == sorted(["train.bin", "val.bin", "prepare_info.json"]
                                                 + (["meta.pkl"] if tokenization == "char" else []))


def test_same_files_for_any_chunk_size_and_process_count(tmp_path):
    """A larger play-like corpus: several chunk sizes and 1 or 2 processes, identical files."""
    path = tmp_path / "input.txt"
    text = make_text(60_000, seed=3) + "\u00e9t\u00e9 \u4e2d\u6587\n" * 50 + make_text(20_000, seed=4)
    path.write_text(text, encoding="utf-8")
    for tokenization in ("char", "bpe"):
        runs = []
        for chunk_bytes, num_proc in ((1 << 22, 1), (1000, 1), (997, 2), (4096, 2)):
            out = tmp_path / f"{tokenization}_{chunk_bytes}_{num_proc}"
            prepare_corpus(str(path), str(out), tokenization, 0.9, num_proc=num_proc, chunk_bytes=chunk_bytes, **QUIET)
            runs.append({n: (out / n).read_bytes() for n in os.listdir(out) if n != "prepare_info.json"})
        assert all(r == runs[0] for r in runs[1:])
        train, val, _ = old_rule(text, tokenization, 0.9)
        assert np.frombuffer(runs[0]["train.bin"], np.uint16).tolist() == train
        assert np.frombuffer(runs[0]["val.bin"], np.uint16).tolist() == val


@pytest.mark.parametrize("chunk_bytes", [1, 5, 1 << 20])
def test_non_utf8_error_names_the_first_bad_byte(tmp_path, chunk_bytes):
    good = "d\u00e9j\u00e0 vu \u4e2d\n".encode() * 5
    cases = [b"\xe9" + good, good + b"caf\xe9 au lait\n" + good, good + "\u4e2d".encode()[:2] + b"x" + good,
             good + b"\x80\x80\x80\x80\x80\x80" + good, good + "\U0001F600".encode()[:3]]
    for i, raw in enumerate(cases):
        path = tmp_path / f"bad{i}.txt"
        path.write_bytes(raw)
        with pytest.raises(DataError) as old:
            read_text(str(path))  # the whole-file reader: the reference message
        with pytest.raises(DataError) as new:
            prepare_corpus(str(path), str(tmp_path / "out"), "bpe", num_proc=2, chunk_bytes=chunk_bytes, **QUIET)
        assert str(new.value) == str(old.value) and "not valid UTF-8" in str(new.value)
        assert "iconv" in new.value.suggestion
    assert not (tmp_path / "out").exists()


def test_errors_before_anything_is_written(tmp_path):
    blank = tmp_path / "blank.txt"
    blank.write_text(" \n\n\t \u3000\n" * 1000)
    with pytest.raises(DataError, match="is empty"):
        prepare_corpus(str(blank), str(tmp_path / "o1"), "char", chunk_bytes=16, **QUIET)
    short = tmp_path / "short.txt"
    short.write_text("a")
    with pytest.raises(DataError, match="too short to split"):
        prepare_corpus(str(short), str(tmp_path / "o2"), "char", **QUIET)
    # characters missing from a given vocabulary: all of them are known after the first pass
    meta = tmp_path / "meta.pkl"
    meta.write_bytes(pickle.dumps(build_char_meta("abc \n")))
    text = tmp_path / "text.txt"
    text.write_text("abc abc\n" * 500 + "cab X\n" + "abc\n" * 500 + "\u00e9\n")
    with pytest.raises(DataError, match="2 distinct character\\(s\\).*'X', '\u00e9'") as e:
        prepare_corpus(str(text), str(tmp_path / "o3"), "char", meta_path=str(meta), num_proc=2,
                       chunk_bytes=64, **QUIET)
    assert str(meta) in str(e.value)
    (tmp_path / "o4").mkdir()
    (tmp_path / "o4" / "notes.md").write_text("no .txt file here\n")
    with pytest.raises(DataError, match=r"is a directory without files matching '\*\.txt'"):
        prepare_corpus(str(tmp_path / "o4"), str(tmp_path / "o5"), "char", **QUIET)
    for o in ("o1", "o2", "o3", "o5"):
        assert not (tmp_path / o).exists() or os.listdir(tmp_path / o) == []


# ----------------------------------------------------------------------------- directories

def make_corpus(root):
    """Documents in nested folders, created out of order, plus files that are no documents."""
    docs = {"b/02.txt": make_text(3000, seed=2), "a.txt": "caf\u00e9 " + make_text(1000, seed=1),
            "b/01.txt": make_text(2500, seed=5) + "\r\nno final newline",
            "c/deep/x.txt": "\u4e2d\u6587 " * 300, "b/10.txt": make_text(900, seed=7) + "\n\n",
            "z.txt": make_text(1200, seed=8)}
    others = {"notes.md": "not a .txt", ".hidden.txt": "hidden", ".git/HEAD.txt": "hidden dir",
              "empty.txt": "", "c/val.bin": "x", "train.bin": "output name"}
    for rel, text in {**docs, **others}.items():
        p = os.path.join(root, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w", encoding="utf-8", newline="") as f:
            f.write(text)
    order = ["a.txt", "b/01.txt", "b/02.txt", "b/10.txt", "c/deep/x.txt", "z.txt"]  # sorted relative paths
    return [docs[r] for r in order], order


@pytest.mark.parametrize("tokenization", ["char", "bpe"])
def test_directory_of_documents(tmp_path, tokenization):
    texts, order = make_corpus(tmp_path / "corpus")
    files = text_files(str(tmp_path / "corpus"))
    assert [os.path.relpath(p, tmp_path / "corpus") for p in files] == order[:5] + ["empty.txt", "z.txt"]
    every = [os.path.relpath(p, tmp_path / "corpus") for p in text_files(str(tmp_path / "corpus"), "*")]
    assert every == order[:5] + ["empty.txt", "notes.md", "z.txt"]  # no outputs (c/val.bin), nothing hidden
    # whole documents: the first k with train's share of characters closest to 0.8
    chars = np.cumsum([len(t) for t in texts])
    k = 1 + min(range(len(texts) - 1), key=lambda j: abs(chars[j] / chars[-1] - 0.8))
    if tokenization == "char":
        meta = build_char_meta("".join(texts))
        tok = TokenizationManager("char", meta=meta)
        sep = []
    else:
        tok = TokenizationManager("bpe")
        sep = [50256]  # <|endoftext|> after each document
    expect = {"train": sum((tok.encode(t) + sep for t in texts[:k]), []),
              "val": sum((tok.encode(t) + sep for t in texts[k:]), [])}
    for chunk_bytes, num_proc in ((1 << 20, 1), (50, 2)):
        out = tmp_path / f"out{chunk_bytes}"
        info = prepare_corpus(str(tmp_path / "corpus"), str(out), tokenization, 0.8, num_proc=num_proc,
                              chunk_bytes=chunk_bytes, **QUIET)
        ids, meta_bytes, _ = read_out(out)
        assert ids == expect
        if tokenization == "char":
            assert meta_bytes == pickle.dumps(meta)
        assert info["split_rule"] == "documents" and info["documents"] == len(texts) == 6
        assert (info["train_documents"], info["val_documents"]) == (k, len(texts) - k)
        assert info["first_val_document"] == order[k]
        assert info["train_chars"] == chars[k - 1] and info["input_chars"] == chars[-1]
        assert info["document_separator"] == ("<|endoftext|>" if tokenization == "bpe" else None)


def test_directory_with_one_text_file_is_that_file(tmp_path):
    """Today's 'directory holding input.txt' keeps working, byte for byte (other files are ignored)."""
    d = tmp_path / "shakespeare_char"
    d.mkdir()
    (d / "input.txt").write_text(TRICKY, encoding="utf-8", newline="")
    (d / "prepare.py").write_text("print('not text')\n")
    (d / "empty.txt").write_text("")
    prepare_corpus(str(d / "input.txt"), str(tmp_path / "file"), "char", **QUIET)
    prepare_corpus(str(d), str(d), "char", chunk_bytes=100, num_proc=2, **QUIET)  # output beside the input
    assert read_out(d)[:2] == read_out(tmp_path / "file")[:2]
    # run again: the outputs in the directory are no documents
    info = prepare_corpus(str(d), str(d), "char", **QUIET)
    assert info["split_rule"] == "text_chars" and read_out(d)[:2] == read_out(tmp_path / "file")[:2]


def test_text_mode_of_prepare_reward_data_reads_one_file_only(tmp_path):
    """data_loader (prepare_reward_data.py --input_mode text) repeats the single-file rule; a
    directory of documents gets a clear error pointing to binary mode."""
    texts, _ = make_corpus(tmp_path / "corpus")
    with pytest.raises(DataError, match=r"directory of 6 text files") as e:
        load_token_data("text", str(tmp_path / "corpus"), tokenization="bpe")
    assert "--input_mode binary" in e.value.suggestion
    # prepare_reward_data.py's up-front validation reports it with the other problems
    cfg = RewardDataConfig(data_path=str(tmp_path / "corpus"), output_dir=str(tmp_path / "rd"), device="cpu")
    assert any("is a directory of 6 text files" in p.error for p in cfg.validate(report=False))
    one = tmp_path / "one"
    one.mkdir()
    (one / "input.txt").write_text(TRICKY, encoding="utf-8", newline="")
    prepare_corpus(str(one), str(tmp_path / "prepared"), "bpe", chunk_bytes=64, num_proc=2, **QUIET)
    data = load_token_data("text", str(one), tokenization="bpe")
    ids, _, info = read_out(tmp_path / "prepared")
    assert data.train.tolist() == ids["train"] and data.val.tolist() == ids["val"]
    assert data.source["train_sha256"] == info["train_sha256"]
    assert list_documents(str(one)) == [str(one / "input.txt")]


# ----------------------------------------------------------------------------- the pool's processes

POOL_PROBE = """import multiprocessing, os, runpy, sys, threading
import numpy, tqdm, lib.prepare  # imported under the real platform; then run_in_order sees argv[2]'s
multiprocessing.set_start_method(sys.argv[1], force=True)  # the platform's default (Python 3.14: forkserver)
sys.platform = sys.argv[2]
seen = []  # at each fork of this interpreter: its Python threads, and whether torch is loaded
os.register_at_fork(before=lambda: seen.append((sorted(t.name for t in threading.enumerate()), "torch" in sys.modules)))
sys.argv = ["prepare_data.py"] + sys.argv[3:]
try:
    runpy.run_path("prepare_data.py", run_name="__main__")
finally:
    print("FORKS", seen)
"""


def run_pool_probe(tmp_path, start_method, platform):
    """prepare_data.py --num_proc 2 on a small BPE corpus under that start method and reported platform:
    the forks its process made (see POOL_PROBE), and where the bins are."""
    path = tmp_path / "in.txt"
    path.write_text(make_text(3000), encoding="utf-8")
    r = subprocess.run([sys.executable, "-c", POOL_PROBE, start_method, platform, "--input", str(path), "--out_dir",
                        str(tmp_path / "out"), "--tokenization", "bpe", "--num_proc", "2", "--chunk_bytes", "2000"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    return eval(r.stdout.split("FORKS", 1)[1]), path, tmp_path / "out"


@pytest.mark.slow  # a command line in a subprocess
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the pool forks on Linux")
@pytest.mark.parametrize("default", ["fork", "forkserver"])
def test_the_pool_forks_from_one_thread_without_torch_whatever_the_default_start_method(tmp_path, default):
    """prepare_data.py's pool processes are forked from it, whatever multiprocessing's default: under
    forkserver (Python 3.14's default on Linux) they were the server's children, so they exited at once to
    die with their parent, and the pool restarted them forever. At each fork no other Python thread runs
    (tqdm's monitor did, a byte bar being open) and torch is not loaded (lib/prepare.py's module once imported it)."""
    seen, _, _ = run_pool_probe(tmp_path, default, "linux")
    assert len(seen) == 4, seen  # two processes for each of the two passes
    assert all(s == (["MainThread"], False) for s in seen), seen


@pytest.mark.slow  # a command line in a subprocess
def test_the_pool_elsewhere_spawns_and_gives_the_same_bins(tmp_path):
    """Away from Linux the pool keeps the platform's start method: spawn on macOS and Windows, whose
    processes import prepare_data.py again as their main module and get their initializer's arguments
    pickled. Run here with the platform reported as macOS: no fork, and the bins of --num_proc 1."""
    seen, path, out = run_pool_probe(tmp_path, "spawn", "darwin")
    assert seen == []  # spawn starts its processes without a fork of this interpreter
    prepare_corpus(str(path), str(tmp_path / "one"), "bpe", num_proc=1, chunk_bytes=2000, **QUIET)
    for name in ("train.bin", "val.bin"):
        assert (out / name).read_bytes() == (tmp_path / "one" / name).read_bytes(), name


# ----------------------------------------------------------------------------- kill -9

@pytest.mark.slow
def test_killed_run_leaves_the_previous_output_complete(tmp_path):
    """kill -9 in the middle: the earlier preparation in --out_dir stays complete and consistent,
    only *.tmp files are added, the pool processes die with their parent, and a rerun finishes
    clears the leftovers."""
    small = tmp_path / "small.txt"
    small.write_text(make_text(5000), encoding="utf-8")
    out = tmp_path / "out"
    prepare_corpus(str(small), str(out), "bpe", **QUIET)
    before = {n: (out / n).read_bytes() for n in os.listdir(out)}
    big = tmp_path / "big.txt"
    big.write_text(make_text(100_000, seed=1) * 40, encoding="utf-8")  # 4 MB: a second or two of BPE
    cmd = [sys.executable, "prepare_data.py", "--input", str(big), "--out_dir", str(out), "--tokenization", "bpe",
           "--num_proc", "2", "--chunk_bytes", "10000"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not any(n.startswith("train.bin.") for n in os.listdir(out)):
        assert p.poll() is None and time.time() < deadline, "no temporary output appeared"
        time.sleep(0.05)
    time.sleep(0.3)
    children = {pid for pid, _, _ in live_processes() if _ppid(pid) == p.pid}
    assert len(children) >= 2, "expected the 2 pool processes"
    p.send_signal(signal.SIGKILL)
    p.wait()
    while children & {pid for pid, _, _ in live_processes()}:
        assert time.time() < deadline, "pool processes outlived their parent"
        time.sleep(0.05)
    left = set(os.listdir(out)) - set(before)
    assert left and all(n.endswith(".tmp") for n in left)
    assert {n: (out / n).read_bytes() for n in before} == before  # old output untouched and consistent
    info = json.loads(before["prepare_info.json"])
    assert info["train_sha256"] == sha256_file(out / "train.bin")
    info = prepare_corpus(str(big), str(out), "bpe", num_proc=2, **QUIET)
    assert sorted(os.listdir(out)) == ["prepare_info.json", "train.bin", "val.bin"]
    assert info["input_chars"] == 4_000_000 and info["train_sha256"] == sha256_file(out / "train.bin")


def _ppid(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError):
        return None
