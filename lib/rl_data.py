"""
Prompt data of the fine-tuning scripts (train_grpo.py, train_spin.py): the base model's corpus, its
splits checked against the generator checkpoint's data record, and random natural windows of them as
prompts (and, for SPIN, their natural continuations).
"""
import os

import numpy as np
import torch

from core.errors import DataError
from core.files import sha256_file
from lib.corpus import Corpus


def prompt_corpus(data_record, data_dir, splits=("train", "val")):
    """The base model's Corpus: --data_dir, else the directory the checkpoint's data record names, with
    each of `splits` checked against that record (its size and sha256), so prompts come from the text
    the model was trained on."""
    if data_dir is None:
        recorded = {os.path.dirname(data_record[f"{s}_bin"]) if isinstance(data_record, dict)
                    and data_record.get(f"{s}_bin") else None for s in splits}
        if None in recorded:
            raise DataError("the policy checkpoint records no training data, so the prompt split is unknown",
                            "pass --data_dir with the train.bin/val.bin the model was trained on")
        if len(recorded) > 1 or any(os.path.basename(data_record[f"{s}_bin"]) != f"{s}.bin" for s in splits):
            raise DataError(f"the policy checkpoint records its splits outside one prepared directory "
                            f"({', '.join(data_record[f'{s}_bin'] for s in splits)})",
                            "pass --data_dir with the train.bin/val.bin the model was trained on")
        data_dir = recorded.pop()
    corpus = Corpus(data_dir)
    for split in splits:
        check_split(corpus, data_record, split)
    return corpus


def check_split(corpus, data_record, split):
    """Refuse a corpus whose `split` is missing or is not the one the checkpoint's data record describes."""
    path = corpus.train_bin if split == "train" else corpus.val_bin
    if not os.path.exists(path):
        raise DataError(f"{split} split not found: {path}",
                        "pass --data_dir with the base model's train.bin/val.bin")
    if isinstance(data_record, dict) and data_record.get(f"{split}_bytes") is not None:
        if os.path.getsize(path) != data_record[f"{split}_bytes"] or (
                data_record.get(f"{split}_sha256") and sha256_file(path) != data_record[f"{split}_sha256"]):
            raise DataError(f"{path} is not the {split} split the policy was trained on (size or "
                            f"sha256 differs from the checkpoint's data record)",
                            "prompts must come from the base model's own train split (and val "
                            "perplexity from its own val split): pass its --data_dir")


def sample_prompts(data, plen, n, rng):
    """n random windows of plen tokens from a memmap -> LongTensor (n, plen)."""
    starts = rng.integers(0, len(data) - plen + 1, size=n)
    idx = starts[:, None] + np.arange(plen)[None, :]
    return torch.from_numpy(data[idx].astype(np.int64))


def step_prompt_len(seed, step, seq_len):
    """Step `step`'s prompt length, uniform in [1, seq_len // 2], from (seed, step) alone."""
    return int(np.random.default_rng([seed, step]).integers(1, seq_len // 2 + 1))
