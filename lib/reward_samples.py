"""
The sample plan and generation of the reward dataset (prepare_reward_data.py), as a library:
the crossovers K of a split's samples (crossover_plan), their temperatures (temperature_plan),
each sample's own sampling noise (sample_uniforms), batching by canonical prefill length
(make_batches) and the base model's generation of a batch (generate_batch, iter_generated).

prepare_reward_data.py writes the dataset with these; bench/bench_reward_data.py times
iter_generated. Why a sample's tokens never depend on batching, thread count or process
count: see prepare_reward_data.py's docstring.
"""
import hashlib
import json
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from core.devices import autocast_context
from engine import Engine

PREFILL_BUCKET = 16  # canonical prefill length = K rounded down to a multiple of this (min 1)
MIN_ROWS = 16  # short batches are padded with copies of their own rows up to this many
SPLIT_IDS = {"train": 0, "val": 1}


def crossover_plan(n_tokens, block_size, samples_per_chunk, seed, split, max_blocks=None, max_samples=None):
    """Crossovers K (int64, one per sample, in [1, N-1]) of a split's samples.

    Sample i uses block i // samples_per_chunk. All K of the full plan are drawn at once
    from a generator seeded by (seed, split), so K never depends on batching and a capped
    run makes exactly the first samples of the full one."""
    n_blocks = n_tokens // block_size
    rng = np.random.default_rng([seed, SPLIT_IDS[split]])
    K = rng.integers(1, block_size, size=n_blocks * samples_per_chunk, dtype=np.int64)
    if max_blocks is not None:
        K = K[:max_blocks * samples_per_chunk]
    if max_samples is not None:
        K = K[:max_samples]
    return K


def temperature_plan(gen, n_tokens, split, temperatures, n):
    """Sampling temperature (float32, one per sample) of the first n samples of a split of n_tokens, each
    drawn uniformly from `temperatures` by a generator seeded by (gen.seed, split, 1) over the full plan
    of GenSettings gen (its block_size and samples_per_chunk), so it never depends on batching and a
    capped run uses the first draws of the full one."""
    rng = np.random.default_rng([gen.seed, SPLIT_IDS[split], 1])
    pick = rng.integers(0, len(temperatures), size=(n_tokens // gen.block_size) * gen.samples_per_chunk)
    return np.asarray(temperatures, dtype=np.float32)[pick[:n]]


def temperature_counts(temps):
    """{"0.7": count, ...} of a split's per-sample temperatures, as a JSON line for the metadata."""
    values, counts = np.unique(temps, return_counts=True)
    return json.dumps({f"{float(v):g}": int(c) for v, c in zip(values, counts)})


def sample_seed(seed, split, i):
    h = hashlib.sha256(f"reward-sample/{seed}/{split}/{i}".encode()).digest()
    return int.from_bytes(h[:8], "little") & ((1 << 63) - 1)


def sample_uniforms(seed, split, indices, block_size):
    """(len(indices), N) uniforms; row r is sample indices[r]'s own stream (column t is
    used for position t), the same however samples are batched."""
    out = torch.empty(len(indices), block_size)
    for r, i in enumerate(indices):
        g = torch.Generator().manual_seed(sample_seed(seed, split, int(i)))
        torch.rand(block_size, generator=g, out=out[r])
    return out


def labels(K, block_size):
    """[K/N, (N-K)/N] as float32: the natural and the synthetic fraction."""
    K = np.asarray(K, dtype=np.float64)
    return np.stack([K / block_size, (block_size - K) / block_size], axis=1).astype(np.float32)


def prefill_lengths(K):
    """Canonical prefill length of each sample (depends on its K only)."""
    return np.maximum(1, (np.asarray(K) // PREFILL_BUCKET) * PREFILL_BUCKET)


def make_batches(indices, K, batch_size, merge=False):
    """Pending sample indices -> batches of one prefill length each, in (prefill, index) order.
    A group of n samples is cut into ceil(n / batch_size) batches of near-equal size
    (70 -> 35 + 35 rather than 64 + 6: no tiny, padded batch). merge: batches cut from that order
    across prefill lengths (a GPU's decoder prefills each length of a batch on its own, and a decode
    step costs about as much at 8 rows as at 64)."""
    indices = np.asarray(indices, dtype=np.int64)
    P = prefill_lengths(K[indices])
    order = np.lexsort((indices, P))
    indices, P = indices[order], P[order]
    if merge:
        return np.array_split(indices, -(-len(indices) // batch_size)) if len(indices) else []
    starts = np.flatnonzero(np.r_[True, P[1:] != P[:-1]])
    ends = np.r_[starts[1:], len(P)]
    return [b for s, e in zip(starts, ends)
            for b in np.array_split(indices[s:e], -(-(e - s) // batch_size))]


@dataclass
class GenSettings:
    block_size: int
    samples_per_chunk: int
    seed: int
    temperature: float = 1.0
    top_k: Optional[int] = None
    batch_size: int = 64
    device: str = "cpu"
    temperature_plans: Optional[dict] = None  # split -> per-sample temperatures (--temperatures)
    dtype: str = "float32"  # autocast precision of generation (common.autocast_context)
    # batches across prefill lengths, each row prefilled to its own (make_batches; GPT.generate's static
    # decoder): what a GPU runs; on CPU the same tokens (tests/test_prepare_reward_data.py)
    merge: bool = False


@torch.no_grad()
def generate_batch(engine, tokens, indices, K, gen, split):
    """Samples `indices` -> their token rows, uint16 (len, N). One prefill length per batch, or, where
    batches merge lengths (gen.merge), each row's own. engine: the generator's Engine, held by the caller for
    every batch (its static decoders, and on CUDA their graphs, then serve them all)."""
    N = gen.block_size
    n = len(indices)
    rows = np.resize(indices, max(n, MIN_ROWS))  # pad a short batch with copies of its own rows
    starts = (rows // gen.samples_per_chunk) * N
    nat = np.stack([tokens[s:s + N] for s in starts]).astype(np.int64)
    k = K[rows]
    P = prefill_lengths(k)
    assert gen.merge or (P == P[0]).all(), "a batch must share one prefill length"
    prefill = int(P[0]) if (P == P[0]).all() else torch.from_numpy(P).to(gen.device)
    U = sample_uniforms(gen.seed, split, rows, N)
    temperature = gen.temperature  # one for all, or each sample's own (a per-row tensor)
    if gen.temperature_plans is not None:
        temperature = torch.from_numpy(gen.temperature_plans[split][rows]).to(gen.device)
    decoder = engine.decoder(torch.device(gen.device))
    if gen.merge and decoder == "eager":  # rows of several prefill lengths: the static cache's alone
        decoder = "static"
    with autocast_context(gen.device, gen.dtype):
        out = engine.generate(torch.from_numpy(nat).to(gen.device), max_new_tokens=0, temperature=temperature,
                              top_k=gen.top_k, prefix_lens=torch.from_numpy(k).to(gen.device),
                              uniforms=U.to(gen.device), prefill_len=prefill, decoder=decoder)
    return out[:n].cpu().numpy().astype(np.uint16)


def iter_generated(model, tokens, K, pending, gen, split):
    """Yield (indices, token rows) batch by batch for the pending samples of a split: the batches
    and generation prepare_reward_data.run_split uses. The benchmark (bench/bench_reward_data.py)
    times exactly this."""
    engine = Engine(model)  # one engine: its decoders serve every batch
    for batch in make_batches(pending, K, gen.batch_size, gen.merge):
        yield batch, generate_batch(engine, tokens, batch, K, gen, split)
