"""
Hugging Face GPT-2 <-> this project's GPT, with no need for the transformers package.

In:  `read_hf_dir(path)` turns a local directory as `save_pretrained` writes it (config.json plus
     model.safetensors, sharded *.safetensors with an index, or pytorch_model.bin read with
     torch.load(weights_only=True)) into a checkpoint dict of the same shape train.py writes.
     checkpoint.read_checkpoint calls it for directories, so every script that loads a generator
     (or a reward model exported by export_hf.py) accepts such a directory where it takes a .pt.
     Nothing is ever downloaded: a hub name such as 'gpt2' gets `hub_name_error`.
Out: `generator_to_hf` / `trunk_to_hf` map a GPT to GPT-2's tensor names and config.json
     (export_hf.py writes the files).

The two layouts differ in three ways, all handled here:
  - GPT-2 stores its projections as Conv1D, weight shape (in, out): transposed w.r.t. nn.Linear;
  - GPT-2's MLP uses the tanh approximation of GELU ('gelu_new'), nanoGPT the exact one: the
    GPTConfig field `activation` records which, so imported weights compute exactly what they
    computed in transformers and exported models name the matching `activation_function`;
  - the project may train without biases (bias=False) and pads GPT-2's vocabulary of 50257 to
    50304: exports write zero biases and crop the embedding to the tokenizer's vocabulary.
"""
import hashlib
import json
import os
import pickle
import re
from dataclasses import fields

import torch

from core.errors import CheckpointError, ProjectError
from core.files import sha256_file
from model import GPTConfig, split_model_args
from tokenization_manager import GPT2_VOCAB_SIZE, load_meta

# the projections GPT-2 stores as Conv1D (weight transposed)
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json",
                "pytorch_model.bin", "pytorch_model.bin.index.json")
REWARD_CONFIG = "reward_config.json"  # beside a reward model's trunk (export_hf.py)
REWARD_HEAD = "reward_head.safetensors"
ACTIVATION_FROM_HF = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}
ACTIVATION_TO_HF = {"gelu_tanh": "gelu_new", "gelu": "gelu"}
SAVE_PRETRAINED_HINT = ("python -c \"from transformers import GPT2LMHeadModel; "
                        "GPT2LMHeadModel.from_pretrained('{name}').save_pretrained('{local}')\"")


# ----------------------------------------------------------------------------- paths

def is_hf_dir(path):
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, "config.json"))


def looks_like_hub_name(path):
    """'gpt2', 'gpt2-medium', 'openai-community/gpt2': no file extension, at most one slash."""
    p = os.fspath(path)
    return (re.fullmatch(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?", p) is not None
            and os.path.splitext(p)[1] == "" and not os.path.exists(p))


def hub_name_error(path, flag=None):
    """The error for a model name that is not on disk, or None if `path` does not look like one."""
    if not looks_like_hub_name(path):
        return None
    name = os.fspath(path)
    if name.endswith("-local"):  # the docs' directory for a hub model (gpt2-local: gpt2), not saved yet
        hub, local = name[:-len("-local")], name
    else:
        hub, local = name, os.path.basename(name) + "-local"
    where = f"{flag} {name}" if flag else name
    return CheckpointError(
        f"{where} is not a local model directory or checkpoint file, and models are never downloaded",
        "if it is a path, check it; if it names a Hugging Face model, save the weights on a machine with "
        f"internet: {SAVE_PRETRAINED_HINT.format(name=hub, local=local)}; copy {local}/ (config.json and "
        f"model.safetensors) here and pass " + (f"{flag} {local}" if flag else "that directory's path"))


def source_sha256(path):
    """sha256 of a checkpoint file, or of a model directory's config and weight files (the
    identity runs record to refuse resuming from other weights)."""
    if not os.path.isdir(path):
        return sha256_file(path)
    h = hashlib.sha256()
    names = ["config.json", REWARD_CONFIG] + [n for n in sorted(os.listdir(path))
                                              if n.endswith((".safetensors", ".bin", ".index.json"))]
    for name in names:
        p = os.path.join(path, name)
        if os.path.isfile(p):
            h.update(f"{name} {sha256_file(p)}\n".encode())
    return h.hexdigest()


# ----------------------------------------------------------------------------- reading

def _read_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"cannot read {path}: {e}", "re-create the directory with save_pretrained "
                                                          "or export_hf.py") from None


def _load_safetensors(path):
    try:
        from safetensors.torch import load_file
    except ImportError:
        raise ProjectError(f"{path} needs the package 'safetensors' to be read",
                           "pip install safetensors") from None
    try:
        return load_file(path, device="cpu")
    except Exception as e:  # a truncated or foreign file
        raise CheckpointError(f"{path} is not a readable safetensors file ({type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else ''})",
                              "the file may be truncated; copy or re-create it") from None


def _load_bin(path):
    try:
        sd = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise CheckpointError(f"{path} was refused by the safe loader (weights_only=True): "
                              f"{str(e).splitlines()[0]}",
                              "use a model.safetensors instead; the file may contain executable pickle code") from None
    except Exception as e:
        raise CheckpointError(f"{path} is not a readable PyTorch weight file ({type(e).__name__})",
                              "the file may be truncated; copy or re-create it") from None
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise CheckpointError(f"{path} is not a state dict of tensors")
    return sd


def read_weights(path):
    """All tensors of a save_pretrained directory (safetensors preferred, sharded or not)."""
    for name in WEIGHT_FILES:
        p = os.path.join(path, name)
        if not os.path.isfile(p):
            continue
        load = _load_safetensors if ".safetensors" in name else _load_bin
        if not name.endswith(".index.json"):
            return load(p), [name]
        shards = sorted(set((_read_json(p).get("weight_map") or {}).values()))
        if not shards:
            raise CheckpointError(f"{p} lists no weight files")
        sd = {}
        for shard in shards:
            sp = os.path.join(path, shard)
            if not os.path.isfile(sp):
                raise CheckpointError(f"{p} names {shard}, which is missing from {path}",
                                      "copy every shard of the model")
            sd.update(load(sp))
        return sd, shards
    raise CheckpointError(f"{path} has a config.json but no weights ({', '.join(WEIGHT_FILES[::2])})",
                          "copy the whole directory save_pretrained wrote")


def gpt_config_from_hf(cfg, path):
    """GPTConfig from a GPT-2 config.json dict; anything this GPT cannot compute exactly is refused."""
    where = os.path.join(path, "config.json")
    if cfg.get("model_type") != "gpt2":
        raise CheckpointError(f"{where}: model_type is {cfg.get('model_type')!r}, only 'gpt2' models can be loaded",
                              "use a GPT-2 checkpoint (gpt2, gpt2-medium, distilgpt2, ...) or a directory "
                              "written by export_hf.py")
    g = lambda k, default: cfg.get(k, default) if cfg.get(k) is not None else default  # noqa: E731
    n_embd = int(g("n_embd", 768))
    act = g("activation_function", "gelu_new")
    problems = []
    if act not in ACTIVATION_FROM_HF:
        problems.append(f"activation_function {act!r} (supported: {', '.join(ACTIVATION_FROM_HF)})")
    if abs(float(g("layer_norm_epsilon", 1e-5)) - 1e-5) > 1e-12:
        problems.append(f"layer_norm_epsilon {cfg['layer_norm_epsilon']} (this GPT uses 1e-5)")
    if g("n_inner", 4 * n_embd) != 4 * n_embd:
        problems.append(f"n_inner {cfg['n_inner']} (this GPT uses 4 * n_embd)")
    if not g("scale_attn_weights", True) or g("scale_attn_by_inverse_layer_idx", False):
        problems.append("non-standard attention scaling")
    if g("add_cross_attention", False):
        problems.append("cross-attention")
    if problems:
        raise CheckpointError(f"{where}: this GPT cannot reproduce {'; '.join(problems)}",
                              "only standard GPT-2 architectures can be loaded")
    return GPTConfig(block_size=int(g("n_positions", g("n_ctx", 1024))), vocab_size=int(g("vocab_size", 50257)),
                     n_layer=int(g("n_layer", 12)), n_head=int(g("n_head", 12)), n_embd=n_embd,
                     dropout=0.0, bias=True, activation=ACTIVATION_FROM_HF.get(act, "gelu"))


def hf_to_project_state_dict(sd, config, path, tied=True):
    """GPT-2 tensor names and layouts -> this project's `transformer.*` names (float32)."""
    trunk, lm_head = {}, None
    for k, v in sd.items():
        name = k[len("transformer."):] if k.startswith("transformer.") else k
        if name == "lm_head.weight":
            lm_head = v
            continue
        if name.endswith((".attn.bias", ".attn.masked_bias")) and v.dim() != 1:
            continue  # old transformers versions saved the causal-mask buffers
        if name.endswith(CONV1D):
            v = v.t()
        trunk["transformer." + name] = v.float().contiguous() if v.is_floating_point() else v
    expected = {"transformer.wte.weight", "transformer.wpe.weight", "transformer.ln_f.weight", "transformer.ln_f.bias"}
    for i in range(config.n_layer):
        for part in ("ln_1.weight", "ln_1.bias", "ln_2.weight", "ln_2.bias", "attn.c_attn.weight",
                     "attn.c_attn.bias", "attn.c_proj.weight", "attn.c_proj.bias", "mlp.c_fc.weight",
                     "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"):
            expected.add(f"transformer.h.{i}.{part}")
    missing, unexpected = sorted(expected - set(trunk)), sorted(set(trunk) - expected)
    if missing or unexpected:
        what = "; ".join(s for s in (missing and f"missing {', '.join(missing[:4])}",
                                     unexpected and f"unexpected {', '.join(unexpected[:4])}") if s)
        raise CheckpointError(f"{path}: the weights do not match a GPT-2 of its config.json ({what})",
                              "the directory is incomplete or holds another architecture")
    wte = trunk["transformer.wte.weight"]
    if lm_head is not None and not torch.equal(lm_head.float(), wte):
        raise CheckpointError(f"{path}: lm_head.weight is not tied to the token embedding",
                              "only GPT-2 models with tied input/output embeddings can be loaded")
    if lm_head is None and not tied:
        raise CheckpointError(f"{path}: config.json says tie_word_embeddings=false but there is no lm_head.weight")
    return trunk


def read_hf_dir(path):
    """A checkpoint dict (as checkpoint.read_checkpoint returns) from a local Hugging Face directory."""
    if not is_hf_dir(path):
        raise CheckpointError(f"{path} is a directory without a config.json: neither a checkpoint file nor a "
                              f"Hugging Face model directory",
                              "pass the .pt file itself (e.g. out/ckpt.pt), or a directory written by "
                              "save_pretrained or export_hf.py")
    cfg = _read_json(os.path.join(path, "config.json"))
    config = gpt_config_from_hf(cfg, path)
    reward = _read_json(os.path.join(path, REWARD_CONFIG)) if os.path.isfile(os.path.join(path, REWARD_CONFIG)) else None
    sd, files = read_weights(path)
    sd = hf_to_project_state_dict(sd, config, path, tied=cfg.get("tie_word_embeddings", True))
    tokenization = _dir_tokenization(path, config.vocab_size)
    extra = {}
    if reward is not None:  # export_hf.py's reward model: GPT2Model trunk + head + the whole GPTConfig
        stored = reward.get("gpt_config") or {}
        known = {f.name for f in fields(GPTConfig)}
        config = GPTConfig(**{**{k: v for k, v in stored.items() if k in known}, "mode": "reward"})
        head_path = os.path.join(path, REWARD_HEAD)
        if not os.path.isfile(head_path):
            raise CheckpointError(f"{path} has a {REWARD_CONFIG} but no {REWARD_HEAD}",
                                  "copy the whole directory export_hf.py wrote")
        sd.update(_load_safetensors(head_path))
        files.append(REWARD_HEAD)
        if reward.get("tokenization"):  # the recorded method and size; the vocabulary file is the local one
            tokenization = dict(reward["tokenization"], meta_path=(tokenization or {}).get("meta_path"))
        if reward.get("reward_data"):
            extra["reward_data"] = reward["reward_data"]
    else:
        sd["lm_head.weight"] = sd["transformer.wte.weight"]
    model_args, model_extra = split_model_args(config)
    return {"model": sd, "optimizer": None, "mode": config.mode,
            "model_args": model_args, "model_extra": model_extra, "config": {},
            "tokenization": tokenization,
            "pretrained": {"format": "huggingface", "path": os.path.abspath(path), "files": files}, **extra}


def _dir_tokenization(path, vocab_size):
    """The tokenization a model directory implies: a meta.pkl beside the weights (export_hf.py
    writes one for char models) means char; GPT-2's vocabulary means BPE; otherwise unknown."""
    meta = os.path.join(path, "meta.pkl")
    if os.path.isfile(meta):
        return {"method": "char", "vocab_size": load_meta(meta)["vocab_size"], "meta_path": os.path.abspath(meta)}
    if vocab_size >= GPT2_VOCAB_SIZE:
        return {"method": "bpe", "vocab_size": GPT2_VOCAB_SIZE, "meta_path": None}
    return None


# ----------------------------------------------------------------------------- writing

def trunk_to_hf(model, vocab_size, prefix=""):
    """GPT-2 tensors of the model's trunk: Conv1D layout, zero biases where the project has none,
    the embedding cropped to `vocab_size` rows. Fresh contiguous float32 tensors."""
    c = model.config
    sd = {k: v for k, v in model.state_dict().items() if k.startswith("transformer.")}
    names = ["wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"] + [
        f"h.{i}.{part}" for i in range(c.n_layer) for part in (
            "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
            "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
            "mlp.c_proj.weight", "mlp.c_proj.bias")]
    out = {}
    for name in names:
        v = sd.get("transformer." + name)
        if v is None:  # a bias of a bias=False model: zero is the same function
            v = torch.zeros(sd["transformer." + name[:-len("bias")] + "weight"].shape[0])
        if name.endswith(CONV1D):
            v = v.t()
        if name == "wte.weight":
            v = v[:vocab_size]
        out[prefix + name] = v.detach().to("cpu", torch.float32).contiguous().clone()
    return out


def hf_config(config, vocab_size, architecture="GPT2LMHeadModel", eos_token_id=None):
    """config.json for transformers' GPT-2 classes describing this GPTConfig."""
    return {
        "architectures": [architecture], "model_type": "gpt2",
        "vocab_size": vocab_size, "n_positions": config.block_size, "n_embd": config.n_embd,
        "n_layer": config.n_layer, "n_head": config.n_head, "n_inner": None,
        "activation_function": ACTIVATION_TO_HF[config.activation],
        "resid_pdrop": config.dropout, "embd_pdrop": config.dropout, "attn_pdrop": config.dropout,
        "layer_norm_epsilon": 1e-5, "initializer_range": 0.02,
        "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
        "tie_word_embeddings": True, "use_cache": True,
        "bos_token_id": eos_token_id, "eos_token_id": eos_token_id, "pad_token_id": None,
        "dtype": "float32",
    }


def generator_to_hf(model, vocab_size, eos_token_id=None):
    """(tensors, config.json dict) of a generator for GPT2LMHeadModel (lm_head is tied to wte,
    so it is not stored, as save_pretrained does)."""
    model.require("generator")
    if vocab_size > model.config.vocab_size:
        raise ProjectError(f"the tokenizer has {vocab_size} tokens but the model only {model.config.vocab_size}")
    return trunk_to_hf(model, vocab_size, "transformer."), hf_config(model.config, vocab_size,
                                                                     eos_token_id=eos_token_id)


def reward_to_hf(model):
    """(trunk tensors, config.json dict, head tensors, GPTConfig dict) of a reward model: the trunk
    as a GPT2Model (full embedding), every non-trunk tensor under its project name, and the whole
    GPTConfig so that fields added later travel with it."""
    model.require("reward")
    c = model.config
    head = {k: v.detach().to("cpu", torch.float32).contiguous().clone()
            for k, v in model.state_dict().items() if not k.startswith("transformer.")}
    return (trunk_to_hf(model, c.vocab_size), hf_config(c, c.vocab_size, "GPT2Model"), head,
            {f.name: getattr(c, f.name) for f in fields(c)})
