"""
Shared plumbing for every script: error types with user-facing messages, a clean stop
on Ctrl-C or SIGTERM, progress bars that print lines off a terminal, atomic file
writes, directory locks, hashing, device / precision selection, distributed set-up,
early stopping and JSONL logging. Scripts import from here instead of copying code.
"""
import contextlib
import ctypes
import hashlib
import json
import math
import os
import re
import resource
import signal
import sys
import tempfile
import time

import numpy as np


class _Torch:
    """torch, imported on first use: prepare_data.py and the tokenizers (and the pool processes
    prepare_data.py forks) never need it, and importing it costs seconds and about 200 MB each."""

    def __getattr__(self, name):
        import torch
        return getattr(torch, name)


torch = _Torch()


# -----------------------------------------------------------------------------
# errors: a ProjectError carries a one-line cause and an optional suggestion.
# Command-line scripts print both and exit 2 instead of dumping a traceback.

class ProjectError(Exception):
    """A problem caused by the user's input (file, flag, data), not a bug."""

    def __init__(self, message, suggestion=None):
        super().__init__(message)
        self.message = message
        self.suggestion = suggestion

    def __str__(self):
        return self.message


class MetaFileError(ProjectError):
    """A char-level meta.pkl is missing, unreadable, unsafe or malformed."""


class BinaryFileError(ProjectError):
    """A token/label .bin file is missing, truncated, mis-sized or out of range."""


class CheckpointError(ProjectError):
    """A checkpoint is missing, corrupt, unsafe or of the wrong kind."""


class TokenizationMismatchError(ProjectError, ValueError):
    """Two parts of the pipeline disagree on tokenization (method or vocab)."""


class DataError(ProjectError):
    """A text corpus or token stream cannot be used (empty, too short, bad encoding)."""


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


PEAK_MEMORY_PREFIX = "peak memory: "  # experiment/steps.StepRunner finds a step's own report by it


def peak_memory_text():
    """This process's peak memory so far: its peak resident set and, when CUDA was used, torch's
    peak of allocated GPU memory. On Linux the peak is /proc/self/status's VmHWM: getrusage's
    ru_maxrss carries the parent's peak over fork and exec, so a step started by run_cycles would
    report at least run_cycles' own peak. Elsewhere ru_maxrss (KiB on Linux, bytes on macOS)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    try:
        with open("/proc/self/status") as f:
            rss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration, ValueError, IndexError):
        pass
    text = f"{rss / 2**30:.2f} GiB RSS"
    torch = sys.modules.get("torch")  # never imported just for this
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        text += f", CUDA {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB max allocated"
    rank = os.environ.get("RANK")
    return text + ("" if rank is None else f" (rank {rank})")


def run_cli(main, report_peak=False):
    """Run `main()` and turn user errors into a short message and exit code 2. report_peak: print
    the process's peak memory when main returns (to stderr, so stdout stays the script's own);
    run_cycles shows each step's in its log."""
    exit_with_launcher()
    _FRESH_DIRS.clear()  # only the directories this run creates
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


class Interrupted(KeyboardInterrupt):
    """A stop signal (SIGTERM, SIGHUP) raised as Ctrl-C's KeyboardInterrupt is, so that one path ends
    a run cleanly (run_cli's message, a running step stopped with it); `signum` is the signal."""

    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


STOP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))  # kill PID, a hangup


@contextlib.contextmanager
def env_default(name, value):
    """Within the block os.environ[name] is `value` unless it was set already (child processes inherit
    it); as it was after the block (main() may run in a test's process)."""
    old = os.environ.get(name)
    os.environ.setdefault(name, value)
    try:
        yield os.environ[name]
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


@contextlib.contextmanager
def interrupt_on(*signums):
    """Within the block, the signals `signums` raise Interrupted in the main thread, as SIGINT raises
    KeyboardInterrupt; the previous handlers come back after it (main() may run in a test's process).
    Outside the main thread signal handlers cannot be set: the block then changes nothing."""
    def handler(signum, frame):
        raise Interrupted(signum)
    old = {}
    try:
        for s in signums:
            old[s] = signal.signal(s, handler)
    except ValueError:  # not the main thread
        pass
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


# a step of run_cycles.py runs in a process group of its own (experiment/steps.StepRunner), so a stop
# of run_cycles can end the step and everything it started; this variable names run_cycles' pid, so
# the step also dies with it when run_cycles itself is killed (kill -9 of its group included)
DIE_WITH_PARENT_ENV = "ADVGPT_DIE_WITH_PARENT"


def exit_with_launcher():
    """Under torchrun, die with the launcher. torchrun starts each worker in a session of its own,
    so `kill -9` of torchrun (or of its process group) would leave the workers running and still
    writing, unseen, beside a rerun. Linux can send a signal to a process when its parent dies.
    Likewise a step of run_cycles.py (DIE_WITH_PARENT_ENV) dies with run_cycles; the variable is
    removed, so that processes the step starts do not take it for theirs."""
    if "TORCHELASTIC_RUN_ID" in os.environ:
        die_with_parent()
        return
    parent = os.environ.pop(DIE_WITH_PARENT_ENV, "")
    if parent.isdigit():
        die_with_parent(int(parent))


def leave_torchrun_worker():
    """A torchrun worker whose script finished: exit now, skipping the interpreter's and C++'s
    teardown. Once DistributedDataParallel has been built on a gloo group, torch keeps that group
    referenced from C++, so destroy_process_group() cannot join gloo's threads (gloo_tcp_loop,
    pt_gloo_runloop keep running), and running the exit-time destructors with those threads live is
    the likely cause of the abort seen after finished work ("terminate called without an active
    exception", SIGABRT); inferred from the threads, the abort was not reproduced here. Everything is written by now: end_run() synchronised the ranks, left the group
    and released the locks; output files are closed (atomic writes)."""
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def die_with_parent(parent_pid=None):
    """Linux: have the kernel kill this process (SIGKILL) when its parent dies, kill -9 included;
    used by torchrun workers and by prepare_data.py's pool processes. `parent_pid`, if known, catches
    a parent that died before the request was made (else: having been handed to init, pid 1)."""
    if not sys.platform.startswith("linux"):
        return
    PR_SET_PDEATHSIG = 1
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
    if os.getppid() == 1 or (parent_pid is not None and os.getppid() != parent_pid):
        os._exit(1)


# "1": progress bars stay tqdm's redraws even off a terminal; run_cycles sets it for its steps, whose
# output its StepRunner turns into lines itself (final states, a snapshot now and then)
PROGRESS_BARS_ENV = "ADVGPT_PROGRESS_BARS"


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


# -----------------------------------------------------------------------------
# files

_UMASK = os.umask(0)
os.umask(_UMASK)

@contextlib.contextmanager
def atomic_output(path, mode="wb"):
    """Yield a file object on a temporary name beside `path`; rename on success only.

    A crash or kill leaves at most a `path.XXXXXXXX.tmp` file, never a half-written `path`;
    such leftovers of earlier, killed writes of `path` are removed after the next successful one
    (they can be as large as a checkpoint).
    """
    path = os.fspath(path)
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    started = time.time()
    fd, tmp = tempfile.mkstemp(dir=d, prefix=os.path.basename(path) + ".", suffix=".tmp")
    try:
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; give the usual permissions
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    remove_stale_temps(path, before=started)


def remove_stale_temps(path, before):
    """Delete atomic_output's temporary files of `path` last modified before `before` (a time
    stamp): leftovers of killed writes. A write still in progress keeps touching its file."""
    d, base = os.path.split(os.path.abspath(path))
    pattern = re.compile(re.escape(base) + r"\.[A-Za-z0-9_]{8}\.tmp")
    with contextlib.suppress(OSError):
        for name in os.listdir(d):
            if pattern.fullmatch(name):
                p = os.path.join(d, name)
                with contextlib.suppress(OSError):
                    if os.path.getmtime(p) < before:
                        os.remove(p)


def atomic_write_text(path, text):
    with atomic_output(path, "w") as f:
        f.write(text)


def atomic_torch_save(obj, path):
    with atomic_output(path, "wb") as f:
        torch.save(obj, f)


def sha256_file(path, chunk=1 << 22):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(chunk)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def sha256_bytes(b):
    return hashlib.sha256(memoryview(b)).hexdigest()


_DIR_LOCKS = {}  # lock file path -> descriptor, for the directories this process writes
_FRESH_DIRS = set()  # real paths of the output directories (and parents) this run created


def hold_dir_lock(directory, flag, lock_name=".lock", users="another process"):
    """One writer per output directory: an exclusive lock on `directory/lock_name`, held until
    end_run(), release_dir_lock() or the end of the process (the kernel releases it even after
    kill -9). A second run into the same directory, e.g. a rerun beside a first one that is still
    going, stops with an error instead of both writing. Returns the descriptor, which child
    processes may inherit."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        return None
    path = os.path.realpath(os.path.join(directory, lock_name))
    if path in _DIR_LOCKS:  # main() called again in the same process (tests, notebooks)
        return _DIR_LOCKS[path]
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise ProjectError(f"{flag} {directory}: cannot create the lock file {path}: {e.strerror}",
                               f"choose a writable location for {flag}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = ""
            with contextlib.suppress(OSError):
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            os.close(fd)
            taken = f", taken by process {holder}" if holder.isdigit() else ""
            raise ProjectError(f"{flag} {directory} is in use by {users} (lock {path}{taken})",
                               f"wait until it ends (or stop it), or choose another {flag}") from None
        try:  # a holder that finished removed the file after we opened it (release_dir_lock): take the new one
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _DIR_LOCKS[path] = fd
    return fd


def release_dir_lock(directory, lock_name=".lock"):
    """A finished run's end: remove its lock file, then release the lock (no litter in a finished
    directory). A process that opened the file just before finds, once it has the lock, that the
    path is gone or another file, and takes the lock anew (hold_dir_lock)."""
    path = os.path.realpath(os.path.join(directory, lock_name))
    fd = _DIR_LOCKS.pop(path, None)
    if fd is None:
        return
    with contextlib.suppress(OSError):
        os.unlink(path)
    os.close(fd)


def drop_fresh_dirs():
    """A run stopped by bad input (run_cli): remove the output directories it created while they hold
    nothing but its lock, so that a mistyped flag leaves no empty run directory behind. Directories
    that were there before, or that hold anything else, stay as they are."""
    locks = {}
    for path in _DIR_LOCKS:
        locks.setdefault(os.path.dirname(path), set()).add(os.path.basename(path))
    # the deepest first, so that a fresh OUT_DIR/tb is gone before OUT_DIR is looked at
    for d in sorted(_FRESH_DIRS, key=len, reverse=True):
        with contextlib.suppress(OSError):
            if d in locks and set(os.listdir(d)) == locks[d]:
                for name in locks[d]:
                    release_dir_lock(d, name)
            os.rmdir(d)  # only an empty directory goes
    _FRESH_DIRS.clear()


def check_writable_dir(path, flag="--out_dir"):
    """Create `path` if needed and make sure we can write there; ProjectError otherwise."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ProjectError(f"{flag} {path} exists and is a file, not a directory",
                           f"pass a directory path to {flag}")
    missing, p = [], os.path.abspath(path)
    while not os.path.exists(p) and p != os.path.dirname(p):
        missing.append(p)
        p = os.path.dirname(p)
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise ProjectError(f"{flag} {path} cannot be created or written: {e.strerror}",
                           f"choose a writable location for {flag}") from None
    _FRESH_DIRS.update(os.path.realpath(m) for m in missing)
    # access(2) asks the kernel, for this process's credentials, and reports a read-only file
    # system too; unlike a probe file it writes nothing, so a kill here leaves nothing behind
    if not os.access(path, os.W_OK | os.X_OK):
        raise ProjectError(f"{flag} {path} cannot be created or written: permission denied",
                           f"choose a writable location for {flag}")


def check_writable_file(path, flag):
    """An output file's path, checked before the work that fills it: not a directory, and in a directory
    that can be created and written (atomic_output writes beside it, then renames)."""
    if os.path.isdir(path):
        raise ProjectError(f"{flag} {path} is a directory, not a file",
                           f"pass a file path to {flag}, e.g. {os.path.join(path, 'result.json')}")
    check_writable_dir(os.path.dirname(os.path.abspath(path)), f"{flag}'s directory")


# -----------------------------------------------------------------------------
# devices and precision

DEVICE_NAME = re.compile(r"cpu|mps|cuda(?::(\d+))?")  # what --device may name ('auto' aside)


def device_available(device):
    m = DEVICE_NAME.fullmatch(device)
    if m is None:  # 'cuda:abc', 'cudax', 'tpu'
        return False
    if device == "cpu":
        return True
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            return False
        return m.group(1) is None or int(m.group(1)) < torch.cuda.device_count()
    return hasattr(torch.backends, "mps") and torch.backends.mps.is_available()  # 'mps'


def device_name(device):
    """The hardware behind a resolved device, for the results' stamp: the GPU's name on CUDA, else the
    CPU's model (from /proc/cpuinfo where there is one) and its core count."""
    if str(device).startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    if device == "mps":
        return "Apple MPS"
    model = None
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    return f"{model or 'CPU'}, {os.cpu_count()} cores"


def resolve_device(device="auto", flag="--device"):
    """'auto' -> cuda, mps or cpu; an explicit but unavailable device is a ProjectError."""
    if device == "auto":
        if torch.cuda.is_available():
            return "cuda"
        if hasattr(torch.backends, "mps") and torch.backends.mps.is_available():
            return "mps"
        return "cpu"
    if DEVICE_NAME.fullmatch(device) is None:
        raise ProjectError(f"{flag} {device} is not a device", f"use {flag} auto, cpu, cuda, cuda:N or mps")
    if not device_available(device):
        raise ProjectError(f"{flag} {device} is not available on this machine",
                           f"use {flag} auto or {flag} cpu")
    return device


def resolve_dtype(dtype, device):
    """'auto' -> bfloat16 on CUDA with bf16 support, else float16 on CUDA, float32 elsewhere."""
    if dtype == "auto":
        if device.startswith("cuda"):
            return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
        return "float32"
    return dtype


AUTOCAST_DEVICES = ("cuda", "cpu")
DTYPES = ("auto", "float32", "bfloat16", "float16")


def add_dtype_arg(parser):
    """Every script's --dtype (resolve_dtype, autocast_context)."""
    parser.add_argument("--dtype", default="auto", choices=DTYPES,
                        help="autocast precision ('auto': bfloat16 on CUDA if supported, else float16; float32 on "
                             "CPU and MPS); an explicit bfloat16 or float16 autocasts on CPU too; float16 trains "
                             "with a gradient scaler")


def autocast_context(device, dtype):
    """Mixed precision: autocast in bfloat16 or float16 on CUDA and on CPU (where only an explicit
    --dtype asks for it: 'auto' is float32 there); a no-op context for float32 or other devices."""
    kind = device.split(":")[0]
    if dtype == "float32" or kind not in AUTOCAST_DEVICES:
        return contextlib.nullcontext()
    ptdtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    return torch.amp.autocast(device_type=kind, dtype=ptdtype)


def synchronize(device):
    """Wait for the work queued on a CUDA device, so a timing means what it says (a no-op elsewhere)."""
    if str(device).startswith("cuda"):
        torch.cuda.synchronize(device)


def needs_grad_scaler(device, dtype):
    """True exactly where float16 autocast runs (autocast_context), whose small gradients underflow
    unless the loss is scaled up first."""
    return dtype == "float16" and device.split(":")[0] in AUTOCAST_DEVICES


def grad_scaler(device, dtype):
    """The gradient scaler of a training loop: enabled where needs_grad_scaler, a disabled one
    (every call a no-op: scale returns the loss, step just steps) elsewhere."""
    kind = device.split(":")[0]
    return torch.amp.GradScaler(kind if kind in AUTOCAST_DEVICES else "cpu", enabled=needs_grad_scaler(device, dtype))


def clip_and_step(scaler, optimizer, params, grad_clip):
    """One optimizer step after backward(scaler.scale(loss)): unscale, clip the gradient norm to
    grad_clip (<= 0: no clipping), step (skipped by the scaler on inf/nan gradients) and update the
    scale. Returns the gradient norm before clipping (a tensor)."""
    scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip > 0 else float("inf"))
    scaler.step(optimizer)
    scaler.update()
    return norm


# -----------------------------------------------------------------------------
# distributed (torchrun)

def wrap_ddp(module, dist, device):
    """`module` in DistributedDataParallel under torchrun (on this process's GPU, or CPU/gloo),
    else `module` itself. Evaluate through the unwrapped module: rank 0 evaluates alone."""
    if not dist.enabled:
        return module
    from torch.nn.parallel import DistributedDataParallel as DDP
    return DDP(module, device_ids=[dist.local_rank] if str(device).startswith("cuda") else None)


class DistInfo:
    def __init__(self, enabled=False, rank=0, local_rank=0, world_size=1):
        self.enabled = enabled
        self.rank = rank
        self.local_rank = local_rank
        self.world_size = world_size

    @property
    def master(self):
        return self.rank == 0

    def share(self, total, flag):
        """This process's part of a per-step total (`flag` names it in the error): the scripts'
        batch flags are totals, so one command means the same run for any number of processes."""
        if total % self.world_size:
            raise ProjectError(f"{flag} {total} is not divisible by the {self.world_size} processes "
                               f"(it is the total per step)", "use a multiple of the number of processes")
        return total // self.world_size

    def my_slice(self, x):
        """This rank's equal part (along the first dimension) of something every rank drew alike."""
        n = len(x) // self.world_size
        return x[self.rank * n:(self.rank + 1) * n]


def init_distributed(device="auto", backend=None):
    """Initialise torch.distributed when launched by torchrun (RANK set).

    Returns (DistInfo, device). gloo on CPU, nccl on CUDA (unless `backend` names
    one); each rank takes the GPU of its local rank.
    """
    if int(os.environ.get("RANK", -1)) == -1:
        return DistInfo(), resolve_device(device)
    backend_override = None if backend in (None, "auto") else backend
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    world_size = int(os.environ["WORLD_SIZE"])
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        device = f"cuda:{local_rank}"
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = resolve_device(device)
        backend = "gloo"
    torch.distributed.init_process_group(backend=backend_override or backend)
    return DistInfo(True, rank, local_rank, world_size), device


def end_run(dist):
    """A script's last step: leave the process group and release the output directory locks."""
    if dist.enabled and torch.distributed.is_initialized():
        # every rank arrives before any leaves: no rank tears its connections down while a peer
        # (rank 0 writing summaries and plots) still has them open
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    while _DIR_LOCKS:
        os.close(_DIR_LOCKS.popitem()[1])


# -----------------------------------------------------------------------------
# training helpers

class EarlyStopping:
    """Stop when the metric has not improved by at least `min_delta` for `patience` checks.

    `mode='min'` for losses, 'max' for rewards. `patience <= 0` disables stopping.
    """

    def __init__(self, patience=5, min_delta=0.0, mode="min", best=None, bad_checks=0):
        assert mode in ("min", "max")
        self.patience = patience
        self.min_delta = min_delta
        self.mode = mode
        self.best = best
        self.bad_checks = bad_checks

    def improved(self, value):
        if self.best is None or not math.isfinite(self.best):
            return True
        if self.mode == "min":
            return value < self.best - self.min_delta
        return value > self.best + self.min_delta

    def step(self, value):
        """Record `value`; return True if it is a new best (counter reset)."""
        if self.improved(value):
            self.best = value
            self.bad_checks = 0
            return True
        self.bad_checks += 1
        return False

    @property
    def should_stop(self):
        return self.patience > 0 and self.bad_checks >= self.patience

    def state_dict(self):
        return {"best": self.best, "bad_checks": self.bad_checks,
                "patience": self.patience, "min_delta": self.min_delta, "mode": self.mode}

    def load_state_dict(self, d):
        self.best = d.get("best")
        self.bad_checks = int(d.get("bad_checks", 0))


def cosine_lr(it, learning_rate, min_lr, warmup_iters, lr_decay_iters):
    """Linear warmup, then cosine decay to min_lr at lr_decay_iters, then flat."""
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    ratio = (it - warmup_iters) / max(1, lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))
    return min_lr + coeff * (learning_rate - min_lr)


class JsonlLogger:
    """Append one JSON object per line; flushed so a killed run keeps what it logged. A
    `tracker` (tracking.Tracker) also gets every row: the one place each script records one."""

    def __init__(self, path, enabled=True, tracker=None):
        self.path = path
        self.enabled = enabled and path is not None
        self.tracker = tracker if self.enabled else None
        if self.enabled:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)

    def log(self, **record):
        if not self.enabled:
            return
        record.setdefault("time", time.time())
        with open(self.path, "a") as f:
            f.write(json.dumps(record, default=_json_default) + "\n")
        if self.tracker is not None:
            self.tracker.log(record)

    def close(self):
        if self.tracker is not None:
            self.tracker.close()


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, torch.Tensor):
        return o.item() if o.numel() == 1 else o.tolist()
    return str(o)


def read_jsonl(path):
    out = []
    if not os.path.exists(path):
        return out
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    pass  # a line cut short by a kill
    return out


def start_metrics_log(path, resume_keep=None, fresh_note=None):
    """metrics.jsonl at the start of a run (call it on the master process only). Resuming
    (`resume_keep`, a predicate on records): drop what was logged after the checkpoint, so no
    step appears twice. A fresh run (resume_keep None): an old log is removed, after printing
    `fresh_note` if given, so two runs never mix in one file."""
    if resume_keep is not None:
        truncate_jsonl(path, resume_keep)
    elif os.path.exists(path):
        if fresh_note:
            print(fresh_note)
        os.remove(path)


def truncate_jsonl(path, keep):
    """Drop records for which keep(record) is False (used when resuming from a checkpoint)."""
    if not os.path.exists(path):
        return
    records = [r for r in read_jsonl(path) if keep(r)]
    atomic_write_text(path, "".join(json.dumps(r, default=_json_default) + "\n" for r in records))


def check_finite(value, what, step):
    """Raise a clear error on NaN/inf instead of letting a broken model be saved."""
    if not math.isfinite(value):
        raise ProjectError(f"{what} became {value} at step {step}; training stopped without "
                           f"writing a checkpoint for this state",
                           "lower the learning rate, enable gradient clipping, or use float32")
