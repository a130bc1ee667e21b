"""
Running the steps' scripts for run_cycles.py: each in a process group of its own (stopped with everything it
started when run_cycles is), its output streamed to the console and to steps.log (progress bars made into
lines off a terminal), several at once where they do not depend on each other (run_together).
"""
import codecs
import contextlib
import os
import select
import shlex
import signal
import subprocess
import sys
import time

from core.errors import ProjectError
from core.process import DIE_WITH_PARENT_ENV, PEAK_MEMORY_PREFIX, PROGRESS_BARS_ENV
from experiment import launcher

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # where the scripts are


class Command:
    """A step's command of the user's own (run_cycles --arm): its words as given, not a script of this repository."""

    def __init__(self, words):
        self.words = list(words)


def root_path(path):
    """A path inside the repository (a script, a preset's config or corpus) as the caller's directory
    reaches it: relative where that is the repository or above it (train.py from the root), else absolute."""
    full = os.path.join(ROOT, path)
    rel = os.path.relpath(full)
    return full if rel.split(os.sep)[0] == os.pardir else rel


class StepOutput:
    """Where a step's output goes. The log gets each line's final state (a progress bar's last
    redraw, not every one). A terminal gets the raw stream, so bars redraw in place. Any other
    stdout (`run_cycles.py > log.txt`, a pipe) gets what the log gets, plus a snapshot of a
    running progress bar at most every `interval` seconds. prefix: put before each line (a step that
    runs beside others: StepRunner.run_together)."""

    def __init__(self, log, console, tty, interval=30.0, clock=time.monotonic, prefix=""):
        self.log, self.console, self.tty, self.prefix = log, console, tty, prefix
        self.interval, self.clock = interval, clock
        self.pending, self.tail = "", []
        self.last_snapshot, self.last_snapshot_text = clock(), None

    def _line(self, line):
        self.log.write(self.prefix + line)
        if not self.tty:
            self.console.write(self.prefix + line)
        self.tail = (self.tail + [line])[-20:]

    def feed(self, text):
        if self.tty:
            self.console.write(text)
        *lines, self.pending = (self.pending + text).split("\n")
        self.pending = "\r".join(self.pending.split("\r")[-2:])  # a bar's older redraws are not needed
        for line in lines:
            self._line(line.rstrip("\r").rsplit("\r", 1)[-1] + "\n")
        if "\r" in self.pending and self.clock() - self.last_snapshot >= self.interval:
            # the last complete redraw of the bar (the piece after the last \r may be cut short)
            snap = self.pending.rsplit("\r", 1)[0].rsplit("\r", 1)[-1].rstrip()
            if snap.strip() and snap != self.last_snapshot_text:
                self._line(snap + "\n")
                self.last_snapshot_text = snap
            self.last_snapshot = self.clock()
        self.log.flush()
        self.console.flush()

    def close(self):
        if self.pending.rsplit("\r", 1)[-1]:
            self._line(self.pending.rsplit("\r", 1)[-1] + "\n")
        self.pending = ""
        self.log.flush()
        self.console.flush()


class StepRunner:
    """Runs the steps' scripts, each streaming its output to the console and to log_path (see
    StepOutput; a progress bar's snapshot at most every progress_interval seconds off a terminal).
    lock_fd: the run directory's lock, inherited by every step, so a step orphaned by kill -9 of
    run_cycles keeps the directory locked until it exits. nproc > 1: the steps that allow it run
    under torchrun with that many processes.

    Each step runs in a process group of its own: when run_cycles is interrupted (Ctrl-C, or SIGTERM
    / SIGHUP, which run_cycles raises as KeyboardInterrupt) the step's whole group gets the same
    signal, and SIGKILL after stop_grace seconds, so nothing the step started (prepare.py's pip
    download, torchrun's workers) runs on. The step also dies with run_cycles (core.process's
    DIE_WITH_PARENT_ENV), which a kill of run_cycles' own group no longer reaches directly.

    warm: fork each script that runs in one process from a launcher that imported torch once
    (experiment/launcher.py; Linux), not a fresh Python: seconds less a step. close() ends it."""

    @staticmethod
    def warm_on(device):
        """Whether the steps of a run on `device` fork warm: on a CPU (a forked process's CUDA is not yet measured
        on a GPU here, and a GPU step is long anyway)."""
        return device == "cpu"

    def __init__(self, log_path, lock_fd=None, progress_interval=30.0, nproc=1, stop_grace=10.0, warm=False):
        self.log_path, self.lock_fd = log_path, lock_fd
        self.progress_interval, self.nproc, self.stop_grace = progress_interval, nproc, stop_grace
        self.warm, self.launcher = warm and launcher.available(), None  # the launcher: started by the first step

    def close(self):
        """End the warm launcher, if any (its steps have ended by now)."""
        if self.launcher is not None:
            self.launcher.close()
        self.launcher, self.warm = None, False

    def run(self, name, cmd, parallel=True, timeout=None):
        """Run one script (cmd: its path and arguments; under torchrun when parallel and nproc > 1; a command of
        the user's own, started by its first word: Command). Returns its seconds; a failure is a ProjectError
        with the end of its output, as is a step still running after `timeout` seconds (its group is stopped);
        an interrupt stops the step (stop()) and is raised again."""
        return self.run_together([(name, cmd)], parallel, timeouts=[timeout])[0]

    def run_together(self, steps, parallel=True, tags=None, env=None, timeouts=None, at_once=None, after=None):
        """Run several (name, cmd) steps at once, each in its own process group (env: variables set for each,
        e.g. one torch thread apiece on a CPU; timeouts: each one's limit in seconds, or None), and wait for
        all of them. at_once: at most that many run at a time (None: all), a step starting as soon as a place is
        free and the steps it comes after (after[i]: indices of earlier steps) have ended well, the first such in
        their order. With more than one, each line of a step's output is prefixed with [its tag] (default: its
        name; a terminal then gets lines, not interleaved bars). Returns their seconds; a failure is raised once
        the running steps have ended, after which no step waiting on it starts (the others' work stays, for a
        rerun to reuse); an interrupt stops the running steps and is raised again."""
        n = len(steps)
        tags = (tags or [name for name, _ in steps]) if n > 1 else [None] * n
        timeouts, after, at_once = timeouts or [None] * n, after or [()] * n, at_once or n
        waiting, running, results = list(range(n)), [], [None] * n
        with open(self.log_path, "a") as log:
            try:
                while True:
                    ready = [i for i in waiting if all(results[j] is not None and results[j][1] == 0 for j in after[i])]
                    for i in ready[:at_once - len(running)]:
                        waiting.remove(i)
                        r = self._launch(*steps[i], parallel, log, tags[i], env)
                        r["i"], r["deadline"] = i, None if timeouts[i] is None else r["t0"] + timeouts[i]
                        running.append(r)
                    if not running:  # every step ended, or what is left waits on one that failed
                        break
                    for r in self._read(running):
                        running.remove(r)
                        results[r["i"]] = self._finish(r, log) + (r.get("timed_out", False),)
            except KeyboardInterrupt as e:
                sig = getattr(e, "signum", signal.SIGINT)
                for r in running[1:]:  # the signal to every group first (stop() sends the first one's)
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(r["proc"].pid, sig)
                for k, r in enumerate(running):
                    self.stop(r["proc"], r["out"], r["decoder"], sig, signalled=k > 0)
                    done = f"--- {r['name']}: stopped by {signal.Signals(sig).name} after {time.time() - r['t0']:.1f} s"
                    log.write(done + "\n")
                    print(done, flush=True)
                raise
        ended = [r for r in results if r is not None]
        late = [i for i, r in enumerate(results) if r is not None and r[4]]
        if late:
            name, _, _, tail, _ = results[late[0]]
            raise ProjectError(f"step '{name}' was stopped after its limit of {timeouts[late[0]]:.0f} s; "
                               f"its output is in {self.log_path}:\n" + tail,
                               "give it a longer limit (run_cycles --arm_timeout) or a smaller budget, and rerun "
                               "the same command: finished steps are skipped")
        failed = [r for r in ended if r[1] != 0]
        if failed:
            name, rc, _, tail, _ = failed[0]
            raise ProjectError(f"step '{name}' failed (exit {rc}); its output is in {self.log_path}:\n" + tail,
                               "fix the cause and rerun the same command: finished steps are skipped")
        return [r[2] for r in results]

    def _launch(self, name, cmd, parallel, log, tag, extra_env=None):
        # a step runs where run_cycles was started, so every path on its command line (--out_dir, --extra_*'s)
        # means what it means to the user; the script itself is the repository's
        forked = False  # a script in one process, forked from the warm launcher
        if isinstance(cmd, Command):  # the user's own words: python is this interpreter, anything else as it is
            argv = [sys.executable] + cmd.words[1:] if cmd.words[0] in ("python", "python3") else list(cmd.words)
        else:
            cmd = [root_path(cmd[0])] + cmd[1:]
            if parallel and self.nproc > 1:
                cmd = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={self.nproc}"] + cmd
            forked = self.warm and cmd[0] != "-m"
            argv = [sys.executable] + cmd
        shown = shlex.join(cmd.words if isinstance(cmd, Command) else cmd)  # as a shell reads it
        print(f"\n=== {name}: {shown}", flush=True)
        log.write(f"\n$ {shown}\n")
        log.flush()
        # unbuffered: output streams as it comes, and a step orphaned by `kill -9` of this
        # process fails at its next line (broken pipe) instead of running on unseen; progress
        # bars stay bars on the pipe: StepOutput turns their redraws into lines itself
        env = dict(os.environ, PYTHONUNBUFFERED="1", **{DIE_WITH_PARENT_ENV: str(os.getpid()), PROGRESS_BARS_ENV: "1"},
                   **(extra_env or {}))
        if isinstance(cmd, Command):  # a user's command would pass it on, and a script of ours it starts (TRL's arm
            del env[DIE_WITH_PARENT_ENV]  # runs export_hf.py) would find its parent is not run_cycles and quit
        fds, t0 = () if self.lock_fd is None else (self.lock_fd,), time.time()
        if forked and self.launcher is None:
            self.launcher = launcher.Launcher()
        proc = self.launcher.spawn(argv, env, fds) if forked else None
        if forked and proc is None:  # the launcher has gone: fresh processes from here on
            print("note: the warm launcher has ended; steps start as fresh processes", flush=True)
            self.close()
        if proc is None:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, bufsize=0,
                                    start_new_session=True, env=env, pass_fds=fds)
        tty = sys.stdout.isatty() and tag is None
        out = StepOutput(log, sys.stdout, tty, self.progress_interval, prefix="" if tag is None else f"[{tag}] ")
        return {"name": name, "proc": proc, "out": out, "t0": t0, "eof": False,
                "decoder": codecs.getincrementaldecoder("utf-8")(errors="replace")}

    def _read(self, running):
        """Feed each step's output to its StepOutput as it comes, until a step's stdout ends; a step past its
        deadline is stopped (stop(), SIGTERM then SIGKILL) and marked timed_out. Returns the steps that ended."""
        while not any(r["eof"] for r in running):
            live = [r for r in running if not r["eof"]]
            limits = [r["deadline"] for r in live if r.get("deadline") is not None]
            wait = None if not limits else max(0.0, min(limits) - time.time())
            ready = [r for r in live if r["proc"].stdout in select.select([r["proc"].stdout for r in live], [], [],
                                                                          wait)[0]]
            for r in live:  # past its limit, however much it still prints
                if r.get("deadline") is not None and time.time() >= r["deadline"]:
                    r["timed_out"], r["eof"], r["t_end"] = True, True, time.time()
                    self.stop(r["proc"], r["out"], r["decoder"], signal.SIGTERM)
            for r in (r for r in ready if not r["eof"]):
                chunk = r["proc"].stdout.read(65536)
                r["out"].feed(r["decoder"].decode(chunk, final=not chunk))
                r["eof"] = not chunk
                if r["eof"]:  # its own end, not the last one's: its seconds
                    r["t_end"] = time.time()
        return [r for r in running if r["eof"]]

    @staticmethod
    def _finish(r, log):
        """(name, exit status, seconds, the end of its output) of a step whose output has ended."""
        r["out"].close()
        rc = r["proc"].wait()
        secs = r.get("t_end", time.time()) - r["t0"]
        # the step's own report (cli.run_cli's report_peak), one line per process under torchrun
        peaks = [line.strip()[len(PEAK_MEMORY_PREFIX):] for line in r["out"].tail if line.startswith(PEAK_MEMORY_PREFIX)]
        done = f"--- {r['name']}: exit {rc} after {secs:.1f} s"  # not '=== ': that line is the step's launch
        done += f"; {PEAK_MEMORY_PREFIX}{' | '.join(peaks)}" if peaks else ""
        log.write(done + "\n")
        print(done, flush=True)
        return r["name"], rc, secs, "".join(r["out"].tail).rstrip()

    def stop(self, proc, out, decoder, sig, signalled=False):
        """End the step's process group: `sig` to all of it (unless signalled already), its output read on
        meanwhile (a step blocked on a full pipe would not end), SIGKILL to what is left after stop_grace
        seconds or at a second interrupt; returns once the group is gone (or, past SIGKILL, after a few
        seconds more: a process outside the group may hold the pipe)."""
        def signal_group(s):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, s)

        if not signalled:
            signal_group(sig)
        deadline, killed, eof = time.monotonic() + self.stop_grace, False, False
        while True:
            try:
                proc.poll()  # reaps the step's own process once it ends: a zombie still counts in its group
                if eof and not group_alive(proc.pid):
                    break
                if time.monotonic() >= deadline:
                    if killed:
                        break
                    signal_group(signal.SIGKILL)
                    killed, deadline = True, time.monotonic() + 5.0
                elif eof:
                    time.sleep(0.05)
                elif select.select([proc.stdout], [], [], min(0.5, max(0.0, deadline - time.monotonic())))[0]:
                    chunk = proc.stdout.read(65536)
                    out.feed(decoder.decode(chunk, final=not chunk))
                    eof = not chunk
            except KeyboardInterrupt:  # a second Ctrl-C: no more waiting
                deadline = 0
        out.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=1.0)


def group_alive(pgid):
    """True while a process of the group pgid runs. A zombie (ended, not yet reaped: an orphan's new
    parent may never reap it) does not count where /proc tells them apart; elsewhere any member does."""
    if not os.path.isdir("/proc"):
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/{pid}/stat") as f:
                state, _, pgrp = f.read().rsplit(")", 1)[1].split()[:3]
            if int(pgrp) == pgid and state != "Z":
                return True
    return False


def ensure_data(data_dir, runner):
    """The corpus' train.bin and val.bin, prepared by its prepare.py when missing."""
    if os.path.exists(os.path.join(data_dir, "train.bin")) and os.path.exists(os.path.join(data_dir, "val.bin")):
        return
    prep = os.path.join(data_dir, "prepare.py")
    if not os.path.exists(prep):
        raise ProjectError(f"--data_dir {data_dir} has no train.bin/val.bin and no prepare.py",
                           "prepare it first: python prepare_data.py --input TEXT --out_dir DIR")
    runner.run("prepare data", [os.path.abspath(prep)], parallel=False)
