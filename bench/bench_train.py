"""
Training throughput (tokens/s of forward + backward + AdamW step) of our GPT against
Hugging Face transformers GPT2LMHeadModel with the same configuration and the same
starting weights, on random token batches (speed does not depend on the data).

    python bench/bench_train.py                       # 6 layers/6 heads/384, 12 x 256, vocab 65
    python bench/bench_train.py --vocab 50304
    python bench/bench_train.py --n_layer 4 --n_head 4 --n_embd 128 --block_size 64 --steps 8   # nanoGPT's CPU model

Both models get the same loss (cross-entropy over all positions, computed from the
full logits) and the same optimizer settings. Variants: ours as train.py runs it
(configure_optimizers: fused AdamW), ours with torch's default AdamW (the for-loop
implementation, what configure_optimizers used on CPU before), HF eager with torch's
default AdamW, HF with the fused AdamW (attribution), and with --compile ours under
torch.compile. Timings alternate between the variants so that load from other
processes hits all alike.
"""
import argparse
import atexit
import copy
import json
import os
import shutil
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common_hf import bench_model, hf_copy, interleaved, machine_info, max_logit_diff  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
ap.add_argument("--vocab", type=int, default=65, help="vocabulary size (65 = shakespeare_char, 50304 = GPT-2 padded)")
ap.add_argument("--block_size", type=int, default=256, help="sequence length of every training example")
ap.add_argument("--batch_size", type=int, default=12, help="sequences per step")
ap.add_argument("--n_layer", type=int, default=6, help="transformer layers")
ap.add_argument("--n_head", type=int, default=6, help="attention heads")
ap.add_argument("--n_embd", type=int, default=384, help="embedding width")
ap.add_argument("--steps", type=int, default=2, help="optimizer steps per timed run")
ap.add_argument("--repeats", type=int, default=3, help="timed runs per model (the median is reported)")
ap.add_argument("--warmup", type=int, default=1, help="untimed warm-up runs per model")
ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's default)")
ap.add_argument("--device", default="cpu", help="cpu or cuda")
ap.add_argument("--seed", type=int, default=1337, help="seed for weights and batches")
ap.add_argument("--no_before", action="store_true",
                help="skip the 'ours, default AdamW' variant (our model with torch's default for-loop AdamW on "
                     "CPU, i.e. configure_optimizers before it used the fused kernel)")
ap.add_argument("--no_hf_fused", action="store_true",
                help="skip the 'hf, fused AdamW' variant (HF with the same fused AdamW as ours, for attribution)")
ap.add_argument("--compile", action="store_true",
                help="also time our model under torch.compile (train.py --compile); the compile time is reported apart")
ap.add_argument("--warm_cache", action="store_true",
                help="compile with inductor's usual on-disk cache (a repeat run on this machine) instead of a fresh one")
ap.add_argument("--out", default=None, help="also write the results as JSON to this file")
args = ap.parse_args()
if args.compile and not args.warm_cache:  # a cold compile, as a first run sees it (inductor caches on disk)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor_bench_")
    atexit.register(shutil.rmtree, os.environ["TORCHINDUCTOR_CACHE_DIR"], True)

if args.threads:
    torch.set_num_threads(args.threads)
device = args.device
model = bench_model(args.vocab, args.block_size, args.n_layer, args.n_head, args.n_embd, seed=args.seed)
hf = hf_copy(model)
model, hf = model.to(device), hf.to(device)
print(machine_info())
print(f"model: {args.n_layer} layers, {args.n_head} heads, {args.n_embd} wide, block {args.block_size}, "
      f"vocab {args.vocab}, {model.get_num_params() / 1e6:.2f}M params; batch {args.batch_size} x {args.block_size}; "
      f"load average {os.getloadavg()}")
hf_diff = max_logit_diff(model.eval(), hf.eval(), T=args.block_size)
print(f"HF copy check: max |logits diff| = {hf_diff:.2e}")


def groups(m, wd=0.1):
    """nanoGPT's AdamW groups: decay on matrices only."""
    return [{"params": [p for p in m.parameters() if p.dim() >= 2], "weight_decay": wd},
            {"params": [p for p in m.parameters() if p.dim() < 2], "weight_decay": 0.0}]


# (model, optimizer, is_hf) per variant; every model starts from the same weights
variants = {"ours": (model, model.configure_optimizers(0.1, 6e-4, (0.9, 0.95), device), False)}
if not args.no_before:  # our model with torch's default AdamW, as configure_optimizers did before on CPU
    m = copy.deepcopy(model)
    variants["ours, default AdamW"] = (m, torch.optim.AdamW(groups(m), lr=6e-4, betas=(0.9, 0.95)), False)
if args.compile:
    m = copy.deepcopy(model)
    variants["ours, compiled"] = (torch.compile(m), m.configure_optimizers(0.1, 6e-4, (0.9, 0.95), device), False)
variants["hf"] = (hf, torch.optim.AdamW(groups(hf), lr=6e-4, betas=(0.9, 0.95)), True)
if not args.no_hf_fused:  # attribution: HF with the same fused AdamW as ours
    h = copy.deepcopy(hf)
    variants["hf, fused AdamW"] = (h, torch.optim.AdamW(groups(h), lr=6e-4, betas=(0.9, 0.95), fused=True), True)
for m, _, _ in variants.values():
    m.train()

g = torch.Generator().manual_seed(args.seed)
batches = [(torch.randint(0, args.vocab, (args.batch_size, args.block_size), generator=g).to(device),
            torch.randint(0, args.vocab, (args.batch_size, args.block_size), generator=g).to(device))
           for _ in range(args.steps)]


def trainer(m, opt, is_hf):
    def run():
        for x, y in batches:
            if is_hf:
                logits = m(input_ids=x).logits
                loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
            else:
                _, loss = m(x, y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    return run


fns = {name: trainer(*v) for name, v in variants.items()}
res = {"machine": machine_info(), "vocab": args.vocab, "batch_size": args.batch_size, "n_layer": args.n_layer,
       "n_head": args.n_head, "n_embd": args.n_embd, "block_size": args.block_size, "steps_per_run": args.steps,
       "hf_max_logit_diff": hf_diff}
if args.compile:  # the first call compiles (forward and backward); timed apart from the steady state
    t0 = time.perf_counter()
    fns["ours, compiled"]()
    t_first = time.perf_counter() - t0
    t0 = time.perf_counter()
    fns["ours"]()
    res["compile_s"] = t_first - (time.perf_counter() - t0)
    print(f"torch.compile: first run took {res['compile_s']:.1f} s longer than an eager run")
med, times, cpu = interleaved(fns, args.repeats, args.warmup, device)
tokens = args.steps * args.batch_size * args.block_size
res["times"] = times
res["loadavg_end"] = os.getloadavg()
for kind, sec in (("wall", med), ("cpu ", cpu)):
    line = " | ".join(f"{name} {tokens / sec[name]:.0f}" for name in fns)
    print(f"train tok/s [{kind}]: {line}")
    print(f"  ours / HF [{kind}]: " + ", ".join(f"{name} {sec['hf'] / sec[name]:.3f}x" for name in fns if name != "hf"))
for name in fns:
    key = name.replace(", ", "_").replace(" ", "_")
    res[f"{key}_tok_s"], res[f"{key}_cpu_tok_s"] = tokens / med[name], tokens / cpu[name]
print(f"load average at the end: {os.getloadavg()}")
if args.out:
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print(f"wrote {args.out}")
