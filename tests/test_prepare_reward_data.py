"""prepare_reward_data.py and data_loader.py: the reward dataset from a tiny trained base model."""
import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import prepare_reward_data as prd  # noqa: E402
from core.errors import BinaryFileError, DataError, MetaFileError, ProjectError  # noqa: E402
from data_loader import load_and_split_data, load_token_data  # noqa: E402
from engine import Engine, generate_recompute  # noqa: E402
from helpers import make_reward_checkpoint, make_text, prepare_char_data, run_script, strip_to_nanogpt  # noqa: E402
from lib.checkpoint import load_model  # noqa: E402
from lib.corpus import check_token_bin, check_token_ids, max_token  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from tokenization_manager import TokenizationManager  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N = 32
SPC = 3
BLOCKS = 40  # train blocks used by the reference run (val has 31)
FILES = ("train_x.bin", "train_y.bin", "val_x.bin", "val_y.bin")



@pytest.fixture(scope="module")
def base(tmp_path_factory, tiny_char_ckpt):
    root = tmp_path_factory.mktemp("base")
    assert N == 32  # the shared checkpoint's block size
    text_path, data_dir, ckpt, meta = (tiny_char_ckpt[k] for k in ("text", "data_dir", "ckpt", "meta"))
    return {"root": root, "text": text_path, "data_dir": data_dir, "ckpt": ckpt, "meta": meta,
            "vocab": TokenizationManager("char", meta_path=meta).vocab_size}


def args_for(base, out, *extra, spc=SPC, blocks=BLOCKS):
    a = ["--model_path", base["ckpt"], "--data_path", base["text"], "--meta_path", base["meta"],
         "--output_dir", str(out), "--samples_per_chunk", str(spc), "--device", "cpu"]
    if blocks is not None:
        a += ["--max_blocks_per_split", str(blocks)]
    return a + list(extra)


def run_main(argv):
    """prd.main in this process; returns its stdout."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        prd.main(argv)
    return buf.getvalue()


def read_files(out):
    return {f: open(os.path.join(out, f), "rb").read() for f in FILES}


def load_split(out, split):
    x = np.fromfile(os.path.join(out, f"{split}_x.bin"), dtype=np.uint16).reshape(-1, N)
    y = np.fromfile(os.path.join(out, f"{split}_y.bin"), dtype=np.float32).reshape(-1, 2)
    return x, y


@pytest.fixture(scope="module")
def reference(base, tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "rd"
    log = run_main(args_for(base, out, "--gen_batch_size", "64"))
    return {"out": str(out), "log": log, "files": read_files(out)}


def streams(base):
    d = base["data_dir"]
    return {s: np.fromfile(os.path.join(d, f"{s}.bin"), dtype=np.uint16) for s in ("train", "val")}


# ----------------------------------------------------------------------------- output

def test_files_shapes_dtypes_and_metadata(base, reference):
    out = reference["out"]
    assert sorted(f for f in os.listdir(out) if not f.endswith(".json")) == sorted(
        list(FILES) + ["train_metadata.txt", "val_metadata.txt", ".lock"])  # no temporary files left
    n_val_blocks = len(streams(base)["val"]) // N
    for split, S in (("train", BLOCKS * SPC), ("val", n_val_blocks * SPC)):
        assert os.path.getsize(os.path.join(out, f"{split}_x.bin")) == S * N * 2
        assert os.path.getsize(os.path.join(out, f"{split}_y.bin")) == S * 2 * 4
        meta = dict(line.split(": ", 1) for line in open(os.path.join(out, f"{split}_metadata.txt")).read().splitlines())
        assert meta["num_samples"] == str(S) and meta["block_size"] == str(N)
        assert meta["x_shape"] == f"({S}, {N})" and meta["y_shape"] == f"({S}, 2)"
        assert (meta["x_dtype"], meta["y_dtype"]) == ("uint16", "float32")
        assert (meta["tokenization_method"], meta["vocab_size"]) == ("char", str(base["vocab"]))
        assert meta["meta_path"] == os.path.abspath(base["meta"])
        for k in ("model_sha256", "data_sha256", "train_source_sha256", "val_source_sha256", "temperature",
                  "top_k", "seed", "samples_per_chunk", "format_version", "created"):
            assert k in meta, k
        assert meta["model_sha256"] == prd.sha256_file(base["ckpt"])
        assert meta["split_check"].startswith("matched")
    log = reference["log"]
    for text in ("device: cpu", "parameters", f"char (vocab_size={base['vocab']})", f"train_x.bin ({BLOCKS * SPC}, {N})",
                 f"val_y.bin ({n_val_blocks * SPC}, 2)", "9,000 tokens"):
        assert text in log, text


def contains(stream, run):
    """Does the token run occur anywhere in the token stream?"""
    hay, needle = stream.tobytes(), run.tobytes()
    at = hay.find(needle)
    while at != -1:
        if at % 2 == 0:  # token-aligned
            return True
        at = hay.find(needle, at + 1)
    return False


def test_prefixes_are_natural_tokens_of_their_own_split(base, reference):
    st = streams(base)
    other = {"train": st["val"], "val": st["train"]}
    checked_other = 0
    for split in ("train", "val"):
        x, y = load_split(reference["out"], split)
        K = np.rint(y[:, 0] * N).astype(int)
        assert K.min() >= 1 and K.max() <= N - 1
        for i in range(len(x)):
            b = i // SPC  # the sample's own block, in order
            assert np.array_equal(x[i, :K[i]], st[split][b * N:b * N + K[i]]), (split, i)
            if K[i] >= 8:  # long enough to tell the splits apart (train text is lower case, val upper)
                assert not contains(other[split], x[i, :K[i]]), (split, i)
                checked_other += 1
        # the tails are generated, not copied: most differ from the natural continuation
        copied = sum(np.array_equal(x[i], st[split][(i // SPC) * N:(i // SPC + 1) * N]) for i in range(len(x)))
        assert copied < len(x) // 4
    assert checked_other > 50


def test_labels_match_the_crossover_plan(base, reference):
    st = streams(base)
    for split in ("train", "val"):
        x, y = load_split(reference["out"], split)
        K = prd.crossover_plan(len(st[split]), N, SPC, 42, split, max_blocks=BLOCKS)
        assert len(K) == len(y)
        expected = np.stack([K / N, (N - K) / N], 1).astype(np.float32)
        assert np.array_equal(y, expected)
        assert np.allclose(y.sum(1), 1.0, atol=1e-6)
        assert len(np.unique(K)) > N // 2  # K spread over [1, N-1]
    # train and val plans are drawn independently
    assert not np.array_equal(prd.crossover_plan(9000, N, 3, 42, "train")[:90],
                              prd.crossover_plan(1000, N, 3, 42, "val")[:90])


def test_tails_are_the_base_models_samples(base, reference):
    """Each tail is what the model samples from its prefix with the sample's own uniforms
    (checked against the no-cache reference generation)."""
    model, _, _ = load_model(base["ckpt"])
    model.eval()
    st = streams(base)
    x, y = load_split(reference["out"], "val")
    K = np.rint(y[:, 0] * N).astype(int)
    for i in range(0, len(x), 9):
        b = i // SPC
        prefix = torch.from_numpy(st["val"][b * N:b * N + K[i]].astype(np.int64))[None]
        U = prd.sample_uniforms(42, "val", [i], N)
        ref = generate_recompute(model, prefix, N - K[i], 1.0, None, uniforms=U)
        assert np.array_equal(ref[0].numpy(), x[i]), i


# ----------------------------------------------------------------------------- reproducibility

def test_byte_identical_across_batch_sizes_and_threads(base, reference, tmp_path):
    for bs in (16, 5):  # 5: every batch is padded to MIN_ROWS with copies of its own rows
        run_main(args_for(base, tmp_path / f"b{bs}", "--gen_batch_size", str(bs)))
        assert read_files(tmp_path / f"b{bs}") == reference["files"], bs
    # two threads (a capped run: its samples are the first ones of the reference)
    torch.set_num_threads(2)
    try:
        run_main(args_for(base, tmp_path / "t2", "--gen_batch_size", "17", "--max_samples_per_split", "24"))
    finally:
        torch.set_num_threads(1)
    for split in ("train", "val"):
        x2, y2 = load_split(tmp_path / "t2", split)
        xr, yr = load_split(reference["out"], split)
        assert np.array_equal(x2, xr[:24]) and np.array_equal(y2, yr[:24])


def test_sample_logits_are_bitwise_batch_invariant(base):
    """The root of the byte identity: a sample's logits at every step are bitwise equal
    whatever rows share its batch and however many threads run."""
    model, _, _ = load_model(base["ckpt"])
    model.eval()
    tokens = streams(base)["train"]
    K = prd.crossover_plan(len(tokens), N, SPC, 7, "train")
    gen = prd.GenSettings(N, SPC, 7, 1.0, None, 64, "cpu")
    group = np.flatnonzero(prd.prefill_lengths(K) == 16)[:40]  # one canonical prefill length

    from core import sampling
    head = sampling.logits_into
    assert len(group) <= sampling.HEAD_ROWS  # generate forms each step's head logits in one call

    def logits_of(indices, threads):
        seen = []

        def recording(x, weight, out):  # generate's head logits (sampling.head_sample), step by step
            seen.append(head(x, weight, out).clone())
            return out
        sampling.logits_into = recording
        torch.set_num_threads(threads)
        try:
            prd.generate_batch(Engine(model), tokens, indices, K, gen, "train")
        finally:
            torch.set_num_threads(1)
            sampling.logits_into = head
        return torch.stack(seen, 1)[:len(indices)]  # (rows, steps, vocab)

    full = logits_of(group, 1)
    for sub, threads in ((group[5:21], 1), (group[3:20], 2), (group[::2], 2), (group[7:9], 1)):
        got = logits_of(sub, threads)
        want = full[[list(group).index(i) for i in sub]]
        assert torch.equal(got, want), (len(sub), threads, (got - want).abs().max().item())


def test_capped_run_is_a_prefix_of_the_full_run(base, reference, tmp_path):
    run_main(args_for(base, tmp_path / "cap", "--max_samples_per_split", "50", blocks=None))
    for split in ("train", "val"):
        xa, ya = load_split(tmp_path / "cap", split)
        xr, yr = load_split(reference["out"], split)
        assert len(xa) == 50
        assert np.array_equal(xa, xr[:50]) and np.array_equal(ya, yr[:50])


def test_binary_mode_gives_the_same_dataset(base, reference, tmp_path):
    d = base["data_dir"]
    run_main(["--model_path", base["ckpt"], "--input_mode", "binary", "--train_bin", os.path.join(d, "train.bin"),
              "--val_bin", os.path.join(d, "val.bin"), "--output_dir", str(tmp_path / "bin"),
              "--samples_per_chunk", str(SPC), "--max_blocks_per_split", str(BLOCKS), "--device", "cpu"])
    assert read_files(tmp_path / "bin") == reference["files"]
    meta = open(tmp_path / "bin" / "train_metadata.txt").read()
    assert "input_mode: binary" in meta and "tokenization_method: char" in meta  # auto-detected from meta.pkl


def test_ctrl_c_then_resume(base, reference, tmp_path, monkeypatch, capsys):
    out = tmp_path / "int"
    real = prd.generate_batch
    calls = {"n": 0}

    def interrupted(*a, **k):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(prd, "generate_batch", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_main(args_for(base, out, "--gen_batch_size", "16"))
    monkeypatch.setattr(prd, "generate_batch", real)
    assert not os.path.exists(out / "train_x.bin") and os.path.exists(out / "train_x.bin.tmp")
    assert not os.path.exists(out / "train_metadata.txt")
    done = prd.read_done(str(out / "train_done.tmp"), BLOCKS * SPC)
    assert 0 < done.sum() < len(done)

    # without --resume: refused, nothing touched
    before = sorted(os.listdir(out))
    with pytest.raises(SystemExit) as e:
        run_main(args_for(base, out))
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "unfinished run" in err and "--resume" in err
    assert sorted(os.listdir(out)) == before
    # --resume with other settings: refused
    with pytest.raises(ProjectError, match="seed"):
        run_main(args_for(base, out, "--resume", "--seed", "1"))
    # --resume with the same settings (another batch size is fine): the uninterrupted result
    log = run_main(args_for(base, out, "--resume", "--gen_batch_size", "32"))
    assert "already done" in log
    assert read_files(out) == reference["files"]
    assert not [f for f in os.listdir(out) if f.endswith(".tmp")]


def _bits_done(path):
    try:
        with open(path, "rb") as f:
            return int(np.unpackbits(np.frombuffer(f.read(), dtype=np.uint8)).sum())
    except OSError:
        return None


def _run_until(argv, watch, total, timeout=120):
    """Start the script; kill -9 it as soon as `watch` shows partial progress."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.Popen([sys.executable, "prepare_reward_data.py", *argv], cwd=ROOT, env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0 = time.time()
    try:
        while time.time() - t0 < timeout:
            n = _bits_done(watch)
            if n is not None and 0 < n < total:
                os.kill(p.pid, signal.SIGKILL)
                p.wait()
                return n
            if p.poll() is not None:
                return None
            time.sleep(0.002)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return None


@pytest.mark.slow  # kill -9 of real runs at several points, then resumes
def test_kill_9_then_resume_is_byte_identical(base, tmp_path):
    argv = args_for(base, tmp_path / "k", "--gen_batch_size", "16", spc=8, blocks=None)
    S_train, S_val = (9000 // N) * 8, (1000 // N) * 8
    n1 = _run_until(argv, str(tmp_path / "k" / "train_done.tmp"), S_train)
    assert n1 is not None, "the run ended before it could be interrupted"
    assert not os.path.exists(tmp_path / "k" / "train_metadata.txt")
    n2 = _run_until(argv + ["--resume"], str(tmp_path / "k" / "val_done.tmp"), S_val)
    assert n2 is not None, "the resumed run ended before it could be interrupted in val"
    assert os.path.exists(tmp_path / "k" / "train_metadata.txt")  # train finished by the first resume
    assert not os.path.exists(tmp_path / "k" / "val_metadata.txt")
    r = run_script(["prepare_reward_data.py", *argv, "--resume"], cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "train: already complete" in r.stdout
    run_main(args_for(base, tmp_path / "straight", "--gen_batch_size", "64", spc=8, blocks=None))
    assert read_files(tmp_path / "k") == read_files(tmp_path / "straight")


def test_fresh_run_replaces_an_old_complete_dataset(base, reference, tmp_path):
    out = tmp_path / "re"
    shutil.copytree(reference["out"], out)
    log = run_main(args_for(base, out, "--max_samples_per_split", "10"))
    assert "replacing the existing reward dataset" in log
    assert os.path.getsize(out / "train_y.bin") == 10 * 8 and os.path.getsize(out / "val_y.bin") == 10 * 8


def test_a_directory_another_process_is_writing_is_left_alone(base, reference, tmp_path):
    """A second command into a directory that a live run holds stops before touching it
    (without the lock this fresh run would delete the dataset there)."""
    import fcntl
    out = tmp_path / "busy"
    shutil.copytree(reference["out"], out)
    fd = os.open(out / ".lock", os.O_RDWR | os.O_CREAT)  # another description: as if another process
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.pwrite(fd, b"4242\n", 0)
    try:
        with pytest.raises(ProjectError) as e:
            run_main(args_for(base, out))
    finally:
        os.close(fd)
    assert e.value.message == (f"--output_dir {out} is in use by another process "
                               f"(lock {out / '.lock'}, taken by process 4242)")
    assert read_files(out) == reference["files"]
    assert os.path.exists(out / "train_metadata.txt") and os.path.exists(out / "val_metadata.txt")


# ----------------------------------------------------------------------------- checks

def test_split_mismatch_is_refused_unless_overridden(base, tmp_path, capsys):
    with pytest.raises(DataError) as e:
        run_main(args_for(base, tmp_path / "a", "--train_split", "0.8"))
    msg = str(e.value)
    assert "does not match the base model's training data" in msg and "contaminat" in msg
    assert "--train_split is 0.8" in msg and "0.9" in msg
    assert not os.path.exists(tmp_path / "a")  # refused before anything was written
    log = run_main(args_for(base, tmp_path / "b", "--train_split", "0.8", "--allow_split_mismatch",
                            "--max_samples_per_split", "4"))
    assert "WARNING" in log and "MISMATCH overridden" in open(tmp_path / "b" / "val_metadata.txt").read()


def test_other_corpus_in_binary_mode_is_refused(base, tmp_path):
    _, other = prepare_char_data(str(tmp_path / "other"), make_text(9000, seed=5) + make_text(1000, seed=6))
    shutil.copy(base["meta"], os.path.join(other, "meta.pkl"))  # same vocabulary, different text
    argv = ["--model_path", base["ckpt"], "--input_mode", "binary", "--train_bin", os.path.join(other, "train.bin"),
            "--val_bin", os.path.join(other, "val.bin"), "--output_dir", str(tmp_path / "o"), "--device", "cpu"]
    with pytest.raises(DataError, match="different tokens"):
        run_main(argv)


def test_checkpoint_without_split_record(base, tmp_path):
    nano = strip_to_nanogpt(base["ckpt"], str(tmp_path / "nano.pt"))
    argv = args_for(base, tmp_path / "n", "--max_samples_per_split", "4")
    argv[1] = nano
    with pytest.raises(DataError, match="records no train/val split"):
        run_main(argv)
    log = run_main(argv + ["--allow_split_mismatch"])
    assert "WARNING" in log and "records no train/val split" in log
    assert "unverified" in open(tmp_path / "n" / "train_metadata.txt").read()


def test_token_ids_beyond_the_model_vocabulary(base, tmp_path):
    d = tmp_path / "bad"
    d.mkdir()
    shutil.copy(base["meta"], d / "meta.pkl")
    val = np.fromfile(os.path.join(base["data_dir"], "val.bin"), dtype=np.uint16)
    val[10] = base["vocab"]  # one past the vocabulary
    val.tofile(d / "val.bin")
    shutil.copy(os.path.join(base["data_dir"], "train.bin"), d / "train.bin")
    argv = ["--model_path", base["ckpt"], "--input_mode", "binary", "--train_bin", str(d / "train.bin"),
            "--val_bin", str(d / "val.bin"), "--output_dir", str(tmp_path / "o"), "--device", "cpu"]
    with pytest.raises(BinaryFileError, match=f"token id {base['vocab']}"):
        run_main(argv)


def test_reward_checkpoint_is_refused(base, tmp_path, capsys):
    rm = make_reward_checkpoint(base["ckpt"], str(tmp_path / "rm.pt"))
    argv = args_for(base, tmp_path / "o")
    argv[1] = rm
    with pytest.raises(SystemExit):
        run_main(argv)
    assert "is a reward checkpoint" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "o")


def test_padded_vocabulary_ids_are_never_generated(base):
    """A model whose vocab is larger than the tokenizer's (nanoGPT pads 50257 -> 50304)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=N, vocab_size=200, n_layer=2, n_head=2, n_embd=32)).eval()
    tokens = streams(base)["train"]
    K = prd.crossover_plan(len(tokens), N, 2, 0, "train")
    gen = prd.GenSettings(N, 2, 0)
    idx = np.flatnonzero(prd.prefill_lengths(K) == 1)[:32]
    V = base["vocab"]
    assert prd.generate_batch(Engine(model), tokens, idx, K, gen, "train").max() >= V  # untrained: padding ids appear
    prd.restrict_output_vocab(model, V)
    assert prd.generate_batch(Engine(model), tokens, idx, K, gen, "train").max() < V


def test_batches_share_one_prefill_length():
    K = np.random.default_rng(0).integers(1, 256, size=1000)
    batches = prd.make_batches(np.arange(1000), K, 64)
    assert sorted(np.concatenate(batches).tolist()) == list(range(1000))
    for b in batches:
        assert len(b) <= 64 and len(set(prd.prefill_lengths(K[b]).tolist())) == 1
        assert (prd.prefill_lengths(K[b]) <= K[b]).all()
    assert prd.prefill_lengths(np.array([1, 15, 16, 31, 32, 255])).tolist() == [1, 1, 16, 16, 32, 240]


# ----------------------------------------------------------------------------- data_loader

def test_load_and_split_data_matches_prepared_bins(base, tmp_path):
    train, val, tok = load_and_split_data(os.path.dirname(base["text"]) + "/tiny_char/../input.txt",
                                          tokenization="char", meta_path=base["meta"])
    st = streams(base)
    assert train.dtype == np.uint16 and np.array_equal(train, st["train"]) and np.array_equal(val, st["val"])
    assert tok.method == "char" and tok.vocab_size == base["vocab"]
    # the simple form: a directory holding input.txt and meta.pkl -> char auto-detected
    d = str(tmp_path / "simple")  # a copy: the shared corpus directory is read only
    os.makedirs(d)
    shutil.copy(base["text"], os.path.join(d, "input.txt"))
    shutil.copy(base["meta"], os.path.join(d, "meta.pkl"))
    train2, val2, tok2 = load_and_split_data(d, 0.9)
    assert tok2.method == "char" and np.array_equal(train2, st["train"]) and np.array_equal(val2, st["val"])
    b = load_token_data("binary", train_bin=os.path.join(base["data_dir"], "train.bin"),
                        val_bin=os.path.join(base["data_dir"], "val.bin"))
    assert isinstance(b.train, np.memmap) and b.info.method == "char"
    assert b.source["train_sha256"] == load_token_data("text", base["text"], meta_path=base["meta"]).source["train_sha256"]


def test_data_loader_range_checks_with_the_corpus_check(tmp_path, monkeypatch):
    """data_loader's range check is lib/corpus's (check_token_ids, check_token_bin's), on both splits, with
    the chunked max of max_token; no copy of it of its own."""
    import data_loader
    ids = np.array([3, 9, 1, 4], dtype=np.uint16)
    assert max_token(ids, chunk=3) == 9 and max_token(ids[:0]) == -1
    with pytest.raises(BinaryFileError, match=r"^the x contains token id 9, outside the vocabulary of size 9$"):
        check_token_ids(ids, 9, "the x", chunk=2)
    check_token_ids(ids, 10, "the x")
    p = tmp_path / "t.bin"
    ids.tofile(p)
    with pytest.raises(BinaryFileError, match="t.bin contains token id 9, outside the vocabulary of size 5"):
        check_token_bin(str(p), vocab_size=5)
    seen = []
    monkeypatch.setattr(data_loader, "check_token_ids", lambda arr, v, what, hint: seen.append((len(arr), v, what)))
    d = load_token_data("binary", train_bin=str(p), val_bin=str(p), tokenization="bpe")
    assert seen == [(4, d.tokenizer.vocab_size, f"the {s} tokens ({p})") for s in ("train", "val")]


def test_data_loader_errors(base, tmp_path):
    with pytest.raises(BinaryFileError, match="Val binary file not found"):
        load_token_data("binary", train_bin=os.path.join(base["data_dir"], "train.bin"), val_bin=str(tmp_path / "v.bin"))
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"\x01\x00\x02")
    with pytest.raises(BinaryFileError, match="whole number"):
        load_token_data("binary", train_bin=str(odd), val_bin=str(odd), tokenization="bpe")
    with pytest.raises(MetaFileError, match="meta_path is required when tokenization is 'char'"):
        load_token_data("text", base["text"], tokenization="char")


def test_temperature_mix_is_recorded_deterministic_and_resumable(base, tmp_path, monkeypatch):
    mix = ("--temperatures", "0.5,1.5", "--max_samples_per_split", "40")
    run_main(args_for(base, tmp_path / "a", *mix, "--gen_batch_size", "64"))
    files = read_files(tmp_path / "a")
    for split in ("train", "val"):
        meta = dict(line.split(": ", 1) for line in open(tmp_path / "a" / f"{split}_metadata.txt").read().splitlines())
        assert meta["temperatures"] == "0.5,1.5" and meta["temperature"] == "None"
        counts = json.loads(meta["temperature_counts"])
        assert set(counts) == {"0.5", "1.5"} and sum(counts.values()) == 40 and min(counts.values()) > 0
    # the per-sample temperatures come from the seed alone; each sample's tail is exactly what a
    # single-temperature run at its temperature makes (per-row temperatures, per-sample noise)
    n_tok = len(streams(base)["train"])
    gen = prd.GenSettings(N, SPC, 42)
    temps = prd.temperature_plan(gen, n_tok, "train", [0.5, 1.5], 40)
    assert np.array_equal(temps, prd.temperature_plan(gen, n_tok, "train", [0.5, 1.5], 200)[:40])
    x_mix, _ = load_split(tmp_path / "a", "train")
    for t in (0.5, 1.5):
        run_main(args_for(base, tmp_path / f"t{t}", "--temperature", str(t), "--max_samples_per_split", "40"))
        x_t, _ = load_split(tmp_path / f"t{t}", "train")
        assert np.array_equal(x_mix[temps == t], x_t[temps == t]) and not np.array_equal(x_mix, x_t)
    # deterministic for any batch size; interrupted and resumed: the same bytes
    real, calls = prd.generate_batch, {"n": 0}

    def interrupted(*a, **k):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(prd, "generate_batch", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_main(args_for(base, tmp_path / "b", *mix, "--gen_batch_size", "16"))
    monkeypatch.setattr(prd, "generate_batch", real)
    with pytest.raises(ProjectError, match="temperatures"):  # another mix is another run
        run_main(args_for(base, tmp_path / "b", "--temperatures", "0.5,1.4", "--max_samples_per_split", "40",
                          "--resume"))
    run_main(args_for(base, tmp_path / "b", *mix, "--gen_batch_size", "32", "--resume"))
    assert read_files(tmp_path / "b") == files


def test_gpu_batching_across_prefill_lengths_gives_the_same_bytes(base, reference, tmp_path, monkeypatch):
    """A GPU merges prefill lengths in one batch (GenSettings.merge: make_batches across lengths, each
    row prefilled to its own inside GPT.generate's static decoder). On CPU that path gives the reference
    dataset byte for byte: a row's tokens do not depend on which lengths share its batch."""
    seen = []
    make = prd.make_batches

    def recording(indices, K, batch_size, merge=False):
        out = make(indices, K, batch_size, merge)
        seen.extend(len(set(prd.prefill_lengths(K[b]))) for b in out)
        return out
    monkeypatch.setattr(prd, "make_batches", recording)
    real = prd.GenSettings
    monkeypatch.setattr(prd, "GenSettings", lambda *a, **k: real(*a, **{**k, "merge": True}))
    log = run_main(args_for(base, tmp_path / "merged", "--gen_batch_size", "64"))
    assert "batches across prefill lengths" in log and max(seen) > 1
    assert read_files(tmp_path / "merged") == reference["files"]


def test_generation_under_bfloat16_autocast_on_cpu(base, reference, tmp_path, capsys):
    """--dtype bfloat16 generates under autocast on CPU too (the GPU's default precision): valid samples
    of the same plan that differ from the float32 ones somewhere, the precision in the metadata, and a
    float32 run cannot be resumed in bfloat16."""
    run_main(args_for(base, tmp_path / "bf16", "--dtype", "bfloat16"))
    for split in ("train", "val"):
        meta = dict(line.split(": ", 1) for line in open(tmp_path / "bf16" / f"{split}_metadata.txt").read().splitlines())
        ref_meta = dict(line.split(": ", 1) for line in open(os.path.join(reference["out"], f"{split}_metadata.txt"))
                        .read().splitlines())
        assert meta["dtype"] == "bfloat16" and ref_meta["dtype"] == "float32"
        x, y = load_split(tmp_path / "bf16", split)
        xr, yr = load_split(reference["out"], split)
        assert np.array_equal(y, yr) and x.shape == xr.shape and x.max() < base["vocab"]
        K = np.rint(y[:, 0] * N).astype(int)
        assert all(np.array_equal(x[i, :K[i]], xr[i, :K[i]]) for i in range(len(x)))  # the natural prefixes
    assert read_files(tmp_path / "bf16") != reference["files"]
    shutil.copytree(reference["out"], tmp_path / "partial")
    open(tmp_path / "partial" / "train_x.bin.tmp", "wb").close()  # an unfinished float32 run
    with pytest.raises(ProjectError, match="dtype"):
        run_main(args_for(base, tmp_path / "partial", "--dtype", "bfloat16", "--resume"))


def test_a_split_is_generated_by_one_engine_whose_decoders_serve_every_batch(base, monkeypatch):
    """The engine owns its static decoders (and on CUDA their captured graphs): a new Engine per batch would
    rebuild and re-capture them every batch, so iter_generated holds one for the whole split."""
    from lib import reward_samples
    model, _, _ = load_model(base["ckpt"])
    model.eval()
    tokens = streams(base)["train"]
    K = prd.crossover_plan(len(tokens), N, SPC, 7, "train")
    gen = prd.GenSettings(N, SPC, 7, 1.0, None, 8, "cpu")
    made = []
    real_init = Engine.__init__
    monkeypatch.setattr(Engine, "__init__", lambda self, *a, **k: (made.append(1), real_init(self, *a, **k))[1])
    batches = list(reward_samples.iter_generated(model, tokens, K, np.arange(40), gen, "train"))
    assert len(batches) > 2 and len(made) == 1
