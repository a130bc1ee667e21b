"""
Train a reward model: the base generator's trunk (frozen by default) plus a new
reward head that predicts [P(natural), P(synthetic)] of a sequence, on the reward
dataset written by prepare_reward_data.py (targets [K/N, (N-K)/N]).

    python train_reward_model.py --model_path out/ckpt.pt --data_dir data/reward_dataset \
        --out_dir out-reward

Writes out_dir/reward_ckpt.pt (best val loss; mode 'reward': `model, _, _ =
load_model(path)` then `probs, _ = model(x)`), reward_last.pt (latest state, for
--resume), metrics.jsonl, calibration.png, loss_curves.png, reward_summary.json and
val_predictions.npy (the best checkpoint's P(natural) of every val sample, float32, in order).
DDP: torchrun --nproc_per_node=N train_reward_model.py ...

main() reads top to bottom: set-up, the loop, the end. Everything the loop changes is one
RMState (step, best, early stopper, stop reason), passed explicitly to evaluate(), save(),
train_step() and the rest; what set-up built and the loop only reads is one RMRun.
"""
import argparse
import json
import math
import os
import tempfile
import time
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.utils.data import DataLoader
from tqdm import tqdm

from core.cli import progress_bar, run_cli
from core.devices import all_mean, clip_and_step, wrap_ddp
from core.errors import BinaryFileError, CheckpointError, DataError, ProjectError, check_finite
from core.files import atomic_output, atomic_torch_save, atomic_write_text, read_jsonl, sha256_file
from core.plots import plot_calibration, plot_loss_curves
from core.schedule import EarlyStopping
from core.training import RunContext, finish, kept_records, open_run
from lib.checkpoint import (checkpoint_tokenization, load_model, make_checkpoint, model_from_checkpoint, model_shape,
                            read_checkpoint)
from lib.hf_interop import source_sha256
# the head's forward, loss, freezing and optimizer live in the library module lib/reward_head.py (importable from here)
from lib.reward_head import (ADA_INTERVAL, RewardLogits, ada_adjust, augment_tokens,  # noqa: F401 (re-exports)
                             cached_head_logits, frozen_features, head_logits, make_optimizer, natural_sign,
                             reward_loss, sequence_p_natural, set_modes, set_trainable)
from lib.settings import reward_model_args as get_args
from model import head_input_width, split_model_args
from reward_dataset_loader import RewardDataset
from tokenization_manager import check_tokenization_match

BEST_NAME = "reward_ckpt.pt"
LAST_NAME = "reward_last.pt"
METRICS_NAME = "metrics.jsonl"
SUMMARY_NAME = "reward_summary.json"
PREDICTIONS_NAME = "val_predictions.npy"  # the best checkpoint's P(natural) of every val sample, in order


# ---------------------------------------------------------------- frozen-block cache
# With --unfreeze_last_n_blocks n >= 0 the embeddings and the first L - n blocks are frozen
# and in eval mode, so their output for a sample never changes: compute it once per sample
# (--cache_frozen) and train the last n blocks, ln_f and the head on it. Same arithmetic as
# hidden_states(), so losses agree with the plain run up to float rounding (the cache pass
# batches samples differently). frozen_features / cached_head_logits: lib/reward_head.py.

class FrozenFeatures(torch.utils.data.Dataset):
    """(cached features, target) pairs: a drop-in for RewardDataset in the DataLoaders."""

    def __init__(self, feats, ds):
        self.feats, self.ds = feats, ds

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, i):
        return self.feats[i], torch.from_numpy(np.array(self.ds.y[i], dtype=np.float32))

    def batch(self, idx):
        """The samples idx as one batch, gathered in one op: what a DataLoader would collate sample by sample."""
        i = np.asarray(idx, dtype=np.int64)
        return self.feats[torch.from_numpy(i)], torch.from_numpy(np.asarray(self.ds.y[i], dtype=np.float32))


def build_frozen_cache(model, ds, first_block, last_only, ctx, out_dir, chunk=64):
    """frozen_features of every sample of ds, computed once on ctx's device under its autocast (ctx: the
    run's RunContext; its rank 0 shows the progress): a float32 tensor in memory, or in an anonymous memmap
    file in out_dir (deleted when the process ends) when it would take more than half of the available
    memory (shared by the processes torchrun started on this machine, each of which holds its own cache)."""
    T = 1 if last_only else ds.block_size
    shape = (len(ds), T, head_input_width(model.config))
    nbytes = 4 * math.prod(shape)
    if nbytes <= available_memory() // (2 * int(os.environ.get("LOCAL_WORLD_SIZE", 1))):
        feats, where = torch.empty(shape, dtype=torch.float32), "in memory"
    else:
        f = tempfile.TemporaryFile(dir=out_dir, prefix="frozen_cache_")
        f.truncate(nbytes)
        feats = torch.from_numpy(np.memmap(f, dtype=np.float32, mode="w+", shape=shape))
        where = f"in a temporary file in {out_dir}"
    modes = {m: m.training for m in model.modules()}  # set_modes' mix of train/eval comes back after
    model.eval()
    with torch.no_grad():
        desc = f"caching the frozen blocks ({ds.split}) ({nbytes / 2**20:,.0f} MiB {where})"
        for s in progress_bar(range(0, len(ds), chunk), desc=desc, dynamic_ncols=True, disable=not ctx.master):
            x = torch.from_numpy(ds.x[s:s + chunk].astype(np.int64)).to(ctx.device)
            with ctx.amp:
                feats[s:s + len(x)] = frozen_features(model, x, first_block, last_only).float().cpu()
    for m, training in modes.items():
        m.train(training)
    return feats


def use_frozen_cache(args):
    """--cache_frozen resolved: whether to train on cached frozen-block outputs."""
    if args.cache_frozen == "off":
        return False
    if args.augment_p > 0 or args.ada_target is not None:  # every batch's tokens change: nothing to cache
        if args.cache_frozen == "on":
            raise ProjectError("--cache_frozen on: --augment_p changes every batch's tokens, so no feature is "
                               "fixed", "use --cache_frozen auto or off")
        return False
    # Under torchrun every process computes the cache of the whole train split itself: a sample
    # goes to another rank in every epoch, and the duplicated pass is one forward per sample,
    # against one per sample and epoch (with the 50257-token LM features, most of a step) without it.
    why_not = ("--unfreeze_last_n_blocks -1 trains the whole trunk, so nothing is frozen"
               if args.unfreeze_last_n_blocks < 0 else
               "--lm_features are computed by the trained top blocks, so only a wholly frozen trunk "
               "(--unfreeze_last_n_blocks 0) can be cached with them"
               if args.lm_features and args.unfreeze_last_n_blocks > 0 else None)
    if why_not and args.cache_frozen == "on":
        raise ProjectError(f"--cache_frozen on: {why_not}", "use --cache_frozen auto or off")
    return why_not is None


def available_memory():
    """MemAvailable of /proc/meminfo in bytes (a large number where there is none)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 50


def epoch_order(n, epoch, seed, batch_size, rank=0, world=1):
    """This rank's sample order for an epoch.

    One seeded permutation per epoch (a resumed run sees the same order), cut into global
    batches of batch_size * world samples (batch_size = this rank's share); rank r takes
    slice r of every global batch. So step i trains on the same samples for any number of
    processes, and ranks never share a sample. A last, short global
    batch is split evenly; its remainder (at most world - 1 samples) is skipped."""
    perm = np.random.default_rng([seed, epoch]).permutation(n)
    gb = batch_size * world
    full = n // gb
    mine = perm[:full * gb].reshape(full, world, batch_size)[:, rank].ravel()
    rest = perm[full * gb:]
    m = len(rest) // world
    return np.concatenate([mine, rest[rank * m:(rank + 1) * m]]).tolist()


def steps_in_epoch(n, batch_size, world=1):
    gb = batch_size * world
    return n // gb + bool((n % gb) // world)


@torch.no_grad()
def val_metrics(model, loader, device, amp, loss_kind, max_batches=None, forward=None):
    """Val metrics and the (pred, true) pairs for the calibration plot. forward: the
    logits of a loader batch (default: head_logits(model, x); a RewardLogits on cached
    features for --cache_frozen)."""
    forward = forward or (lambda x: head_logits(model, x))
    # each module's own mode: frozen parts stay in eval(), unfrozen blocks and the head in train()
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    preds, trues, loss_sum, n = [], [], 0.0, 0
    for k, (x, y) in enumerate(loader):
        if max_batches is not None and k >= max_batches:
            break
        x, y = x.to(device), y.to(device)
        with amp:
            logits = forward(x)
        loss_sum += reward_loss(logits, y, loss_kind).item() * x.size(0)
        n += x.size(0)
        preds.append(sequence_p_natural(logits).cpu())
        trues.append(y[:, 0].float().cpu())
    for m, mode in modes:
        m.train(mode)
    if n == 0:
        raise DataError("the val split of the reward dataset is empty", "regenerate the reward dataset")
    pred, true = torch.cat(preds), torch.cat(trues)
    return {"val_loss": loss_sum / n,
            "val_mse": F.mse_loss(torch.stack([pred, 1 - pred], 1), torch.stack([true, 1 - true], 1)).item(),
            "val_mae": (pred - true).abs().mean().item(),
            "const_mae": (0.5 - true).abs().mean().item(),
            "val_corr": float(np.corrcoef(pred.numpy(), true.numpy())[0, 1]) if n > 1 and pred.std() > 0 else 0.0,
            "val_samples": n}, pred.numpy(), true.numpy()


# ---------------------------------------------------------------- the state the loop changes

@dataclass
class RMState:
    """Everything the training loop changes. reward_last.pt keeps it (to_dict) for --resume,
    all but the train-loss window of the next log line. base/trunk_sha256 name the checkpoints
    it was trained from (a resume from others is refused)."""
    stopper: EarlyStopping  # on the val loss
    base_sha256: str | None = None
    trunk_sha256: str | None = None
    step: int = 0  # optimizer steps
    epoch: int = 0
    pos: int = 0  # batches done in this epoch
    best: dict | None = None  # eval metrics of the best checkpoint, and its step
    stop_reason: str | None = None
    augment_p: float = 0.0  # the token-substitution rate (--augment_p, adapted by --ada_target)
    ada_signs: float | torch.Tensor = 0.0  # ADA's window: sum of sign(natural margin) over natural positions, and
    ada_count: int | torch.Tensor = 0      # their count (device tensors within a window: read once per ADA_INTERVAL)
    loss_sum: float = 0.0  # the log window: train losses since the last log line, from time t0
    n_losses: int = 0
    t0: float = field(default_factory=time.time)

    def to_dict(self):
        return {"step": self.step, "epoch": self.epoch, "pos": self.pos, "best": self.best,
                "stop_reason": self.stop_reason, "stopper": self.stopper.state_dict(), "augment_p": self.augment_p,
                "ada_signs": float(self.ada_signs), "ada_count": int(self.ada_count),
                "base_sha256": self.base_sha256, "trunk_sha256": self.trunk_sha256}


@dataclass(frozen=True, eq=False)
class RMRun:
    """What set-up builds and the loop only reads: the run's context (core/training.py: ranks, device,
    autocast, scaler, logger) and what is this script's own; the loop's changes all go to RMState."""
    args: argparse.Namespace
    ctx: RunContext
    model: nn.Module
    net: nn.Module  # RewardLogits (under torchrun: in DDP): what train steps run
    fwd: RewardLogits  # never the DDP wrapper (rank 0 evaluates alone)
    optimizer: torch.optim.Optimizer
    train_src: torch.utils.data.Dataset  # RewardDataset, or FrozenFeatures on the cache
    rank_batch: int  # this rank's share of --batch_size
    vocab_size: int  # the tokenizer's: what --augment_p draws from (never a padded vocabulary's unused ids)
    eval_loader: DataLoader
    meta: dict  # checkpoint_meta: what every checkpoint records
    max_iters: int  # --max_iters, or fewer by --max_epochs
    steps_per_epoch: int


def evaluate(state, run):
    """Val metrics of run.model (val_metrics, through run.fwd) recorded in state: the early stopper steps, a
    new best becomes state.best (with its iter), and state.stop_reason says when patience ran
    out. A non-finite val loss is refused. Returns (metrics, whether it is a new best)."""
    args = run.args
    m, _, _ = val_metrics(run.model, run.eval_loader, run.ctx.device, run.ctx.amp, args.loss, args.eval_max_batches,
                          run.fwd)
    # the last update can overflow the head with a finite train loss: save nothing then
    check_finite(m["val_loss"], "reward model val loss", state.step)
    improved = state.stopper.step(m["val_loss"])
    if improved:
        state.best = {**m, "step": state.step}
    if state.stopper.should_stop:
        state.stop_reason = (f"early_stopping (val loss not improved by {args.min_delta} for "
                             f"{args.patience} evals)")
    return m, improved


def save(state, run, last):
    """last: reward_last.pt, the whole training state for --resume (state under 'reward_train', the optimizer
    too). Else reward_ckpt.pt, the model of the best evaluation (just made: state.best) with its metrics.
    run.meta: checkpoint_meta's record of data, base model and flags."""
    if not last:
        b = state.best
        ckpt = make_checkpoint(run.model, None, iter_num=state.step, best_val_loss=b["val_loss"],
                               val_mae=b["val_mae"], const_mae=b["const_mae"], **run.meta)
    else:
        ckpt = make_checkpoint(run.model, run.optimizer, iter_num=state.step,
                               best_val_loss=state.best["val_loss"] if state.best else None,
                               **run.meta, reward_train=state.to_dict())
    atomic_torch_save(ckpt, os.path.join(run.args.out_dir, LAST_NAME if last else BEST_NAME))


def resume(state, args, model, optimizer, master):
    """Load out_dir/reward_last.pt into state, model and optimizer (refusing one trained from
    other checkpoints or flags)."""
    last_path = os.path.join(args.out_dir, LAST_NAME)
    last = read_checkpoint(last_path)
    st = last.get("reward_train")
    if st is None:
        raise CheckpointError(f"{last_path} holds no training state", "drop --resume to start over")
    if st.get("base_sha256") != state.base_sha256 or st.get("trunk_sha256", state.base_sha256) != state.trunk_sha256:
        raise CheckpointError(f"{last_path} was trained from a different --model_path / --init_trunk_from",
                              "resume with the original checkpoints, or use a fresh --out_dir")
    resumed, _ = model_from_checkpoint(last, "reward", path=last_path, require_mode="reward")
    if bool(resumed.config.reward_gen_features) != args.gen_features:
        raise CheckpointError(f"{last_path} was trained {'with' if args.gen_features is False else 'without'} "
                              f"--gen_features", "resume with the original flags, or use a fresh --out_dir")
    if resumed.config.reward_lm_features != args.lm_features:
        raise CheckpointError(f"{last_path} was trained "
                              f"{'with' if resumed.config.reward_lm_features else 'without'} --lm_features",
                              "resume with the original flags, or use a fresh --out_dir")
    if resumed.config.reward_per_position != args.per_position:
        kind = "per-position" if resumed.config.reward_per_position else "last-token"
        raise CheckpointError(f"{last_path} has a {kind} "
                              f"head, but --per_position is {'on' if args.per_position else 'off'}",
                              "resume with the original flags, or use a fresh --out_dir")
    model.load_state_dict(resumed.state_dict())
    optimizer.load_state_dict(last["optimizer"])
    # "iter": the name of reward_last.pt's step before the trainers' rename
    state.step, state.epoch, state.pos = st["step"] if "step" in st else st["iter"], st["epoch"], st["pos"]
    state.augment_p, state.ada_signs, state.ada_count = (st.get("augment_p", args.augment_p), st.get("ada_signs", 0.0),
                                                         st.get("ada_count", 0))
    state.best, state.stop_reason = st.get("best"), st.get("stop_reason")
    if state.best is not None and "step" not in state.best:
        state.best = {**{k: v for k, v in state.best.items() if k != "iter"}, "step": state.best["iter"]}
    if state.stop_reason == "max_iters" and state.step < args.max_iters:
        state.stop_reason = None
    state.stopper.load_state_dict(st["stopper"])
    if master:
        print(f"resuming from {last_path} at iter {state.step}" + (f" (already stopped: {state.stop_reason})"
                                                                 if state.stop_reason else ""))


# ---------------------------------------------------------------- set-up

def load_trunk(args, master):
    """The reward model: the trunk of --init_trunk_from (else --model_path) and a new head.
    Returns (model, the --model_path checkpoint, its tokenization or None)."""
    trunk_path = args.init_trunk_from or args.model_path
    base_ckpt = read_checkpoint(args.model_path)
    generator = model_from_checkpoint(base_ckpt, "generator", path=args.model_path, require_mode="generator",
                                      dropout=0.0)[0] if args.gen_features else None
    gen_config = generator and {**split_model_args(generator.config)[0], **split_model_args(generator.config)[1]}
    model, trunk_ckpt, new_params = load_model(trunk_path, mode="reward",
                                               reward_head_hidden_dim=args.reward_head_hidden_dim,
                                               require_mode="generator", dropout=args.dropout,
                                               reward_per_position=args.per_position,
                                               reward_lm_features=args.lm_features, reward_gen_features=gen_config)
    if generator is not None:  # the detector's copy of the generator whose samples it learns
        model.gen_lm.load_state_dict(generator.state_dict())
        new_params = [p for p in new_params if p != "gen_lm.*"] + [f"gen_lm: a frozen copy of {args.model_path}"]
    if master:
        print(f"loaded the trunk of {trunk_path} strictly; newly initialised: {', '.join(new_params)}")
    expected_tok = checkpoint_tokenization(base_ckpt)
    if args.init_trunk_from is not None:
        trunk_tok = checkpoint_tokenization(trunk_ckpt)
        if expected_tok is not None and trunk_tok is not None:
            check_tokenization_match(trunk_tok, expected_tok,
                                     what=f"--init_trunk_from {args.init_trunk_from}")
    return model, base_ckpt, expected_tok


class RewardSplits(NamedTuple):
    """The reward dataset's two splits and their tokenization (load_data)."""
    train: RewardDataset
    val: RewardDataset
    tok: object  # TokenizationInfo


def load_data(args, model, expected_tok, dist):
    """The train and val splits, checked against the model and its tokenization: RewardSplits."""
    train_ds = RewardDataset(args.data_dir, "train")
    val_ds = RewardDataset(args.data_dir, "val")
    ds_tok = train_ds.get_tokenization_info()
    if expected_tok is not None:
        for ds in (train_ds, val_ds):  # checked here, not in RewardDataset, so the message names the file
            check_tokenization_match(ds.get_tokenization_info(), expected_tok, what=f"reward dataset {ds.meta_path}")
    elif dist.master:
        print(f"warning: {args.model_path} records no tokenization; only the vocab size is checked")
    if int(ds_tok.vocab_size) > model.config.vocab_size:
        raise DataError(f"reward dataset vocab_size {ds_tok.vocab_size} exceeds the model's "
                        f"{model.config.vocab_size}", "regenerate the dataset with this model's tokenizer")
    n_tokens = train_ds.block_size
    if val_ds.block_size != n_tokens:
        raise DataError(f"{args.data_dir}: train and val sequences have different lengths",
                        "regenerate the reward dataset")
    if n_tokens > model.config.block_size:
        raise DataError(f"reward dataset sequences have {n_tokens} tokens, more than the model's "
                        f"block_size {model.config.block_size}",
                        "regenerate the dataset with --block_size <= the model's block_size")
    for ds in (train_ds, val_ds):
        top = ds.max_token() if len(ds) else -1
        if top >= model.config.vocab_size:
            raise BinaryFileError(f"{ds.x_path} holds token id {top}, outside the model's vocabulary "
                                  f"({model.config.vocab_size})", "regenerate the reward dataset from this model")
    if args.per_position:  # labels come from K = round(N * K/N): refuse inexact targets up front
        for ds in (train_ds, val_ds):
            ds.crossovers()
    if len(train_ds) // dist.world_size < 1:
        raise DataError(f"{args.data_dir}: the train split has too few samples ({len(train_ds)})")
    return RewardSplits(train_ds, val_ds, ds_tok)


def training_data(args, ctx, model, splits, first_block):
    """(train source, val loader): the RewardSplits' datasets, or with first_block (--cache_frozen) their
    frozen-block outputs, computed once (after a resume's load: the same frozen weights). The ranks other
    than 0 under torchrun (not ctx.master) never evaluate: no val cache, val loader None."""
    pin, master = ctx.device.startswith("cuda"), ctx.master
    train_ds, val_ds = splits.train, splits.val
    if first_block is None:
        return train_ds, DataLoader(val_ds, batch_size=args.batch_size, shuffle=False,
                                    num_workers=args.num_workers, pin_memory=pin)
    last_only = args.unfreeze_last_n_blocks == 0 and not args.per_position
    feats = {split: build_frozen_cache(model, ds, first_block, last_only, ctx, args.out_dir)
             for split, ds in (("train", train_ds), ("val", val_ds)) if split == "train" or master}
    if not master:
        return FrozenFeatures(feats["train"], train_ds), None
    return FrozenFeatures(feats["train"], train_ds), DataLoader(
        FrozenFeatures(feats["val"], val_ds), batch_size=args.batch_size, shuffle=False,
        num_workers=args.num_workers, pin_memory=pin)


def checkpoint_meta(args, state, base_ckpt, splits, trainable):
    """What every checkpoint of the run records: the data (RewardSplits), the base model, the flags."""
    return {"reward_data": {"data_dir": os.path.abspath(args.data_dir), "block_size": splits.train.block_size,
                            "train_samples": len(splits.train), "val_samples": len(splits.val),
                            "tokenization": splits.tok.to_dict()},
            "data": base_ckpt.get("data"),
            "tokenization": base_ckpt.get("tokenization") or splits.tok.to_dict(),
            "base_model": {"path": os.path.abspath(args.model_path), "sha256": state.base_sha256},
            "reward_training": {"loss": args.loss_name,
                                "unfreeze_last_n_blocks": args.unfreeze_last_n_blocks,
                                "per_position": args.per_position, "lm_features": args.lm_features,
                                "gen_features": args.gen_features,
                                "init_trunk_from": (None if args.init_trunk_from is None else
                                                    {"path": os.path.abspath(args.init_trunk_from),
                                                     "sha256": state.trunk_sha256}),
                                "trainable": trainable},
            "train_config": vars(args)}


def describe(run, splits, cache):
    """rank 0's two lines on what trains on what."""
    args, model = run.args, run.model
    train_ds, val_ds, ds_tok = splits
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    n_total = sum(p.numel() for p in model.parameters())
    what = ("head only" if args.unfreeze_last_n_blocks == 0 else "whole trunk + head"
            if args.unfreeze_last_n_blocks < 0 else f"head + last {args.unfreeze_last_n_blocks} blocks")
    what += ", per-position head" if args.per_position else ", last-token head"
    what += " with LM features" if args.lm_features else ""
    what += " and the generator's" if args.gen_features else ""
    what += (f"; cached once: embeddings + {model.config.n_layer - args.unfreeze_last_n_blocks} of "
             f"{model.config.n_layer} blocks (--cache_frozen)" if cache else "")
    print(f"device {run.ctx.device}, world size {run.ctx.dist.world_size}; trainable {n_train:,} of {n_total:,} "
          f"params ({what})")
    print(f"data {args.data_dir}: {len(train_ds)} train / {len(val_ds)} val sequences of {train_ds.block_size} "
          f"tokens, {ds_tok}; loss {args.loss_name}; up to {run.max_iters} steps ({run.steps_per_epoch}/epoch)")


# ---------------------------------------------------------------- the loop's steps

def batches(state, run):
    """This rank's (x, y) batches from state.epoch, state.pos on, epoch after epoch: the
    seeded order of epoch_order, so a resumed run sees the same ones. train_step counts
    state.pos; the end of an epoch moves state to the next one."""
    args, dist = run.args, run.ctx.dist
    while True:
        order = epoch_order(len(run.train_src), state.epoch, args.seed, run.rank_batch, dist.rank, dist.world_size)
        rest = order[state.pos * run.rank_batch:]
        if isinstance(run.train_src, FrozenFeatures):  # cached features: a gather per batch, not 64 collated rows
            yield from (run.train_src.batch(rest[s:s + run.rank_batch]) for s in range(0, len(rest), run.rank_batch))
        else:
            yield from DataLoader(run.train_src, batch_size=run.rank_batch, sampler=rest,
                                  num_workers=args.num_workers, pin_memory=run.ctx.device.startswith("cuda"))
        state.epoch, state.pos = state.epoch + 1, 0  # the epoch ran to its end


def train_step(state, run, x, y):
    """One optimizer step on this rank's batch; the global batch's loss joins state's log window."""
    pin, args = run.ctx.device.startswith("cuda"), run.args
    if state.augment_p > 0:  # seeded by step (and rank): a resumed run draws the same substitutions
        g = torch.Generator().manual_seed(args.seed * 1_000_003 + state.step * 64 + run.ctx.dist.rank)
        x = augment_tokens(x, state.augment_p, run.vocab_size, g)
    x, y = x.to(run.ctx.device, non_blocking=pin), y.to(run.ctx.device, non_blocking=pin)
    with run.ctx.amp:
        logits = run.net(x)
    loss = reward_loss(logits, y, args.loss)
    if args.ada_target is not None:  # ADA: this rank's natural positions (each rank adapts on its own share)
        signs, count = natural_sign(logits, y)
        state.ada_signs, state.ada_count = state.ada_signs + signs, state.ada_count + count
        if (state.step + 1) % ADA_INTERVAL == 0:  # every rank's window: one p for all (the ratio of the means)
            signs, count = all_mean([float(state.ada_signs), float(state.ada_count)], run.ctx.dist, run.ctx.device)
            state.augment_p = ada_adjust(state.augment_p, signs, count, args.ada_target)
            state.ada_signs, state.ada_count = 0.0, 0
    run.optimizer.zero_grad(set_to_none=True)
    scaler = run.ctx.scaler
    scaler.scale(loss).backward()
    clip_and_step(scaler, run.optimizer, [p for p in run.model.parameters() if p.requires_grad], run.args.grad_clip)
    state.step += 1
    state.pos += 1
    lv = loss.detach()
    if run.ctx.dist.enabled:  # the loss of the whole global batch, identical on every rank
        torch.distributed.all_reduce(lv)
        lv /= run.ctx.dist.world_size
    lv = lv.item()
    check_finite(lv, "reward model train loss", state.step)
    state.loss_sum += lv
    state.n_losses += 1


def log_train(state, run, bar, batch_size):
    """Log the window's mean train loss and throughput, and start a new window."""
    dt = time.time() - state.t0
    run.ctx.logger.log(kind="train", step=state.step, epoch=round(state.step / run.steps_per_epoch, 3),
                   train_loss=state.loss_sum / state.n_losses,
                   samples_per_s=state.n_losses * batch_size * run.ctx.dist.world_size / dt)
    bar.set_postfix(loss=f"{state.loss_sum / state.n_losses:.5f}")
    state.t0, state.loss_sum, state.n_losses = time.time(), 0.0, 0


def eval_and_save(state, run):
    """Evaluate (rank 0), save a new best and the last state; returns the stop flag (every rank)."""
    args, stop = run.args, torch.zeros(1, device=run.ctx.device)
    if run.ctx.dist.master:
        m, improved = evaluate(state, run)
        if improved:
            save(state, run, last=False)
        run.ctx.logger.log(kind="eval", step=state.step, epoch=round(state.step / run.steps_per_epoch, 3),
                           best=improved, augment_p=state.augment_p, **m)
        tqdm.write(f"iter {state.step}: val loss {m['val_loss']:.5f}, MAE {m['val_mae']:.4f} "
                   f"(constant 0.5: {m['const_mae']:.4f}){' *' if improved else ''}")
        stop[0] = float(state.stopper.should_stop)
        if state.step >= run.max_iters and state.stop_reason is None:
            state.stop_reason = "max_iters" if run.max_iters == args.max_iters else "max_epochs"
        save(state, run, last=True)
    if run.ctx.dist.enabled:
        torch.distributed.broadcast(stop, 0)
    return bool(stop.item())


def report(state, run):
    """The end (rank 0): the best checkpoint evaluated, the plots and reward_summary.json."""
    args = run.args
    best_path, metrics_path = os.path.join(args.out_dir, BEST_NAME), os.path.join(args.out_dir, METRICS_NAME)
    best_model, _, _ = load_model(best_path, device=run.ctx.device, require_mode="reward")
    # its frozen blocks are the cached ones: --cache_frozen evaluates it on the cache too
    m, pred, true = val_metrics(best_model, run.eval_loader, run.ctx.device, run.ctx.amp, args.loss,
                                args.eval_max_batches, RewardLogits(best_model, run.fwd.first_block))
    # what run_cycles' detector measurement needs of them (measures.measure_detector), so it need not
    # score the val split a second time
    with atomic_output(os.path.join(args.out_dir, PREDICTIONS_NAME)) as f:
        np.save(f, np.asarray(pred, dtype=np.float32), allow_pickle=False)
    plot_calibration(pred, true, os.path.join(args.out_dir, "calibration.png"),
                     title=f"reward model (val): MAE {m['val_mae']:.4f} vs constant {m['const_mae']:.4f}")
    plot_loss_curves(read_jsonl(metrics_path), os.path.join(args.out_dir, "loss_curves.png"),
                     title="reward model training", x_key="step",
                     panels=[(f"{args.loss_name} loss", [("train_loss", "train", "-"), ("val_loss", "val", "o-")]),
                             ("val MAE of P(natural)", [("val_mae", "reward model", "o-"),
                                                        ("const_mae", "constant 0.5", "--")])])
    summary = {"stop_reason": state.stop_reason, "iters": state.step,
               "best_iter": state.best["step"] if state.best else 0,
               **{k: m[k] for k in ("val_loss", "val_mse", "val_mae", "const_mae", "val_corr", "val_samples")},
               "loss": args.loss_name,
               "unfreeze_last_n_blocks": args.unfreeze_last_n_blocks, "per_position": args.per_position,
               "lm_features": args.lm_features, "gen_features": args.gen_features,
               "augment_p": args.augment_p, "ada_target": args.ada_target, "augment_p_final": state.augment_p,
               "init_trunk_from": args.init_trunk_from,
               "trainable_params": sum(p.numel() for p in run.model.parameters() if p.requires_grad),
               "checkpoint": os.path.abspath(best_path), "val_predictions": PREDICTIONS_NAME,
               # the precision they were made at: a reader at another one scores the split itself
               "dtype": run.ctx.dtype,
               # the val samples they are of: a reader checks its val_x.bin is this one
               "val_predictions_x_sha256": sha256_file(os.path.join(args.data_dir, "val_x.bin")),
               # what a FLOPs count of the run needs (experiment/flops.py): its batches and evaluations, the
               # reward data's sizes and the detector's shape
               **{k: getattr(args, k) for k in ("batch_size", "eval_interval", "eval_max_batches")},
               "reward_data": {k: v for k, v in run.meta["reward_data"].items() if k != "tokenization"},
               **model_shape(run.model)}
    atomic_write_text(os.path.join(args.out_dir, SUMMARY_NAME), json.dumps(summary, indent=2) + "\n")
    print(f"stopped after {state.step} steps: {state.stop_reason}")
    print(f"best (iter {summary['best_iter']}): val loss {m['val_loss']:.5f}, val MAE {m['val_mae']:.4f} "
          f"vs constant-0.5 MAE {m['const_mae']:.4f}, corr {m['val_corr']:.3f}")
    print(f"wrote {best_path}, {metrics_path}, calibration.png, loss_curves.png in {args.out_dir}")


def main(argv=None):
    # ---------------------------------------------------------------- set-up
    args = get_args(argv)
    ctx = open_run(args)
    dist, device = ctx.dist, ctx.device
    rank_batch = dist.share(args.batch_size, "--batch_size")
    torch.manual_seed(args.seed)  # the new head's init: the same on every rank
    model, base_ckpt, expected_tok = load_trunk(args, dist.master)
    splits = load_data(args, model, expected_tok, dist)
    trainable = set_trainable(model, args.unfreeze_last_n_blocks)
    model.to(device)
    set_modes(model, args.unfreeze_last_n_blocks)
    optimizer = make_optimizer(model, args)
    cache = use_frozen_cache(args)
    net = fwd = RewardLogits(model, model.config.n_layer - args.unfreeze_last_n_blocks if cache else None)
    net = wrap_ddp(net, dist, device)
    torch.manual_seed(args.seed + dist.rank)  # dropout noise: per rank
    base_sha = source_sha256(args.model_path)
    state = RMState(EarlyStopping(args.patience, args.min_delta, mode="min"), base_sha,
                    base_sha if args.init_trunk_from is None else source_sha256(args.init_trunk_from),
                    augment_p=args.augment_p)
    metrics_path = os.path.join(args.out_dir, METRICS_NAME)
    if args.resume and os.path.exists(os.path.join(args.out_dir, LAST_NAME)):
        resume(state, args, model, optimizer, dist.master)
    resumed = state.step > 0 or state.best is not None
    ctx.open_log(args, metrics_path, kept_records(state.step) if resumed else None,
                 purge_step=state.step + 1 if resumed else None)
    if state.stop_reason is not None:  # a finished run resumed: nothing to train, so nothing to cache
        fwd.first_block = None
    train_src, eval_loader = training_data(args, ctx, model, splits, fwd.first_block)
    steps_per_epoch = max(1, steps_in_epoch(len(splits.train), rank_batch, dist.world_size))
    max_iters = min(args.max_iters, math.inf if args.max_epochs is None else
                    math.ceil(args.max_epochs * steps_per_epoch))
    vocab_size = expected_tok.vocab_size if expected_tok is not None else model.config.vocab_size
    run = RMRun(args, ctx, model, net, fwd, optimizer, train_src, rank_batch, vocab_size, eval_loader,
                checkpoint_meta(args, state, base_ckpt, splits, trainable), max_iters,
                steps_per_epoch)
    if dist.master:
        describe(run, splits, cache)

    # ---------------------------------------------------------------- loop
    if state.step == 0 and state.stop_reason is None and state.best is None:
        eval_and_save(state, run)  # the untrained head predicts 0.5: the constant baseline
    bar = progress_bar(total=max_iters, initial=min(state.step, max_iters), desc="reward", disable=not dist.master,
                       dynamic_ncols=True)
    steps, state.t0 = batches(state, run), time.time()
    while state.stop_reason is None and state.step < max_iters:
        x, y = next(steps)
        train_step(state, run, x, y)
        bar.update(1)
        if state.step % args.log_interval == 0:
            log_train(state, run, bar, x.size(0))
        if (state.step % args.eval_interval == 0 or state.step >= max_iters) and eval_and_save(state, run):
            break
    bar.close()

    # ---------------------------------------------------------------- the end
    if dist.master:
        if state.stop_reason is None:  # e.g. resumed past a smaller --max_iters
            state.stop_reason = "max_iters"
            save(state, run, last=True)
        report(state, run)
    finish(ctx)


if __name__ == "__main__":
    run_cli(main, report_peak=True)
