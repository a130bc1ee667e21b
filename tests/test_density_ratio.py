"""The detector as a density ratio (issue 20): the log-ratio read off per-position logits, the
principled GRPO options (logit reward, KL inside the reward, mean baseline, log-probs at the
rollout temperature), the float16 gradient scaler, and the residual energy model / SIR of
experiment/residual.py. The toy: data from one bigram distribution p, a generator q = another, so the exact
log-ratio log p / q of any sequence is known."""
import contextlib
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from core.devices import DistInfo, grad_scaler, needs_grad_scaler
from core.errors import ProjectError
from core.objectives import group_advantages, grpo_loss, kl_penalised_rewards, log_ratio_increments, logit_rewards
from core.training import RunContext
from engine import Engine
from helpers import TINY
from lib.grpo_objective import LossTerms, Reward
from model import GPT, GPTConfig

V, L = 5, 8  # symbols; sequence length (1 prompt token + 7 completion tokens)


# ----------------------------------------------------------------------------- the bigram toy

def bigram_pair(seed=0, sharp=2.0, mix=0.5):
    """(P, Q, p0): the data's transition matrix, the generator's (P mixed with another random one)
    and the shared uniform law of the first token."""
    g = torch.Generator().manual_seed(seed)
    P = torch.softmax(sharp * torch.randn(V, V, generator=g, dtype=torch.float64), -1)
    Q = (1 - mix) * P + mix * torch.softmax(0.5 * torch.randn(V, V, generator=g, dtype=torch.float64), -1)
    return P, Q, torch.full((V,), 1.0 / V, dtype=torch.float64)


def sample_chain(T, x0, gen, length=L):
    xs = [x0]
    for _ in range(length - 1):
        xs.append(torch.multinomial(T[xs[-1]].float(), 1, generator=gen).squeeze(-1))
    return torch.stack(xs, 1)


def tok_logp(logT, x):
    """log T(x_t | x_{t-1}) of every completion token, (B, length - 1)."""
    return logT[x[:, :-1], x[:, 1:]]


def marginals(T, p0):
    m = [p0]
    for _ in range(L - 2):
        m.append(m[-1] @ T)
    return torch.stack(m)  # law of x_{t-1} for t = 1 .. L-1


def kl_data_to(T, P, p0):
    """KL(p || pi) of the whole completion given its first token (nats per sequence), exact."""
    return (marginals(P, p0) @ (P * (P.log() - T.log())).sum(-1)).sum().item()


def entropy_rate(T, p0):
    """Mean per-token entropy of chain T along its own completions, exact."""
    return (marginals(T, p0) @ -(T * T.log()).sum(-1)).mean().item()


# ----------------------------------------------------------------------------- log-ratio from per-position logits

def bayes_logits(rho, n_train, k_min=1, k_max=None):
    """The logits log P(K > t | x_<=t) / P(K <= t | x_<=t) of a Bayes-optimal per-position detector
    whose crossover K is uniform on [k_min, k_max], from the per-token log-ratios rho (T,),
    computed straight from the definition (a sum over every crossover, no recurrence)."""
    k_max = n_train - 1 if k_max is None else k_max
    out = []
    for t in range(len(rho)):
        n_gt = sum(1 for k in range(k_min, k_max + 1) if k > t)
        s = sum(math.exp(-sum(rho[k:t + 1])) for k in range(k_min, min(t, k_max) + 1))
        out.append(math.log(n_gt) - math.log(s) if n_gt and s else (50.0 if not s else -50.0))
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("k_min,k_max", [(1, None), (3, 9)])
def test_log_ratio_increments_recover_the_exact_per_token_ratio(k_min, k_max):
    P, Q, p0 = bigram_pair()
    N = 12
    x = sample_chain(Q, torch.tensor([2]), torch.Generator().manual_seed(3), N)[0]
    rho = [0.0] + (P.log() - Q.log())[x[:-1], x[1:]].tolist()
    logits = bayes_logits(rho, N, k_min, k_max)
    got = log_ratio_increments(logits[None], N, k_min, k_max)[0]
    hi = N - 1 if k_max is None else k_max
    for t in range(N):
        want = rho[t] if k_min <= t < hi else 0.0  # the labels never made the others uncertain
        assert got[t].item() == pytest.approx(want, abs=1e-9), t
    # the sequence reward is their sum over the completion; the raw logits' sum is not
    plen = 4
    assert logit_rewards(logits[None], plen, N, k_min=k_min, k_max=k_max)[0].item() == pytest.approx(
        sum(rho[plen:hi]), abs=1e-9)
    assert abs(logits[plen:].sum().item() - sum(rho[plen:hi])) > 0.5
    tok = logit_rewards(logits[None], plen, N, "token", k_min=k_min, k_max=k_max)[0]
    assert tok[1].item() == pytest.approx(sum(rho[plen + 1:hi]), abs=1e-9)


def test_kl_penalised_rewards_hand_computed():
    r = torch.tensor([1.0, 2.0])
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -0.5]])
    ref = torch.tensor([[-1.5, -1.0], [-1.0, -0.5]])
    # sum of log pi - log pi_ref: 0.5 - 1.0 = -0.5 and 0.5
    assert kl_penalised_rewards(r, logp, ref, 2.0).tolist() == [2.0, 1.0]
    tok = kl_penalised_rewards(torch.tensor([[1.0, 0.0], [0.0, 0.0]]), logp, ref, 1.0)
    assert tok.tolist() == [[1.5, 1.0], [-0.5, 0.0]]


# ----------------------------------------------------------------------------- GRPO on the toy

def toy_grpo(P, Q, p0, reward, steps, beta, scale_std, kl_in_reward, lr=0.05, prompts=32, G=8, seed=1):
    """GRPO with core/objectives.py's functions on a directly parameterised bigram policy (logits table,
    started at Q), exact reward: 'logit' = log p/q of the completion, 'p_natural' = its sigmoid
    (a bounded P(natural)-style score). Returns the final transition matrix."""
    theta = Q.log().clone().requires_grad_(True)
    opt = torch.optim.Adam([theta], lr=lr)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x0 = torch.multinomial(p0.float(), prompts, replacement=True, generator=gen).repeat_interleave(G)
        with torch.no_grad():
            x = sample_chain(torch.softmax(theta, -1), x0, gen)
            old = tok_logp(torch.log_softmax(theta, -1), x)
            ref = tok_logp(Q.log(), x)
            r = (tok_logp(P.log(), x) - ref).sum(1)
            r = r if reward == "logit" else torch.sigmoid(r)
            if kl_in_reward:
                r = kl_penalised_rewards(r, old, ref, beta)
            adv = group_advantages(r, G, scale_std=scale_std)
        new = tok_logp(torch.log_softmax(theta, -1), x)
        loss, _ = grpo_loss(new, old, ref, adv, 0.2, 0.0 if kl_in_reward else beta)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return torch.softmax(theta.detach(), -1)


def test_logit_reward_with_kl_in_reward_at_beta_1_moves_the_generator_to_the_data():
    P, Q, p0 = bigram_pair()
    T = toy_grpo(P, Q, p0, "logit", steps=80, beta=1.0, scale_std=False, kl_in_reward=True)
    kl0, kl1 = kl_data_to(Q, P, p0), kl_data_to(T, P, p0)
    assert kl0 > 1.5 and kl1 < 0.1 * kl0, (kl0, kl1)
    # it aims at p, not past it: the entropy rate lands near p's, not below
    assert entropy_rate(T, p0) == pytest.approx(entropy_rate(P, p0), abs=0.1)


def test_bounded_reward_with_std_scaling_and_small_beta_sharpens():
    P, Q, p0 = bigram_pair()
    T = toy_grpo(P, Q, p0, "p_natural", steps=80, beta=0.01, scale_std=True, kl_in_reward=False)
    h_data = entropy_rate(P, p0)
    assert entropy_rate(T, p0) < 0.5 * h_data, (entropy_rate(T, p0), h_data)
    assert kl_data_to(T, P, p0) > kl_data_to(Q, P, p0)  # and it ends further from the data than it began


# ----------------------------------------------------------------------------- train_grpo: temperature, options, scaler

def test_token_logprobs_at_a_temperature_match_a_hand_computation():
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(block_size=16, vocab_size=11, **TINY)).eval()
    x = torch.randint(0, 11, (3, 10))
    logits = gpt.lm_head(gpt.hidden_states(x[:, :-1])).float()
    for T in (0.5, 1.0, 1.7):
        want = F.log_softmax(logits / T, -1).gather(-1, x[:, 1:, None]).squeeze(-1)
        lp, ent = gpt.token_logprobs(x[:, :-1], x[:, 1:], return_entropy=True, temperature=T)
        assert torch.allclose(lp, want, atol=1e-5), T
        q = F.log_softmax(logits / T, -1)
        assert torch.allclose(ent, -(q.exp() * q).sum(-1), atol=1e-5)
    # chunked: the same numbers whatever the chunking
    lp2 = gpt.token_logprobs(x[:, :-1], x[:, 1:], temperature=0.5, max_elements=11 * 4)
    assert torch.allclose(lp2, gpt.token_logprobs(x[:, :-1], x[:, 1:], temperature=0.5), atol=1e-6)


def _grpo_args(*flags):
    import train_grpo
    return train_grpo.get_args(["--model_path", "gen.pt", "--reward_model_path", "rm.pt", "--group_size", "2",
                                "--prompts_per_step", "2", *flags])


def test_grpo_option_parsing():
    a = _grpo_args()
    assert (a.reward, a.advantage, a.kl_in_reward, a.reward_threshold) == ("p_natural", "std", False, 0.9)
    assert _grpo_args("--reward", "logit").reward_threshold == 0.0  # off: the log-ratio is in nats
    assert _grpo_args("--reward", "logit", "--reward_threshold", "3").reward_threshold == 3.0
    assert _grpo_args("--advantage", "mean").advantage == "mean"
    # the compatibility flags are gone: --advantage mean, --num_updates_per_batch, and no top-k for training
    for old in (["--no_scale_std"], ["--ppo_epochs", "2"], ["--top_k", "5"]):
        with pytest.raises(SystemExit) as e:
            _grpo_args(*old)
        assert e.value.code == 2


class CountingScaler(torch.amp.GradScaler):
    """A real (disabled) GradScaler that counts the calls a training step makes on it."""

    def __init__(self):
        super().__init__("cuda", enabled=False)
        self.calls = []

    def scale(self, outputs):
        self.calls.append("scale")
        return super().scale(outputs)

    def unscale_(self, optimizer):
        self.calls.append("unscale_")
        return super().unscale_(optimizer)

    def step(self, optimizer, *a, **k):
        self.calls.append("step")
        return super().step(optimizer, *a, **k)

    def update(self, new_scale=None):
        self.calls.append("update")
        return super().update(new_scale)


def _tiny_models():
    torch.manual_seed(0)
    cfg = dict(block_size=24, vocab_size=16, **TINY)
    policy, ref = GPT(GPTConfig(**cfg)).eval(), GPT(GPTConfig(**cfg)).eval()
    rm = GPT(GPTConfig(mode="reward", reward_per_position=True, reward_head_hidden_dim=16, **cfg)).eval()
    with torch.no_grad():
        for p in rm.reward_head.parameters():
            p.normal_(0.0, 0.5)
    return policy, ref, rm


def test_rollout_and_step_at_temperature_with_logit_reward_kl_in_reward_and_scaler():
    import train_grpo
    policy, ref, rm = _tiny_models()
    T, seq_len = 0.7, 24
    args = _grpo_args("--temperature", str(T), "--reward", "logit", "--kl_in_reward", "--advantage", "mean",
                      "--beta", "0.5")
    data = np.random.default_rng(0).integers(0, 16, 400).astype(np.uint16)
    scaler = CountingScaler()
    ctx = RunContext(DistInfo(), "cpu", "float32", contextlib.nullcontext(), scaler, writes=False)
    opt = policy.configure_optimizers(0.0, 1e-3, (0.9, 0.95), "cpu")
    run = train_grpo.GRPORun(args, ctx, policy, opt, {}, "", None, seq_len, "", ref=ref, reward_model=rm,
                             policy=train_grpo.TokenLogProbs(policy), train_data=data, tok=None, evalset=None,
                             detector_len=seq_len, engine=Engine(policy), reward=Reward.from_args(args),
                             terms=LossTerms.from_args(args))
    batch = train_grpo.rollout(train_grpo.GRPOState(), run)
    s, plen = batch.seqs, batch.plen

    def at_t(m):  # log softmax(logits / T) of the completion tokens, by hand
        lg = m.lm_head(m.hidden_states(s[:, :-1])).float() / T
        return F.log_softmax(lg, -1).gather(-1, s[:, 1:, None]).squeeze(-1)[:, plen - 1:]
    with torch.no_grad():
        ref_lp, pol_lp = at_t(ref), at_t(policy)
        pl = rm.position_logits(s).float()
    assert torch.allclose(batch.ref_logp, ref_lp, atol=1e-5)
    r = logit_rewards(pl[..., 0] - pl[..., 1], plen, seq_len)
    assert torch.allclose(batch.rewards, r, atol=1e-5)
    r_total = r - 0.5 * (pol_lp - ref_lp).sum(1)
    assert torch.allclose(batch.adv, r_total - r_total.view(-1, 2).mean(1).repeat_interleave(2), atol=1e-4)
    # the step takes the policy's log-probs at T too (its KL stat matches the hand one) and goes
    # through the scaler: scale, unscale, step, update
    k3 = (torch.exp(ref_lp - pol_lp) - (ref_lp - pol_lp) - 1).mean().item()
    stats = train_grpo.train_step(train_grpo.GRPOState(), run, batch)
    assert stats["kl"] == pytest.approx(k3, rel=1e-4)
    assert scaler.calls == ["scale", "unscale_", "step", "update"]


def test_grad_scaler_exactly_where_float16_is_picked():
    from core.devices import resolve_dtype
    for device in ("cuda", "cuda:1", "cpu"):  # float16 autocasts on CPU too (common.autocast_context)
        assert needs_grad_scaler(device, "float16")
    for device, dtype in [("cuda", "bfloat16"), ("cuda", "float32"), ("cpu", "bfloat16"), ("cpu", "float32"),
                          ("mps", "float16")]:
        assert not needs_grad_scaler(device, dtype)
    assert not grad_scaler("cpu", resolve_dtype("auto", "cpu")).is_enabled()
    assert grad_scaler("cpu", "float16").is_enabled()


def test_spin_step_goes_through_the_scaler():
    import train_spin
    policy, ref, _ = _tiny_models()
    args = train_spin.get_args(["--model_path", "gen.pt"])
    s = torch.randint(0, 16, (4, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref_logp = ref.token_logprobs(s[:, :-1], s[:, 1:])[:, 3:]
    pairs = train_spin.Pairs(s[:2], s[2:], 4, ref_logp)
    scaler = CountingScaler()
    opt = policy.configure_optimizers(0.0, 1e-3, (0.9, 0.95), "cpu")
    ctx = RunContext(DistInfo(), "cpu", "float32", contextlib.nullcontext(), scaler, writes=False)
    run = train_spin.SPINRun(args, ctx, policy, opt, {}, "", None, 12, "", ref=ref, train_data=None, val_loader=None,
                             ref_engine=Engine(ref))
    train_spin.train_step(train_spin.SPINState(), run, pairs)
    assert scaler.calls == ["scale", "unscale_", "step", "update"]


# ----------------------------------------------------------------------------- experiment/residual.py

def test_residual_gain_hand_computed():
    from experiment.residual import log_normaliser, residual_gain, sample_counts
    assert sample_counts(1) == [1] and sample_counts(2) == [1, 2] and sample_counts(6) == [1, 2, 4, 6]
    samples = torch.tensor([[0.0, math.log(3.0)], [1.0, 1.0]])
    # Z_2 = (e^0 + e^log3) / 2 = 2 and (e + e) / 2 = e; Z_1 = the first sample alone
    assert log_normaliser(samples, 2).tolist() == pytest.approx([math.log(2.0), 1.0])
    assert log_normaliser(samples, 1).tolist() == pytest.approx([0.0, 1.0])
    data = torch.tensor([math.log(2.0), 0.5])
    rep = residual_gain(data, samples, torch.tensor([2, 4]), gen_logp=torch.tensor([-3.0, -2.0]))
    assert sorted(rep) == [1, 2]
    # 6 tokens in all: gain = sum (s - log Z) / 6; NLL_res = NLL_gen - gain
    assert rep[2]["gain"] == pytest.approx((0.0 + (0.5 - 1.0)) / 6)
    assert rep[1]["gain"] == pytest.approx((math.log(2.0) + (0.5 - 1.0)) / 6)
    assert rep[2]["nll_gen"] == pytest.approx(5.0 / 6)
    assert rep[2]["nll_residual"] == pytest.approx(5.5 / 6)
    assert rep[2]["log_z"] == pytest.approx((math.log(2.0) + 1.0) / 2)
    # per-prefix s - log Z_2: 0 and -0.5, minus gain * tokens (gain = -1/12): 1/6 and -1/6
    resid = torch.tensor([1.0 / 6, -1.0 / 6], dtype=torch.float64)
    assert rep[2]["gain_se"] == pytest.approx(resid.std().item() / math.sqrt(2) / 3.0)


def exact_ratio_toy(C, n, seed):
    """Data from bigram P and n continuations from bigram Q of each of its C first tokens, scored by
    the exact log-ratio: (P, Q, p0, data (C, L), s(data) (C,), s(samples) (C, n))."""
    P, Q, p0 = bigram_pair(sharp=1.5, mix=0.5)
    gen = torch.Generator().manual_seed(seed)
    x0 = torch.multinomial(p0.float(), C, replacement=True, generator=gen)
    data = sample_chain(P, x0, gen)
    samples = sample_chain(Q, x0.repeat_interleave(n), gen)
    score = lambda x: (tok_logp(P.log(), x) - tok_logp(Q.log(), x)).sum(1)  # noqa: E731
    return P, Q, p0, data, score(data), score(samples).view(C, n)


def test_residual_model_with_the_exact_log_ratio_is_the_data_distribution():
    from experiment.residual import residual_gain
    C, n = 400, 512
    P, Q, p0, data, s_data, s_samples = exact_ratio_toy(C, n, 5)
    rep = residual_gain(s_data, s_samples, L - 1, gen_logp=tok_logp(Q.log(), data).sum(1))
    nll_p = -tok_logp(P.log(), data).sum().item() / (C * (L - 1))
    kl_tok = kl_data_to(Q, P, p0) / (L - 1)
    assert kl_tok > 0.1
    best = rep[n]
    # Z = 1 exactly; log Z_n is biased low and rises towards 0 as n grows
    assert rep[1]["log_z"] < rep[8]["log_z"] < rep[n]["log_z"] <= 0.05 and rep[n]["log_z"] > -0.05
    assert rep[1]["log_z"] < -0.2
    # the residual NLL is the data's own (its entropy rate), and it beats the generator by ~KL(p||q)
    assert best["nll_residual"] == pytest.approx(nll_p, abs=0.01)
    assert best["nll_residual"] == pytest.approx(entropy_rate(P, p0), abs=0.05)
    assert best["gain"] == pytest.approx(kl_tok, abs=0.04)
    assert 0 < best["gain_se"] < 0.02 and abs(best["gain"] - kl_tok) < 3 * best["gain_se"] + 0.01
    assert rep[1]["gain"] > best["gain"]  # a small n overstates the gain


def test_sir_moves_the_samples_towards_the_data():
    from experiment.residual import sir_choice
    P, Q, p0 = bigram_pair()
    C, n = 2000, 32
    gen = torch.Generator().manual_seed(6)
    x0 = torch.multinomial(p0.float(), C, replacement=True, generator=gen)
    cand = sample_chain(Q, x0.repeat_interleave(n), gen).view(C, n, L)
    scores = (tok_logp(P.log(), cand.view(-1, L)) - tok_logp(Q.log(), cand.view(-1, L))).sum(1).view(C, n)
    chosen = cand[torch.arange(C), sir_choice(scores, gen)]

    def transitions(x):
        counts = torch.zeros(V, V, dtype=torch.float64)
        counts.index_put_((x[:, :-1].reshape(-1), x[:, 1:].reshape(-1)), torch.ones(x[:, 1:].numel(),
                          dtype=torch.float64), accumulate=True)
        return counts / counts.sum(1, keepdim=True)
    far_q = (transitions(cand[:, 0]) - P).abs().sum().item()
    far_sir = (transitions(chosen) - P).abs().sum().item()
    assert far_sir < 0.4 * far_q, (far_sir, far_q)


def test_residual_report_and_sir_generate_on_tiny_models():
    from experiment.residual import detector_scores, residual_report, sir_generate
    gen, _, rm = _tiny_models()
    natural = torch.randint(0, 16, (3, 20), generator=torch.Generator().manual_seed(0))
    s = detector_scores(rm, natural, 6, 24)
    pl = rm.position_logits(natural).float().detach()
    assert torch.allclose(s, logit_rewards(pl[..., 0] - pl[..., 1], 6, 24))
    rep = residual_report(gen, rm, natural, 6, 4, 24, temperature=0.8, generator=torch.Generator().manual_seed(1))
    assert sorted(rep) == [1, 2, 4]
    with torch.no_grad():
        lg = gen.lm_head(gen.hidden_states(natural[:, :-1])).float() / 0.8
        nll = -F.log_softmax(lg, -1).gather(-1, natural[:, 1:, None])[:, 5:].sum().item() / (3 * 14)
    assert rep[4]["nll_gen"] == pytest.approx(nll, rel=1e-5)
    assert rep[4]["nll_residual"] == pytest.approx(nll - rep[4]["gain"])
    out = sir_generate(gen, rm, natural[:, :6], 14, 4, 24, generator=torch.Generator().manual_seed(2))
    assert out.shape == (3, 20) and torch.equal(out[:, :6], natural[:, :6])
    last_token = GPT(GPTConfig(mode="reward", block_size=24, vocab_size=16, **TINY))
    with pytest.raises(ValueError, match="per-position"):
        detector_scores(last_token, natural, 6, 24)


def test_load_detector_reads_the_crossover_block_size(tmp_path):
    from core.files import atomic_torch_save
    from experiment.residual import detector_scores, load_detector
    from lib.checkpoint import make_checkpoint
    _, _, rm = _tiny_models()
    atomic_torch_save(make_checkpoint(rm, None, reward_data={"block_size": 20}), tmp_path / "rm.pt")
    model, n = load_detector(str(tmp_path / "rm.pt"))
    assert n == 20 and not model.training
    x = torch.randint(0, 16, (2, 20), generator=torch.Generator().manual_seed(0))
    assert torch.allclose(detector_scores(model, x, 5, n), detector_scores(rm, x, 5, n))
    atomic_torch_save(make_checkpoint(rm, None), tmp_path / "rm_nodata.pt")
    assert load_detector(str(tmp_path / "rm_nodata.pt"))[1] == 24  # no record: the model's block size
    last = GPT(GPTConfig(mode="reward", block_size=24, vocab_size=16, **TINY))
    atomic_torch_save(make_checkpoint(last, None), tmp_path / "last.pt")
    with pytest.raises(ProjectError, match="last-token head"):
        load_detector(str(tmp_path / "last.pt"))


def test_measure_residual_runs_on_tiny_models(tmp_path, capsys):
    import measure_residual
    from core.files import atomic_torch_save
    from lib.checkpoint import make_checkpoint
    gen, other, rm = _tiny_models()
    atomic_torch_save(make_checkpoint(gen, None), tmp_path / "gen.pt")
    atomic_torch_save(make_checkpoint(other, None), tmp_path / "trunk.pt")
    # the detector's record names the model its trunk came from (train_reward_model.py --init_trunk_from)
    atomic_torch_save(make_checkpoint(rm, None, reward_data={"block_size": 20}, reward_training={
        "init_trunk_from": {"path": str(tmp_path / "trunk.pt")}}), tmp_path / "rm.pt")
    np.random.default_rng(0).integers(0, 16, 500).astype(np.uint16).tofile(tmp_path / "val.bin")
    argv = ["--model_path", str(tmp_path / "gen.pt"), "--reward_model_path", str(tmp_path / "rm.pt"),
            "--data_dir", str(tmp_path), "--num_prefixes", "4", "--n", "3", "--scales", "1,2",
            "--out", str(tmp_path / "r.json")]
    res = measure_residual.main(argv)
    assert res["N"] == 20 and res["prompt_len"] == 5
    assert sorted(res["by_scale"]) == ["1.0", "2.0"] and sorted(res["by_scale"]["1.0"]) == ["1", "2", "3"]
    g1, g2 = res["by_scale"]["1.0"]["3"], res["by_scale"]["2.0"]["3"]
    assert g1["nll_gen"] == g2["nll_gen"] and math.isfinite(g1["gain"])
    # the lower estimate counts the data among the n = 3 samples: at most log(4) per 15-token continuation
    assert math.isfinite(g1["gain_lower"]) and g1["gain_lower"] <= math.log(4) / 15 + 1e-12
    assert (tmp_path / "r.json").exists()
    # a labelled table, one row per lambda and n, and one sentence: the detector's gain against what its
    # trunk knows beyond the generator (its NLL of the same continuations)
    out = capsys.readouterr().out.splitlines()
    assert out[2].split() == ["lambda", "n", "mean", "log", "Z", "gain,", "upper", "(+-", "SE)", "gain,", "lower",
                              "NLL", "generator", "NLL", "residual"]
    assert [line.split()[:2] for line in out[3:9]] == [[lam, m] for lam in ("1", "2") for m in ("1", "2", "3")]
    trunk = res["trunk"]
    assert trunk["path"] == str(tmp_path / "trunk.pt") and trunk["advantage"] == pytest.approx(g1["nll_gen"] - trunk["nll"])
    assert out[9:] == [res["conclusion"]] and res["conclusion"].startswith(
        f"The detector adds {g1['gain_lower']:.4f} to {g1['gain']:.4f} nats per token to its generator (lower and "
        f"upper estimates, n = 3)")
    assert f"its trunk ({tmp_path / 'trunk.pt'})" in res["conclusion"]
    # the continuations are made --batch_size at a time, each with its own uniforms: the same result
    assert measure_residual.main(argv + ["--batch_size", "5"])["by_scale"] == res["by_scale"]
    assert measure_residual.main(argv + ["--trunk_path", "none"])["conclusion"].endswith(
        "no trunk of another model to compare it with (see --trunk_path).")
    raw = measure_residual.main(argv + ["--score", "raw_sum"])
    assert raw["score"] == "raw_sum" and raw["by_scale"]["1.0"]["3"]["gain"] != g1["gain"]
    for bad in ("19", "0"):  # 0 is not the default length
        with pytest.raises(ProjectError, match=f"--prompt_len {bad} must be in"):
            measure_residual.main(argv + ["--prompt_len", bad])
    with pytest.raises(ProjectError, match="--scales"):
        measure_residual.get_args(argv[:4] + ["--scales", "a"])
    for flag, bad, want in (("--num_prefixes", "1", ">= 2"), ("--n", "0", ">= 1"), ("--batch_size", "-1", ">= 1")):
        with pytest.raises(ProjectError, match=f"^{flag} must be {want}, got {bad}$"):
            measure_residual.get_args(argv[:4] + [flag, bad])


def test_reward_model_step_goes_through_the_scaler():
    import argparse

    import train_reward_model as trm
    from core.schedule import EarlyStopping
    torch.manual_seed(0)
    rm = GPT(GPTConfig(mode="reward", block_size=16, vocab_size=16, reward_head_hidden_dim=8, **TINY))
    opt = torch.optim.AdamW([p for p in rm.parameters() if p.requires_grad], lr=1e-3)
    scaler = CountingScaler()
    from core.training import RunContext
    ctx = RunContext(DistInfo(), "cpu", "float32", contextlib.nullcontext(), scaler, writes=False)
    run = trm.RMRun(argparse.Namespace(loss="ce", grad_clip=1.0, ada_target=None), ctx, rm, rm.reward_logits, None, opt,
                    None, 4, 16, None, {}, 1, 1)
    state = trm.RMState(EarlyStopping(1, 0.0, mode="min"))
    x = torch.randint(0, 16, (4, 16))
    y = torch.tensor([[0.25, 0.75]] * 4)
    trm.train_step(state, run, x, y)
    assert scaler.calls == ["scale", "unscale_", "step", "update"] and state.step == 1


def test_window_gains_and_residual_point_hand_computed():
    from experiment.residual import residual_point, window_gains
    data = torch.tensor([math.log(2.0), 0.0], dtype=torch.float64)
    samples = torch.tensor([[0.0, math.log(3.0)], [1.0, 1.0]], dtype=torch.float64)
    g = window_gains(data, samples)
    assert sorted(g) == [1, 2]
    up, lo = g[2]
    # upper: s - log Z_2 (Z_2 = 2 and e); lower: the data counted in, Z = (e^s + e^s1 + e^s2) / 3
    assert up.tolist() == pytest.approx([0.0, -1.0])
    assert lo.tolist() == pytest.approx([math.log(2.0) - math.log(6.0 / 3), -math.log((1 + 2 * math.e) / 3)])
    assert g[1][0].tolist() == pytest.approx([math.log(2.0), -1.0])
    assert g[1][1].tolist() == pytest.approx([math.log(2.0) - math.log(3.0 / 2), -math.log((1 + math.e) / 2)])
    # 3 windows of 4 targets scored by the sweep, the last one short (2 tokens): 10 val tokens, 2 groups
    point = {"val_loss": 2.0, "val_items": [1.5, 3.0], "val_tokens": 10}
    res = {"data": data, "samples": samples, "n": 2, "windows": 2}
    out = residual_point(point, res, 4, 2)
    gains = [math.log(2.0) - math.log(2.0), -math.log((1 + 2 * math.e) / 3)]
    # groups: windows {0, 1} (8 tokens) and {2} (2 tokens, no full window: gain 0)
    assert out["val_items"] == pytest.approx([1.5 - sum(gains) / 8, 3.0])
    assert out["val_loss"] == pytest.approx(2.0 - sum(gains) / 10)
    assert out["val_ppl"] == pytest.approx(math.exp(out["val_loss"]))


def test_the_two_estimates_bracket_the_exact_gain_on_the_toy():
    """With the exact log-ratio, the upper estimate (Z from the generator's samples alone) is above the
    true gain KL(p||q) and the lower one (the data counted among them) below it, both converging."""
    from experiment.residual import information, window_gains
    C, n = 600, 64
    P, Q, p0, _, s_data, s_samples = exact_ratio_toy(C, n, 11)
    s_data, s_samples = s_data.double(), s_samples.double()
    kl = kl_data_to(Q, P, p0)  # nats per sequence
    g = window_gains(s_data, s_samples)
    for m in (1, 4):
        up, lo = g[m]
        assert up.mean().item() > kl > lo.mean().item()
    assert g[1][0].mean() - g[1][1].mean() > g[n][0].mean() - g[n][1].mean() > 0  # the bracket narrows
    info = information({"data": s_data, "samples": s_samples}, L - 1, C * (L - 1))
    assert info[n]["lower"] < kl / (L - 1) < info[n]["upper"] and info[n]["se"] > 0
