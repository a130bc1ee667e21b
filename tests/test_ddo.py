"""core/objectives.py's DDO loss (Direct Discriminative Optimization, Zheng et al. 2025): hand-computed
values and gradients, and the claim the objective rests on, on a toy where it can be checked
exactly: from a reference that differs from the data, DDO's self-play rounds move a bigram model
to the data's transition matrix. The same loop with a sign error or a term on the wrong rows
does not get there: the test would catch either. (train_spin.py --objective ddo runs it on a GPT:
tests/test_spin.py.)"""
import math

import pytest
import torch

from core.objectives import ddo_loss

V, L = 5, 8  # symbols; sequence length (1 natural prompt token + 7 tokens the model writes)


def test_ddo_loss_hand_computed():
    # data rows: sums -3 vs ref -4 (ratio +1) and -1 vs -1.2 (second token masked out: +0.2)
    # sample rows: -3 vs -2 (-1), -1 vs -2 (+1), -2 vs -2 (0); beta 0.5 halves every logit
    ld = torch.tensor([[-1.0, -2.0], [-1.0, -5.0]], requires_grad=True)
    rd = torch.tensor([[-1.5, -2.5], [-1.2, -9.0]])
    ls = torch.tensor([[-2.0, -1.0], [-0.5, -0.5], [-1.0, -1.0]], requires_grad=True)
    rs = torch.tensor([[-1.0, -1.0], [-1.0, -1.0], [-1.0, -1.0]])
    md = torch.tensor([[1, 1], [1, 0]])
    loss, st = ddo_loss(ld, ls, rd, rs, alpha=2.0, beta=0.5, mask_data=md)
    d_data, d_samp = [0.5, 0.1], [-0.5, 0.5, 0.0]
    sp = lambda z: math.log1p(math.exp(z))  # noqa: E731  -log sigmoid(-z) = -log(1 - sigmoid(z))
    want = sum(sp(-d) for d in d_data) / 2 + 2.0 * sum(sp(d) for d in d_samp) / 3
    assert loss.item() == pytest.approx(want, abs=1e-6)
    assert st["reward_chosen"] == pytest.approx(0.3) and st["reward_rejected"] == pytest.approx(0.0)
    assert st["margin"] == pytest.approx(0.3)
    assert st["accuracy"] == pytest.approx(3 / 5)  # both data rows > 0, one sample row < 0
    assert st["nll_chosen"] == pytest.approx(4 / 3)  # counted data tokens -1, -2, -1
    loss.backward()
    sig = lambda z: 1 / (1 + math.exp(-z))  # noqa: E731
    # d/d logp_data token = -beta sigmoid(-d) / B_data; d/d logp_sample token = alpha beta sigmoid(d) / B_samp
    assert torch.allclose(ld.grad, torch.tensor([[-0.25 * sig(-0.5)] * 2, [-0.25 * sig(-0.1), 0.0]]), atol=1e-6)
    assert torch.allclose(ls.grad, torch.tensor([[sig(d) / 3] * 2 for d in d_samp]), atol=1e-6)


def test_ddo_loss_at_the_reference_is_the_scaled_mle_gradient():
    """At p_theta = p_ref every logit is 0: the loss is (1 + alpha) log 2 and the gradient is
    beta / 2 x (alpha x the samples' score - the data's): the MLE gradient where the samples' score
    averages to zero."""
    lp = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]], requires_grad=True)
    loss, st = ddo_loss(lp[:1], lp[1:], lp[:1].detach(), lp[1:].detach(), alpha=3.0, beta=0.2, nll_coef=0.5)
    assert loss.item() == pytest.approx(4 * math.log(2) + 0.5 * 1.5)
    assert st["margin"] == 0.0 and st["accuracy"] == 0.0
    loss.backward()
    assert torch.allclose(lp.grad, torch.tensor([[-0.1 - 0.25] * 2, [0.3] * 2]))
    sums = torch.tensor([-3.0, -1.0])  # summed log-probs are taken as they are
    assert ddo_loss(sums, sums, sums, sums)[0].item() == pytest.approx(2 * math.log(2))


# ----------------------------------------------------------------------------- the bigram toy

def bigram_pair(seed=0, sharp=2.0, mix=0.6):
    """(P, Q): the data's transition matrix, and the reference's, P mixed with another random one."""
    g = torch.Generator().manual_seed(seed)
    P = torch.softmax(sharp * torch.randn(V, V, generator=g, dtype=torch.float64), -1)
    Q = (1 - mix) * P + mix * torch.softmax(0.5 * torch.randn(V, V, generator=g, dtype=torch.float64), -1)
    return P, Q


def sample_chain(T, x0, gen):
    xs = [x0]
    for _ in range(L - 1):
        xs.append(torch.multinomial(T[xs[-1]], 1, generator=gen).squeeze(-1))
    return torch.stack(xs, 1)


def tok_logp(logT, x):
    """log T(x_t | x_{t-1}) of the tokens after the prompt token, (B, L - 1)."""
    return logT[x[:, :-1], x[:, 1:]]


def tv_to(T, P):
    """Total-variation distance of T's transition rows to P's, averaged over the rows with the law
    of the previous token along the data's sequences (rows the data rarely visits weigh little)."""
    m, law = torch.full((V,), 1.0 / V, dtype=torch.float64), []
    for _ in range(L - 1):
        law.append(m)
        m = m @ P
    return (torch.stack(law).mean(0) * 0.5 * (T - P).abs().sum(-1)).sum().item()


# the loss, and the same call with one mistake each: the log-ratio's sign flipped (the arguments of
# model and reference swapped), and the sample term fed the data rows (a wrong half of the batch)
VARIANTS = {
    "ddo": lambda ld, ls, rd, rs: ddo_loss(ld, ls, rd, rs)[0],
    "sign error": lambda ld, ls, rd, rs: ddo_loss(rd, rs, ld, ls)[0],
    "sample term on the data rows": lambda ld, ls, rd, rs: ddo_loss(ld, ld, rd, rd)[0],
}
TV_BOUND = 0.04  # the loop starts at 0.34; sampling noise of 2048 sequences a round is about 0.01


def ddo_self_play(loss_fn, rounds=3, steps=150, n=2048, seed=1, lr=0.05):
    """DDO's self-play on a directly parameterised bigram model (a logits table, started at the
    reference Q): each round freezes the model as the reference, draws n natural sequences from
    P and n samples from the reference after the same prompt tokens, scores both under the reference
    once, then takes `steps` Adam steps on loss_fn. Returns the TV distance to P after each round."""
    P, Q = bigram_pair()
    theta = Q.log().clone().requires_grad_(True)
    opt = torch.optim.Adam([theta], lr=lr)
    gen = torch.Generator().manual_seed(seed)
    tvs = [tv_to(Q, P)]
    for _ in range(rounds):
        ref = torch.log_softmax(theta.detach(), -1)
        x0 = torch.randint(0, V, (n,), generator=gen)
        data, samples = sample_chain(P, x0, gen), sample_chain(ref.exp(), x0, gen)
        ref_data, ref_samples = tok_logp(ref, data), tok_logp(ref, samples)  # once per round
        for _ in range(steps):
            logT = torch.log_softmax(theta, -1)
            loss = loss_fn(tok_logp(logT, data), tok_logp(logT, samples), ref_data, ref_samples)
            opt.zero_grad()
            loss.backward()
            opt.step()
        tvs.append(tv_to(torch.softmax(theta.detach(), -1), P))
    return tvs


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_ddo_self_play_moves_a_bigram_model_to_the_data_and_a_broken_loss_does_not(variant):
    tvs = ddo_self_play(VARIANTS[variant])
    assert tvs[0] > 0.3  # the reference is far from the data
    if variant == "ddo":
        # every round ends near the data (the minimiser is p_data whatever the reference)
        assert max(tvs[1:]) < TV_BOUND, tvs
    else:
        # the sign error runs away from the data; the wrong rows leave the model where it was
        assert min(tvs[1:]) > 0.3, tvs
