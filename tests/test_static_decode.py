"""GPT.generate over a static KV cache (model.StaticDecoder), the path every caller takes on CUDA, where
each step is a replayed CUDA graph. On CPU the same step runs eagerly, so its guarantees are tested here:
the same tokens as the eager loop for the same uniforms (per-row prefixes, prefills and temperatures,
top-k, greedy, bfloat16 autocast), padding rows that never change a real row, and a step that never
synchronises with the host (no .item(), no data-dependent shape), which is what lets it be captured.
The tests marked cuda run the captured graphs themselves and skip without a GPU."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import model as model_mod
from model import GPT, GPTConfig, decoder_rows

CUDA = pytest.mark.cuda  # skipped without a GPU (conftest.py)


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
    eager = m.generate(idx, 68, uniforms=U, static=False, **SETTINGS[setting])
    static = m.generate(idx, 68, uniforms=U, static=True, **SETTINGS[setting])
    assert static.shape == (5, 80) and torch.equal(static, eager)


def test_static_decode_at_gpt2s_vocabulary_and_more_rows_than_a_head_group():
    """50257 columns (the head in HEAD_COLS blocks) and 70 rows (two head groups, a 128-row decoder)."""
    m = tiny(vocab=50257, block=40)
    idx, U = inputs(B=70, T=6, L=40, vocab=50257)
    eager = m.generate(idx, 34, uniforms=U, static=False)
    assert torch.equal(m.generate(idx, 34, uniforms=U, static=True), eager)


def test_mixed_prefixes_and_per_row_prefills_equal_each_row_run_with_its_own_group():
    """prefix_lens: rows keep their own prefixes; a per-row prefill_len (reward data's canonical
    prefill on a GPU, where prefill groups share one decoder) gives each row the tokens of an eager
    run of its own group."""
    m = tiny()
    idx, U = inputs()
    K = torch.tensor([3, 12, 7, 1, 9])
    assert torch.equal(m.generate(idx, 68, uniforms=U, prefix_lens=K, static=True),
                       m.generate(idx, 68, uniforms=U, prefix_lens=K, static=False))
    P = torch.tensor([1, 8, 4, 1, 8])
    merged = m.generate(idx, 68, uniforms=U, prefix_lens=K, prefill_len=P, static=True)
    for i in range(5):
        group = P == P[i]
        alone = m.generate(idx[group], 68, uniforms=U[group], prefix_lens=K[group], prefill_len=int(P[i]),
                           static=False)
        assert torch.equal(merged[i], alone[int(group[:i].sum())]), i
    assert (merged[:, :12].eq(idx) | (torch.arange(12) >= K[:, None])).all()  # prefixes kept
    with pytest.raises(ValueError, match="prefill_len"):
        m.generate(idx, 68, uniforms=U, prefix_lens=K, prefill_len=torch.tensor([1, 8, 8, 1, 8]), static=True)
    with pytest.raises(ValueError, match="static=True"):
        m.generate(idx, 68, uniforms=U, prefix_lens=K, prefill_len=P, static=False)


def test_padding_rows_never_change_a_real_row():
    """5 rows run in an 8-row decoder padded with copies; the same 5 rows beside 3 other real rows give
    the same tokens (a row's tokens depend on its own prompt and uniforms only)."""
    m = tiny()
    idx, U = inputs(B=8)
    assert decoder_rows(5) == decoder_rows(8) == 8 and decoder_rows(65) == 128 and decoder_rows(130) == 192
    alone = m.generate(idx[:5], 68, uniforms=U[:5], static=True)
    other = idx.clone()
    other[5:] = torch.randint(0, 300, (3, 12))
    assert torch.equal(m.generate(other, 68, uniforms=U, static=True)[:5], alone)
    assert torch.equal(alone, m.generate(idx[:5], 68, uniforms=U[:5], static=False))


def test_under_bfloat16_autocast_the_same_tokens_as_the_eager_loop_under_autocast():
    """The decoder's bfloat16 cache and half-precision weight copies round exactly what autocast rounds."""
    m = tiny()
    idx, U = inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        eager = m.generate(idx, 68, uniforms=U, static=False)
        static = m.generate(idx, 68, uniforms=U, static=True)
    assert torch.equal(static, eager)
    dec = model_mod._DECODERS[m][(8, 80, torch.bfloat16, True)]
    assert dec.caches[0][0].dtype == torch.bfloat16 and dec.head.dtype == torch.bfloat16
    assert all(h.dtype == torch.bfloat16 for h in dec.half.values()) and len(dec.half) == 2 * 4 * 2  # weights, biases
    m.to(torch.bfloat16)  # bfloat16 weights, no autocast: the trunk's own dtype throughout
    assert torch.equal(m.generate(idx, 68, uniforms=U, static=True), m.generate(idx, 68, uniforms=U, static=False))


def test_decoders_are_reused_refreshed_and_bounded():
    """One decoder per (rows, length, dtype), at most MAX_DECODERS per model; a weight update in place is
    seen by the next run (the graphs read the weights' memory), moved weights get a new decoder."""
    m = tiny()
    idx, U = inputs()
    first = m.generate(idx, 68, uniforms=U, static=True)
    dec = model_mod._DECODERS[m][(8, 80, torch.float32, False)]
    with torch.no_grad():
        m.lm_head.weight.mul_(3.0)  # in place, as an optimizer step
    sharper = m.generate(idx, 68, uniforms=U, static=True)
    assert model_mod._DECODERS[m][(8, 80, torch.float32, False)] is dec and not torch.equal(sharper, first)
    assert torch.equal(sharper, m.generate(idx, 68, uniforms=U, static=False))
    m.transformer.wpe.weight = torch.nn.Parameter(m.transformer.wpe.weight.clone())  # new memory
    m.generate(idx, 68, uniforms=U, static=True)
    assert model_mod._DECODERS[m][(8, 80, torch.float32, False)] is not dec
    for length in range(20, 20 + model_mod.MAX_DECODERS + 2):
        m.generate(idx[:, :4], length - 4, uniforms=U[:, :length], static=True)
    assert len(model_mod._DECODERS[m]) == model_mod.MAX_DECODERS


class HostSyncs(TorchDispatchMode):
    """Records the ops that read a value back to the host (a CUDA graph cannot hold them)."""
    SYNC = ("aten._local_scalar_dense", "aten.nonzero", "aten.item", "aten.is_nonzero", "aten.equal",
            "aten.masked_select", "aten._unique", "aten.unique")

    def __init__(self):
        super().__init__()
        self.syncs, self.ops = [], 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        if str(func).startswith(self.SYNC):
            self.syncs.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("mixed", [False, True])
def test_a_step_never_synchronises_with_the_host(mixed):
    m = tiny(vocab=9000)
    idx, U = inputs(vocab=9000)
    m.generate(idx, 68, uniforms=U, static=True, temperature=torch.full((5,), 0.9), top_k=50)
    dec = model_mod._DECODERS[m][(8, 80, torch.float32, False)]
    dec.pos.fill_(30)
    with torch.no_grad(), HostSyncs() as mode:
        dec.step(model_mod._Trunk(m), False, 50, 64, mixed)
    assert mode.ops > 50 and mode.syncs == []
    assert int(dec.pos) == 31
    with torch.no_grad(), HostSyncs() as mode:  # the probe itself sees a sync
        bool((dec.pos > 3).any())
    assert mode.syncs


@pytest.mark.slow
def test_the_step_compiles_as_one_graph():
    """torch.compile(fullgraph=True) of the step on CPU: no graph break anywhere in it (a break or a
    host read would be an error), and the compiled step writes the eager step's tokens."""
    m = tiny()
    idx, U = inputs()
    m.generate(idx, 68, uniforms=U, static=True)
    dec = model_mod._DECODERS[m][(8, 80, torch.float32, False)]
    trunk = model_mod._Trunk(m)
    compiled = torch.compile(lambda: dec.step(trunk, False, None, 64, True), fullgraph=True)
    dec.pos.fill_(12)
    state = [t.clone() for t in (dec.out, dec.h, *[c for kv in dec.caches for c in kv])]
    outs = []
    for run in (lambda: dec.step(trunk, False, None, 64, True), compiled):
        for t, saved in zip((dec.out, dec.h, *[c for kv in dec.caches for c in kv]), state):
            t.copy_(saved)
        dec.pos.fill_(12)
        with torch.no_grad():
            for _ in range(20):
                run()
        outs.append(dec.out[:5, :32].clone())
    assert int(dec.pos) == 32 and torch.equal(outs[1], outs[0])


# ----------------------------------------------------------------------------- on a GPU

@CUDA
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_graphs_give_the_eager_loops_tokens(dtype):
    """The captured graphs on a GPU against the eager loop on the same GPU. In float32 both compute the
    same math with other kernels (the eager step's matmuls over pos + 1 keys, SDPA over a masked span),
    so a token may differ where two candidates tie to rounding: at least 99.9 % agree. In bfloat16 the
    rounding is coarser: at least 99 % of the tokens, and every row's first 8 generated tokens."""
    m = tiny(vocab=50257, block=256).cuda()
    idx, U = inputs(B=64, T=32, L=256, vocab=50257)
    idx, U = idx.cuda(), U.cuda()
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        eager = m.generate(idx, 224, uniforms=U, static=False)
        static = m.generate(idx, 224, uniforms=U, static=True)
    dec = model_mod._DECODERS[m][(64, 256, dtype, dtype == torch.bfloat16)]
    assert dec.graphs and all(k[2] % 64 == 0 for k in dec.graphs)
    agree = (static[:, 32:] == eager[:, 32:]).float().mean().item()
    assert agree >= (0.999 if dtype == torch.float32 else 0.99), agree
    assert torch.equal(static[:, 32:40], eager[:, 32:40]) or dtype == torch.float32 and agree >= 0.999


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
        a = m.generate(idx, 224, uniforms=U)
        b = m.generate(other, 224, uniforms=U)
        c = m.generate(idx[:40], 224, uniforms=U[:40])
    assert torch.equal(a[:40], b[:40]) and torch.equal(a[:40], c)
