"""core/objectives.py's SPIN loss and entropy floor against hand-computed numbers, and the ideal detector's reward
distilling a known teacher (the GRPO math itself is in test_grpo.py)."""
import math

import pytest
import torch
import torch.nn.functional as F

from core.objectives import (entropy_floor_penalty, group_advantages, grpo_loss, kl_penalised_rewards, sequence_logprob,
                       spin_loss, trunk_ratio_rewards)


def test_spin_loss_hand_computed():
    # pair 1: chosen sum -3 vs ref -4 (log ratio +1); rejected -3 vs ref -2 (-1): margin 0.5 * 2 = 1
    # pair 2: chosen -1 (second token masked out) vs ref -1.2 (+0.2); rejected -1 vs -2 (+1): margin -0.4
    lc = torch.tensor([[-1.0, -2.0], [-1.0, -5.0]], requires_grad=True)
    rc = torch.tensor([[-1.5, -2.5], [-1.2, -9.0]])
    lr = torch.tensor([[-2.0, -1.0], [-0.5, -0.5]], requires_grad=True)
    rr = torch.tensor([[-1.0, -1.0], [-1.0, -1.0]])
    mc = torch.tensor([[1, 1], [1, 0]])
    loss, st = spin_loss(lc, lr, rc, rr, beta=0.5, mask_chosen=mc)
    # log(1 + e^-1) = 0.313262, log(1 + e^0.4) = 0.913015
    assert loss.item() == pytest.approx((0.313262 + 0.913015) / 2, abs=1e-6)
    assert st["margin"] == pytest.approx(0.3) and st["accuracy"] == 0.5
    assert st["reward_chosen"] == pytest.approx((0.5 + 0.1) / 2)
    assert st["reward_rejected"] == pytest.approx((-0.5 + 0.5) / 2)
    loss.backward()
    # d loss / d logp_chosen token = -beta * sigmoid(-margin) / B on counted tokens, 0 on masked ones
    s1, s2 = 1 / (1 + math.e), 1 / (1 + math.exp(-0.4))
    assert torch.allclose(lc.grad, torch.tensor([[-0.25 * s1] * 2, [-0.25 * s2, 0.0]]), atol=1e-6)
    assert torch.allclose(lr.grad, torch.tensor([[0.25 * s1] * 2, [0.25 * s2] * 2]), atol=1e-6)


def test_spin_likelihood_anchor_hand_computed():
    """nll_coef adds that times the mean per-token NLL of the chosen completions (counted tokens only)."""
    lc = torch.tensor([[-1.0, -2.0], [-1.0, -5.0]], requires_grad=True)
    rc = torch.tensor([[-1.5, -2.5], [-1.2, -9.0]])
    lr = torch.tensor([[-2.0, -1.0], [-0.5, -0.5]])
    rr = torch.tensor([[-1.0, -1.0], [-1.0, -1.0]])
    mc = torch.tensor([[1, 1], [1, 0]])
    plain, _ = spin_loss(lc, lr, rc, rr, beta=0.5, mask_chosen=mc)
    loss, st = spin_loss(lc, lr, rc, rr, beta=0.5, mask_chosen=mc, nll_coef=0.5)
    # counted chosen tokens -1, -2, -1: NLL 4/3 per token
    assert st["nll_chosen"] == pytest.approx(4 / 3)
    assert loss.item() == pytest.approx(plain.item() + 0.5 * 4 / 3, abs=1e-6)
    loss.backward()
    s1, s2 = 1 / (1 + math.e), 1 / (1 + math.exp(-0.4))
    # DPO's gradient (test above) plus -0.5 / 3 on each counted chosen token
    want = torch.tensor([[-0.25 * s1 - 0.5 / 3] * 2, [-0.25 * s2 - 0.5 / 3, 0.0]])
    assert torch.allclose(lc.grad, want, atol=1e-6)


def test_spin_loss_takes_summed_logprobs_and_is_log2_at_the_reference():
    lp = torch.tensor([-3.0, -1.0])
    loss, st = spin_loss(lp, lp - 1, lp, lp - 1, beta=0.1)  # policy == reference: margin 0
    assert loss.item() == pytest.approx(math.log(2)) and st["accuracy"] == 0.0
    assert sequence_logprob(torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([[1, 0, 1]])).tolist() == [4.0]


def test_entropy_floor_penalty_hand_computed():
    H = torch.tensor([[1.0, 0.5, 2.0], [3.0, 0.0, 0.0]], requires_grad=True)
    H_ref = torch.tensor([[0.8, 1.0, 2.5], [2.0, 1.0, 1.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    # relu(H_ref - H) on counted tokens: 0, 0.5, 0 (3 tokens; the 0.5 at [0, 2] is masked out)
    p = entropy_floor_penalty(H, H_ref, mask)
    assert p.item() == pytest.approx(0.5 / 3)
    p.backward()
    assert torch.allclose(H.grad, torch.tensor([[0.0, -1 / 3, 0.0], [0.0, 0.0, 0.0]]))
    assert entropy_floor_penalty(H_ref + 0.1, H_ref).item() == 0.0  # broader than the reference: free


def _distil(reward, steps=100, V=8, L=4, G=16, P=8, seed=0):
    """KL(pi || teacher) before and after GRPO steps on a context-free policy over V tokens (completions of
    L tokens, P prompts x G samples) with `reward(teacher_logp, ref_logp)` and the KL to the reference (the
    starting policy) in the reward at beta 1, a mean baseline: the ideal detector arm's recipe."""
    g = torch.Generator().manual_seed(seed)
    teacher = F.log_softmax(torch.randn(V, generator=g) * 2, -1)
    logits = torch.nn.Parameter(torch.randn(V, generator=g))
    ref = F.log_softmax(logits.detach().clone(), -1)
    opt = torch.optim.Adam([logits], lr=0.05)

    def kl():
        with torch.no_grad():
            lp = F.log_softmax(logits, -1)
            return float((lp.exp() * (lp - teacher)).sum())
    before = kl()
    for _ in range(steps):
        with torch.no_grad():
            old = F.log_softmax(logits, -1)
            x = torch.multinomial(old.exp(), P * G * L, replacement=True, generator=g).view(P * G, L)
            r = kl_penalised_rewards(reward(teacher[x], ref[x]), old[x], ref[x], 1.0)
            adv = group_advantages(r, G, scale_std=False)
        loss, _ = grpo_loss(F.log_softmax(logits, -1)[x], old[x], ref[x], adv, 0.2, 0.0)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return before, kl()


def test_the_ideal_detectors_reward_distils_the_trunk():
    """The trunk's log-ratio to the reference as the reward, KL in the reward at beta 1 (the ideal-detector
    arm, --arms ratio): GRPO moves the policy to the trunk, its KL to it falls to almost nothing. With the
    sign flipped it runs away from the trunk; with log p_ref in place of log p_trunk the reward is the KL alone
    and the policy stays where it started."""
    before, after = _distil(trunk_ratio_rewards)
    assert before > 1.0 and after < 0.05 * before, (before, after)
    _, flipped = _distil(lambda t, r: -trunk_ratio_rewards(t, r))
    assert flipped > before, (before, flipped)
    _, ref_only = _distil(lambda t, r: trunk_ratio_rewards(r, r))
    assert ref_only == pytest.approx(before, rel=1e-3), (before, ref_only)
    # the reward by hand: the sum of the per-token log-ratios, or their suffix sums per token
    t, r = torch.log(torch.tensor([[0.5, 0.25, 0.5]])), torch.log(torch.tensor([[0.25, 0.25, 1.0]]))
    assert torch.allclose(trunk_ratio_rewards(t, r), torch.tensor([0.0]), atol=1e-6)  # log 2 + 0 - log 2
    assert torch.allclose(trunk_ratio_rewards(t, r, "token"), torch.log(torch.tensor([[1.0, 0.5, 0.5]])), atol=1e-6)
