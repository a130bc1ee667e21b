"""
Vocabulary-wide log-probabilities of a linear head without the whole (positions, V) logits: the fused
log-prob autograd function (LinearLogprob, its own backward), the chunked loss, and the memory budget
(LOGIT_ELEMENTS, logit_budget) that decides when a GPU forms the whole logits instead. GPT (model.py) uses
it for its loss, token log-probs and LM features; the decode engine (engine.py) for its head's logits.
"""
import torch
from torch.nn import functional as F

# How many vocabulary-wide values (one float32 each) one chunk of positions may form at once, chosen
# by memory. On CPU 2**25, 128 MiB per (positions, V) tensor whatever the batch size (linear_logprobs
# also keeps a chunk near the cache, positions_per_chunk, so at GPT-2's 50257 columns a chunk is far
# smaller). On a GPU the whole logits wherever they fit: a chunk holds at most 12 bytes a logit (the
# forward's logits and log-softmax in float32, then backward's kept log-probs, dlogits and their copy in
# autocast's dtype: about 10; tests/test_model.py counts them), so the budget is LOGIT_MEMORY_FRACTION of
# the device's memory over 12 bytes; GPT-2 124M's 12 x 1024 x 50304 logits fit a 40 GB card whole.
LOGIT_ELEMENTS = 2 ** 25
LOGIT_MEMORY_FRACTION = 0.25


def logit_budget(device):
    """The vocabulary-wide values one chunk may form on `device` (see LOGIT_ELEMENTS)."""
    device = torch.device(device)
    if device.type != "cuda":
        return LOGIT_ELEMENTS
    total = torch.cuda.get_device_properties(device).total_memory  # cached by torch: no device call
    return max(LOGIT_ELEMENTS, int(total * LOGIT_MEMORY_FRACTION) // 12)


def positions_per_chunk(vocab_size, width=0, max_elements=None, device="cpu"):
    """Positions per chunk of linear_logprobs. On CPU about 2**20 logits (4 MiB, near the cache) but at
    least `width` positions (each chunk reads the whole (V, width) head, which should not dominate); on a
    GPU as many as the budget holds (one chunk, the whole logits, wherever they fit). Never more than
    max_elements (default logit_budget(device)) logits; at least 1."""
    cap = (max_elements or logit_budget(device)) // int(vocab_size)
    if torch.device(device).type != "cpu":
        return max(1, cap)
    return max(1, min(cap, max(2 ** 20 // int(vocab_size), int(width))))


# Vocabulary columns per matmul of logits_into on CPU for a narrow head (width <= 256, where writing the
# logits bounds the matmul): one (4096, width) slice of the head is read once per chunk of rows and
# stays in cache while its (rows, 4096) logits are written, instead of the whole (V, width) head
# streaming past a (rows, V) output; each logit has the same bits either way. A wide head's matmul
# is bound by arithmetic and runs whole.
HEAD_COLS = 4096
BACKWARD_ROWS = 128  # rows per chunk of LinearLogprob.backward: its (rows, HEAD_COLS) blocks bound the memory


def logits_into(x, weight, out):
    """x @ weight.T into the float32 buffer out: in place, since on CPU a fresh (chunk, V) tensor per
    chunk costs more in page faults than the matmul; through F.linear under autocast (its dtype)."""
    if torch.is_autocast_enabled(x.device.type) or x.dtype != out.dtype:
        return out.copy_(F.linear(x, weight))
    V = weight.size(0)
    # whole under torch.compile too (the decode engine's compiled step): dynamo takes no column block as out=
    if x.device.type != "cpu" or V <= 2 * HEAD_COLS or x.size(1) > 256 or torch.compiler.is_compiling():
        return torch.mm(x, weight.T, out=out)
    for s in range(0, V, HEAD_COLS):  # column blocks written in place (the BLAS takes out's row stride)
        torch.mm(x, weight[s:s + HEAD_COLS].T, out=out[:, s:s + HEAD_COLS])
    return out


def _logprob_chunks(x, weight, targets, temps, want_entropy, n):
    """The forward of linear_logprobs on flat rows x (N, C), targets (N,): log p (len(temps), N) for
    every temperature, the log-normaliser lse (len(temps), N), the entropy (N,) (one temperature
    only) or None, and the last chunk's log-probs at the last temperature. Two or three (n, V)
    buffers, reused by every chunk; logits are float32 (float64 for float64 inputs)."""
    N, V = x.size(0), weight.size(0)
    assert not want_entropy or len(temps) == 1, "the entropy is for one temperature"
    f = torch.promote_types(x.dtype, torch.float32)
    logp, lse = (torch.empty(len(temps), N, dtype=f, device=x.device) for _ in range(2))
    ent = torch.empty(N, dtype=f, device=x.device) if want_entropy else None
    raw, ls = (torch.empty(min(n, N), V, dtype=f, device=x.device) for _ in range(2))
    # a third buffer only for several temperatures (the sweep's, no autograd): each reads the same logits.
    # One temperature scales them in place and the entropy's p overwrites them: two (n, V) buffers (8 bytes
    # a logit), the same values as three
    z = torch.empty_like(raw) if len(temps) > 1 and any(t != 1 for t in temps) else None
    for s in range(0, N, n):
        e = min(s + n, N)
        rc, y = logits_into(x[s:e], weight, raw[:e - s]), targets[s:e, None]
        for i, t in enumerate(temps):
            if t == 1:  # x / 1 == x
                zc = rc
            else:
                zc = rc.div_(t) if z is None else torch.div(rc, t, out=z[:e - s])
            lc = ls[:e - s]
            torch.log_softmax(zc, dim=-1, out=lc)
            logp[i, s:e] = lc.gather(1, y).squeeze(1)
            lse[i, s:e] = zc.gather(1, y).squeeze(1) - logp[i, s:e]
            if want_entropy:  # one temperature: the scaled logits are spent, p goes in their place (softmax
                p = torch.softmax(zc, dim=-1, out=zc)  # reads each row before writing it; faster than exp)
                ent[s:e] = -p.mul_(lc).sum(-1)
    return logp, lse, ent, lc


class LinearLogprob(torch.autograd.Function):
    """log p(y) and the entropy under softmax(x @ W.T / T), per row, in chunks of positions.

    Why: with GPT-2's 50257 tokens the (positions, V) log-softmax dominates the time and memory of
    GRPO, the reference, the detector's LM features and val scoring. Here no (chunk, V) tensor
    outlives its chunk, and backward recomputes the logits once, in blocks of HEAD_COLS columns that
    stay in cache, and forms log p = z / T - lse from the forward's lse (no second softmax), then
    dlogits = (g_logp * (onehot(y) - p) - g_ent * p * (log p + H)) / T, accumulating dx and that
    block's rows of dW (as fused linear-cross-entropy kernels do)."""

    @staticmethod
    # kernel: tensor arguments, a torch.autograd.Function's forward (its signature is autograd's)
    def forward(ctx, x, weight, targets, temperature, want_entropy, n, rows=None):
        """rows: the rows to compute (sorted indices), or None for all; the outputs then have one
        entry per listed row, and the others have none and get no gradient."""
        ctx.set_materialize_grads(False)
        if rows is None:
            logp, lse, ent, logits = _logprob_chunks(x, weight, targets, [temperature], want_entropy, n)
            lse = lse[0]
        else:  # backward keeps the blocks of every row (the same dW sums), skipping the others (_live_rows)
            logp, part, ent_part, logits = _logprob_chunks(x[rows], weight, targets[rows], [temperature],
                                                           want_entropy, n)
            lse = torch.zeros(x.size(0), dtype=part.dtype, device=x.device).index_copy_(0, rows, part[0])
            ent = None if ent_part is None else torch.zeros_like(lse).index_copy_(0, rows, ent_part)
        ctx.save_for_backward(x, weight, targets, lse, ent, rows)
        # all positions in one chunk: backward reads its log-probs instead of recomputing the logits (of
        # the computed rows only on a GPU; the CPU recomputes them in cache-sized blocks of every row)
        whole = x.size(0) <= n if rows is None else keeps_computed_rows(x.device) and rows.numel() <= n
        ctx.logp = logits if whole else None
        ctx.t, ctx.n = temperature, n
        dev = x.device.type  # backward's matmuls run under forward's autocast, as torch.amp.custom_bwd does
        ctx.amp = (dev, torch.get_autocast_dtype(dev), torch.is_autocast_enabled(dev))
        return logp[0], (ent if rows is None else ent_part)

    @staticmethod
    def backward(ctx, g_logp, g_ent):
        x, weight, targets, lse, ent, kept = ctx.saved_tensors
        t, N, f = ctx.t, x.size(0), lse.dtype
        uncomputed = None  # rows the forward did not compute (no lse): zero dlogits
        if kept is not None:  # the computed rows' gradients in place, zeros elsewhere
            g_logp, g_ent = (None if g is None else torch.zeros_like(lse).index_copy_(0, kept, g.to(f))
                             for g in (g_logp, g_ent))
            uncomputed = torch.ones(N, dtype=torch.bool, device=x.device).index_fill_(0, kept, False)
        g_logp = torch.zeros_like(lse) if g_logp is None else g_logp.to(f) / t
        # dlogits = p * (a * log p + b) (+ g_logp at y): a = -g_ent / T, b = a * H - g_logp
        a = torch.zeros_like(lse) if g_ent is None else -g_ent.to(f) / t
        b = a * (ent if g_ent is not None else 0) - g_logp
        with torch.autocast(ctx.amp[0], dtype=ctx.amp[1], enabled=ctx.amp[2]):
            if kept is not None and ctx.logp is not None:
                dx, dw = _backward_saved_rows(ctx.logp, x, weight, kept, a, b, f)
            else:
                dx, dw = _backward_blocks(ctx, x, weight, lse, a, b, uncomputed, f)
            # the one-hot part of dlogits: g_logp at each row's target
            dx += g_logp[:, None] * weight[targets].to(f)
            dw.index_add_(0, targets, g_logp[:, None] * x.to(f))
        ctx.logp = None
        return dx.to(x.dtype), dw.to(weight.dtype), None, None, None, None, None


def keeps_computed_rows(device):
    """Whether LinearLogprob keeps a single chunk's log-probs of the computed rows (start > 0) for its
    backward: on a GPU, where memory allows the whole logits; the CPU forms them again in blocks."""
    return device.type != "cpu"


# kernel: tensor arguments, the autograd.Function's backward over blocks (ctx: its saved state)
def _backward_blocks(ctx, x, weight, lse, a, b, uncomputed, f):
    """dx and dW of dlogits = p * (a * log p + b) over blocks of rows (and, on CPU, of HEAD_COLS columns),
    log p read from the forward's single chunk or recomputed from its lse."""
    t, N, V = ctx.t, x.size(0), weight.size(0)
    dx, dw = torch.zeros(x.shape, dtype=f, device=x.device), torch.zeros(weight.shape, dtype=f, device=x.device)
    rows = N if ctx.logp is not None else max(ctx.n, BACKWARD_ROWS)
    cols = V if x.device.type != "cpu" or ctx.logp is not None else HEAD_COLS  # whole rows: one GEMM each
    size = min(rows, N) * min(cols, V)
    pbuf = torch.empty(size, dtype=f, device=x.device)
    zbuf = torch.empty(size if ctx.logp is None else 0, dtype=f, device=x.device)  # recomputed logits
    for r in range(0, N, rows):
        e = min(r + rows, N)
        # on a GPU every row of a block (finding the live ones would read them back to the host)
        live = _live_rows(a[r:e], b[r:e]) if x.device.type == "cpu" else None
        if live is not None and not live.numel():
            continue
        sel = (lambda v: v[r:e]) if live is None else (lambda v: v[r:e][live])  # noqa: E731
        # a block run whole with uncomputed rows: their exp(z / T - 0) may overflow, inf * 0 = nan
        sanitize = live is None and uncomputed is not None and (x.device.type != "cpu"
                                                                or bool(uncomputed[r:e].any()))
        xr, lr, ar, br = sel(x), sel(lse), sel(a), sel(b)
        m = xr.size(0)
        for c in range(0, V, cols):
            k = min(c + cols, V)
            if ctx.logp is not None:
                lp = sel(ctx.logp)[:, c:k]
            else:  # log p = z / T - lse, from the forward's lse
                lp = logits_into(xr, weight[c:k], zbuf[:m * (k - c)].view(m, k - c))
                lp = (lp.div_(t) if t != 1 else lp).sub_(lr[:, None])
            p = torch.exp(lp, out=pbuf[:m * (k - c)].view(m, k - c))
            grad = p.mul_(lp.mul_(ar[:, None]).add_(br[:, None]))  # in place: lp is spent
            if sanitize:
                grad.nan_to_num_(0.0, 0.0, 0.0)  # their dlogits are zeros
            gx = _gradient_gemms(grad, weight[c:k], xr, dw[c:k])
            if live is None:
                dx[r:e] += gx
            else:
                dx[r:e].index_add_(0, live, gx)
    return dx, dw


def _gradient_gemms(grad, weight, x, dw):
    """dlogits @ W (returned, in dw's dtype), and dlogits.T @ x added into dw. Under autocast (backward
    runs under forward's) both GEMMs take its dtype with float32 accumulation, dlogits cast once (2 bytes
    a logit, not a copy per GEMM); without autocast they run in dw's dtype (TF32 where the entry point
    allows it), dW accumulated in place."""
    dev = grad.device.type
    if not torch.is_autocast_enabled(dev):
        dw.addmm_(grad.T, x.to(dw.dtype))
        return grad @ weight.to(grad.dtype)
    h = torch.get_autocast_dtype(dev)
    grad = grad.to(h)
    with torch.autocast(dev, enabled=False):
        dw += grad.T @ x.to(h)
        return (grad @ weight.to(h)).to(dw.dtype)


# kernel: tensor arguments, the autograd.Function's backward from the saved log-probs
def _backward_saved_rows(logp, x, weight, kept, a, b, f):
    """dx and dW from the forward's log-probs of the computed rows `kept` (a GPU's single chunk): the
    other rows' dlogits are zeros, so no logits are formed again and no row is visited twice."""
    ak, bk = a[kept][:, None], b[kept][:, None]
    grad = torch.addcmul(bk, logp, ak)  # a * log p + b: the one (rows, V) temporary
    grad.mul_(logp.exp_())  # the saved log p is spent: p in its place
    dw = torch.zeros(weight.shape, dtype=f, device=x.device)
    gx = _gradient_gemms(grad, weight, x[kept], dw)
    return torch.zeros(x.shape, dtype=f, device=x.device).index_add_(0, kept, gx), dw


def _live_rows(a, b):
    """The rows of a chunk of LinearLogprob.backward whose dlogits p * (a * log p + b) are not all zero
    (indices), or None for all of them. GRPO's loss reads only the completion's positions, so the
    prompt's get exactly zero gradient: their logits need not be formed again. A chunk with fewer than
    4 live rows runs whole (with MKL each row's bits are the same at any row count of 4 or more; their
    zero rows add exact zeros to dW either way)."""
    live = ((a != 0) | (b != 0)).nonzero().squeeze(1)
    return None if live.numel() == a.numel() or 0 < live.numel() < 4 else live


def linear_logprobs(x, weight, targets, return_entropy=False, temperature=1.0, max_elements=None, start=0):
    """log p(targets[..., t]) under softmax(x[..., t, :] @ weight.T / temperature), shaped like
    targets, and with return_entropy the entropy of each predictive distribution: LinearLogprob on
    the flattened positions, in chunks of positions_per_chunk (a boundary may fall inside a row).
    start: positions t >= start only, shaped like targets[..., start:] (the same values as those
    columns of the full call, and the same gradients: backward keeps the full call's blocks)."""
    n = positions_per_chunk(weight.size(0), x.size(-1), max_elements, x.device)
    T, shape = targets.size(-1), (*targets.shape[:-1], targets.size(-1) - start)
    rows = None
    if start:
        rows = torch.arange(targets.numel(), device=x.device).view(-1, T)[:, start:].reshape(-1)
    logp, ent = LinearLogprob.apply(x.reshape(-1, x.size(-1)), weight, targets.reshape(-1),
                                    float(temperature), bool(return_entropy), n, rows)
    logp = logp.view(shape)
    return (logp, ent.view(shape)) if return_entropy else logp


@torch.no_grad()
def logprobs_at_temperatures(x, weight, targets, temps, max_elements=None):
    """linear_logprobs at every temperature in `temps`, one matmul per chunk serving them all (for
    the frontier's sweep; no autograd): (len(temps), *targets.shape). Chunks of about 2**20 logits
    whatever the width: each chunk's logits are read once per temperature, so they should stay near
    the cache (about 12 % faster than chunks of 32 positions at 13 temperatures, width 32)."""
    n = positions_per_chunk(weight.size(0), 0, max_elements, x.device)
    logp = _logprob_chunks(x.reshape(-1, x.size(-1)), weight, targets.reshape(-1),
                           [float(t) for t in temps], False, n)[0]
    return logp.view(len(temps), *targets.shape)


def chunked_cross_entropy(x, weight, targets, max_elements=None):
    """F.cross_entropy(x @ weight.T, targets, ignore_index=-1) (the mean over the scored positions)
    without the full logits: linear_logprobs, summed and divided by the count."""
    scored = targets != -1
    logp = linear_logprobs(x, weight, targets.clamp(min=0), max_elements=max_elements)
    return -(logp * scored).sum() / scored.sum()
