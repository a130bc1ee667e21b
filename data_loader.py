"""
Token data behind one interface, for prepare_reward_data.py and friends.

  text mode:   read a UTF-8 text file (or a directory holding one *.txt file), tokenize it and
               split it with nanoGPT's rule (corpus.split_text: the TEXT is cut at
               int(len * train_split) characters and both parts are encoded separately),
               i.e. exactly how prepare_data.py made the base model's train.bin / val.bin.
               A directory of several text files is a corpus of documents, which prepare_data.py
               splits its own way: text mode refuses it (use binary mode with its output).
  binary mode: lib/corpus.open_tokens over existing uint16 train.bin / val.bin (a memmap:
               nothing is read into memory until it is used), range-checked as
               corpus.check_token_bin checks them (corpus.check_token_ids).

Both return a TokenData with the two uint16 token streams, the tokenizer, and a record
of where the tokens came from (sizes and sha256 of each stream), comparable with the
'data' record that train.py stores in every checkpoint.

    from data_loader import load_and_split_data
    train_tokens, val_tokens, tokenizer = load_and_split_data('data/shakespeare_char/input.txt')
"""
import os
from dataclasses import dataclass, field

import numpy as np

from core.errors import BinaryFileError, DataError, MetaFileError
from core.files import sha256_bytes, sha256_file
from lib.corpus import check_token_ids, open_tokens, read_text, resolve_text_file, split_text, to_uint16
from tokenization_manager import TokenizationManager, detect_tokenization

UINT16_VOCAB_LIMIT = 65535  # the .bin formats store ids as uint16
METHODS = ("auto", "bpe", "char")


@dataclass
class TokenData:
    """Train and val token streams (uint16), the tokenizer, and where they came from."""
    train: np.ndarray
    val: np.ndarray
    tokenizer: TokenizationManager
    source: dict = field(default_factory=dict)

    @property
    def info(self):
        return self.tokenizer.info

    def split(self, name):
        return {"train": self.train, "val": self.val}[name]


def resolve_text_path(data_path):
    """A text file, or a directory holding one text file -> the text file's path
    (corpus.resolve_text_file; DataError for a directory of several)."""
    return resolve_text_file(data_path, "--data_path")


def resolve_tokenization(tokenization="auto", meta_path=None, data_source=None):
    """-> (method, meta_path). 'auto' follows detect_tokenization (meta.pkl beside the
    data -> char, 'char' in the directory name -> char, else bpe); 'char' without
    --meta_path looks for a meta.pkl beside the data. Raises MetaFileError when char
    tokenization has no vocabulary to use."""
    if tokenization not in METHODS:
        raise DataError(f"unknown tokenization {tokenization!r}", "use auto, bpe or char")
    if tokenization == "bpe":
        if meta_path is not None:
            raise MetaFileError("meta_path is only used with char tokenization, but tokenization is 'bpe'",
                                "drop --meta_path, or use --tokenization char/auto")
        return "bpe", None
    method, found = detect_tokenization(data_source, meta_path)
    if tokenization == "char" and method == "bpe":
        method, found = "char", None
    if method == "char" and found is None:
        raise MetaFileError("meta_path is required when tokenization is 'char'",
                            "pass --meta_path path/to/meta.pkl (the vocabulary the base model was "
                            "trained with), or put meta.pkl beside the data")
    return method, found


def make_tokenizer(tokenization="auto", meta_path=None, data_source=None):
    method, meta_path = resolve_tokenization(tokenization, meta_path, data_source)
    return TokenizationManager(method, meta_path=meta_path)


def open_token_bin(path, what="Train"):
    """corpus.open_tokens over a uint16 token file, with errors that name the split; `what` is 'Train' or 'Val'."""
    if path is None:
        raise BinaryFileError(f"{what.lower()}_bin is required in binary mode",
                              f"pass --{what.lower()}_bin path/to/{what.lower()}.bin")
    if not os.path.isfile(path):
        raise BinaryFileError(f"{what} binary file not found: {path}",
                              "check the path, or create it with prepare_data.py / the dataset's prepare.py")
    size = os.path.getsize(path)
    if size == 0 or size % 2:
        raise BinaryFileError(f"{what} binary file {path} has {size} bytes, not a whole number (> 0) "
                              f"of uint16 tokens", "the file is truncated or not a token file; re-create it")
    return open_tokens(path)


def load_token_data(input_mode="text", data_path=None, train_bin=None, val_bin=None,
                    tokenization="auto", meta_path=None, train_split=0.9):
    """Load train/val tokens in text or binary mode. Returns TokenData."""
    if input_mode == "text":
        text_path = resolve_text_path(data_path)
        tok = make_tokenizer(tokenization, meta_path, data_path)
        raw = read_text(text_path, "--data_path")
        train_text, val_text = split_text(raw, train_split)
        train = to_uint16(tok.encode_array(train_text), "train tokens")
        val = to_uint16(tok.encode_array(val_text), "val tokens")
        source = {"input_mode": "text", "data_path": os.path.abspath(text_path),
                  "data_sha256": sha256_file(text_path), "data_chars": len(raw),
                  "train_split": train_split, "split_rule": "text_chars",
                  "train_sha256": sha256_bytes(train.tobytes()), "val_sha256": sha256_bytes(val.tobytes())}
    elif input_mode == "binary":
        train = open_token_bin(train_bin, "Train")
        val = open_token_bin(val_bin, "Val")
        tok = make_tokenizer(tokenization, meta_path, train_bin)
        source = {"input_mode": "binary", "train_bin": os.path.abspath(train_bin),
                  "val_bin": os.path.abspath(val_bin),
                  "train_sha256": sha256_file(train_bin), "val_sha256": sha256_file(val_bin)}
    else:
        raise DataError(f"unknown input mode {input_mode!r}", "use --input_mode text or binary")
    if tok.vocab_size > UINT16_VOCAB_LIMIT:
        raise DataError(f"the {tok.method} vocabulary has {tok.vocab_size} tokens, beyond the uint16 range "
                        f"of the .bin formats (at most {UINT16_VOCAB_LIMIT})",
                        "use a tokenizer with a smaller vocabulary")
    for name, arr in (("train", train), ("val", val)):
        source[f"{name}_tokens"] = int(len(arr))
        # corpus.check_token_ids: check_token_bin's range check, on the arrays of either mode
        check_token_ids(arr, tok.vocab_size, f"the {name} tokens"
                        + (f" ({source[f'{name}_bin']})" if input_mode == "binary" else ""),
                        "pass the matching --tokenization / --meta_path or re-create the .bin files")
    source["tokenization"] = tok.info.to_dict()
    return TokenData(train, val, tok, source)


def load_and_split_data(data_path, train_split=0.9, tokenization="auto", meta_path=None):
    """Text mode in one call: -> (train_tokens, val_tokens, tokenizer), uint16 arrays."""
    d = load_token_data("text", data_path=data_path, tokenization=tokenization, meta_path=meta_path,
                        train_split=train_split)
    return d.train, d.val, d.tokenizer
