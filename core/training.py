"""
A trainer's start and end, the same in train.py, train_reward_model.py, train_grpo.py and train_spin.py:
open_run checks and locks the output directory, joins torchrun's process group (if launched by it), and
picks the device and the precision (its autocast context and float16 gradient scaler); RunContext.open_log
starts metrics.jsonl and the trackers (TensorBoard, W&B); finish closes them and leaves the group. Each
script keeps its own loop, written out, as nanoGPT's train.py does.
"""
import contextlib
from dataclasses import dataclass
from typing import Callable, Optional

from core.devices import DistInfo, autocast_context, end_run, grad_scaler, init_distributed, resolve_device, resolve_dtype
from core.files import JsonlLogger, check_writable_dir, hold_dir_lock, start_metrics_log
from core.tracking import open_tracker


@dataclass
class RunContext:
    """What every trainer sets up before its loop."""
    dist: DistInfo  # torchrun's ranks (a one-process DistInfo otherwise)
    device: str  # this process's device ("cuda:N" under torchrun)
    dtype: str  # the autocast precision (resolve_dtype)
    amp: contextlib.AbstractContextManager  # autocast_context(device, dtype): reusable, enter it per use
    scaler: object  # grad_scaler(device, dtype): enabled under float16 autocast only
    writes: bool  # this process writes the outputs (rank 0)
    logger: Optional[JsonlLogger] = None  # set by open_log

    @property
    def master(self):
        return self.dist.master

    @property
    def device_type(self):
        return self.device.split(":")[0]

    def lock_out_dir(self, args):
        """On the process that writes: --out_dir checked (created if missing) and locked for this run."""
        if self.writes:
            check_writable_dir(args.out_dir, "--out_dir")
            hold_dir_lock(args.out_dir, "--out_dir")

    def open_log(self, args, metrics_path, keep: Optional[Callable] = None, fresh_note=None, purge_step=None):
        """metrics.jsonl and the trackers, one logger for both. A fresh run (keep None) replaces an old log (after
        printing fresh_note); a resumed one keeps the records keep(record) accepts, and the trackers drop the
        events from purge_step on (the resumed run logs them again)."""
        if self.writes:
            start_metrics_log(metrics_path, keep, fresh_note)
        tracker = open_tracker(args, args.out_dir, self.writes, purge_step=purge_step)
        self.logger = JsonlLogger(metrics_path, enabled=self.writes, tracker=tracker)
        return self.logger


def open_run(args, distributed=True, backend=None, writes=True, lock=True):
    """The context of a trainer's run from its parsed args (--device, --dtype, --out_dir): torchrun's group where
    distributed and launched by it (else this process alone, on --device), the precision, and, on the process
    that writes (rank 0, if `writes`), --out_dir checked and locked for this run (lock=False: the script does it
    later, ctx.lock_out_dir, once the inputs it may refuse have been read)."""
    dist, device = init_distributed(args.device, backend) if distributed else (DistInfo(), resolve_device(args.device))
    dtype = resolve_dtype(args.dtype, device)
    ctx = RunContext(dist, device, dtype, autocast_context(device, dtype), grad_scaler(device, dtype),
                     writes and dist.master)
    if lock:
        ctx.lock_out_dir(args)
    return ctx


def step_of(record):
    """A metrics.jsonl record's step ("iter" in the logs written before the trainers' rename; None: none)."""
    return record.get("step", record.get("iter"))


def kept_records(step, relogged=lambda record: False):
    """What a resumed run keeps of its metrics.jsonl, one rule for every trainer: the records before its
    checkpoint's `step` (a record without one counts as before) and those at `step` that the resumed run does not
    log again (`relogged(record)` False), so no record appears twice."""
    def keep(record):
        s = step_of(record)
        return s is None or s < step or (s == step and not relogged(record))
    return keep


def finish(ctx):
    """A trainer's end: its logger closed (trackers flushed), the process group left and the locks released."""
    if ctx.logger is not None:
        ctx.logger.close()
    end_run(ctx.dist)
