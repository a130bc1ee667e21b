"""
Training throughput (tokens/s of forward + backward + AdamW step) of our GPT against
Hugging Face transformers GPT2LMHeadModel with the same configuration and the same
starting weights, on random token batches (speed does not depend on the data).

    python bench/bench_train.py                       # 6 layers/6 heads/384, 12 x 256, vocab 65
    python bench/bench_train.py --vocab 50304

Both models get the same loss (cross-entropy over all positions, computed from the
full logits) and the same optimizer settings; timings alternate between the two models
so that load from other processes hits both alike.
"""
import argparse
import json
import os
import sys

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
ap.add_argument("--out", default=None, help="also write the results as JSON to this file")
args = ap.parse_args()

if args.threads:
    torch.set_num_threads(args.threads)
device = args.device
model = bench_model(args.vocab, args.block_size, args.n_layer, args.n_head, args.n_embd, seed=args.seed)
hf = hf_copy(model)
model, hf = model.to(device), hf.to(device)
print(machine_info())
print(f"model: {args.n_layer} layers, {args.n_head} heads, {args.n_embd} wide, block {args.block_size}, "
      f"vocab {args.vocab}, {model.get_num_params() / 1e6:.2f}M params; batch {args.batch_size} x {args.block_size}")
print(f"HF copy check: max |logits diff| = {max_logit_diff(model.eval(), hf.eval(), T=args.block_size):.2e}")
model.train()
hf.train()

# the same AdamW settings for both (nanoGPT's: decay on matrices only, betas 0.9/0.95)
opt_ours = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95), device)
decay = [p for p in hf.parameters() if p.dim() >= 2]
no_decay = [p for p in hf.parameters() if p.dim() < 2]
opt_hf = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                            {"params": no_decay, "weight_decay": 0.0}], lr=6e-4, betas=(0.9, 0.95))

g = torch.Generator().manual_seed(args.seed)
batches = [(torch.randint(0, args.vocab, (args.batch_size, args.block_size), generator=g).to(device),
            torch.randint(0, args.vocab, (args.batch_size, args.block_size), generator=g).to(device))
           for _ in range(args.steps)]


def train_ours():
    for x, y in batches:
        _, loss = model(x, y)
        loss.backward()
        opt_ours.step()
        opt_ours.zero_grad(set_to_none=True)


def train_hf():
    for x, y in batches:
        logits = hf(input_ids=x).logits
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
        loss.backward()
        opt_hf.step()
        opt_hf.zero_grad(set_to_none=True)


med, times, cpu = interleaved({"ours": train_ours, "hf": train_hf}, args.repeats, args.warmup, device)
tokens = args.steps * args.batch_size * args.block_size
res = {"machine": machine_info(), "vocab": args.vocab, "batch_size": args.batch_size,
       "block_size": args.block_size, "steps_per_run": args.steps, "times": times}
for name in med:
    res[f"{name}_tok_s"], res[f"{name}_cpu_tok_s"] = tokens / med[name], tokens / cpu[name]
for kind, sfx in (("wall", "tok_s"), ("cpu ", "cpu_tok_s")):
    print(f"train [{kind}]: ours {res['ours_' + sfx]:.0f} tok/s | HF {res['hf_' + sfx]:.0f} tok/s "
          f"({res['ours_' + sfx] / res['hf_' + sfx]:.2f}x)")
if args.out:
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print(f"wrote {args.out}")
