"""
Processes and signals: a clean stop on SIGTERM or SIGHUP (raised as Ctrl-C is), dying with a parent
(torchrun's launcher, run_cycles.py), a script's peak memory, and the environment protocol between
run_cycles.py and its steps (DIE_WITH_PARENT_ENV, PROGRESS_BARS_ENV, PEAK_MEMORY_PREFIX).
"""
import contextlib
import ctypes
import os
import resource
import signal
import sys


PEAK_MEMORY_PREFIX = "peak memory: "  # experiment/runner.StepRunner finds a step's own report by it


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


# a step of run_cycles.py runs in a process group of its own (experiment/runner.StepRunner), so a stop
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
