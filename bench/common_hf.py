"""
Shared by the benchmarks: the benchmark model, a Hugging Face GPT2LMHeadModel holding
the SAME weights as one of our GPTs, and a timing helper.

Our GPT uses nanoGPT's parameter names, which are also GPT-2's; the only layout
difference is that HF's Conv1D stores weights as (in, out), the transpose of nn.Linear.
"""
import os
import platform
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # run as `python bench/xyz.py` from the repository root

from model import GPT, GPTConfig  # noqa: E402

# Conv1D layers in HF GPT-2 (weights stored transposed)
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def bench_model(vocab_size=65, block_size=256, n_layer=6, n_head=6, n_embd=384, seed=0):
    """The 6-layer/6-head/384-wide benchmark GPT (random weights; speed does not depend on them)."""
    torch.manual_seed(seed)
    cfg = GPTConfig(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=block_size,
                    vocab_size=vocab_size, dropout=0.0, bias=True)
    return GPT(cfg)


def hf_copy(model, n_positions=None):
    """A transformers GPT2LMHeadModel with `model`'s weights.

    n_positions > block_size is allowed (left-padded generation runs past position
    block_size for rows with long prefixes); the extra position rows are zeros.
    """
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    c = model.config
    n_positions = n_positions or c.block_size
    hf_cfg = GPT2Config(vocab_size=c.vocab_size, n_positions=n_positions, n_embd=c.n_embd,
                        n_layer=c.n_layer, n_head=c.n_head,
                        activation_function="gelu",  # exact erf GELU, as nn.GELU()
                        layer_norm_epsilon=1e-5, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        bos_token_id=None, eos_token_id=None, pad_token_id=0,
                        tie_word_embeddings=True)
    hf = GPT2LMHeadModel(hf_cfg)
    ours = model.state_dict()
    theirs = hf.state_dict()
    with torch.no_grad():
        for k, dst in theirs.items():
            if k not in ours:
                continue  # e.g. HF's non-persistent attention buffers
            src = ours[k]
            if k.endswith(CONV1D):
                src = src.t()
            if k == "transformer.wpe.weight" and src.shape[0] < dst.shape[0]:
                dst.zero_()
                dst[:src.shape[0]].copy_(src)
                continue
            assert dst.shape == src.shape, (k, dst.shape, src.shape)
            dst.copy_(src)
    missing = [k for k in ours if k not in theirs]
    assert not missing, f"parameters with no HF counterpart: {missing}"
    assert hf.lm_head.weight.data_ptr() == hf.transformer.wte.weight.data_ptr(), "lm_head not tied"
    return hf.eval()


@torch.no_grad()
def max_logit_diff(model, hf, B=2, T=None, seed=0):
    """Max |logits_ours - logits_hf| over all positions of a random batch."""
    T = T or model.config.block_size
    idx = torch.randint(0, model.config.vocab_size, (B, T),
                        generator=torch.Generator().manual_seed(seed)).to(model.lm_head.weight.device)
    # the head on every position (forward(idx, targets) returns no logits when B * T * V is large
    # enough for its chunked loss, and forward(idx) only the last position's)
    ours = model.lm_head(model.hidden_states(idx))
    theirs = hf(idx).logits
    return (ours - theirs).abs().max().item()


def sync(device):
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def interleaved(fns, repeats, warmup=1, device="cpu"):
    """Time several callables in turns (A B C A B C ...), so that load from other
    processes on a shared machine hits all of them alike.

    Returns ({name: median wall s}, {name: [wall s]}, {name: median CPU s}). The CPU
    time (this process, all its threads) is less sensitive to other processes taking
    the cores than the wall time; with one thread it approximates an idle core."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
            sync(device)
    times = {name: [] for name in fns}
    cpu = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            sync(device)
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            sync(device)
            times[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    return ({name: statistics.median(t) for name, t in times.items()}, times,
            {name: statistics.median(c) for name, c in cpu.items()})


def machine_info():
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    import transformers
    return (f"{cpu}, {os.cpu_count()} logical CPUs, torch {torch.__version__}, "
            f"transformers {transformers.__version__}, torch threads {torch.get_num_threads()}")
