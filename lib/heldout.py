"""
Windows of a token file. The held-out loss of a generator over val.bin: consecutive windows, their loader, and
the token-weighted mean cross-entropy and perplexity (evaluate.py is its command line; train_grpo.py, train_spin.py
and run_cycles' measurements call it too). train.py's random batches: nanoGPT's get_batch, and step_offsets, one
stream of offsets for any number of processes.
"""
import math

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from core.cli import progress_bar
from core.devices import autocast_context
from core.errors import DataError
from lib.corpus import check_token_bin, open_tokens


class TokenWindows(Dataset):
    """Consecutive (x, y) windows of a uint16 .bin: window i covers tokens
    [i*block_size, i*block_size + block_size + 1), so the targets never overlap.
    The last, shorter window is padded (x with 0, y with -1, which the loss ignores)."""

    def __init__(self, bin_path, block_size):
        self.bin_path = bin_path
        self.block_size = block_size
        self.n_tokens = check_token_bin(bin_path, min_tokens=2)
        self.n_windows = math.ceil((self.n_tokens - 1) / block_size)

    def __len__(self):
        return self.n_windows

    def __getitem__(self, i):
        data = open_tokens(self.bin_path)
        start = i * self.block_size
        win = torch.from_numpy(data[start:start + self.block_size + 1].astype(np.int64))
        x = torch.zeros(self.block_size, dtype=torch.long)
        y = torch.full((self.block_size,), -1, dtype=torch.long)
        x[:len(win) - 1] = win[:-1]
        y[:len(win) - 1] = win[1:]
        return x, y


def make_eval_loader(bin_path, block_size, batch_size):
    """DataLoader of (x, y) batches covering the whole .bin once, in order."""
    return DataLoader(TokenWindows(bin_path, block_size), batch_size=batch_size, shuffle=False)


@torch.no_grad()
def evaluate_loss(model, data_loader, device, max_batches=None, dtype="float32", progress=False):
    """(token-weighted mean cross-entropy, number of scored tokens) over the loader.
    Targets equal to -1 are not scored."""
    raw = getattr(model, "module", model)
    raw = getattr(raw, "_orig_mod", raw)
    if raw.config.mode != "generator":
        raise ValueError("perplexity needs a generator model, got a reward model")
    was_training = model.training
    model.eval()
    total = torch.zeros((), dtype=torch.float64, device=device)
    count = 0
    batches = data_loader
    if progress:
        n = len(data_loader) if max_batches is None else min(max_batches, len(data_loader))
        batches = progress_bar(data_loader, total=n, desc="eval", unit="batch")
    for k, (x, y) in enumerate(batches):
        if max_batches is not None and k >= max_batches:
            break
        x, y = x.to(device), y.to(device)
        scored = y != -1
        with autocast_context(str(device), dtype):
            # chunked log-probs: never the full (B, T, vocab) logits at once (50k BPE vocab)
            logp = raw.token_logprobs(x, y.clamp(min=0))
        total -= logp.double()[scored].sum()
        count += int(scored.sum())
    model.train(was_training)
    if count == 0:
        raise DataError("the evaluation data holds no tokens to score")
    return total.item() / count, count


def calculate_perplexity(model, data_loader, device, max_batches=None, dtype="float32"):
    """exp of the token-weighted mean cross-entropy over every batch (x, y) of the loader."""
    loss, _ = evaluate_loss(model, data_loader, device, max_batches, dtype)
    return math.exp(loss)


def get_batch(corpus, split, batch_size, block_size, generator, device):
    """nanoGPT's batches of a Corpus split ('train' or 'val'): random offsets drawn from `generator`, inputs
    and next-token targets."""
    ix = torch.randint(corpus.num_tokens(split) - block_size, (batch_size,), generator=generator)
    return batch_at(corpus, split, ix.numpy(), block_size, device)



def batch_at(corpus, split, ix, block_size, device):
    """Inputs and next-token targets of the windows of a split starting at offsets `ix`."""
    data = corpus.fresh_tokens(split)  # a fresh memmap per batch, as nanoGPT's
    win = data[ix[:, None] + np.arange(block_size + 1)].astype(np.int64)
    x = torch.from_numpy(np.ascontiguousarray(win[:, :-1]))
    y = torch.from_numpy(np.ascontiguousarray(win[:, 1:]))
    if device.startswith("cuda"):
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.to(device), y.to(device)



def step_offsets(corpus, micro_steps, batch_size, block_size, generator, dist):
    """This process's micro-batch offsets for one optimizer step, shape (micro_steps, batch_size).

    Every process draws the offsets of the WHOLE step (all processes' micro-batches) from the
    same generator and keeps its own slice, so the data of step i is the same for any number
    of processes: 1 process with gradient_accumulation_steps=4 sees exactly the batches that
    4 processes with 1 micro-step each see, and a resumed run continues the same stream."""
    total = micro_steps * dist.world_size
    ix = torch.randint(corpus.num_tokens("train") - block_size, (total, batch_size), generator=generator)
    return dist.my_slice(ix).numpy()
