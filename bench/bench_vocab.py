"""
Vocabulary-wide work against the bare GEMMs of the same shapes, measured in one process.

For each vocabulary (65 = characters, 50257 = GPT-2's BPE) and width (32: 1 layer, 2 heads, the
tiny BPE stand-in; 768: a 1-layer slice of GPT-2 small, 12 heads) it times
  grpo   the GRPO step's vocabulary-wide work: the policy's token log-probs and entropies, forward
         and backward of a loss on them (core.logprobs.LinearLogprob); the reference's log-probs; the
         detector's forward with LM features (per-position head), each on batch x (seq_len - 1) positions
  gen    GPT.generate of gen_tokens new tokens for gen_batch rows (KV cache, head_sample)
  val    val scoring: token log-probs of batch x (seq_len - 1) positions, no autograd
and, alternating with each (common_hf.interleaved, so machine load hits both alike), the bare
torch.mm calls of the same shapes: the vocabulary head's GEMMs alone (forward, and for the policy
dlogits @ W and dlogits.T @ x), and all the linear layers' GEMMs (trunk + head).
GFLOP/s = the FLOPs of all those GEMMs / the case's wall time. Peak: VmHWM after one untimed run
with the high-water mark reset (/proc/self/clear_refs), minus the RSS before it; on CUDA, torch's
max_memory_allocated over the same run, minus what was allocated before it.

    OMP_NUM_THREADS=1 python bench/bench_vocab.py --threads 1 --out bench/results/vocab_t1.json
    python bench/bench_vocab.py --device cuda --dtype bfloat16 --wide_batch 32 --wide_gen_tokens 127
"""
import argparse
import ctypes
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common_hf import interleaved  # noqa: E402
from core.devices import autocast_context  # noqa: E402
from engine import Engine, decode_status  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
ap.add_argument("--vocabs", default="65,50257", help="comma-separated vocabulary sizes")
ap.add_argument("--widths", default="32,768", help="comma-separated model widths (n_embd); heads = max(2, width // 64)")
ap.add_argument("--n_layer", type=int, default=1, help="transformer blocks of every model")
ap.add_argument("--seq_len", type=int, default=128, help="tokens per sequence (GRPO and val)")
ap.add_argument("--batch", type=int, default=32, help="sequences per GRPO step / val batch at width < 256 "
                "(32 = 4 prompts x 8 completions, the quick preset's step)")
ap.add_argument("--wide_batch", type=int, default=4, help="sequences per GRPO step / val batch at width >= 256 (CPU time)")
ap.add_argument("--gen_batch", type=int, default=32, help="rows generated at once")
ap.add_argument("--gen_tokens", type=int, default=127, help="new tokens per row at width < 256")
ap.add_argument("--wide_gen_tokens", type=int, default=32, help="new tokens per row at width >= 256")
ap.add_argument("--cases", default="grpo,gen,val", help="comma-separated cases to run")
ap.add_argument("--repeats", type=int, default=3, help="timed repeats (the median is reported)")
ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
ap.add_argument("--device", default="cpu", help="cpu or cuda")
ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                help="autocast precision of the cases (as the scripts' --dtype, on CPU too), and the dtype of their bare GEMMs")
ap.add_argument("--out", default=None, help="also write the results as JSON to this file")


def proc_mib(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key)) / 1024


def peak_mib(fn, device="cpu"):
    """(peak RSS during fn above the RSS before it, the absolute peak), MiB. The C heap first gives
    freed pages back (malloc_trim), or a case would reuse an earlier case's pages and show +0.
    On CUDA: the same from the caching allocator's counters (allocated tensors, not reserved)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - before) / 2**20, torch.cuda.max_memory_allocated() / 2**20
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the figure is then a lower bound
        pass
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS
    before = proc_mib("VmRSS:")
    fn()
    return proc_mib("VmHWM:") - before, proc_mib("VmHWM:")


def linear_shapes(M, C, V, n_layer, trunk=True, head=True, backward=False):
    """(m, k, n) of every GEMM of the model's linear layers on M positions: x (M, k) @ (k, n); with
    backward also dX = dY (M, n) @ W (n, k) and dW = dY.T (n, M) @ X (M, k)."""
    fwd = [(M, C, 3 * C), (M, C, C), (M, C, 4 * C), (M, 4 * C, C)] * n_layer if trunk else []
    fwd += [(M, C, V)] if head else []
    return fwd + ([s for m, k, n in fwd for s in ((m, n, k), (n, m, k))] if backward else [])


def gemm_runner(shapes, device="cpu", dtype=torch.float32):
    """Bare torch.mm of each shape and their FLOPs. The operands come from one pool of random
    matrices, a transpose serving where it fits (as dlogits.T @ x does in backward), so the
    (positions, V) ones exist once and the bare GEMMs add little to the process's memory."""
    pool = {}

    def mat(r, c, avoid=()):
        for key, t in (((r, c), lambda m: m), ((c, r), lambda m: m.T)):
            if key in pool and pool[key].data_ptr() not in avoid:
                return t(pool[key])
        pool[(r, c) if (r, c) not in pool else (r, c, len(pool))] = m = torch.randn(r, c, device=device, dtype=dtype)
        return m

    ops = []
    for m, k, n in shapes:
        a, b = mat(m, k), mat(k, n)
        out = mat(m, n, avoid=(a.data_ptr(), b.data_ptr()))
        ops.append((a, b, out if out.is_contiguous() else torch.empty(m, n, device=device, dtype=dtype)))

    def run():
        for a, b, out in ops:
            torch.mm(a, b, out=out)
    return run, sum(2 * m * k * n for m, k, n in shapes)


def build(V, C, n_layer, T, device):
    cfg = dict(block_size=T + 1, vocab_size=V, n_layer=n_layer, n_head=max(2, C // 64), n_embd=C, bias=True)
    policy = GPT(GPTConfig(**cfg)).to(device)
    ref = GPT(GPTConfig(**cfg)).to(device).eval()
    det = GPT(GPTConfig(**cfg, mode="reward", reward_per_position=True, reward_lm_features=True)).to(device).eval()
    return policy, ref, det


def amp(fn, device, dtype):
    """fn under the scripts' own autocast (a no-op on CPU or in float32)."""
    def run():
        with autocast_context(device, dtype):
            fn()
    return run


def cases(V, C, args):
    """{case: (fn, head GEMM shapes, all GEMM shapes)} for one vocabulary and width."""
    wide = C >= 256
    B, T, L = (args.wide_batch if wide else args.batch), args.seq_len, args.n_layer
    policy, ref, det = build(V, C, L, max(T, 1 + (args.wide_gen_tokens if wide else args.gen_tokens)), args.device)
    g = torch.Generator().manual_seed(0)
    seqs = torch.randint(0, V, (B, T), generator=g).to(args.device)
    adv = torch.randn(B, T - 1, generator=g).to(args.device)
    N, new = B * (T - 1), (args.wide_gen_tokens if wide else args.gen_tokens)
    prompts = torch.randint(0, V, (args.gen_batch, 1), generator=g).to(args.device)
    u = torch.rand(args.gen_batch, 1 + new, generator=g).to(args.device)

    def grpo():  # autocast as the scripts use it (common.autocast_context)
        logp, ent = policy.token_logprobs(seqs[:, :-1], seqs[:, 1:], return_entropy=True)
        (-(logp * adv).mean()).backward()
        policy.zero_grad(set_to_none=True)
        with torch.no_grad():
            ref.token_logprobs(seqs[:, :-1], seqs[:, 1:])
            det.position_probs(seqs)

    def val():
        with torch.no_grad():
            ref.token_logprobs(seqs[:, :-1], seqs[:, 1:])

    def gen():
        Engine(policy).generate(prompts, new, uniforms=u)

    grpo_all = (linear_shapes(N, C, V, L, backward=True) + linear_shapes(N, C, V, L)
                + linear_shapes(B * T, C, V, L, head=False) + linear_shapes(N, C, V, L, trunk=False))
    grpo, val, gen = (amp(f, args.device, args.dtype) for f in (grpo, val, gen))
    return {"grpo": (grpo, linear_shapes(N, C, V, L, trunk=False, backward=True) + 2 * [(N, C, V)], grpo_all),
            "gen": (gen, new * [(args.gen_batch, C, V)], new * linear_shapes(args.gen_batch, C, V, L)),
            "val": (val, [(N, C, V)], linear_shapes(N, C, V, L))}


def main():
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    gemm_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[args.dtype]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}, {args.device}"
          + (f" ({torch.cuda.get_device_name()}), {args.dtype}" if args.device.startswith("cuda") else ""))
    rows = []
    for V in [int(v) for v in args.vocabs.split(",")]:
        for C in [int(c) for c in args.widths.split(",")]:
            for name, (fn, head, every) in cases(V, C, args).items():
                if name not in args.cases.split(","):
                    continue
                mem, peak = peak_mib(fn, args.device)  # before the bare GEMMs' operands exist
                head_fn, head_flops = gemm_runner(head, args.device, gemm_dtype)
                all_fn, all_flops = gemm_runner(every, args.device, gemm_dtype)
                med, _, cpu = interleaved({"case": fn, "head": head_fn, "all": all_fn}, args.repeats,
                                          device=args.device)
                row = {"case": name, "vocab": V, "width": C, "s": med["case"], "gflops": all_flops / med["case"] / 1e9,
                       "head_gemm_s": med["head"], "x_head": med["case"] / med["head"],
                       "x_head_cpu": cpu["case"] / cpu["head"], "all_gemm_s": med["all"],
                       "x_all": med["case"] / med["all"], "gemm_gflops": all_flops / med["all"] / 1e9,
                       "peak_above_mib": mem, "peak_mib": peak, "load": os.getloadavg()[0]}
                rows.append(row)
                print(f"{name:4s} V={V:5d} C={C:3d}: {row['s'] * 1e3:8.1f} ms, {row['gflops']:6.1f} GFLOP/s | head GEMMs "
                      f"{row['head_gemm_s'] * 1e3:7.1f} ms, x{row['x_head']:.2f} (CPU x{row['x_head_cpu']:.2f}) | all "
                      f"GEMMs {row['all_gemm_s'] * 1e3:7.1f} ms ({row['gemm_gflops']:.1f} GFLOP/s), x{row['x_all']:.2f} | "
                      f"peak +{mem:.0f} MiB ({peak:.0f}) | load {row['load']:.1f}", flush=True)
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "time": time.strftime("%Y-%m-%d %H:%M"), "rows": rows,
                       "decode": decode_status()}, f, indent=1)


if __name__ == "__main__":
    main()
