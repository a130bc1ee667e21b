"""
The decode engine around model.py's GPT, as nanochat's engine.py wraps its gpt.py: the model computes (its
trunk over a key/value cache), the engine decodes, keeping the static decoders it builds. Engine(model,
decoder=...).generate(..., decoder=...) chooses the decoder (the argument; without one GPT_DECODE's on CUDA,
decoder_choice) and drives it: the eager loop, or StaticDecoder, a static KV cache whose
steps CUDA captures as graphs, its step compiled or not; past block_size it rolls the context
(generate_rolling). Sampling is inverse-CDF on given uniforms (sample_next, head_sample), so a row's tokens
depend on its own logits and noise alone; generate_recompute is the cache-free reference loop.
"""
import contextlib
import os
import warnings
from typing import NamedTuple, Optional, Union

import torch
import torch.nn as nn

from core.sampling import head_sample, sample_next


class Draw(NamedTuple):
    """One Engine.generate call's arguments, checked there: what every decoder reads."""
    idx: torch.Tensor  # (B, T) prompts
    length: int  # T_out: the columns of the output
    temperature: Union[float, torch.Tensor]  # a number, or (B, 1) per row
    top_k: Optional[int]
    prefix_lens: torch.Tensor  # (B,)
    uniforms: torch.Tensor  # (B, T_out): the noise of every draw
    prefill_len: Union[None, int, torch.Tensor]


class Engine:
    """Decoding for one GPT (generator mode): Engine(model).generate(idx, ...). The model is only read: its
    KV caches (model.new_kv_cache), its trunk (model.hidden_states) and its head; the engine keeps the static
    decoders it builds for it (static_decoder), so a caller that decodes again and again holds one Engine.
    decoder: this engine's default decoder (see generate); None: GPT_DECODE's on CUDA, else eager."""

    def __init__(self, model, decoder=None):
        if decoder is not None and decoder not in DECODERS:
            raise ValueError(f"decoder {decoder!r} is not one of {', '.join(DECODERS)}")
        self.model = model
        self.default_decoder = decoder
        self.decoders = {}  # (rows, length, dtype, autocast) -> StaticDecoder, the most recently used last

    @torch.no_grad()
    def generate(self, idx, max_new_tokens=None, temperature=1.0, top_k=None, prefix_lens=None, generator=None,
                 seed=None, uniforms=None, prefill_len=None, decoder=None):
        """Sample continuations for a batch, with a key/value cache.

        idx: (B, T) token ids. The output has T + max_new_tokens columns for every row;
        `max_new_tokens=None` fills up to block_size.

        prefix_lens: optional (B,) lengths K_i in [1, T]. Row i keeps idx[i, :K_i] and
        samples every later position, so rows with different natural prefixes share one
        batch without padding: all rows are aligned at the same positions, the common
        prefix min(K_i) is prefilled in one pass, then one token per step is produced for
        every row, taking the given token while a row is still inside its prefix.

        Randomness: `uniforms` (B, T_out) in [0, 1) fixes every draw explicitly (column t
        is used for position t); otherwise they are drawn from `generator`, or from a
        fresh generator seeded with `seed`, or from the global RNG. Sampling is
        inverse-CDF on these uniforms, so a row's tokens depend only on its own logits
        and uniforms, never on the other rows of the batch.

        prefill_len: override the prefill length (must be <= min(prefix_lens)); callers
        that need identical numerics however rows are grouped can fix it per row group. With
        the static cache it may also be a (B,) tensor: each row's own prefill length (<= its K).

        temperature: a number for every row, or a tensor with one temperature (> 0) per row
        ((B,) or (B, 1)); a row then samples exactly as it would alone at its own temperature.

        decoder: "eager" (the loop below), "static" (StaticDecoder: on CUDA each step is a replayed CUDA
        graph, no host synchronisation per token) or "compiled" (its step compiled: fewer kernels, seconds to
        compile). Default: the Engine's decoder, else decoder_choice() (GPT_DECODE) on CUDA for a model not
        training with dropout, else eager. Every
        decoder gives the eager loop's tokens (tests/test_static_decode.py).
        """
        model = self.model
        model.require("generator")
        B, T = idx.size()
        if max_new_tokens is None:
            max_new_tokens = model.config.block_size - T
        T_out = T + max_new_tokens
        if T < 1 or max_new_tokens < 0:
            raise ValueError("generate needs at least one prompt token and max_new_tokens >= 0")
        if isinstance(temperature, torch.Tensor):  # one temperature per row
            temperature = temperature.to(device=idx.device, dtype=torch.float32).reshape(-1, 1)
            if temperature.size(0) != B or not bool((temperature > 0).all()):
                raise ValueError("a per-row temperature needs one value > 0 per row of idx")
        if prefix_lens is None:
            prefix_lens = torch.full((B,), T, dtype=torch.long, device=idx.device)
        else:
            prefix_lens = torch.as_tensor(prefix_lens, dtype=torch.long, device=idx.device)
            if prefix_lens.shape != (B,) or prefix_lens.min() < 1 or prefix_lens.max() > T:
                raise ValueError("prefix_lens must have one entry per row, each in [1, idx.size(1)]")
        if uniforms is None:
            if generator is None and seed is not None:
                generator = torch.Generator(device=idx.device).manual_seed(seed)
            uniforms = torch.rand((B, T_out), generator=generator, device=idx.device)
        draw = Draw(idx, T_out, temperature, top_k, prefix_lens, uniforms, prefill_len)
        decoder = self.decoder(idx.device, decoder)
        if T_out > model.config.block_size:
            return generate_rolling(self, draw, decoder)
        if decoder != "eager":
            return StaticDecoder.run(self, draw, decoder == "compiled")
        return eager_decode(model, draw)

    def decoder(self, device, decoder=None):
        """The decoder to use: `decoder` if given, else the Engine's, else GPT_DECODE's (decoder_choice, checked
        on a CPU too, so a launcher's typo fails where it is tried first) on CUDA for a model not training with
        dropout, else the eager loop; a model with static_decoding = False (lib/ensemble.Ensemble) always the latter."""
        choice = decoder_choice()
        decoder = decoder if decoder is not None else self.default_decoder
        m = self.model
        eager_only = not getattr(m, "static_decoding", True)  # no one trunk to capture (lib/ensemble.Ensemble)
        if decoder is not None:
            if decoder not in DECODERS:
                raise ValueError(f"decoder {decoder!r} is not one of {', '.join(DECODERS)}")
            if eager_only and decoder != "eager":
                raise ValueError(f"a {type(m).__name__} decodes with the eager loop only, not {decoder!r}")
            return decoder
        eager = eager_only or (m.training and m.config.dropout > 0)
        return choice if device.type == "cuda" and not eager else "eager"

    def static_decoder(self, rows, length):
        """The engine's StaticDecoder of this shape (and autocast dtype), built anew for moved weights; at most
        MAX_DECODERS are kept (each holds a KV cache of its rows x length)."""
        model = self.model
        dev = model.lm_head.weight.device.type
        amp = torch.is_autocast_enabled(dev)  # a graph holds the casts of the autocast it was captured under
        dtype = torch.get_autocast_dtype(dev) if amp else model.lm_head.weight.dtype
        dec = self.decoders.pop((rows, length, dtype, amp), None)
        if dec is None or dec.ptrs != weight_pointers(model):
            dec = StaticDecoder(model, rows, length, dtype)
        self.decoders[(rows, length, dtype, amp)] = dec  # the most recently used last
        while len(self.decoders) > MAX_DECODERS:
            self.decoders.pop(next(iter(self.decoders)))
        return dec


def eager_decode(model, draw):
    """Engine.generate's eager loop over a Draw (checked there) -> the (B, T_out) tokens: the common prefix
    prefilled in one pass, then one token per step for every row."""
    idx, T_out, temperature, top_k, prefix_lens, uniforms, prefill_len = draw
    if isinstance(prefill_len, torch.Tensor) and prefill_len.numel() > 1:
        raise ValueError("a per-row prefill_len needs the static-cache decoder: pass decoder='static'")
    B, T = idx.size()
    P = int(prefix_lens.min()) if prefill_len is None else int(prefill_len)
    if not 1 <= P <= int(prefix_lens.min()):
        raise ValueError("prefill_len must be in [1, min(prefix_lens)]")
    out = torch.empty((B, T_out), dtype=idx.dtype, device=idx.device)
    out[:, :T] = idx
    caches = model.new_kv_cache(B, T_out)
    workspace = {}  # logits and sampling buffers reused by every step
    x = model.hidden_states(out[:, :P], caches, 0)
    for t in range(P, T_out):
        nxt = head_sample(x[:, -1, :], model.lm_head.weight, temperature, top_k, uniforms[:, t], workspace)
        if t < T:  # rows still inside their prefix keep the given token
            nxt = torch.where(prefix_lens > t, out[:, t], nxt)
        out[:, t] = nxt
        if t + 1 < T_out:
            x = model.hidden_states(out[:, t:t + 1], caches, t)
    return out


@torch.no_grad()
def generate_recompute(model, idx, max_new_tokens, temperature=1.0, top_k=None, uniforms=None):
    """Reference generation without a cache: the whole context is re-run for every
    token (nanoGPT's loop). Used by tests and benchmarks to check `Engine.generate`."""
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


def generate_rolling(engine, draw, decoder):
    """Engine.generate past block_size: when the cache is full, keep the last half block of context,
    prefill it again and continue (rare, sample.py only)."""
    idx, T_out, temperature, top_k, prefix_lens, uniforms, _ = draw
    if int(prefix_lens.min()) != idx.size(1):
        raise ValueError("mixed prefix lengths need the total length to fit in block_size")
    model, out = engine.model, idx
    keep = model.config.block_size // 2
    while out.size(1) < T_out:
        ctx = out[:, -keep:] if out.size(1) > keep else out
        n = min(T_out - out.size(1), model.config.block_size - ctx.size(1))
        u = torch.cat([uniforms[:, out.size(1) - ctx.size(1):out.size(1)],
                       uniforms[:, out.size(1):out.size(1) + n]], dim=1)
        new = engine.generate(ctx, n, temperature, top_k, uniforms=u, decoder=decoder)
        out = torch.cat([out, new[:, ctx.size(1):]], dim=1)
    return out


def decoder_choice():
    """GPT_DECODE, CUDA's default decoder for every caller of Engine.generate: compiled (the static-cache decoder,
    StaticDecoder, with its step's regions compiled: the default), static (the same, not compiled) or eager
    (the eager loop, as before either existed). Read at each call, so a launcher can set it for what it runs
    (run_cycles' presets do); bench/gpu_check.sh measures them that way."""
    choice = os.environ.get("GPT_DECODE", "compiled")
    if choice not in DECODERS:
        raise ValueError(f"GPT_DECODE={choice!r} is not a decoder: use one of {', '.join(DECODERS)}")
    return choice


SPAN = 64  # positions per cache bucket: a step attends over the first multiple of SPAN past its position
MAX_DECODERS = 4  # StaticDecoders kept per Engine (each holds a KV cache of its rows x length)


def decoder_rows(batch):
    """The rows of the StaticDecoder that serves a batch: a power of two from 8 up to 64, then a multiple
    of 64, so a run's batches share a few decoders (and their graphs); the padding rows are copies."""
    return max(8, 1 << (batch - 1).bit_length()) if batch <= 64 else -(-batch // 64) * 64


class _Trunk(nn.Module):
    """GPT.trunk (before ln_f) as a forward, so torch.func.functional_call runs it on half-precision weights;
    embedded: x is already the embeddings (a step's, made where its token is drawn), only the blocks run."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x, caches, pos, run_block=None, embedded=False):
        if embedded:
            return self.model.blocks(x, None, caches, pos, run_block)
        return self.model.trunk(x, None, caches, pos, run_block)


# The compiled step (the "compiled" decoder) compiles two regions, each once for every block, span and
# position (dynamic shapes): a block's step, reused by all the blocks (torch.compile guards on a block's type
# and its tensors' shapes, not on which block it is), and the choice of the next token. A whole-step graph
# would unroll every block: at GPT-2's shapes it took 35 s to compile on this CPU, a block 8 s. Either way the
# compiled code is traced on the first (warm-up) step and replayed inside the captured graph.
def block_step(block, x, cache, pos):
    return block(x, cache, pos)


# kernel: tensor arguments, the captured (and compiled) step's token choice
def next_token(model, h, head, temperature, top_k, uniforms, out, prefix, prefill, pos, span, workspace):
    """The tokens at position pos, written into out: drawn from ln_f(h) with uniforms[:, pos], or the given
    ones for rows inside their prefix or prefill; then pos += 1. Returns their embeddings (the blocks' input),
    the rows past their prefill, the cache columns of a span that attention masks (those past pos) and the
    position. ln_f, the embeddings and the position's advance sit here, inside the step's compiled region,
    not as kernels of their own between regions."""
    here = pos.clone()
    at = here.view(1)
    given = out.index_select(1, at).view(-1)
    active = prefill <= here
    drawn = head_sample(model.transformer.ln_f(h), head, temperature, top_k, uniforms.index_select(1, at).view(-1),
                        workspace)
    tok = torch.where(active & (prefix <= here), drawn, given)
    out.index_copy_(1, at, tok.view(-1, 1))
    pos.add_(1)
    return model.embed(tok.view(-1, 1), here), active, torch.arange(span, device=here.device) > here, here


# process-wide, not the Engine's: torch.compile caches its code per function for the whole process anyway
_COMPILED = {}
# process-wide: a compiler that fails here fails for every engine, so it is tried (and warned about) once
_COMPILE_FAILED = []  # why compiling the step failed in this process, if it did


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
    """Engine.generate over a static KV cache: every buffer a step reads or writes (the sequences, their
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
    def run(engine, draw, compile_step=False):
        """Engine.generate's Draw (checked there) -> the (B, length) tokens, on a decoder of the engine's."""
        model = engine.model
        idx, length, temperature, top_k, prefix_lens, uniforms, prefill_len = draw
        B, T = idx.shape
        if prefill_len is None:  # the eager loop's: the shortest prefix, for every row
            prefill = prefix_lens.min().expand(B)
        else:
            prefill = torch.as_tensor(prefill_len, dtype=torch.long, device=idx.device).expand(B)
        if bool(((prefill < 1) | (prefill > prefix_lens)).any()):
            raise ValueError("prefill_len must be in [1, min(prefix_lens)] (per row: in [1, its prefix length])")
        temps = temperature if isinstance(temperature, torch.Tensor) else torch.full((B, 1), float(temperature))
        # every row greedy, every row at T = 1 (no divide: x / 1 == x, the same tokens), or each its own T;
        # read once per call, not per token
        sampling = "greedy" if not isinstance(temperature, torch.Tensor) and temperature == 0 else (
            "unit" if bool((temps == 1).all()) else "rows")
        order = torch.argsort(prefill, stable=True)  # rows of one prefill length together
        rows = torch.cat([order, order[-1:].expand(decoder_rows(B) - B)])  # padding: copies of a real row
        lengths = prefill[rows].tolist()
        mixed, trunk = lengths[0] != lengths[-1], _Trunk(model)
        dec = engine.static_decoder(len(rows), length)
        spans = sorted({min(length, -(-(t + 1) // SPAN) * SPAN) for t in range(lengths[0], length)})
        key = (sampling, top_k, mixed, compile_step and not _COMPILE_FAILED)
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
            self.h[s:e] = x[:, -1]  # before ln_f, which the step applies
            s = e

    def trunk_call(self, trunk, x, caches, pos, run_block=None, embedded=False):
        if not self.half:
            return trunk(x, caches, pos, run_block, embedded)
        return torch.func.functional_call(trunk, self.half, (x, caches, pos, run_block, embedded), tie_weights=False,
                                          strict=False)

    def step(self, trunk, key, span):
        """Position pos for every row: the token (sampled from h, or the given one inside the prefix),
        then the blocks on it (its key and value at pos, the new h, before ln_f); pos += 1. key: (sampling:
        "greedy", "unit" or "rows", top_k, mixed, compile_step), with mixed for rows of several prefill lengths."""
        sampling, top_k, mixed, compile_step = key
        head = trunk.model.lm_head.weight if self.head is None else self.head
        temperature = {"greedy": 0, "unit": 1}.get(sampling, self.temperature)
        # uncompiled, the (B, V) buffers of the workspace are reused from step to step; compiled, the graph
        # plans its own
        x, active, unseen, here = (compiled(next_token) if compile_step else next_token)(
            trunk.model, self.h, head, temperature, top_k, self.uniforms, self.out, self.prefix, self.prefill,
            self.pos, span, {} if compile_step else self.workspace)
        caches = [(k, v, unseen, active if mixed else None) for k, v in self.caches]
        run_block = compiled(block_step) if compile_step else None
        x = self.trunk_call(trunk, x, caches, here, run_block, embedded=True)[:, -1]
        self.h.copy_(torch.where(active.view(-1, 1), x.to(self.h.dtype), self.h) if mixed else x)

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

