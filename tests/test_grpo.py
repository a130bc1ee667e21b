"""GRPO: the math against hand-computed numbers, and train_grpo.py end to end on a
reward that is trivially gameable (P(natural) = share of one token)."""
import dataclasses
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from core.files import atomic_torch_save, read_jsonl
from core.objectives import (clipped_surrogate, degenerate_mask, group_advantages, grpo_loss, guard_degenerate, k3_kl,
                       token_rewards, zero_spread_fraction)
from engine import Engine
from helpers import ALPHABET, TINY, prepare_alphabet_data, run_script, train_gameable_reward
from lib.checkpoint import load_model, make_checkpoint
from lib.grpo_objective import LossTerms, Reward
from lib.corpus import describe_split
from model import GPT, GPTConfig
from tokenization_manager import TokenizationManager

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
X_CHAR = "d"  # the token the gameable reward likes
# Every run here but the cuda-marked one is pinned to CPU, also where a GPU is visible (--device auto would take
# it, with bf16 and a compiled decoder these tests' thresholds were not set for). The runs a test compares bit
# for bit (a resumed run against a straight one) need it most: on CUDA the backward's atomic adds reorder sums.
CPU_EXACT = ["--device", "cpu"]


# ----------------------------------------------------------------------------- math

def test_group_advantages_hand_computed():
    r = torch.tensor([0.1, 0.4, 0.7, 0.5, 0.5, 0.5])
    # group 1: mean 0.4, deviations -0.3, 0, 0.3; sample std sqrt(0.18 / 2) = 0.3
    # group 2: no spread -> zero advantage, not 0/0
    adv = group_advantages(r, 3, scale_std=True, eps=0.0)
    assert torch.allclose(adv, torch.tensor([-1.0, 0.0, 1.0, 0.0, 0.0, 0.0]), atol=1e-6)
    adv = group_advantages(r, 3, scale_std=False)
    assert torch.allclose(adv, torch.tensor([-0.3, 0.0, 0.3, 0.0, 0.0, 0.0]), atol=1e-6)
    adv = group_advantages(r, 3, scale_std=True, eps=0.1)  # eps enters the denominator
    assert torch.allclose(adv[:3], torch.tensor([-0.75, 0.0, 0.75]), atol=1e-6)
    assert zero_spread_fraction(r, 3) == 0.5
    with pytest.raises(ValueError):
        group_advantages(r, 4)


def test_token_level_rewards_and_advantages_hand_computed():
    # per-position P(natural) of two sequences of length 5 with a prompt of 2 tokens
    p = torch.tensor([[0.9, 0.9, 0.6, 0.2, 0.4],
                      [0.9, 0.9, 0.8, 0.8, 0.2]])
    r = token_rewards(p, prompt_len=2)
    # token at t gets mean(p[t:]): row 0 -> (0.6+0.2+0.4)/3, (0.2+0.4)/2, 0.4
    assert torch.allclose(r, torch.tensor([[0.4, 0.3, 0.4], [0.6, 0.5, 0.2]]), atol=1e-6)
    # one group of 2: per position, deviations from the pair's mean (+-0.1, +-0.1, +-0.1)
    adv = group_advantages(r, 2, scale_std=False)
    assert torch.allclose(adv, torch.tensor([[-0.1, -0.1, 0.1], [0.1, 0.1, -0.1]]), atol=1e-6)
    # with std scaling every position has sample std 0.1 * sqrt(2): advantages +-1/sqrt(2)
    adv = group_advantages(r, 2, scale_std=True, eps=0.0)
    assert torch.allclose(adv.abs(), torch.full((2, 3), 2 ** -0.5), atol=1e-5)
    # a position where the group agrees carries no signal
    r2 = torch.tensor([[0.5, 0.3], [0.5, 0.7]])
    assert torch.allclose(group_advantages(r2, 2, eps=0.0)[:, 0], torch.zeros(2))
    # the token-level loss takes (B, T) advantages like the sequence-level one takes (B,)
    logp = torch.zeros(2, 3, requires_grad=True)
    loss, _ = grpo_loss(logp, logp.detach(), None, adv, clip_eps=0.2, beta=0.0)
    loss.backward()
    assert torch.allclose(logp.grad, -adv / 6, atol=1e-6)


def test_k3_kl_values():
    logp = torch.zeros(3)
    ref = torch.log(torch.tensor([1.0, 2.0, 0.5]))  # ratio pi_ref / pi_theta = 1, 2, 0.5
    kl = k3_kl(logp, ref)
    # r - log r - 1: 0, 1 - ln 2, ln 2 - 0.5
    assert torch.allclose(kl, torch.tensor([0.0, 1 - math.log(2), math.log(2) - 0.5]), atol=1e-6)
    assert (k3_kl(torch.randn(100), torch.randn(100)) >= 0).all()


def test_grpo_loss_hand_computed():
    adv = torch.tensor([1.0, -1.0])
    old = torch.tensor([[-1.0, -2.0], [-1.5, -0.5]])
    # ratios exp(logp - old): [[1.5, 1.0], [0.5, 1.1]]
    logp = (old + torch.log(torch.tensor([[1.5, 1.0], [0.5, 1.1]])))
    logp.requires_grad_(True)
    # pi_ref / pi_theta: [[1, 2], [0.5, 1]]
    ref = logp.detach() + torch.log(torch.tensor([[1.0, 2.0], [0.5, 1.0]]))
    loss, st = grpo_loss(logp, old, ref, adv, clip_eps=0.2, beta=0.1)
    # surrogate min(ratio*A, clip(ratio)*A):
    #   [0,0] A=+1 ratio 1.5 -> min(1.5, 1.2) = 1.2 (clipped)   [0,1] A=+1 ratio 1.0 -> 1.0
    #   [1,0] A=-1 ratio 0.5 -> min(-0.5, -0.8) = -0.8 (clipped) [1,1] A=-1 ratio 1.1 -> -1.1
    #   mean = (1.2 + 1.0 - 0.8 - 1.1) / 4 = 0.075
    # k3 KL: 0, 1 - ln2, ln2 - 0.5, 0 -> mean 0.5 / 4 = 0.125
    # loss = -0.075 + 0.1 * 0.125 = -0.0625
    assert loss.item() == pytest.approx(-0.0625, abs=1e-6)
    assert st["kl"] == pytest.approx(0.125, abs=1e-6)
    assert st["clip_frac"] == pytest.approx(0.5)
    assert st["surrogate"] == pytest.approx(0.075, abs=1e-6)
    loss.backward()
    # d/dlogp per token, / 4 tokens: unclipped -ratio*A, clipped 0; KL: beta * (1 - pi_ref/pi_theta)
    expected = torch.tensor([[0.0 + 0.1 * 0.0, -1.0 + 0.1 * (1 - 2.0)],
                             [0.0 + 0.1 * (1 - 0.5), 1.1 + 0.0]]) / 4
    assert torch.allclose(logp.grad, expected, atol=1e-6)


def test_grpo_loss_token_level_normalisation():
    # ratio 1 everywhere (first pass), no KL: the per-token loss is -A
    adv = torch.tensor([1.0, -1.0])
    logp = torch.zeros(2, 3)
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]])
    loss, _ = grpo_loss(logp, logp, None, adv, clip_eps=0.2, beta=0.0, mask=mask)
    # token-level: (-1 + 1 + 1 + 1) / 4 = 0.5 (a per-sequence mean would give 0)
    assert loss.item() == pytest.approx(0.5)
    surr, ratio = clipped_surrogate(logp, logp, adv, 0.2)
    assert torch.equal(ratio, torch.ones(2, 3))


def test_degenerate_mask():
    rng = np.random.default_rng(0)
    natural = torch.from_numpy(rng.integers(0, 16, size=(1, 40)))
    one_token = torch.tensor([[3] * 30 + list(range(10))])
    loop = torch.tensor([[1, 2, 3] * 13 + [4]])
    flags = degenerate_mask(torch.cat([natural, one_token, loop]))
    assert flags.tolist() == [False, True, True]


# ----------------------------------------------------------------------------- evaluate / save on their own

def _tiny_run(tmp_path, *flags):
    """What train_grpo's evaluate() and save() take, built by hand (no main()): a GRPORun of args, a
    random tiny policy and reward model (saved, as --reward_model_path must exist for its sha256) and
    the EvalSet, and a GRPOState in the middle of a run."""
    import train_grpo
    from core.schedule import EarlyStopping
    from core.training import open_run
    data_dir = Path(prepare_alphabet_data(tmp_path))
    tok = TokenizationManager("char", meta_path=str(data_dir / "meta.pkl"))
    data = describe_split(str(data_dir / "train.bin"), str(data_dir / "val.bin"), tok.info, str(data_dir))
    torch.manual_seed(0)
    policy = GPT(GPTConfig(block_size=32, vocab_size=16, **TINY))
    rm = GPT(GPTConfig(block_size=32, vocab_size=16, mode="reward", reward_head_hidden_dim=32, **TINY))
    with torch.no_grad():  # a head that is not all zeros, so P(natural) is not exactly 0.5
        for p in rm.reward_head.parameters():
            p.normal_(0.0, 0.5)
    base_ckpt = make_checkpoint(policy, None, data=data, tokenization=tok.info.to_dict())
    atomic_torch_save(base_ckpt, tmp_path / "gen.pt")
    atomic_torch_save(make_checkpoint(rm, None, data=data, tokenization=tok.info.to_dict()), tmp_path / "rm.pt")
    args = train_grpo.get_args(["--model_path", str(tmp_path / "gen.pt"), "--reward_model_path",
                                str(tmp_path / "rm.pt"), "--out_dir", str(tmp_path / "out"), "--group_size", "2",
                                "--eval_reward_samples", "4", "--eval_max_batches", "2", "--num_show", "2",
                                "--device", "cpu", *flags])
    ctx = open_run(args, distributed=False, lock=False)
    train_data, _, probe, evalset = train_grpo.load_data(args, ctx, base_ckpt, tok.info, 32, 32)
    stopper = EarlyStopping(args.patience, args.min_delta, mode="max")
    stopper.step(0.25)
    seqs = torch.from_numpy(train_data[:128].astype(np.int64)).view(4, 32)
    state = train_grpo.GRPOState(step=3, rewards_hist=[0.2, 0.25, 0.3], stopper=stopper, updates=3,
                                 completion_tokens=300, last_batch=(seqs, 8, torch.tensor([0.1, 0.2, 0.3, 0.4])))
    optimizer = policy.configure_optimizers(0.0, 1e-3, (0.9, 0.95), "cpu")
    run = train_grpo.GRPORun(args, ctx, policy, optimizer, base_ckpt, "base-sha", probe, 32,
                             str(tmp_path / "out" / "ckpt.pt"), ref=policy, reward_model=rm, policy=policy,
                             train_data=train_data, tok=tok, evalset=evalset, detector_len=32,
                             engine=Engine(policy), reward=Reward.from_args(args), terms=LossTerms.from_args(args))
    return run, state


def test_evaluate_on_its_own(tmp_path):
    import train_grpo
    from core.files import JsonlLogger
    run, state = _tiny_run(tmp_path)
    policy, tok = run.model, run.tok
    policy.train()
    run.ctx.logger = JsonlLogger(str(tmp_path / "metrics.jsonl"))
    rec = train_grpo.evaluate(state, run)
    assert rec["kind"] == "eval" and rec["step"] == 3
    assert rec["val_ppl"] == pytest.approx(math.exp(rec["val_loss"]))
    assert 0 < rec["eval_reward"] < 1 and rec["eval_reward"] != 0.5
    # the first completion of each of the first num_show prompts (groups of 2), decoded
    seqs = state.last_batch[0]
    assert [s["reward"] for s in rec["samples"]] == [0.1, 0.3]
    assert rec["samples"][1]["prompt"] == tok.decode(seqs[2, :8]) and len(rec["samples"][1]["completion"]) == 24
    assert [{k: v for k, v in r.items() if k != "time"} for r in read_jsonl(str(tmp_path / "metrics.jsonl"))] == [rec]
    assert state.val_hist == [{"step": 3, "val_loss": rec["val_loss"], "val_ppl": rec["val_ppl"],
                               "eval_reward": rec["eval_reward"]}]
    assert policy.training  # evaluating leaves the policy's mode alone
    # fixed val prompts and fixed noise: the same policy scores the same
    run.ctx.logger = None
    assert train_grpo.evaluate(state, dataclasses.replace(run, tok=None))["eval_reward"] == rec["eval_reward"]
    assert len(state.val_hist) == 2


def test_save_then_reload_on_its_own(tmp_path):
    import train_grpo
    from core.errors import ProjectError
    from lib.checkpoint import read_checkpoint
    run, state = _tiny_run(tmp_path, "--max_steps", "10", "--resume")
    policy, optimizer, probe, base_ckpt, path = run.model, run.optimizer, run.probe, run.base_ckpt, run.ckpt_path
    state.val_hist.append({"step": 0, "val_loss": 2.5, "val_ppl": math.exp(2.5), "eval_reward": 0.3})
    policy(probe[:, :-1], probe[:, 1:])[1].backward()
    optimizer.step()
    os.makedirs(os.path.dirname(path))
    train_grpo.save(state, run)
    # a plain generator checkpoint every script reads, carrying the run's state
    model, ck, _ = load_model(path, require_mode="generator")
    assert ck["iter_num"] == 3 and ck["best_val_loss"] == 2.5 and ck["data"] == base_ckpt["data"]
    for k, v in policy.state_dict().items():
        assert torch.equal(v, model.state_dict()[k]), k
    g = ck["grpo"]
    assert g["seq_len"] == 32 and g["base_sha256"] == "base-sha" and not g["finished"]
    assert g["updates"] == 3 and g["completion_tokens"] == 300
    # the resume path of the script gets the same state back (and the optimizer's)
    opt2 = model.configure_optimizers(0.0, 1e-3, (0.9, 0.95), "cpu")
    back = train_grpo.restore_state(dataclasses.replace(run, optimizer=opt2), read_checkpoint(path))
    assert back.to_dict() == state.to_dict() and back.last_batch is None
    assert back.stopper.best == 0.25
    assert torch.equal(opt2.state_dict()["state"][0]["exp_avg"], optimizer.state_dict()["state"][0]["exp_avg"])
    # a policy whose log-probs are no longer finite is never written
    with torch.no_grad():
        policy.transformer.wte.weight.fill_(float("nan"))
    with pytest.raises(ProjectError, match="policy log-prob became nan at step 3"):
        train_grpo.save(state, dataclasses.replace(run, ckpt_path=str(tmp_path / "nan.pt")))
    assert not (tmp_path / "nan.pt").exists()


# ----------------------------------------------------------------------------- end to end

@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A random-init tiny generator (near-uniform policy) and a reward model trained
    briefly so that P(natural) = share of X_CHAR in the sequence."""
    tmp = tmp_path_factory.mktemp("grpo")
    data_dir = Path(prepare_alphabet_data(tmp))
    info = TokenizationManager("char", meta_path=str(data_dir / "meta.pkl")).info
    x_id = ALPHABET.index(X_CHAR)
    data = describe_split(str(data_dir / "train.bin"), str(data_dir / "val.bin"), info, str(data_dir))
    torch.manual_seed(0)
    cfg = GPTConfig(block_size=32, vocab_size=16, n_layer=2, n_head=2, n_embd=32)
    gen = GPT(cfg)
    gen_path = tmp / "gen.pt"
    atomic_torch_save(make_checkpoint(gen, None, iter_num=0, best_val_loss=None, data=data,
                                      tokenization=info.to_dict()), gen_path)
    rm_path = train_gameable_reward(str(data_dir), str(tmp / "reward.pt"), X_CHAR)
    return dict(tmp=tmp, data_dir=data_dir, gen=gen_path, reward=rm_path, x_id=x_id)


def _mean_reward(gen_path, reward_path, n=256, seed=0):
    gen, _, _ = load_model(str(gen_path), require_mode="generator")
    rm, _, _ = load_model(str(reward_path), require_mode="reward")
    gen.eval()
    rm.eval()
    prompts = torch.randint(0, 16, (n, 4), generator=torch.Generator().manual_seed(seed))
    seqs = Engine(gen).generate(prompts, seed=seed)
    with torch.no_grad():
        probs, _ = rm(seqs)
    return probs[:, 0].mean().item()


@pytest.mark.slow
def test_grpo_raises_gameable_reward_and_resumes(setup):
    import train_grpo
    out = setup["tmp"] / "out"
    argv = [*CPU_EXACT, "--model_path", str(setup["gen"]), "--reward_model_path", str(setup["reward"]),
            "--out_dir", str(out), "--prompts_per_step", "8", "--group_size", "8",
            "--learning_rate", "3e-3", "--beta", "0.01", "--kl_cap", "0", "--reward_threshold", "2",
            "--patience", "0", "--eval_interval", "10", "--save_interval", "5",
            "--reward_window", "3", "--num_updates_per_batch", "2", "--micro_batch_size", "32"]
    train_grpo.main(argv + ["--max_steps", "10"])
    recs = read_jsonl(str(out / "metrics.jsonl"))
    steps = [r for r in recs if r["kind"] == "step"]
    assert [r["step"] for r in steps] == list(range(1, 11))
    for key in ("reward_mean", "reward_std", "zero_spread_frac", "kl", "clip_frac", "entropy",
                "tokens_per_s", "degenerate_frac"):
        assert all(isinstance(r[key], float) and math.isfinite(r[key]) for r in steps), key
    # every sequence of a step has the full length: prompt + completion = seq_len 32
    assert all(1 <= r["prompt_len"] <= 16 for r in steps)
    evals = [r for r in recs if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [0, 10]
    assert len(evals[1]["samples"]) == 3 and all(set(s["completion"]) <= set(ALPHABET)
                                                   for s in evals[1]["samples"])
    assert evals[0]["val_ppl"] == pytest.approx(math.exp(evals[0]["val_loss"]))

    # resume: continue the same run to step 16
    train_grpo.main(argv + ["--max_steps", "16", "--resume"])
    steps = [r for r in read_jsonl(str(out / "metrics.jsonl")) if r["kind"] == "step"]
    assert [r["step"] for r in steps] == list(range(1, 17))
    summary = json.loads((out / "grpo_summary.json").read_text())
    assert summary["steps"] == 16 and summary["stop_reason"] == "max_steps"
    assert (out / "grpo_curves.png").stat().st_size > 1000

    # the output is a plain generator checkpoint, and the reward went up on fresh samples
    ck = torch.load(out / "ckpt.pt", weights_only=True, map_location="cpu")
    assert ck["mode"] == "generator" and ck["tokenization"]["vocab_size"] == 16
    assert ck["data"]["train_sha256"] == torch.load(setup["gen"], weights_only=True, map_location="cpu")["data"]["train_sha256"]
    before = _mean_reward(setup["gen"], setup["reward"])
    after = _mean_reward(out / "ckpt.pt", setup["reward"])
    assert after > before + 0.1, (before, after)
    assert summary["reward_end"] > summary["reward_start"] + 0.1


@pytest.mark.slow
def test_the_degeneracy_guard_takes_the_pay_out_of_repetition(setup):
    """The gameable reward (P(natural) = the share of one token) prefers repetition, as a blind detector may:
    without the guard, GRPO drives every sample degenerate (one token over half of it); with the guard (the
    default: a degenerate sample's reward is P(natural)'s floor, 0) the policy keeps to the edge of
    degeneracy, its samples over it a few times in ten at most."""
    import train_grpo
    argv = [*CPU_EXACT, "--model_path", str(setup["gen"]), "--reward_model_path", str(setup["reward"]),
            "--prompts_per_step", "8", "--group_size", "8", "--learning_rate", "3e-3", "--beta", "0.01",
            "--kl_cap", "0", "--reward_threshold", "0", "--patience", "0", "--eval_interval", "100",
            "--save_interval", "100", "--num_updates_per_batch", "2", "--max_steps", "30"]
    shares = {}
    for guard in (False, True):
        out = setup["tmp"] / f"guard_{guard}"
        train_grpo.main(argv + ["--out_dir", str(out)] + ([] if guard else ["--no_degeneracy_guard"]))
        steps = [r for r in read_jsonl(str(out / "metrics.jsonl")) if r["kind"] == "step"]
        assert steps[0]["degenerate_frac"] == 0.0  # the random policy starts far from it
        shares[guard] = np.mean([r["degenerate_frac"] for r in steps[-10:]])
    assert shares[False] > 0.9 and shares[True] < 0.35, shares


@pytest.mark.slow
def test_grpo_with_the_trunk_ratio_reward_runs_without_a_detector(setup):
    """--reward trunk_ratio: the reward is another LM's log-ratio to the reference, no reward model; its
    summary records the trunk's shape (its LM head counts as the detector's scoring in the FLOPs), no eval
    reward. A missing or misplaced --trunk_path is refused."""
    import train_grpo
    from core.errors import ProjectError
    from experiment import flops
    torch.manual_seed(5)
    trunk = GPT(GPTConfig(block_size=32, vocab_size=16, n_layer=1, n_head=2, n_embd=32))
    base = torch.load(setup["gen"], weights_only=True, map_location="cpu")
    atomic_torch_save(make_checkpoint(trunk, None, data=base["data"], tokenization=base["tokenization"]),
                      setup["tmp"] / "trunk.pt")
    out = setup["tmp"] / "ratio"
    argv = [*CPU_EXACT, "--model_path", str(setup["gen"]), "--out_dir", str(out), "--prompts_per_step", "4",
            "--group_size", "4", "--max_steps", "3", "--eval_interval", "3", "--kl_cap", "0", "--patience", "0"]
    for bad in (["--reward", "trunk_ratio"], ["--trunk_path", str(setup["tmp"] / "trunk.pt")],
                ["--reward", "trunk_ratio", "--trunk_path", "t.pt", "--reward_model_path", str(setup["reward"])]):
        with pytest.raises(ProjectError, match="--reward trunk_ratio takes --trunk_path"):
            train_grpo.get_args(argv + bad)
    train_grpo.main(argv + ["--reward", "trunk_ratio", "--trunk_path", str(setup["tmp"] / "trunk.pt"),
                            "--kl_in_reward", "--beta", "1", "--advantage", "mean"])
    summary = json.loads((out / "grpo_summary.json").read_text())
    assert summary["reward"] == "trunk_ratio" and summary["steps"] == 3 and summary["eval_reward_end"] is None
    assert "reward_head" not in summary["detector"] and summary["detector"]["model_args"]["n_layer"] == 1
    steps = [r for r in read_jsonl(str(out / "metrics.jsonl")) if r["kind"] == "step"]
    assert all(math.isfinite(r["reward_mean"]) for r in steps)
    rec = flops.step_rl({"prompts_per_step": 4, "group_size": 4, "eval_interval": 3, **summary}, "grpo")
    assert rec["detail"]["detector_forward_flops_per_token"] == flops.forward_flops(summary["detector"]["model_args"])


def test_guard_degenerate_by_hand():
    r = torch.tensor([0.9, 0.2, 0.5, 0.7, 0.6, 0.8])
    bad = torch.tensor([True, False, False, False, True, False])
    assert torch.equal(guard_degenerate(r, bad, 3, floor=0.0), torch.tensor([0.0, 0.2, 0.5, 0.7, 0.0, 0.8]))
    assert torch.equal(guard_degenerate(r, bad, 3), torch.tensor([0.2, 0.2, 0.5, 0.7, 0.6, 0.8]))  # group minima
    tok = torch.tensor([[1.0, 3.0], [2.0, 0.5], [4.0, 4.0], [0.0, 1.0]])  # per-token rewards, groups of 2
    assert torch.equal(guard_degenerate(tok, torch.tensor([True, False, False, True]), 2),
                       torch.tensor([[1.0, 0.5], [2.0, 0.5], [4.0, 4.0], [0.0, 1.0]]))


@pytest.mark.slow
def test_grpo_interrupted_and_resumed_equals_straight_run(setup):
    import train_grpo
    argv = ["--model_path", str(setup["gen"]), "--reward_model_path", str(setup["reward"]),
            "--prompts_per_step", "2", "--group_size", "4", "--learning_rate", "3e-3",
            "--eval_interval", "100", "--save_interval", "2", "--patience", "0", "--kl_cap", "0",
            *CPU_EXACT]
    a, b = setup["tmp"] / "straight", setup["tmp"] / "resumed"
    train_grpo.main(argv + ["--out_dir", str(a), "--max_steps", "6"])
    train_grpo.main(argv + ["--out_dir", str(b), "--max_steps", "3"])
    train_grpo.main(argv + ["--out_dir", str(b), "--max_steps", "6", "--resume"])
    sa = torch.load(a / "ckpt.pt", weights_only=True, map_location="cpu")
    sb = torch.load(b / "ckpt.pt", weights_only=True, map_location="cpu")
    assert sa["grpo"]["step"] == sb["grpo"]["step"] == 6
    for k, v in sa["model"].items():
        assert torch.allclose(v, sb["model"][k], atol=1e-6), k
    ra = [r["reward_mean"] for r in read_jsonl(str(a / "metrics.jsonl")) if r["kind"] == "step"]
    rb = [r["reward_mean"] for r in read_jsonl(str(b / "metrics.jsonl")) if r["kind"] == "step"]
    assert ra == pytest.approx(rb, abs=1e-6)
    # the FLOPs count every evaluation the run made: at step 0 and at its last, 6, not a multiple of 100
    from experiment import flops
    evals = [r["step"] for r in read_jsonl(str(a / "metrics.jsonl")) if r["kind"] == "eval"]
    summary = json.loads((a / "grpo_summary.json").read_text())
    assert evals == [0, 6] and flops.evaluations(summary["steps"], 100) == 2


@pytest.mark.slow
def test_null_arm_shuffled_rewards_do_not_raise_the_reward(setup):
    """--shuffle_rewards keeps GRPO's updates but not the detector's signal: the run that raises
    the gameable reward above (same settings) leaves it where it was."""
    import train_grpo
    out = setup["tmp"] / "null"
    train_grpo.main([*CPU_EXACT, "--model_path", str(setup["gen"]), "--reward_model_path", str(setup["reward"]),
                     "--out_dir", str(out), "--prompts_per_step", "8", "--group_size", "8",
                     "--learning_rate", "3e-3", "--beta", "0.01", "--kl_cap", "0", "--reward_threshold", "0",
                     "--patience", "0", "--eval_interval", "10", "--save_interval", "5", "--max_steps", "10",
                     "--num_updates_per_batch", "2", "--shuffle_rewards"])
    summary = json.loads((out / "grpo_summary.json").read_text())
    assert summary["shuffle_rewards"] is True and summary["steps"] == 10 and summary["prompt_split"] == "train"
    steps = [r for r in read_jsonl(str(out / "metrics.jsonl")) if r["kind"] == "step"]
    assert all(0 <= r["reward_completion"] <= 1 for r in steps)
    before = _mean_reward(setup["gen"], setup["reward"])
    after = _mean_reward(out / "ckpt.pt", setup["reward"])
    assert abs(after - before) < 0.1, (before, after)


@pytest.mark.slow
def test_grpo_plus_mle_runs_logs_its_term_and_resumes_exactly(setup):
    """--ptx_coef: the MLE term on natural train windows rides on every update; its loss is logged,
    its windows are drawn from (seed, step) so a resumed run repeats the straight one."""
    import train_grpo
    argv = ["--model_path", str(setup["gen"]), "--reward_model_path", str(setup["reward"]),
            "--prompts_per_step", "2", "--group_size", "4", "--learning_rate", "3e-3", "--eval_interval", "100",
            "--save_interval", "2", "--patience", "0", "--kl_cap", "0", "--ptx_coef", "1.0", "--ptx_rows", "4",
            *CPU_EXACT]
    a, b = setup["tmp"] / "ptx_straight", setup["tmp"] / "ptx_resumed"
    train_grpo.main(argv + ["--out_dir", str(a), "--max_steps", "4"])
    train_grpo.main(argv + ["--out_dir", str(b), "--max_steps", "2"])
    train_grpo.main(argv + ["--out_dir", str(b), "--max_steps", "4", "--resume"])
    steps = [r for r in read_jsonl(str(a / "metrics.jsonl")) if r["kind"] == "step"]
    assert all(0 < r["ptx_loss"] < 10 for r in steps)
    sa, sb = (torch.load(d / "ckpt.pt", weights_only=True, map_location="cpu") for d in (a, b))
    for k, v in sa["model"].items():
        assert torch.allclose(v, sb["model"][k], atol=1e-6), k
    summary = json.loads((a / "grpo_summary.json").read_text())
    assert summary["ptx_coef"] == 1.0 and summary["ptx_rows"] == 4
    from experiment import flops
    # the run's shape from its summary, beside the settings it was given (run_cycles parses them)
    rec = flops.step_rl({"prompts_per_step": 2, "group_size": 4, "eval_interval": 100, **summary}, "grpo")
    assert rec["detail"]["ptx_tokens"] == 4 * 4 * 32  # steps x rows x seq_len (one update per step)


def test_shuffle_within_groups_moves_rows_only_inside_their_group():
    from core.objectives import shuffle_within_groups
    perm = shuffle_within_groups(24, 8, np.random.default_rng(0))
    assert sorted(perm.tolist()) == list(range(24))
    assert all(perm[i].item() // 8 == i // 8 for i in range(24))
    assert not torch.equal(perm, torch.arange(24))
    with pytest.raises(ValueError):
        shuffle_within_groups(10, 4, np.random.default_rng(0))


def test_grpo_stops_at_reward_threshold(setup):
    import train_grpo
    out = setup["tmp"] / "thr"
    train_grpo.main([*CPU_EXACT, "--model_path", str(setup["gen"]), "--reward_model_path", str(setup["reward"]),
                     "--out_dir", str(out), "--prompts_per_step", "2", "--group_size", "4",
                     "--reward_window", "2", "--reward_threshold", "0.01", "--max_steps", "50",
                     "--eval_interval", "100"])
    summary = json.loads((out / "grpo_summary.json").read_text())
    assert summary["steps"] == 2 and summary["stop_reason"].startswith("reward_threshold")
    # the completion reward (the generated positions only) drives the window, and is logged beside
    # the all-position reward the advantages use
    steps = [r for r in read_jsonl(str(out / "metrics.jsonl")) if r["kind"] == "step"]
    assert steps[-1]["reward_window"] == pytest.approx(np.mean([r["reward_completion"] for r in steps]))


def test_grpo_names_its_two_rewards_and_prints_lines_off_a_terminal(setup, capsys):
    """The progress bar's two rewards are named for what they are: this step's sequence reward (the
    advantages', prompt positions included) and the completion reward over the last --reward_window
    steps, which the closing line reports under the same name and value. Off a terminal the bar is
    lines, no carriage-return redraws."""
    import re

    import train_grpo
    out = setup["tmp"] / "names"
    train_grpo.main([*CPU_EXACT, "--model_path", str(setup["gen"]), "--reward_model_path", str(setup["reward"]),
                     "--out_dir", str(out), "--prompts_per_step", "2", "--group_size", "4", "--max_steps", "5",
                     "--reward_window", "3", "--patience", "0", "--reward_threshold", "0", "--eval_interval", "100"])
    captured = capsys.readouterr()
    assert "\r" not in captured.err + captured.out
    bar = [line for line in captured.err.splitlines() if line.startswith("grpo: ")]
    assert 2 <= len(bar) <= 7 and bar[-1].startswith("grpo: 100%")
    last = re.search(r"sequence reward \(this step\) (\S+), completion reward \(last 3 steps\) (\S+), KL", bar[-1])
    steps = [r for r in read_jsonl(str(out / "metrics.jsonl")) if r["kind"] == "step"]
    assert float(last.group(1)) == pytest.approx(steps[-1]["reward_mean"], abs=6e-4)
    closing = re.search(r"completion reward \(the detector's reward of the generated positions, mean over steps\): "
                        r"(\S+) \(first 3 steps\) -> (\S+) \(last 3 steps\)", captured.out)
    assert closing and float(closing.group(2)) == pytest.approx(float(last.group(2)), abs=6e-4)
    assert float(closing.group(2)) == pytest.approx(np.mean([r["reward_completion"] for r in steps[-3:]]), abs=6e-5)


@pytest.mark.slow  # a command line run in a subprocess
def test_grpo_wrong_mode_exits_2(setup, capsys):
    # a reward checkpoint as the policy: the real command line, exit 2, no traceback
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = run_script(["train_grpo.py", "--model_path", str(setup["reward"]), "--reward_model_path", str(setup["reward"]),
                    "--out_dir", str(setup["tmp"] / "bad")], cwd=ROOT, env=env)
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr
    assert "is a reward checkpoint, but a generator checkpoint is needed here" in p.stderr
    # a generator checkpoint as the reward model (in-process through the same run_cli)
    import train_grpo
    from core.cli import run_cli
    with pytest.raises(SystemExit) as e:
        run_cli(lambda: train_grpo.main([*CPU_EXACT, "--model_path", str(setup["gen"]), "--reward_model_path",
                                         str(setup["gen"]), "--out_dir", str(setup["tmp"] / "bad")]))
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "is a generator checkpoint, but a reward checkpoint is needed here" in err
    assert "suggestion: pass a checkpoint written by train_reward_model.py" in err


@pytest.mark.slow
def test_token_level_grpo_raises_a_per_position_reward(setup):
    import train_grpo
    rm = train_gameable_reward(str(setup["data_dir"]), str(setup["tmp"] / "reward_pp.pt"), X_CHAR,
                               per_position=True)
    out = setup["tmp"] / "token_level"
    train_grpo.main([*CPU_EXACT, "--model_path", str(setup["gen"]), "--reward_model_path", str(rm),
                     "--out_dir", str(out), "--prompts_per_step", "8", "--group_size", "8",
                     "--learning_rate", "3e-3", "--beta", "0.01", "--kl_cap", "0", "--reward_threshold", "2",
                     "--patience", "0", "--eval_interval", "10", "--save_interval", "10", "--reward_window", "3",
                     "--max_steps", "10", "--reward_level", "token"])
    summary = json.loads((out / "grpo_summary.json").read_text())
    assert summary["reward_level"] == "token" and summary["updates"] == 10
    assert summary["completion_tokens"] == sum(64 * (32 - r["prompt_len"]) for r in
                                               read_jsonl(str(out / "metrics.jsonl")) if r["kind"] == "step")
    assert _mean_reward(out / "ckpt.pt", rm) > _mean_reward(setup["gen"], rm) + 0.1
    # a last-token reward model has no per-position verdicts to credit tokens with
    from core.errors import ProjectError
    with pytest.raises(ProjectError, match="--reward_level token needs a per-position reward model"):
        train_grpo.main([*CPU_EXACT, "--model_path", str(setup["gen"]), "--reward_model_path", str(setup["reward"]),
                         "--out_dir", str(setup["tmp"] / "tl_bad"), "--reward_level", "token"])


@pytest.mark.slow
def test_entropy_floor_keeps_the_policy_from_sharpening(setup):
    """--entropy_floor: the penalty is logged every step, and with the same seeds the policy's
    entropy after a few large steps stays above the unpenalised run's (GRPO against this reward
    sharpens the policy); a resumed run equals a straight one."""
    import train_grpo
    argv = ["--model_path", str(setup["gen"]), "--reward_model_path", str(setup["reward"]),
            "--prompts_per_step", "4", "--group_size", "8", "--learning_rate", "3e-3", "--beta", "0.0",
            "--eval_interval", "100", "--save_interval", "3", "--patience", "0", "--kl_cap", "0", *CPU_EXACT,
            "--max_steps", "6"]
    plain, floor, resumed = (setup["tmp"] / n for n in ("ent_plain", "ent_floor", "ent_resumed"))
    train_grpo.main(argv + ["--out_dir", str(plain)])
    train_grpo.main(argv + ["--out_dir", str(floor), "--entropy_floor", "5"])
    steps = {d: [r for r in read_jsonl(str(d / "metrics.jsonl")) if r["kind"] == "step"] for d in (plain, floor)}
    assert "entropy_penalty" not in steps[plain][0]
    assert all(math.isfinite(r["entropy_penalty"]) and r["entropy_penalty"] >= 0 for r in steps[floor])
    assert steps[floor][0]["entropy_penalty"] == pytest.approx(0.0, abs=1e-5)  # the policy starts as the reference
    assert steps[plain][-1]["entropy"] < steps[plain][0]["entropy"]  # without the floor it sharpens
    assert steps[floor][-1]["entropy"] > steps[plain][-1]["entropy"]
    train_grpo.main(argv[:-2] + ["--max_steps", "3", "--out_dir", str(resumed), "--entropy_floor", "5"])
    train_grpo.main(argv + ["--out_dir", str(resumed), "--entropy_floor", "5", "--resume"])
    a, b = (torch.load(d / "ckpt.pt", weights_only=True, map_location="cpu")["model"] for d in (floor, resumed))
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


@pytest.mark.slow
def test_principled_options_run_and_resume(setup):
    """--reward logit --kl_in_reward --beta 1 --advantage mean at --temperature 0.8 (issue 20):
    finite rewards and KL every step, the options recorded, and a run interrupted at step 3 and
    resumed equals the straight one."""
    import train_grpo
    rm = setup["tmp"] / "reward_pp.pt"
    if not rm.exists():
        train_gameable_reward(str(setup["data_dir"]), str(rm), X_CHAR, per_position=True)
    argv = ["--model_path", str(setup["gen"]), "--reward_model_path", str(rm), "--prompts_per_step", "2",
            "--group_size", "4", "--learning_rate", "3e-3", "--eval_interval", "100", "--save_interval", "2",
            "--patience", "0", "--kl_cap", "0", "--reward", "logit", "--kl_in_reward", "--beta", "1",
            "--advantage", "mean", "--temperature", "0.8", "--eval_reward_samples", "8", *CPU_EXACT]
    a, b = setup["tmp"] / "logit_straight", setup["tmp"] / "logit_resumed"
    train_grpo.main(argv + ["--out_dir", str(a), "--max_steps", "6"])
    train_grpo.main(argv + ["--out_dir", str(b), "--max_steps", "3"])
    train_grpo.main(argv + ["--out_dir", str(b), "--max_steps", "6", "--resume"])
    steps = [r for r in read_jsonl(str(a / "metrics.jsonl")) if r["kind"] == "step"]
    assert len(steps) == 6 and all(math.isfinite(r["reward_mean"]) and math.isfinite(r["kl"]) for r in steps)
    summary = json.loads((a / "grpo_summary.json").read_text())
    assert (summary["reward"], summary["kl_in_reward"], summary["advantage"]) == ("logit", True, "mean")
    assert summary["stop_reason"] == "max_steps"  # no P(natural) threshold on a reward in nats
    sa, sb = (torch.load(d / "ckpt.pt", weights_only=True, map_location="cpu")["model"] for d in (a, b))
    assert all(torch.allclose(sa[k], sb[k], atol=1e-6) for k in sa)
    rb = [r["reward_mean"] for r in read_jsonl(str(b / "metrics.jsonl")) if r["kind"] == "step"]
    assert [r["reward_mean"] for r in steps] == pytest.approx(rb, abs=1e-5)
    from core.errors import ProjectError
    with pytest.raises(ProjectError, match="--reward logit needs a per-position reward model"):
        train_grpo.main([*CPU_EXACT, "--model_path", str(setup["gen"]), "--reward_model_path", str(setup["reward"]),
                         "--out_dir", str(setup["tmp"] / "logit_bad"), "--reward", "logit"])


@pytest.mark.cuda
def test_grpo_on_a_gpu_under_bfloat16_runs_and_resumes_close(setup):
    """The GPU's own path: --dtype auto (bfloat16 autocast), rollouts through the captured static-cache
    decoder, the whole logits in one chunk. Every figure finite; a resumed run follows the straight one to
    the precision's rounding (CUDA's atomic adds make the bits order-dependent, and a flipped token changes
    the steps after it)."""
    import train_grpo
    argv = ["--model_path", str(setup["gen"]), "--reward_model_path", str(setup["reward"]), "--device", "cuda",
            "--prompts_per_step", "4", "--group_size", "8", "--learning_rate", "3e-3", "--eval_interval", "100",
            "--save_interval", "2", "--patience", "0", "--kl_cap", "0", "--reward_threshold", "0"]
    a, b = setup["tmp"] / "cuda_straight", setup["tmp"] / "cuda_resumed"
    train_grpo.main(argv + ["--out_dir", str(a), "--max_steps", "4"])
    train_grpo.main(argv + ["--out_dir", str(b), "--max_steps", "2"])
    train_grpo.main(argv + ["--out_dir", str(b), "--max_steps", "4", "--resume"])
    ra, rb = ([r for r in read_jsonl(str(d / "metrics.jsonl")) if r["kind"] == "step"] for d in (a, b))
    assert [r["step"] for r in ra] == [r["step"] for r in rb] == [1, 2, 3, 4]
    for r in ra:
        assert all(math.isfinite(r[k]) for k in ("loss", "reward_mean", "kl", "entropy", "grad_norm")), r
    assert [r["reward_mean"] for r in ra] == pytest.approx([r["reward_mean"] for r in rb], abs=0.05)
    # one sampled token that flips after the resume changes the gradients from there on, and an Adam step
    # moves a parameter by about the learning rate: two steps after the resume, 4 x lr bounds the distance
    sa, sb = (torch.load(d / "ckpt.pt", weights_only=True, map_location="cpu")["model"] for d in (a, b))
    assert all(torch.allclose(sa[k], sb[k], rtol=0, atol=4 * 3e-3) for k in sa)
