"""
Live metrics beside metrics.jsonl: TensorBoard event files and Weights & Biases runs.

Every training script logs its metrics rows through common.JsonlLogger; a Tracker given to it
sends each row's numbers on with the row's "step" (every trainer's one step key), under "<kind>/<name>"
when the row has a kind (GRPO's "step" and "eval" rows). metrics.jsonl stays the record the
project reads back; these are for watching a run live.

- TensorBoard: --tensorboard_dir, default "auto" = OUT_DIR/tb when the `tensorboard` package is
  installed (silently skipped when it is not, so a minimal install keeps working); a directory
  given explicitly needs the package (clear error otherwise); "none" turns it off.
- W&B: nanoGPT's flags --wandb_log, --wandb_project, --wandb_run_name, plus --wandb_group (one
  group per run_cycles.py run). Needs the `wandb` package; works offline with WANDB_MODE=offline
  (the run directory goes to OUT_DIR/wandb/offline-run-*, `wandb sync` uploads it later).

Only the process that writes metrics.jsonl (rank 0 under torchrun) tracks.
"""
import importlib
import importlib.util
import math
import numbers
import os

from core.cli import str2bool
from core.errors import ProjectError
from core.files import check_writable_dir

TB_AUTO = "auto"
TB_OFF = ("none", "off", "")
STEP_KEYS = ("step",)  # the step of a metrics row: every trainer writes "step"


def add_tracking_args(parser):
    """The tracking flags, shared by every training script (so each --help lists them)."""
    g = parser.add_argument_group("experiment tracking (TensorBoard, Weights & Biases)")
    g.add_argument("--tensorboard_dir", default=TB_AUTO,
                   help="TensorBoard event files of the metrics; 'auto' = OUT_DIR/tb if the tensorboard "
                        "package is installed (skipped if not), 'none' = off")
    g.add_argument("--wandb_log", type=str2bool, nargs="?", const=True, default=False,
                   help="also log the metrics to Weights & Biases (needs `pip install wandb`; "
                        "WANDB_MODE=offline writes OUT_DIR/wandb/offline-run-* without network)")
    g.add_argument("--wandb_project", default="adversarial-gpt", help="W&B project (with --wandb_log)")
    g.add_argument("--wandb_run_name", default=None, help="W&B run name (unset: W&B picks one)")
    g.add_argument("--wandb_group", default=None,
                   help="W&B group, e.g. one per run_cycles.py run (run_cycles.py sets it for its steps)")


def _import(package, flag):
    """`package`, or a ProjectError naming it and the flag that asked for it."""
    try:
        return importlib.import_module(package)
    except ImportError:
        raise ProjectError(f"{flag} needs the Python package '{package}', which is not installed",
                           f"pip install {package} (or turn {flag} off)") from None


def resolve_tensorboard_dir(tensorboard_dir, out_dir):
    """The event directory, created and checked writable, or None: 'auto' gives OUT_DIR/tb when
    tensorboard is installed. Checked here, at set-up, so a bad path is not found by SummaryWriter."""
    value = (tensorboard_dir or "").strip()
    if value.lower() in TB_OFF:
        return None
    if value == TB_AUTO:
        if importlib.util.find_spec("tensorboard") is None:
            return None  # the default adapts to the install; an explicit directory does not
        value = os.path.join(out_dir, "tb")
    else:
        _import("tensorboard", "--tensorboard_dir")
    check_writable_dir(value, "--tensorboard_dir")
    return value


class Tracker:
    """Sends metrics rows to a TensorBoard writer and/or a W&B run (either may be None)."""

    def __init__(self, tb_writer=None, wandb_run=None):
        self.tb = tb_writer
        self.wandb = wandb_run

    def log(self, record):
        step = next((record[k] for k in STEP_KEYS if isinstance(record.get(k), numbers.Number)), None)
        if step is None or (self.tb is None and self.wandb is None):
            return
        prefix = f"{record['kind']}/" if isinstance(record.get("kind"), str) else ""
        scalars = {prefix + k: float(v) for k, v in record.items()
                   if k not in STEP_KEYS and k != "time" and isinstance(v, numbers.Number)
                   and not isinstance(v, bool) and math.isfinite(v)}
        if self.tb is not None:
            for name, value in scalars.items():
                self.tb.add_scalar(name, value, int(step))
            self.tb.flush()  # rows are rare; a killed run keeps what it logged
        if self.wandb is not None:
            self.wandb.log(scalars, step=int(step))

    def log_text(self, name, text, step=0):
        if self.tb is not None:
            self.tb.add_text(name, text, step)
            self.tb.flush()
        if self.wandb is not None:
            self.wandb.summary[name] = text

    def close(self):
        if self.tb is not None:
            self.tb.close()
            self.tb = None
        if self.wandb is not None:
            self.wandb.finish()
            self.wandb = None


def _plain(d):
    """The flags as W&B's config: plain values kept, anything else as its text."""
    return {k: v if isinstance(v, (str, int, float, bool, type(None))) else str(v)
            for k, v in d.items() if not k.startswith("_")}


def open_tracker(args, out_dir, enabled=True, purge_step=None, config=None):
    """A Tracker from the flags of add_tracking_args (an empty one when not `enabled`, i.e.
    off rank 0). `purge_step`: a resumed run's step, so TensorBoard drops the events logged
    after its checkpoint (as metrics.jsonl does)."""
    if not enabled:
        return Tracker()
    tb_dir = resolve_tensorboard_dir(getattr(args, "tensorboard_dir", TB_AUTO), out_dir)
    writer = run = None
    if tb_dir is not None:
        from torch.utils.tensorboard import SummaryWriter
        writer = SummaryWriter(tb_dir, purge_step=purge_step)
    if getattr(args, "wandb_log", False):
        wandb = _import("wandb", "--wandb_log")
        try:
            run = wandb.init(project=args.wandb_project, name=args.wandb_run_name, group=args.wandb_group,
                             config=config if config is not None else _plain(vars(args)), dir=out_dir)
        except Exception as e:  # no login, no network: W&B's own error, named and with the fix
            raise ProjectError(f"--wandb_log: W&B could not start a run: {type(e).__name__}: {e}",
                               "run `wandb login`, or set WANDB_MODE=offline (and `wandb sync` later)") from None
    return Tracker(writer, run)
