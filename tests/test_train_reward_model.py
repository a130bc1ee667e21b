"""train_reward_model.py on a tiny reward dataset where synthetic text is easy to tell
apart (natural positions use tokens 0..7, synthetic positions are all token 15)."""
import json
import math
import os
import types

import numpy as np
import pytest
import torch

from core.errors import ProjectError, TokenizationMismatchError
from core.devices import DistInfo
from core.files import atomic_torch_save, read_jsonl
from core.training import RunContext
from helpers import run_script, write_reward_split
from lib.checkpoint import load_model, make_checkpoint
from model import GPT, GPTConfig
from tokenization_manager import TokenizationInfo

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
V, N = 16, 32


def easy_samples(n, seed):
    rng = np.random.default_rng(seed)
    k = rng.integers(1, N, size=n)  # crossover K in [1, N-1]
    x = rng.integers(0, 8, size=(n, N))
    x[np.arange(N)[None, :] >= k[:, None]] = 15  # the "generated" part
    y = np.stack([k / N, (N - k) / N], 1)
    return x, y


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rm")
    info = TokenizationInfo("char", V, str(tmp / "meta.pkl"))
    torch.manual_seed(0)
    gen = GPT(GPTConfig(block_size=N, vocab_size=V, n_layer=2, n_head=2, n_embd=32))
    gen_path = tmp / "gen.pt"
    atomic_torch_save(make_checkpoint(gen, None, iter_num=0, tokenization=info.to_dict()), gen_path)
    data_dir = tmp / "rdata"
    for split, n, seed in (("train", 512, 0), ("val", 128, 1)):
        write_reward_split(str(data_dir), split, *easy_samples(n, seed), info)
    return dict(tmp=tmp, gen=gen_path, data=data_dir, info=info)


def run(setup, out, *extra):
    import train_reward_model
    train_reward_model.main(["--device", "cpu", "--model_path", str(setup["gen"]), "--data_dir", str(setup["data"]),
                             "--out_dir", str(out), "--reward_head_hidden_dim", "32",
                             "--batch_size", "32", "--learning_rate", "3e-3", "--eval_interval", "20",
                             *extra])


def test_reward_training_beats_constant_and_checkpoint_loads(setup, capsys):
    out = setup["tmp"] / "out"
    run(setup, out, "--max_iters", "60")
    # off a terminal (here pytest's capture, as a log file) the bar is a line now and then, not redraws
    err = capsys.readouterr().err
    bar = [line for line in err.splitlines() if line.startswith("reward: ")]
    assert "\r" not in err and 2 <= len(bar) <= 11 and bar[-1].startswith("reward: 100%|##########| 60/60")
    evals = [r for r in read_jsonl(str(out / "metrics.jsonl")) if r["kind"] == "eval"]
    assert [e["step"] for e in evals] == [0, 20, 40, 60]
    first, last = evals[0], evals[-1]
    # the fresh head predicts exactly 0.5: the constant predictor
    assert first["val_mae"] == pytest.approx(first["const_mae"], abs=1e-6)
    assert last["val_loss"] < 0.5 * first["val_loss"]
    assert last["val_mae"] < 0.6 * last["const_mae"]
    summary = json.loads((out / "reward_summary.json").read_text())
    assert summary["val_mae"] < 0.6 * summary["const_mae"]
    for name in ("calibration.png", "loss_curves.png"):
        assert (out / name).stat().st_size > 1000

    # a reward checkpoint: safe load, the documented usage, and the trunk left untouched
    ck = torch.load(out / "reward_ckpt.pt", weights_only=True, map_location="cpu")
    assert ck["mode"] == "reward" and ck["reward_data"]["block_size"] == N
    model, _, new = load_model(str(out / "reward_ckpt.pt"))
    assert new == [] and model.config.mode == "reward" and model.config.reward_head_hidden_dim == 32
    x, y = easy_samples(64, 5)
    model.eval()
    with torch.no_grad():
        probs, _ = model(torch.from_numpy(x).long())
    assert probs.shape == (64, 2) and torch.allclose(probs.sum(1), torch.ones(64))
    assert (probs[:, 0] - torch.from_numpy(y[:, 0]).float()).abs().mean() < 0.6 * np.abs(0.5 - y[:, 0]).mean()
    base = torch.load(setup["gen"], weights_only=True, map_location="cpu")["model"]
    for k, v in ck["model"].items():
        if k.startswith("transformer."):
            assert torch.equal(v, base[k]), f"frozen trunk tensor {k} changed"


def test_unfreeze_ce_and_resume(setup):
    out = setup["tmp"] / "unfrozen"
    run(setup, out, "--max_iters", "20", "--unfreeze_last_n_blocks", "1", "--loss", "ce",
        "--optimizer", "adam")
    run(setup, out, "--max_iters", "40", "--unfreeze_last_n_blocks", "1", "--loss", "ce",
        "--optimizer", "adam", "--resume")
    evals = [r for r in read_jsonl(str(out / "metrics.jsonl")) if r["kind"] == "eval"]
    assert [e["step"] for e in evals] == [0, 20, 40]
    assert evals[-1]["val_mae"] < evals[0]["val_mae"]
    ck = torch.load(out / "reward_ckpt.pt", weights_only=True, map_location="cpu")
    base = torch.load(setup["gen"], weights_only=True, map_location="cpu")["model"]
    assert not torch.equal(ck["model"]["transformer.h.1.mlp.c_fc.weight"], base["transformer.h.1.mlp.c_fc.weight"])
    assert torch.equal(ck["model"]["transformer.h.0.mlp.c_fc.weight"], base["transformer.h.0.mlp.c_fc.weight"])


def test_tokenization_mismatch_is_refused(setup, tmp_path):
    bad = tmp_path / "bpe_data"
    info = TokenizationInfo("bpe", 50257)
    for split in ("train", "val"):
        write_reward_split(str(bad), split, *easy_samples(8, 0), info)
    import train_reward_model
    with pytest.raises(TokenizationMismatchError, match="Tokenization method mismatch"):
        train_reward_model.main(["--device", "cpu", "--model_path", str(setup["gen"]), "--data_dir", str(bad),
                                 "--out_dir", str(tmp_path / "o")])


@pytest.mark.slow  # a command line run in a subprocess
def test_wrong_mode_exits_2(setup):
    rm = GPT(GPTConfig(block_size=N, vocab_size=V, n_layer=2, n_head=2, n_embd=32, mode="reward"))
    path = setup["tmp"] / "a_reward.pt"
    atomic_torch_save(make_checkpoint(rm, None, tokenization=setup["info"].to_dict()), path)
    p = run_script(["train_reward_model.py", "--model_path", str(path), "--data_dir", str(setup["data"]),
                    "--out_dir", str(setup["tmp"] / "bad")], cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert p.returncode == 2
    assert "Traceback" not in p.stderr
    assert "is a reward checkpoint, but a generator checkpoint is needed here" in p.stderr


# ----------------------------------------------------------------------------- per-position head

def test_per_position_whole_trunk_learns_and_records_its_head(setup):
    out = setup["tmp"] / "per_position"
    run(setup, out, "--max_iters", "40", "--per_position", "--unfreeze_last_n_blocks", "-1")
    evals = [r for r in read_jsonl(str(out / "metrics.jsonl")) if r["kind"] == "eval"]
    assert evals[0]["val_mae"] == pytest.approx(evals[0]["const_mae"], abs=1e-6)  # fresh head: 0.5
    assert evals[-1]["val_mae"] < 0.5 * evals[-1]["const_mae"]
    summary = json.loads((out / "reward_summary.json").read_text())
    assert summary["per_position"] is True and summary["loss"] == "position_ce"
    model, _, _ = load_model(str(out / "reward_ckpt.pt"))
    assert model.config.reward_per_position
    # the whole trunk trained, embeddings included
    ck = torch.load(out / "reward_ckpt.pt", weights_only=True, map_location="cpu")["model"]
    base = torch.load(setup["gen"], weights_only=True, map_location="cpu")["model"]
    for k in ("transformer.wte.weight", "transformer.h.0.attn.c_attn.weight"):
        assert not torch.equal(ck[k], base[k]), k
    # forward's sequence score is the mean of the per-position scores
    x, _ = easy_samples(16, 9)
    model.eval()
    with torch.no_grad():
        x = torch.from_numpy(x).long()
        assert torch.allclose(model(x)[0][:, 0], model.position_probs(x).mean(1), atol=1e-6)


def test_per_position_refuses_inexact_targets_and_mismatched_resume(setup, tmp_path):
    bad = tmp_path / "inexact"
    x, y = easy_samples(32, 0)
    y = y.copy()
    y[7] = [0.4, 0.6]  # 0.4 * 32 = 12.8: not a crossover
    write_reward_split(str(bad), "train", x, y, setup["info"])
    write_reward_split(str(bad), "val", *easy_samples(8, 1), setup["info"])
    import train_reward_model
    from core.errors import DataError
    with pytest.raises(DataError, match=r"not an exact \[K/N, \(N-K\)/N\] with N=32 \(first: sample 7"):
        train_reward_model.main(["--device", "cpu", "--model_path", str(setup["gen"]), "--data_dir", str(bad),
                                 "--out_dir", str(tmp_path / "o"), "--per_position"])
    assert not (tmp_path / "o" / "reward_ckpt.pt").exists()
    # the last-token head does not need exact targets: the same data trains
    out = tmp_path / "last"
    train_reward_model.main(["--device", "cpu", "--model_path", str(setup["gen"]), "--data_dir", str(bad),
                             "--out_dir", str(out), "--max_iters", "2", "--eval_interval", "1",
                             "--batch_size", "8"])
    from core.errors import CheckpointError
    with pytest.raises(CheckpointError, match="has a last-token head, but --per_position is on"):
        train_reward_model.main(["--device", "cpu", "--model_path", str(setup["gen"]), "--data_dir", str(setup["data"]),
                                 "--out_dir", str(out), "--max_iters", "4", "--batch_size", "8",
                                 "--per_position", "--resume"])


def test_init_trunk_from_another_checkpoint(setup, tmp_path):
    torch.manual_seed(5)
    other = GPT(GPTConfig(block_size=N, vocab_size=V, n_layer=3, n_head=2, n_embd=48))  # larger
    other_path = tmp_path / "other.pt"
    atomic_torch_save(make_checkpoint(other, None, tokenization=setup["info"].to_dict()), other_path)
    out = tmp_path / "from_other"
    run(setup, out, "--max_iters", "20", "--per_position", "--init_trunk_from", str(other_path))
    ck = torch.load(out / "reward_ckpt.pt", weights_only=True, map_location="cpu")
    assert ck["model_args"]["n_layer"] == 3 and ck["model_args"]["n_embd"] == 48
    assert ck["reward_training"]["init_trunk_from"]["path"] == str(other_path)
    assert ck["base_model"]["path"] == str(setup["gen"])  # the data's generator stays the base
    # the frozen trunk is the other checkpoint's, unchanged
    assert torch.equal(ck["model"]["transformer.h.2.mlp.c_fc.weight"],
                       other.state_dict()["transformer.h.2.mlp.c_fc.weight"])


# ----------------------------------------------------------------------------- --cache_frozen

def losses(out):
    rows = read_jsonl(str(out / "metrics.jsonl"))
    return ([r["train_loss"] for r in rows if r["kind"] == "train"],
            [r["val_loss"] for r in rows if r["kind"] == "eval"])


@pytest.mark.parametrize("extra", [
    ("--unfreeze_last_n_blocks", "1", "--per_position"),
    ("--unfreeze_last_n_blocks", "0", "--loss", "ce"),  # last-token head: only the last position is cached
    ("--unfreeze_last_n_blocks", "0", "--per_position", "--lm_features"),  # the head's whole input is cached
])
def test_cache_frozen_gives_the_uncached_loss_curve(setup, tmp_path, extra):
    common = ("--max_iters", "12", "--eval_interval", "6", "--log_interval", "1", *extra)
    run(setup, tmp_path / "plain", *common, "--cache_frozen", "off")
    run(setup, tmp_path / "cached", *common, "--cache_frozen", "on")
    (train_p, val_p), (train_c, val_c) = losses(tmp_path / "plain"), losses(tmp_path / "cached")
    assert len(train_p) == 12 and len(val_p) == 3
    assert train_c == pytest.approx(train_p, rel=1e-5, abs=1e-7)
    assert val_c == pytest.approx(val_p, rel=1e-5, abs=1e-7)
    assert train_p[-1] < train_p[0]  # it trained: the curves compared are not flat
    # the final report (the best checkpoint, evaluated on the cache) agrees too
    sp, sc = (json.loads((tmp_path / d / "reward_summary.json").read_text()) for d in ("plain", "cached"))
    for k in ("val_loss", "val_mae", "val_corr"):
        assert sc[k] == pytest.approx(sp[k], rel=1e-5, abs=1e-7), k
    # the same weights come out
    a = torch.load(tmp_path / "plain" / "reward_last.pt", weights_only=True, map_location="cpu")["model"]
    b = torch.load(tmp_path / "cached" / "reward_last.pt", weights_only=True, map_location="cpu")["model"]
    for k in a:
        assert torch.allclose(a[k], b[k], rtol=1e-4, atol=1e-6), k


def test_data_loader_workers_give_the_same_run(setup, tmp_path):
    """--num_workers 2: the batches come from worker processes (which open their own memmaps of the dataset),
    in the same order, so the run is the one without workers, loss for loss."""
    common = ("--max_iters", "8", "--eval_interval", "4", "--log_interval", "1", "--cache_frozen", "off",
              "--unfreeze_last_n_blocks", "1", "--per_position")
    run(setup, tmp_path / "main", *common, "--num_workers", "0")
    run(setup, tmp_path / "workers", *common, "--num_workers", "2")
    (train_m, val_m), (train_w, val_w) = losses(tmp_path / "main"), losses(tmp_path / "workers")
    assert len(train_m) == 8 and len(val_m) == 3 and train_m[-1] < train_m[0]
    assert (train_w, val_w) == (train_m, val_m)


def test_cache_frozen_in_a_temporary_file_and_resume(setup, tmp_path, monkeypatch):
    import train_reward_model

    # CPU: the cached and the plain path agree to 1e-5 only where batch shapes choose no other kernels
    common = ("--max_iters", "10", "--eval_interval", "5", "--log_interval", "1",
              "--unfreeze_last_n_blocks", "1", "--per_position", "--device", "cpu")
    run(setup, tmp_path / "ref", *common, "--cache_frozen", "off")
    # no memory to spare: the cache goes to an anonymous file in out_dir, gone afterwards
    monkeypatch.setattr(train_reward_model, "available_memory", lambda: 0)
    out = tmp_path / "resumed"
    run(setup, out, *common[:1], "5", *common[2:], "--cache_frozen", "on")
    run(setup, out, *common, "--cache_frozen", "on", "--resume")
    (train_r, val_r), (train_c, val_c) = losses(tmp_path / "ref"), losses(out)
    assert len(train_c) == 10
    assert train_c == pytest.approx(train_r, rel=1e-5, abs=1e-7)
    assert val_c == pytest.approx(val_r, rel=1e-5, abs=1e-7)
    assert not [f for f in os.listdir(out) if f.startswith("frozen_cache")]


def test_cache_frozen_refusals(setup, tmp_path):
    import train_reward_model
    with pytest.raises(ProjectError, match="--cache_frozen on: --unfreeze_last_n_blocks -1 trains the whole trunk"):
        run(setup, tmp_path / "o", "--unfreeze_last_n_blocks", "-1", "--cache_frozen", "on")
    with pytest.raises(ProjectError, match="only a wholly frozen trunk .* can be cached with them"):
        run(setup, tmp_path / "o2", "--unfreeze_last_n_blocks", "1", "--lm_features", "--cache_frozen", "on")
    args = train_reward_model.get_args(["--model_path", "m", "--cache_frozen", "auto"])
    assert train_reward_model.use_frozen_cache(args) is True  # under torchrun too: every process caches
    args.unfreeze_last_n_blocks = -1  # auto just falls back to the plain steps
    assert train_reward_model.use_frozen_cache(args) is False


def test_frozen_cache_matches_the_trunk_and_keeps_train_modes(setup):
    """The cached features are the frozen blocks' output, and building the cache leaves the
    trainable blocks and head in train mode (dropout there stays on)."""
    import train_reward_model as trm
    from reward_dataset_loader import RewardDataset
    model, _, _ = load_model(str(setup["gen"]), mode="reward", reward_per_position=True, dropout=0.1)
    trm.set_trainable(model, 1)
    trm.set_modes(model, 1)
    ds = RewardDataset(str(setup["data"]), "val")
    ctx = RunContext(DistInfo(), "cpu", "float32", torch.autocast("cpu", enabled=False), None, False)
    feats = trm.build_frozen_cache(model, ds, 1, False, ctx, str(setup["tmp"]))
    assert model.transformer.h[1].training and model.reward_head.training
    assert not model.transformer.h[0].training and not model.transformer.drop.training
    x = torch.from_numpy(ds.x[:5].astype(np.int64))
    model.eval()
    with torch.no_grad():
        assert torch.allclose(trm.cached_head_logits(model, feats[:5], 1), model.position_logits(x), atol=1e-5)


def test_evaluation_restores_each_modules_mode(setup):
    """val_metrics() (what evaluate() runs) must not leave the unfrozen block and the head in eval mode (their dropout
    would silently stop after the first evaluation)."""
    import train_reward_model as trm
    from reward_dataset_loader import RewardDataset
    model, _, _ = load_model(str(setup["gen"]), mode="reward", dropout=0.1)
    trm.set_trainable(model, 1)
    trm.set_modes(model, 1)
    before = [(name, m.training) for name, m in model.named_modules()]
    loader = torch.utils.data.DataLoader(RewardDataset(str(setup["data"]), "val"), batch_size=64)
    trm.val_metrics(model, loader, "cpu", torch.autocast("cpu", enabled=False), "mse", max_batches=1)
    assert [(name, m.training) for name, m in model.named_modules()] == before
    assert model.transformer.h[1].training and model.reward_head.training and not model.transformer.h[0].training


# ----------------------------------------------------------------------------- the loop's state, on its own

def tiny_state_and_model(setup, tmp_path, *flags):
    """What main's set-up builds, by hand: args, a reward model on the tiny generator, its
    optimizer, a fresh RMState and the val loader."""
    import train_reward_model as trm
    from core.schedule import EarlyStopping
    from reward_dataset_loader import RewardDataset
    args = trm.get_args(["--model_path", str(setup["gen"]), "--data_dir", str(setup["data"]),
                         "--out_dir", str(tmp_path), "--reward_head_hidden_dim", "8", *flags])
    torch.manual_seed(0)
    model, _, _ = load_model(str(setup["gen"]), mode="reward", reward_head_hidden_dim=8,
                             reward_per_position=args.per_position)
    trm.set_trainable(model, args.unfreeze_last_n_blocks)
    trm.set_modes(model, args.unfreeze_last_n_blocks)
    state = trm.RMState(EarlyStopping(args.patience, args.min_delta, mode="min"), "base-sha", "trunk-sha")
    loader = torch.utils.data.DataLoader(RewardDataset(str(setup["data"]), "val"), batch_size=64)
    return trm, args, model, trm.make_optimizer(model, args), state, loader


def tiny_run(trm, args, model, optimizer, loader, meta=None):
    """The read-only run context evaluate() and save() take, with what they read of it (main builds the rest)."""
    ctx = types.SimpleNamespace(device="cpu", amp=torch.autocast("cpu", enabled=False))
    fwd = trm.RewardLogits(model)
    return trm.RMRun(args, ctx, model, fwd, fwd, optimizer, None, 0, model.config.vocab_size, loader, meta,
                     args.max_iters, 1)


def test_evaluate_records_the_best_and_early_stopping_in_the_state(setup, tmp_path):
    trm, args, model, _, state, loader = tiny_state_and_model(setup, tmp_path, "--patience", "1",
                                                              "--min_delta", "10", "--eval_max_batches", "1")
    run = tiny_run(trm, args, model, None, loader)
    m, improved = trm.evaluate(state, run)
    assert improved and state.best == {**m, "step": 0} and state.stop_reason is None
    assert m["val_samples"] == 64  # --eval_max_batches 1
    assert m["val_mae"] == pytest.approx(m["const_mae"], abs=1e-6)  # the fresh head: 0.5
    state.step = 7  # the same model again: not better by --min_delta 10, and patience 1 runs out
    m2, improved = trm.evaluate(state, run)
    assert not improved and m2 == m and state.best["step"] == 0
    assert state.stop_reason == "early_stopping (val loss not improved by 10.0 for 1 evals)"
    with torch.no_grad():
        model.reward_head[2].bias.fill_(float("nan"))
    with pytest.raises(ProjectError, match="reward model val loss became nan at step 7"):
        trm.evaluate(state, run)


def test_save_then_resume_restores_the_state(setup, tmp_path):
    trm, args, model, optimizer, state, loader = tiny_state_and_model(
        setup, tmp_path, "--per_position", "--unfreeze_last_n_blocks", "1")
    amp = torch.autocast("cpu", enabled=False)
    state.step = 2
    run = tiny_run(trm, args, model, optimizer, loader, {"train_config": vars(args)})
    trm.evaluate(state, run)
    best, last = str(tmp_path / trm.BEST_NAME), str(tmp_path / trm.LAST_NAME)
    trm.save(state, run, last=False)  # as the loop does: right after a new best
    ck = torch.load(best, weights_only=True, map_location="cpu")  # the best: the model and its metrics, no training state
    assert ck["optimizer"] is None and "reward_train" not in ck and ck["iter_num"] == 2
    assert (ck["best_val_loss"], ck["val_mae"]) == (state.best["val_loss"], state.best["val_mae"])
    reloaded, _, _ = load_model(best, require_mode="reward")
    assert reloaded.config.reward_per_position
    assert trm.val_metrics(reloaded, loader, "cpu", amp, args.loss)[0] == {k: v for k, v in state.best.items()
                                                                        if k != "step"}
    x, y = next(iter(loader))  # one step, so the optimizer has moments to save
    trm.reward_loss(trm.head_logits(model, x), y, args.loss).backward()
    optimizer.step()
    state.step, state.epoch, state.pos = 3, 1, 2
    trm.save(state, run, last=True)
    assert torch.load(last, weights_only=True, map_location="cpu")["reward_train"] == state.to_dict()

    # a fresh set-up resumed from reward_last.pt: the same state, weights and optimizer
    (tmp_path / trm.METRICS_NAME).write_text("".join(json.dumps({"kind": "eval", "step": i}) + "\n" for i in (0, 3, 6)))
    trm, args, model2, optimizer2, state2, _ = tiny_state_and_model(
        setup, tmp_path, "--per_position", "--unfreeze_last_n_blocks", "1", "--resume")
    trm.resume(state2, args, model2, optimizer2, master=True)
    assert state2.to_dict() == state.to_dict()
    for (k, a), b in zip(model.state_dict().items(), model2.state_dict().values()):
        assert torch.equal(a, b), k
    assert repr(optimizer2.state_dict()) == repr(optimizer.state_dict())
    from core.files import start_metrics_log  # what main() keeps of the log (RunContext.open_log)
    from core.training import kept_records
    start_metrics_log(str(tmp_path / trm.METRICS_NAME), kept_records(state2.step))
    assert [r["step"] for r in read_jsonl(str(tmp_path / trm.METRICS_NAME))] == [0, 3]  # truncated

    # the state belongs to its checkpoints and flags
    from core.errors import CheckpointError
    state2.base_sha256 = "another"
    with pytest.raises(CheckpointError, match="trained from a different --model_path / --init_trunk_from"):
        trm.resume(state2, args, model2, optimizer2, master=False)


def test_the_generators_features_are_its_surprisal_and_the_trunks_log_ratio_to_it():
    """--gen_features' head input (GPTConfig.reward_gen_features): beside the trunk state and its LM features,
    at every position t > 0 the generator's surprisal -log p_gen(x_t) and log p_trunk(x_t) - log p_gen(x_t),
    each computed here from the two models apart, and their running means; zeros at t = 0."""
    from model import N_LM_FEATURES, head_input_width, split_model_args
    torch.manual_seed(0)
    trunk = GPT(GPTConfig(block_size=N, vocab_size=V, n_layer=1, n_head=2, n_embd=16))
    gen = GPT(GPTConfig(block_size=N, vocab_size=V, n_layer=2, n_head=2, n_embd=32))
    cfg = {**split_model_args(gen.config)[0], **split_model_args(gen.config)[1]}
    from lib.reward_head import Detector
    det_config = GPTConfig(block_size=N, vocab_size=V, n_layer=1, n_head=2, n_embd=16, mode="reward",
                           reward_per_position=True, reward_lm_features=True, reward_gen_features=cfg)
    with pytest.raises(ValueError, match=r"lib.reward_head.Detector\(config\), not GPT\(config\)"):
        GPT(det_config)  # model.py's GPT reads its own trunk only
    det = Detector(det_config)
    det.transformer.load_state_dict(trunk.transformer.state_dict())
    det.gen_lm.load_state_dict(gen.state_dict())
    assert head_input_width(det.config) == 16 + 2 * N_LM_FEATURES and not any(p.requires_grad
                                                                              for p in det.gen_lm.parameters())
    idx = torch.randint(0, V, (3, N), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        feats = det.head_input(idx, det.hidden_states(idx))[..., 16 + N_LM_FEATURES:]
        lp_gen = gen.token_logprobs(idx[:, :-1], idx[:, 1:])
        lp_trunk = trunk.token_logprobs(idx[:, :-1], idx[:, 1:])
    assert feats.shape == (3, N, 4) and (feats[:, 0] == 0).all()
    assert torch.allclose(feats[:, 1:, 0], -lp_gen, atol=1e-5)
    assert torch.allclose(feats[:, 1:, 1], lp_trunk - lp_gen, atol=1e-5)
    counts = torch.arange(1, N)[None, :]
    assert torch.allclose(feats[:, 1:, 3], (lp_trunk - lp_gen).cumsum(1) / counts, atol=1e-5)
    det.train()
    assert not det.gen_lm.training  # frozen: no dropout whatever the head does
    with pytest.raises(ValueError, match="needs reward_lm_features"):
        GPTConfig(mode="reward", reward_gen_features=cfg)


def test_gen_features_train_end_to_end_and_the_generator_copy_is_the_generators(setup):
    """train_reward_model.py --gen_features (the ratio_features recipe): the detector carries the generator's
    weights (--model_path) unchanged by training, reloads strictly from its checkpoint, records the flag and
    the generator's shape for a FLOPs count; without --lm_features it is refused."""
    from experiment import flops
    from lib.checkpoint import model_shape
    out = setup["tmp"] / "gen_features"
    trunk = setup["tmp"] / "trunk.pt"
    torch.manual_seed(3)
    atomic_torch_save(make_checkpoint(GPT(GPTConfig(block_size=N, vocab_size=V, n_layer=1, n_head=2, n_embd=16)), None,
                                      iter_num=0, tokenization=setup["info"].to_dict()), trunk)
    run(setup, out, "--max_iters", "20", "--per_position", "--lm_features", "--gen_features",
        "--init_trunk_from", str(trunk), "--unfreeze_last_n_blocks", "0")
    model, _, new = load_model(str(out / "reward_ckpt.pt"))
    gen, _, _ = load_model(str(setup["gen"]))
    assert new == [] and model.config.reward_gen_features["n_layer"] == 2
    for k, v in gen.state_dict().items():
        assert torch.equal(model.gen_lm.state_dict()[k], v), k
    summary = json.loads((out / "reward_summary.json").read_text())
    assert summary["gen_features"] and summary["val_mae"] < summary["const_mae"]
    shape = model_shape(model)
    assert shape["reward_head"]["gen_model_args"]["n_layer"] == 2
    assert flops.detector_forward(shape["model_args"], shape["reward_head"]) > \
        flops.detector_forward(shape["model_args"], {**shape["reward_head"], "gen_model_args": None}) + \
        flops.forward_flops(shape["reward_head"]["gen_model_args"]) - 1
    with pytest.raises(ProjectError, match="--gen_features .* --lm_features"):
        run(setup, setup["tmp"] / "refused", "--gen_features")


# ----------------------------------------------------------------------------- ADA for tokens

def test_the_augmentation_treats_natural_and_generated_tokens_alike():
    """augment_tokens substitutes each token with probability p whatever its label: on natural positions (t < K)
    and on generated ones at the same rate, p (1 - 1/V) (a draw can give the token back); p = 0 is the identity."""
    from lib.reward_head import augment_tokens
    from reward_dataset_loader import position_labels
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 65, (512, 64), generator=g)
    y = torch.randint(1, 64, (512,), generator=g).double() / 64
    labels = position_labels(torch.stack([y, 1 - y], dim=1), 64)
    out = augment_tokens(x, 0.3, 65, torch.Generator().manual_seed(1))
    changed = (out != x).float()
    expected = 0.3 * 64 / 65
    assert changed[labels == 0].mean().item() == pytest.approx(expected, abs=0.01)
    assert changed[labels == 1].mean().item() == pytest.approx(expected, abs=0.01)
    assert 0 <= out.min() and out.max() < 65
    assert augment_tokens(x, 0.0, 65, torch.Generator().manual_seed(1)) is x


def test_ada_raises_p_while_the_detector_is_too_sure_of_natural_text():
    """natural_sign counts sign(logit_natural - logit_synthetic) over natural positions only (a per-position head's
    t < K; a last-token head's rows over half natural); ada_adjust moves p by ADA_STEP toward the target, in bounds."""
    from lib.reward_head import ADA_MAX_P, ADA_STEP, ada_adjust, natural_sign
    logits = torch.zeros(2, 4, 2)
    logits[..., 0] = torch.tensor([[1.0, 1.0, -1.0, -1.0], [1.0, -1.0, -1.0, -1.0]])
    y = torch.tensor([[0.5, 0.5], [0.25, 0.75]])  # K = 2 and 1: natural positions (0, 0), (0, 1), (1, 0)
    signs, count = natural_sign(logits, y)
    assert (float(signs), int(count)) == (3.0, 3)
    assert all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in (signs, count))  # read once per window, not per step
    signs, count = natural_sign(logits[:, -1], torch.tensor([[0.75, 0.25], [0.25, 0.75]]))
    assert (float(signs), int(count)) == (-1.0, 1)
    assert ada_adjust(0.1, 3.0, 3, 0.6) == pytest.approx(0.1 + ADA_STEP)  # r = 1 > 0.6: augment more
    assert ada_adjust(0.1, 0.0, 3, 0.6) == pytest.approx(0.1 - ADA_STEP)
    assert ada_adjust(0.0, -3.0, 3, 0.6) == 0.0 and ada_adjust(ADA_MAX_P, 3.0, 3, 0.6) == ADA_MAX_P
    assert ada_adjust(0.3, 0.0, 0, 0.6) == 0.3  # no natural position: no evidence


def test_ada_trains_records_and_resumes_its_p(setup, tmp_path):
    """--augment_p with --ada_target: the run trains uncached, every eval row logs p, the summary its start and end,
    and reward_last.pt keeps p for --resume; --cache_frozen on is refused with it."""
    out = tmp_path / "ada"
    run(setup, out, "--max_iters", "16", "--eval_interval", "8", "--per_position", "--augment_p", "0.1",
        "--ada_target", "0.6")
    summary = json.loads((out / "reward_summary.json").read_text())
    assert summary["augment_p"] == 0.1 and summary["ada_target"] == 0.6
    moved = (summary["augment_p_final"] - 0.1) / 0.01  # 16 steps: 4 adjustments of one step each, up or down
    assert moved == pytest.approx(round(moved), abs=1e-6) and round(moved) in (-4, -2, 2, 4)
    evals = [r for r in read_jsonl(str(out / "metrics.jsonl")) if r.get("kind") == "eval"]
    assert [r["augment_p"] for r in evals][0] == 0.1
    last = torch.load(out / "reward_last.pt", weights_only=True, map_location="cpu")
    assert last["reward_train"]["augment_p"] == pytest.approx(summary["augment_p_final"])
    # resumed to 20 steps, its p is the checkpoint's (one more adjustment), not the new start --augment_p 0.5
    run(setup, out, "--max_iters", "20", "--eval_interval", "8", "--per_position", "--augment_p", "0.5",
        "--ada_target", "0.6", "--resume")
    again = json.loads((out / "reward_summary.json").read_text())["augment_p_final"]
    assert abs(again - summary["augment_p_final"]) == pytest.approx(0.01)
    with pytest.raises(ProjectError, match="--cache_frozen on: --augment_p changes every batch's tokens"):
        run(setup, tmp_path / "refused", "--max_iters", "2", "--augment_p", "0.1", "--cache_frozen", "on")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_ada_trains_under_half_precision(setup, tmp_path, dtype):
    """ADA's sign statistic and its p under autocast (bf16; fp16 with its scaler): p moves by whole steps and the
    losses stay finite."""
    out = tmp_path / dtype
    run(setup, out, "--max_iters", "8", "--eval_interval", "4", "--per_position", "--augment_p", "0.1",
        "--ada_target", "0.6", "--dtype", dtype)
    summary = json.loads((out / "reward_summary.json").read_text())
    moved = (summary["augment_p_final"] - 0.1) / 0.01  # 8 steps: 2 adjustments
    assert summary["dtype"] == dtype and round(moved) in (-2, 0, 2) and abs(moved - round(moved)) < 1e-6
    evals = [r for r in read_jsonl(str(out / "metrics.jsonl")) if r.get("kind") == "eval"]
    assert evals and all(math.isfinite(r["val_loss"]) for r in evals)
