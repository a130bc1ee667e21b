"""common.py: atomic writes clean up after killed writes."""
import os
import time

from common import atomic_write_text


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
