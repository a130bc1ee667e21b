"""run_cycles.py: one tiny cycle end to end, then a rerun that resumes instead of redoing work."""
import json
import os
import subprocess
import sys

from helpers import make_text, tiny_train_config
from prepare_data import prepare_corpus

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))



def run(args, cwd=ROOT):
    return subprocess.run([sys.executable, "run_cycles.py"] + args, cwd=cwd, capture_output=True,
                          text=True, timeout=600)


def tiny_args(tmp_path, data_dir, cfg):
    return ["--preset", "quick", "--out_dir", str(tmp_path / "run"), "--data_dir", str(data_dir),
            "--base_config", str(cfg), "--max_cycles", "1", "--device", "cpu",
            "--extra_reward_data=--max_blocks_per_split 12 --samples_per_chunk 2 --gen_batch_size 16",
            "--extra_reward_model=--max_iters 20 --eval_interval 10 --batch_size 8",
            "--extra_grpo=--max_steps 3 --prompts_per_step 2 --group_size 4 --eval_interval 3 "
            "--save_interval 1"]


def test_one_cycle_end_to_end_then_resume(tmp_path):
    data_dir = tmp_path / "tiny_char"
    (tmp_path / "input.txt").write_text(make_text(6000, seed=3))
    prepare_corpus(str(tmp_path / "input.txt"), str(data_dir), "char", 0.9, log=lambda *a: None)
    cfg = tmp_path / "tiny.py"
    cfg.write_text(tiny_train_config())

    r = run(tiny_args(tmp_path, data_dir, cfg))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = tmp_path / "run"
    for step in ("cycle_0/base", "cycle_1/reward_data", "cycle_1/reward_model", "cycle_1/grpo",
                 "cycle_1/eval"):
        assert (out / f"{step}.done.json").exists(), step
    assert (out / "cycle_1/reward_data/train_x.bin").exists()
    assert (out / "cycle_1/reward_model/reward_ckpt.pt").exists()
    assert (out / "summary.png").stat().st_size > 1000
    summary = json.loads((out / "summary.json").read_text())
    row = summary["cycles"][0]
    assert row["cycle"] == 1
    for key in ("gen_val_loss", "gen_val_ppl", "rm_val_mae", "rm_const_mae", "grpo_reward_start",
                "grpo_reward_end", "grpo_kl_final", "new_val_ppl"):
        assert row[key] is not None, key
    assert abs(row["gen_val_ppl"] - 2.718281828 ** row["gen_val_loss"]) < 1e-3
    assert "| 1 |" in (out / "summary.md").read_text()
    assert "stopped: max_cycles (1) reached" in (out / "summary.md").read_text()

    # finished run: nothing is redone
    r2 = run(tiny_args(tmp_path, data_dir, cfg))
    assert r2.returncode == 0, r2.stderr[-3000:]
    assert "===" not in r2.stdout  # no step was launched again
    assert json.loads((out / "summary.json").read_text())["cycles"] == summary["cycles"]

    # lose the last two steps (as if killed during GRPO): only those run again, GRPO resumes
    (out / "cycle_1/grpo.done.json").unlink()
    (out / "cycle_1/eval.done.json").unlink()
    r3 = run(tiny_args(tmp_path, data_dir, cfg))
    assert r3.returncode == 0, r3.stdout[-3000:] + r3.stderr[-3000:]
    launched = [line for line in r3.stdout.splitlines() if line.startswith("=== ")]
    assert len(launched) == 1 and "GRPO" in launched[0] and "--resume" in launched[0], launched
    assert json.loads((out / "summary.json").read_text())["cycles"][0]["new_val_ppl"] == \
        summary["cycles"][0]["new_val_ppl"]


def test_bad_base_ckpt_is_a_clear_error(tmp_path):
    r = run(["--base_ckpt", str(tmp_path / "nope.pt"), "--out_dir", str(tmp_path / "o")])
    assert r.returncode == 2
    assert "error: --base_ckpt" in r.stderr and "Traceback" not in r.stderr


def test_a_directory_in_use_is_refused(tmp_path):
    """While another process (e.g. a step orphaned by kill -9) holds the run's lock, a rerun
    stops at once instead of writing beside it."""
    import fcntl
    out = tmp_path / "run"
    out.mkdir()
    fd = os.open(out / "run.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        r = run(["--out_dir", str(out), "--data_dir", str(tmp_path / "missing")])
    finally:
        os.close(fd)
    assert r.returncode == 2
    assert f"error: --out_dir {out} is in use by another run_cycles.py" in r.stderr
    assert sorted(os.listdir(out)) == ["run.lock"]
