"""
The fine-tuning layer under train_grpo.py's and train_spin.py's loops: their AdamW flags, the common part
of the state a loop changes and its checkpoint keeps (FinetuneState) and of the read-only context set-up
builds (FinetuneRun, as train_reward_model.py's RMRun), and the bookkeeping around them: save (never a
policy whose log-probs are not finite), restore (--resume), the metrics a resumed run keeps and the
summary's val loss before and after. Each script adds its own fields and writes its own loop out.
"""
import argparse
from dataclasses import dataclass, field

import torch

from core.errors import check_finite
from core.files import atomic_torch_save
from core.training import RunContext
from lib.checkpoint import make_checkpoint


def add_optimizer_args(p, lr_default, lr_help="AdamW learning rate",
                       micro_help="sequences per forward/backward chunk (gradient accumulation); 0 = whole batch"):
    """The fine-tuning scripts' AdamW flags, one argument group (the same names in both; each script's own
    learning rate, its one default)."""
    g = p.add_argument_group("optimizer")
    g.add_argument("--learning_rate", type=float, default=lr_default, help=lr_help)
    g.add_argument("--weight_decay", type=float, default=0.0, help="AdamW weight decay on matrices")
    g.add_argument("--beta1", type=float, default=0.9, help="AdamW beta1")
    g.add_argument("--beta2", type=float, default=0.95, help="AdamW beta2")
    g.add_argument("--grad_clip", type=float, default=1.0, help="clip the gradient norm to this (0 = off)")
    g.add_argument("--micro_batch_size", type=int, default=0, help=micro_help)
    return g


@dataclass
class FinetuneState:
    """What every fine-tuning loop changes and its checkpoint keeps. Step i's inputs come from
    (--seed, i) alone, so `step` is also the RNG state: a resumed run repeats the straight one."""
    step: int = 0
    stop_reason: str = None
    val_hist: list = field(default_factory=list)  # one record per evaluation
    finished: bool = False  # the final evaluation and save are done (a resumed finished run only reports)

    def to_dict(self):
        return {"step": self.step, "stop_reason": self.stop_reason, "val_history": self.val_hist,
                "finished": self.finished}

    @staticmethod
    def fields_from_dict(d):
        """The constructor's arguments for the common part of a to_dict() record."""
        return dict(step=int(d["step"]), stop_reason=d.get("stop_reason"), val_hist=list(d.get("val_history", [])),
                    finished=bool(d.get("finished")))


@dataclass(frozen=True, eq=False)
class FinetuneRun:
    """What set-up builds and the loop only reads: the run's context (core/training.py: ranks, device,
    autocast, scaler, logger), the flags, the policy and its optimizer, the base checkpoint (whose data
    and tokenization records every save copies) and its sha256, the probe sequence save() checks, the
    sequence length and the run's checkpoint path."""
    args: argparse.Namespace
    ctx: RunContext
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    base_ckpt: dict
    base_sha: str
    probe: torch.Tensor  # (1, seq_len) train tokens
    seq_len: int
    ckpt_path: str


def save(state, run, key, record):
    """Write run.ckpt_path atomically: a plain generator checkpoint every script reads (the base model's
    data and tokenization records, the flags as train_config) with `record`, the script's state and the
    run's identity, under `key` for --resume."""
    # an update can overflow the weights before any loss is nan: never save a policy whose
    # log-probs are no longer finite (one forward of one sequence, cheap next to a save)
    probe = run.probe
    with torch.no_grad(), run.ctx.amp:
        check_finite(run.model.token_logprobs(probe[:, :-1], probe[:, 1:]).float().sum().item(),
                     "policy log-prob", state.step)
    last_val = state.val_hist[-1]["val_loss"] if state.val_hist else None
    ckpt = make_checkpoint(run.model, run.optimizer, iter_num=state.step, best_val_loss=last_val,
                           data=run.base_ckpt.get("data"), tokenization=run.base_ckpt.get("tokenization"),
                           train_config=vars(run.args), **{key: record})
    atomic_torch_save(ckpt, run.ckpt_path)


def restore(run, own, key, from_dict):
    """The state in `own` (the --resume checkpoint, read) under `key`, made by from_dict, with run's
    optimizer restored. A run stopped by its step budget alone continues to a larger --max_steps."""
    if own.get("optimizer") is not None:
        run.optimizer.load_state_dict(own["optimizer"])
    state = from_dict(own[key])
    if state.stop_reason == "max_steps" and state.step < run.args.max_steps:
        state.stop_reason, state.finished = None, False
    if run.ctx.master:
        print(f"resuming from {run.ckpt_path} at step {state.step}" + (f" (already stopped: {state.stop_reason})"
                                                                       if state.stop_reason else ""))
    return state


def relogged(state):
    """Which records at a resumed run's step (core.training.kept_records) it logs again: that step's evaluation and
    rounds, unless the run had finished (it logged its final evaluation and does not redo it)."""
    return lambda r: not (r.get("kind") == "step" or state.finished)


def val_summary(val_hist):
    """The summary's val loss and perplexity before (the first evaluation) and after (the last); None
    where the run made no evaluation."""
    first, last = (val_hist[0], val_hist[-1]) if val_hist else ({}, {})
    return {"val_loss_before": first.get("val_loss"), "val_ppl_before": first.get("val_ppl"),
            "val_loss_after": last.get("val_loss"), "val_ppl_after": last.get("val_ppl")}
