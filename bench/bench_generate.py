"""
Generation throughput of GPT.generate (KV cache) against
  - a nanoGPT-style loop that re-runs the whole context for every token
    (engine.generate_recompute), and
  - Hugging Face transformers GPT2LMHeadModel.generate(use_cache=True, do_sample=True)
    holding the SAME weights,
for a 6-layer / 6-head / 384-wide GPT with a 256-token context.

Uniform prompts: every row has a --prompt_len prompt and generates up to the full context.
Mixed prefixes: row i keeps K_i ~ U{1..255} given tokens and samples the rest up to 256
(Engine.generate(prefix_lens=K)); HF gets the prefixes left-padded to max(K) with an
attention mask and must generate 256 - min(K) tokens for every row, since it cannot
stop rows at different lengths.

    python bench/bench_generate.py                    # vocab 65 (shakespeare_char)
    python bench/bench_generate.py --vocab 50304      # GPT-2 sized vocabulary
    python bench/bench_generate.py --device cuda --gpt2   # the GPU anchor (below)

--gpt2 (on a GPU) times instead, at GPT-2 124M's shapes with random weights, batch 64, a 32-token prompt and
224 new tokens at T = 1: this project's generate (the static-cache decoder with CUDA graphs and its compiled
step in float32, under bfloat16 autocast and with bfloat16 weights, the same uncompiled with bfloat16 weights,
and the eager loop under autocast) against Hugging Face generate
in bfloat16 with the dynamic cache and with cache_implementation="static" (compiled on first use), and the
memory floor: the bfloat16 weights plus the mean KV cache read once per step at the copy bandwidth measured
here (the same anchors as the GPU probe). With --no_hf, only the compiled step against the uncompiled one (bf16 weights).

For uniform prompts it also times, alternating with the others, the bare torch.mm calls of every
linear layer's GEMM in that generation (prefill, then one row per sequence per token): the GEMM
peak of these shapes here, and ours as a fraction of it (its FLOPs over its whole time); and one
bare read (sum) of the key/value cache each step attends to. The two together are a floor no
implementation of this generation goes below on this machine (no overhead, attention at streaming
speed), printed as tokens/s and against HF.
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common_hf import bench_model, hf_copy, interleaved, machine_info, max_logit_diff, sync  # noqa: E402
from engine import Engine, decode_status, generate_recompute  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
ap.add_argument("--vocab", type=int, default=65, help="vocabulary size (65 = shakespeare_char, 50304 = GPT-2 padded)")
ap.add_argument("--block_size", type=int, default=256, help="context length of the model and total length generated")
ap.add_argument("--batch_sizes", default="1,32,64", help="comma-separated batch sizes for uniform prompts")
ap.add_argument("--prompt_len", type=int, default=16, help="prompt tokens per row for uniform prompts")
ap.add_argument("--mixed_batch_sizes", default="32", help="comma-separated batch sizes for the mixed-prefix case ('' to skip)")
ap.add_argument("--repeats", type=int, default=3, help="timed repeats per measurement (the median is reported)")
ap.add_argument("--warmup", type=int, default=1, help="untimed warm-up runs per measurement")
ap.add_argument("--recompute_tokens", type=int, default=8,
                help="tokens the recompute loop generates per timing; it starts at the mean context "
                     "length of the full run so its tokens/s estimates the full run")
ap.add_argument("--recompute_repeats", type=int, default=1, help="timed repeats of the (slow) recompute loop")
ap.add_argument("--no_recompute", action="store_true", help="skip the recompute loop")
ap.add_argument("--no_hf", action="store_true", help="skip Hugging Face transformers")
ap.add_argument("--temperature", type=float, default=1.0, help="sampling temperature for all methods")
ap.add_argument("--top_k", type=int, default=None, help="top-k for all methods (default: none)")
ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's default)")
ap.add_argument("--device", default="cpu", help="cpu or cuda")
ap.add_argument("--seed", type=int, default=1337, help="seed for weights, prompts and prefix lengths")
ap.add_argument("--out", default=None, help="also write the results as JSON to this file")
ap.add_argument("--gpt2", action="store_true", help="the GPU anchor at GPT-2 124M's shapes (see above) instead")
args = ap.parse_args()


def gpt2_anchor():
    """--gpt2: ours against HF generate (dynamic and static cache) and the memory floor, on one GPU."""
    from transformers import GPT2Config, GPT2LMHeadModel  # optional: only the benchmarks need it
    B, P, new, L = 64, 32, 224, 1024
    torch.manual_seed(args.seed)
    cfg = dict(n_layer=12, n_head=12, n_embd=768, vocab_size=50257, block_size=L, bias=True)
    ours = GPT(GPTConfig(**cfg)).to(device).eval()
    ours16 = GPT(GPTConfig(**cfg)).to(device, torch.bfloat16).eval()
    idx = torch.randint(0, 50257, (B, P), generator=gen).to(device)
    bf16 = torch.autocast("cuda", dtype=torch.bfloat16)
    hf = GPT2LMHeadModel(GPT2Config(n_layer=12, n_head=12, n_embd=768, n_positions=L)).to(device, torch.bfloat16).eval()
    kw = dict(do_sample=True, max_new_tokens=new, min_new_tokens=new, top_k=0, pad_token_id=0)

    def under(ctx, fn):
        def run():
            with ctx:
                fn()
        return run
    ours, ours16 = Engine(ours), Engine(ours16)
    fns = {"ours_static_fp32": lambda: ours.generate(idx, new, seed=1, decoder="compiled"),
           "ours_static_bf16_autocast": under(bf16, lambda: ours.generate(idx, new, seed=1, decoder="compiled")),
           "ours_static_bf16_weights": lambda: ours16.generate(idx, new, seed=1, decoder="compiled"),
           "ours_static_bf16_weights_uncompiled": lambda: ours16.generate(idx, new, seed=1, decoder="static"),
           "ours_eager_bf16_autocast": under(bf16, lambda: ours.generate(idx, new, seed=1, decoder="eager")),
           "hf_bf16_dynamic": lambda: hf.generate(idx, **kw),
           "hf_bf16_static": lambda: hf.generate(idx, cache_implementation="static", **kw)}
    if args.no_hf:  # the compiled step against the uncompiled one alone (bf16 weights): one compile, no HF
        fns = {k: f for k, f in fns.items() if k.startswith("ours_static_bf16_weights")}
    first = {}  # the first call of each, with its compiles, timed on its own
    with torch.no_grad():
        for name in ("ours_static_bf16_weights", "ours_static_bf16_weights_uncompiled", "hf_bf16_static"):
            if name in fns:
                t0 = time.time()
                fns[name]()
                sync(device)
                first[name] = time.time() - t0
        med, times, _ = interleaved(fns, args.repeats, args.warmup, device)
    x = torch.empty(2 ** 30, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    y.copy_(x)
    sync(device)
    t0 = time.time()
    for _ in range(10):
        y.copy_(x)
    sync(device)
    bw = 2 * 2 ** 30 * 10 / (time.time() - t0)
    step_bytes = 2 * sum(p.numel() for p in ours16.parameters()) + 2 * 12 * B * (P + new / 2) * 768 * 2
    res = {"machine": machine_info(), "device": torch.cuda.get_device_name(), "batch": B, "prompt_len": P,
           "new_tokens": new, "first_call_s": first, "times": times, "copy_GBps": bw / 1e9,
           "floor_ms_per_step": step_bytes / bw * 1e3}
    for name, s in med.items():
        res[name] = {"s": s, "ms_per_step": s / new * 1e3, "tok_s": B * new / s}
    best = min((k for k in med if k.startswith("ours_static")), key=med.get)
    res["ours_best"] = best
    if "hf_bf16_static" in med:
        res["ours_vs_hf_static"] = med["hf_bf16_static"] / med[best]
    res["compiled_vs_uncompiled"] = med["ours_static_bf16_weights_uncompiled"] / med["ours_static_bf16_weights"]
    res["ours_of_floor"] = res["floor_ms_per_step"] / res[best]["ms_per_step"]
    print(f"GPT-2 124M shapes, batch {B}, {P} + {new} tokens, T = 1, {res['device']}:")
    for name in med:
        print(f"  {name:28s} {res[name]['ms_per_step']:7.3f} ms/step {res[name]['tok_s']:10,.0f} tok/s")
    versus = f"{res['ours_vs_hf_static']:.2f}x HF static, " if "ours_vs_hf_static" in res else ""
    print(f"  floor (bf16 weights + mean KV cache at {bw / 1e9:,.0f} GB/s) {res['floor_ms_per_step']:.3f} ms/step; "
          f"{best}: {versus}{100 * res['ours_of_floor']:.0f} % of the floor; the compiled step "
          f"{res['compiled_vs_uncompiled']:.2f}x the uncompiled one (bf16 weights); first calls {first}")
    return res


if args.gpt2:
    if not args.device.startswith("cuda"):
        ap.error("--gpt2 is the GPU anchor: it needs --device cuda")
    gen = torch.Generator().manual_seed(args.seed)
    device = args.device
    result = gpt2_anchor()
    if args.out:
        with open(args.out, "w") as f:
            json.dump({**result, "decode": decode_status()}, f, indent=1)  # a failed compile ran uncompiled
    sys.exit(0)

if args.threads:
    torch.set_num_threads(args.threads)
device = args.device
torch.manual_seed(args.seed)
L = args.block_size
model = bench_model(args.vocab, L, seed=args.seed).to(device).eval()
print(machine_info())
print(f"model: 6 layers, 6 heads, 384 wide, block {L}, vocab {args.vocab}, "
      f"{model.get_num_params() / 1e6:.2f}M params; temperature {args.temperature}, top_k {args.top_k}")

hf = None
hf_sample = {}
if not args.no_hf:
    hf = hf_copy(model).to(device)
    hf_diff = max_logit_diff(model, hf, T=L)
    print(f"HF copy check: max |logits diff| over {L} positions = {hf_diff:.2e}")
    # same sampling as ours: temperature, optional top-k, nothing else (HF defaults top_k=50)
    hf_sample = dict(do_sample=True, use_cache=True, temperature=args.temperature,
                     top_k=args.top_k or 0, top_p=1.0, pad_token_id=0, eos_token_id=None)

results = {"machine": machine_info(), "vocab": args.vocab, "block_size": L, "uniform": [], "mixed": []}
if hf is not None:
    results["hf_max_logit_diff"] = hf_diff
gen = torch.Generator().manual_seed(args.seed)


def gemm_runner(B, P, new):
    """Bare torch.mm of every linear layer's GEMM in one generate(B rows, P-token prompt, `new` tokens),
    on the model's own weights (so they stream from memory as in generation): the prefill on B * P
    rows, then `new` - 1 steps of one row per sequence, the head on the last position only, into
    preallocated outputs; and their FLOPs. The generation's GEMM peak on this machine."""
    layers = [lin.weight.detach() for blk in model.transformer.h
              for lin in (blk.attn.c_attn, blk.attn.c_proj, blk.mlp.c_fc, blk.mlp.c_proj)]
    head = model.lm_head.weight.detach()

    def operands(m):
        ops = [(torch.randn(m, w.size(1), device=device), w.T, torch.empty(m, w.size(0), device=device))
               for w in layers]
        return ops + [(torch.randn(B, head.size(1), device=device), head.T, torch.empty(B, head.size(0), device=device))]
    prefill, step = operands(B * P), operands(B)

    def run():
        for ops in [prefill] + (new - 1) * [step]:
            for a, b, out in ops:
                torch.mm(a, b, out=out)
    flops = sum(2 * a.size(0) * a.size(1) * b.size(1) for ops in [prefill] + (new - 1) * [step] for a, b, _ in ops)
    return run, flops


def cache_runner(B, P, new):
    """One read of the key/value cache per layer per decode step, as attention needs it (context P
    .. P + new - 2 after the prefill), as bare sum() calls over caches of the model's layout: the
    memory-traffic part of generation's floor. Returns (run, bytes read)."""
    cfg = model.config
    hs = cfg.n_embd // cfg.n_head
    caches = [torch.randn(B, cfg.n_head, P + new, hs, device=device) for _ in range(2 * cfg.n_layer)]

    def run():
        for t in range(P + 1, P + new):
            for c in caches:
                c[:, :, :t].sum()
    return run, sum(4 * B * cfg.n_head * t * hs for t in range(P + 1, P + new)) * 2 * cfg.n_layer


def recompute_tps(B, mean_ctx):
    """tokens/s of the full-recompute loop, timed on a few tokens around the mean context."""
    n = args.recompute_tokens
    start = max(1, min(L - n, int(mean_ctx - n / 2)))
    idx = torch.randint(0, args.vocab, (B, start), generator=gen).to(device)
    med, _, cpu = interleaved({"r": lambda: generate_recompute(model, idx, n, args.temperature, args.top_k)},
                              args.recompute_repeats, warmup=0, device=device)
    return B * n / med["r"], B * n / cpu["r"]


# ----------------------------------------------------------------------------- uniform prompts
P = args.prompt_len
new = L - P
for B in [int(b) for b in args.batch_sizes.split(",") if b]:
    idx = torch.randint(0, args.vocab, (B, P), generator=gen).to(device)
    fns = {"ours": lambda: Engine(model).generate(idx, new, args.temperature, args.top_k, seed=0)}
    if hf is not None:
        mask = torch.ones_like(idx)
        fns["hf"] = lambda: hf.generate(idx, attention_mask=mask, max_new_tokens=new,
                                        min_new_tokens=new, **hf_sample)
    fns["gemm"], flops = gemm_runner(B, P, new)
    fns["cache"], cache_bytes = cache_runner(B, P, new)
    with torch.no_grad():
        med, all_times, cpu = interleaved(fns, args.repeats, args.warmup, device)
    floor_s = med["gemm"] + med["cache"]  # zero overhead: bare GEMMs, then one stream of the cache
    row = {"batch": B, "prompt_len": P, "new_tokens_per_row": new, "times": all_times, "gemm_flops": flops,
           "gemm_peak_gflops": flops / med.pop("gemm") / 1e9, "ours_gflops": flops / med["ours"] / 1e9,
           "cache_bytes": cache_bytes, "cache_read_gb_s": cache_bytes / med.pop("cache") / 1e9,
           "floor_s": floor_s, "floor_tok_s": B * new / floor_s, "ours_of_floor": floor_s / med["ours"]}
    row["ours_of_gemm_peak"] = row["ours_gflops"] / row["gemm_peak_gflops"]
    cpu.pop("gemm"), cpu.pop("cache")
    for name in med:
        row[f"{name}_s"], row[f"{name}_cpu_s"] = med[name], cpu[name]
        row[f"{name}_tok_s"], row[f"{name}_cpu_tok_s"] = B * new / med[name], B * new / cpu[name]
    if not args.no_recompute:
        with torch.no_grad():
            row["recompute_tok_s"], row["recompute_cpu_tok_s"] = recompute_tps(B, (P + L - 1) / 2)
    for kind, sfx in (("wall", "tok_s"), ("cpu ", "cpu_tok_s")):
        line = f"uniform B={B:3d} [{kind}]: ours {row['ours_' + sfx]:8.0f} tok/s"
        if "hf_" + sfx in row:
            line += f" | HF {row['hf_' + sfx]:8.0f} tok/s ({row['ours_' + sfx] / row['hf_' + sfx]:.2f}x)"
        if "recompute_" + sfx in row:
            line += (f" | recompute {row['recompute_' + sfx]:6.1f} tok/s "
                     f"({row['ours_' + sfx] / row['recompute_' + sfx]:.1f}x)")
        print(line, flush=True)
    print(f"uniform B={B:3d}: ours {row['ours_gflops']:.1f} GFLOP/s in its GEMMs' FLOPs; the bare GEMMs of the same "
          f"shapes {row['gemm_peak_gflops']:.1f} GFLOP/s: ours at {100 * row['ours_of_gemm_peak']:.0f} % of that peak",
          flush=True)
    print(f"uniform B={B:3d}: floor (the bare GEMMs + one read of the {cache_bytes / 1e9:.1f} GB of KV cache the "
          f"steps attend to, at {row['cache_read_gb_s']:.1f} GB/s) {row['floor_tok_s']:.0f} tok/s"
          + (f" = {row['floor_tok_s'] / row['hf_tok_s']:.2f}x HF" if "hf_tok_s" in row else "")
          + f"; ours at {100 * row['ours_of_floor']:.0f} % of it", flush=True)
    results["uniform"].append(row)

# ----------------------------------------------------------------------------- mixed prefixes
for B in [int(b) for b in args.mixed_batch_sizes.split(",") if b]:
    K = torch.randint(1, L, (B,), generator=gen)  # uniform in 1..L-1
    full = torch.randint(0, args.vocab, (B, L), generator=gen).to(device)
    useful = int((L - K).sum())  # tokens that really have to be sampled
    fns = {"ours": lambda: Engine(model).generate(full, 0, args.temperature, args.top_k,
                                                  prefix_lens=K.to(device), seed=0)}
    hf_mixed = None
    if hf is not None:
        kmax, kmin = int(K.max()), int(K.min())
        left = torch.zeros((B, kmax), dtype=torch.long)
        mask = torch.zeros((B, kmax), dtype=torch.long)
        for i, k in enumerate(K.tolist()):
            left[i, kmax - k:] = full[i, :k].cpu()
            mask[i, kmax - k:] = 1
        left, mask = left.to(device), mask.to(device)
        hf_new = L - kmin
        # rows with long prefixes run past position L; give HF room for that
        hf_mixed = hf_copy(model, n_positions=kmax + hf_new).to(device)
        fns["hf"] = lambda: hf_mixed.generate(left, attention_mask=mask, max_new_tokens=hf_new,
                                              min_new_tokens=hf_new, **hf_sample)
    with torch.no_grad():
        med, all_times, cpu = interleaved(fns, args.repeats, args.warmup, device)
    row = {"batch": B, "min_prefix": int(K.min()), "max_prefix": int(K.max()),
           "useful_new_tokens": useful, "times": all_times}
    for name in med:
        row[f"{name}_s"], row[f"{name}_cpu_s"] = med[name], cpu[name]
        row[f"{name}_tok_s"], row[f"{name}_cpu_tok_s"] = useful / med[name], useful / cpu[name]
    if hf is not None:
        row["hf_generated_per_row"] = L - int(K.min())
    for kind, sfx in (("wall", "s"), ("cpu ", "cpu_s")):
        line = (f"mixed   B={B:3d} [{kind}] (K in {row['min_prefix']}..{row['max_prefix']}, {useful} useful "
                f"tokens): ours {row['ours_' + sfx]:.2f} s")
        if "hf_" + sfx in row:
            line += f" | HF left-padded {row['hf_' + sfx]:.2f} s ({row['hf_' + sfx] / row['ours_' + sfx]:.2f}x)"
        print(line, flush=True)
    results["mixed"].append(row)
    hf_mixed = None  # its memory back before the next batch size

if args.out:
    with open(args.out, "w") as f:
        json.dump({**results, "decode": decode_status()}, f, indent=1)
    print(f"wrote {args.out}")
