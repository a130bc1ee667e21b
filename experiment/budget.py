"""
The budget a GRPO step sets for the arms that match it (the same-budget MLE control, SPIN, DDO; aa_test.py's null
continuations): what the step used, read from its records, and the control's train.py settings on it.
"""

# AdamW's settings of the GRPO step (as its parser read them, Run.settings_of), which the MLE control, SPIN and DDO
# take over with its budget
OPTIMIZER_SETTINGS = ("weight_decay", "beta1", "beta2", "grad_clip")


def grpo_budget(summary, settings):
    """What a finished GRPO step used (its grpo_summary.json: steps, optimizer updates, rows per step,
    generated completion tokens, seq_len) and its optimizer's settings (its parsed settings): the budget
    the control, SPIN and DDO arms match."""
    steps, tokens = int(summary["steps"]), int(summary["completion_tokens"])
    return {"steps": steps, "updates": int(summary["updates"]), "rows_per_step": int(summary["rows_per_step"]),
            "completion_tokens": tokens, "tokens_per_step": tokens / steps if steps else 0.0,
            "seq_len": int(summary["seq_len"]), **{k: settings[k] for k in ("learning_rate",) + OPTIMIZER_SETTINGS}}


def continuation_settings(budget, lr, block_size, batch_size, nproc=1):
    """train.py's settings of the same-budget MLE control's continuation of a generator (train.py --init_from):
    as many updates as the GRPO step's `budget` made, batch_size rows (per process) of block_size tokens, a
    constant learning rate lr, no early stopping, GRPO's optimizer settings; aa_test.py trains its null pairs
    with the same."""
    updates = int(budget["updates"])
    return {"block_size": block_size, "batch_size": batch_size, "gradient_accumulation_steps": nproc,
            "max_iters": updates, "learning_rate": lr, "decay_lr": "False", "patience": 0,
            # train.py evaluates at iteration 0 and at the end; its estimates are not used here
            "eval_interval": updates, "eval_iters": 5, "log_interval": max(1, updates // 10),
            "dropout": 0.0, "compile": "False",
            # the optimizer settings GRPO used (AdamW; the learning rate is the one above)
            **{k: float(budget[k]) for k in OPTIMIZER_SETTINGS if k in budget}}
