"""
Reward-dataset generation throughput: prepare_reward_data.py's generation path against
doing the same job with Hugging Face transformers GPT2LMHeadModel.generate.

The job: S samples of N tokens (6-layer / 6-head / 384-wide GPT, N = block 256, char
vocab 65); sample i keeps the first K_i natural tokens of its block (K_i uniform in
[1, N-1], the script's own crossover plan) and the model samples the other N - K_i.
Throughput = generated tokens (sum of N - K_i) per second of wall time.

  ours:     reward_samples.iter_generated (exactly what prepare_reward_data.py runs: batches of
            one canonical prefill length, KV cache, mixed-prefix GPT.generate).
  HF:       the prompts x[:K_i] left-padded to the batch's max K with an attention mask,
            generate(do_sample=True, use_cache=True, max_new_tokens=N - min K) (HF cannot
            stop rows at different lengths; each row keeps its first N - K_i new tokens).
            Measured twice: batches in sample order (the obvious way) and batches sorted
            by K (less padding and overrun, HF's best case).

    python bench/bench_reward_data.py --threads 1          # 1024 samples, batch 64 (about 35 min on 1 core)
    python bench/bench_reward_data.py --no_hf_order        # skip the slowest baseline
"""
import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common_hf import ROOT, bench_model, hf_copy, machine_info, max_logit_diff  # noqa: E402
from engine import decode_status  # noqa: E402
from lib import reward_samples  # noqa: E402  (the generation prepare_reward_data.py runs)
from lib.corpus import open_tokens  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
ap.add_argument("--block_size", type=int, default=256, help="tokens per sample N (= the model's context)")
ap.add_argument("--vocab", type=int, default=65, help="vocabulary size (65 = shakespeare_char)")
ap.add_argument("--num_samples", type=int, default=1024,
                help="samples generated per method and repeat (the script batches samples of one prefill length "
                     "together, so it needs about 16 x batch_size samples for full batches, as in real runs)")
ap.add_argument("--samples_per_chunk", type=int, default=10, help="samples per natural block (as the script)")
ap.add_argument("--batch_size", type=int, default=64, help="generation batch size for both methods")
ap.add_argument("--repeats", type=int, default=1, help="timed repeats (interleaved; the median is reported)")
ap.add_argument("--tokens", default=os.path.join(ROOT, "data", "shakespeare_char", "train.bin"),
                help="uint16 token file for the natural blocks (random tokens if it does not exist)")
ap.add_argument("--temperature", type=float, default=1.0, help="sampling temperature for both methods")
ap.add_argument("--top_k", type=int, default=None, help="top-k for both methods (default: none)")
ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's default)")
ap.add_argument("--no_hf_order", action="store_true", help="skip the (slowest) HF run in sample order")
ap.add_argument("--seed", type=int, default=1337, help="seed for the weights and the crossover plan")
ap.add_argument("--out", default=None, help="also write the results as JSON here")
args = ap.parse_args()

if args.threads:
    torch.set_num_threads(args.threads)
N, S = args.block_size, args.num_samples
model = bench_model(args.vocab, N, seed=args.seed).eval()
if os.path.exists(args.tokens):
    tokens = open_tokens(args.tokens)
    source = args.tokens
else:
    tokens = np.random.default_rng(args.seed).integers(0, args.vocab, size=400 * N).astype(np.uint16)
    source = "random tokens"
assert int(tokens[:S * N].max()) < args.vocab, "token ids beyond --vocab"
K = reward_samples.crossover_plan(len(tokens), N, args.samples_per_chunk, args.seed, "train", max_samples=S)
assert len(K) == S, "not enough tokens for --num_samples"
useful = int((N - K).sum())
gen = reward_samples.GenSettings(N, args.samples_per_chunk, args.seed, args.temperature, args.top_k,
                                 args.batch_size, "cpu")
print(machine_info())
print(f"model: 6 layers, 6 heads, 384 wide, block {N}, vocab {args.vocab}, {model.get_num_params() / 1e6:.2f}M "
      f"params; {S} samples from {source}, {useful:,} tokens to generate; batch {args.batch_size}")

hf = hf_copy(model, n_positions=2 * N)  # rows with long prompts run past position N in HF's batched generate
hf_diff = max_logit_diff(model, hf, T=N)
print(f"HF copy check: max |logits diff| over {N} positions = {hf_diff:.2e}")
hf_sample = dict(do_sample=True, use_cache=True, temperature=args.temperature, top_k=args.top_k or 0, top_p=1.0,
                 pad_token_id=0, eos_token_id=None)
starts = (np.arange(S) // args.samples_per_chunk) * N
nat = torch.from_numpy(np.stack([tokens[s:s + N] for s in starts]).astype(np.int64))


def run_ours(indices):
    out = np.zeros((len(indices), N), dtype=np.uint16)
    pos = {int(i): r for r, i in enumerate(indices)}
    for batch, x in reward_samples.iter_generated(model, tokens, K, indices, gen, "train"):
        out[[pos[int(i)] for i in batch]] = x
    return out


@torch.no_grad()
def run_hf(indices, sort):
    order = np.array(sorted(indices, key=lambda i: K[i])) if sort else np.asarray(indices)
    out = np.zeros((len(indices), N), dtype=np.int64)
    pos = {int(i): r for r, i in enumerate(indices)}
    for s in range(0, len(order), args.batch_size):
        b = order[s:s + args.batch_size]
        kb = K[b]
        kmax, kmin = int(kb.max()), int(kb.min())
        left = torch.zeros((len(b), kmax), dtype=torch.long)
        mask = torch.zeros((len(b), kmax), dtype=torch.long)
        for r, (i, k) in enumerate(zip(b, kb)):
            left[r, kmax - k:] = nat[i, :k]
            mask[r, kmax - k:] = 1
        new = N - kmin
        res = hf.generate(left, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, **hf_sample)
        for r, (i, k) in enumerate(zip(b, kb)):
            out[pos[int(i)], :k] = nat[i, :k]
            out[pos[int(i)], k:] = res[r, kmax:kmax + N - k]
    return out


fns = {"ours": lambda idx: run_ours(idx), "hf_sorted": lambda idx: run_hf(idx, True)}
if not args.no_hf_order:
    fns["hf_order"] = lambda idx: run_hf(idx, False)

# warm-up on a few samples, then interleave the methods (A B C A B C ...) so that load from
# other processes on this shared machine hits all of them alike
warm = np.arange(min(16, S))
for fn in fns.values():
    fn(warm)
times = {name: [] for name in fns}
outputs = {}
for rep in range(args.repeats):
    for name, fn in fns.items():
        t0 = time.perf_counter()
        outputs[name] = fn(np.arange(S))
        times[name].append(time.perf_counter() - t0)
        print(f"  repeat {rep + 1}: {name:9s} {times[name][-1]:7.2f} s ({useful / times[name][-1]:8.0f} tok/s)",
              flush=True)

# sanity: every method kept the natural prefixes and produced valid tokens
for name, o in outputs.items():
    assert all(np.array_equal(o[i, :K[i]], nat[i, :K[i]].numpy()) for i in range(S)), name
    assert o.max() < args.vocab, name
# ours is batch-invariant: a subset regenerated on its own gives the same rows
sub = np.arange(0, S, max(1, S // 32))
assert np.array_equal(outputs["ours"][sub], run_ours(sub))

med = {name: statistics.median(t) for name, t in times.items()}
res = {"machine": machine_info(), "block_size": N, "vocab": args.vocab, "num_samples": S, "batch_size": args.batch_size,
       "generated_tokens": useful, "threads": torch.get_num_threads(), "times": times, "hf_max_logit_diff": hf_diff,
       "tok_s": {name: useful / t for name, t in med.items()}}
print(f"\nreward-data generation, {S} samples x {N} tokens ({useful:,} generated), batch {args.batch_size}, "
      f"{torch.get_num_threads()} threads (median of {args.repeats}):")
for name, t in med.items():
    line = f"  {name:9s} {t:7.2f} s  {useful / t:8.0f} generated tok/s"
    if name != "ours":
        line += f"   ours is {t / med['ours']:.2f}x faster"
    print(line)
if args.out:
    with open(args.out, "w") as f:
        json.dump({**res, "decode": decode_status()}, f, indent=1)  # a failed compile ran uncompiled
    print(f"wrote {args.out}")
