"""
What each step of a run cost, in FLOPs, so every arm's total compute stands beside its verdict.

The count follows nanoGPT's estimate_mfu: a forward pass costs 2 FLOPs per weight-matrix entry per
token (every Linear of the blocks, the LM head over the vocabulary, the reward head) plus 4 * n_layer
* n_embd * context for attention; a training token costs 3 forward passes (forward + backward), a
frozen trunk one. Generation with a KV cache is counted as one forward per token of the sequence
(prompt and completion alike). Layer norms, biases, softmax and the optimizer are left out (well
under 1 % for these shapes). Evaluations inside training runs count; the run's own measurements of
the finished generators (the frontier sweep, fresh detectors) do not: they are the same for every arm.

Each step_* function reads the summary record the step's script wrote at its end (train.py's
train_summary.json, prepare_reward_data.py's reward_data_summary.json, train_reward_model.py's
reward_summary.json, train_grpo.py's grpo_summary.json, train_spin.py's spin_summary.json or
ddo_summary.json: its
counters, settings and model shapes) and returns {"flops": total, "detail": {...}}; no checkpoint
is opened.
"""
from model import N_GEN_FEATURES, N_LM_FEATURES  # the features a reward head reads beside the trunk state


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


def detector_forward(model_args, head):
    """Forward FLOPs per token of a detector: its trunk (model_args) and its head, as the scripts
    record it (lib.checkpoint.reward_head_shape: LM features read or not, hidden width)."""
    C, gen = int(model_args["n_embd"]), head.get("gen_model_args")
    inputs = C + N_LM_FEATURES * bool(head.get("lm_features")) + N_GEN_FEATURES * bool(gen)
    # a detector that reads its generator's features runs that generator beside its trunk
    return forward_flops(model_args, reward_head=(inputs, int(head.get("hidden_dim") or C))) \
        + (forward_flops(gen) if gen else 0)


def evaluations(steps, interval):
    """How often a run of `steps` evaluates: at step 0, every `interval`, and at its last step if that is
    not a multiple (train.py, train_reward_model.py, train_grpo.py and train_spin.py alike)."""
    interval = max(int(interval or steps or 1), 1)
    return steps // interval + 1 + (steps % interval != 0)


def step_train(rec):
    """A train.py run (its train_summary.json; None: no run, no known cost): iterations x tokens per
    iteration x 3 forwards, plus its evaluations (train and val, eval_iters batches each, at
    iteration 0, every eval_interval and the last)."""
    if rec is None:
        return None
    ma = rec["model_args"]
    f = forward_flops(ma, rec.get("block_size") or ma["block_size"])
    T = int(rec.get("block_size") or ma["block_size"])
    iters, B, acc = int(rec.get("iters") or 0), int(rec["batch_size"]), int(rec.get("gradient_accumulation_steps", 1))
    train_tokens = iters * B * acc * T
    evals = evaluations(iters, rec.get("eval_interval"))
    eval_tokens = evals * 2 * int(rec.get("eval_iters", 0)) * B * T
    return {"flops": 3 * f * train_tokens + f * eval_tokens,
            "detail": {"train_tokens": train_tokens, "eval_tokens": eval_tokens, "forward_flops_per_token": f}}


def step_reward_data(rec):
    """prepare_reward_data.py (its reward_data_summary.json): every block of both splits generated
    (one forward per token of the generator)."""
    tokens = int(rec["tokens"])
    f = forward_flops(rec["generator_model_args"])
    return {"flops": f * tokens, "detail": {"generated_tokens": tokens, "forward_flops_per_token": f}}


def step_reward_model(rec):
    """train_reward_model.py (its reward_summary.json): batches x block through the detector (3
    forwards when any trunk block trains, else 1: a frozen trunk needs no backward beyond the head),
    plus its evaluations (the reward data's val split, or --eval_max_batches of it, at every eval)."""
    ma = rec["model_args"]
    f = detector_forward(ma, rec["reward_head"])
    T = int(ma["block_size"])
    iters, B = int(rec.get("iters") or 0), int(rec["batch_size"])
    trains_trunk = int(rec.get("unfreeze_last_n_blocks", 0)) != 0
    evals = evaluations(iters, rec.get("eval_interval"))
    n_val = int(rec["reward_data"]["val_samples"])
    if rec.get("eval_max_batches"):
        n_val = min(n_val, int(rec["eval_max_batches"]) * B)
    eval_tokens, train_tokens = evals * n_val * T, iters * B * T
    return {"flops": (3 if trains_trunk else 1) * f * train_tokens + f * eval_tokens,
            "detail": {"train_tokens": train_tokens, "eval_tokens": eval_tokens, "trunk_trained": trains_trunk,
                       "forward_flops_per_token": f}}


def step_rl(rec, kind):
    """train_grpo.py (kind "grpo") or train_spin.py ("spin", "ddo"), from its summary record: per step,
    its rows x seq_len tokens are generated (1 forward), scored by the policy with backward on every
    update (3 each), by the reference (1) and by the detector (GRPO; its forward), all twice for
    SPIN's and DDO's natural/sampled pair (the ideal-detector arm's trunk scores like a detector, its LM head
    over the vocabulary in place of a reward head); plus the evaluations: val batches, GRPO's reward samples
    (generated and scored), SPIN's and DDO's fixed val pairs (the sample generated and both rows
    scored by the reference once, both scored by the policy at every evaluation)."""
    ma = rec["model_args"]
    f = forward_flops(ma)
    seq = int(rec["seq_len"])
    steps = int(rec["steps"])
    rows = int(rec["prompts_per_step"]) * int(rec.get("group_size", 1))
    updates = int(rec.get("num_updates_per_batch", 1))
    det = rec.get("detector") if kind == "grpo" else None  # --reward trunk_ratio: the trunk LM, no reward head
    f_det = (detector_forward(det["model_args"], det["reward_head"]) if det.get("reward_head") else
             forward_flops(det["model_args"])) if det else 0
    pairs = 2 if kind in ("spin", "ddo") else 1
    per_token = f + pairs * (3 * f * updates + f) + f_det
    tokens = steps * rows * seq
    evals = evaluations(steps, rec.get("eval_interval"))
    val_tokens = evals * int(rec.get("eval_max_batches") or 0) * int(rec.get("eval_batch_size", 0)) \
        * int(ma["block_size"])
    reward_tokens = evals * int(rec.get("eval_reward_samples", 0) or 0) * seq if f_det else 0
    pair_tokens = int(rec.get("eval_pairs") or 0) * seq if pairs == 2 else 0  # one row of the fixed val pairs
    # GRPO's MLE term (--ptx_coef): natural windows with backward on every update
    ptx_tokens = steps * updates * int(rec.get("ptx_rows") or rec["prompts_per_step"]) * seq \
        if float(rec.get("ptx_coef") or 0) > 0 else 0
    return {"flops": per_token * tokens + f * val_tokens + (f + f_det) * reward_tokens + 3 * f * ptx_tokens
            + f * pair_tokens * (3 + 2 * evals),
            "detail": {"rollout_tokens": tokens, "eval_val_tokens": val_tokens, "eval_reward_tokens": reward_tokens,
                       "ptx_tokens": ptx_tokens, "eval_pair_tokens": pair_tokens,
                       "forward_flops_per_token": f, "detector_forward_flops_per_token": f_det}}


def step_sir(generator_model_args, detector, n, samples, length):
    """The SIR arm's inference (its samples on the frontier): samples x n candidates of `length` tokens, each
    generated (one forward per token) and scored by the detector (its trunk, its head and, with generator
    features, the generator again: detector_forward). detector: the reward model's record (model_args,
    reward_head). The residual model's val measurement is a measurement, like every arm's val perplexity."""
    tokens = int(samples) * int(n) * int(length)
    f_gen = forward_flops(generator_model_args)
    f_det = detector_forward(detector["model_args"], detector["reward_head"])
    return {"flops": (f_gen + f_det) * tokens,
            "detail": {"candidate_tokens": tokens, "forward_flops_per_token": f_gen,
                       "detector_forward_flops_per_token": f_det}}


def total(parts):
    """{name: step record or None} -> the sum of the known steps' FLOPs."""
    return float(sum(p["flops"] for p in parts.values() if p))
