"""
What each step of a run cost, in FLOPs, so every arm's total compute stands beside its verdict.

The count follows nanoGPT's estimate_mfu: a forward pass costs 2 FLOPs per weight-matrix entry per
token (every Linear of the blocks, the LM head over the vocabulary, the reward head) plus 4 * n_layer
* n_embd * context for attention; a training token costs 3 forward passes (forward + backward), a
frozen trunk one. Generation with a KV cache is counted as one forward per token of the sequence
(prompt and completion alike). Layer norms, biases, softmax and the optimizer are left out (well
under 1 % for these shapes). Evaluations inside training runs count; the run's own measurements of
the finished generators (the frontier sweep, fresh detectors) do not: they are the same for every arm.

Each step_* function reads what the step wrote (its checkpoint's config and counters, the reward
data's files) and returns {"flops": total, "detail": {...}}.
"""
import os

from core.checkpoint import read_checkpoint
from model import N_LM_FEATURES  # the LM features a reward head reads beside the trunk state
from reward_dataset_loader import RewardDataset


def forward_flops(model_args, context=None, reward_head=None):
    """Forward FLOPs per token of a GPT with these model_args (n_layer, n_embd, vocab_size,
    block_size): 2 x (12 n_embd^2 per block + the LM head's vocab_size x n_embd) + 4 n_layer n_embd
    context. reward_head: (inputs, hidden) of a reward head read instead of (or beside, with LM
    features) the LM head."""
    L, C, V = int(model_args["n_layer"]), int(model_args["n_embd"]), int(model_args["vocab_size"])
    T = int(context or model_args["block_size"])
    matrices = 12 * L * C * C
    if reward_head is None:
        matrices += V * C
    else:
        inputs, hidden = reward_head
        matrices += inputs * hidden + hidden * 2 + (V * C if inputs > C else 0)  # LM features need the LM head
    return 2 * matrices + 4 * L * C * T


def _ckpt(path):
    return read_checkpoint(path)


def _train_run_ckpt(out_dir):
    """The checkpoint holding a train.py run's whole history (last.pt, written at the end, else ckpt.pt)."""
    for name in ("last.pt", "ckpt.pt"):
        if os.path.exists(os.path.join(out_dir, name)):
            return _ckpt(os.path.join(out_dir, name))
    return None


def step_train(out_dir):
    """A train.py run: iterations x tokens per iteration x 3 forwards, plus its evaluations (train and
    val, eval_iters batches each, at iteration 0 and every eval_interval)."""
    ck = _train_run_ckpt(out_dir)
    if ck is None:
        return None
    cfg, ma = ck["config"], ck["model_args"]
    f = forward_flops(ma, cfg.get("block_size") or ma["block_size"])
    T = int(cfg.get("block_size") or ma["block_size"])
    iters, B, acc = int(ck.get("iter_num") or 0), int(cfg["batch_size"]), int(cfg.get("gradient_accumulation_steps", 1))
    train_tokens = iters * B * acc * T
    evals = iters // max(int(cfg.get("eval_interval", iters) or 1), 1) + 1
    eval_tokens = evals * 2 * int(cfg.get("eval_iters", 0)) * B * T
    return {"flops": 3 * f * train_tokens + f * eval_tokens,
            "detail": {"train_tokens": train_tokens, "eval_tokens": eval_tokens, "forward_flops_per_token": f}}


def step_reward_data(rd_dir, generator_ckpt):
    """prepare_reward_data.py: every block of both splits generated (one forward per token)."""
    ma = _ckpt(generator_ckpt)["model_args"]
    tokens = 0
    for split in ("train", "val"):
        ds = RewardDataset(rd_dir, split)
        tokens += len(ds) * ds.block_size
    f = forward_flops(ma)
    return {"flops": f * tokens, "detail": {"generated_tokens": tokens, "forward_flops_per_token": f}}


def _detector_forward(rm_ck):
    ma, extra = rm_ck["model_args"], rm_ck.get("model_extra") or {}
    C = int(ma["n_embd"])
    inputs = C + N_LM_FEATURES * bool(extra.get("reward_lm_features"))
    return forward_flops(ma, reward_head=(inputs, int(extra.get("reward_head_hidden_dim") or C)))


def step_reward_model(rm_dir):
    """train_reward_model.py: batches x block through the detector (3 forwards when any trunk block
    trains, else 1: a frozen trunk needs no backward beyond the head), plus its evaluations (the
    reward data's val split, or --eval_max_batches of it, at every eval)."""
    ck = _ckpt(os.path.join(rm_dir, "reward_last.pt"))
    cfg = ck["config"]
    f = _detector_forward(ck)
    T = int(ck["model_args"]["block_size"])
    iters, B = int(ck.get("iter_num") or 0), int(cfg["batch_size"])
    trains_trunk = int(cfg.get("unfreeze_last_n_blocks", 0)) != 0
    evals = iters // max(int(cfg.get("eval_interval") or iters or 1), 1) + 1
    n_val = len(RewardDataset(cfg["data_dir"], "val"))
    if cfg.get("eval_max_batches"):
        n_val = min(n_val, int(cfg["eval_max_batches"]) * B)
    eval_tokens, train_tokens = evals * n_val * T, iters * B * T
    return {"flops": (3 if trains_trunk else 1) * f * train_tokens + f * eval_tokens,
            "detail": {"train_tokens": train_tokens, "eval_tokens": eval_tokens, "trunk_trained": trains_trunk,
                       "forward_flops_per_token": f}}


def step_rl(out_dir, ckpt_name, state_key, reward_model_ckpt=None):
    """train_grpo.py (state_key "grpo") or train_spin.py ("spin"): per step, its rows x seq_len tokens
    are generated (1 forward), scored by the policy with backward on every update (3 each), by the
    reference (1) and by the detector (GRPO; its forward), all twice for SPIN's chosen/rejected pair;
    plus the evaluations' val batches and reward samples."""
    ck = _ckpt(os.path.join(out_dir, ckpt_name))
    cfg, st = ck["config"], ck[state_key]
    f = forward_flops(ck["model_args"])
    seq = int(st["seq_len"])
    steps = int(st["step"])
    rows = int(cfg["prompts_per_step"]) * int(cfg.get("group_size", 1))
    updates = int(cfg.get("num_updates_per_batch", 1))
    f_det = _detector_forward(_ckpt(reward_model_ckpt)) if reward_model_ckpt else 0
    pairs = 2 if state_key == "spin" else 1
    per_token = f + pairs * (3 * f * updates + f) + f_det
    tokens = steps * rows * seq
    evals = steps // max(int(cfg.get("eval_interval", steps) or 1), 1) + 1
    val_tokens = evals * int(cfg.get("eval_max_batches") or 0) * int(cfg.get("eval_batch_size", 0)) \
        * int(ck["model_args"]["block_size"])
    reward_tokens = evals * int(cfg.get("eval_reward_samples", 0) or 0) * seq if f_det else 0
    # GRPO's MLE term (--ptx_coef): natural windows with backward on every update
    ptx_tokens = steps * updates * int(cfg.get("ptx_rows") or cfg["prompts_per_step"]) * seq \
        if float(cfg.get("ptx_coef") or 0) > 0 else 0
    return {"flops": per_token * tokens + f * val_tokens + (f + f_det) * reward_tokens + 3 * f * ptx_tokens,
            "detail": {"rollout_tokens": tokens, "eval_val_tokens": val_tokens, "eval_reward_tokens": reward_tokens,
                       "ptx_tokens": ptx_tokens,
                       "forward_flops_per_token": f, "detector_forward_flops_per_token": f_det}}


def total(parts):
    """{name: step record or None} -> the sum of the known steps' FLOPs."""
    return float(sum(p["flops"] for p in parts.values() if p))
