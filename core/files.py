"""
Files a run writes: atomic outputs (a kill leaves no half-written file), hashes, one writer per output
directory (a lock), the output directories a run created, and JSON-lines logs.
"""
import contextlib
import hashlib
import json
import os
import re
import sys
import tempfile
import time

import numpy as np

from core.errors import ProjectError


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
    import torch  # here: the tokenizers and prepare_data.py's pool use this module without torch
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


class OutputDirs:
    """The output directories this process writes: the locks it holds on them and the directories (and their
    parents) its run created, which a run stopped by bad input removes again. Locks are a process's (the
    kernel's flock), so there is one of these per process, OUTPUT_DIRS; the functions below act on it."""

    def __init__(self):
        self.locks = {}  # lock file path -> descriptor
        self.fresh = set()  # real paths of the directories this run created

    def hold(self, directory, flag, lock_name=".lock", users="another process"):
        """hold_dir_lock's lock on directory/lock_name (see there); the descriptor."""
        try:
            import fcntl
        except ImportError:  # not POSIX: no lock
            return None
        path = os.path.realpath(os.path.join(directory, lock_name))
        if path in self.locks:  # main() called again in the same process (tests, notebooks)
            return self.locks[path]
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
            try:  # a holder that finished removed the file after we opened it (release): take the new one
                if os.stat(path).st_ino == os.fstat(fd).st_ino:
                    break
            except FileNotFoundError:
                pass
            os.close(fd)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.locks[path] = fd
        return fd

    def release(self, directory, lock_name=".lock"):
        """release_dir_lock (see there)."""
        path = os.path.realpath(os.path.join(directory, lock_name))
        fd = self.locks.pop(path, None)
        if fd is None:
            return
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.close(fd)

    def release_all(self):
        """A script's end (devices.end_run): every lock released, their files left (a rerun reuses them)."""
        while self.locks:
            os.close(self.locks.popitem()[1])

    def drop_fresh(self):
        """drop_fresh_dirs (see there)."""
        locks = {}
        for path in self.locks:
            locks.setdefault(os.path.dirname(path), set()).add(os.path.basename(path))
        # the deepest first, so that a fresh OUT_DIR/tb is gone before OUT_DIR is looked at
        for d in sorted(self.fresh, key=len, reverse=True):
            with contextlib.suppress(OSError):
                if d in locks and set(os.listdir(d)) == locks[d]:
                    for name in locks[d]:
                        self.release(d, name)
                os.rmdir(d)  # only an empty directory goes
        self.fresh.clear()


OUTPUT_DIRS = OutputDirs()


def hold_dir_lock(directory, flag, lock_name=".lock", users="another process"):
    """One writer per output directory: an exclusive lock on `directory/lock_name`, held until
    end_run(), release_dir_lock() or the end of the process (the kernel releases it even after
    kill -9). A second run into the same directory, e.g. a rerun beside a first one that is still
    going, stops with an error instead of both writing. Returns the descriptor, which child
    processes may inherit."""
    return OUTPUT_DIRS.hold(directory, flag, lock_name, users)


def release_dir_lock(directory, lock_name=".lock"):
    """A finished run's end: remove its lock file, then release the lock (no litter in a finished
    directory). A process that opened the file just before finds, once it has the lock, that the
    path is gone or another file, and takes the lock anew (hold_dir_lock)."""
    OUTPUT_DIRS.release(directory, lock_name)


def drop_fresh_dirs():
    """A run stopped by bad input (run_cli): remove the output directories it created while they hold
    nothing but its lock, so that a mistyped flag leaves no empty run directory behind. Directories
    that were there before, or that hold anything else, stay as they are."""
    OUTPUT_DIRS.drop_fresh()


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
    OUTPUT_DIRS.fresh.update(os.path.realpath(m) for m in missing)
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

    def close(self):  # (again: nothing more to close)
        if self.tracker is not None:
            self.tracker.close()
            self.tracker = None


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    torch = sys.modules.get("torch")  # a tensor means torch is loaded; never imported for this
    if torch is not None and isinstance(o, torch.Tensor):
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
