"""
The GRPO math, as small pure functions on tensors (train_grpo.py does the I/O); at the end, the
self-play objectives of train_spin.py (SPIN, DDO) and GRPO's entropy floor.

For a prompt we sample a group of G completions and score each with the reward
model. GRPO needs no value network: a completion's advantage is its reward
relative to the other completions of the SAME prompt,

    A_i = (r_i - mean_j r_j) / (std_j r_j + eps)        (std scaling optional)

and every completion token of sequence i gets A_i. The policy loss per token is
PPO's clipped surrogate plus a KL penalty towards the frozen reference model,

    ratio_t = pi_theta(y_t) / pi_old(y_t)
    L_t     = -min(ratio_t * A, clip(ratio_t, 1-eps, 1+eps) * A) + beta * KL_t
    KL_t    = r_t - log r_t - 1,   r_t = pi_ref(y_t) / pi_theta(y_t)   ("k3": >= 0, unbiased)

(k3's value estimates KL(pi_theta || pi_ref), but as a loss its expected gradient is that of
KL(pi_ref || pi_theta): see k3_kl.) The other form puts the KL into the sequence reward,
r_i - beta * sum_t (log pi(y_t) - log pi_ref(y_t)) (kl_penalised_rewards), whose optimum is
pi_ref * exp(r / beta) / Z: with r = log p_data / pi_ref and beta = 1 that is p_data itself.

averaged over ALL completion tokens of the batch (token-level normalisation, so
long and short completions weigh by their tokens, not per sequence).

Token-level rewards (with a per-position reward model): completion token t of
sequence i is credited with the mean of the detector's P(natural) at positions
t..T-1, its own verdict and those of every later position it influenced,

    r_{i,t} = mean_{s >= t} p_{i,s},

and advantages are group-relative per position: A_{i,t} = (r_{i,t} - mean_j r_{j,t})
/ std_j r_{j,t}. All completions of a step share one prompt length, so position t
means the same thing across the group.
"""
import numpy as np
import torch
import torch.nn.functional as F


def group_advantages(rewards, group_size, scale_std=True, eps=1e-4):
    """rewards (B,) or (B, L) laid out as B/group_size consecutive groups -> advantages of
    the same shape. With (B, L), each column is normalised within its group on its own.

    The std is the sample std (n-1) of the group. A group whose rewards are all equal
    gets advantage 0 for every member (it carries no learning signal).
    """
    if rewards.dim() not in (1, 2) or rewards.size(0) % group_size != 0:
        raise ValueError(f"rewards must be (B,) or (B, L) with B a multiple of group_size={group_size}")
    shape = rewards.shape
    r = rewards.float().reshape(-1, group_size, *shape[1:])
    adv = r - r.mean(dim=1, keepdim=True)
    if scale_std:
        std = r.std(dim=1, keepdim=True) if group_size > 1 else torch.zeros_like(r[:, :1])
        # a group without spread has all-zero deviations: keep them 0 (no 0/0 when eps=0)
        adv = torch.where(std > 0, adv / (std + eps), torch.zeros_like(adv))
    return adv.reshape(shape)


def token_rewards(position_p, prompt_len):
    """Per-token rewards of the completion from per-position P(natural) (B, T): the token
    at position t (t >= prompt_len) gets the mean of position_p[:, t:], shape (B, T - prompt_len)."""
    p = position_p.float()[:, prompt_len:]
    # suffix means: reversed cumulative sums divided by the suffix lengths
    suffix_sum = suffix_sums(p)
    counts = torch.arange(p.size(1), 0, -1, device=p.device, dtype=p.dtype)
    return suffix_sum / counts


def shuffle_within_groups(n, group_size, rng):
    """A permutation of range(n) that moves items only within their group of group_size
    consecutive rows (the null arm's shuffled rewards): LongTensor (n,)."""
    if n % group_size:
        raise ValueError(f"{n} rows do not split into groups of {group_size}")
    perm = np.stack([g * group_size + rng.permutation(group_size) for g in range(n // group_size)])
    return torch.from_numpy(perm.reshape(-1))


def suffix_sums(x):
    """Sums of x[:, t:] for every t, shape like x (B, L): the return-to-go of per-token rewards."""
    return x.flip(1).cumsum(1).flip(1)


def log_ratio_increments(position_logits, n_train, k_min=1, k_max=None):
    """Per-token log-ratios rho_t = log p_data(x_t | x_<t) / q(x_t | x_<t) (B, T) recovered from a
    per-position detector's logits (B, T) (logit = l_natural - l_synthetic, position t sees x_0..t).

    Such a detector was trained with label natural iff t < K, with the crossover K uniform on
    [k_min, k_max] (default k_max = n_train - 1, n_train = the block size it was trained on;
    reward_samples.crossover_plan). Bayes-optimal, its odds at t are #{k > t} / S_t with
    S_t = sum_{k = k_min}^{min(t, k_max)} exp(-(rho_k + ... + rho_t)), which obeys
    S_t = exp(-rho_t) * (S_{t-1} + [t <= k_max]), S_{k_min - 1} = 0. Hence

        log S_t = log #{k > t} - logit_t,   rho_t = log(S_{t-1} + 1) - log S_t   (k_min <= t < k_max)

    exactly (docs/design.md, section 3). Positions the labels never made uncertain (t < k_min:
    always natural; t >= k_max: always synthetic) say nothing about rho: they get 0."""
    a = position_logits if position_logits.dtype == torch.float64 else position_logits.float()
    T = a.size(1)
    k_max = n_train - 1 if k_max is None else k_max
    t = torch.arange(T, device=a.device)
    n_gt = (k_max - torch.maximum(t, torch.full_like(t, k_min - 1))).clamp(min=0)
    ok = (t >= k_min) & (t < k_max)
    log_s = torch.where(ok, torch.log(n_gt.clamp(min=1).to(a.dtype)) - a, torch.zeros_like(a))
    prev = F.pad(log_s[:, :-1], (1, 0))
    # log(S_{t-1} + 1), where S_{k_min - 1} = 0 contributes log 1 = 0
    log_prev1 = torch.where((t > k_min) & ok, F.softplus(prev), torch.zeros_like(a))
    return torch.where(ok, log_prev1 - log_s, torch.zeros_like(a))


def logit_rewards(position_logits, prompt_len, n_train, level="sequence", k_min=1, k_max=None):
    """The log-ratio reward of completions from per-position detector logits (B, T): the sum of
    log_ratio_increments over the completion positions prompt_len.. (sequence level, (B,)), or
    their suffix sums, the log-ratio of each completion token and all later ones (token level,
    (B, T - prompt_len))."""
    rho = log_ratio_increments(position_logits, n_train, k_min, k_max)[:, prompt_len:]
    return rho.sum(1) if level == "sequence" else suffix_sums(rho)


def trunk_ratio_rewards(trunk_logp, ref_logp, level="sequence"):
    """The ideal detector's reward: the detector trunk's log-ratio to the reference over the completion tokens,
    sum_t (log p_trunk(x_t) - log p_ref(x_t)) (B,), or its suffix sums, per token (B, L) (logp: (B, L) each).
    A detector built on the trunk can at best know this ratio (it is the Neyman-Pearson statistic were the
    trunk the data). With the KL to the reference inside the reward at beta = 1 (kl_penalised_rewards) the
    reward is sum_t (log p_trunk - log pi): GRPO is then on-policy reverse-KL distillation of the trunk into
    the policy, whose optimum pi_ref exp(r) / Z is p_trunk itself."""
    r = (trunk_logp - ref_logp).float()
    return r.sum(1) if level == "sequence" else suffix_sums(r)


def guard_degenerate(rewards, degenerate, group_size, floor=None):
    """A degenerate completion (degenerate_mask; (B,) bool) gets no reward for fooling the detector: its
    reward, sequence (B,) or per token (B, L), becomes `floor` (P(natural)'s 0), or without one (a log-ratio
    has none) the lowest of its group's, so repetition, which a detector can score as natural text, never pays
    more than the group's worst sample."""
    if floor is None:
        g = rewards.view(-1, group_size, *rewards.shape[1:])
        low = g.min(dim=1, keepdim=True).values.expand_as(g).reshape(rewards.shape)
    else:
        low = torch.full_like(rewards, floor)
    return torch.where(degenerate.view(-1, *([1] * (rewards.dim() - 1))), low, rewards)


def kl_penalised_rewards(rewards, logp, ref_logp, beta):
    """The KL to the reference inside the reward: r - beta * sum_t (logp_t - ref_logp_t) over the
    completion tokens (logp, ref_logp: (B, L), the sampling policy's and the reference's). Sequence
    rewards (B,) take the whole sum; token rewards (B, L) take the sum over t' >= t (the part of the
    KL token t and its successors incur). The optimum of E[r] - beta KL is pi_ref exp(r/beta) / Z."""
    log_ratio = (logp - ref_logp).float()
    penalty = log_ratio.sum(1) if rewards.dim() == 1 else suffix_sums(log_ratio)
    return rewards.float() - beta * penalty


def zero_spread_fraction(rewards, group_size, tol=1e-6):
    """Fraction of groups whose rewards are (numerically) all equal."""
    r = rewards.float().view(-1, group_size)
    return ((r.max(dim=1).values - r.min(dim=1).values) <= tol).float().mean().item()


def k3_kl(logp, ref_logp):
    """Per-token k3 estimate r - log r - 1 (log r = ref_logp - logp) from samples of pi_theta:
    its VALUE is an unbiased estimate of KL(pi_theta || pi_ref), always >= 0. Used as a LOSS (the
    samples' distribution held fixed, gradient through logp only), its expected gradient is that of
    KL(pi_ref || pi_theta), not KL(pi_theta || pi_ref): E_pi[grad(r - log r)] = E_pi[(1 - r) grad
    log pi] = -E_ref[grad log pi]. Both vanish at pi = pi_ref; away from it they pull differently
    (KL(ref||pi) is mass-covering). The KL of the reward form is train_grpo's --kl_in_reward."""
    log_r = ref_logp - logp
    return torch.exp(log_r) - log_r - 1.0


def clipped_surrogate(logp, old_logp, advantages, clip_eps):
    """Per-token PPO objective min(ratio*A, clip(ratio)*A) (to be MAXIMISED) and ratio.

    logp, old_logp: (B, T); advantages: (B,) or (B, T)."""
    if advantages.dim() == 1:
        advantages = advantages[:, None]
    ratio = torch.exp(logp - old_logp)
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    return torch.minimum(ratio * advantages, clipped * advantages), ratio


def masked_token_mean(x, mask=None):
    """Mean over the tokens where mask is 1 (all tokens without a mask)."""
    if mask is None:
        return x.mean()
    mask = mask.to(x.dtype)
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def grpo_loss(logp, old_logp, ref_logp, advantages, clip_eps, beta, mask=None):
    """GRPO loss over completion tokens with token-level normalisation.

    logp: (B, T) log pi_theta of the sampled tokens (with grad); old_logp: the same
    under the sampling policy (detached); ref_logp: under the frozen reference
    (detached, may be None when beta == 0); advantages: (B,); mask: (B, T) with 1 on
    completion tokens (None = every column is a completion token).

    Returns (loss, stats) where stats holds detached floats: kl (mean per-token k3),
    clip_frac (tokens whose clipped branch is active, i.e. whose gradient is cut),
    ratio_mean, surrogate.
    """
    surr, ratio = clipped_surrogate(logp, old_logp, advantages, clip_eps)
    per_token = -surr
    if ref_logp is not None:
        kl = k3_kl(logp, ref_logp)
        per_token = per_token + beta * kl
    else:
        kl = torch.zeros_like(logp)
    loss = masked_token_mean(per_token, mask)
    adv = advantages[:, None] if advantages.dim() == 1 else advantages
    # the clip is active where moving further would help but is cut off
    clipped = ((ratio > 1.0 + clip_eps) & (adv > 0)) | ((ratio < 1.0 - clip_eps) & (adv < 0))
    with torch.no_grad():
        stats = {
            "kl": masked_token_mean(kl.detach(), mask).item(),
            "clip_frac": masked_token_mean(clipped.float(), mask).item(),
            "ratio_mean": masked_token_mean(ratio.detach(), mask).item(),
            "surrogate": masked_token_mean(surr.detach(), mask).item(),
        }
    return loss, stats


def degenerate_mask(tokens, max_share=0.5, ngram=4, min_distinct=0.3):
    """Flag degenerate completions, vectorised over rows of `tokens` (B, L).

    A completion is degenerate when its most frequent token makes up more than
    `max_share` of it, or when fewer than `min_distinct` of its n-grams are distinct
    (it loops on a short pattern). Returns a bool tensor (B,).
    """
    B, L = tokens.shape
    t = tokens.long()
    counts = torch.zeros((B, int(t.max().item()) + 1), dtype=torch.long, device=t.device)
    counts.scatter_add_(1, t, torch.ones_like(t))
    share = counts.max(dim=1).values.float() / max(L, 1)
    bad = share > max_share
    if L >= ngram:
        # pack each n-gram into one int64 key (ids < 2**16, n <= 4 keeps it exact)
        n = min(ngram, 4)
        key = torch.zeros((B, L - n + 1), dtype=torch.long, device=t.device)
        for i in range(n):
            key = key * 65536 + t[:, i:L - n + 1 + i]
        key, _ = key.sort(dim=1)
        distinct = 1 + (key[:, 1:] != key[:, :-1]).sum(dim=1)
        bad |= distinct.float() / key.size(1) < min_distinct
    return bad


# ----------------------------------------------------------------------------- SPIN, DDO and an entropy floor

def sequence_logprob(logp, mask=None):
    """Summed log-probs of each sequence's completion tokens: (B, T) -> (B,) (mask: 1 = counted).
    A (B,) input is taken as already summed."""
    if logp.dim() == 1:
        return logp
    return logp.sum(1) if mask is None else (logp * mask.to(logp.dtype)).sum(1)


def mean_token_nll(logp, mask=None):
    """Mean per-token NLL of completions (B, T) (mask: 1 = counted): the likelihood anchor. Given
    summed (B,) log-probs, the per-token count is unknown, so per sequence."""
    if logp.dim() == 1:
        return -logp.mean()
    n_tok = logp.numel() if mask is None else mask.sum()
    return -sequence_logprob(logp, mask).sum() / n_tok


def spin_loss(logp_chosen, logp_rejected, ref_logp_chosen, ref_logp_rejected, beta=0.1,
              mask_chosen=None, mask_rejected=None, nll_coef=0.0):
    """Self-Play Fine-Tuning (Chen et al. 2024): DPO with chosen = the natural continuation of a
    prompt, rejected = the generator's own continuation of the same prompt, reference = the
    previous iterate (detached). Per pair, with summed completion log-probs (sequence_logprob):

        margin = beta * ((logp_c - ref_logp_c) - (logp_r - ref_logp_r))
        loss   = mean over pairs of -log sigmoid(margin) + nll_coef * NLL(chosen)

NLL(chosen) is the mean per-token negative log-likelihood of the chosen (natural) completions:
the likelihood anchor (as in RPO, Pang et al. 2024). DPO's loss alone only needs the margin to
grow, which it also does when both log-probs fall; the anchor keeps the natural text's own
likelihood from falling with it.

    Inputs: (B, T) per-token log-probs with optional (B, T) masks, or (B,) sums.
    Returns (loss, stats): stats holds detached floats margin (mean implicit reward margin),
    accuracy (share of pairs with margin > 0), reward_chosen, reward_rejected (mean beta * log
    ratios)."""
    r_c = beta * (sequence_logprob(logp_chosen, mask_chosen) - sequence_logprob(ref_logp_chosen, mask_chosen))
    r_r = beta * (sequence_logprob(logp_rejected, mask_rejected) -
                  sequence_logprob(ref_logp_rejected, mask_rejected))
    margin = r_c - r_r
    loss = -torch.nn.functional.logsigmoid(margin).mean()  # log(1 + e^-m) without overflow
    nll = mean_token_nll(logp_chosen, mask_chosen)
    if nll_coef:
        loss = loss + nll_coef * nll
    with torch.no_grad():
        stats = {"margin": margin.mean().item(), "accuracy": (margin > 0).float().mean().item(),
                 "reward_chosen": r_c.mean().item(), "reward_rejected": r_r.mean().item(), "nll_chosen": nll.item()}
    return loss, stats


def ddo_loss(logp_data, logp_sample, ref_logp_data, ref_logp_sample, alpha=1.0, beta=1.0,
             mask_data=None, mask_sample=None, nll_coef=0.0):
    """Direct Discriminative Optimization (Zheng et al., ICML 2025, arXiv 2503.01103): the model is
    its own GAN discriminator. Its sequence log-likelihood ratio to a frozen reference, summed over
    the completion tokens (sequence_logprob),

        d(x) = beta * (log p_theta(x) - log p_ref(x))

    is the discriminator's logit: natural continuations (data) should score high, the reference's
    own samples of the same prompts low,

        loss = -mean_data log sigmoid(d) - alpha * mean_samples log(1 - sigmoid(d))   (+ nll_coef * NLL)

    With alpha = beta = 1 it is the GAN discriminator's loss with sigmoid(d) = p_theta / (p_theta +
    p_ref); the optimal discriminator is p_data / (p_data + p_ref), so the minimiser is p_theta =
    p_data, whatever the reference. alpha weighs the sample term against the data term; beta < 1
    aims past the data, p_theta ~ p_ref^(1 - 1/beta) p_data^(1/beta) (the paper's guidance-like
    regime). At p_theta = p_ref the gradient is beta/2 times (alpha x the samples' score, zero in
    expectation, minus the data's log-likelihood gradient): MLE, scaled, plus sample noise.

    Inputs: (B, T) per-token log-probs with optional masks, or (B,) sums; the two groups may differ
    in size. Returns (loss, stats) with spin_loss's keys: reward_chosen / reward_rejected = mean d
    of the data / the samples, margin = their difference, accuracy = the share of rows on the right
    side of 0 (data d > 0, sample d < 0), nll_chosen = the data's mean per-token NLL."""
    d_data = beta * (sequence_logprob(logp_data, mask_data) - sequence_logprob(ref_logp_data, mask_data))
    d_samp = beta * (sequence_logprob(logp_sample, mask_sample) - sequence_logprob(ref_logp_sample, mask_sample))
    # log(1 - sigmoid(d)) = logsigmoid(-d), without overflow
    loss = -F.logsigmoid(d_data).mean() - alpha * F.logsigmoid(-d_samp).mean()
    nll = mean_token_nll(logp_data, mask_data)
    if nll_coef:
        loss = loss + nll_coef * nll
    with torch.no_grad():
        right = torch.cat([(d_data > 0).float(), (d_samp < 0).float()])
        stats = {"margin": (d_data.mean() - d_samp.mean()).item(), "accuracy": right.mean().item(),
                 "reward_chosen": d_data.mean().item(), "reward_rejected": d_samp.mean().item(),
                 "nll_chosen": nll.item()}
    return loss, stats


def entropy_floor_penalty(entropy, ref_entropy, mask=None):
    """mean over completion tokens of relu(H_ref - H_policy): how far the policy's per-token
    entropy has dropped below the reference's. Against a detector GRPO mostly sharpens the
    generator (a lower effective temperature, which an MLE model gets free by sampling at a
    lower T); this term charges for that sharpening only, never for staying as broad as the
    reference. Add coef * penalty to the loss. entropy: (B, T) with grad (model.token_logprobs(...,
    return_entropy=True)); ref_entropy: the reference's on the same tokens (detached here)."""
    return masked_token_mean(torch.relu(ref_entropy.detach() - entropy), mask)
