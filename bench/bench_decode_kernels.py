"""
Kernels per decode step of the static-cache decoder (engine.StaticDecoder), counted on CPU at GPT-2 124M's
shapes (random weights, batch 64, a 32-token prompt, T = 1):

  uncompiled   the step's dispatched ops that do work (views and empty allocations left out): one GPU launch
               each, roughly; split into those inside the step's two compiled regions (the draw, next_token,
               and each block) and those between them, which stay eager kernels in the compiled step too
  compiled     the kernels of the compiled regions in Inductor's generated code (fused kernels plus extern
               calls such as the GEMMs), the draw's plus n_layer times a block's, plus the eager ops between
               the regions: the compiled step's launches (CPU Inductor's code; Triton's fuses alike)

A step is isolated as the difference of two generations, 16 tokens apart, so the count needs nothing of the
decoder's internals and runs on any commit (docs/benchmarks.md has the before and after).

    python bench/bench_decode_kernels.py [--dtype bfloat16] [--no_compile] [--out counts.json]
"""
import argparse
import contextlib
import functools
import json
import os
import re
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import engine  # noqa: E402
from engine import Engine  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402

NO_WORK = ("view", "_unsafe_view", "t", "transpose", "select", "slice", "expand", "unsqueeze", "squeeze",
           "permute", "as_strided", "alias", "detach", "_reshape_alias", "split", "unbind", "empty", "empty_like",
           "empty_strided", "lift_fresh", "promote_types", "result_type")


class StepOps(TorchDispatchMode):
    """Every dispatched op as (name, inside a region, dtype, shape); regions() raises depth inside the draw and
    each block. tests/test_static_decode.py reads a step's ops through it too."""

    def __init__(self):
        super().__init__()
        self.ops, self.depth = [], 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops.append((func.__name__, self.depth > 0, getattr(out, "dtype", None), getattr(out, "shape", None)))
        return out

    def working(self):
        """The ops that do work (views and empty allocations left out): one GPU launch each, roughly."""
        return [op for op in self.ops if op[0].split(".")[0] not in NO_WORK]


@contextlib.contextmanager
def regions(mode, model):
    """While open, the draw (engine.next_token) and every block of model count as inside a compiled region."""
    def inside(fn):
        @functools.wraps(fn)
        def run(*a, **k):
            mode.depth += 1
            try:
                return fn(*a, **k)
            finally:
                mode.depth -= 1
        return run
    inner, blocks = engine.next_token, list(model.transformer.h)
    engine.next_token = inside(inner)
    for block in blocks:
        block.forward = inside(block.forward)
    try:
        yield mode
    finally:
        engine.next_token = inner
        for block in blocks:
            del block.forward  # the class's forward again


def count_uncompiled(model, idx, U, amp):
    counts = []
    for n in (32 + 48, 32 + 64):
        with amp, regions(StepOps(), model) as mode, mode:
            Engine(model).generate(idx, n - 32, uniforms=U[:, :n], decoder="static")
        work = mode.working()
        counts.append((len(work), sum(inside for _, inside, _, _ in work)))
    steps = 16
    total, inside = ((b - a) / steps for a, b in zip(*counts))
    return {"ops_per_step": total, "inside_regions": inside, "between_regions": total - inside}


def kernel_calls(code):
    """Kernel launches in one Inductor wrapper: calls of its generated kernels and of extern kernels."""
    body = code[code.find("def call("):]
    body = body[:body.find("\nclass ")] if "\nclass " in body else body
    return len(re.findall(r"^\s+(?:cpp_fused_\w+|triton_\w+\.run|extern_kernels\.\w+|torch\.ops\.\w+\.\w+)\(",
                          body, re.M))


def count_compiled(model, idx, U, amp):
    from torch._inductor.utils import run_and_get_code
    with amp:
        _, codes = run_and_get_code(lambda: Engine(model).generate(idx, 32, uniforms=U[:, :64], decoder="compiled"))
    # the draw's graph samples (a cumulative sum, searchsorted); a block's does not
    kinds = ["draw" if re.search(r"cumsum|searchsorted|bucketize", c) else "block" for c in codes]
    per_graph = [{"graph": k, "kernels": kernel_calls(c)} for k, c in zip(kinds, codes)]
    return {"graphs": per_graph, "decode": engine.decode_status()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                    help="bfloat16: the step under CPU autocast, as a GPU decodes (bf16 matrices, float32 sampling)")
    ap.add_argument("--n_layer", type=int, default=12, help="blocks (GPT-2 124M: 12)")
    ap.add_argument("--no_compile", action="store_true", help="count the uncompiled step only (no Inductor)")
    ap.add_argument("--batch_size", type=int, default=64,
                    help="rows decoded at once (the count per step is the same at any; the tests' run takes 4)")
    ap.add_argument("--n_embd", type=int, default=768,
                    help="width, 64 a head (GPT-2 124M: 768; the tests': 64, a third of the time, another count)")
    ap.add_argument("--out", default=None, help="write the counts here as JSON")
    args = ap.parse_args()
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=args.n_layer, n_head=max(1, args.n_embd // 64), n_embd=args.n_embd, vocab_size=50257,
                          block_size=256, bias=True)).eval()
    idx = torch.randint(0, 50257, (args.batch_size, 32))
    U = torch.rand(args.batch_size, 256)
    amp = torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.dtype == "bfloat16")
    width = "" if args.n_embd == 768 else f" but {args.n_embd} wide"
    res = {"shapes": f"GPT-2 124M shapes{width}, batch {args.batch_size}, 32-token prompt, T = 1",
           "n_layer": args.n_layer, "dtype": args.dtype, "uncompiled": count_uncompiled(model, idx, U, amp)}
    if not args.no_compile:
        c = count_compiled(model, idx, U, amp)
        first = {g["graph"]: g["kernels"] for g in reversed(c["graphs"])}  # each kind's first graph
        c["per_step"] = (first["draw"] + args.n_layer * first["block"] + res["uncompiled"]["between_regions"]
                         if len(first) == 2 else None)
        res["compiled"] = c
    print(json.dumps(res, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
