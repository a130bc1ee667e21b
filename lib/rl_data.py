"""
Prompt data shared by the RL fine-tuning scripts (train_grpo.py, train_spin.py): the base
model's token splits, checked against the generator checkpoint's data record, and random
natural windows of them as prompts (and, for SPIN, their natural continuations). Also what the
two scripts share besides data: their optimizer flags, and the check of the run's own
checkpoint before resuming from it.
"""
import os

import numpy as np
import torch

from core.errors import CheckpointError, DataError
from core.files import sha256_file
from lib.checkpoint import read_checkpoint
from lib.corpus import open_tokens
from lib.hf_interop import source_sha256


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
    return open_tokens(path), path


def sample_prompts(data, plen, n, rng):
    """n random windows of plen tokens from a memmap -> LongTensor (n, plen)."""
    starts = rng.integers(0, len(data) - plen + 1, size=n)
    idx = starts[:, None] + np.arange(plen)[None, :]
    return torch.from_numpy(data[idx].astype(np.int64))


def step_prompt_len(seed, step, seq_len):
    """Step `step`'s prompt length, uniform in [1, seq_len // 2], from (seed, step) alone."""
    return int(np.random.default_rng([seed, step]).integers(1, seq_len // 2 + 1))


def add_optimizer_args(p, lr_help="AdamW learning rate",
                       micro_help="sequences per forward/backward chunk (gradient accumulation); 0 = whole batch"):
    """The RL scripts' AdamW flags, one argument group (the same names and defaults in both)."""
    g = p.add_argument_group("optimizer")
    g.add_argument("--learning_rate", type=float, default=3e-5, help=lr_help)
    g.add_argument("--weight_decay", type=float, default=0.0, help="AdamW weight decay on matrices")
    g.add_argument("--beta1", type=float, default=0.9, help="AdamW beta1")
    g.add_argument("--beta2", type=float, default=0.95, help="AdamW beta2")
    g.add_argument("--grad_clip", type=float, default=1.0, help="clip the gradient norm to this (0 = off)")
    g.add_argument("--micro_batch_size", type=int, default=0, help=micro_help)
    return g


def own_checkpoint_to_resume(ckpt_path, state_key, what, model_path):
    """The run's own checkpoint (read), or None when there is none to resume from; refuses one that
    holds no `state_key` state or that was started from another --model_path."""
    if not os.path.exists(ckpt_path):
        return None
    own = read_checkpoint(ckpt_path)
    if own.get(state_key) is None:
        raise CheckpointError(f"{ckpt_path} holds no {what} state to resume from",
                              "use another --out_dir, or drop --resume to start over")
    if own[state_key].get("base_sha256") != source_sha256(model_path):
        raise CheckpointError(f"{ckpt_path} was started from a different --model_path",
                              "resume with the original --model_path, or use a fresh --out_dir")
    return own
