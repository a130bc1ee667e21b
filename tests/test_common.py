"""core/common.py: atomic writes clean up after killed writes; one writer per output directory."""
import os
import signal
import subprocess
import sys
import time

import pytest

from core.common import DistInfo, ProjectError, atomic_write_text, check_writable_dir, end_run, hold_dir_lock

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
    code = ("import sys, time; from core.common import hold_dir_lock; hold_dir_lock(sys.argv[1], '--out_dir'); "
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
    from core.common import wrap_ddp
    m = torch.nn.Linear(2, 2)
    assert wrap_ddp(m, DistInfo(), "cpu") is m


def test_start_metrics_log(tmp_path, capsys):
    from core.common import read_jsonl, start_metrics_log
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
    child = f"import sys; sys.path.insert(0, {root!r}); from core.common import peak_memory_text; print(peak_memory_text())"
    parent = (f"import subprocess, sys, numpy as np; sys.path.insert(0, {root!r}); from core.common import peak_memory_text\n"
              f"a = np.ones(2**30 // 8); print(peak_memory_text())\n"
              f"print(subprocess.run([sys.executable, '-c', {child!r}], capture_output=True, text=True).stdout)")
    out = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True, check=True).stdout.split("\n")
    parent_gib, child_gib = (float(line.split(" GiB")[0]) for line in out[:2])
    assert parent_gib >= 1.0 and child_gib < 0.5, out
