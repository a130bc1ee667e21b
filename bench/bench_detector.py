"""
Detector (reward-model) training throughput: tokens/s of train_reward_model.py's step
(forward + per-position cross-entropy + backward + grad clip + AdamW) on random token
batches, for nanoGPT's CPU char model shape (4 layers, 4 heads, 128 wide, vocab 65,
no biases) and N = 64 tokens per sample.

    python bench/bench_detector.py --threads 1                 # every section
    python bench/bench_detector.py --threads 1 --sections batch,threads

Sections (variants inside a section take turns, so load from other processes hits all
alike; the median of --repeats timed runs is reported):
  head      per-position vs last-token head, whole trunk trainable
  threads   torch threads 1 vs 2
  batch     batch sizes (--batch_sizes)
  optim     AdamW for-loop (torch's CPU default) vs foreach vs fused
  attention F.scaled_dot_product_attention: default CPU kernel vs the math backend; mkldnn off
  bf16      float32 vs bfloat16 autocast on CPU
  compile   torch.compile (inductor): compile time, then steady-state speed
  eval      forward-only (evaluation) tokens/s vs batch size
  cache     head / top blocks trainable (--unfreeze_last_n_blocks 0, 1, 2): plain steps and evaluation vs
            the same on cached outputs of the frozen lower blocks, and the cache pass; reported as
            the time of an epoch of --epoch_samples samples and of a whole run (--run_steps steps,
            an evaluation of --val_samples every --eval_interval steps), the cache pass included
"""
import argparse
import atexit
import json
import os
import shutil
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common_hf import interleaved, machine_info  # noqa: E402  (also puts the repository on sys.path)
from lib import reward_head  # noqa: E402  (what train_reward_model.py trains with)
from model import GPT, GPTConfig  # noqa: E402

SECTIONS = ("head", "threads", "batch", "optim", "attention", "bf16", "compile", "eval", "cache")

ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
ap.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {','.join(SECTIONS)}")
ap.add_argument("--n_layer", type=int, default=4, help="transformer layers")
ap.add_argument("--n_head", type=int, default=4, help="attention heads")
ap.add_argument("--n_embd", type=int, default=128, help="embedding width")
ap.add_argument("--vocab", type=int, default=65, help="vocabulary size (65 = shakespeare_char)")
ap.add_argument("--n_tokens", type=int, default=64, help="tokens per sample (the reward dataset's N)")
ap.add_argument("--head_dim", type=int, default=256, help="reward head hidden width")
ap.add_argument("--batch_size", type=int, default=64, help="samples per step (all sections but batch)")
ap.add_argument("--batch_sizes", default="32,64,128,256", help="batch sizes of the batch and eval sections")
ap.add_argument("--tokens_per_run", type=int, default=32768,
                help="tokens per timed run (steps = this / (batch * N), at least 1)")
ap.add_argument("--repeats", type=int, default=3, help="timed runs per variant (the median is reported)")
ap.add_argument("--warmup", type=int, default=1, help="untimed warm-up runs per variant")
ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads for every section but threads")
ap.add_argument("--compile_steps", type=int, default=2000,
                help="the compile section also reports the break-even against a run of this many steps")
ap.add_argument("--epoch_samples", type=int, default=31370,
                help="the cache section's epoch: samples per epoch (31,370 = the default reward dataset)")
ap.add_argument("--val_samples", type=int, default=3484, help="the cache section's val split (default dataset's)")
ap.add_argument("--run_steps", type=int, default=1500,
                help="the cache section's whole run: steps (run_cycles' default preset: 1500 of batch 64)")
ap.add_argument("--eval_interval", type=int, default=100, help="the cache section's run: steps between evaluations")
ap.add_argument("--seed", type=int, default=1337, help="seed for weights and batches")
ap.add_argument("--warm_cache", action="store_true",
                help="compile with inductor's usual on-disk cache (a repeat run on this machine) instead of a fresh one")
ap.add_argument("--out", default=None, help="also write the results as JSON to this file")
args = ap.parse_args()
sections = [s for s in args.sections.split(",") if s]
if "compile" in sections and not args.warm_cache:  # a cold compile, as a first run sees it (inductor caches on disk)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor_bench_")
    atexit.register(shutil.rmtree, os.environ["TORCHINDUCTOR_CACHE_DIR"], True)
unknown = set(sections) - set(SECTIONS)
if unknown:
    ap.error(f"unknown sections {sorted(unknown)}; choose from {','.join(SECTIONS)}")
if "cache" in sections and args.n_layer < 2:  # it unfreezes the top 0, 1 and 2 blocks
    ap.error(f"the cache section needs --n_layer 2 or more (got {args.n_layer}); or leave cache out of --sections")
torch.set_num_threads(args.threads)
N = args.n_tokens


def new_model(per_position=True, seed=None):
    torch.manual_seed(args.seed if seed is None else seed)
    cfg = GPTConfig(n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd, block_size=N,
                    vocab_size=args.vocab, dropout=0.0, bias=False, mode="reward",
                    reward_head_hidden_dim=args.head_dim, reward_per_position=per_position)
    return GPT(cfg)


class Opt:  # what make_optimizer reads from the script's arguments (its defaults)
    optimizer, learning_rate, weight_decay = "adamw", 1e-4, 0.01


def batches(B, steps, seed=0):
    """Random tokens and exact targets [K/N, (N-K)/N] with K uniform in [1, N-1]."""
    g = torch.Generator().manual_seed(args.seed + seed)
    out = []
    for _ in range(steps):
        x = torch.randint(0, args.vocab, (B, N), generator=g)
        k = torch.randint(1, N, (B,), generator=g).float()
        out.append((x, torch.stack([k / N, (N - k) / N], 1)))
    return out


def steps_for(B):
    return max(1, args.tokens_per_run // (B * N))


def trainer(B=None, per_position=True, unfreeze=-1, threads=None, optim_kw=None, ctx=None,
            compile_net=False, cached=False):
    """A callable running steps_for(B) steps of train_reward_model.py's update, and its
    token count. cached: the batches are the frozen lower blocks' outputs (built here once)."""
    B = B or args.batch_size
    model = new_model(per_position)
    reward_head.set_trainable(model, unfreeze)
    reward_head.set_modes(model, unfreeze)
    opt = reward_head.make_optimizer(model, Opt)
    if optim_kw is not None:  # the same groups, another AdamW implementation
        opt = torch.optim.AdamW([{"params": g["params"], "weight_decay": g["weight_decay"]}
                                 for g in opt.param_groups], lr=Opt.learning_rate, **optim_kw)
    first = len(model.transformer.h) - unfreeze
    net = reward_head.RewardLogits(model, first_block=first if cached else None)
    if compile_net:
        net = torch.compile(net)
    data = batches(B, steps_for(B))
    if cached:
        with torch.no_grad():
            data = [(reward_head.frozen_features(model, x, first), y) for x, y in data]
    params = [p for p in model.parameters() if p.requires_grad]

    def run():
        old = torch.get_num_threads()
        if threads:
            torch.set_num_threads(threads)
        try:
            for x, y in data:
                with ctx if ctx is not None else torch.autocast("cpu", enabled=False):
                    logits = net(x)
                loss = reward_head.reward_loss(logits, y, "mse")
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                opt.step()
        finally:
            torch.set_num_threads(old)
    return run, len(data) * B * N


def section(title, variants, note=""):
    """variants: {name: (callable, tokens)}, timed in turns. Prints and returns
    {name: {tok_s (wall), cpu_tok_s (this process's CPU time), times}}."""
    fns = {k: v[0] for k, v in variants.items()}
    med, times, cpu = interleaved(fns, args.repeats, args.warmup)
    res = {}
    print(f"\n== {title}{' (' + note + ')' if note else ''}")
    base = None
    for name, (_, tokens) in variants.items():
        tps, ctps = tokens / med[name], tokens / cpu[name]
        base = base or tps
        res[name] = {"tok_s": tps, "cpu_tok_s": ctps, "times": times[name]}
        print(f"  {name:<34} {tps:9.0f} tok/s  (by CPU time {ctps:8.0f})  {tps / base:5.2f}x")
    return res


results = {"machine": machine_info(), "args": vars(args), "sections": {}}
print(machine_info())
m = new_model()
print(f"model: {args.n_layer} layers, {args.n_head} heads, {args.n_embd} wide, vocab {args.vocab}, N {N}, "
      f"{sum(p.numel() for p in m.parameters()) / 1e6:.3f}M params; batch {args.batch_size}, "
      f"~{args.tokens_per_run} tokens per timed run; load average {os.getloadavg()}")
R = results["sections"]

if "head" in sections:
    R["head"] = section("head (whole trunk trainable)", {
        "per-position": trainer(),
        "last-token": trainer(per_position=False)})

if "threads" in sections:
    R["threads"] = section("torch threads", {
        "1 thread": trainer(threads=1),
        "2 threads": trainer(threads=2)})

if "batch" in sections:
    R["batch"] = section("batch size", {f"batch {b}": trainer(B=b) for b in map(int, args.batch_sizes.split(","))})

if "optim" in sections:
    R["optim"] = section("AdamW implementation", {
        "for-loop (torch's CPU default)": trainer(optim_kw={}),
        "foreach=True": trainer(optim_kw={"foreach": True}),
        "make_optimizer (fused on CPU)": trainer()})

if "attention" in sections:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    class Both:  # two context managers as one (trainer takes one ctx)
        def __init__(self, *cms):
            self.cms = cms

        def __enter__(self):
            for c in self.cms:
                c.__enter__()

        def __exit__(self, *exc):
            for c in reversed(self.cms):
                c.__exit__(*exc)

    off = torch.autocast("cpu", enabled=False)
    # sdpa_kernel must also hold during backward: run the whole step inside it
    run_default, tok = trainer()
    run_math, _ = trainer()
    run_nomkl, _ = trainer()

    def math_step():
        with sdpa_kernel([SDPBackend.MATH]):
            run_math()

    def nomkldnn_step():
        with torch.backends.mkldnn.flags(enabled=False):
            run_nomkl()
    R["attention"] = section("attention kernel / mkldnn", {
        "SDPA default (flash CPU kernel)": (run_default, tok),
        "SDPA math backend": (math_step, tok),
        "mkldnn disabled": (nomkldnn_step, tok)})

if "bf16" in sections:
    R["bf16"] = section("autocast dtype", {
        "float32": trainer(),
        "bfloat16 autocast": trainer(ctx=torch.autocast("cpu", dtype=torch.bfloat16))})

if "compile" in sections:
    import torch._dynamo
    eager, tok = trainer()
    comp, _ = trainer(compile_net=True)
    t0 = time.perf_counter()
    comp()  # the first run compiles the forward and backward graphs
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    eager()
    eager_run = time.perf_counter() - t0
    R["compile"] = section("torch.compile (inductor, CPU)", {"eager": (eager, tok), "compiled": (comp, tok)})
    compile_s = first - eager_run
    e, c = R["compile"]["eager"]["tok_s"], R["compile"]["compiled"]["tok_s"]
    step_tokens = args.batch_size * N
    saved_per_step = step_tokens / e - step_tokens / c
    br = compile_s / saved_per_step if saved_per_step > 0 else float("inf")
    R["compile"]["compile_s"] = compile_s
    R["compile"]["break_even_steps"] = br
    run_s_e = args.compile_steps * step_tokens / e
    run_s_c = compile_s + args.compile_steps * step_tokens / c
    R["compile"]["run"] = {"steps": args.compile_steps, "eager_s": run_s_e, "compiled_s": run_s_c}
    print(f"  compile time (first run minus an eager run): {compile_s:.1f} s (training graph only; evaluation "
          f"under no_grad and a short last batch compile again); break-even after {br:.0f} steps; "
          f"{args.compile_steps} steps: eager {run_s_e:.0f} s, compiled {run_s_c:.0f} s")
    torch._dynamo.reset()

if "eval" in sections:
    def evaluator(B):
        model = new_model().eval()
        data = batches(B, steps_for(B), seed=1)

        @torch.no_grad()
        def run():
            for x, _ in data:
                reward_head.head_logits(model, x)
        return run, len(data) * B * N
    sizes = list(map(int, args.batch_sizes.split(","))) + [512]
    R["eval"] = section("evaluation (forward only, no_grad)", {f"batch {b}": evaluator(b) for b in sizes})

if "cache" in sections:
    R["cache"] = {}
    S, V, B = args.epoch_samples, args.val_samples, args.batch_size

    def forward_only(first, cached):
        """Evaluation batches (no_grad) through the whole model, or from cached features."""
        model = new_model().eval()
        net = reward_head.RewardLogits(model, first_block=first if cached else None)
        data = batches(B, steps_for(B), seed=1)
        if cached:
            with torch.no_grad():
                data = [(reward_head.frozen_features(model, x, first), y) for x, y in data]

        @torch.no_grad()
        def run():
            for x, _ in data:
                net(x)
        return run, len(data) * B * N

    def cache_pass(first):
        """build_frozen_cache's work: the frozen lower blocks under no_grad, 64 samples a chunk."""
        model = new_model().eval()
        xs = [x for x, _ in batches(64, steps_for(64), seed=2)]

        @torch.no_grad()
        def run():
            for x in xs:
                reward_head.frozen_features(model, x, first)
        return run, len(xs) * 64 * N

    for n in (0, 1, 2):
        first = args.n_layer - n
        r = section(f"--unfreeze_last_n_blocks {n}: head + top {n} block(s) trainable, the rest frozen", {
            "train step": trainer(unfreeze=n),
            "train step on cached features": trainer(unfreeze=n, cached=True),
            "eval forward": forward_only(first, False),
            "eval forward on cached features": forward_only(first, True),
            "cache pass": cache_pass(first)})
        parts = dict(r)
        for kind in ("tok_s", "cpu_tok_s"):  # seconds per sample of each part, by wall and by CPU time
            sec = {k: N / v[kind] for k, v in parts.items()}
            epoch_plain = S * sec["train step"]
            epoch_cached = S * sec["train step on cached features"]
            build = (S + V) * sec["cache pass"]
            n_evals = args.run_steps // args.eval_interval + 1
            run_plain = args.run_steps * B * sec["train step"] + n_evals * V * sec["eval forward"]
            run_cached = (build + args.run_steps * B * sec["train step on cached features"]
                          + n_evals * V * sec["eval forward on cached features"])
            r[f"estimate_{kind}"] = est = {
                "epoch_plain_s": epoch_plain, "epoch_cached_first_s": build + epoch_cached,
                "epoch_cached_later_s": epoch_cached, "run_plain_s": run_plain, "run_cached_s": run_cached}
            print(f"  [{'wall' if kind == 'tok_s' else 'cpu '}] epoch of {S} samples: plain {epoch_plain:.0f} s; cached "
                  f"{est['epoch_cached_first_s']:.0f} s with the cache pass over train+val "
                  f"({epoch_plain / est['epoch_cached_first_s']:.2f}x), {epoch_cached:.0f} s after it "
                  f"({epoch_plain / epoch_cached:.2f}x); run of {args.run_steps} steps + {n_evals} evals of {V}: "
                  f"plain {run_plain:.0f} s, cached {run_cached:.0f} s ({run_plain / run_cached:.2f}x)")
        print(f"  cache size {(S + V) * N * args.n_embd * 4 / 2**30:.2f} GiB (float32)")
        R["cache"][f"unfreeze_{n}"] = r

print(f"\nload average at the end: {os.getloadavg()}")
results["loadavg_end"] = os.getloadavg()
if args.out:
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    print(f"wrote {args.out}")
