"""The data-limited test (--preset data_limit --data_chars D): the D characters, their dev slice and the judge's text
never overlap each other or the val split; MLE's continuation says 'not saturated' where more MLE still gains; and the
preset runs end to end at smoke sizes."""
import json
import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from core.errors import ProjectError
from experiment import archive, cycle0
from experiment.presets import SMOKE_MIN_EPOCHS, SMOKE_TRAIN, preset
from experiment.report import saturation, saturation_section
from helpers import make_text, prepare_char_data, run_script
from lib.checkpoint import checkpoint_train_config
from lib.corpus import Corpus

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def windows(tokens, n=24):
    """Every n-token window of a stream, as bytes: two texts share one only where they overlap."""
    t = np.asarray(tokens, dtype=np.uint16)
    return {t[i:i + n].tobytes() for i in range(len(t) - n + 1)}


def test_the_d_characters_their_dev_slice_and_the_judges_text_are_disjoint_and_never_the_val_split(tmp_path):
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz ,.;:!?ABCDEFGH\n"))
    text = "".join(np.random.default_rng(4).choice(letters, 30000))  # no 24-character window twice by chance
    _, data_dir = prepare_char_data(str(tmp_path), text=text)
    src = Corpus(data_dir)
    settings = {**preset("data_limit"), "judge_after": 12000}
    arms, judge = cycle0.data_limit(data_dir, str(tmp_path / "run"), 8000, settings)
    a, j = Corpus(arms), Corpus(judge)
    # the D characters: the first 8,000 of the train split, the last tenth of them the dev slice
    assert len(a.train) + len(a.val) == 8000 and len(a.val) == 800
    assert np.array_equal(np.concatenate([a.train, a.val]), src.train[:8000])
    # the judge's text: past judge_after, its own last tenth its dev slice
    assert np.array_equal(np.concatenate([j.train, j.val]), src.train[12000:])
    parts = {"train": windows(a.train), "dev": windows(a.val), "judge": windows(j.train),
             "judge dev": windows(j.val), "val": windows(src.val)}
    names = list(parts)
    for x in range(len(names)):
        for y in range(x + 1, len(names)):
            assert not parts[names[x]] & parts[names[y]], f"{names[x]} and {names[y]} share text"
    info = json.load(open(os.path.join(arms, "prepare_info.json")))
    assert info["dev_from_train"] == [7200, 8000] and info["val_tokens"] == 800
    # the same call again keeps what is written; bounds past the judge's text are refused
    assert cycle0.data_limit(data_dir, str(tmp_path / "run"), 8000, settings) == (arms, judge)
    with pytest.raises(ProjectError, match="--data_chars 13000"):
        cycle0.data_limit(data_dir, str(tmp_path / "run2"), 13000, settings)


def entry(arm, val, dev, cycle=0, rep=0):
    return {"arm": arm, "cycle": cycle, "replicate": rep, "val_loss": val, "dev_loss": dev}


def seeds(dev_changes, at_cap=()):
    out = []
    for r, d in enumerate(dev_changes):
        out += [{**entry("base", 2.0, 2.1, rep=r), "at_cap": r in at_cap}, entry("control", 2.0, 2.1 + d, 1, r)]
    return out


def test_saturation_needs_the_bound_on_the_continuations_gain_below_half_the_margin():
    """Saturated only where the one-sided 95 % upper bound on the continuation's dev gain lies below delta / 2: a
    mean change >= 0 with no interval (the old rule) is not enough."""
    # MLE still gains 0.01-0.03 on dev at every seed: not saturated at any margin below 0.04
    still = saturation(seeds([-0.01, -0.03, -0.02, -0.015]), delta=0.03)
    assert not still["saturated"] and still["gain_bound"] > 0.015 and still["limit"] == pytest.approx(0.015)
    # the old rule's "saturated": a mean change of +0.0007 with a wide spread; the bound is far above 0
    noisy = saturation(seeds([0.03, -0.025, -0.003]), delta=0.01)
    assert noisy["dev_change"] > 0 and not noisy["saturated"]
    # flat within a small spread: saturated at a margin of 0.03, not at one of 0.002
    flat = seeds([-0.004, 0.002, -0.003, 0.001, -0.002, 0.0, -0.001, 0.003])
    assert saturation(flat, delta=0.03)["saturated"] and not saturation(flat, delta=0.002)["saturated"]
    # a seed whose dev minimum sat at its schedule's cap: not saturated, named; one seed: no interval
    assert saturation(seeds([0.004, 0.006, 0.005], at_cap=(1,)), delta=0.03)["at_cap"] == [1]
    assert not saturation(seeds([0.004, 0.006, 0.005], at_cap=(1,)), delta=0.03)["saturated"]
    # the report names the clause that failed: D = 200,000's eight seeds gained nothing, but four stopped at the cap
    capped = saturation_section(saturation(seeds([0.004, 0.006, 0.005], at_cap=(1,)), delta=0.03))
    assert "**not saturated**" in capped and "dev minimum may lie past its schedule" in capped
    assert "may still gain" not in capped and "may still gain" in saturation_section(still)
    one = saturation(seeds([0.01]), delta=0.03)
    assert one["gain_bound"] is None and not one["saturated"]
    assert saturation([{**entry("base", 2.0, 2.1), "dev_loss": None}]) is None  # no dev slice: no check


def test_a_d_too_small_for_its_dev_slice_is_refused_before_any_step_naming_the_smallest_that_works(tmp_path):
    """--data_chars 100 at context 64: a dev slice of 10 tokens; refused at once (it used to train the judge for ten
    minutes first), the message naming the smallest D whose dev slice and train part each hold a window."""
    assert cycle0.smallest_data_chars(64, 0.1) == 646 and round(646 * 0.1) == 65 and round(645 * 0.1) == 64
    assert cycle0.config_block_size(os.path.join(ROOT, "config", "train_shakespeare_char_cpu.py"), {}) == 64
    assert cycle0.config_block_size(None, {"block_size": 32}, ["--block_size=16"]) == 16
    out = tmp_path / "run"
    r = run_script([os.path.join(ROOT, "run_cycles.py"), "--preset", "data_limit", "--data_chars", "100", "--out_dir",
                    str(out), "--device", "cpu"], cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=120)
    assert r.returncode == 2 and "--data_chars 100" in r.stderr and "--data_chars 646 or more" in r.stderr, r.stderr
    assert not out.exists()  # nothing ran, nothing written


@pytest.mark.slow  # a whole run_cycles.py pipeline
def test_the_data_limit_preset_runs_end_to_end_at_smoke_sizes(tmp_path):
    _, data_dir = prepare_char_data(str(tmp_path), text=make_text(20000, seed=3))
    out = tmp_path / "run"
    cmd = [os.path.join(ROOT, "run_cycles.py"), "--preset", "data_limit", "--smoke", "--data_chars", "6000",
           "--data_dir", data_dir, "--out_dir", str(out), "--device", "cpu",
           "--arms", "unfrozen,heldout,more_data,ensemble_kd"]  # (the others have pipelines of their own)
    r = run_script(cmd, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())
    base = next(g for g in s["generators"] if g["arm"] == "base")
    trunk = next(g for g in s["generators"] if g["arm"] == "trunk")
    rec = json.loads((out / "cycle_0" / "base.done.json").read_text())
    grid, cont = rec["grid"], rec["continued"]
    # the grid's best point, continued in the continuation's regime (its lr, constant; its batch) to its dev minimum
    best = min(grid, key=lambda p: p["dev_loss"])
    assert len(grid) == 2 and base["generator"] == cont["checkpoint"] == str(out / "cycle_0" / "base_grid" /
                                                                               "continued" / "ckpt.pt")
    assert (cont["dropout"], cont["weight_decay"]) == (best["dropout"], best["weight_decay"])
    assert cont["dev_loss"] <= cont["dev_loss_before"] and rec["flops"]["flops"] == sum(p["flops"] for p in grid + [cont])
    assert trunk["generator"] == base["generator"]  # MLE at its limit is the trunk
    assert s["data_dir"] == os.path.abspath(data_dir) and s["arms_data_dir"] == str(out / "data" / "limit")
    assert s["judge_data"]["dir"] == str(out / "data" / "judge") and "ratio" not in s["settings"]["arms"]
    assert s["saturation"]["per_seed"] and "## MLE at its limit?" in (out / "summary.md").read_text()
    # the second detector's arm: its own detector, the whole trunk trained, measured train and val
    unfrozen = next(g for g in s["generators"] if g["arm"] == "unfrozen")
    assert unfrozen["own_detector"]["recipe"] == "per_position" and unfrozen["own_detector"]["train_mae"] is not None
    assert set(s["frontier"]["cycle_1"]["arms"]["unfrozen"]["verdicts"]) == {"control", "trunk"}
    # the heldout arm: MLE on (1 - h) D at the base's chosen point, charged the grid that chose it; its detector's natural
    # text the other h D, its GRPO's prompts from its own text; its detector's AUROC judges whether its word counts
    held = next(g for g in s["generators"] if g["arm"] == "heldout")
    held_rec = json.loads((out / "cycle_0" / "heldout_base.done.json").read_text())
    assert len(held_rec["grid"]) == 1 and (held_rec["grid"][0]["dropout"], held_rec["grid"][0]["weight_decay"]) == \
        (best["dropout"], best["weight_decay"])
    assert held_rec["selection_flops"] == sum(p["flops"] for p in grid) and held["compute_flops"] > held_rec["flops"]
    assert held["own_detector"]["auroc"] is not None and s["heldout"]["share"] == 0.2
    assert "detector" in s["frontier"]["cycle_1"]["arms"]["heldout"]
    rd = (out / "cycle_1" / "heldout" / "detector" / "reward_data" / "train_metadata.txt").read_text()
    assert f"train_bin: {out / 'data' / 'limit_held' / 'train.bin'}\n" in rd
    # its mechanism's memorised text is its generator's own (1 - h) D; the cycle's detector's is all of D
    held_det = json.loads((out / "cycle_1" / "heldout" / "detector" / "detect.done.json").read_text())
    assert held_det["seen_text"] == str(out / "data" / "limit_fit")
    assert json.loads((out / "cycle_1" / "detect.done.json").read_text())["seen_text"] == str(out / "data" / "limit")
    log = (out / "steps.log").read_text()
    held_grpo = next(line for line in log.splitlines() if "cycle_1/heldout/grpo" in line and "train_grpo.py" in line)
    assert f"--data_dir {out / 'data' / 'limit_fit'}" in held_grpo and f"--model_path {held_rec['generator']}" in held_grpo
    # the GRPO arms tuned as MLE is: four points each on the dev slice, the chosen one's generator judged, the others'
    # FLOPs charged as its selection
    for arm, d in (("adversarial", out / "cycle_1"), ("heldout", out / "cycle_1" / "heldout")):
        g = next(g for g in s["generators"] if g["arm"] == arm)
        sel = json.loads((d / "grid.done.json").read_text())
        assert len(sel["points"]) == 4 and g["tuned"]["chosen"] == sel["chosen"]
        assert g["tuned"]["selection_flops"] == sum(p["flops"] for k, p in enumerate(sel["points"]) if k != sel["chosen"])
        assert sel["points"][sel["chosen"]]["checkpoint"] in (g["generator"], g["generator"].replace("/ckpt.pt", "/last.pt"))
    # the positive control: MLE at its limit on twice the data, by the same recipe on its own text, judged as an arm;
    # the row's margin from it, and every word from the margin's vocabulary (never "tie")
    more = next(g for g in s["generators"] if g["arm"] == "more_data")
    more_rec = json.loads((out / "cycle_0" / "more_data.done.json").read_text())
    assert more["generator"] == more_rec["generator"] == str(out / "cycle_0" / "more_data_grid" / "continued" / "ckpt.pt")
    assert Corpus(str(out / "data" / "limit_2x")).train.size + Corpus(str(out / "data" / "limit_2x")).val.size == 12000
    # the ensemble: the seed's MLE at its limit and three members of their own seeds; its student counts them all
    ens = json.loads((out / "cycle_0" / "ensemble.done.json").read_text())
    assert len(ens["members"]) == 4 and ens["members"][0] == base["generator"] and len(set(ens["members"])) == 4
    kd = next(g for g in s["generators"] if g["arm"] == "ensemble_kd")
    assert all(0 <= g["copy_rate"] <= 1 for g in s["generators"])  # every generator's memorisation, measured
    # the lexicon baseline's words come from the D characters less their dev slice, never the whole train split
    detects = [json.loads(p.read_text()) for p in out.glob("cycle_1/**/detect.done.json")]
    assert detects and {d["lexicon_text"] for d in detects} == {str(out / "data" / "limit")}
    assert kd["generator"] == ens["student"] and kd["compute_flops"] > ens["ensemble_flops"] > 0
    # the student trains by the members' recipe (the chosen grid point's), not the continuation's regime of MLE at its
    # limit (GRPO's learning rate, constant, its batch)
    student = json.loads((out / "cycle_0" / "ensemble" / "student" / "train_summary.json").read_text())
    assert student["base"] == best["checkpoint"]
    recipe = ("learning_rate", "min_lr", "warmup_iters", "batch_size", "beta2")
    student_cfg, member_cfg = (checkpoint_train_config(torch.load(out / "cycle_0" / "ensemble" / p / "ckpt.pt",
                                                                  weights_only=True, map_location="cpu"))
                               for p in ("student", "member1"))
    assert {k: student_cfg[k] for k in recipe} == {k: member_cfg[k] for k in recipe} and member_cfg["learning_rate"] == 1e-3
    assert next(g for g in s["generators"] if g["arm"] == "ensemble")["generator"] == "+".join(ens["members"])
    row = s["frontier"]["cycle_1"]
    assert set(row["margin"]) == {"quality", "coverage"} and isinstance(row["powered"], bool)
    assert s["design"]["primary"] == ["adversarial", "heldout", "ddo"] and "more_data" in row["arms"]
    words = {v["verdict"] for a in row["arms"].values() for v in a["verdicts"].values()}
    assert words <= {"beyond", "inside", "equivalent", "inconclusive", "mixed", "degenerate", "out of range"}, words
    adv = row["arms"]["adversarial"]["verdicts"]
    assert adv["trunk"]["family"] == 2 and adv["control"]["family"] == 0  # Holm: the primary comparisons run (no ddo here)
    for m in ("at_quality", "at_coverage"):
        c = adv["trunk"][m]
        if c["verdict"] != "out of range":
            assert c["ci95"][0] <= c["diff"] <= c["ci95"][1] and c["mde"] > 0
    assert s["cycles"][0]["rm_train_mae"] is not None and s["data_slices"]["dev_from_train"] == [5400, 6000]
    # every step but the verdict's own measurements trained and stopped on the D characters
    log = (out / "steps.log").read_text()
    continued = next(line for line in log.splitlines() if "base_grid/continued" in line and "train.py" in line)
    assert f"--init_from {best['checkpoint']}" in continued and "--learning_rate 5e-05 --decay_lr False" in continued
    # the grid's schedule stretched to SMOKE_MIN_EPOCHS passes over the 5400 train tokens (batch 8 x 32), past
    # SMOKE's 6 iterations
    point = next(line for line in log.splitlines() if "base_grid/dropout0_wd0.1 " in line and "train.py" in line)
    iters = -(-SMOKE_MIN_EPOCHS * 5400 // (8 * 32))
    assert iters > SMOKE_TRAIN["max_iters"] and f"--max_iters {iters} --lr_decay_iters {iters}" in point, point
    # the grid's points and the judge trained at once (parallel_cycle0), their lines tagged
    for tag in ("cycle_0/base_grid/dropout0_wd0.1/train", "cycle_0/base_grid/dropout0.2_wd0.1/train", "cycle_0/judge"):
        assert f"[{tag}] " in log
    assert f"--data_dir {out / 'data' / 'limit'}" in log and f"--data_dir {data_dir} " not in log
    # resumed where the recorded paths differ (another checkout): the cycle's detector keeps its record; the heldout
    # detector's, whose memorised text is named, is measured again on its generator's own (1 - h) D
    dets = {"cycle": out / "cycle_1" / "detect.done.json", "held": out / "cycle_1" / "heldout" / "detector" / "detect.done.json"}
    for p in dets.values():
        p.write_text(json.dumps({**json.loads(p.read_text()), "seen_text": "/elsewhere"}))
    # --archive: each finished seed kept without its checkpoints; a run whose directory was lost (a machine that came
    # back empty) resumes from it, here in another directory: replicate 0 from its record, reading none of its
    # checkpoints; a new seed trains at replicate 0's grid choice and is judged by the judge kept as weights alone
    arch = tmp_path / "archive"
    r = run_script(cmd + ["--archive", str(arch)], cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert json.loads(dets["cycle"].read_text())["seen_text"] == "/elsewhere"
    assert json.loads(dets["held"].read_text())["seen_text"] == str(out / "data" / "limit_fit")
    assert sorted(str(p.relative_to(arch)) for p in arch.rglob("*") if p.is_file()) == [
        "archive.json", "cycle_0/base.done.json", "cycle_0/judge.done.json", "cycle_0/judge/ckpt.pt",
        "cycle_0/more_data.done.json", "cycle_1/grid.done.json", "cycle_1/heldout/grid.done.json",
        "reference.done.json", "replicate.done.json"]
    assert torch.load(arch / "cycle_0/judge/ckpt.pt", weights_only=True)["optimizer"] is None
    before, samples = json.loads((out / "summary.json").read_text()), (out / "samples.md").read_text()
    out2 = tmp_path / "elsewhere"
    cmd2 = [str(out2) if w == str(out) else w for w in cmd] + ["--seeds", "2", "--archive", str(arch)]
    r = run_script(cmd2, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    after = json.loads((out2 / "summary.json").read_text())
    moved = json.loads(json.dumps(before["generators"]).replace(str(out), str(out2)))
    assert [g for g in after["generators"] if not g["replicate"]] == moved
    assert {g["replicate"] for g in after["generators"]} == {0, 1}
    log = (out2 / "steps.log").read_text()
    assert "cycle_0/judge " not in log and "seed_1/cycle_0/base_grid/continued " in log
    # a seed past 0 trains its cycle-0 models at once (limit.train_together), each as soon as what it needs has ended:
    # each grid's one point and its continuation, the ensemble's members and its student; each once, and none again
    # where base(), more_data(), ensemble() and the others ask for it
    point = f"dropout{best['dropout']:g}_wd{best['weight_decay']:g}"
    grids = ("base_grid", "heldout_base", "more_data_grid")
    started = {d: log.index(f"--out_dir {out2}/seed_1/cycle_0/{d} ") for d in
               [f"{g}/{w}" for g in grids for w in (point, "continued")] + [f"ensemble/member{k}" for k in (1, 2, 3)]
               + ["ensemble/student"]}
    ended = {}  # (its last line: every line of a step comes before the launch of a step that waits on it)
    for d in started:
        tag = f"seed_1/cycle_0/{d}/train"
        assert f"[{tag}] " in log and log.count(f"--out_dir {out2}/seed_1/cycle_0/{d} ") == 1, d
        ended[d] = log.rindex(f"[{tag}] ")
    for g in grids:  # a continuation after its point, the student after MLE at its limit and every member
        assert ended[f"{g}/{point}"] < started[f"{g}/continued"], g
    needs = ["base_grid/continued"] + [f"ensemble/member{k}" for k in (1, 2, 3)]
    assert max(ended[d] for d in needs) < started["ensemble/student"]
    seed1 = json.loads((out2 / "seed_1" / "cycle_0" / "base.done.json").read_text())
    assert [(p["dropout"], p["weight_decay"]) for p in seed1["grid"]] == [(best["dropout"], best["weight_decay"])]
    assert not list((out2 / "seed_1").rglob("grid.done.json"))  # the tuned arms at replicate 0's points
    assert {g["tuned"]["from_replicate"] for g in after["generators"] if g["replicate"] and g.get("tuned")} == {0}
    t1 = [line for line in samples.splitlines() if "| 1.00 |" in line]  # replicate 0's rows at T = 1, kept
    assert t1 and t1 == [line for line in (out2 / "samples.md").read_text().splitlines() if "| 1.00 |" in line]
    assert (arch / "seed_1" / "replicate.done.json").exists()  # the new seed, kept as it finished
    # other arms cannot resume a replicate whose checkpoints are gone: refused before any step, naming the record
    cmd3 = [str(tmp_path / "third") if w == str(out) else w for w in cmd] + ["--archive", str(arch)]
    cmd3[cmd3.index("--arms") + 1] = "unfrozen,heldout,more_data"
    r = run_script(cmd3, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=900)
    assert r.returncode == 2 and "replicate.done.json was made with --arms " in r.stderr, r.stderr[-2000:]
    assert not (tmp_path / "third" / "cycle_0" / "base_grid").exists()  # nothing trained


def test_an_archive_restores_only_what_the_run_lacks_and_refuses_a_directory_that_is_not_one(tmp_path):
    arch, run_dir = tmp_path / "arch", tmp_path / "moved"
    (arch / "seed_1").mkdir(parents=True)
    (arch / "archive.json").write_text(json.dumps({"run_dir": "/made/here", "files": []}))
    (arch / "seed_1" / "replicate.done.json").write_text(json.dumps({"gen": "/made/here/seed_1/ckpt.pt",
                                                                     "other": "/made/here2/x", "dir": "/made/here",
                                                                     "ens": "/made/here/a.pt+/made/here/b.pt"}))
    (arch / "reference.done.json").write_text("{}")
    run_dir.mkdir()
    (run_dir / "reference.done.json").write_text('{"mine": 1}')
    assert archive.restore(str(arch), str(run_dir)) == 1  # the run's own file stays; paths move to the run directory
    assert json.loads((run_dir / "seed_1" / "replicate.done.json").read_text()) == {
        "gen": f"{run_dir}/seed_1/ckpt.pt", "other": "/made/here2/x", "dir": str(run_dir),  # whole path parts only
        "ens": f"{run_dir}/a.pt+{run_dir}/b.pt"}
    assert json.loads((run_dir / "reference.done.json").read_text()) == {"mine": 1}
    assert not (run_dir / "archive.json").exists()
    (arch / "archive.json").unlink()
    with pytest.raises(ProjectError, match="no archive.json: it is not a run's archive"):
        archive.restore(str(arch), str(run_dir))
    (tmp_path / "new").mkdir()
    assert archive.restore(str(tmp_path / "new"), str(run_dir)) == 0  # an archive not yet written: nothing to restore
    # a judge of the user's own (--judge_ckpt, outside the run) is not copied; the archive is still one
    (run_dir / "replicate.done.json").write_text("{}")
    (run_dir / "cycle_0").mkdir()
    (run_dir / "cycle_0" / "judge.done.json").write_text(json.dumps({"checkpoint": str(tmp_path / "judge.pt")}))
    assert archive.save(str(run_dir), str(tmp_path / "kept")) == [
        "replicate.done.json", "seed_1/replicate.done.json", "reference.done.json", "cycle_0/judge.done.json"]
    assert json.loads((tmp_path / "kept" / "archive.json").read_text())["run_dir"] == str(run_dir)


def test_a_continued_model_resumes_its_own_checkpoint_not_its_start(tmp_path):
    """cycle0_command: init_from (where the continuation starts) gives way to --resume once it has a checkpoint, as
    train.py refuses both at once."""
    run = SimpleNamespace(out_dir=str(tmp_path), judge_data_dir=None, data_dir="d", dev=[], extra={},
                          track=lambda d: [])
    settings = {"learning_rate": 5e-5, "init_from": "grid/ckpt.pt"}
    tdir, cmd = cycle0.cycle0_command(run, "base_grid/continued", "c.py", settings, 1)
    assert cmd[-2:] == ["--init_from", "grid/ckpt.pt"] and "--resume" not in cmd
    os.makedirs(tdir)
    open(os.path.join(tdir, "last.pt"), "w").close()
    _, cmd = cycle0.cycle0_command(run, "base_grid/continued", "c.py", settings, 1)
    assert cmd[-1] == "--resume" and "--init_from" not in cmd and "--learning_rate" in cmd


def test_the_copy_rate_counts_windows_found_verbatim_in_the_train_text():
    """Issue 78's memorisation measure: a sample cut from the train text copies every window, a random one none,
    and a sample whose first window alone is copied, one window in 32."""
    from experiment.measures import copy_rate, copy_window, train_windows
    rng = np.random.default_rng(0)
    train = rng.integers(0, 60, 5000)
    windows = train_windows(train, 32)
    assert len(windows) == 5000 - 31 and copy_window(65) == 32 and copy_window(50257) == 16  # (no two alike)
    copied = np.stack([np.concatenate([[7], train[s:s + 63]]) for s in (0, 100, 4000)])  # a prompt token, then text
    fresh = rng.integers(0, 60, (3, 64))
    assert copy_rate(copied, windows, 32) == 1.0 and copy_rate(fresh, windows, 32) == 0.0
    half = np.concatenate([copied[:, :33], fresh[:, 33:]], axis=1)  # 32 copied tokens, then fresh ones
    assert copy_rate(half, windows, 32) == pytest.approx(1 / 32)  # only the first of 32 windows lies in the copy
    assert copy_rate(copied[:, :20], windows, 32) is None  # samples shorter than a window


def test_the_lexicons_words_exclude_the_dev_slice(tmp_path):
    """The lexicon baseline is scored on reward data whose natural text comes from the dev slice: its vocabulary is the
    arms' train part (the D characters less the dev slice), which lacks a word that only the dev slice holds; the
    whole train split (what it read before issue 76) has it."""
    from experiment.measures import train_vocabulary
    words = "the and of to a in that is was he for it with as his on be at by".split()
    rng = np.random.default_rng(5)
    text = " ".join(rng.choice(words, 6000))
    D = 20000
    dev_from = D - round(D * 0.1)
    text = text[:dev_from + 500] + " zounds " + text[dev_from + 508:]  # a word inside the dev slice alone
    assert "zounds" not in text[:dev_from] and "zounds" not in text[D:]
    _, data_dir = prepare_char_data(str(tmp_path), text=text + " " + " ".join(rng.choice(words, 20000)))
    arms, _ = cycle0.data_limit(data_dir, str(tmp_path / "run"), D, {**preset("data_limit"), "judge_after": D})
    assert "zounds" not in train_vocabulary(Corpus(arms)) and "zounds" in train_vocabulary(Corpus(data_dir))
