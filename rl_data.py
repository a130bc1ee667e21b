"""
Prompt data shared by the RL fine-tuning scripts (train_grpo.py, train_spin.py): the base
model's token splits, checked against the generator checkpoint's data record, and random
natural windows of them as prompts (and, for SPIN, their natural continuations).
"""
import os

import numpy as np
import torch

from common import DataError, sha256_file


def open_split(data_record, data_dir, split):
    """np.memmap of the base model's split, checked against the checkpoint's data record."""
    if data_dir is not None:
        path = os.path.join(data_dir, f"{split}.bin")
    elif isinstance(data_record, dict) and data_record.get(f"{split}_bin"):
        path = data_record[f"{split}_bin"]
    else:
        raise DataError("the policy checkpoint records no training data, so the prompt split is unknown",
                        "pass --data_dir with the train.bin/val.bin the model was trained on")
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
    return np.memmap(path, dtype=np.uint16, mode="r"), path


def sample_prompts(data, plen, n, rng):
    """n random windows of plen tokens from a memmap -> LongTensor (n, plen)."""
    starts = rng.integers(0, len(data) - plen + 1, size=n)
    idx = starts[:, None] + np.arange(plen)[None, :]
    return torch.from_numpy(data[idx].astype(np.int64))


def step_prompt_len(seed, step, seq_len):
    """Step `step`'s prompt length, uniform in [1, seq_len // 2], from (seed, step) alone."""
    return int(np.random.default_rng([seed, step]).integers(1, seq_len // 2 + 1))
