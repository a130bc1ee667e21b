"""
The steps of a run_cycles.py run, and their records. A step either runs one script as a subprocess (a ScriptStep, run
by experiment/runner.py's StepRunner: the console and steps.log get its output) or measures in this process, and
leaves a `<step>.done.json` record, so a rerun of the same command resumes after the last finished step (an
interrupted script resumes through its own --resume). Each step returns ONE record that the next step reads: a
script's own summary record (train_summary.json, reward_summary.json, grpo_summary.json, ...) is read once, right
after it ran, and carries what the next step and the FLOPs count (experiment/flops.py) need.

  cycle 0         the generator and the models beside it: experiment/cycle0.py
  Run             the run's settings and its steps: experiment/run.py
  the arms        their table and each cycle's steps: experiment/arms.py
"""
import json
import os
from dataclasses import dataclass, field
from typing import Callable, Optional

from core.files import atomic_write_text
from core.process import PEAK_MEMORY_PREFIX, peak_memory_text
from lib.checkpoint import read_checkpoint, sequence_length


# ----------------------------------------------------------------------------- records

def done_path(d, step):
    return os.path.join(d, f"{step}.done.json")


def read_done(d, step):
    p = done_path(d, step)
    if os.path.exists(p):
        with open(p) as f:
            return json.load(f)
    return None


def mark_done(d, step, record):
    atomic_write_text(done_path(d, step), json.dumps(record, indent=2) + "\n")
    return record


def read_json(path):
    with open(path) as f:
        return json.load(f)


def note_peak(what):
    """run_cycles' own peak memory after one of its in-process measurements (the steps report theirs)."""
    print(f"run_cycles {PEAK_MEMORY_PREFIX}{peak_memory_text()} (after {what})", flush=True)


REPLICATE_STRIDE = 100_000  # replicate r's seeds are replicate 0's + r * this: no two replicates share a draw


def replicate_root(out_dir, rep):
    """Replicate rep's directory: the run's own for replicate 0, OUT/seed_<rep> for the others."""
    return out_dir if rep == 0 else os.path.join(out_dir, f"seed_{rep}")


def replicate_seed(seed, rep):
    """Replicate rep's seed of a step seeded `seed` in replicate 0 (which keeps a run without replicates' seeds)."""
    return seed + REPLICATE_STRIDE * rep


def generator_block_size(path):
    return sequence_length(read_checkpoint(path), path)


ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # each of several steps run at once on a CPU


@dataclass
class ScriptStep:
    """A script run as the step `step` of directory d (Run.run_steps), described before it runs: cmd is the
    script and its words (or a runner.Command of the user's own), or a function making them when the step runs
    (None: nothing to run, record(None, 0.0) alone); --resume is added where the file `resume` exists, else the
    words `fresh`; summary is the JSON the script writes at its end (None: it writes none), record(summary,
    seconds) the step's record; timeout: its limit in seconds (None: none). step None: no record of its own (a
    cycle-0 model's adds its val perplexity)."""
    d: str
    step: Optional[str]
    label: str
    cmd: object
    summary: Optional[str]
    record: Callable
    resume: Optional[str] = None
    fresh: tuple = ()
    parallel: bool = True  # under torchrun where the run has several processes (StepRunner)
    timeout: Optional[float] = None

    def words(self):
        cmd = self.cmd() if callable(self.cmd) else self.cmd
        if cmd is None or not isinstance(cmd, list):  # nothing to run, or the user's own words as they are
            return cmd
        return cmd + (["--resume"] if self.resume is not None and os.path.exists(self.resume) else list(self.fresh))


@dataclass
class Measured:
    """What the run's in-process measurements keep, so that nothing is measured twice in one invocation."""
    sweeps: dict = field(default_factory=dict)  # checkpoint -> its eval record: a checkpoint used twice is swept once
    # checkpoint (and its file's version) -> (val loss, ppl): cycle 0's models are often one checkpoint
    val_ppls: dict = field(default_factory=dict)
    # checkpoint -> {(n, length, seed): its T = 1 samples} from its sweep, which its detector measurement reuses
    samples: dict = field(default_factory=dict)
    det_features: dict = field(default_factory=dict)  # the natural blocks' head input per detector trunk
    dev_corpus: object = None  # the arms' corpus, whose val split is the dev slice under --data_chars (Run.dev_loss)
    train_windows: object = None  # the arms' train text's windows, once (measures.copy_rate)
