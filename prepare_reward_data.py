"""
Build the reward-model dataset from a base model and a corpus.

For each split separately (train from the base model's train split, val from its val
split), the token stream is cut into non-overlapping blocks of N tokens. Every block
gives `samples_per_chunk` samples; sample i (block b = i // samples_per_chunk) keeps the
block's first K_i natural tokens, K_i uniform in [1, N-1], and the base model generates
the other N - K_i tokens. Its target is [K_i/N, (N-K_i)/N].

Output in --output_dir, per split: {split}_x.bin (uint16, (S, N)), {split}_y.bin
(float32, (S, 2)), {split}_metadata.txt (key: value lines); and the run's record,
reward_data_summary.json.

    python prepare_reward_data.py --model_path out-shakespeare-char/ckpt.pt \
        --data_path data/shakespeare_char/input.txt --output_dir data/reward_dataset
    python prepare_reward_data.py --model_path out/ckpt.pt --input_mode binary \
        --train_bin data/shakespeare_char/train.bin --val_bin data/shakespeare_char/val.bin

Under torchrun the batches are dealt out to the processes and rank 0 writes every row:
    torchrun --standalone --nproc_per_node=4 prepare_reward_data.py --model_path ... (same flags)

Reproducibility: the same inputs, flags and seed give byte-identical files, whatever
--gen_batch_size, the thread count, the number of torchrun processes, or interruptions
(kill it, rerun with --resume, with any number of processes):
  - all K_i of a split are drawn up front from a generator seeded by (seed, split);
  - sample i's sampling noise is its own stream of uniforms, seeded by (seed, split, i);
  - a sample's floating-point path never depends on its batch mates: samples are
    grouped by a canonical prefill length that depends on K_i only (K_i rounded down to
    a multiple of PREFILL_BUCKET), batches have at least MIN_ROWS rows (matmuls use
    another kernel below that), and the model's decode attention is batch-invariant.
Byte identity across batch sizes and thread counts is tested for CPU generation; CUDA
kernels may choose other algorithms for other batch shapes (resume there with the same
--gen_batch_size and expect, at worst, rare single-token differences).
Progress is kept in {split}_x.bin.tmp / {split}_y.bin.tmp (each sample at its final row)
plus a bitmap of finished samples, flushed after every batch; a finished split is
renamed into place and its metadata written last, so nothing half-written looks complete.
"""
import json
import os
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Optional

import numpy as np
import torch

from core.cli import progress_bar, run_cli
from core.devices import DistInfo, end_run, init_distributed, resolve_dtype
from core.errors import DataError, ProjectError
from core.files import atomic_output, atomic_write_text, check_writable_dir, hold_dir_lock, sha256_file
from data_loader import TokenData, load_token_data
from engine import Engine
from lib.checkpoint import checkpoint_tokenization, model_from_checkpoint, sequence_length
from lib.hf_interop import source_sha256
# the sample plan and the generation live in the library module lib/reward_samples.py (importable from here too)
from lib.reward_samples import (MIN_ROWS, PREFILL_BUCKET, SPLIT_IDS, GenSettings, crossover_plan,  # noqa: F401
                                generate_batch, iter_generated, labels, make_batches, prefill_lengths, sample_seed,
                                sample_uniforms, temperature_counts, temperature_plan)
from reward_data_config import SPLITS, STATE_NAME, RewardDataConfig, check_tokenization_match, partial_files

FORMAT_VERSION = 1
SUMMARY_NAME = "reward_data_summary.json"  # the run's record, written at its end (write_summary)


# ----------------------------------------------------------------------------- checks

def warn(msg):
    if int(os.environ.get("RANK", 0)) != 0:  # under torchrun, rank 0 speaks for all
        return
    bar = "!" * 78
    print(f"{bar}\nWARNING: {msg}\n{bar}", flush=True)


def check_compatibility(model, data, block_size, ckpt, model_path):
    """Tokenizer vs model vocab, block size, uint16 range, enough tokens for a block."""
    info, cfg = data.info, model.config
    if info.vocab_size > cfg.vocab_size:
        raise DataError(f"the tokenizer's vocab_size {info.vocab_size} exceeds the vocab_size {cfg.vocab_size} of "
                        f"{model_path}", "use the tokenization (and meta.pkl) the base model was trained with")
    if not 2 <= block_size <= cfg.block_size:
        raise DataError(f"block_size {block_size} must be in [2, the model's block_size {cfg.block_size}]",
                        "omit --block_size to use the model's")
    recorded = checkpoint_tokenization(ckpt)
    if recorded is not None:
        check_tokenization_match(info, recorded, "dataset")
    else:
        warn(f"{model_path} records no tokenization; only the vocabulary size could be checked "
             f"(data: {info})")
    for split in SPLITS:
        n = len(data.split(split))
        if n < block_size:
            raise DataError(f"the {split} split has {n} tokens, fewer than one block of {block_size}",
                            "use more text or a smaller --block_size")


def check_split_alignment(ckpt, data, input_mode, train_split, model_path, allow):
    """Refuse data whose train/val split differs from the one the base model trained on.

    Returns a short description of the outcome for the metadata."""
    rec = ckpt.get("data")
    if not isinstance(rec, dict) or not (rec.get("train_sha256") or rec.get("train_tokens")):
        msg = (f"{model_path} records no train/val split of its training data (e.g. a nanoGPT checkpoint), "
               f"so it cannot be verified that the val samples hold only text the base model never trained on")
        if not allow:
            raise DataError(msg, "use a checkpoint written by train.py, or pass --allow_split_mismatch if you "
                                 "are sure the data is split exactly as the base model's training data")
        warn(msg + " (--allow_split_mismatch given: continuing)")
        return "unverified (no record in the checkpoint; --allow_split_mismatch)"
    src = data.source
    problems = []
    if input_mode == "text" and rec.get("train_split") is not None \
            and abs(float(rec["train_split"]) - float(train_split)) > 1e-12:
        problems.append(f"--train_split is {train_split} but the model's data was split at {rec['train_split']}")
    for split in SPLITS:
        n_ours, n_rec = src[f"{split}_tokens"], rec.get(f"{split}_tokens")
        h_ours, h_rec = src[f"{split}_sha256"], rec.get(f"{split}_sha256")
        if n_rec is not None and int(n_rec) != n_ours:
            problems.append(f"{split}: {n_ours:,} tokens here vs {int(n_rec):,} in the model's {split} data")
        elif h_rec and h_rec != h_ours:
            problems.append(f"{split}: same length but different tokens (sha256 {h_ours[:12]} vs {h_rec[:12]})")
    if not problems:
        return "matched (token counts and sha256 of both splits equal the checkpoint's record)"
    msg = ("the data's train/val split does not match the base model's training data "
           f"({rec.get('data_dir', '?')}): " + "; ".join(problems) + ". Reward val samples could then contain "
           "text the base model was trained on (and train samples its held-out text), contaminating evaluation")
    if not allow:
        raise DataError(msg, "use the corpus and --train_split the base model was trained with (or --input_mode "
                             "binary with its train.bin/val.bin); --allow_split_mismatch overrides this check")
    warn(msg + " (--allow_split_mismatch given: continuing)")
    return "MISMATCH overridden with --allow_split_mismatch: " + "; ".join(problems)


def restrict_output_vocab(model, vocab_size):
    """Generate only real token ids: e.g. nanoGPT pads GPT-2's 50257 tokens to 50304, and
    the padding ids must never appear in the dataset. The output layer keeps only the
    first vocab_size rows (the model is used for generation only here)."""
    if vocab_size >= model.config.vocab_size:
        return
    w = model.transformer.wte.weight.detach()[:vocab_size]
    head = torch.nn.Linear(model.config.n_embd, vocab_size, bias=False, device=w.device, dtype=w.dtype)
    head.weight = torch.nn.Parameter(w, requires_grad=False)
    model.lm_head = head


# ----------------------------------------------------------------------------- output files

def split_paths(out_dir, split):
    j = lambda name: os.path.join(out_dir, name)  # noqa: E731
    return {"x": j(f"{split}_x.bin"), "y": j(f"{split}_y.bin"), "meta": j(f"{split}_metadata.txt"),
            "x_tmp": j(f"{split}_x.bin.tmp"), "y_tmp": j(f"{split}_y.bin.tmp"), "done": j(f"{split}_done.tmp")}


def write_done(path, done):
    with atomic_output(path, "wb") as f:
        f.write(np.packbits(done).tobytes())


def read_done(path, n):
    if not os.path.exists(path):
        return None
    with open(path, "rb") as f:
        raw = np.frombuffer(f.read(), dtype=np.uint8)
    if raw.size != (n + 7) // 8:
        return None
    return np.unpackbits(raw, count=n).astype(bool)


def fsync_path(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def split_complete(p):
    return all(os.path.exists(p[k]) for k in ("x", "y", "meta")) and not any(
        os.path.exists(p[k]) for k in ("x_tmp", "y_tmp", "done"))


def metadata_text(fields):
    return "".join(f"{k}: {'None' if v is None else v}\n" for k, v in fields.items())


def prepare_output_dir(cfg, fingerprint):
    """Check/record the run's settings; a fresh run clears an older complete dataset."""
    out = cfg.output_dir
    check_writable_dir(out, "--output_dir")  # validate() checked it; this records that the run made it
    hold_dir_lock(out, "--output_dir")  # one writer: a second run into this directory stops here
    state_path = os.path.join(out, STATE_NAME)
    partial = partial_files(out)
    state = None
    if os.path.exists(state_path):
        try:
            with open(state_path) as f:
                state = json.load(f)
        except (OSError, json.JSONDecodeError):
            state = None
    if cfg.resume and (partial or state):
        if state is None:
            raise ProjectError(f"{out} holds partial files ({', '.join(partial)}) but no readable {STATE_NAME}, so "
                               f"their settings are unknown", "start over in a fresh --output_dir")
        old = state.get("fingerprint", {})
        diff = [f"{k}: {old.get(k)!r} then, {v!r} now" for k, v in fingerprint.items() if old.get(k) != v]
        if diff:
            raise ProjectError(f"--resume: the run in {out} was started with other settings ({'; '.join(diff)})",
                               "rerun with the original flags, or drop --resume and use a fresh --output_dir")
        print(f"resuming the run in {out}")
        return
    if partial:  # validate() reports this too; kept here for programmatic callers
        raise ProjectError(f"Output directory {out} holds an unfinished run ({', '.join(partial)})",
                           "rerun with --resume (and the same flags) to finish it, or choose a fresh --output_dir")
    old_files = [p[k] for s in SPLITS for p in [split_paths(out, s)] for k in ("meta", "x", "y")
                 if os.path.exists(p[k])]
    if old_files:
        print(f"replacing the existing reward dataset in {out}")
        for path in old_files:  # metadata first: the old splits stop looking complete at once
            os.remove(path)
    atomic_write_text(state_path, json.dumps({"fingerprint": fingerprint,
                                              "started": datetime.now(timezone.utc).isoformat(timespec="seconds")},
                                             indent=2) + "\n")


def shard_rounds(batches, dist):
    """Deal the batches out to the ranks, one per rank per round: (round, this rank's batch or None)."""
    for j in range(0, len(batches), dist.world_size):
        k = j + dist.rank
        yield batches[k] if k < len(batches) else None


def gather_rows(batch, x, gen, dist):
    """All ranks' (indices, rows) of one round, on every rank (gloo and nccl both do all_gather).

    Batches are padded to gen.batch_size rows (index -1) so every rank sends one shape."""
    cap, N = gen.batch_size, gen.block_size
    idx = torch.full((cap,), -1, dtype=torch.int64, device=gen.device)
    rows = torch.zeros((cap, N), dtype=torch.int32, device=gen.device)
    if batch is not None:
        idx[:len(batch)] = torch.from_numpy(batch)
        rows[:len(batch)] = torch.from_numpy(x.astype(np.int32))
    idx_all = [torch.empty_like(idx) for _ in range(dist.world_size)]
    rows_all = [torch.empty_like(rows) for _ in range(dist.world_size)]
    torch.distributed.all_gather(idx_all, idx)
    torch.distributed.all_gather(rows_all, rows)
    out = []
    for i, r in zip(idx_all, rows_all):
        keep = i >= 0
        if keep.any():
            out.append((i[keep].cpu().numpy(), r[keep].cpu().numpy().astype(np.uint16)))
    return out


def broadcast_object(obj, dist):
    """rank 0's `obj` on every rank."""
    if not dist.enabled:
        return obj
    box = [obj]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


@dataclass(frozen=True)
class SplitJob:
    """One split to generate, as every step of it reads it: its name, source tokens, crossover plan K and
    labels Y, its files (split_paths), the generation settings, the metadata both splits share, and whether
    rank 0 shows a progress bar."""
    split: str
    tokens: np.ndarray
    K: np.ndarray
    Y: np.ndarray
    paths: dict
    gen: GenSettings
    out_dir: str
    meta_fields: dict
    progress: bool = True


def split_job(tokens, K, split, gen, out_dir, meta_fields):
    return SplitJob(split, tokens, K, labels(K, gen.block_size), split_paths(out_dir, split), gen, out_dir,
                    meta_fields)


def run_split(model, job, resume, dist):
    """Generate (or finish) one split (a SplitJob); returns (samples, generated tokens, seconds).

    Under torchrun (dist.enabled) the pending batches are dealt out to the ranks round by
    round; every round's rows are gathered and rank 0 alone writes them, so the files are
    exactly those of a single process (a sample's tokens never depend on where it ran)."""
    master = dist.master
    S, split, p = len(job.K), job.split, job.paths
    complete = broadcast_object(split_complete(p) if master else None, dist)
    if complete:
        if master:
            print(f"{split}: already complete ({S:,} samples)")
        return S, 0, 0.0
    t0 = time.time()
    generated = 0
    partial = open_partial_split(p, split, S, job.gen.block_size, resume) if master else None
    pending = broadcast_object(None if partial is None else partial[3], dist)
    if pending is not None:
        generated = generate_pending(model, job, partial, pending, dist, t0)
        partial = None  # the memmaps are closed before their files are renamed
    if not master:
        return S, generated, time.time() - t0
    finalize_split(job)
    return S, generated, time.time() - t0


def open_partial_split(p, split, S, N, resume):
    """Rank 0: the split's temporary files (kept with --resume, else new) as (x memmap, y memmap,
    done bitmap, pending sample indices); None when a resumed split has every sample done."""
    done = read_done(p["done"], S) if resume else None
    if done is not None and done.all():
        return None
    sizes_ok = (os.path.exists(p["x_tmp"]) and os.path.getsize(p["x_tmp"]) == S * N * 2
                and os.path.exists(p["y_tmp"]) and os.path.getsize(p["y_tmp"]) == S * 8)
    if done is not None and sizes_ok:
        x_mm = np.memmap(p["x_tmp"], dtype=np.uint16, mode="r+", shape=(S, N))
        y_mm = np.memmap(p["y_tmp"], dtype=np.float32, mode="r+", shape=(S, 2))
    else:
        x_mm = np.memmap(p["x_tmp"], dtype=np.uint16, mode="w+", shape=(S, N))
        y_mm = np.memmap(p["y_tmp"], dtype=np.float32, mode="w+", shape=(S, 2))
        done = np.zeros(S, dtype=bool)
        write_done(p["done"], done)
    pending = np.flatnonzero(~done)
    if len(pending) < S:
        print(f"{split}: {S - len(pending):,} of {S:,} samples already done")
    return x_mm, y_mm, done, pending


def generate_pending(model, job, partial, pending, dist, t0):
    """Generate a SplitJob's pending samples batch by batch (dealt out to the ranks under torchrun); rank 0
    writes each round's rows into the memmaps of `partial` (open_partial_split), flushes them, then marks
    them done. Returns the tokens generated (counted on rank 0; t0: the split's start, for the rate)."""
    master, gen, K = dist.master, job.gen, job.K
    N, S = gen.block_size, len(K)
    if master:
        x_mm, y_mm, done, _ = partial
    generated = 0
    bar = progress_bar(total=S, initial=S - len(pending), unit="sample", desc=f"{job.split}",
                       disable=not (job.progress and master), dynamic_ncols=True)
    batches = make_batches(pending, K, gen.batch_size, gen.merge)
    engine = Engine(model)  # one engine: its decoders (and their CUDA graphs) serve every batch
    for batch in shard_rounds(batches, dist):
        x = None if batch is None else generate_batch(engine, job.tokens, batch, K, gen, job.split)
        results = gather_rows(batch, x, gen, dist) if dist.enabled else [(batch, x)]
        if not master:
            continue
        for b, rows in results:
            x_mm[b] = rows
            y_mm[b] = job.Y[b]
        x_mm.flush()  # data first, then the bitmap that declares it done
        y_mm.flush()
        for b, _ in results:
            done[b] = True
            generated += int((N - K[b]).sum())
            bar.update(len(b))
        write_done(job.paths["done"], done)
        bar.set_postfix(gen_tok_s=f"{generated / max(time.time() - t0, 1e-9):,.0f}")
    bar.close()
    return generated


def finalize_split(job):
    """Rank 0: both tmp files into place, then the metadata (a split is complete only with it)."""
    p, K, Y, split, gen = job.paths, job.K, job.Y, job.split, job.gen
    N, S = gen.block_size, len(K)
    for tmp, final in ((p["x_tmp"], p["x"]), (p["y_tmp"], p["y"])):
        if os.path.exists(tmp):
            fsync_path(tmp)
            os.replace(tmp, final)
    if not (os.path.getsize(p["x"]) == S * N * 2 and os.path.getsize(p["y"]) == S * 8):
        raise ProjectError(f"{split}: the finished files in {job.out_dir} have unexpected sizes",
                           "start over in a fresh --output_dir")
    fields = dict(job.meta_fields)
    fields.update(split=split, num_samples=S, x_shape=f"({S}, {N})", y_shape=f"({S}, 2)",
                  num_blocks=-(-S // gen.samples_per_chunk), crossover_min=int(K.min()), crossover_max=int(K.max()),
                  crossover_mean=f"{K.mean():.4f}", y_natural_mean=f"{Y[:, 0].astype(np.float64).mean():.6f}",
                  temperature_counts=(None if gen.temperature_plans is None
                                      else temperature_counts(gen.temperature_plans[split])),
                  x_sha256=sha256_file(p["x"]), y_sha256=sha256_file(p["y"]),
                  created=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    atomic_write_text(p["meta"], metadata_text(fields))
    if os.path.exists(p["done"]):
        os.remove(p["done"])


# ----------------------------------------------------------------------------- main

def main(argv=None):
    cfg = RewardDataConfig.from_args(argv)
    dist, device = init_distributed(cfg.device)
    master = dist.master
    log = print if master else (lambda *a, **k: None)
    if cfg.validate(report=master):
        sys.exit(2)
    if dist.enabled:  # every rank has looked at the output dir before rank 0 touches it
        torch.distributed.barrier()
    log("Configuration validation passed")
    t_start = time.time()
    model, n_params = load_base_model(cfg, device, dist, log)
    data, N, split_check = load_checked_data(cfg, model, log)
    run = RewardDataRun(cfg, dist, device, model, n_params, data, N, split_check, cfg.temperature_list(),
                        source_sha256(cfg.model_path))

    temps = run.temps
    plans = {s: crossover_plan(len(data.split(s)), N, cfg.samples_per_chunk, cfg.seed, s,
                               cfg.max_blocks_per_split, cfg.max_samples_per_split) for s in SPLITS}
    if master:
        prepare_output_dir(cfg, run_fingerprint(run, plans))
    if dist.enabled:  # the other ranks start once rank 0 has checked and set up the output dir
        torch.distributed.barrier()

    meta_fields = metadata_fields(run)
    gen = GenSettings(N, cfg.samples_per_chunk, cfg.seed, cfg.temperature, cfg.top_k, cfg.gen_batch_size, device,
                      dtype=resolve_dtype(cfg.dtype, device), merge=device.startswith("cuda"))
    if temps is not None:  # each sample's own temperature, drawn over the sample plan gen describes
        gen.temperature_plans = {s: temperature_plan(gen, len(data.split(s)), s, temps, len(plans[s])) for s in SPLITS}
    log(f"generating: block_size {N}, {cfg.samples_per_chunk} samples per block, temperature "
        f"{cfg.temperature if temps is None else 'one of ' + ','.join(map(str, temps)) + ' per sample'}, "
          f"top_k {cfg.top_k}, seed {cfg.seed}, batch {cfg.gen_batch_size}, {gen.dtype}"
        + (", batches across prefill lengths" if gen.merge else ""))
    results = {}
    for split in SPLITS:
        job = split_job(data.split(split), plans[split], split, gen, cfg.output_dir, meta_fields)
        results[split] = run_split(model, job, cfg.resume, dist)
    if dist.enabled:  # rank 0 has finalized the last split
        torch.distributed.barrier()
    end_run(dist)
    if master:
        write_summary(cfg, N, results)
        print_summary(run, results, t_start)


def load_base_model(cfg, device, dist, log):
    """The validated base generator (cfg.checkpoint) on `device`, in eval mode, and its parameter count
    (counted here: restrict_output_vocab later unties the output layer)."""
    model, _ = model_from_checkpoint(cfg.checkpoint, path=cfg.model_path, require_mode="generator")
    model.to(device).eval()
    mc = model.config
    n_params = model.get_num_params()
    log(f"device {device} ({dist.world_size} process(es)); base model {cfg.model_path}: {n_params / 1e6:.2f}M parameters "
          f"({mc.n_layer} layers, {mc.n_head} heads, {mc.n_embd} wide, block {mc.block_size}, vocab {mc.vocab_size})")
    return model, n_params


def load_checked_data(cfg, model, log):
    """The token data of both splits, checked against the model (vocabulary, block size, the
    train/val split it trained on); restricts the model's output to the data's vocabulary.
    Returns (data, block size N, the split check's outcome)."""
    method, meta_path = cfg.resolved_tokenization
    data = load_token_data(cfg.input_mode, cfg.data_path, cfg.train_bin, cfg.val_bin, method, meta_path,
                           cfg.train_split)
    N = cfg.block_size or sequence_length(cfg.checkpoint, cfg.model_path)
    log(f"data ({cfg.input_mode} mode): tokenization {data.info}; train {len(data.train):,} tokens, "
          f"val {len(data.val):,} tokens")
    check_compatibility(model, data, N, cfg.checkpoint, cfg.model_path)
    split_check = check_split_alignment(cfg.checkpoint, data, cfg.input_mode, cfg.train_split, cfg.model_path,
                                        cfg.allow_split_mismatch)
    log(f"train/val split check: {split_check}")
    restrict_output_vocab(model, data.info.vocab_size)
    return data, N, split_check


@dataclass(frozen=True)
class RewardDataRun:
    """What set-up builds and the rest only reads: the config, the ranks and device, the base model (its
    parameter count taken before restrict_output_vocab), the checked data with its block size N and split
    check, the temperatures (None: cfg.temperature for every sample) and the model file's sha256."""
    cfg: RewardDataConfig
    dist: DistInfo
    device: str
    model: torch.nn.Module
    n_params: int
    data: TokenData
    N: int
    split_check: str
    temps: Optional[list]
    model_sha: str


def run_fingerprint(run, plans):
    """The settings a --resume must match (recorded in STATE_NAME)."""
    cfg, data, N, temps, model_sha, device = run.cfg, run.data, run.N, run.temps, run.model_sha, run.device
    dtype = resolve_dtype(cfg.dtype, device)
    src = data.source
    return {"format_version": FORMAT_VERSION, "model_sha256": model_sha, "input_mode": cfg.input_mode,
            "train_sha256": src["train_sha256"], "val_sha256": src["val_sha256"],
            "tokenization_method": data.info.method, "vocab_size": data.info.vocab_size,
            "block_size": N, "samples_per_chunk": cfg.samples_per_chunk, "temperature": cfg.temperature,
            "temperatures": temps, "top_k": cfg.top_k, "seed": cfg.seed, "prefill_bucket": PREFILL_BUCKET,
            "train_samples": len(plans["train"]), "val_samples": len(plans["val"]),
            "device_type": torch.device(device).type,
            # float32 runs keep the fingerprint of the versions before --dtype, so they still resume
            **({} if dtype == "float32" else {"dtype": dtype})}


def metadata_fields(run):
    """The key: value lines both splits' metadata files share (finalize_split adds the split's own)."""
    cfg, data, N, temps, device = run.cfg, run.data, run.N, run.temps, run.device
    mc, n_params, model_sha, split_check = run.model.config, run.n_params, run.model_sha, run.split_check
    src = data.source
    meta_fields = {"format_version": FORMAT_VERSION, "x_dtype": "uint16", "y_dtype": "float32",
                   "block_size": N, "tokenization_method": data.info.method, "vocab_size": data.info.vocab_size,
                   "meta_path": data.info.meta_path,
                   "y_columns": "natural_fraction K/N, synthetic_fraction (N-K)/N",
                   "model_path": os.path.abspath(cfg.model_path), "model_sha256": model_sha,
                   "model_params": n_params, "model_block_size": mc.block_size,
                   "model_vocab_size": mc.vocab_size, "input_mode": cfg.input_mode}
    for k in ("data_path", "data_sha256", "train_split", "split_rule", "train_bin", "val_bin"):
        if k in src:
            meta_fields[k] = src[k]
    meta_fields.update({"train_source_tokens": src["train_tokens"], "train_source_sha256": src["train_sha256"],
                        "val_source_tokens": src["val_tokens"], "val_source_sha256": src["val_sha256"],
                        "split_check": split_check, "samples_per_chunk": cfg.samples_per_chunk,
                        "temperature": cfg.temperature if temps is None else None,
                        "temperatures": None if temps is None else ",".join(f"{t:g}" for t in temps),
                        "top_k": cfg.top_k, "seed": cfg.seed,
                        "max_blocks_per_split": cfg.max_blocks_per_split,
                        "max_samples_per_split": cfg.max_samples_per_split,
                        "prefill_bucket": PREFILL_BUCKET, "device": device,
                        "dtype": resolve_dtype(cfg.dtype, device),
                        "generator": "prepare_reward_data.py"})
    return meta_fields


def write_summary(cfg, N, results):
    """--output_dir/reward_data_summary.json, the dataset's record for what builds on it (run_cycles'
    FLOPs count and its check of the detector's block size): N, the samples per split, their tokens
    (every sample's N, prompt included: the generation's forwards) and the generator's model_args."""
    samples = {split: int(r[0]) for split, r in results.items()}
    summary = {"block_size": int(N), "samples": samples, "tokens": int(N) * sum(samples.values()),
               "generator_model_args": cfg.checkpoint["model_args"]}
    atomic_write_text(os.path.join(cfg.output_dir, SUMMARY_NAME), json.dumps(summary, indent=2) + "\n")


def print_summary(run, results, t_start):
    """Rank 0's closing report: the model, the tokenization, each split's files, the speed."""
    cfg, n_params, data, N, split_check, device = run.cfg, run.n_params, run.data, run.N, run.split_check, run.device
    total_gen = sum(r[1] for r in results.values())
    total_t = sum(r[2] for r in results.values())
    print("\n=== Reward dataset complete ===")
    print(f"device: {device}")
    print(f"model: {cfg.model_path} ({n_params / 1e6:.2f}M parameters)")
    print(f"tokenization: {data.info.method} (vocab_size={data.info.vocab_size})"
          + (f", meta {data.info.meta_path}" if data.info.meta_path else ""))
    print(f"train/val split check: {split_check}")
    for split in SPLITS:
        S = results[split][0]
        p = split_paths(cfg.output_dir, split)
        print(f"{split}: {len(data.split(split)):,} tokens -> {S:,} samples "
              f"({-(-S // cfg.samples_per_chunk):,} blocks of {N} x {cfg.samples_per_chunk})")
        print(f"  X: {p['x']} ({S}, {N}) uint16")
        print(f"  Y: {p['y']} ({S}, 2) float32")
        print(f"  metadata: {p['meta']}")
    if total_t > 0:
        print(f"generated {total_gen:,} tokens in {total_t:.1f}s ({total_gen / total_t:,.0f} tok/s); "
              f"total time {time.time() - t_start:.1f}s")


if __name__ == "__main__":
    run_cli(main, report_peak=True)
