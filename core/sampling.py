"""
Sampling the next token by inverse CDF on given uniforms: a row's token depends on its own logits and uniform
alone, whatever its batch mates, so every decoder (engine.py's eager loop and its static-cache step) draws the
same tokens from the same noise. Pure tensor functions: no host synchronisation, nothing a CUDA graph forbids.
"""
import torch
from torch.nn import functional as F

from core.logprobs import logits_into


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
    (B, V), S = logits.shape, SAMPLE_BLOCK
    bufs = None if workspace is None else workspace.get("sample")
    if bufs is None or bufs[0].size(0) < B or bufs[0].size(1) != V or bufs[0].device != logits.device:
        bufs = tuple(torch.empty(logits.shape, dtype=torch.float32, device=logits.device) for _ in range(2))
        if workspace is not None:
            workspace["sample"] = bufs
    scaled, probs = bufs[0][:B], bufs[1][:B]  # a larger buffer's first rows: still contiguous
    # half-precision logits (autocast's) are widened by the first op that reads them, not copied first: a
    # float32 divide by per-row temperatures, the top-k copy, or the float32 softmax (the same bits)
    if per_row:
        logits = torch.div(logits, temperature, out=scaled)
    elif temperature != 1:  # x / 1 == x exactly: no divide then
        logits = torch.div(logits.float(), temperature, out=scaled)
    if top_k is not None and top_k < V:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # a slice: a list index is a host copy
        if logits is not scaled:  # never modify the caller's tensor
            logits = scaled.copy_(logits)
        logits.masked_fill_(logits < kth, float("-inf"))
    torch.softmax(logits, dim=-1, dtype=torch.float32, out=probs)
    full = V // S * S  # the whole blocks, then the partial one (an empty one sums to 0 and is never drawn)
    blocks = torch.cat([probs[:, :full].view(B, -1, S).sum(-1), probs[:, full:].sum(-1, keepdim=True)], 1)
    cdf = blocks.cumsum(-1, dtype=torch.float64)  # widened as it sums: no float64 copy first
    target = u.double()[:, None] * cdf[:, -1:]
    b = torch.searchsorted(cdf, target, right=True).clamp_(max=cdf.size(1) - 1)  # the target's block
    cols = b * S + torch.arange(S, device=b.device)
    inner = (probs.gather(1, cols.clamp(max=V - 1)) * (cols < V)).cumsum(-1, dtype=torch.float64)
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
    amp = torch.is_autocast_enabled(x.device.type)
    f = torch.promote_types(x.dtype, torch.float32)
    buf = workspace.get("logits")
    if not amp and (buf is None or buf.size(0) < rows or buf.size(1) != V or buf.dtype != f or buf.device != x.device):
        buf = workspace["logits"] = torch.empty(rows, V, dtype=f, device=x.device)
    out = torch.empty(B, dtype=torch.long, device=x.device)
    for s, e in groups:
        # under autocast the logits stay in its dtype, not copied to float32: sample_next widens them as it
        # first reads them (the same bits)
        logits = F.linear(x[s:e], weight) if amp else logits_into(x[s:e], weight, buf[:e - s])
        out[s:e] = sample_next(logits, temperature[s:e] if per_row else temperature, top_k, u[s:e], workspace)
    return out
