"""
A dual-mode GPT in one file, in the spirit of nanoGPT.

mode='generator': the usual language model (lm_head tied to the token embedding).
mode='reward':    the same trunk, the hidden state of the LAST token goes through a
                  small MLP + softmax that predicts [P(natural), P(synthetic)].

Parameter names match nanoGPT, so its checkpoints load directly (core/checkpoint.py reads and
writes every checkpoint). Generation uses a key/value cache and supports rows with
different natural-prefix lengths in one batch (`prefix_lens`), which is how the
reward dataset is built.
"""
import copy
import inspect
import math
import os
import weakref
from dataclasses import dataclass, fields

import torch
import torch.nn as nn
from torch.nn import functional as F

MODES = ("generator", "reward")
# GPT_DECODE=eager turns the static-cache decoder (StaticDecoder, CUDA's default) off: every caller then
# decodes with the eager loop, as before it existed (bench/gpu_check.sh measures both that way)
STATIC_DECODE = os.environ.get("GPT_DECODE", "static") != "eager"
ACTIVATIONS = ("gelu", "gelu_tanh")
N_LM_FEATURES = 4  # see GPT.lm_features


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304  # GPT-2's 50257 padded up to a multiple of 64
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True  # biases in Linears and LayerNorms, like GPT-2
    mode: str = "generator"  # 'generator' | 'reward'
    reward_head_hidden_dim: int = 256
    # reward mode only. False: the design's head on the last position. True: the head scores
    # every position t (natural iff t < K) and the sequence's P(natural) is the mean over
    # positions, so a perfect detector's sequence score equals K/N.
    reward_per_position: bool = False
    # MLP non-linearity: 'gelu' is the exact (erf) GELU of nanoGPT; 'gelu_tanh' is the tanh
    # approximation GPT-2 was trained with (Hugging Face's 'gelu_new'), set for imported weights
    activation: str = "gelu"
    # reward mode only: the head also gets, at every position t, the surprisal -log p(x_t | x_<t)
    # and the entropy of the trunk's own next-token prediction (through the tied embedding),
    # and their running means over positions <= t (evidence accumulates along the prefix).
    # A trunk taken from a stronger LM than the generator then hands the detector that LM's
    # judgement of each token directly, which hidden states alone give up only slowly.
    reward_lm_features: bool = False

    def __post_init__(self):
        check_mode(self.mode)
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"GPTConfig.activation must be one of {ACTIVATIONS}, got {self.activation!r}")


def check_mode(mode):
    if mode not in MODES:
        raise ValueError(f"GPTConfig.mode must be 'generator' or 'reward', got {mode!r}")


# every GPTConfig field; a checkpoint stores nanoGPT's under `model_args` and ours under
# `model_extra` (core/checkpoint.py), so nanoGPT's `GPTConfig(**ckpt['model_args'])` works on it
MODEL_ARG_KEYS = [f.name for f in fields(GPTConfig)]
NANOGPT_MODEL_ARGS = ("n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size", "dropout")
MODEL_EXTRA_KEYS = tuple(k for k in MODEL_ARG_KEYS if k not in NANOGPT_MODEL_ARGS)


def split_model_args(config):
    """(model_args, model_extra) of a GPTConfig: nanoGPT's fields exactly, and the rest."""
    return ({k: getattr(config, k) for k in NANOGPT_MODEL_ARGS},
            {k: getattr(config, k) for k in MODEL_EXTRA_KEYS})


class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (PyTorch's has no bias=False before 2.1)."""

    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):

    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = config.dropout
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.n_embd = config.n_embd

    def forward(self, x, kv_cache=None, pos=0):
        """x: (B, T, C). With kv_cache=(k, v) of shape (B, nh, T_max, hs), the new keys
        and values are written at [pos, pos+T) and attention runs over [0, pos+T)."""
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        hs = C // self.n_head
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)
        dropout = self.attn_dropout if self.training else 0.0
        if kv_cache is None:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
        elif isinstance(pos, torch.Tensor):  # a step of StaticDecoder: no shape depends on the position
            y = self._static_attention(q, k, v, kv_cache, pos)
        else:
            k_cache, v_cache = kv_cache
            k_cache[:, :, pos:pos + T] = k
            v_cache[:, :, pos:pos + T] = v
            k_all = k_cache[:, :, :pos + T]
            v_all = v_cache[:, :, :pos + T]
            if T == 1:  # one new token sees every cached position: no mask needed
                # explicit matmuls, not SDPA: for a single query the CPU SDPA kernel splits the
                # keys across threads depending on the batch size, so a row's result would
                # depend on its batch mates; this form is batch- and thread-count-invariant
                # (prepare_reward_data.py relies on it) and just as fast here
                att = (q @ k_all.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
                y = att.softmax(dim=-1) @ v_all
            elif pos == 0:
                y = F.scaled_dot_product_attention(q, k_all, v_all, is_causal=True)
            else:  # a chunk appended to a filled cache: causal w.r.t. absolute positions
                qpos = torch.arange(pos, pos + T, device=x.device)[:, None]
                kpos = torch.arange(pos + T, device=x.device)[None, :]
                y = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=kpos <= qpos)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))

    @staticmethod
    def _static_attention(q, k, v, kv_cache, pos):
        """One query per row at position `pos` (a 0-dim tensor) over a static cache: kv_cache is
        (k_cache, v_cache, unseen, write). The new key and value go to column pos of the rows where
        `write` (a (B,) bool tensor, or None for all) holds, the others keep theirs; attention runs
        over the first `span` = len(unseen) columns, those where `unseen` (arange(span) > pos, made once
        per step) holds masked, so a CUDA graph of this step serves every position up to span.
        The same explicit form as the eager loop's single-token step on every device: the CPU tests run
        what a GPU runs (SDPA would want a 4-D mask and picks other kernels, with other rounding, per device)."""
        k_cache, v_cache, unseen, write = kv_cache
        span, at = unseen.size(0), pos.view(1)
        if write is not None:  # rows still inside their prefill keep the prefill's keys and values
            keep = write.view(-1, 1, 1, 1)
            k = torch.where(keep, k.to(k_cache.dtype), k_cache.index_select(2, at))
            v = torch.where(keep, v.to(v_cache.dtype), v_cache.index_select(2, at))
        k_cache.index_copy_(2, at, k.to(k_cache.dtype))
        v_cache.index_copy_(2, at, v.to(v_cache.dtype))
        keys, values = k_cache[:, :, :span], v_cache[:, :, :span]
        att = (q @ keys.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))
        return att.masked_fill(unseen, float("-inf")).softmax(dim=-1) @ values


class MLP(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU(approximate="tanh" if config.activation == "gelu_tanh" else "none")
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    """Pre-norm transformer block."""

    def __init__(self, config):
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x, kv_cache=None, pos=0):
        x = x + self.attn(self.ln_1(x), kv_cache, pos)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):

    def __init__(self, config):
        super().__init__()
        assert config.vocab_size is not None and config.block_size is not None
        check_mode(config.mode)
        # a copy of its own: changing the caller's config later (e.g. `config.mode = 'reward'`
        # to build a reward model from the same object) must not change this live model
        config = copy.deepcopy(config)
        self.config = config

        # shared trunk
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=LayerNorm(config.n_embd, bias=config.bias),
        ))
        # task heads
        if config.mode == "generator":
            self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
            self.transformer.wte.weight = self.lm_head.weight  # weight tying
        else:
            self.reward_head = nn.Sequential(
                nn.Linear(config.n_embd + N_LM_FEATURES * config.reward_lm_features, config.reward_head_hidden_dim),
                nn.ReLU(),
                nn.Linear(config.reward_head_hidden_dim, 2),  # scores for [natural, synthetic]
                nn.Softmax(dim=-1),
            )

        self.apply(self._init_weights)
        # GPT-2: residual projections scaled by 1/sqrt(2 * n_layer)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))
        if config.mode == "reward":
            self.init_reward_head()
        self.logit_budget = LOGIT_ELEMENTS  # of the device the weights are on (_apply)

    def _apply(self, fn, *args, **kwargs):
        """nn.Module's move or cast (.to, .cuda, ...), which also sets the logit budget of the device the
        model is now on: forward reads a plain int (a constant to torch.compile, not a device query)."""
        out = super()._apply(fn, *args, **kwargs)
        self.logit_budget = logit_budget(self.transformer.wte.weight.device)
        return out

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def init_reward_head(self):
        """He init for the ReLU layer; a zero output layer so a fresh head predicts
        exactly [0.5, 0.5] (the constant predictor) and learns from there."""
        hidden, out = self.reward_head[0], self.reward_head[2]
        nn.init.kaiming_normal_(hidden.weight, nonlinearity="relu")
        nn.init.zeros_(hidden.bias)
        nn.init.zeros_(out.weight)
        nn.init.zeros_(out.bias)

    def get_num_params(self, non_embedding=True):
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.transformer.wpe.weight.numel()
        return n

    # ------------------------------------------------------------------ forward

    def trunk(self, idx, n_blocks=None, kv_caches=None, pos=0):
        """The trunk's forward before ln_f: embeddings, then the first `n_blocks` blocks (all by
        default), shape (B, T, n_embd). train_reward_model.py caches it for frozen blocks."""
        B, T = idx.size()
        if isinstance(pos, torch.Tensor):  # a StaticDecoder step (one token; it checked the bounds)
            positions = pos.view(1)
        elif pos + T > self.config.block_size:
            raise ValueError(f"sequence of length {pos + T} exceeds block_size {self.config.block_size}")
        else:
            positions = torch.arange(pos, pos + T, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(positions))
        blocks = self.transformer.h if n_blocks is None else self.transformer.h[:n_blocks]
        for i, block in enumerate(blocks):
            x = block(x, None if kv_caches is None else kv_caches[i], pos)
        return x

    def hidden_states(self, idx, kv_caches=None, pos=0):
        """Trunk output after ln_f, shape (B, T, n_embd)."""
        return self.transformer.ln_f(self.trunk(idx, None, kv_caches, pos))

    def forward(self, idx, targets=None):
        x = self.hidden_states(idx)
        if self.config.mode == "generator":
            if targets is not None and targets.numel() * self.config.vocab_size > self.logit_budget:
                # a large vocabulary: the loss in position chunks, never the whole (B, T, V) logits,
                # so no logits to return (every caller with targets reads only the loss)
                logits, loss = None, chunked_cross_entropy(x, self.lm_head.weight, targets)
            elif targets is not None:
                logits = self.lm_head(x)
                loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                                       ignore_index=-1)
            else:
                logits = self.lm_head(x[:, [-1], :])  # only the last position is needed
                loss = None
            return logits, loss
        x = self.head_input(idx, x)
        if self.config.reward_per_position:
            probs = F.softmax(self.head_logits(x).float(), dim=-1).mean(dim=1)
        else:
            probs = self.reward_head(x[:, -1, :])  # (B, 2): [P(natural), P(synthetic)]
        loss = F.mse_loss(probs, targets) if targets is not None else None
        return probs, loss

    def lm_features(self, idx, x, max_elements=None):
        """(B, T, 4): surprisal of token t under the trunk's next-token prediction from t-1,
        that prediction's entropy (zeros at t = 0, which has no prediction), and the running
        means of both over positions 1..t. The logits are formed in chunks of positions
        (linear_logprobs), so a 50k vocabulary needs bounded memory at any batch size."""
        # the tied embedding is the LM head: state t-1 predicts token t
        logp, entropy = linear_logprobs(x[:, :-1], self.transformer.wte.weight, idx[:, 1:], True, max_elements=max_elements)
        f = F.pad(torch.stack([-logp, entropy], dim=-1), (0, 0, 1, 0))  # zeros at t = 0
        count = torch.arange(f.size(1), device=f.device, dtype=f.dtype).clamp(min=1)[None, :, None]
        return torch.cat([f, f.cumsum(dim=1) / count], dim=-1)

    def head_input(self, idx, x):
        """What the reward head reads at each position: the trunk state, plus the LM
        features when the config asks for them."""
        if not self.config.reward_lm_features:
            return x
        return torch.cat([x, self.lm_features(idx, x).to(x.dtype)], dim=-1)

    def head_logits(self, x):
        """The reward head without its softmax (its logits [natural, synthetic]), on head inputs
        (head_input) of any leading shape."""
        for layer in list(self.reward_head)[:-1]:
            x = layer(x)
        return x

    def reward_logits(self, idx):
        """Pre-softmax reward scores (B, 2) of the last-token head, for numerically stable
        cross-entropy. A per-position model has no single logit pair: use position_logits."""
        self._require("reward")
        if self.config.reward_per_position:
            raise ValueError("reward_logits is for the last-token head; this model scores every "
                             "position: use position_logits / position_probs")
        return self.head_logits(self.head_input(idx, self.hidden_states(idx))[:, -1, :])

    def position_logits(self, idx):
        """Pre-softmax [natural, synthetic] scores at every position, shape (B, T, 2).
        Position t sees tokens 0..t only (causal), so it judges the prefix up to t."""
        self._require("reward")
        return self.head_logits(self.head_input(idx, self.hidden_states(idx)))

    def position_probs(self, idx):
        """P(natural) at every position, shape (B, T). For a per-position model the mean over
        T is the sequence's P(natural) that forward() returns; for a last-token model only the
        last column is what it was trained on."""
        return F.softmax(self.position_logits(idx).float(), dim=-1)[..., 0]

    def token_logprobs(self, idx, targets, return_entropy=False, max_elements=None, temperature=1.0, start=0):
        """log p(targets[:, t] | idx[:, :t+1]) for every position, shape (B, T), under
        softmax(logits / temperature): the distribution generate(..., temperature) samples from.

        Logits are formed in chunks of positions (linear_logprobs), so memory stays bounded
        with a 50k vocabulary at any batch size, in backward too. With return_entropy, also
        the entropy of the predictive distribution at each position.

        start: only positions start.. go through the vocabulary-wide head, shape (B, T - start): the
        columns start.. of the full call (GRPO reads only the completion's; the trunk still runs on all).
        """
        self._require("generator")
        return linear_logprobs(self.hidden_states(idx), self.lm_head.weight, targets, return_entropy,
                               temperature=temperature, max_elements=max_elements, start=start)

    def _require(self, mode):
        if self.config.mode != mode:
            raise ValueError(f"this operation needs a {mode} model, but the model is in "
                             f"{self.config.mode!r} mode")

    # ------------------------------------------------------------------ training helpers

    def crop_block_size(self, block_size):
        assert block_size <= self.config.block_size
        self.config.block_size = block_size
        self.transformer.wpe.weight = nn.Parameter(self.transformer.wpe.weight[:block_size])

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        """AdamW over trainable parameters; weight decay on matrices only (as nanoGPT)."""
        groups = adamw_param_groups(self.parameters(), weight_decay)
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, **fused_optimizer_kwargs(device_type))

    # ------------------------------------------------------------------ generation

    def new_kv_cache(self, batch_size, length, device=None, dtype=None):
        p = self.transformer.wte.weight
        c = self.config
        shape = (batch_size, c.n_head, length, c.n_embd // c.n_head)
        return [(torch.empty(shape, device=device or p.device, dtype=dtype or p.dtype),
                 torch.empty(shape, device=device or p.device, dtype=dtype or p.dtype))
                for _ in range(c.n_layer)]

    @torch.no_grad()
    def generate(self, idx, max_new_tokens=None, temperature=1.0, top_k=None,
                 prefix_lens=None, generator=None, seed=None, uniforms=None, prefill_len=None, static=None):
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

        static: decode over a static cache (StaticDecoder: on CUDA each step is a replayed CUDA
        graph, no host synchronisation per token); default: on CUDA, for a model that is not
        training with dropout, unless GPT_DECODE=eager. The same tokens as the eager loop
        (tests/test_static_decode.py).
        """
        self._require("generator")
        B, T = idx.size()
        if max_new_tokens is None:
            max_new_tokens = self.config.block_size - T
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
        if T_out > self.config.block_size:
            return self._generate_rolling(idx, T_out, temperature, top_k, prefix_lens, uniforms)
        if static is None:
            static = STATIC_DECODE and idx.device.type == "cuda" and not (self.training and self.config.dropout > 0)
        if static:
            return StaticDecoder.run(self, idx, T_out, temperature, top_k, prefix_lens, uniforms, prefill_len)

        if isinstance(prefill_len, torch.Tensor) and prefill_len.numel() > 1:
            raise ValueError("a per-row prefill_len needs the static-cache decoder: pass static=True")
        P = int(prefix_lens.min()) if prefill_len is None else int(prefill_len)
        if not 1 <= P <= int(prefix_lens.min()):
            raise ValueError("prefill_len must be in [1, min(prefix_lens)]")
        out = torch.empty((B, T_out), dtype=idx.dtype, device=idx.device)
        out[:, :T] = idx
        caches = self.new_kv_cache(B, T_out)
        workspace = {}  # logits and sampling buffers reused by every step
        x = self.hidden_states(out[:, :P], caches, 0)
        for t in range(P, T_out):
            nxt = head_sample(x[:, -1, :], self.lm_head.weight, temperature, top_k, uniforms[:, t], workspace)
            if t < T:  # rows still inside their prefix keep the given token
                nxt = torch.where(prefix_lens > t, out[:, t], nxt)
            out[:, t] = nxt
            if t + 1 < T_out:
                x = self.hidden_states(out[:, t:t + 1], caches, t)
        return out

    def _generate_rolling(self, idx, T_out, temperature, top_k, prefix_lens, uniforms):
        """Generation past block_size: when the cache is full, keep the last half
        block of context, prefill it again and continue (rare, sample.py only)."""
        if int(prefix_lens.min()) != idx.size(1):
            raise ValueError("mixed prefix lengths need the total length to fit in block_size")
        out = idx
        keep = self.config.block_size // 2
        while out.size(1) < T_out:
            ctx = out[:, -keep:] if out.size(1) > keep else out
            n = min(T_out - out.size(1), self.config.block_size - ctx.size(1))
            u = torch.cat([uniforms[:, out.size(1) - ctx.size(1):out.size(1)],
                           uniforms[:, out.size(1):out.size(1) + n]], dim=1)
            new = self.generate(ctx, n, temperature, top_k, uniforms=u)
            out = torch.cat([out, new[:, ctx.size(1):]], dim=1)
        return out


# How many vocabulary-wide values (one float32 each) one chunk of positions may form at once, chosen
# by memory. On CPU 2**25, 128 MiB per (positions, V) tensor whatever the batch size (linear_logprobs
# also keeps a chunk near the cache, positions_per_chunk, so at GPT-2's 50257 columns a chunk is far
# smaller). On a GPU the whole logits wherever they fit: a chunk holds about three (positions, V)
# float32 tensors (logits, their log-softmax, the gradient), so the budget is LOGIT_MEMORY_FRACTION of
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


# Vocabulary columns per matmul of _head_logits on CPU for a narrow head (width <= 256, where writing the
# logits bounds the matmul): one (4096, width) slice of the head is read once per chunk of rows and
# stays in cache while its (rows, 4096) logits are written, instead of the whole (V, width) head
# streaming past a (rows, V) output; each logit has the same bits either way. A wide head's matmul
# is bound by arithmetic and runs whole.
HEAD_COLS = 4096
BACKWARD_ROWS = 128  # rows per chunk of LinearLogprob.backward: its (rows, HEAD_COLS) blocks bound the memory


def _head_logits(x, weight, out):
    """x @ weight.T into the float32 buffer out: in place, since on CPU a fresh (chunk, V) tensor per
    chunk costs more in page faults than the matmul; through F.linear under autocast (its dtype)."""
    if torch.is_autocast_enabled(x.device.type) or x.dtype != out.dtype:
        return out.copy_(F.linear(x, weight))
    V = weight.size(0)
    if x.device.type != "cpu" or V <= 2 * HEAD_COLS or x.size(1) > 256:
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
    # a third buffer only where needed: with a wide head one chunk's is 100 MB of fresh pages
    z = torch.empty_like(raw) if want_entropy or any(t != 1 for t in temps) else None
    for s in range(0, N, n):
        e = min(s + n, N)
        rc, y = _head_logits(x[s:e], weight, raw[:e - s]), targets[s:e, None]
        for i, t in enumerate(temps):
            zc, lc = (torch.div(rc, t, out=z[:e - s]) if t != 1 else rc), ls[:e - s]  # x / 1 == x
            torch.log_softmax(zc, dim=-1, out=lc)
            logp[i, s:e] = lc.gather(1, y).squeeze(1)
            lse[i, s:e] = zc.gather(1, y).squeeze(1) - logp[i, s:e]
            if want_entropy:  # p from softmax (its exp is faster than torch.exp), into the free buffer
                p = torch.softmax(zc, dim=-1, out=(z if t == 1 else raw)[:e - s])  # raw is spent then
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
                lp = _head_logits(xr, weight[c:k], zbuf[:m * (k - c)].view(m, k - c))
                lp = (lp.div_(t) if t != 1 else lp).sub_(lr[:, None])
            p = torch.exp(lp, out=pbuf[:m * (k - c)].view(m, k - c))
            grad = p.mul_(lp.mul_(ar[:, None]).add_(br[:, None]))  # in place: lp is spent
            if sanitize:
                grad.nan_to_num_(0.0, 0.0, 0.0)  # their dlogits are zeros
            gx = (grad @ weight[c:k]).to(f)  # autocast's dtype: accumulated in float32
            if live is None:
                dx[r:e] += gx
            else:
                dx[r:e].index_add_(0, live, gx)
            dw[c:k].addmm_(grad.T, xr.to(f))  # in place: float32 accumulation, never autocast
    return dx, dw


def _backward_saved_rows(logp, x, weight, kept, a, b, f):
    """dx and dW from the forward's log-probs of the computed rows `kept` (a GPU's single chunk): the
    other rows' dlogits are zeros, so no logits are formed again and no row is visited twice."""
    ak, bk = a[kept][:, None], b[kept][:, None]
    grad = logp.exp().mul_(logp * ak + bk)
    dx = torch.zeros(x.shape, dtype=f, device=x.device).index_add_(0, kept, (grad @ weight).to(f))
    dw = torch.zeros(weight.shape, dtype=f, device=x.device).addmm_(grad.T, x[kept].to(f))  # float32, in place
    return dx, dw


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


def adamw_param_groups(params, weight_decay):
    """nanoGPT's AdamW parameter groups over the trainable `params`: weight decay on matrices
    (dim >= 2: Linear weights, embeddings), none on biases and LayerNorm gains."""
    params = [p for p in params if p.requires_grad]
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def fused_optimizer_kwargs(device_type):
    """{'fused': True} for Adam/AdamW where torch has a fused kernel: CUDA, and CPU since torch 2.4.
    One pass over each parameter instead of a dozen elementwise ops per parameter; the same
    update up to float rounding, a few percent faster per step on CPU (docs/benchmarks.md, "Detector training")."""
    if device_type not in ("cuda", "cpu") or "fused" not in inspect.signature(torch.optim.AdamW).parameters:
        return {}
    if device_type == "cpu" and tuple(int(v) for v in torch.__version__.split(".")[:2]) < (2, 4):
        return {}
    return {"fused": True}


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

    def forward(self, idx, caches, pos):
        return self.model.hidden_states(idx, caches, pos)


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
        self.caches = [(k.zero_(), v.zero_()) for k, v in model.new_kv_cache(rows, length, dtype=dtype)]
        half = dtype != model.lm_head.weight.dtype  # under autocast: the matrices in its dtype
        self.half = {f"model.{n}": p.detach().to(dtype) for n, p in model.named_parameters()
                     if half and n.startswith("transformer.h.") and (".attn.c_" in n or ".mlp.c_" in n)}
        self.head = model.lm_head.weight.detach().to(dtype) if half else None
        self.graphs = {} if dev.type == "cuda" else None
        self.pool = None
        self.ptrs = weight_pointers(model)  # a graph reads these addresses: other weights, other decoder
        self.workspace = {}

    @staticmethod
    def run(model, idx, length, temperature, top_k, prefix_lens, uniforms, prefill_len):
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
        for span in spans:  # captured before the buffers are loaded: a capture's warm-up step writes them
            dec.graph(trunk, greedy, top_k, span, mixed)
        dec.load(trunk, idx[rows], uniforms[rows], prefix_lens[rows], prefill[rows], temps.to(idx.device)[rows])
        dec.prefill_groups(trunk, lengths)
        dec.pos.fill_(lengths[0])
        for t in range(lengths[0], length):
            span = min(length, -(-(t + 1) // SPAN) * SPAN)
            if dec.graphs is None:
                dec.step(trunk, greedy, top_k, span, mixed)
            else:
                with torch.cuda.device(idx.device):  # replayed on cuda:N's stream
                    dec.graphs[(greedy, top_k, span, mixed)].replay()
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

    def trunk_call(self, trunk, idx, caches, pos):
        if not self.half:
            return trunk(idx, caches, pos)
        return torch.func.functional_call(trunk, self.half, (idx, caches, pos), tie_weights=False, strict=False)

    def step(self, trunk, greedy, top_k, span, mixed):
        """Position pos for every row: the token (sampled from h, or the given one inside the prefix),
        then the trunk on it (its key and value at pos, the new h); pos += 1."""
        at = self.pos.view(1)
        head = trunk.model.lm_head.weight if self.head is None else self.head
        u = self.uniforms.index_select(1, at).view(-1)
        sampled = head_sample(self.h, head, 0 if greedy else self.temperature, top_k, u, self.workspace)
        given = self.out.index_select(1, at).view(-1)
        active = self.prefill <= self.pos  # rows past their prefill
        tok = torch.where(active & (self.prefix <= self.pos), sampled, given)
        self.out.index_copy_(1, at, tok.view(-1, 1))
        unseen = torch.arange(span, device=self.pos.device) > self.pos  # the columns attention masks
        caches = [(k, v, unseen, active if mixed else None) for k, v in self.caches]
        x = self.trunk_call(trunk, tok.view(-1, 1), caches, self.pos)[:, -1]
        self.h.copy_(torch.where(active.view(-1, 1), x.to(self.h.dtype), self.h) if mixed else x)
        self.pos.add_(1)

    def graph(self, trunk, greedy, top_k, span, mixed):
        """On CUDA, the graph of step(...), captured on first use after a warm-up step on a side stream
        (both write the decoder's buffers: call it before loading them)."""
        key = (greedy, top_k, span, mixed)
        if self.graphs is None or key in self.graphs:
            return
        self.pos.zero_()
        # autocast's cache of casts must not hand the graph a tensor it frees when its context closes
        amp = torch.autocast("cuda", dtype=torch.get_autocast_dtype("cuda"), enabled=torch.is_autocast_enabled("cuda"),
                             cache_enabled=False)
        with torch.cuda.device(self.out.device):  # cuda:N's streams, not the current device's
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side), amp:
                self.step(trunk, greedy, top_k, span, mixed)
            torch.cuda.current_stream().wait_stream(side)
            self.pos.zero_()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=self.pool), amp:
                self.step(trunk, greedy, top_k, span, mixed)
        self.pool = self.pool or g.pool()
        self.graphs[key] = g


def weight_pointers(model):
    return tuple(p.data_ptr() for p in model.parameters())


_DECODERS = weakref.WeakKeyDictionary()  # model -> {(rows, length, dtype, autocast): StaticDecoder}, a cache
