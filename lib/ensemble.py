"""
An ensemble of K generator GPTs as one generator (Kim, Kotha, Liang, Hashimoto 2025, "Pre-training under infinite
compute": with limited data an ensemble of K independently trained models beats one, and one model distilled from
it, train_distill.py, keeps most of the gain).

Ensemble(members): its next-token distribution is the mean of the members' probabilities; its logits are
log(mean_k softmax(z_k)) (a log-sum-exp of the log-softmaxes minus log K), so softmax(logits / T) samples it at
temperature T. It takes a GPT's place where the project takes a generator:
  forward(idx, targets=None)     GPT.forward's (logits, loss)
  token_logprobs, logprobs_at_temperatures   scores in chunks of positions, at any vocabulary (lib/heldout, a judge)
  hidden_states, lm_head, new_kv_cache   what engine.Engine's eager loop and experiment/measures' val scoring read
      of a GPT: here the "hidden state" is the mixture's log-probabilities, each member running over its own KV
      cache, and the head is the identity (V x V: vocabularies up to IDENTITY_HEAD_MAX_VOCAB, a char corpus's)
  generate                       GPT.generate's signature, through the Engine (its eager loop: static_decoding)
load_ensemble reads the members' checkpoints (lib/checkpoint, weights_only=True); member_summaries and
training_flops sum what training the members cost. mixture_logprobs and distillation_loss are train_distill.py's
objective; forward_flops is experiment/flops.forward_flops' count, for the scripts that may not import experiment/.
"""
import copy
import json
import math
import os
from types import SimpleNamespace

import torch
import torch.nn as nn
from torch.nn import functional as F

from core.errors import ProjectError
from core.logprobs import logit_budget, positions_per_chunk
from engine import Engine
from lib.checkpoint import checkpoint_tokenization, load_model
from tokenization_manager import check_tokenization_match

# the identity head forms V x V weights and V x V FLOPs a position: a char vocabulary's 65 costs nothing, GPT-2's
# 50304 would take 10 GB (score such an ensemble with token_logprobs / logprobs_at_temperatures instead)
IDENTITY_HEAD_MAX_VOCAB = 4096
SUMMARY_NAME = "train_summary.json"  # train.py's record beside its ckpt.pt


class EnsembleError(ProjectError, ValueError):
    """Models that cannot form one ensemble (a reward model, another vocabulary or context)."""


def mixture_logprobs(hidden, heads):
    """log(mean_k softmax(hidden[k] @ heads[k].T)), float32 (N, V), from K rows (N, C_k) and heads (V, C_k): a
    running log-sum-exp, so a few (N, V) buffers at any K."""
    acc = None
    for h, w in zip(hidden, heads):
        lp = torch.log_softmax(F.linear(h, w).float(), dim=-1)
        acc = lp if acc is None else torch.logaddexp(acc, lp)
    return acc if len(heads) == 1 else acc - math.log(len(heads))


def check_members(members, names):
    """An EnsembleError unless every member is a generator with the first one's vocabulary and block size."""
    if not members:
        raise EnsembleError("an ensemble needs at least one member")
    first = members[0].config
    for m, name in zip(members, names):
        mode = getattr(getattr(m, "config", None), "mode", None)
        if mode != "generator":
            raise EnsembleError(f"{name} is a {mode} model: an ensemble's members are generators",
                                "pass generator checkpoints (train.py's ckpt.pt)")
        for field in ("vocab_size", "block_size"):
            if getattr(m.config, field) != getattr(first, field):
                raise EnsembleError(f"{name} has {field} {getattr(m.config, field)} but {names[0]} has "
                                    f"{getattr(first, field)}: an ensemble's members share one vocabulary and context",
                                    "ensemble generators trained on the same corpus with the same block_size")


class Ensemble(nn.Module):
    """K generator GPTs (same vocab_size and block_size) as one generator: the mean of their probabilities."""

    static_decoding = False  # engine.Engine decodes it with its eager loop: there is no one trunk to capture

    def __init__(self, members, names=None):
        super().__init__()
        members = list(members)
        names = list(names) if names is not None else [f"member {i}" for i in range(len(members))]
        check_members(members, names)
        self.members = nn.ModuleList(members)
        self.names = names
        self.config = copy.deepcopy(members[0].config)  # its vocab_size, block_size and mode are the ensemble's
        self.identity = {}  # (device, dtype) -> the V x V identity of lm_head

    @property
    def heads(self):
        return [m.lm_head.weight for m in self.members]

    @property
    def logit_budget(self):
        return logit_budget(self.heads[0].device)

    def require(self, mode):
        if mode != "generator":
            raise ValueError(f"this operation needs a {mode} model, but an Ensemble is a generator")

    def get_num_params(self, non_embedding=True):
        return sum(m.get_num_params(non_embedding) for m in self.members)

    def member_states(self, idx, kv_caches=None, pos=0):
        """Each member's final hidden states (B, T, C_k), over its own cache where kv_caches (new_kv_cache's)
        are given."""
        caches = kv_caches if kv_caches is not None else [None] * len(self.members)
        return [m.hidden_states(idx, c, pos) for m, c in zip(self.members, caches)]

    def log_probs(self, idx, kv_caches=None, pos=0):
        """The mixture's log-probabilities at every position of idx, float32 (B, T, V)."""
        B, T = idx.shape
        hs = self.member_states(idx, kv_caches, pos)
        return mixture_logprobs([h.reshape(B * T, -1) for h in hs], self.heads).view(B, T, -1)

    # ------------------------------------------------------------------ a GPT's decode interface (engine.py)

    def new_kv_cache(self, batch_size, length, device=None, dtype=None):
        return [m.new_kv_cache(batch_size, length, device, dtype) for m in self.members]

    def hidden_states(self, idx, kv_caches=None, pos=0, run_block=None):
        """The mixture's log-probabilities (B, T, V), which lm_head (the identity) maps to themselves."""
        if run_block is not None:
            raise ValueError("an Ensemble has no blocks of its own for run_block: decode it with the eager loop")
        return self.log_probs(idx, kv_caches, pos)

    @property
    def lm_head(self):
        """The identity head over hidden_states (the log-probabilities): .weight, (V, V) float32."""
        V, dev = self.config.vocab_size, self.heads[0].device
        if V > IDENTITY_HEAD_MAX_VOCAB:
            raise EnsembleError(f"an ensemble of {V}-token generators has no head of hidden_states under "
                                f"{IDENTITY_HEAD_MAX_VOCAB} tokens (its identity would be {V} x {V})",
                                "score it with Ensemble.token_logprobs / logprobs_at_temperatures")
        if dev not in self.identity:
            self.identity = {dev: torch.eye(V, device=dev)}
        return SimpleNamespace(weight=self.identity[dev])

    # ------------------------------------------------------------------ a GPT's forward and scores

    def forward(self, idx, targets=None):
        """GPT.forward's (logits, loss) for a generator: without targets the last position's logits (B, 1, V); with
        them the mean NLL (targets -1 unscored) and every position's logits, or None past the logit budget."""
        if targets is None:
            return self.last_logits(idx), None
        V = self.config.vocab_size
        if targets.numel() * V > self.logit_budget:
            scored = targets != -1
            logp = self.token_logprobs(idx, targets.clamp(min=0))
            return None, -(logp * scored).sum() / scored.sum()
        logits = self.log_probs(idx)
        return logits, F.nll_loss(logits.view(-1, V), targets.reshape(-1), ignore_index=-1)

    def last_logits(self, idx):
        hs = [h[:, -1] for h in self.member_states(idx)]
        return mixture_logprobs(hs, self.heads)[:, None, :]

    def token_logprobs(self, idx, targets, return_entropy=False, max_elements=None, temperature=1.0, start=0):
        """GPT.token_logprobs: log p(targets[:, t] | idx[:, :t+1]) under softmax(logits / temperature), (B, T - start),
        and with return_entropy each prediction's entropy; in chunks of positions (no (B, T, V) tensor)."""
        logp, ent = self.scores(idx, targets, [temperature], return_entropy, max_elements, start)
        return (logp[0], ent) if return_entropy else logp[0]

    def logprobs_at_temperatures(self, idx, targets, temps, max_elements=None):
        """core.logprobs.logprobs_at_temperatures of the mixture: (len(temps), B, T) log-probs of targets."""
        return self.scores(idx, targets, temps, False, max_elements)[0]

    def scores(self, idx, targets, temps, want_entropy=False, max_elements=None, start=0):
        """(log-probs (len(temps), B, T - start), entropies (B, T - start) or None) under softmax(logits / T)."""
        assert not want_entropy or len(temps) == 1, "the entropy is for one temperature"
        hs = [h[:, start:].reshape(-1, h.size(-1)) for h in self.member_states(idx)]
        shape, y = targets[:, start:].shape, targets[:, start:].reshape(-1)
        n = positions_per_chunk(self.config.vocab_size, 0, max_elements, y.device)
        logp = torch.empty(len(temps), y.numel(), device=y.device)
        ent = torch.empty(y.numel(), device=y.device) if want_entropy else None
        for s in range(0, y.numel(), n):
            lp = mixture_logprobs([h[s:s + n] for h in hs], self.heads)
            for i, t in enumerate(temps):
                ls = torch.log_softmax(lp if t == 1 else lp / t, dim=-1)
                logp[i, s:s + n] = ls.gather(1, y[s:s + n, None]).squeeze(1)
                if want_entropy:
                    ent[s:s + n] = -(ls.exp() * ls).sum(-1)
        return logp.view(len(temps), *shape), (ent.view(shape) if want_entropy else None)

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
        """GPT.generate's sampling (max_new_tokens after idx, at temperature, top_k), by engine.Engine's eager loop."""
        return Engine(self).generate(idx, max_new_tokens, temperature=temperature, top_k=top_k)


# ----------------------------------------------------------------------------- checkpoints and their cost

def split_paths(paths):
    """A comma-separated string or a list of paths -> the list (blank entries dropped)."""
    items = paths.split(",") if isinstance(paths, str) else list(paths)
    return [os.fspath(p).strip() for p in items if os.fspath(p).strip()]


def load_ensemble(paths, device="cpu", flag="ensemble member"):
    """The Ensemble of generator checkpoints `paths` (a list, or comma-separated), in eval mode on device; flag names
    them in errors (a script's flag). Members that record their tokenization must agree on it. Sets .tokenization
    (the first record, or None) and .sources ([{path, model_args}])."""
    paths = split_paths(paths)
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise EnsembleError(f"{flag} {missing[0]}: no such checkpoint file", "pass generator checkpoints (ckpt.pt "
                            "of train.py runs), comma-separated")
    models, infos = [], []
    for p in paths:
        model, ckpt, _ = load_model(p, device=device, require_mode="generator")
        models.append(model)
        infos.append((p, checkpoint_tokenization(ckpt), ckpt["model_args"]))
    known = [(p, info) for p, info, _ in infos if info is not None]
    for p, info in known[1:]:
        check_tokenization_match(info, known[0][1], what=f"{flag} {p} (against {known[0][0]})")
    ens = Ensemble(models, names=[f"{flag} {p}" for p in paths]).eval()
    ens.tokenization = known[0][1] if known else None
    ens.sources = [{"path": os.path.abspath(p), "model_args": dict(args)} for p, _, args in infos]
    return ens


def member_summaries(paths):
    """Each member's train.py record (train_summary.json beside its checkpoint), None where it has none."""
    out = []
    for p in split_paths(paths):
        path = os.path.join(os.path.dirname(os.path.abspath(p)), SUMMARY_NAME)
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                out.append(json.load(f))
        else:
            out.append(None)
    return out


def training_flops(paths, count):
    """What training every member cost: count (experiment/flops.step_train, passed in by the experiment's code)
    of each member's train_summary.json, summed: {"flops", "detail": {"members": [...]}}, or None when a member's
    cost is unknown (no record)."""
    parts = [count(rec) if rec is not None else None for rec in member_summaries(paths)]
    if not parts or any(p is None for p in parts):
        return None
    return {"flops": float(sum(p["flops"] for p in parts)), "detail": {"members": parts}}


def forward_flops(model_args, context=None):
    """Forward FLOPs per token of a generator with these model_args: experiment/flops.forward_flops' count
    (nanoGPT's estimate_mfu: 2 x (12 n_embd^2 a block + the LM head) + 4 n_layer n_embd context)."""
    L, C, V = int(model_args["n_layer"]), int(model_args["n_embd"]), int(model_args["vocab_size"])
    return 2 * (12 * L * C * C + V * C) + 4 * L * C * int(context or model_args["block_size"])


# ----------------------------------------------------------------------------- distillation

def distillation_loss(x, weight, teacher_hidden, teacher_heads, targets, alpha, scale=None):
    """alpha * KL(p || q) + (1 - alpha) * CE(targets, q) per position, averaged over the scored ones (targets -1
    are not): q = softmax(x @ weight.T) the student's (x: its final hidden states), p the teachers' mixture
    (mixture_logprobs of teacher_hidden and teacher_heads, constants). Formed in chunks of positions; when x
    requires grad, each chunk's backward runs at once and x's own backward at the end, so no (positions, V) tensor
    outlives its chunk at GPT-2's vocabulary. scale: applied to a chunk's loss before its backward (a GradScaler's
    scale). Returns {"loss", "kl", "ce"}: floats, unscaled."""
    y = targets.reshape(-1)
    xf, th = x.reshape(y.numel(), -1), [h.reshape(y.numel(), -1) for h in teacher_hidden]
    grad = x.requires_grad and torch.is_grad_enabled()
    xd = xf.detach().requires_grad_() if grad else xf
    scored = y != -1
    count = max(int(scored.sum()), 1)
    n = positions_per_chunk(weight.size(0), x.size(-1), None, x.device)
    total = torch.zeros(3, dtype=torch.float64, device=x.device)
    for s in range(0, y.numel(), n):
        with torch.no_grad():
            logp = mixture_logprobs([h[s:s + n] for h in th], teacher_heads)
        logq = torch.log_softmax(F.linear(xd[s:s + n], weight).float(), dim=-1)
        m = scored[s:s + n]
        kl = (logp.exp() * (logp - logq)).sum(-1) * m
        ce = -logq.gather(1, y[s:s + n].clamp(min=0)[:, None]).squeeze(1) * m
        loss = (alpha * kl + (1 - alpha) * ce).sum() / count
        if grad:
            (scale(loss) if scale is not None else loss).backward()
        total += torch.stack([loss.detach(), kl.detach().sum() / count, ce.detach().sum() / count]).double()
    if grad:
        x.backward(xd.grad.view_as(x))
    loss, kl, ce = total.tolist()
    return {"loss": loss, "kl": kl, "ce": ce}
