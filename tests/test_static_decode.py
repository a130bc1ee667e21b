"""Engine.generate over a static KV cache (engine.StaticDecoder), the path every caller takes on CUDA, where
each step is a replayed CUDA graph. On CPU the same step runs eagerly, so its guarantees are tested here:
the same tokens as the eager loop for the same uniforms (per-row prefixes, prefills and temperatures,
top-k, greedy, bfloat16 autocast), padding rows that never change a real row, and a step that never
synchronises with the host (no .item(), no data-dependent shape), which is what lets it be captured.
The tests marked cuda run the captured graphs themselves and skip without a GPU."""
import copy
import importlib.util
import os

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import engine
import model as model_mod
from core.sampling import sample_next
from engine import Engine, decoder_rows
from model import GPT, GPTConfig

CUDA = pytest.mark.cuda  # skipped without a GPU (conftest.py)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiny(vocab=300, block=96, seed=0, **kw):
    torch.manual_seed(seed)
    return GPT(GPTConfig(block_size=block, vocab_size=vocab, n_layer=2, n_head=2, n_embd=32, **kw)).eval()


def inputs(B=5, T=12, L=80, vocab=300, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (B, T), generator=g), torch.rand(B, L, generator=g)


SETTINGS = {"T=1": {}, "T=0.7": {"temperature": 0.7}, "per-row T": {"temperature": torch.tensor([0.5, 1.0, 1.5, 0.8, 1.2])},
            "top-k": {"top_k": 5, "temperature": 1.3}, "greedy": {"temperature": 0}}


@pytest.mark.parametrize("setting", SETTINGS)
def test_static_decode_gives_the_eager_loops_tokens(setting):
    m = tiny()
    idx, U = inputs()
    eager = Engine(m).generate(idx, 68, uniforms=U, decoder="eager", **SETTINGS[setting])
    static = Engine(m).generate(idx, 68, uniforms=U, decoder="static", **SETTINGS[setting])
    assert static.shape == (5, 80) and torch.equal(static, eager)


def test_static_decode_at_gpt2s_vocabulary_and_more_rows_than_a_head_group():
    """50257 columns (the head in HEAD_COLS blocks) and 70 rows (two head groups, a 128-row decoder)."""
    m = tiny(vocab=50257, block=40)
    idx, U = inputs(B=70, T=6, L=40, vocab=50257)
    eager = Engine(m).generate(idx, 34, uniforms=U, decoder="eager")
    assert torch.equal(Engine(m).generate(idx, 34, uniforms=U, decoder="static"), eager)


def test_mixed_prefixes_and_per_row_prefills_equal_each_row_run_with_its_own_group():
    """prefix_lens: rows keep their own prefixes; a per-row prefill_len (reward data's canonical
    prefill on a GPU, where prefill groups share one decoder) gives each row the tokens of an eager
    run of its own group."""
    m = tiny()
    idx, U = inputs()
    K = torch.tensor([3, 12, 7, 1, 9])
    assert torch.equal(Engine(m).generate(idx, 68, uniforms=U, prefix_lens=K, decoder="static"),
                       Engine(m).generate(idx, 68, uniforms=U, prefix_lens=K, decoder="eager"))
    P = torch.tensor([1, 8, 4, 1, 8])
    merged = Engine(m).generate(idx, 68, uniforms=U, prefix_lens=K, prefill_len=P, decoder="static")
    for i in range(5):
        group = P == P[i]
        alone = Engine(m).generate(idx[group], 68, uniforms=U[group], prefix_lens=K[group], prefill_len=int(P[i]),
                           decoder="eager")
        assert torch.equal(merged[i], alone[int(group[:i].sum())]), i
    assert (merged[:, :12].eq(idx) | (torch.arange(12) >= K[:, None])).all()  # prefixes kept
    with pytest.raises(ValueError, match="prefill_len"):
        Engine(m).generate(idx, 68, uniforms=U, prefix_lens=K, prefill_len=torch.tensor([1, 8, 8, 1, 8]),
                           decoder="static")
    with pytest.raises(ValueError, match="decoder='static'"):
        Engine(m).generate(idx, 68, uniforms=U, prefix_lens=K, prefill_len=P, decoder="eager")


def test_padding_rows_never_change_a_real_row():
    """5 rows run in an 8-row decoder padded with copies; the same 5 rows beside 3 other real rows give
    the same tokens (a row's tokens depend on its own prompt and uniforms only)."""
    m = tiny()
    idx, U = inputs(B=8)
    assert decoder_rows(5) == decoder_rows(8) == 8 and decoder_rows(65) == 128 and decoder_rows(130) == 192
    alone = Engine(m).generate(idx[:5], 68, uniforms=U[:5], decoder="static")
    other = idx.clone()
    other[5:] = torch.randint(0, 300, (3, 12))
    assert torch.equal(Engine(m).generate(other, 68, uniforms=U, decoder="static")[:5], alone)
    assert torch.equal(alone, Engine(m).generate(idx[:5], 68, uniforms=U[:5], decoder="eager"))


def test_under_bfloat16_autocast_the_same_tokens_as_the_eager_loop_under_autocast():
    """The decoder's bfloat16 cache and half-precision weight copies round exactly what autocast rounds."""
    m = tiny()
    idx, U = inputs()
    eng = Engine(m)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        eager = Engine(m).generate(idx, 68, uniforms=U, decoder="eager")
        static = eng.generate(idx, 68, uniforms=U, decoder="static")
    assert torch.equal(static, eager)
    dec = eng.decoders[(8, 80, torch.bfloat16, True)]
    assert dec.caches[0][0].dtype == torch.bfloat16 and dec.head.dtype == torch.bfloat16
    assert all(h.dtype == torch.bfloat16 for h in dec.half.values()) and len(dec.half) == 2 * 4 * 2  # weights, biases
    m.to(torch.bfloat16)  # bfloat16 weights, no autocast: the trunk's own dtype throughout
    assert torch.equal(Engine(m).generate(idx, 68, uniforms=U, decoder="static"),
                       Engine(m).generate(idx, 68, uniforms=U, decoder="eager"))


def test_a_new_decoders_first_step_reads_only_finite_buffers(monkeypatch):
    """On CUDA each graph's warm-up step runs on a new decoder before load() fills it. A masked cache column
    still enters attention as 0 x value, so a cache allocated on memory a freed decoder left (float32 bits
    read as bfloat16: NaN) made h NaN and the next token out of range: a device-side assert on the H100,
    when a bfloat16 decode followed a float32 one on the same model. Here the allocation is poisoned."""
    m = tiny()
    real = m.new_kv_cache
    monkeypatch.setattr(m, "new_kv_cache", lambda *a, **k: [(c.fill_(float("nan")), d.fill_(float("nan")))
                                                            for c, d in real(*a, **k)])
    dec = Engine(m).static_decoder(8, 80)
    with torch.no_grad():
        for step in range(3):  # the warm-up's step at pos 0, then two more
            dec.step(engine._Trunk(m), ("rows", None, False, False), 64)
    assert torch.isfinite(dec.h).all() and int(dec.out[:, :3].max()) < 300


def test_decoders_are_reused_refreshed_and_bounded():
    """One decoder per (rows, length, dtype), at most MAX_DECODERS per Engine, and the Engine's own (another
    Engine of the model builds its own); a weight update in place is seen by the next run (the graphs read
    the weights' memory), moved weights get a new decoder."""
    m = tiny()
    idx, U = inputs()
    eng = Engine(m, decoder="static")
    first = eng.generate(idx, 68, uniforms=U)
    dec = eng.decoders[(8, 80, torch.float32, False)]
    other = Engine(m)
    other.generate(idx, 68, uniforms=U, decoder="static")
    assert other.decoders[(8, 80, torch.float32, False)] is not dec
    with torch.no_grad():
        m.lm_head.weight.mul_(3.0)  # in place, as an optimizer step
    sharper = eng.generate(idx, 68, uniforms=U)
    assert eng.decoders[(8, 80, torch.float32, False)] is dec and not torch.equal(sharper, first)
    assert torch.equal(sharper, Engine(m).generate(idx, 68, uniforms=U, decoder="eager"))
    m.transformer.wpe.weight = torch.nn.Parameter(m.transformer.wpe.weight.clone())  # new memory
    eng.generate(idx, 68, uniforms=U)
    assert eng.decoders[(8, 80, torch.float32, False)] is not dec
    for length in range(20, 20 + engine.MAX_DECODERS + 2):
        eng.generate(idx[:, :4], length - 4, uniforms=U[:, :length])
    assert len(eng.decoders) == engine.MAX_DECODERS


class HostSyncs(TorchDispatchMode):
    """Records the ops that read a value back to the host (a CUDA graph cannot hold them), and those that
    make a tensor from host data (on CUDA a host-to-device copy, which a capture forbids)."""
    SYNC = ("aten._local_scalar_dense", "aten.nonzero", "aten.item", "aten.is_nonzero", "aten.equal",
            "aten.masked_select", "aten._unique", "aten.unique", "aten.lift_fresh")

    def __init__(self):
        super().__init__()
        self.syncs, self.ops = [], 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        if str(func).startswith(self.SYNC):
            self.syncs.append(str(func))
        return func(*args, **(kwargs or {}))


class HostIndices(TorchFunctionMode):
    """Records indexing by anything but ints, slices, None and Ellipsis. On CUDA a Python list or a
    NumPy array as an index becomes a CPU tensor copied to the device (a blocking copy, which a capture
    forbids), a CPU tensor is the same copy, and a boolean mask reads its count back to the host. On CPU
    none of these costs anything, so only their presence shows what a GPU would do."""
    OPS = (torch.Tensor.__getitem__, torch.Tensor.__setitem__)

    def __init__(self):
        super().__init__()
        self.bad = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.OPS:
            index = args[1] if isinstance(args[1], tuple) else (args[1],)
            for i in index:
                if not (i is None or i is Ellipsis or isinstance(i, (int, slice))):
                    self.bad.append(f"{func.__name__}[{type(i).__name__}]")
        return func(*args, **(kwargs or {}))


def captured_step(mixed, top_k=50, vocab=9000, compile_step=False):
    """A decoder of a tiny model at position 30, and its step (what a CUDA graph captures) as a call."""
    m = tiny(vocab=vocab)
    idx, U = inputs(vocab=vocab)
    eng = Engine(m)
    eng.generate(idx, 68, uniforms=U, decoder="static", temperature=torch.full((5,), 0.9), top_k=top_k)
    dec = eng.decoders[(8, 80, torch.float32, False)]
    dec.pos.fill_(30)
    return dec, lambda: dec.step(engine._Trunk(m), ("rows", top_k, mixed, compile_step), 64)


@pytest.mark.parametrize("mixed", [False, True])
def test_a_step_never_synchronises_with_the_host(mixed):
    dec, step = captured_step(mixed)
    with torch.no_grad(), HostSyncs() as mode:
        step()
    assert mode.ops > 50 and mode.syncs == []
    assert int(dec.pos) == 31
    with torch.no_grad(), HostSyncs() as mode:  # the probe itself sees a sync
        bool((dec.pos > 3).any())
    assert mode.syncs
    with HostSyncs() as mode:  # and a tensor made from host data
        torch.tensor([1, 2])
    assert mode.syncs


def step_ops(dec, m, key, amp=False):
    """The step's ops, each marked inside or between its compiled regions, by bench/bench_decode_kernels.py's
    counter (the one docs/benchmarks.md's counts come from)."""
    path = os.path.join(ROOT, "bench", "bench_decode_kernels.py")
    spec = importlib.util.spec_from_file_location("bench_decode_kernels", path)
    kernels = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kernels)
    with kernels.regions(kernels.StepOps(), m) as mode, torch.no_grad(), \
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp), mode:
        dec.step(engine._Trunk(m), key, 64)
    return mode


@pytest.mark.parametrize("amp", [False, True])
def test_a_step_runs_one_op_between_its_compiled_regions_and_no_divide_at_t_1(amp):
    """What the step does not need stays out (issue 63): between the regions only the new hidden state's copy
    (ln_f, the embeddings and the position's advance run inside the draw's region); no temperature divide
    when every row samples at T = 1 (x / 1 == x), one with per-row temperatures; under autocast no float32
    copy of the (B, V) logits before sampling (the divide or the softmax widens them)."""
    m = tiny(vocab=9000)
    idx, U = inputs(vocab=9000)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
        eng = Engine(m)
        eng.generate(idx, 68, uniforms=U, decoder="static")
    dec = eng.decoders[(8, 80, torch.bfloat16 if amp else torch.float32, amp)]
    for sampling in ("unit", "rows"):
        dec.pos.fill_(30)
        mode = step_ops(dec, m, (sampling, None, False, False), amp)
        ops = mode.ops
        between = [name for name, inside, _, _ in mode.working() if not inside]
        assert between == ["copy_.default"], between
        divides = [name for name, _, _, shape in ops if name.startswith("div") and shape == (8, 9000)]
        assert len(divides) == (sampling == "rows"), (sampling, divides)
        wide_copies = [name for name, _, dtype, shape in ops
                       if name.startswith(("_to_copy", "copy_")) and shape == (8, 9000) and dtype == torch.float32]
        assert wide_copies == [], wide_copies
        assert int(dec.pos) == 31


@pytest.mark.parametrize("mixed", [False, True])
@pytest.mark.parametrize("top_k", [None, 50])
def test_a_step_indexes_with_nothing_from_the_host(mixed, top_k):
    """No list, array, host tensor or mask as an index anywhere in the step (top_k's k-th value was taken
    with [:, [-1]]: a host-to-device copy inside the capture, an error on CUDA only)."""
    dec, step = captured_step(mixed, top_k)
    with torch.no_grad(), HostIndices() as mode:
        step()
    assert mode.bad == []
    x = torch.zeros(4, 6)
    with HostIndices() as mode:  # the probe sees each kind
        x[:, [-1]], x[x > 0], x[torch.tensor([1])], x[1:, 2], x[..., None]
    assert mode.bad == ["__getitem__[list]", "__getitem__[Tensor]", "__getitem__[Tensor]"]


def test_the_step_attends_with_one_form_on_every_device():
    """The captured step's code takes no device-dependent branch, so the CPU tests run what a GPU runs
    (8bd02d5 gave SDPA a 1-D mask on CUDA only: an IndexError at the first step there)."""
    import inspect
    for fn in (model_mod.CausalSelfAttention._static_attention, engine.StaticDecoder.step, engine.next_token,
               sample_next):
        src = inspect.getsource(fn)
        assert "device.type" not in src and "is_cuda" not in src, fn.__qualname__


@pytest.mark.slow
def test_the_step_compiles_as_one_graph():
    """torch.compile(fullgraph=True) of the step on CPU: no graph break anywhere in it (a break or a
    host read would be an error), and the compiled step writes the eager step's tokens. The aot_eager backend:
    dynamo's trace and its functionalised graph in seconds; inductor's kernels are the compiled decoder's test."""
    m = tiny()
    idx, U = inputs()
    eng = Engine(m)
    eng.generate(idx, 68, uniforms=U, decoder="static")
    dec = eng.decoders[(8, 80, torch.float32, False)]
    trunk = engine._Trunk(m)
    compiled = torch.compile(lambda: dec.step(trunk, ("rows", None, True, False), 64), fullgraph=True,
                             backend="aot_eager")  # dynamo traces it whole (a break is an error); no C++ to build
    dec.pos.fill_(12)
    state = [t.clone() for t in (dec.out, dec.h, *[c for kv in dec.caches for c in kv])]
    outs = []
    for run in (lambda: dec.step(trunk, ("rows", None, True, False), 64), compiled):
        for t, saved in zip((dec.out, dec.h, *[c for kv in dec.caches for c in kv]), state):
            t.copy_(saved)
        dec.pos.fill_(12)
        with torch.no_grad():
            for _ in range(20):
                run()
        outs.append(dec.out[:5, :32].clone())
    assert int(dec.pos) == 32 and torch.equal(outs[1], outs[0])


@pytest.mark.slow
def test_the_compiled_step_gives_the_steps_tokens_and_compiles_once():
    """The compiled decoder (CUDA's default): a block's step and the draw under torch.compile, with dynamic shapes.
    On CPU (inductor's C++ kernels) the tokens of the uncompiled step: float32 with per-row temperatures,
    top-k, greedy, mixed prefixes and prefills, a vocabulary past the CPU's blocked head. Two graphs (the draw and
    a block's step) then serve every batch, length, span, position and block: no recompile per shape, the last
    span included (a span of the whole cache, a contiguous view, compiled a second block step). In bfloat16 each token is the inverse-CDF draw of its uniform to the precision's rounding. fullgraph=True makes a graph break an error, so nothing in them reads from the host."""
    import torch._dynamo
    from torch._dynamo.utils import counters
    m = tiny(vocab=9000)
    torch._dynamo.reset()
    graphs = lambda: counters["stats"]["unique_graphs"]  # noqa: E731
    before = graphs()
    # first 16 rows, the head size: were they one size to torch.compile (duck sizing), it would fix the rows
    # the graphs so far after each: the draw at T = 1 and a block's step; the draw with per-row temperatures (a
    # divide the draw at T = 1 has not); no more at other rows and temperatures; one more block step for mixed
    # prefills (it keeps prefilling rows)
    for B, T, L, kw, want in [(12, 7, 90, {}, 2), (5, 12, 80, {"temperature": torch.tensor([0.5, 1.0, 1.5, 0.8, 1.2])}, 3),
                              (30, 20, 96, {"temperature": 0.8}, 3), (16, 5, 70, {}, 3),
                              (5, 12, 80, {"prefix_lens": torch.tensor([3, 12, 7, 1, 9]),
                                           "prefill_len": torch.tensor([1, 8, 4, 1, 8])}, 4)]:
        idx, U = inputs(B=B, T=T, L=L, vocab=9000)
        compiled = Engine(m).generate(idx, L - T, uniforms=U, decoder="compiled", **kw)
        assert torch.equal(compiled, Engine(m).generate(idx, L - T, uniforms=U, decoder="static", **kw)), (B, T, L)
        assert graphs() - before == want, (B, T, L, kw)
    idx, U = inputs(vocab=9000)
    for kw in ({"top_k": 5, "temperature": 1.3}, {"temperature": 0}):
        assert torch.equal(Engine(m).generate(idx, 68, uniforms=U, decoder="compiled", **kw),
                           Engine(m).generate(idx, 68, uniforms=U, decoder="static", **kw)), kw
    # bfloat16: the fused kernels may round a near-tie the other way, then a row diverges; as on a GPU, every
    # token must still be the inverse-CDF draw of its uniform to bfloat16's rounding (inverse_cdf_slack)
    with torch.no_grad():
        m.lm_head.weight.mul_(30)  # peaked distributions: a token depends on its context
    for half in (True, False):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=half):
            mh = m if half else copy.deepcopy(m).to(torch.bfloat16)
            seq = Engine(mh).generate(idx, 68, uniforms=U, decoder="compiled")
        slack = inverse_cdf_slack(m, seq, U, 12)
        assert slack.max().item() <= 0.05 and (slack == 0).float().mean().item() >= 0.9, (half, slack.max())


def test_a_step_that_fails_to_compile_decodes_uncompiled_and_says_so(monkeypatch):
    """Compiling is an optimisation: if it fails (on its first step, before the buffers are loaded), the
    decode goes on with the uncompiled step, the same tokens, with one warning, and the process does not
    try again."""
    def broken(fn):
        def fail(*args):
            raise RuntimeError("no compiler here")
        return fail
    monkeypatch.setattr(engine, "compiled", broken)
    monkeypatch.setattr(engine, "_COMPILE_FAILED", [])
    m = tiny()
    idx, U = inputs()
    with pytest.warns(UserWarning, match="compiled decode step failed.*GPT_DECODE=static.*no compiler here"):
        out = Engine(m).generate(idx, 68, uniforms=U, decoder="compiled")
    assert torch.equal(out, Engine(m).generate(idx, 68, uniforms=U, decoder="eager")) and len(engine._COMPILE_FAILED) == 1
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(Engine(m).generate(idx, 68, uniforms=U, decoder="compiled"), out)


def test_gpt_decode_names_the_decoder_and_refuses_others(monkeypatch):
    """GPT_DECODE picks CUDA's default decoder for every caller (compiled, static or eager), read at each
    generate; a typo is an error that names the variable and the choices, not a silent default, on a CPU
    too (where it picks nothing), so a launcher's typo fails where it is tried first."""
    monkeypatch.delenv("GPT_DECODE", raising=False)
    assert engine.decoder_choice() == "compiled"
    m = tiny()
    idx, U = inputs()
    for value in engine.DECODERS:
        monkeypatch.setenv("GPT_DECODE", value)
        assert engine.decoder_choice() == value
        assert Engine(m).generate(idx, 4, uniforms=U[:, :16]).shape == (5, 16)
    monkeypatch.setenv("GPT_DECODE", "compile")
    for decoder in (None, "eager", "static"):
        with pytest.raises(ValueError, match="GPT_DECODE='compile' is not a decoder: use one of compiled, static, "
                                             "eager"):
            Engine(m).generate(idx, 4, uniforms=U[:, :16], decoder=decoder)
    with pytest.raises(ValueError, match="GPT_DECODE='compile' is not a decoder"):
        Engine(m).generate(idx, 100)  # past block_size: the rolling window's path


def test_the_decoder_is_an_argument_and_gpt_decode_only_its_default(monkeypatch):
    """generate(decoder=...) wins over Engine(model, decoder=...), which wins over GPT_DECODE; the variable
    only picks CUDA's decoder when no argument does, and the CPU's default stays the eager loop."""
    m = tiny()
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    monkeypatch.setenv("GPT_DECODE", "static")
    assert Engine(m).decoder(cuda) == "static" and Engine(m).decoder(cpu) == "eager"
    assert Engine(m, decoder="eager").decoder(cuda) == "eager"
    assert Engine(m, decoder="compiled").decoder(cpu) == "compiled"
    assert Engine(m, decoder="compiled").decoder(cuda, "static") == "static"
    with pytest.raises(ValueError, match="decoder 'fast' is not one of compiled, static, eager"):
        Engine(m, decoder="fast")
    idx, U = inputs()
    calls = []
    monkeypatch.setattr(engine.StaticDecoder, "run", lambda eng, draw, compile_step: calls.append(compile_step)
                        or draw.idx.new_zeros(5, draw.length))
    Engine(m, decoder="static").generate(idx, 4, uniforms=U[:, :16])
    Engine(m, decoder="static").generate(idx, 4, uniforms=U[:, :16], decoder="eager")
    assert calls == [False]


def test_generation_past_the_block_keeps_the_callers_decoder(monkeypatch):
    """Past block_size the engine rolls its window and generates per window: each window keeps the caller's
    decoder (sample.py passes the uncompiled one on a GPU; it was dropped, so every window took the device's
    default decoder), and the tokens are the eager loop's."""
    m = tiny(block=32)
    idx, U = inputs(B=3, T=8, L=70)
    calls = []
    run = engine.StaticDecoder.run

    def spy(*a):
        calls.append(a[-1])  # compile_step
        return run(*a)
    monkeypatch.setattr(engine.StaticDecoder, "run", spy)
    static = Engine(m).generate(idx, 62, uniforms=U, decoder="static")
    assert len(calls) >= 3 and calls == [False] * len(calls)
    calls.clear()
    eager = Engine(m).generate(idx, 62, uniforms=U, decoder="eager")
    assert not calls and torch.equal(static, eager)


# ----------------------------------------------------------------------------- on a GPU

def inverse_cdf_slack(m, seq, U, T):
    """(B, L - T): for each drawn position t >= T, how far its uniform u lies outside the interval of the
    cumulative distribution that the drawn token covers, under float32 probabilities of a whole forward of
    seq[:, :t] (no cache, no autocast). 0 where the token is exactly the inverse-CDF draw of u."""
    out = []
    for r in range(0, len(seq), 4):  # 4 rows at a time: whole, GPT-2's shapes take ~15 GB in float64
        s = seq[r:r + 4]
        with torch.no_grad(), torch.autocast(seq.device.type, enabled=False):
            logits = m.lm_head(m.hidden_states(s[:, :-1]))[:, T - 1:].float()
        p = logits.softmax(-1).double()
        tok = s[:, T:, None]
        hi = p.cumsum(-1).gather(-1, tok)[..., 0]
        lo = hi - p.gather(-1, tok)[..., 0]
        u = U[r:r + 4, T:].double()
        out.append(torch.maximum(lo - u, u - hi).clamp(min=0))
    return torch.cat(out)


def test_the_inverse_cdf_slack_sees_a_wrong_token():
    m = tiny()
    with torch.no_grad():
        m.lm_head.weight.mul_(30)  # peaked distributions: a token depends on its context
    idx, U = inputs()
    seq = Engine(m).generate(idx, 68, uniforms=U, decoder="static")
    assert inverse_cdf_slack(m, seq, U, 12).max() < 1e-6
    seq[:, 40] = (seq[:, 40] + 1) % 300
    assert inverse_cdf_slack(m, seq, U, 12)[:, 40 - 12].max() > 1e-3


@CUDA
@pytest.mark.parametrize("compile_step", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_graphs_draw_the_models_tokens(dtype, compile_step):
    """The captured graphs on a GPU, and the eager loop on the same GPU, each against float32 probabilities
    of whole forwards of the sequence they wrote: every token is the inverse-CDF draw of its uniform, to
    the precision's rounding of the probabilities. Token-for-token agreement of the two loops is not
    asked for: both are right, a tie to rounding flips a token, and the rows then diverge."""
    m = tiny(vocab=50257, block=256).cuda()
    with torch.no_grad():
        m.lm_head.weight.mul_(30)
    idx, U = inputs(B=64, T=32, L=256, vocab=50257)
    idx, U = idx.cuda(), U.cuda()
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        eager = Engine(m).generate(idx, 224, uniforms=U, decoder="eager")
        eng = Engine(m, decoder="compiled" if compile_step else "static")
        static = eng.generate(idx, 224, uniforms=U)
    dec = eng.decoders[(64, 256, dtype, dtype == torch.bfloat16)]
    assert dec.graphs and all(k[-1] % 64 == 0 and k[3] == compile_step for k in dec.graphs)
    tol = 1e-4 if dtype == torch.float32 else 0.05
    for seq in (static, eager):
        slack = inverse_cdf_slack(m, seq, U, 32)
        assert slack.max().item() <= tol and (slack == 0).float().mean().item() >= 0.9, slack.max().item()


@CUDA
def test_cuda_graphs_keep_rows_independent_of_their_batch_mates():
    """On a GPU in bfloat16: in one decoder (the same rows, so the same kernels) a row's tokens are the
    same whatever its batch mates are; the padding rows are such batch mates."""
    m = tiny(vocab=50257, block=256).cuda()
    idx, U = inputs(B=64, T=32, L=256, vocab=50257)
    idx, U = idx.cuda(), U.cuda()
    other = idx.clone()
    other[40:] = torch.randint(0, 50257, (24, 32), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        a = Engine(m).generate(idx, 224, uniforms=U)
        b = Engine(m).generate(other, 224, uniforms=U)
        c = Engine(m).generate(idx[:40], 224, uniforms=U[:40])
    assert torch.equal(a[:40], b[:40]) and torch.equal(a[:40], c)
