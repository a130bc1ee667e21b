"""
Command-line plumbing for every script: run_cli (a ProjectError becomes a short message and exit 2),
flag range checks, str2bool, and progress bars that print lines off a terminal.
"""
import argparse
import contextlib
import math
import os
import re
import signal
import sys
import time

from core.errors import ProjectError
from core.files import OUTPUT_DIRS, drop_fresh_dirs
from core.process import (PEAK_MEMORY_PREFIX, PROGRESS_BARS_ENV, exit_with_launcher, leave_torchrun_worker,
                          peak_memory_text)


def str2bool(s):
    if isinstance(s, bool):
        return s
    if s.lower() in ("1", "true", "yes", "y", "on"):
        return True
    if s.lower() in ("0", "false", "no", "n", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected True or False, got {s!r}")


# The numeric flags several scripts share, with their ranges: checked when the arguments are parsed, where
# torch or numpy would otherwise raise a bare ValueError mid-run (AdamW's betas, a DataLoader's batch size,
# a negative seed). NaN fails every test, so it is refused too.
SHARED_FLAG_RANGES = {
    "learning_rate": (lambda v: math.isfinite(v) and v >= 0, ">= 0"),
    "min_lr": (lambda v: math.isfinite(v) and v >= 0, ">= 0"),
    "weight_decay": (lambda v: math.isfinite(v) and v >= 0, ">= 0"),
    "beta1": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "beta2": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "grad_clip": (lambda v: math.isfinite(v) and v >= 0, ">= 0 (0 = no clipping)"),
    "dropout": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "warmup_iters": (lambda v: v >= 0, ">= 0"),
    "lr_decay_iters": (lambda v: v >= 0, ">= 0"),
    "seed": (lambda v: v >= 0, ">= 0"),
    "eval_batch_size": (lambda v: v >= 1, ">= 1"),
    "eval_max_batches": (lambda v: v >= 1, ">= 1 (leave it out for the whole split)"),
    "min_delta": (lambda v: math.isfinite(v) and v >= 0, ">= 0"),
    "num_workers": (lambda v: v >= 0, ">= 0"),
}


EMPTY_OK = ("tensorboard_dir",)  # text flags for which '' means something ('' = off)


EPILOG = "every flag in full: docs/flags.md"  # the epilog of a --help that gives each flag one line (OneLineHelp)


def first_clause(text, shortest=10):
    """A help text's first clause without its parentheses: up to the first '; ', '. ' or ': ' outside them and at
    least `shortest` characters in (so "p_natural: the detector's P(natural)" is not cut to its first word)."""
    depth, out = 0, []
    for i, ch in enumerate(text):
        if depth == 0 and i >= shortest and text[i:i + 2] in ("; ", ". ", ": ") and text[i - 3:i] not in ("e.g", "i.e"):
            break
        if ch == "(" and (depth or text[i - 1:i] == " "):  # an aside, not a call such as P(natural)
            depth += 1
        elif ch == ")" and depth:
            depth -= 1
        elif depth == 0:
            out.append(ch)
    short = re.sub(r"\s+([,;])", r"\1", re.sub(r"\s+", " ", "".join(out))).strip().rstrip(",")
    return short if len(short) >= shortest or not text else text


class OneLineHelp(argparse.ArgumentDefaultsHelpFormatter):
    """--help gives each flag one line, its help's first clause and its default; the whole text is in
    docs/flags.md (python docs/gen_flags.py), written from the same definitions."""

    def _get_help_string(self, action):
        text = first_clause(action.help or "")
        unset = action.default is None or action.default is False or action.default is argparse.SUPPRESS \
            or action.default == ""  # by identity: a default of 0 or 0.0 equals False, and is shown
        if unset or not action.option_strings or "%(default)" in text:
            return text
        return f"{text} (default: %(default)s)"


def check_no_empty_flags(args, script, empty_ok=()):
    """A ProjectError naming the first text flag set to '' (which would otherwise fall back to a default,
    or name the current directory, in silence), unless it is in EMPTY_OK or `empty_ok`."""
    for name, v in vars(args).items():
        if v == "" and name not in (*EMPTY_OK, *empty_ok):
            raise ProjectError(f"--{name} is empty", f"give it a value, or leave it out for its default "
                                                     f"(python {script} --help)")


def check_flag_ranges(args, script, rules=(), empty_ok=()):
    """A ProjectError naming the first flag out of its range, with its value: an empty text flag
    (check_no_empty_flags); the script's own `rules`, (flag, whether its value is fine, the range in
    words); then the flags of SHARED_FLAG_RANGES that `args` has and that are set."""
    check_no_empty_flags(args, script, empty_ok)
    shared = ((name, v is None or ok(v), what) for name, (ok, what) in SHARED_FLAG_RANGES.items()
              for v in [getattr(args, name, None)])
    for name, fine, what in (*rules, *shared):
        if not fine:
            raise ProjectError(f"--{name} must be {what}, got {getattr(args, name)}", f"see python {script} --help")


def run_cli(main, report_peak=False):
    """Run `main()` and turn user errors into a short message and exit code 2. report_peak: print
    the process's peak memory when main returns (to stderr, so stdout stays the script's own);
    run_cycles shows each step's in its log."""
    exit_with_launcher()
    OUTPUT_DIRS.fresh.clear()  # only the directories this run creates
    try:
        main()
        if report_peak:
            print(PEAK_MEMORY_PREFIX + peak_memory_text(), file=sys.stderr, flush=True)
        leave_torchrun_worker()
    except ProjectError as e:
        _close_progress_bars()
        drop_fresh_dirs()
        # one write: under torchrun every rank reports, and lines written apart interleave with another
        # rank's; the other ranks say which they are (one of them may be the only one that failed)
        rank = os.environ.get("RANK", "0")
        tag = "" if rank == "0" else f"[rank {rank}] "
        sys.stderr.write(f"{tag}error: {e.message}\n" + (f"{tag}suggestion: {e.suggestion}\n" if e.suggestion else ""))
        sys.stderr.flush()
        sys.exit(2)
    except KeyboardInterrupt as e:  # Ctrl-C, or a signal that interrupt_on() turns into one
        print("\ninterrupted; rerun with the same command (and --resume where offered) to continue",
              file=sys.stderr)
        sys.exit(128 + getattr(e, "signum", signal.SIGINT))


def progress_bar(iterable=None, interval=60.0, **kwargs):
    """A progress bar: tqdm's (same arguments) on a terminal, a LineBar elsewhere (a log file, a pipe),
    which prints the bar's state as a line now and then instead of redrawing it, as train.py prints
    its iterations off a terminal. Bars go to kwargs' file, else stderr (tqdm's default)."""
    from tqdm import tqdm
    file = kwargs.get("file") or sys.stderr
    isatty = getattr(file, "isatty", None)
    if os.environ.get(PROGRESS_BARS_ENV) == "1" or (isatty is not None and isatty()):
        return tqdm(iterable, **kwargs)
    return line_bar_class()(iterable, interval=interval, **kwargs)


def line_bar_class():
    """LineBar, a tqdm subclass made on first use (tqdm is imported only by scripts that show bars)."""
    global _LineBar
    if _LineBar is not None:
        return _LineBar
    from tqdm import tqdm

    class LineBar(tqdm):
        """tqdm for output that is not a terminal: the bar's state as a whole line when it starts, when
        another tenth of the total is done or `interval` seconds after the last line, and when it
        closes; never a carriage-return redraw (a log would hold every one)."""

        def __init__(self, *args, interval=60.0, **kwargs):
            self._interval, self._closing = interval, False
            self._last = (None, None, -math.inf)  # the last line: its text, tenth of the total, time
            kwargs.pop("dynamic_ncols", None)
            kwargs.setdefault("ascii", True)
            super().__init__(*args, **kwargs)

        def display(self, msg=None, pos=None):
            if msg == "":  # tqdm clears a bar before other output and at close: a line needs no clearing
                return False
            text = (self.__str__() if msg is None else msg).rstrip()
            tenth = int(10 * self.n / self.total) if self.total else None
            now = time.monotonic()
            last_text, last_tenth, last_t = self._last
            final = self.total and self.n >= self.total  # close() prints that one, with its last postfix
            if text and text != last_text and (self._closing or not final and (
                    tenth != last_tenth or now - last_t >= self._interval)):
                self.fp.write(text + "\n")
                self.fp.flush()
                self._last = (text, tenth, now)
            return True

        def clear(self, nolock=False):
            pass

        def close(self):
            if not self.disable:
                self._closing = True
                self.display()  # the final state
            self.leave = False  # so that tqdm's close adds neither a redraw nor a carriage return
            super().close()

    _LineBar = LineBar
    return LineBar


_LineBar = None


def _close_progress_bars():
    """End tqdm bars left open by the error (e.g. nan in a training loop), so that
    `error:` starts its own line instead of following the bar."""
    tqdm_module = sys.modules.get("tqdm")
    for bar in list(getattr(getattr(tqdm_module, "tqdm", None), "_instances", ())):
        with contextlib.suppress(Exception):
            bar.close()
