"""core/files.py, cli.py, process.py, devices.py: atomic writes clean up after killed writes; one writer per output
directory; progress bars off a terminal; peak memory."""
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from core.cli import run_cli
from core.devices import DistInfo, end_run
from core.errors import ProjectError
from core.files import atomic_write_text, check_writable_dir, hold_dir_lock, release_dir_lock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_atomic_write_removes_leftovers_of_killed_writes_only(tmp_path):
    target = tmp_path / "ckpt.pt"
    old = time.time() - 100

    def touch(name, mtime):
        p = tmp_path / name
        p.write_text("x")
        os.utime(p, (mtime, mtime))
        return p

    touch("ckpt.pt.ab12cd_4.tmp", old)              # a killed atomic write of ckpt.pt: removed
    touch("ckpt.pt.zz99yy88.tmp", time.time() + 5)  # another write still in progress: kept
    touch("last.pt.ab12cd34.tmp", old)              # a leftover of another file: kept for its next write
    touch("train_x.bin.tmp", old)                   # prepare_reward_data's resumable progress: kept
    atomic_write_text(target, "new")
    assert target.read_text() == "new"
    assert sorted(os.listdir(tmp_path)) == ["ckpt.pt", "ckpt.pt.zz99yy88.tmp", "last.pt.ab12cd34.tmp",
                                            "train_x.bin.tmp"]


def _holder(directory):
    """Another process that takes the directory's lock and keeps it until killed."""
    code = ("import sys, time; from core.files import hold_dir_lock; hold_dir_lock(sys.argv[1], '--out_dir'); "
            "print('held', flush=True); time.sleep(600)")
    p = subprocess.Popen([sys.executable, "-c", code, str(directory)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_check_writable_dir_writes_nothing(tmp_path):
    """No probe file: a kill during the check can leave no litter (issue 21)."""
    check_writable_dir(str(tmp_path / "new" / "out"))
    assert os.listdir(tmp_path / "new" / "out") == []
    (tmp_path / "f").write_text("x")
    with pytest.raises(ProjectError, match="exists and is a file"):
        check_writable_dir(str(tmp_path / "f"))
    if os.geteuid() != 0:  # root may write anywhere
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o555)
        with pytest.raises(ProjectError, match="cannot be created or written"):
            check_writable_dir(str(ro))
        assert os.listdir(ro) == []


def test_bad_input_leaves_no_output_directory_the_run_created(tmp_path, capsys):
    """run_cli on a ProjectError removes the directories the run made (a new parent too) while they hold
    nothing but its lock; one that was there before, or that holds anything else, stays."""
    old, kept = tmp_path / "old", tmp_path / "kept"
    old.mkdir()

    def main():
        for d in (tmp_path / "new" / "out", old, kept):
            check_writable_dir(str(d))
            hold_dir_lock(str(d), "--out_dir")
        check_writable_dir(str(tmp_path / "new" / "out" / "tb"), "--tensorboard_dir")  # inside the locked one
        (kept / "metrics.jsonl").write_text("{}\n")
        raise ProjectError("--model_path nodir does not exist", "check it")

    with pytest.raises(SystemExit) as e:
        run_cli(main)
    assert e.value.code == 2 and "error: --model_path nodir" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["kept", "old"]
    assert sorted(os.listdir(kept)) == [".lock", "metrics.jsonl"] and os.listdir(old) == [".lock"]
    end_run(DistInfo())
    run_cli(lambda: check_writable_dir(str(tmp_path / "finished")))  # a run that ends well keeps its directory,
    with pytest.raises(SystemExit):
        run_cli(main)  # and a later failing run in this process leaves it alone
    assert sorted(os.listdir(tmp_path)) == ["finished", "kept", "old"]
    end_run(DistInfo())


def test_error_is_one_write_and_names_a_worker_rank(monkeypatch):
    """Under torchrun every rank reports the same bad flag: written line by line, two ranks' lines
    interleaved ('...per step)suggestion: ...'). One write per error, the other ranks' tagged."""
    class Stderr:
        def __init__(self):
            self.writes = []

        def write(self, text):
            self.writes.append(text)

        def flush(self):
            pass

    def bad():
        raise ProjectError("--batch_size 3 is not divisible by the 2 processes", "use a multiple of 2")

    for rank, tag in ((None, ""), ("0", ""), ("1", "[rank 1] ")):
        if rank is None:
            monkeypatch.delenv("RANK", raising=False)
        else:
            monkeypatch.setenv("RANK", rank)
        err = Stderr()
        monkeypatch.setattr(sys, "stderr", err)
        with pytest.raises(SystemExit) as e:
            run_cli(bad)
        assert e.value.code == 2
        assert err.writes == [f"{tag}error: --batch_size 3 is not divisible by the 2 processes\n"
                              f"{tag}suggestion: use a multiple of 2\n"]


def test_dir_lock_refuses_a_second_writer_until_the_first_is_gone(tmp_path):
    p = _holder(tmp_path)
    try:
        with pytest.raises(ProjectError) as e:
            hold_dir_lock(str(tmp_path), "--out_dir")
        assert e.value.message == (f"--out_dir {tmp_path} is in use by another process "
                                   f"(lock {tmp_path / '.lock'}, taken by process {p.pid})")
        assert "choose another --out_dir" in e.value.suggestion
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    fd = hold_dir_lock(str(tmp_path), "--out_dir")  # the kernel released the killed holder's lock
    assert hold_dir_lock(str(tmp_path), "--out_dir") == fd  # the same process may take it again
    assert (tmp_path / ".lock").read_text() == f"{os.getpid()}\n"
    end_run(DistInfo())  # released: another process can have it now
    p = _holder(tmp_path)
    p.send_signal(signal.SIGKILL)
    p.wait()


def test_wrap_ddp_is_the_module_itself_without_torchrun():
    import torch

    from core.devices import wrap_ddp
    m = torch.nn.Linear(2, 2)
    assert wrap_ddp(m, DistInfo(), "cpu") is m


def test_start_metrics_log(tmp_path, capsys):
    from core.files import read_jsonl, start_metrics_log
    p = tmp_path / "metrics.jsonl"
    p.write_text("".join(f'{{"iter": {i}}}\n' for i in range(5)))
    start_metrics_log(str(p), lambda r: r["iter"] <= 2)  # resume at iter 2
    assert [r["iter"] for r in read_jsonl(str(p))] == [0, 1, 2]
    start_metrics_log(str(p), fresh_note="note: replaced")  # a fresh run
    assert not p.exists() and "note: replaced" in capsys.readouterr().out
    start_metrics_log(str(p))  # nothing to remove, nothing printed
    start_metrics_log(str(p), lambda r: True)  # resuming without a log
    assert not p.exists() and capsys.readouterr().out == ""


@pytest.mark.slow  # a command line run in a subprocess
def test_peak_memory_is_the_processs_own_not_its_parents(tmp_path):
    """A step started by a large run_cycles must not report run_cycles' peak (ru_maxrss carries it
    over fork and exec on Linux; VmHWM does not)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("VmHWM is Linux's")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    child = f"import sys; sys.path.insert(0, {root!r}); from core.process import peak_memory_text; print(peak_memory_text())"
    parent = (f"import subprocess, sys, numpy as np; sys.path.insert(0, {root!r}); from core.process import peak_memory_text\n"
              f"a = np.ones(2**30 // 8); print(peak_memory_text())\n"
              f"print(subprocess.run([sys.executable, '-c', {child!r}], capture_output=True, text=True).stdout)")
    out = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True, check=True).stdout.split("\n")
    parent_gib, child_gib = (float(line.split(" GiB")[0]) for line in out[:2])
    assert parent_gib >= 1.0 and child_gib < 0.5, out


# ----------------------------------------------------------------------------- progress bars

class FakeTty:
    """A stream that says it is a terminal."""

    def __init__(self):
        import io
        self.buf = io.StringIO()

    def isatty(self):
        return True

    def write(self, s):
        return self.buf.write(s)

    def flush(self):
        pass


def test_progress_bar_off_a_terminal_prints_a_line_now_and_then(monkeypatch):
    """Off a terminal (a log file, a pipe) a bar prints whole lines, at its start, every tenth of the
    total and at its end (with its last postfix), and tqdm.write's messages keep lines of their own:
    no carriage-return redraws. On a terminal, or with PROGRESS_BARS_ENV (run_cycles' steps, whose
    StepRunner makes lines of the redraws itself), it is tqdm's own bar."""
    import io

    from tqdm import tqdm

    from core import cli
    monkeypatch.delenv(cli.PROGRESS_BARS_ENV, raising=False)
    log = io.StringIO()
    bar = cli.progress_bar(total=1000, desc="reward", file=log, dynamic_ncols=True)
    for i in range(1000):
        bar.update(1)
        bar.set_postfix(loss=f"{i:04d}")
        if i == 500:
            tqdm.write("iter 500: val loss 1.0", file=log)
    bar.close()
    text = log.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert lines[0].startswith("reward:   0%") and "iter 500: val loss 1.0" in lines
    assert [line.split("|")[0] for line in lines if line.startswith("reward:")] == [
        f"reward: {p:3d}%" for p in range(0, 101, 10)]
    assert lines[-1].startswith("reward: 100%|##########| 1000/1000") and lines[-1].endswith("loss=0999]")
    # a bar without a total: a line every `interval` seconds
    clock = [0.0]
    monkeypatch.setattr(cli.time, "monotonic", lambda: clock[0])
    log = io.StringIO()
    for i in cli.progress_bar(iter(range(100)), desc="cache", file=log, interval=30.0, mininterval=0):
        clock[0] = float(i)  # one item a second: lines at 0, 30, 60 and 90 s, and the end
    assert [line.split(" ")[1] for line in log.getvalue().splitlines()] == ["0it", "31it", "61it", "91it", "100it"]
    monkeypatch.undo()
    # a terminal, or a step of run_cycles: tqdm's bar, redrawn in place
    tty = FakeTty()
    bar = cli.progress_bar(total=3, desc="grpo", file=tty)
    assert type(bar) is tqdm
    bar.update(3)
    bar.close()
    assert "\r" in tty.buf.getvalue()
    monkeypatch.setenv(cli.PROGRESS_BARS_ENV, "1")
    assert type(cli.progress_bar(total=3, file=io.StringIO())) is tqdm


def test_a_finished_run_removes_its_lock_file_and_a_late_opener_takes_the_new_one(tmp_path, monkeypatch):
    """release_dir_lock removes the lock file, then releases it: the finished directory keeps no
    run.lock. A process that opened the old file just before it was removed must not hold a lock on
    that removed file beside a third process that created a new one: hold_dir_lock takes the lock
    again on whatever file the path names once it holds one."""
    from core import files
    fd = hold_dir_lock(str(tmp_path), "--out_dir", "run.lock")
    release_dir_lock(str(tmp_path), "run.lock")
    assert os.listdir(tmp_path) == []
    with pytest.raises(OSError):
        os.fstat(fd)  # closed
    release_dir_lock(str(tmp_path), "run.lock")  # not held: nothing to do
    real_open, opened = os.open, []

    def open_then_lose_it(path, *a):  # the previous holder removes its file right after this open
        fd = real_open(path, *a)
        if not opened:
            os.unlink(path)
        opened.append(fd)
        return fd
    monkeypatch.setattr(files.os, "open", open_then_lose_it)
    fd = hold_dir_lock(str(tmp_path), "--out_dir", "run.lock")
    monkeypatch.undo()
    assert len(opened) == 2 and fd == opened[1]  # the first, removed file was let go
    assert os.stat(tmp_path / "run.lock").st_ino == os.fstat(fd).st_ino
    assert (tmp_path / "run.lock").read_text() == f"{os.getpid()}\n"
    release_dir_lock(str(tmp_path), "run.lock")


def test_device_name_asks_cuda_for_the_device_it_was_given(monkeypatch):
    """The CUDA branch of the results' stamp, on a CPU: the name of cuda:N, not of the current device."""
    from core.devices import device_name
    asked = []
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: asked.append(d) or "NVIDIA H100 80GB HBM3")
    assert device_name("cuda:1") == "NVIDIA H100 80GB HBM3" and asked == [torch.device("cuda:1")]
    assert device_name("cuda") == "NVIDIA H100 80GB HBM3" and asked[-1] == torch.device("cuda")
    assert device_name("cpu").endswith(f"{os.cpu_count()} cores") and len(asked) == 2


def test_device_flag_is_a_device_name_on_any_machine(monkeypatch):
    """The CUDA branch of the --device check, on a CPU with one GPU faked: a malformed name is refused
    as such (int('abc') raised a traceback there), a device index is checked against the count."""
    from core.devices import device_available, resolve_device
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert [device_available(d) for d in ("cpu", "cuda", "cuda:0", "cuda:1")] == [True, True, True, False]
    for bad in ("cuda:abc", "cudax", "cuda:-1", "cuda:", "tpu", "cpu:1"):
        assert not device_available(bad)
        with pytest.raises(ProjectError, match=f"^--device {bad} is not a device$") as e:
            resolve_device(bad)
        assert "cuda:N" in e.value.suggestion
    with pytest.raises(ProjectError, match="^--device cuda:1 is not available on this machine$"):
        resolve_device("cuda:1")
    assert resolve_device("cuda:0") == "cuda:0"


def test_output_directories_are_an_explicit_object(tmp_path):
    """The locks and the fresh directories a run holds are an OutputDirs' own (OUTPUT_DIRS is the process's):
    two of them contend for a directory as two processes would (flock is per open file), and each drops
    only the fresh directories it recorded."""
    from core.files import OutputDirs
    a, b = OutputDirs(), OutputDirs()
    out = tmp_path / "run"
    out.mkdir()
    fd = a.hold(str(out), "--out_dir")
    assert a.hold(str(out), "--out_dir") == fd  # held already: the same lock
    with pytest.raises(ProjectError, match="is in use by another process"):
        b.hold(str(out), "--out_dir")
    a.release(str(out))
    assert b.hold(str(out), "--out_dir") is not None and not a.locks
    b.release_all()
    fresh, kept = tmp_path / "fresh", tmp_path / "kept"
    fresh.mkdir()
    kept.mkdir()
    a.fresh.add(str(fresh))
    a.drop_fresh()
    b.drop_fresh()
    assert not fresh.exists() and kept.exists() and not a.fresh
