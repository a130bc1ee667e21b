"""
Read a reward dataset written by prepare_reward_data.py:

  {split}_x.bin        uint16, (num_samples, block_size)  token ids
  {split}_y.bin        float32, (num_samples, 2)          [K/N, (N-K)/N] = [P(natural), P(synthetic)]
  {split}_metadata.txt key: value lines (shapes, dtypes, tokenization, provenance)

RewardDataset is a torch Dataset over np.memmap views: the files are opened lazily in
each process (DataLoader workers open their own), so memory does not grow with the
file size. Inspect a dataset and check its quality with

    python reward_dataset_loader.py --data_dir data/reward_dataset
"""
import argparse
import os
import re
import shutil

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from core.cli import check_flag_ranges, run_cli
from core.errors import BinaryFileError, DataError, TokenizationMismatchError
from core.files import atomic_output, atomic_write_text, sha256_file
from tokenization_manager import TokenizationInfo, check_tokenization_match

SPLITS = ("train", "val")
DTYPES = {"uint16": np.uint16, "float32": np.float32}
REQUIRED_KEYS = ("num_samples", "block_size", "x_shape", "y_shape", "x_dtype", "y_dtype",
                 "tokenization_method", "vocab_size")


def read_metadata(path):
    """`key: value` lines -> dict of strings. Raises DataError when missing/unreadable."""
    if not os.path.exists(path):
        raise DataError(f"reward dataset metadata not found: {path}",
                        "create the dataset with prepare_reward_data.py (a split without metadata "
                        "is unfinished: rerun it with --resume)")
    meta = {}
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except UnicodeDecodeError:
        raise DataError(f"{path} is not a text file of `key: value` lines (not valid UTF-8)",
                        "re-create the dataset with prepare_reward_data.py") from None
    for line in lines:
        if ":" in line:
            k, v = line.split(":", 1)
            meta[k.strip()] = v.strip()
    missing = [k for k in REQUIRED_KEYS if k not in meta]
    if missing:
        raise DataError(f"{path} lacks {', '.join(missing)}", "re-create the dataset with prepare_reward_data.py")
    return meta


def parse_shape(s):
    return tuple(int(v) for v in re.findall(r"\d+", s))


class RewardDataset(Dataset):
    """(x: LongTensor[block_size], y: FloatTensor[2]) samples of one split."""

    def __init__(self, data_dir, split="train", expected_tokenization_info=None):
        if split not in SPLITS:
            raise ValueError(f"split must be 'train' or 'val', got {split!r}")
        self.data_dir, self.split = data_dir, split
        self.x_path = os.path.join(data_dir, f"{split}_x.bin")
        self.y_path = os.path.join(data_dir, f"{split}_y.bin")
        self.meta_path = os.path.join(data_dir, f"{split}_metadata.txt")
        self.metadata = read_metadata(self.meta_path)
        m = self.metadata
        try:
            self.num_samples = int(m["num_samples"])
            self.block_size = int(m["block_size"])
            self.vocab_size = int(m["vocab_size"])
        except ValueError:
            raise DataError(f"{self.meta_path}: num_samples, block_size and vocab_size must be integers",
                            "re-create the dataset with prepare_reward_data.py") from None
        self.tokenization_info = TokenizationInfo(m["tokenization_method"], self.vocab_size,
                                                  None if m.get("meta_path") in (None, "None") else m["meta_path"])
        S, N = self.num_samples, self.block_size
        if parse_shape(m["x_shape"]) != (S, N) or parse_shape(m["y_shape"]) != (S, 2):
            raise DataError(f"{self.meta_path}: x_shape {m['x_shape']} / y_shape {m['y_shape']} disagree with "
                            f"num_samples {S} and block_size {N}", "re-create the dataset")
        if m["x_dtype"] != "uint16" or m["y_dtype"] != "float32":
            raise DataError(f"{self.meta_path}: expected uint16 X and float32 Y, got {m['x_dtype']} / {m['y_dtype']}",
                            "re-create the dataset with prepare_reward_data.py")
        for path, shape, dtype in ((self.x_path, (S, N), np.uint16), (self.y_path, (S, 2), np.float32)):
            if not os.path.exists(path):
                raise BinaryFileError(f"reward dataset file not found: {path}",
                                      "re-create the dataset with prepare_reward_data.py")
            expected = int(np.prod(shape)) * np.dtype(dtype).itemsize
            size = os.path.getsize(path)
            if size != expected:
                raise BinaryFileError(
                    f"{path} is {'truncated' if size < expected else 'too large'}: {size:,} bytes, but shape "
                    f"{shape} {np.dtype(dtype).name} needs {expected:,}",
                    "the file is damaged or belongs to another dataset; re-create it with prepare_reward_data.py")
        if expected_tokenization_info is not None:
            try:
                check_tokenization_match(self.tokenization_info, expected_tokenization_info, "dataset")
            except TokenizationMismatchError as e:
                raise TokenizationMismatchError(
                    e.message, f"the reward dataset {data_dir} was made with another tokenization; regenerate it "
                               f"with prepare_reward_data.py from this model's checkpoint") from None
        self._x = self._y = None  # opened lazily, per process

    # memmaps are not pickled: every DataLoader worker opens its own views
    def __getstate__(self):
        state = self.__dict__.copy()
        state["_x"] = state["_y"] = None
        return state

    @property
    def x(self):
        if self._x is None:
            self._x = np.memmap(self.x_path, dtype=np.uint16, mode="r", shape=(self.num_samples, self.block_size))
        return self._x

    @property
    def y(self):
        if self._y is None:
            self._y = np.memmap(self.y_path, dtype=np.float32, mode="r", shape=(self.num_samples, 2))
        return self._y

    def __len__(self):
        return self.num_samples

    def __getitem__(self, i):
        if not -self.num_samples <= i < self.num_samples:
            raise IndexError(f"index {i} out of range for {self.num_samples} samples")
        x = torch.from_numpy(self.x[i].astype(np.int64))
        y = torch.from_numpy(np.array(self.y[i], dtype=np.float32))
        return x, y

    def get_tokenization_info(self):
        return self.tokenization_info

    def get_stats(self, bins=10):
        """Label statistics (read from the small Y file only) and the crossover histogram."""
        y = np.asarray(self.y, dtype=np.float64)
        N = self.block_size
        sums = y.sum(axis=1)
        K = np.rint(y[:, 0] * N).astype(np.int64)
        # integer-aligned bins over the valid K range [1, N-1]
        edges = np.unique(np.rint(np.linspace(1, N, min(bins, N - 1) + 1))).astype(np.int64)
        hist, _ = np.histogram(K, bins=edges)
        empty = self.num_samples == 0
        return {
            "num_samples": self.num_samples,
            "block_size": N,
            "y_min": y.min(axis=0).tolist() if not empty else None,
            "y_max": y.max(axis=0).tolist() if not empty else None,
            "y_mean": y.mean(axis=0).tolist() if not empty else None,
            "y_std": y.std(axis=0).tolist() if not empty else None,
            "prob_sum_min": float(sums.min()) if not empty else None,
            "prob_sum_max": float(sums.max()) if not empty else None,
            "prob_sum_mean": float(sums.mean()) if not empty else None,
            "tokenization_method": self.tokenization_info.method,
            "vocab_size": self.vocab_size,
            "crossover_min": int(K.min()) if not empty else None,
            "crossover_max": int(K.max()) if not empty else None,
            "crossover_mean": float(K.mean()) if not empty else None,
            "crossover_distinct": int(np.unique(K).size),
            "crossover_hist": hist.tolist(),
            "crossover_bin_edges": edges.tolist(),
            "labels_off_grid": int((np.abs(y[:, 0] * N - K) > 1e-3).sum()),
        }

    def crossovers(self, tol=1e-6):
        """The crossover K of every sample, recovered from its stored target K/N.

        Per-position labels (position t is natural iff t < K) are only right if K/N was
        stored exactly, so a target off the 1/N grid, a pair not summing to 1 or a K outside
        [0, N] is refused with the first offending sample named."""
        y = np.asarray(self.y, dtype=np.float64)
        N = self.block_size
        K = np.rint(y[:, 0] * N).astype(np.int64)
        bad = ((np.abs(y[:, 0] - K / N) > tol) | (np.abs(y[:, 1] - (N - K) / N) > tol)
               | (K < 0) | (K > N))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise DataError(f"{self.y_path}: {int(bad.sum())} of {self.num_samples} targets are not an exact "
                            f"[K/N, (N-K)/N] with N={N} (first: sample {i}, y={y[i].tolist()}), so per-position "
                            f"labels cannot be derived from them",
                            "regenerate the dataset with prepare_reward_data.py, or train a last-token head "
                            "(without --per_position)")
        return K

    def max_token(self, chunk_rows=65536):
        """Largest token id in X (scanned chunk by chunk)."""
        top = -1
        for s in range(0, self.num_samples, chunk_rows):
            top = max(top, int(self.x[s:s + chunk_rows].max()))
        return top


def position_labels(y, n_tokens):
    """Per-position targets from sequence targets y (B, 2) = [K/N, (N-K)/N]: a (B, N) long
    tensor with class 0 (natural) at positions t < K and class 1 (synthetic) from K on.
    The targets must be exact (RewardDataset.crossovers checks a whole split up front)."""
    K = torch.round(y[:, 0].double() * n_tokens).long()
    return (torch.arange(n_tokens, device=y.device)[None, :] >= K[:, None]).long()


def merge_train_splits(current_dir, earlier_dirs, out_dir):
    """A reward dataset whose train split is current_dir's followed by every earlier dataset's
    (replay: a detector that also learns earlier generators' text), and whose val split is
    current_dir's alone (it measures the current generator). Streams in chunks; each file is
    written atomically, the metadata last, so an interrupted merge never looks complete."""
    parts = [RewardDataset(d, "train") for d in [current_dir] + list(earlier_dirs)]
    first = parts[0]
    for ds in parts[1:]:
        if ds.block_size != first.block_size or ds.tokenization_info.to_dict() != first.tokenization_info.to_dict():
            raise DataError(f"{ds.data_dir} has another block size or tokenization than {current_dir}",
                            "replay only merges reward datasets of the same corpus and block size")
    os.makedirs(out_dir, exist_ok=True)
    paths = {k: os.path.join(out_dir, f"train_{k}.bin") for k in ("x", "y")}
    for key, path in paths.items():
        with atomic_output(path, "wb") as out:
            for ds in parts:
                with open(ds.x_path if key == "x" else ds.y_path, "rb") as f:
                    shutil.copyfileobj(f, out, 1 << 22)
    for name in ("val_x.bin", "val_y.bin"):
        with open(os.path.join(current_dir, name), "rb") as f, atomic_output(os.path.join(out_dir, name), "wb") as out:
            shutil.copyfileobj(f, out, 1 << 22)
    shutil.copyfile(os.path.join(current_dir, "val_metadata.txt"), os.path.join(out_dir, "val_metadata.txt"))
    S = sum(ds.num_samples for ds in parts)
    meta = {**first.metadata, "num_samples": S, "x_shape": (S, first.block_size), "y_shape": (S, 2),
            "num_blocks": S, "x_sha256": sha256_file(paths["x"]), "y_sha256": sha256_file(paths["y"]),
            "replay_from": ", ".join(os.path.abspath(d) for d in earlier_dirs),
            "replay_samples": ", ".join(str(ds.num_samples) for ds in parts)}
    atomic_write_text(os.path.join(out_dir, "train_metadata.txt"), "".join(f"{k}: {v}\n" for k, v in meta.items()))
    return out_dir


def create_reward_dataloaders(data_dir, batch_size=32, num_workers=0, expected_tokenization_info=None,
                              pin_memory=None, drop_last=False, seed=None, persistent_workers=False):
    """(train_loader, val_loader); train is shuffled (reproducibly with `seed`), val is not.
    pin_memory defaults to True when CUDA is available."""
    train_ds = RewardDataset(data_dir, "train", expected_tokenization_info)
    val_ds = RewardDataset(data_dir, "val", expected_tokenization_info)
    if pin_memory is None:
        pin_memory = torch.cuda.is_available()
    g = torch.Generator().manual_seed(seed) if seed is not None else None
    common = dict(batch_size=batch_size, num_workers=num_workers, pin_memory=pin_memory,
                  persistent_workers=persistent_workers and num_workers > 0)
    train_loader = DataLoader(train_ds, shuffle=True, drop_last=drop_last, generator=g, **common)
    val_loader = DataLoader(val_ds, shuffle=False, **common)
    return train_loader, val_loader


# ----------------------------------------------------------------------------- report

def quality_problems(ds, stats=None):
    """Problems a reward dataset must not have; an empty list when it is sound."""
    s = stats or ds.get_stats()
    N, problems = ds.block_size, []
    if s["num_samples"] == 0:
        return [f"{ds.split}: no samples"]
    if abs(s["prob_sum_min"] - 1) > 1e-5 or abs(s["prob_sum_max"] - 1) > 1e-5:
        problems.append(f"{ds.split}: label sums are not 1 (min {s['prob_sum_min']:.6f}, max {s['prob_sum_max']:.6f})")
    if min(s["y_min"]) < 0 or max(s["y_max"]) > 1:
        problems.append(f"{ds.split}: labels outside [0, 1]")
    if s["labels_off_grid"]:
        problems.append(f"{ds.split}: {s['labels_off_grid']} labels are not of the form K/{N}")
    if s["crossover_min"] < 1 or s["crossover_max"] > N - 1:
        problems.append(f"{ds.split}: crossover K outside [1, {N - 1}] "
                        f"(min {s['crossover_min']}, max {s['crossover_max']})")
    top = ds.max_token()
    if top >= ds.vocab_size:
        problems.append(f"{ds.split}: token id {top} outside the vocabulary (vocab_size {ds.vocab_size})")
    # K should be ~uniform on [1, N-1]: flag a collapsed or badly skewed distribution
    n = s["num_samples"]
    if n >= 20 and s["crossover_distinct"] <= 1:
        problems.append(f"{ds.split}: degenerate crossover distribution (every sample has K={s['crossover_min']})")
    elif n >= 200:
        hist = np.asarray(s["crossover_hist"], dtype=np.float64)
        expected = n * np.diff(s["crossover_bin_edges"]) / (N - 1)  # uniform K: proportional to bin width
        if (hist < 0.25 * expected).any() or (hist > 4 * expected).any():
            problems.append(f"{ds.split}: degenerate crossover distribution (histogram {hist.astype(int).tolist()}, "
                            f"expected about {np.round(expected).astype(int).tolist()})")
        mean_k = s["crossover_mean"]
        if abs(mean_k - N / 2) > 0.15 * N:
            problems.append(f"{ds.split}: crossover mean {mean_k:.1f} is far from N/2 = {N / 2:.1f}")
    return problems


def print_dataset_info(data_dir, batch_size=32, num_workers=0):
    """Print per-split statistics, the tokenization consistency, a DataLoader test and a
    quality report. Returns the list of problems found (empty = all checks passed)."""
    # open both splits before printing, so a missing or broken one fails with no half-printed report
    datasets, problems = {split: RewardDataset(data_dir, split) for split in SPLITS}, []
    print(f"=== Reward Dataset Info: {data_dir} ===")
    for split, ds in datasets.items():
        s = ds.get_stats()
        print(f"\n{split.upper()} SET:")
        print(f"  Samples: {s['num_samples']:,}")
        print(f"  Block size: {s['block_size']}")
        print(f"  Tokenization: {s['tokenization_method']} (vocab_size={s['vocab_size']})")
        if s["num_samples"]:
            f = lambda v: "[" + " ".join(f"{x:.6g}" for x in v) + "]"  # noqa: E731
            print("  Y statistics (columns: natural, synthetic):")
            print(f"    Min:  {f(s['y_min'])}")
            print(f"    Max:  {f(s['y_max'])}")
            print(f"    Mean: {f(s['y_mean'])}")
            print(f"    Std:  {f(s['y_std'])}")
            print("  Probability sums:")
            print(f"    Min:  {s['prob_sum_min']:.6f}")
            print(f"    Max:  {s['prob_sum_max']:.6f}")
            print(f"    Mean: {s['prob_sum_mean']:.6f}")
            print(f"  Crossover K: min {s['crossover_min']}, max {s['crossover_max']}, mean {s['crossover_mean']:.1f}, "
                  f"{s['crossover_distinct']} distinct; histogram {s['crossover_hist']}")
        problems += quality_problems(ds, s)

    a, b = datasets["train"].get_tokenization_info(), datasets["val"].get_tokenization_info()
    if (a.method, a.vocab_size) == (b.method, b.vocab_size):
        print(f"\nTokenization consistency: OK, both splits use {a.method} with vocab_size={a.vocab_size}")
    else:
        msg = f"tokenization mismatch between splits: train {a}, val {b}"
        print(f"\nTokenization consistency: MISMATCH, {msg}")
        problems.append(msg)
    if datasets["train"].block_size != datasets["val"].block_size:
        problems.append(f"block size differs between splits: train {datasets['train'].block_size}, "
                        f"val {datasets['val'].block_size}")

    print("\nDataLoader test:")
    train_loader, val_loader = create_reward_dataloaders(data_dir, batch_size=batch_size, num_workers=num_workers,
                                                         seed=0)
    for name, loader in (("train", train_loader), ("val", val_loader)):
        if len(loader.dataset) == 0:
            print(f"  {name}: empty")
            continue
        x, y = next(iter(loader))
        print(f"  {name}: {len(loader)} batches of up to {batch_size}; first batch x {tuple(x.shape)} {x.dtype}, "
              f"y {tuple(y.shape)} {y.dtype}")

    print("\nQuality report:")
    if problems:
        for p in problems:
            print(f"  PROBLEM: {p}")
    else:
        print("  all checks passed (label sums = 1, labels K/N with K in [1, N-1], tokens within the vocabulary, "
              "crossover distribution not degenerate)")
    return problems


def main(argv=None):
    ap = argparse.ArgumentParser(description="Show statistics and quality checks of a reward dataset.")
    ap.add_argument("--data_dir", default="data/reward_dataset", help="directory written by prepare_reward_data.py")
    ap.add_argument("--batch_size", type=int, default=32, help="batch size of the DataLoader test")
    ap.add_argument("--num_workers", type=int, default=0, help="DataLoader workers for the DataLoader test")
    args = ap.parse_args(argv)
    check_flag_ranges(args, "reward_dataset_loader.py", [("batch_size", args.batch_size >= 1, ">= 1")])
    problems = print_dataset_info(args.data_dir, args.batch_size, args.num_workers)
    if problems:
        raise SystemExit(1)


if __name__ == "__main__":
    run_cli(main)
