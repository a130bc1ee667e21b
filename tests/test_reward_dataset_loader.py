"""reward_dataset_loader.py: RewardDataset, DataLoaders, stats, integrity checks and the report."""
import contextlib
import io
import os
import pickle
import shutil
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import prepare_reward_data as prd  # noqa: E402
from core.errors import BinaryFileError, DataError, ProjectError, TokenizationMismatchError  # noqa: E402
from helpers import run_script  # noqa: E402
from reward_data_config import TokenizationInfo  # noqa: E402
from reward_dataset_loader import RewardDataset, create_reward_dataloaders, print_dataset_info  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N, SPC, BLOCKS = 32, 3, 40



@pytest.fixture(scope="module")
def ds_dir(tmp_path_factory, tiny_char_ckpt):
    root = tmp_path_factory.mktemp("rdl")
    assert N == 32  # the shared checkpoint's block size
    text_path, data_dir, ckpt = (tiny_char_ckpt[k] for k in ("text", "data_dir", "ckpt"))
    out = root / "reward"
    with contextlib.redirect_stdout(io.StringIO()):
        prd.main(["--model_path", ckpt, "--data_path", text_path, "--meta_path", os.path.join(data_dir, "meta.pkl"),
                  "--output_dir", str(out), "--samples_per_chunk", str(SPC), "--max_blocks_per_split", str(BLOCKS),
                  "--device", "cpu"])
    return str(out)


def raw(d, split):
    x = np.fromfile(os.path.join(d, f"{split}_x.bin"), dtype=np.uint16).reshape(-1, N)
    y = np.fromfile(os.path.join(d, f"{split}_y.bin"), dtype=np.float32).reshape(-1, 2)
    return x, y


def copy_of(ds_dir, tmp_path):
    d = tmp_path / "copy"
    shutil.copytree(ds_dir, d)
    return str(d)


def test_items(ds_dir):
    ds = RewardDataset(ds_dir, "train")
    x_all, y_all = raw(ds_dir, "train")
    assert len(ds) == BLOCKS * SPC == len(x_all)
    x, y = ds[5]
    assert x.dtype == torch.long and x.shape == (N,) and y.dtype == torch.float32 and y.shape == (2,)
    assert np.array_equal(x.numpy(), x_all[5]) and np.array_equal(y.numpy(), y_all[5])
    assert np.array_equal(ds[-1][0].numpy(), x_all[-1])
    with pytest.raises(IndexError):
        ds[len(ds)]
    assert ds.get_tokenization_info().method == "char" and ds.block_size == N
    assert len(RewardDataset(ds_dir, "val")) > 0


def test_memmap_views_are_not_copied_to_workers(ds_dir):
    ds = RewardDataset(ds_dir, "train")
    ds[0]
    assert isinstance(ds.x, np.memmap) and isinstance(ds.y, np.memmap)
    blob = pickle.dumps(ds)
    assert len(blob) < 4000 < os.path.getsize(os.path.join(ds_dir, "train_x.bin"))  # no data inside
    again = pickle.loads(blob)
    assert again._x is None and torch.equal(again[3][0], ds[3][0])


def test_dataloaders_shuffle_and_batch(ds_dir):
    train_loader, val_loader = create_reward_dataloaders(ds_dir, batch_size=16, seed=0)
    assert train_loader.pin_memory == torch.cuda.is_available()
    assert len(train_loader) == -(-BLOCKS * SPC // 16)
    xs, ys = zip(*train_loader)
    assert all(x.shape == (16, N) and y.shape == (16, 2) for x, y in zip(xs[:-1], ys[:-1]))
    assert xs[-1].shape[0] == BLOCKS * SPC - 16 * (len(xs) - 1)
    x_all, _ = raw(ds_dir, "train")
    got = torch.cat(xs).numpy()
    assert not np.array_equal(got, x_all)  # shuffled ...
    assert sorted(map(bytes, got.astype(np.uint16))) == sorted(map(bytes, x_all))  # ... a permutation
    vx = torch.cat([x for x, _ in val_loader]).numpy()
    assert np.array_equal(vx, raw(ds_dir, "val")[0])  # val in order
    # same seed, same order
    again = torch.cat([x for x, _ in create_reward_dataloaders(ds_dir, batch_size=16, seed=0)[0]]).numpy()
    assert np.array_equal(again, got)


def test_dataloader_with_workers(ds_dir):
    train_loader, _ = create_reward_dataloaders(ds_dir, batch_size=32, num_workers=2, seed=1)
    xs, ys = zip(*train_loader)
    x_all, y_all = raw(ds_dir, "train")
    got_y = torch.cat(ys).numpy()
    assert len(got_y) == len(y_all)
    assert sorted(map(bytes, torch.cat(xs).numpy().astype(np.uint16))) == sorted(map(bytes, x_all))
    assert np.allclose(got_y.sum(1), 1.0, atol=1e-6)


def test_tokenization_expectations(ds_dir):
    RewardDataset(ds_dir, "train", TokenizationInfo("char", RewardDataset(ds_dir).vocab_size))
    with pytest.raises(TokenizationMismatchError, match=r"^Tokenization method mismatch: dataset uses 'char' but "
                                                        r"expected 'bpe'$") as e:
        RewardDataset(ds_dir, "train", TokenizationInfo("bpe", 50257))
    assert isinstance(e.value, ValueError)
    with pytest.raises(TokenizationMismatchError, match="Vocabulary size mismatch"):
        create_reward_dataloaders(ds_dir, expected_tokenization_info=TokenizationInfo("char", 65))


def test_stats(ds_dir):
    ds = RewardDataset(ds_dir, "val")
    s = ds.get_stats()
    _, y = raw(ds_dir, "val")
    y64 = y.astype(np.float64)
    assert s["num_samples"] == len(y) and s["block_size"] == N
    assert np.allclose(s["y_min"], y64.min(0)) and np.allclose(s["y_max"], y64.max(0))
    assert np.allclose(s["y_mean"], y64.mean(0)) and np.allclose(s["y_std"], y64.std(0))
    assert abs(s["prob_sum_min"] - 1) < 1e-6 and abs(s["prob_sum_max"] - 1) < 1e-6
    assert abs(s["prob_sum_mean"] - 1) < 1e-6
    assert s["tokenization_method"] == "char" and s["vocab_size"] == ds.vocab_size
    assert sum(s["crossover_hist"]) == len(y) and len(s["crossover_bin_edges"]) == len(s["crossover_hist"]) + 1
    K = np.rint(y[:, 0] * N)
    assert s["crossover_min"] == K.min() and s["crossover_max"] == K.max() and s["labels_off_grid"] == 0


def test_truncated_and_mis_sized_files(ds_dir, tmp_path):
    d = copy_of(ds_dir, tmp_path)
    xp = os.path.join(d, "train_x.bin")
    with open(xp, "r+b") as f:
        f.truncate(os.path.getsize(xp) - 10)
    with pytest.raises(BinaryFileError, match="train_x.bin is truncated"):
        RewardDataset(d, "train")
    with open(os.path.join(d, "val_y.bin"), "ab") as f:
        f.write(b"\0" * 8)
    with pytest.raises(BinaryFileError, match="val_y.bin is too large"):
        RewardDataset(d, "val")
    os.remove(xp)
    with pytest.raises(BinaryFileError, match="not found"):
        RewardDataset(d, "train")
    os.remove(os.path.join(d, "val_metadata.txt"))
    with pytest.raises(DataError, match="metadata not found"):
        RewardDataset(d, "val")
    with pytest.raises(ValueError):
        RewardDataset(d, "test")


def test_inconsistent_metadata(ds_dir, tmp_path):
    d = copy_of(ds_dir, tmp_path)
    mp = os.path.join(d, "train_metadata.txt")
    text = open(mp).read()
    open(mp, "w").write(text.replace(f"x_shape: ({BLOCKS * SPC}, {N})", f"x_shape: ({BLOCKS * SPC}, {N + 1})"))
    with pytest.raises(DataError, match="disagree"):
        RewardDataset(d, "train")


def test_print_dataset_info(ds_dir, capsys):
    problems = print_dataset_info(ds_dir, batch_size=8)
    out = capsys.readouterr().out
    assert problems == []
    for text in ("TRAIN SET:", "VAL SET:", f"Samples: {BLOCKS * SPC}", f"Block size: {N}", "Tokenization: char",
                 "Min:", "Max:", "Mean:", "Std:", "Probability sums:", "Tokenization consistency: OK",
                 "DataLoader test:", f"train: {-(-BLOCKS * SPC // 8)} batches", f"x (8, {N})", "y (8, 2)",
                 "all checks passed"):
        assert text in out, text


def corrupt(d, split, fn):
    x, y = raw(d, split)
    x, y = x.copy(), y.copy()
    fn(x, y)
    x.tofile(os.path.join(d, f"{split}_x.bin"))
    y.tofile(os.path.join(d, f"{split}_y.bin"))


def test_quality_report_flags_problems(ds_dir, tmp_path, capsys):
    d = copy_of(ds_dir, tmp_path)
    vocab = RewardDataset(d).vocab_size

    def bad_sum(x, y):
        y[3] = [0.5, 0.6]

    def bad_token(x, y):
        x[7, 2] = vocab

    corrupt(d, "train", bad_sum)
    corrupt(d, "val", bad_token)
    problems = print_dataset_info(d)
    assert any("label sums are not 1" in p for p in problems)
    assert any(f"token id {vocab} outside the vocabulary" in p for p in problems)
    assert "PROBLEM:" in capsys.readouterr().out

    def degenerate(x, y):
        y[:] = [0.5, 0.5]

    corrupt(d, "train", degenerate)
    assert any("degenerate crossover distribution" in p for p in print_dataset_info(d))


def test_print_dataset_info_fails_before_printing_when_a_split_is_missing(ds_dir, tmp_path, capsys):
    d = str(tmp_path / "train_only")
    shutil.copytree(ds_dir, d)
    for f in os.listdir(d):
        if f.startswith("val_"):
            os.remove(os.path.join(d, f))
    with pytest.raises(DataError, match="val_metadata.txt"):
        print_dataset_info(d)
    assert capsys.readouterr().out == ""  # no header or train report above the error


def test_command_line_checks_its_numbers_before_reading(ds_dir, capsys):
    import reward_dataset_loader
    for flag, bad, want in (("--batch_size", "0", ">= 1"), ("--num_workers", "-1", ">= 0")):
        with pytest.raises(ProjectError, match=f"^{flag} must be {want}, got {bad}$"):  # not torch's ValueError
            reward_dataset_loader.main(["--data_dir", ds_dir, flag, bad])
    assert capsys.readouterr().out == ""


@pytest.mark.slow  # a command line run in a subprocess
def test_command_line(ds_dir, tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = run_script(["reward_dataset_loader.py", "--data_dir", ds_dir], cwd=ROOT, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"=== Reward Dataset Info: {ds_dir} ===" in r.stdout and "all checks passed" in r.stdout
    r = run_script(["reward_dataset_loader.py", "--data_dir", str(tmp_path / "none")], cwd=ROOT, env=env, timeout=120)
    assert r.returncode == 2 and "error: reward dataset metadata not found" in r.stderr and "Traceback" not in r.stderr


def test_per_position_labels_from_exact_targets(tmp_path):
    from helpers import write_reward_split
    from reward_dataset_loader import position_labels
    N = 10
    K = np.array([1, 3, 9, 5])
    y = np.stack([K / N, (N - K) / N], 1).astype(np.float32)  # float32 as prepare_reward_data writes them
    write_reward_split(str(tmp_path / "ok"), "train", np.zeros((4, N)), y, TokenizationInfo("char", 16))
    ds = RewardDataset(str(tmp_path / "ok"), "train")
    assert ds.crossovers().tolist() == [1, 3, 9, 5]
    labels = position_labels(torch.from_numpy(y), N)
    assert labels.shape == (4, N) and labels.dtype == torch.long
    assert labels[1].tolist() == [0, 0, 0, 1, 1, 1, 1, 1, 1, 1]  # natural (0) at t < K = 3
    assert ((labels == 0).sum(1) == torch.from_numpy(K)).all()
    # a target off the 1/N grid, or a pair that does not sum to one, is refused
    for bad in ([0.25, 0.75], [0.3, 0.6]):
        y2 = y.copy()
        y2[2] = bad
        write_reward_split(str(tmp_path / "bad"), "train", np.zeros((4, N)), y2, TokenizationInfo("char", 16))
        with pytest.raises(DataError, match=r"1 of 4 targets are not an exact .* \(first: sample 2"):
            RewardDataset(str(tmp_path / "bad"), "train").crossovers()


def test_merge_train_splits_for_replay(tmp_path):
    """Replay: the merged train split is the current dataset's followed by the earlier ones', the
    val split is the current one's alone, and a dataset of another block size is refused."""
    import numpy as np

    from core.errors import DataError
    from helpers import write_reward_split
    from reward_dataset_loader import RewardDataset, merge_train_splits
    from tokenization_manager import TokenizationInfo
    info = TokenizationInfo("char", 65, None)
    rng = np.random.default_rng(0)
    dirs = []
    for i, n in enumerate((5, 3)):
        d = str(tmp_path / f"rd{i}")
        for split, m in (("train", n), ("val", 2 + i)):
            k = rng.integers(1, 8, size=m)
            write_reward_split(d, split, rng.integers(0, 65, size=(m, 8)), np.stack([k / 8, 1 - k / 8], 1), info)
        dirs.append(d)
    out = merge_train_splits(dirs[0], [dirs[1]], str(tmp_path / "merged"))
    tr, va = RewardDataset(out, "train"), RewardDataset(out, "val")
    a, b = RewardDataset(dirs[0], "train"), RewardDataset(dirs[1], "train")
    assert len(tr) == 8 and np.array_equal(np.asarray(tr.x), np.concatenate([a.x, b.x]))
    assert np.array_equal(np.asarray(tr.y), np.concatenate([a.y, b.y]))
    assert np.array_equal(np.asarray(va.x), np.asarray(RewardDataset(dirs[0], "val").x))
    assert tr.metadata["replay_samples"] == "5, 3"
    other = str(tmp_path / "rd_other")
    write_reward_split(other, "train", np.zeros((2, 4)), np.full((2, 2), 0.5), info)
    with pytest.raises(DataError, match="another block size or tokenization"):
        merge_train_splits(dirs[0], [other], str(tmp_path / "merged2"))
