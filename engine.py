"""
The decode engine beside model.py (as nanochat keeps engine.py beside gpt.py): inverse-CDF sampling on
given uniforms (sample_next, head_sample), the cache-free reference loop (generate_recompute), generation
past block_size (generate_rolling), and StaticDecoder, GPT.generate over a static KV cache whose steps CUDA
captures as graphs, compiled (decoder_choice: GPT_DECODE).
"""
import contextlib
import os
import warnings
import weakref

import torch
import torch.nn as nn
from torch.nn import functional as F

from core.logprobs import _head_logits

SAMPLE_BLOCK = 256  # tokens per block of sample_next's two-level inverse CDF


def sample_next(logits, temperature, top_k, u, workspace=None):
    """Draw one token per row from logits (B, V) by inverse CDF with uniforms u (B,).

    temperature == 0 means greedy; a float32 tensor (B, 1) gives each row its own
    temperature (> 0). With a 50k vocabulary a (B, V) cumulative sum costs more than the softmax,
    so the CDF has two levels: the probabilities' sums over blocks of SAMPLE_BLOCK tokens, the
    block where u * total falls, and the float64 cumulative sum inside that block only. Every
    step is per row, so a row's token depends only on its own logits and uniform, whatever the batch.

    workspace: an optional dict kept by the caller across steps; the (B, V) buffers are
    then reused instead of allocated per call (with a 50k vocabulary the fresh pages
    cost more than the arithmetic). The tokens are bitwise the same with or without it.
    """
    per_row = isinstance(temperature, torch.Tensor)
    if not per_row and temperature == 0:
        return logits.argmax(dim=-1)
    logits, (B, V), S = logits.float(), logits.shape, SAMPLE_BLOCK
    bufs = None if workspace is None else workspace.get("sample")
    if bufs is None or bufs[0].size(0) < B or bufs[0].size(1) != V or bufs[0].device != logits.device:
        bufs = tuple(torch.empty(logits.shape, dtype=torch.float32, device=logits.device) for _ in range(2))
        if workspace is not None:
            workspace["sample"] = bufs
    scaled, probs = bufs[0][:B], bufs[1][:B]  # a larger buffer's first rows: still contiguous
    if per_row or temperature != 1:  # x / 1 == x exactly: no copy needed then
        logits = torch.div(logits, temperature, out=scaled)
    if top_k is not None and top_k < V:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # a slice: a list index is a host copy
        if logits is not scaled:  # never modify the caller's tensor
            logits = scaled.copy_(logits)
        logits.masked_fill_(logits < kth, float("-inf"))
    torch.softmax(logits, dim=-1, out=probs)
    full = V // S * S  # the whole blocks, then the partial one (an empty one sums to 0 and is never drawn)
    blocks = torch.cat([probs[:, :full].view(B, -1, S).sum(-1), probs[:, full:].sum(-1, keepdim=True)], 1)
    cdf = blocks.double().cumsum(-1)
    target = u.double()[:, None] * cdf[:, -1:]
    b = torch.searchsorted(cdf, target, right=True).clamp_(max=cdf.size(1) - 1)  # the target's block
    cols = b * S + torch.arange(S, device=b.device)
    inner = (probs.gather(1, cols.clamp(max=V - 1)) * (cols < V)).double().cumsum(-1)
    # kept below the block's total, so rounding never walks past its last token
    rest = torch.minimum(target - F.pad(cdf, (1, 0)).gather(1, b), inner[:, -1:] * (1 - 2 ** -40))
    return (b * S + torch.searchsorted(inner, rest.clamp_(min=0), right=True))[:, 0]


# Rows per group of head_sample on CPU: the logits of a group are formed (in HEAD_COLS blocks) and
# sampled before the next group's, in one reused buffer. At V = 50257 and width 32, 64 rows took
# 15-20 % less time than 16 and about the same as 128, with the same tokens (an earlier figure of
# docs/benchmarks.md, in its git history).
# A group never has fewer than 4 rows unless the batch has: with MKL the matmul of >= 4 rows gives
# each row the same bits at any row count, one row alone does not.
HEAD_ROWS = 64


def head_groups(B, device_type):
    """The (start, end) row groups of head_sample: one group off the CPU (a GPU wants big launches),
    else HEAD_ROWS rows each, a remainder of under 4 rows joining the group before it."""
    if device_type != "cpu" or B <= HEAD_ROWS:
        return [(0, B)]
    starts = list(range(0, B, HEAD_ROWS))
    if B - starts[-1] < 4:
        starts.pop()
    return [(s, e) for s, e in zip(starts, starts[1:] + [B])]


def head_sample(x, weight, temperature, top_k, u, workspace):
    """sample_next(x @ weight.T, temperature, top_k, u) for rows x (B, C), in row groups (head_groups)
    whose logits are formed into one reused buffer and sampled while they are near the cache; the
    same tokens as one call on all rows (sample_next is per row). workspace: a dict kept across steps."""
    B, V = x.size(0), weight.size(0)
    per_row = isinstance(temperature, torch.Tensor)
    groups = head_groups(B, x.device.type)
    rows = max(e - s for s, e in groups)
    f = torch.promote_types(x.dtype, torch.float32)
    buf = workspace.get("logits")
    if buf is None or buf.size(0) < rows or buf.size(1) != V or buf.dtype != f or buf.device != x.device:
        buf = workspace["logits"] = torch.empty(rows, V, dtype=f, device=x.device)
    out = torch.empty(B, dtype=torch.long, device=x.device)
    for s, e in groups:
        logits = _head_logits(x[s:e], weight, buf[:e - s])
        out[s:e] = sample_next(logits, temperature[s:e] if per_row else temperature, top_k, u[s:e], workspace)
    return out


@torch.no_grad()
def generate_recompute(model, idx, max_new_tokens, temperature=1.0, top_k=None, uniforms=None):
    """Reference generation without a cache: the whole context is re-run for every
    token (nanoGPT's loop). Used by tests and benchmarks to check `GPT.generate`."""
    B, T = idx.size()
    if uniforms is None:
        uniforms = torch.rand((B, T + max_new_tokens), device=idx.device)
    out = idx
    for t in range(T, T + max_new_tokens):
        logits, _ = model(out[:, -model.config.block_size:])
        out = torch.cat([out, sample_next(logits[:, -1, :], temperature, top_k,
                                          uniforms[:, t])[:, None]], dim=1)
    return out


# ----------------------------------------------------------------------------- decoding over a static cache

DECODERS = ("compiled", "static", "eager")  # GPT_DECODE's values


def generate_rolling(model, idx, T_out, temperature, top_k, prefix_lens, uniforms, static, compile_step):
    """GPT.generate past block_size: when the cache is full, keep the last half block of context,
    prefill it again and continue (rare, sample.py only)."""
    if int(prefix_lens.min()) != idx.size(1):
        raise ValueError("mixed prefix lengths need the total length to fit in block_size")
    out = idx
    keep = model.config.block_size // 2
    while out.size(1) < T_out:
        ctx = out[:, -keep:] if out.size(1) > keep else out
        n = min(T_out - out.size(1), model.config.block_size - ctx.size(1))
        u = torch.cat([uniforms[:, out.size(1) - ctx.size(1):out.size(1)],
                       uniforms[:, out.size(1):out.size(1) + n]], dim=1)
        new = model.generate(ctx, n, temperature, top_k, uniforms=u, static=static, compile_step=compile_step)
        out = torch.cat([out, new[:, ctx.size(1):]], dim=1)
    return out


def decoder_choice():
    """GPT_DECODE, CUDA's default decoder for every caller of GPT.generate: compiled (the static-cache decoder,
    StaticDecoder, with its step's regions compiled: the default), static (the same, not compiled) or eager
    (the eager loop, as before either existed). Read at each call, so a launcher can set it for what it runs
    (run_cycles' presets do); bench/gpu_check.sh measures them that way."""
    choice = os.environ.get("GPT_DECODE", "compiled")
    if choice not in DECODERS:
        raise ValueError(f"GPT_DECODE={choice!r} is not a decoder: use one of {', '.join(DECODERS)}")
    return choice


SPAN = 64  # positions per cache bucket: a step attends over the first multiple of SPAN past its position
MAX_DECODERS = 4  # StaticDecoders kept per model (each holds a KV cache of its rows x length)


def decoder_rows(batch):
    """The rows of the StaticDecoder that serves a batch: a power of two from 8 up to 64, then a multiple
    of 64, so a run's batches share a few decoders (and their graphs); the padding rows are copies."""
    return max(8, 1 << (batch - 1).bit_length()) if batch <= 64 else -(-batch // 64) * 64


class _Trunk(nn.Module):
    """GPT.hidden_states as a forward, so torch.func.functional_call runs it on half-precision weights."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, idx, caches, pos, run_block=None):
        return self.model.hidden_states(idx, caches, pos, run_block)


# The compiled step (GPT.generate's compile_step) compiles two regions, each once for every block, span and
# position (dynamic shapes): a block's step, reused by all the blocks (torch.compile guards on a block's type
# and its tensors' shapes, not on which block it is), and the choice of the next token. A whole-step graph
# would unroll every block: at GPT-2's shapes it took 35 s to compile on this CPU, a block 8 s. Either way the
# compiled code is traced on the first (warm-up) step and replayed inside the captured graph.
def _block_step(block, x, cache, pos):
    return block(x, cache, pos)


def _next_token(h, head, temperature, top_k, uniforms, out, prefix, prefill, pos, span, workspace):
    """The tokens at position pos, written into out: drawn from h with uniforms[:, pos], or the given ones
    for rows inside their prefix or prefill. Returns them, the rows past their prefill, and the cache
    columns of a span that attention masks (those past pos)."""
    at = pos.view(1)
    given = out.index_select(1, at).view(-1)
    active = prefill <= pos
    drawn = head_sample(h, head, temperature, top_k, uniforms.index_select(1, at).view(-1), workspace)
    tok = torch.where(active & (prefix <= pos), drawn, given)
    out.index_copy_(1, at, tok.view(-1, 1))
    return tok, active, torch.arange(span, device=pos.device) > pos


_COMPILED = {}
_COMPILE_FAILED = []  # why compiling the step failed in this process, if it did: it is not tried again


def decode_status():
    """This process's decoder choice (GPT_DECODE) and why compiling the decode step failed, if it did (then
    every 'compiled' decode ran uncompiled): benchmarks write it beside their timings."""
    return {"decoder": decoder_choice(), "compile_failed": list(_COMPILE_FAILED)}


def compiled(fn):
    """fn under torch.compile, made on first use: fullgraph (a graph break, a host read, is an error),
    dynamic shapes, and bf16 rounded where eager rounds it (emulate_precision_casts), so its tokens stay the
    uncompiled step's up to near-ties (tests/test_static_decode.py)."""
    if fn not in _COMPILED:
        _COMPILED[fn] = torch.compile(fn, fullgraph=True, dynamic=True, options={"emulate_precision_casts": True})
    return _COMPILED[fn]


class StaticDecoder:
    """GPT.generate over a static KV cache: every buffer a step reads or writes (the sequences, their
    uniforms, prefix and prefill lengths, temperatures, the position, the last hidden state, the cache)
    is allocated once, so on CUDA one step is captured as a graph per (span, mixed prefill) and replayed
    for every position; the position is a tensor the step advances itself, and sampling (the same
    inverse CDF on the same uniforms as the eager loop), per-row temperatures and prefixes all stay
    inside the step: no host synchronisation per token. Under autocast the cache holds the autocast
    dtype and the matrices are half-precision copies refreshed before each run: the same bits autocast
    gives (it rounds the same values), without casting every weight at every step.

    Rows may prefill different lengths (prefill_len per row): each group of equal length is prefilled
    on its own, and a step leaves the cache and hidden state of a row that is still inside its prefill
    alone, so a row's numerics are those of a run of its group alone (up to the kernels' batch size)."""

    def __init__(self, model, rows, length, dtype):
        c, dev = model.config, model.lm_head.weight.device
        self.rows, self.length = rows, length
        self.out = torch.zeros(rows, length, dtype=torch.long, device=dev)
        self.uniforms = torch.zeros(rows, length, device=dev)
        self.prefix = torch.zeros(rows, dtype=torch.long, device=dev)
        self.prefill = torch.zeros(rows, dtype=torch.long, device=dev)
        self.temperature = torch.ones(rows, 1, device=dev)
        self.pos = torch.zeros((), dtype=torch.long, device=dev)
        # the hidden state that predicts position pos, in the trunk's output dtype (float32 under autocast)
        self.h = torch.zeros(rows, c.n_embd, device=dev, dtype=model.lm_head.weight.dtype)
        # zeroed now, not only in load(): a capture's warm-up step runs before load, and a masked column's
        # value is multiplied by 0, so memory a freed decoder left (NaN as another dtype) would poison h
        # one column past the longest span: a span of the whole cache would make its keys a contiguous view,
        # a case torch.compile specialises on, so the compiled block step would compile twice per precision
        self.caches = [(k.zero_(), v.zero_()) for k, v in model.new_kv_cache(rows, length + 1, dtype=dtype)]
        # the heads and head size are the model's: static to torch.compile, else a head size equal to the rows
        # (GPT-2's 64 at 64 rows) shares their symbol (duck sizing) and fixes the block step's rows at 64
        for t in (t for kv in self.caches for t in kv):
            torch._dynamo.mark_static(t, 1)
            torch._dynamo.mark_static(t, 3)
        half = dtype != model.lm_head.weight.dtype  # under autocast: the matrices in its dtype
        self.half = {f"model.{n}": p.detach().to(dtype) for n, p in model.named_parameters()
                     if half and n.startswith("transformer.h.") and (".attn.c_" in n or ".mlp.c_" in n)}
        self.head = model.lm_head.weight.detach().to(dtype) if half else None
        self.graphs = {} if dev.type == "cuda" else None
        self.pool = None
        self.ptrs = weight_pointers(model)  # a graph reads these addresses: other weights, other decoder
        self.workspace = {}

    @staticmethod
    def run(model, idx, length, temperature, top_k, prefix_lens, uniforms, prefill_len, compile_step=False):
        """GPT.generate's arguments (checked there) -> the (B, length) tokens."""
        B, T = idx.shape
        if prefill_len is None:  # the eager loop's: the shortest prefix, for every row
            prefill = prefix_lens.min().expand(B)
        else:
            prefill = torch.as_tensor(prefill_len, dtype=torch.long, device=idx.device).expand(B)
        if bool(((prefill < 1) | (prefill > prefix_lens)).any()):
            raise ValueError("prefill_len must be in [1, min(prefix_lens)] (per row: in [1, its prefix length])")
        greedy = not isinstance(temperature, torch.Tensor) and temperature == 0
        temps = temperature if isinstance(temperature, torch.Tensor) else torch.full((B, 1), float(temperature))
        order = torch.argsort(prefill, stable=True)  # rows of one prefill length together
        rows = torch.cat([order, order[-1:].expand(decoder_rows(B) - B)])  # padding: copies of a real row
        lengths = prefill[rows].tolist()
        mixed, trunk = lengths[0] != lengths[-1], _Trunk(model)
        dec = StaticDecoder.of(model, len(rows), length)
        spans = sorted({min(length, -(-(t + 1) // SPAN) * SPAN) for t in range(lengths[0], length)})
        key = (greedy, top_k, mixed, compile_step and not _COMPILE_FAILED)
        if key[3] and spans:  # compiled (and captured) before the buffers are loaded: its steps write them
            key = dec.compile(trunk, key, spans)
        for span in spans:  # captured before the buffers are loaded: a capture's warm-up step writes them
            dec.graph(trunk, key, span)
        dec.load(trunk, idx[rows], uniforms[rows], prefix_lens[rows], prefill[rows], temps.to(idx.device)[rows])
        dec.prefill_groups(trunk, lengths)
        dec.pos.fill_(lengths[0])
        # graphs replay on cuda:N's stream: the device is set once for the loop, not per token
        with torch.cuda.device(idx.device) if dec.graphs is not None else contextlib.nullcontext():
            for t in range(lengths[0], length):
                span = min(length, -(-(t + 1) // SPAN) * SPAN)
                if dec.graphs is None:
                    dec.step(trunk, key, span)
                else:
                    dec.graphs[key + (span,)].replay()
        return dec.out[:B].index_select(0, torch.argsort(order))

    @staticmethod
    def of(model, rows, length):
        """The model's decoder of this shape (and autocast dtype), built anew for moved weights."""
        dev = model.lm_head.weight.device.type
        amp = torch.is_autocast_enabled(dev)  # a graph holds the casts of the autocast it was captured under
        dtype = torch.get_autocast_dtype(dev) if amp else model.lm_head.weight.dtype
        decoders = _DECODERS.setdefault(model, {})
        dec = decoders.pop((rows, length, dtype, amp), None)
        if dec is None or dec.ptrs != weight_pointers(model):
            dec = StaticDecoder(model, rows, length, dtype)
        decoders[(rows, length, dtype, amp)] = dec  # the most recently used last
        while len(decoders) > MAX_DECODERS:
            decoders.pop(next(iter(decoders)))
        return dec

    def load(self, trunk, idx, uniforms, prefix, prefill, temps):
        T = idx.size(1)
        self.out[:, :T].copy_(idx)
        self.out[:, T:].zero_()
        self.uniforms.copy_(uniforms)
        self.prefix.copy_(prefix)
        self.prefill.copy_(prefill)
        self.temperature.copy_(temps.reshape(-1, 1))
        for k, v in self.caches:  # a masked key's value is multiplied by 0: keep it finite
            k.zero_()
            v.zero_()
        for name, h in self.half.items():
            h.copy_(trunk.get_parameter(name))
        if self.head is not None:
            self.head.copy_(trunk.model.lm_head.weight)

    def prefill_groups(self, trunk, lengths):
        """Each run of rows with one prefill length P through the trunk at once, into the shared cache."""
        s = 0
        while s < len(lengths):
            e = s + 1
            while e < len(lengths) and lengths[e] == lengths[s]:
                e += 1
            x = self.trunk_call(trunk, self.out[s:e, :lengths[s]], [(k[s:e], v[s:e]) for k, v in self.caches], 0)
            self.h[s:e] = x[:, -1]
            s = e

    def trunk_call(self, trunk, idx, caches, pos, run_block=None):
        if not self.half:
            return trunk(idx, caches, pos, run_block)
        return torch.func.functional_call(trunk, self.half, (idx, caches, pos, run_block), tie_weights=False,
                                          strict=False)

    def step(self, trunk, key, span):
        """Position pos for every row: the token (sampled from h, or the given one inside the prefix),
        then the trunk on it (its key and value at pos, the new h); pos += 1. key: (greedy, top_k, mixed,
        compile_step), with mixed for rows of several prefill lengths."""
        greedy, top_k, mixed, compile_step = key
        head = trunk.model.lm_head.weight if self.head is None else self.head
        # uncompiled, the (B, V) buffers of the workspace are reused from step to step; compiled, the graph
        # plans its own
        tok, active, unseen = (compiled(_next_token) if compile_step else _next_token)(
            self.h, head, 0 if greedy else self.temperature, top_k, self.uniforms, self.out, self.prefix,
            self.prefill, self.pos, span, {} if compile_step else self.workspace)
        caches = [(k, v, unseen, active if mixed else None) for k, v in self.caches]
        run_block = compiled(_block_step) if compile_step else None
        x = self.trunk_call(trunk, tok.view(-1, 1), caches, self.pos, run_block)[:, -1]
        self.h.copy_(torch.where(active.view(-1, 1), x.to(self.h.dtype), self.h) if mixed else x)
        self.pos.add_(1)

    def compile(self, trunk, key, spans):
        """The compiled step's first call, where torch.compile compiles it, then on CUDA its graphs (they
        write the decoder's buffers: call it before loading them). Returns the key to decode with: the
        uncompiled step's if compiling or capturing failed, with a warning, once per process (the compiled
        step only makes decoding faster)."""
        try:
            if self.graphs is None:  # nothing to capture: the first step compiles (graph() warms up its own)
                self.warm_up(trunk, key, spans[0])
            for span in spans:
                self.graph(trunk, key, span)
            return key
        except Exception as e:
            for span in spans:  # the graphs captured before the failure, if any
                (self.graphs or {}).pop(key + (span,), None)
            _COMPILE_FAILED.append(repr(e))
            warnings.warn(f"the compiled decode step failed, so decoding goes on without it "
                          f"(GPT_DECODE=static skips the attempt): {e!r:.500}")
            return key[:3] + (False,)

    def warm_up(self, trunk, key, span):
        """One step at position 0, as a capture wants it first: on CUDA on a side stream. A compiled step
        compiles here."""
        self.pos.zero_()
        if self.graphs is None:
            self.step(trunk, key, span)
            return
        with torch.cuda.device(self.out.device):  # cuda:N's streams, not the current device's
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side), self.capture_autocast():
                self.step(trunk, key, span)
            torch.cuda.current_stream().wait_stream(side)

    @staticmethod
    def capture_autocast():
        # autocast's cache of casts must not hand the graph a tensor it frees when its context closes
        return torch.autocast("cuda", dtype=torch.get_autocast_dtype("cuda"), enabled=torch.is_autocast_enabled("cuda"),
                              cache_enabled=False)

    def graph(self, trunk, key, span):
        """On CUDA, the graph of step(trunk, key, span), captured on first use after a warm-up step (both
        write the decoder's buffers: call it before loading them)."""
        if self.graphs is None or key + (span,) in self.graphs:
            return
        self.warm_up(trunk, key, span)
        self.pos.zero_()
        with torch.cuda.device(self.out.device):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=self.pool), self.capture_autocast():
                self.step(trunk, key, span)
        self.pool = self.pool or g.pool()
        self.graphs[key + (span,)] = g


def weight_pointers(model):
    return tuple(p.data_ptr() for p in model.parameters())


_DECODERS = weakref.WeakKeyDictionary()  # model -> {(rows, length, dtype, autocast): StaticDecoder}, a cache
