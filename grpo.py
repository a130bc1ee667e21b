"""
The GRPO math, as small pure functions on tensors (train_grpo.py does the I/O).

For a prompt we sample a group of G completions and score each with the reward
model. GRPO needs no value network: a completion's advantage is its reward
relative to the other completions of the SAME prompt,

    A_i = (r_i - mean_j r_j) / (std_j r_j + eps)        (std scaling optional)

and every completion token of sequence i gets A_i. The policy loss per token is
PPO's clipped surrogate plus a KL penalty towards the frozen reference model,

    ratio_t = pi_theta(y_t) / pi_old(y_t)
    L_t     = -min(ratio_t * A, clip(ratio_t, 1-eps, 1+eps) * A) + beta * KL_t
    KL_t    = r_t - log r_t - 1,   r_t = pi_ref(y_t) / pi_theta(y_t)   ("k3": >= 0, unbiased)

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
    suffix_sum = p.flip(1).cumsum(1).flip(1)
    counts = torch.arange(p.size(1), 0, -1, device=p.device, dtype=p.dtype)
    return suffix_sum / counts


def shuffle_within_groups(n, group_size, rng):
    """A permutation of range(n) that moves items only within their group of group_size
    consecutive rows (the null arm's shuffled rewards): LongTensor (n,)."""
    if n % group_size:
        raise ValueError(f"{n} rows do not split into groups of {group_size}")
    perm = np.stack([g * group_size + rng.permutation(group_size) for g in range(n // group_size)])
    return torch.from_numpy(perm.reshape(-1))


def zero_spread_fraction(rewards, group_size, tol=1e-6):
    """Fraction of groups whose rewards are (numerically) all equal."""
    r = rewards.float().view(-1, group_size)
    return ((r.max(dim=1).values - r.min(dim=1).values) <= tol).float().mean().item()


def k3_kl(logp, ref_logp):
    """Per-token k3 estimator of KL(pi_theta || pi_ref) from samples of pi_theta:
    r - log r - 1 with log r = ref_logp - logp. Always >= 0."""
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


def grpo_loss(logp, old_logp, ref_logp, advantages, clip_eps=0.2, beta=0.04, mask=None):
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


# ----------------------------------------------------------------------------- SPIN and an entropy floor

def sequence_logprob(logp, mask=None):
    """Summed log-probs of each sequence's completion tokens: (B, T) -> (B,) (mask: 1 = counted).
    A (B,) input is taken as already summed."""
    if logp.dim() == 1:
        return logp
    return logp.sum(1) if mask is None else (logp * mask.to(logp.dtype)).sum(1)


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
    if logp_chosen.dim() == 2:
        n_tok = logp_chosen.numel() if mask_chosen is None else mask_chosen.sum()
        nll = -sequence_logprob(logp_chosen, mask_chosen).sum() / n_tok
    else:  # sums were given: per-token is unknown, so per sequence
        nll = -logp_chosen.mean()
    if nll_coef:
        loss = loss + nll_coef * nll
    with torch.no_grad():
        stats = {"margin": margin.mean().item(), "accuracy": (margin > 0).float().mean().item(),
                 "reward_chosen": r_c.mean().item(), "reward_rejected": r_r.mean().item(), "nll_chosen": nll.item()}
    return loss, stats


def entropy_floor_penalty(entropy, ref_entropy, mask=None):
    """mean over completion tokens of relu(H_ref - H_policy): how far the policy's per-token
    entropy has dropped below the reference's. Against a detector GRPO mostly sharpens the
    generator (a lower effective temperature, which an MLE model gets free by sampling at a
    lower T); this term charges for that sharpening only, never for staying as broad as the
    reference. Add coef * penalty to the loss. entropy: (B, T) with grad (model.token_logprobs(...,
    return_entropy=True)); ref_entropy: the reference's on the same tokens (detached here)."""
    return masked_token_mean(torch.relu(ref_entropy.detach() - entropy), mask)
