"""
A dual-mode GPT in one file, in the spirit of nanoGPT.

mode='generator': the usual language model (lm_head tied to the token embedding).
mode='reward':    the same trunk, the hidden state of the LAST token goes through a
                  small MLP + softmax that predicts [P(natural), P(synthetic)].

Parameter names match nanoGPT, so its checkpoints load directly (lib/checkpoint.py reads and
writes every checkpoint). GPT.generate is nanoGPT's sampling loop (with a key/value cache);
the decode engine beside this file (engine.py, as nanochat's engine.py wraps its gpt.py) drives
the model for everything else: fixed sampling noise, rows with different natural-prefix lengths
in one batch (how the reward dataset is built), a static cache captured as CUDA graphs.
"""
import copy
import inspect
import math
from dataclasses import dataclass, fields

import torch
import torch.nn as nn
from torch.nn import functional as F

from core.logprobs import LOGIT_ELEMENTS, chunked_cross_entropy, linear_logprobs, logit_budget

MODES = ("generator", "reward")
ACTIVATIONS = ("gelu", "gelu_tanh")
N_LM_FEATURES = 4  # see GPT.lm_features
N_GEN_FEATURES = 4  # see lib/reward_head.Detector.gen_features


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
    # reward mode only, with reward_lm_features: the config (a dict of GPTConfig fields) of the generator whose
    # samples the detector tells from natural text. Such a detector is lib/reward_head.Detector: a frozen copy
    # of the generator rides beside its reward head, which also reads, at every position, that generator's own
    # surprisal of the token and the trunk's log-ratio to it, log p_trunk(x_t) - log p_gen(x_t), with their
    # running means: the statistic of the ideal detector on this trunk (a likelihood-ratio test, were the trunk
    # the data), which the trunk's features alone cannot form.
    reward_gen_features: dict = None

    def __post_init__(self):
        check_mode(self.mode)
        if self.reward_gen_features and not self.reward_lm_features:
            raise ValueError("GPTConfig.reward_gen_features needs reward_lm_features (the trunk's surprisal)")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"GPTConfig.activation must be one of {ACTIVATIONS}, got {self.activation!r}")


def check_mode(mode):
    if mode not in MODES:
        raise ValueError(f"GPTConfig.mode must be 'generator' or 'reward', got {mode!r}")


# every GPTConfig field; a checkpoint stores nanoGPT's under `model_args` and ours under
# `model_extra` (lib/checkpoint.py), so nanoGPT's `GPTConfig(**ckpt['model_args'])` works on it
MODEL_ARG_KEYS = [f.name for f in fields(GPTConfig)]
NANOGPT_MODEL_ARGS = ("n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size", "dropout")
MODEL_EXTRA_KEYS = tuple(k for k in MODEL_ARG_KEYS if k not in NANOGPT_MODEL_ARGS)


def head_input_width(config):
    """The width of what a reward head reads at a position: the trunk state and the LM (and generator) features."""
    return config.n_embd + N_LM_FEATURES * bool(config.reward_lm_features) \
        + N_GEN_FEATURES * bool(config.reward_gen_features)


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


def with_running_means(f):
    """Per-token features of positions 1..T-1, (B, T-1, k), as the head reads them: (B, T, 2k), zeros at t = 0
    (no prediction there), then each feature's running mean over positions 1..t."""
    f = F.pad(f, (0, 0, 1, 0))
    count = torch.arange(f.size(1), device=f.device, dtype=f.dtype).clamp(min=1)[None, :, None]
    return torch.cat([f, f.cumsum(dim=1) / count], dim=-1)


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
            self.add_head_inputs(config)  # what the head reads besides this trunk: nothing, in a GPT
            self.reward_head = nn.Sequential(
                nn.Linear(head_input_width(config), config.reward_head_hidden_dim),
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

    def add_head_inputs(self, config):
        """Modules the reward head reads besides this trunk. A GPT has none; lib/reward_head.Detector
        (registered here, so construction draws the same random numbers) adds its generator."""
        if config.reward_gen_features:
            raise ValueError("GPTConfig.reward_gen_features: a detector that reads its generator is "
                             "lib.reward_head.Detector(config), not GPT(config) (load_model builds either)")

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

    def trunk(self, idx, n_blocks=None, kv_caches=None, pos=0, run_block=None):
        """The trunk's forward before ln_f: embeddings, then the first `n_blocks` blocks (all by
        default), shape (B, T, n_embd). train_reward_model.py caches it for frozen blocks.
        run_block(block, x, cache, pos), if given, runs each block (the decode engine's compiled step)."""
        return self.blocks(self.embed(idx, pos), n_blocks, kv_caches, pos, run_block)

    def embed(self, idx, pos=0):
        """Token plus position embeddings of idx (B, T) at positions pos.. (a tensor: a StaticDecoder step)."""
        T = idx.size(1)
        if isinstance(pos, torch.Tensor):  # a StaticDecoder step (one token; it checked the bounds)
            positions = pos.view(1)
        elif pos + T > self.config.block_size:
            raise ValueError(f"sequence of length {pos + T} exceeds block_size {self.config.block_size}")
        else:
            positions = torch.arange(pos, pos + T, dtype=torch.long, device=idx.device)
        return self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(positions))

    def blocks(self, x, n_blocks=None, kv_caches=None, pos=0, run_block=None):
        """The first n_blocks blocks (all by default) on embeddings x (B, T, n_embd)."""
        blocks = self.transformer.h if n_blocks is None else self.transformer.h[:n_blocks]
        for i, block in enumerate(blocks):
            cache = None if kv_caches is None else kv_caches[i]
            x = block(x, cache, pos) if run_block is None else run_block(block, x, cache, pos)
        return x

    def hidden_states(self, idx, kv_caches=None, pos=0, run_block=None):
        """Trunk output after ln_f, shape (B, T, n_embd)."""
        return self.transformer.ln_f(self.trunk(idx, None, kv_caches, pos, run_block))

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
        return with_running_means(torch.stack([-logp, entropy], dim=-1))

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
        self.require("reward")
        if self.config.reward_per_position:
            raise ValueError("reward_logits is for the last-token head; this model scores every "
                             "position: use position_logits / position_probs")
        return self.head_logits(self.head_input(idx, self.hidden_states(idx))[:, -1, :])

    def position_logits(self, idx):
        """Pre-softmax [natural, synthetic] scores at every position, shape (B, T, 2).
        Position t sees tokens 0..t only (causal), so it judges the prefix up to t."""
        self.require("reward")
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
        self.require("generator")
        return linear_logprobs(self.hidden_states(idx), self.lm_head.weight, targets, return_entropy,
                               temperature=temperature, max_elements=max_elements, start=start)

    def require(self, mode):
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
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
        """nanoGPT's sampling loop, with a key/value cache: max_new_tokens tokens after idx (B, T), each drawn
        from the softmax of the last logits / temperature (top_k: only the k most likely), prompt and new tokens
        within block_size. engine.Engine(model).generate decodes the same model with fixed sampling noise,
        per-row prefixes and temperatures, past block_size, over a static cache (CUDA graphs, compiled)."""
        self.require("generator")
        B, T = idx.size()
        if T + max_new_tokens > self.config.block_size:
            raise ValueError(f"{T} prompt + {max_new_tokens} new tokens exceed block_size {self.config.block_size}: "
                             f"engine.Engine(model).generate rolls the context past it")
        caches = self.new_kv_cache(B, T + max_new_tokens)
        x = self.hidden_states(idx, caches, 0)
        for t in range(T, T + max_new_tokens):
            logits = self.lm_head(x[:, -1, :]).float() / temperature
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, -1:]] = -float("inf")  # a slice: a list index is a host copy per token
            idx_next = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
            idx = torch.cat((idx, idx_next), dim=1)
            if t + 1 < T + max_new_tokens:
                x = self.hidden_states(idx_next, caches, t)
        return idx


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
