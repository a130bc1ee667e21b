"""
Every checkpoint file and Hugging Face model directory is read and written here.

The layout is nanoGPT's, in plain types only (tensors, dicts, lists, numbers, strings, None),
so nanoGPT's own loader reads a generator checkpoint of this project unchanged:

    model          the state dict (nanoGPT's parameter names; a generator has no other tensors)
    optimizer      the optimizer's state dict (or None)
    model_args     exactly nanoGPT's model fields: n_layer, n_head, n_embd, block_size, bias,
                   vocab_size, dropout  (nanoGPT: GPTConfig(**ckpt['model_args']))
    model_extra    this project's other GPTConfig fields (mode, activation, reward head, ...)
    config         the training run's settings as a plain dict (the script's flags), with
                   `dataset` where known, as nanoGPT's sample.py reads it
    iter_num, best_val_loss   as nanoGPT
    mode, tokenization, data, rng, early_stopping, ...   this project's records, plain dicts

Older checkpoints of this project (the GPTConfig object under `config`, our fields inside
`model_args`, the flags under `train_config`) still load: `read_checkpoint` converts them
(`upgrade_layout`), unpickling GPTConfig under weights_only=True only while it reads.
"""
import contextlib
import os
import pickle
import warnings
import zipfile

import torch

from core.errors import CheckpointError, MetaFileError, ProjectError
from lib.hf_interop import hub_name_error, read_hf_dir, source_sha256
from lib.reward_head import build_reward_model
from model import MODEL_ARG_KEYS, MODEL_EXTRA_KEYS, NANOGPT_MODEL_ARGS, GPTConfig, split_model_args
from tokenization_manager import (GPT2_VOCAB_SIZE, TokenizationInfo, TokenizationManager, check_tokenization_match,
                                  load_meta)

# ---------------------------------------------------------------------- writing

def unwrap_model(model):
    """The GPT inside DDP's `.module` and torch.compile's `._orig_mod` wrappers."""
    raw = model.module if hasattr(model, "module") else model
    return getattr(raw, "_orig_mod", raw)


def plain(value):
    """`value` as plain types only (dict, list, str, int, float, bool, None, tensors), so that
    torch.load(weights_only=True) needs no allowlist: tuples become lists, str subclasses
    str, anything else its str()."""
    if value is None or isinstance(value, (bool, int, float, torch.Tensor)):
        return value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return str(value)


def training_config(settings):
    """The `config` dict of a checkpoint: a run's settings (e.g. vars(args)) as plain types,
    with nanoGPT's `dataset` filled in from `data_dir` when the run did not name one."""
    cfg = plain(dict(settings or {}))
    if not cfg.get("dataset") and isinstance(cfg.get("data_dir"), str) and cfg["data_dir"]:
        cfg["dataset"] = os.path.basename(os.path.normpath(cfg["data_dir"]))
    return cfg


def make_checkpoint(model, optimizer=None, train_config=None, **extra):
    """The checkpoint dict every script writes (nanoGPT's layout, see the module docstring).
    `train_config`: the run's settings (stored as `config`); `extra`: further records."""
    raw = unwrap_model(model)
    model_args, model_extra = split_model_args(raw.config)
    ckpt = {
        "model": raw.state_dict(),
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "model_args": model_args,
        "model_extra": model_extra,
        "config": training_config(train_config),
        "mode": raw.config.mode,
    }
    ckpt.update(extra)
    return ckpt


def model_shape(model):
    """What a FLOPs count needs of a model, for the scripts' summary records (experiment/flops.py
    reads them instead of the checkpoints): the model_args its checkpoint records and, for a
    detector, its head (whether it reads the LM features, its hidden width)."""
    config = unwrap_model(model).config
    shape = {"model_args": split_model_args(config)[0]}
    if config.mode == "reward":
        shape["reward_head"] = {"lm_features": bool(config.reward_lm_features),
                                "hidden_dim": config.reward_head_hidden_dim}
        if config.reward_gen_features:  # the generator it runs beside its trunk (GPTConfig.reward_gen_features)
            shape["reward_head"]["gen_model_args"] = split_model_args(GPTConfig(**config.reward_gen_features))[0]
    return shape


# ---------------------------------------------------------------------- reading

@contextlib.contextmanager
def _legacy_globals():
    """Allow the GPTConfig class (pickled by old checkpoints) while one file is read."""
    if hasattr(torch.serialization, "safe_globals"):
        with torch.serialization.safe_globals([GPTConfig]):
            yield
    else:  # torch < 2.5
        torch.serialization.add_safe_globals([GPTConfig])
        yield


def upgrade_layout(ckpt):
    """Convert, in place, an older checkpoint of this project to the current layout: the
    GPTConfig object under `config` and our fields inside `model_args` become `model_args`
    (nanoGPT's fields) + `model_extra`, `train_config` becomes `config`. Current checkpoints
    and nanoGPT's pass unchanged. Returns `ckpt`."""
    cfg, args = ckpt.get("config"), ckpt.get("model_args")
    legacy_args = isinstance(args, dict) and any(k in MODEL_EXTRA_KEYS for k in args)
    if not isinstance(cfg, GPTConfig) and not legacy_args:
        return ckpt
    full = dict(args) if isinstance(args, dict) else {}
    if isinstance(cfg, GPTConfig):  # getattr: a field added later falls back to its default
        full.update({k: getattr(cfg, k) for k in MODEL_ARG_KEYS})
        ckpt["config"] = ckpt.get("train_config") or {}
    ckpt.pop("train_config", None)
    ckpt["model_args"] = {k: full[k] for k in NANOGPT_MODEL_ARGS if k in full}
    ckpt["model_extra"] = {**{k: full[k] for k in MODEL_EXTRA_KEYS if k in full}, **(ckpt.get("model_extra") or {})}
    return ckpt


def read_checkpoint(path, map_location="cpu"):
    """torch.load with weights_only=True and clear errors for every way a file can be bad.
    A directory is read as a Hugging Face GPT-2 model (config.json + safetensors) instead."""
    if not os.path.exists(path):
        raise hub_name_error(path) or CheckpointError(f"checkpoint not found: {path}",
                                                      "check the path, or train a model first with train.py")
    if os.path.isdir(path):  # a local Hugging Face GPT-2 directory (lib/hf_interop.py converts it)
        return read_hf_dir(path)
    with open(path, "rb") as f:
        head = f.read(2)
    if not zipfile.is_zipfile(path):  # torch.save writes a zip archive; old files are a bare pickle
        if head == b"PK":
            raise CheckpointError(f"{path} is a damaged checkpoint: its zip archive is truncated or corrupt",
                                  "the file was cut short (an interrupted copy?); copy or re-create it")
        if head[:1] != b"\x80":  # every pickle of protocol >= 2 starts with PROTO
            what = "the file is empty" if not head else "neither a torch.save zip archive nor a pickle"
            raise CheckpointError(f"{path} is not a PyTorch checkpoint ({what})",
                                  "pass a checkpoint written by train.py, train_reward_model.py or train_grpo.py")
    try:
        with warnings.catch_warnings():  # torch warns about pickle protocols before refusing
            warnings.simplefilter("ignore")
            with _legacy_globals():  # old checkpoints pickled the GPTConfig object itself
                ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        # torch's message is a generic paragraph; the line that says what was refused is the useful one
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        why = [ln.split("WeightsUnpickler error:", 1)[-1].strip() for ln in lines
               if not ln.startswith(("Weights only load failed", "Check the documentation"))]
        why = next((ln for ln in why if ln), "unknown reason")
        raise CheckpointError(f"{path} was refused by the safe loader (weights_only=True): {why}",
                              "only load checkpoints written by this project or nanoGPT; "
                              "the file may contain executable pickle code") from None
    except Exception as e:  # anything else torch.load cannot read (e.g. a zip that is not a checkpoint)
        raise CheckpointError(f"{path} is not a readable PyTorch checkpoint "
                              f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})",
                              "the file may be truncated or corrupt; re-create it") from None
    if not isinstance(ckpt, dict) or "model" not in ckpt or not isinstance(ckpt["model"], dict):
        raise CheckpointError(f"{path} is not a model checkpoint (no 'model' state dict)",
                              "pass a checkpoint written by train.py, train_reward_model.py "
                              "or train_grpo.py")
    return upgrade_layout(ckpt)


def own_checkpoint_to_resume(ckpt_path, state_key, what, model_path):
    """A run's own checkpoint (read), or None when there is none to resume from; refuses one that
    holds no `state_key` state or that was started from another --model_path."""
    if not os.path.exists(ckpt_path):
        return None
    own = read_checkpoint(ckpt_path)
    if own.get(state_key) is None:
        raise CheckpointError(f"{ckpt_path} holds no {what} state to resume from",
                              "use another --out_dir, or drop --resume to start over")
    if own[state_key].get("base_sha256") != source_sha256(model_path):
        raise CheckpointError(f"{ckpt_path} was started from a different --model_path",
                              "resume with the original --model_path, or use a fresh --out_dir")
    return own


def checkpoint_config(ckpt, path="checkpoint"):
    """GPTConfig from `model_args` (nanoGPT's fields) and `model_extra` (ours); an older
    layout is read too."""
    ckpt = upgrade_layout(dict(ckpt))
    args = ckpt.get("model_args")
    if not isinstance(args, dict):
        raise CheckpointError(f"{path} has no 'model_args' dict (nor an old-style GPTConfig 'config')",
                              "pass a checkpoint written by this project or by nanoGPT")
    extra = ckpt.get("model_extra") if isinstance(ckpt.get("model_extra"), dict) else {}
    known = {k: v for k, v in {**args, **extra}.items() if k in MODEL_ARG_KEYS}
    missing = [k for k in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size") if k not in known]
    if missing:
        raise CheckpointError(f"{path}: model_args lacks {', '.join(missing)}")
    return GPTConfig(**known)


def sequence_length(ckpt, path="checkpoint"):
    """The length of the sequences a checkpoint works on, computed here only: for a detector, N of the
    reward data it was trained on (its crossovers K ~ U[1, N-1]; recorded by train_reward_model.py),
    else the model's context (block_size)."""
    recorded = (ckpt.get("reward_data") or {}).get("block_size")
    return int(recorded or checkpoint_config(ckpt, path).block_size)


def checkpoint_tokenization(ckpt, guess=False):
    """The TokenizationInfo a checkpoint records (`tokenization`, or the older place inside
    `data`), or None when it records none (nanoGPT's checkpoints). With guess=True a
    checkpoint without a record is judged by its vocabulary size: GPT-2's or more is bpe,
    fewer is a char vocabulary of that size (with no meta_path)."""
    for rec in (ckpt.get("tokenization"), (ckpt.get("data") or {}).get("tokenization")
                if isinstance(ckpt.get("data"), dict) else None):
        if isinstance(rec, dict) and "method" in rec and "vocab_size" in rec:
            return TokenizationInfo.from_dict(rec)
    if not guess:
        return None
    V = checkpoint_config(ckpt).vocab_size
    return TokenizationInfo("bpe", GPT2_VOCAB_SIZE) if V >= GPT2_VOCAB_SIZE else TokenizationInfo("char", V)


def tokenizer_for(ckpt, ckpt_path, method=None, meta_path=None):
    """The TokenizationManager of a checkpoint (sample.py, export_hf.py): `method` / `meta_path`
    (flags) override its record; a nanoGPT checkpoint's char vocabulary is found by nanoGPT's
    rule data/<config['dataset']>/meta.pkl."""
    info = checkpoint_tokenization(ckpt)
    if method is None and meta_path is None and info is None:
        nano = ckpt.get("config") if isinstance(ckpt.get("config"), dict) else {}
        guess = os.path.join("data", str(nano.get("dataset", "")), "meta.pkl")
        if nano.get("dataset") and os.path.exists(guess):  # nanoGPT's own convention
            return TokenizationManager("char", meta_path=guess)
        raise ProjectError(f"{ckpt_path} does not record its tokenization (a nanoGPT checkpoint?)",
                           "pass --tokenization bpe, or --tokenization char --meta_path path/to/meta.pkl")
    if method is not None or meta_path is not None:
        return TokenizationManager(method or "char", meta_path=meta_path)
    if info.method == "bpe":
        return TokenizationManager("bpe")
    candidates = [info.meta_path]
    data_dir = (ckpt.get("data") or {}).get("data_dir")
    if data_dir:  # the recorded path may be from another machine; try beside the data
        candidates.append(os.path.join(data_dir, "meta.pkl"))
    candidates = list(dict.fromkeys(candidates))  # the two are often the same path
    for path in candidates:
        if path and os.path.exists(path):
            return TokenizationManager("char", meta_path=path)
    raise MetaFileError(f"the char vocabulary of {ckpt_path} was not found (looked for "
                        f"{', '.join(p for p in candidates if p)})", "pass --meta_path path/to/meta.pkl")


def checkpoint_train_config(ckpt):
    """The training run's settings a checkpoint records (a dict; {} if none)."""
    cfg = upgrade_layout(dict(ckpt)).get("config")
    return cfg if isinstance(cfg, dict) else {}


def checkpoint_mode(ckpt):
    """'generator' or 'reward', judged by the stored config and by the head weights."""
    keys = _clean_state_dict(ckpt["model"]).keys()
    if any(k.startswith("reward_head.") for k in keys):
        return "reward"
    return "generator"


def _clean_state_dict(sd):
    """Strip torch.compile's `_orig_mod.` and DDP's `module.` prefixes; drop nanoGPT's
    non-flash causal-mask buffers."""
    out = {}
    for k, v in sd.items():
        for prefix in ("_orig_mod.", "module."):
            while k.startswith(prefix):
                k = k[len(prefix):]
        if k.endswith(".attn.bias") and v.dim() == 4:  # registered mask buffer, not a weight
            continue
        out[k] = v
    return out


def model_from_checkpoint(ckpt, mode=None, reward_head_hidden_dim=None, path="checkpoint",
                          require_mode=None, dropout=None, reward_per_position=None, reward_lm_features=None,
                          reward_gen_features=None):
    """Build a GPT from a checkpoint dict in `mode` (default: the checkpoint's own mode).

    The trunk (`transformer.*`) is loaded STRICTLY: any missing, unexpected or
    mis-shaped trunk tensor is an error. A head present in the checkpoint for the
    requested mode is loaded strictly too; a head that is not (e.g. a new reward head
    on a generator checkpoint) is freshly initialised and listed in the returned
    `new_params`, as is a new detector's generator copy (reward_gen_features: its config; the caller
    loads the generator's weights into gen_lm). `require_mode` makes a checkpoint of the other mode an error.

    Returns (model, new_params).
    """
    sd = _clean_state_dict(ckpt["model"])
    stored_mode = checkpoint_mode(ckpt)
    if require_mode is not None and stored_mode != require_mode:
        raise CheckpointError(
            f"{path} is a {stored_mode} checkpoint, but a {require_mode} checkpoint is needed here",
            "pass a base/GRPO generator checkpoint" if require_mode == "generator"
            else "pass a checkpoint written by train_reward_model.py")
    config = checkpoint_config(ckpt, path)
    config.mode = mode or stored_mode
    if dropout is not None:
        config.dropout = dropout
    if config.mode == "reward":
        if stored_mode == "reward":
            config.reward_head_hidden_dim = sd["reward_head.0.weight"].shape[0]
        else:
            if reward_head_hidden_dim is not None:
                config.reward_head_hidden_dim = reward_head_hidden_dim
            if reward_per_position is not None:  # a new head: its kind is the caller's choice
                config.reward_per_position = bool(reward_per_position)
            if reward_lm_features is not None:
                config.reward_lm_features = bool(reward_lm_features)
            if reward_gen_features is not None:
                config.reward_gen_features = reward_gen_features or None
    model = build_reward_model(config)  # a GPT, or a Detector that reads its generator too

    trunk = {k[len("transformer."):]: v for k, v in sd.items() if k.startswith("transformer.")}
    try:
        model.transformer.load_state_dict(trunk, strict=True)
    except RuntimeError as e:
        raise CheckpointError(f"{path}: the transformer trunk does not match its config: "
                              f"{str(e).splitlines()[1].strip() if len(str(e).splitlines()) > 1 else e}",
                              "the checkpoint is corrupt or from a different architecture") from None

    new_params = []
    if config.mode == "generator":
        # lm_head is tied to wte; a stored lm_head must agree with it
        if "lm_head.weight" in sd and not torch.equal(sd["lm_head.weight"], sd["transformer.wte.weight"]):
            raise CheckpointError(f"{path}: lm_head.weight is not tied to transformer.wte.weight")
    else:
        head = {k[len("reward_head."):]: v for k, v in sd.items() if k.startswith("reward_head.")}
        if head:
            try:
                model.reward_head.load_state_dict(head, strict=True)
            except RuntimeError as e:
                raise CheckpointError(f"{path}: reward_head does not match: {e}") from None
        else:
            new_params = ["reward_head." + k for k, _ in model.reward_head.named_parameters()]
        if config.reward_gen_features:
            gen = {k[len("gen_lm."):]: v for k, v in sd.items() if k.startswith("gen_lm.")}
            if gen:
                try:
                    model.gen_lm.load_state_dict(gen, strict=True)
                except RuntimeError as e:
                    raise CheckpointError(f"{path}: gen_lm (the detector's generator) does not match: {e}") from None
            else:
                new_params.append("gen_lm.*")
    unknown = [k for k in sd if not (k.startswith("transformer.") or k.startswith("lm_head.")
                                     or k.startswith("reward_head.") or k.startswith("gen_lm."))]
    if unknown:
        raise CheckpointError(f"{path}: unexpected tensors {unknown[:5]}")
    return model, new_params


def load_model(path, mode=None, device="cpu", reward_head_hidden_dim=None, require_mode=None,
               dropout=None, verbose=False, reward_per_position=None, reward_lm_features=None,
               reward_gen_features=None):
    """read_checkpoint + model_from_checkpoint + .to(device). Returns (model, ckpt, new_params)."""
    ckpt = read_checkpoint(path)
    model, new_params = model_from_checkpoint(ckpt, mode, reward_head_hidden_dim, path, require_mode, dropout,
                                              reward_per_position, reward_lm_features, reward_gen_features)
    if verbose and new_params:
        print(f"newly initialised (not in {path}): {', '.join(new_params)}")
    return model.to(device), ckpt, new_params


def load_pretrained(path, tok, data_dir, dropout):
    """--init_from PATH (nanoGPT's init_from='gpt2', from local files): the generator in a checkpoint
    file or a Hugging Face directory, checked against the data's tokenization.
    Returns (model, a record of where the weights came from, for the checkpoints)."""
    if not os.path.exists(path):
        raise hub_name_error(path, "--init_from") or ProjectError(
            f"--init_from {path}: no such file or directory",
            "pass scratch, resume, a checkpoint .pt, or a local Hugging Face GPT-2 directory")
    ckpt = read_checkpoint(path)
    model, _ = model_from_checkpoint(ckpt, path=path, require_mode="generator", dropout=dropout)
    V = model.config.vocab_size
    weights = checkpoint_tokenization(ckpt, guess=True)  # nanoGPT's records none: judged by vocab_size
    if weights.method != tok.method:
        how = ("python prepare_data.py --input your.txt --tokenization bpe --out_dir DIR" if weights.method == "bpe"
               else "prepare the data with the char vocabulary the weights were trained with (--meta_path)")
        raise ProjectError(f"--init_from {path} holds a {weights.method} model (vocab_size {V}) but --data_dir "
                           f"{data_dir} is tokenized {tok.info}", f"prepare the corpus to match: {how}")
    check_tokenization_match(tok.info, weights, what=f"dataset {data_dir}")
    if tok.method == "char" and weights.meta_path and os.path.exists(weights.meta_path) \
            and load_meta(weights.meta_path)["stoi"] != load_meta(tok.meta_path)["stoi"]:
        raise ProjectError(f"--init_from {path} was trained with the char vocabulary {weights.meta_path}, whose "
                           f"characters map to other ids than in {tok.meta_path}",
                           f"prepare the corpus with --meta_path {weights.meta_path}")
    if V < tok.vocab_size:
        raise ProjectError(f"--init_from {path} has vocab_size {V}, fewer than the {tok.vocab_size} tokens of "
                           f"{data_dir}", "use weights trained with this tokenization")
    source = {"path": os.path.abspath(path), "format": "huggingface" if os.path.isdir(path) else "checkpoint",
              "sha256": source_sha256(path), "iter_num": ckpt.get("iter_num")}
    return model, source
