"""
A warm start for run_cycles' steps. Each step is a script of its own, and a fresh Python spends seconds
importing torch, and torch._dynamo at an optimizer's first step, before its first line of work: most of a
small step's time, and more on a loaded machine. The launcher is one process that imports them once; each
step is forked from it and runs its script as `python script.py ARGS` would: its argv, environment and
working directory, a session of its own, its output on the runner's pipe, its torch threads as its
OMP_NUM_THREADS says (its peak memory is its own: Linux starts VmHWM anew at a fork). The launcher reports
each step's exit status back and dies with run_cycles, its steps with it. torchrun steps and a user's own
commands start fresh (runner.py).
"""
import atexit
import contextlib
import importlib
import io
import json
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback

from core.process import DIE_WITH_PARENT_ENV, die_with_parent

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# what every step's script imports; numpy and torch first (torch._dynamo: any optimizer's first step)
PREIMPORT = ("numpy", "torch", "torch._dynamo", "torch.optim", "model", "engine", "lib.checkpoint", "lib.finetune",
             "lib.heldout", "lib.reward_head", "core.training", "core.devices", "tokenization_manager", "data_loader",
             "core.plots")
OPTIONAL = ("torch.utils.tensorboard",)  # where installed: each step's --tensorboard_dir auto writes there (0.6 s)
MAX_MESSAGE = 1 << 20


def available():
    """Where steps may be forked: Linux (fork after imports, descriptors over a Unix socket, prctl)."""
    return sys.platform.startswith("linux")


class Launcher:
    """run_cycles' end: starts the launcher process, asks it for steps (spawn), collects exit statuses."""

    def __init__(self, env=None):
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        code = "import sys; from experiment.launcher import main; main(*map(int, sys.argv[1:]))"
        self.proc = subprocess.Popen([sys.executable, "-c", code, str(theirs.fileno()), str(os.getpid())], cwd=ROOT,
                                     pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     env=env)
        theirs.close()
        self.exits, self.gone = {}, False

    def spawn(self, argv, env, pass_fds=(), cwd=None, stderr=False):
        """A step forked from the launcher (argv: [python, script, args...]), in `cwd` (default: this process's):
        a Popen-like WarmStep, its stdout and stderr on one pipe, or with `stderr` each on its own. None when the
        launcher has gone (the caller starts it fresh)."""
        request = json.dumps({"argv": list(argv), "env": dict(env), "cwd": cwd or os.getcwd(), "stderr": stderr})
        pipes = [os.pipe() for _ in range(2 if stderr else 1)]
        try:
            try:
                socket.send_fds(self.sock, [request.encode()], [w for _, w in pipes] + list(pass_fds))
            finally:
                for _, w in pipes:
                    os.close(w)
            while True:
                message = self._receive(None)
                if message is None:
                    break
                if "pid" in message:
                    ends = [os.fdopen(r, "rb", buffering=0) for r, _ in pipes]
                    pipes = []
                    return WarmStep(self, message["pid"], *ends)
        except OSError:
            self.gone = True
        finally:
            for r, w in pipes:
                os.close(r)
        return None

    def collect(self, timeout):
        """Read what the launcher has sent within `timeout` seconds (None: wait for one message)."""
        self._receive(timeout)

    def _receive(self, timeout):
        if self.gone or not select.select([self.sock], [], [], timeout)[0]:
            return None
        try:
            data = self.sock.recv(MAX_MESSAGE)
        except OSError:
            data = b""
        if not data:  # the launcher died: its steps died with it (die_with_parent), unreported
            self.gone = True
            return None
        message = json.loads(data)
        if "exit" in message:
            self.exits[message["exit"]] = message["returncode"]
        return message

    def close(self):
        """End the launcher, at once: a step still running dies with it."""
        self.sock.close()
        self.proc.kill()
        self.proc.wait()


class WarmStep:
    """A forked step as subprocess.Popen shows one: pid (its process group's too), stdout, returncode
    (negative: the signal that ended it), poll(), wait(timeout)."""

    def __init__(self, launcher, pid, stdout, stderr=None):
        self.launcher, self.pid, self.stdout, self.stderr, self.returncode = launcher, pid, stdout, stderr, None

    def poll(self):
        if self.returncode is None:
            self.launcher.collect(0)
            self._update()
        return self.returncode

    def _update(self):
        if self.pid in self.launcher.exits:
            self.returncode = self.launcher.exits.pop(self.pid)
        elif self.launcher.gone:  # ended with the launcher (SIGKILL), its status lost
            self.returncode = -signal.SIGKILL

    def wait(self, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"step {self.pid}", timeout)
            self.launcher.collect(left)
            self._update()
        return self.returncode


def serve(sock, parent):
    """The launcher process: import, then fork a step per request until run_cycles closes its end."""
    die_with_parent(parent)  # kill -9 of run_cycles ends the launcher, and so its steps
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C: run_cycles stops the steps itself
    for name in PREIMPORT:
        importlib.import_module(name)
    for name in OPTIONAL:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    sys.modules["core.plots"].pyplot()  # matplotlib on Agg, about 1 s: most steps plot at their end
    torch = sys.modules["torch"]
    threads = (os.environ.get("OMP_NUM_THREADS"), torch.get_num_threads())
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    while True:
        ready = select.select([sock, wake_r], [], [])[0]
        if wake_r in ready:
            os.read(wake_r, 4096)
        if sock in ready:
            try:
                data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 16)
            except InterruptedError:
                continue
            if not data:
                return
            pid = fork_step(json.loads(data), fds, threads, (sock.fileno(), wake_r, wake_w))
            sock.send(json.dumps({"pid": pid}).encode())
        while True:  # reap: every ended step's status, in order
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            sock.send(json.dumps({"exit": pid, "returncode": os.waitstatus_to_exitcode(status)}).encode())


def fork_step(request, fds, threads, close):
    """Fork one step; returns its pid once it leads a session of its own (a stop signal to its group
    from then on reaches it)."""
    sync_r, sync_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            os.write(sync_w, b"x")
            for fd in (*close, sync_r, sync_w):
                os.close(fd)
            code = run_step(request, fds[0], fds[1] if request.get("stderr") else fds[0], threads)
        except BaseException:  # noqa: B036 (nothing may escape into the launcher's loop)
            traceback.print_exc()
            code = 1
        if code < 0:
            signal.signal(-code, signal.SIG_DFL)
            os.kill(os.getpid(), -code)
        os._exit(code if code >= 0 else 1)
    os.close(sync_w)
    os.read(sync_r, 1)
    os.close(sync_r)
    for fd in fds:
        os.close(fd)
    return pid


def run_step(request, out_fd, err_fd, threads):
    """In the forked step: the state a fresh `python script.py ARGS` would start with, then the script."""
    signal.set_wakeup_fd(-1)
    for s in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    die_with_parent(os.getppid())  # the launcher's end is the step's
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    for fd in {out_fd, err_fd}:
        os.close(fd)
    encoding, errors = sys.stdout.encoding, sys.stdout.errors
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding, errors, write_through=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding, "backslashreplace",
                                  write_through=True)
    os.chdir(request["cwd"])
    env = request["env"]
    if DIE_WITH_PARENT_ENV in env:  # the step's parent is the launcher, not run_cycles
        env[DIE_WITH_PARENT_ENV] = str(os.getppid())
    os.environ.clear()
    os.environ.update(env)
    # torch read OMP_NUM_THREADS when the launcher imported it: this step's own, set again
    torch = sys.modules["torch"]
    if env.get("OMP_NUM_THREADS") != threads[0]:
        torch.set_num_threads(int(env["OMP_NUM_THREADS"]) if env.get("OMP_NUM_THREADS", "").isdigit()
                              else threads[1])
    script = request["argv"][1]
    sys.argv = request["argv"][1:]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        code = exit_code(e.code)
    except KeyboardInterrupt:  # as the interpreter ends on one: by SIGINT itself
        traceback.print_exc()
        code = -signal.SIGINT
    except BaseException:  # noqa: B036 (as Python prints an uncaught exception, and exits 1)
        traceback.print_exc()
        code = 1
    for t in threading.enumerate():  # the interpreter's exit: non-daemon threads, then atexit
        if t is not threading.current_thread() and not t.daemon:
            t.join()
    atexit._run_exitfuncs()
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
        sys.stderr.flush()
    return code


def exit_code(code):
    """sys.exit's argument as the process's exit status (as the interpreter turns it into one)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def main(fd, parent):
    """The launcher process (Launcher starts it): fd, its end of the socket; parent, run_cycles' pid."""
    serve(socket.socket(fileno=fd), parent)
