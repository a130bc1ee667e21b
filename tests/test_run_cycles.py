"""run_cycles.py: one tiny cycle with both arms end to end, then reruns that resume instead of
redoing work; the output of steps on a terminal and elsewhere."""
import copy
import io
import json
import math
import os
import pathlib
import re
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from core.errors import ProjectError
from experiment import cycle0
from experiment.cycle0 import cycle0_note
from experiment.presets import DETECTORS, PRESETS, SMOKE_TRAIN, argv, preset, ratio_arm_settings
from experiment.report import check_finite_tree as finite_numbers, write_summary
from experiment.runner import StepOutput, StepRunner
from experiment.run import Run
from experiment.steps import ScriptStep
from helpers import make_text, run_script, tiny_train_config
from lib.prepare import prepare_corpus
from lib.rl_settings import GRPO_LEARNING_RATE

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, OMP_NUM_THREADS="1")


def run(args, cwd=ROOT, env=None):
    return run_script([os.path.join(ROOT, "run_cycles.py"), *args], cwd=cwd, env={**ENV, **(env or {})}, timeout=900)


def tiny_args(tmp_path, data_dir, cfg):
    return ["--preset", "quick", "--out_dir", str(tmp_path / "run"), "--data_dir", str(data_dir),
            "--base_config", str(cfg), "--max_cycles", "1", "--device", "cpu",
            "--detector", "frozen_last_token",  # the strong_trunk recipe has its own test
            "--quality_samples", "16", "--detect_blocks", "16", "--eval_batch_size", "16",
            "--extra_reward_data=--max_blocks_per_split 12 --samples_per_chunk 2 --gen_batch_size 16",
            "--extra_reward_model=--max_iters 20 --eval_interval 10 --batch_size 8",
            "--extra_grpo=--max_steps 3 --prompts_per_step 2 --group_size 4 --eval_interval 3 "
            "--save_interval 1", "--extra_judge=--max_iters 40 --lr_decay_iters 40"]


def parse_cpu(argv):
    """run_cycles' arguments for a test's Run, on CPU also where a GPU is visible (--device auto would take it)."""
    import run_cycles
    return run_cycles.parse_args(["--device", "cpu", *argv])


def launched(stdout):
    return [line for line in stdout.splitlines() if line.startswith("=== ")]


def test_the_presets_built_in_files_are_found_from_any_directory(tmp_path, monkeypatch):
    """The preset's corpus and config are the repository's, from its root (as nanoGPT is run: relative paths,
    as before) or from anywhere else (absolute); a --data_dir given stays the user's."""
    from experiment.runner import ROOT, root_path
    monkeypatch.chdir(ROOT)
    assert parse_cpu([]).data_dir == "data/shakespeare_char" and root_path("train.py") == "train.py"
    monkeypatch.chdir(tmp_path)
    assert parse_cpu([]).data_dir == os.path.join(ROOT, "data", "shakespeare_char")
    assert parse_cpu(["--preset", "gpt2"]).data_dir == os.path.join(ROOT, "data", "shakespeare")
    assert parse_cpu(["--data_dir", "data/shakespeare_char"]).data_dir == "data/shakespeare_char"
    assert root_path("config/train_shakespeare_char_cpu.py") == os.path.join(ROOT, "config", "train_shakespeare_char_cpu.py")
    assert os.path.isfile(root_path(PRESETS["default"]["base_config"]))


def test_check_finite_tree_names_the_first_non_finite_number():
    """The check run_cycles applies before writing summary.json, which the end-to-end tests apply to
    the file they read back (json.loads accepts NaN and Infinity)."""
    finite_numbers({"a": [1, 2.5, None, "x"], "b": {"c": -0.0}})
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(ProjectError, match=r"summary\.b\.c\[1\] is (nan|inf|-inf), not a finite number"):
            finite_numbers({"a": 1.0, "b": {"c": [0.5, bad]}})


GEN_KEYS = ("generator", "val_loss", "val_ppl", "real_word_rate", "distinct_2", "degenerate_share",
            "det_val_mae", "det_const_mae", "det_val_corr", "det_auroc", "det_lexicon_mae", "det_curve")


@pytest.mark.slow  # a whole run_cycles.py pipeline
def test_one_cycle_both_arms_end_to_end_then_resume(tmp_path, monkeypatch, capsys):
    data_dir = tmp_path / "tiny_char"
    (tmp_path / "input.txt").write_text(make_text(6000, seed=3))
    prepare_corpus(str(tmp_path / "input.txt"), str(data_dir), "char", 0.9, log=lambda *a: None)
    cfg = tmp_path / "tiny.py"
    cfg.write_text(tiny_train_config())

    r = run(tiny_args(tmp_path, data_dir, cfg))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = tmp_path / "run"
    # cycle 1 (both arms), then the final stage: cycle 2's detectors of both arms' generators
    for step in ("cycle_0/base", "cycle_0/judge", "cycle_0/eval", "cycle_1/reward_data", "cycle_1/reward_model", "cycle_1/detect",
                 "cycle_1/grpo", "cycle_1/eval", "cycle_1/null/grpo", "cycle_1/null/eval",
                 "cycle_1/control/mle", "cycle_1/control/eval",
                 "cycle_2/reward_data", "cycle_2/reward_model", "cycle_2/detect",
                 "cycle_2/control/reward_data", "cycle_2/control/reward_model", "cycle_2/control/detect",
                 "reference"):
        assert (out / f"{step}.done.json").exists(), step
    assert not (out / "cycle_1/control/reward_model").exists()  # cycle 1's detector is shared
    assert not (out / "cycle_2/grpo").exists()  # the final stage only detects
    assert (out / "summary.png").stat().st_size > 1000
    assert not (out / "run.lock").exists()  # a finished run leaves no lock file
    # the output went to a pipe: lines, not progress-bar redraws (text mode reads a redraw's \r as a newline, so
    # a redraw would show as the bar's first state)
    assert "reward:   0%" not in r.stdout and "reward: 100%" in r.stdout

    summary = json.loads((out / "summary.json").read_text())
    finite_numbers(summary)
    row = summary["cycles"][0]
    assert row["cycle"] == 1
    for key in ("gen_val_loss", "gen_val_ppl", "rm_val_mae", "rm_const_mae", "grpo_reward_start",
                "grpo_reward_end", "grpo_kl_final", "new_val_ppl", "rm_auroc", "rm_lexicon_mae",
                "grpo_updates", "grpo_completion_tokens", "control_val_ppl"):
        assert row[key] is not None, key
    assert abs(row["gen_val_ppl"] - 2.718281828 ** row["gen_val_loss"]) < 1e-3
    gens = {(g["cycle"], g["arm"]): g for g in summary["generators"]}
    assert sorted(gens) == [(0, "base"), (1, "adversarial"), (1, "control"), (1, "null")]
    # the null arm: the adversarial step's GRPO with shuffled rewards, not measured by a detector
    null = gens.pop((1, "null"))
    assert null["det_skipped"] and math.isfinite(null["val_ppl"]) and null["generator"].endswith("cycle_1/null/grpo/ckpt.pt")
    assert json.loads((out / "cycle_1/null/grpo/grpo_summary.json").read_text())["shuffle_rewards"] is True
    # compute: the adversarial arm paid for the base, its detector and GRPO; the control for the base and MLE
    done = lambda step: json.loads((out / f"{step}.done.json").read_text())  # noqa: E731
    flops = lambda step: done(step)["flops"]["flops"]  # noqa: E731
    assert gens[(0, "base")]["compute_flops"] == flops("cycle_0/base") > 0
    assert gens[(1, "adversarial")]["compute_flops"] == pytest.approx(
        flops("cycle_0/base") + flops("cycle_1/reward_data") + flops("cycle_1/reward_model") + flops("cycle_1/grpo"))
    assert gens[(1, "control")]["compute_flops"] == pytest.approx(flops("cycle_0/base") + flops("cycle_1/control/mle"))
    assert null["compute_flops"] == pytest.approx(
        flops("cycle_0/base") + flops("cycle_1/reward_data") + flops("cycle_1/reward_model") + flops("cycle_1/null/grpo"))
    for key, g in gens.items():
        for k in GEN_KEYS:
            assert g[k] is not None, (key, k)
        assert 0 <= g["real_word_rate"] <= 1 and 0 <= g["det_auroc"] <= 1 and g["det_curve"][0][0] == 0
    assert gens[(0, "base")]["detector"] == "cycle_1"
    assert gens[(1, "adversarial")]["detector"] == "cycle_2" and gens[(1, "adversarial")]["det_final_stage"]
    assert gens[(1, "control")]["detector"] == "cycle_2/control"
    assert gens[(0, "base")]["det_val_mae"] == row["rm_val_mae"]
    ref = summary["natural_reference"]
    assert ref["samples"] == 16 and 0 < ref["real_word_rate"] <= 1
    assert len(summary["verdicts"]) == 7 and summary["verdicts"][1].startswith("val perplexity: ")
    md = (out / "summary.md").read_text()
    assert "| 1 | control |" in md and "| 0 | base |" in md and "## Verdicts" in md
    assert "stopped: max_cycles (1) reached" in md
    assert f"Corpus: {data_dir}, prepared from input.txt (user file, " in " ".join(md.split())  # the corpus it ran on
    assert md.splitlines()[2].startswith("Run: commit `") and ", preset quick, device cpu (" in md.splitlines()[2] \
        and " cores), precision float32, run time " in md.splitlines()[2]  # what ran, on what, at the top
    # the headline verdicts: the adversarial and null arms against the control's temperature frontier
    # (no detector trunk with this detector: no compute-matched control)
    fr = summary["frontier"]["cycle_1"]
    assert sorted(fr["arms"]) == ["adversarial", "null"] and sorted(fr["controls"]) == ["control"]
    adv = fr["arms"]["adversarial"]
    v = adv["verdicts"]["control"]
    assert v["verdict"] in ("beyond", "inside", "tie", "mixed", "out of range")
    for m in ("at_quality", "at_coverage"):
        assert v[m]["verdict"] in ("beyond", "inside", "tie", "out of range")
    temps = ["0.5", "0.7", "1", "1.4", "2"]  # the quick preset's own sweep
    assert sorted(fr["controls"]["control"]["curve"], key=float) == sorted(adv["curve"], key=float) == temps
    assert set(v["along_curve"]) == set(temps) and fr["replicates"] == 1
    for key in ("real_word_rate", "distinct_2", "degenerate_share", "val_ppl", "judge_nll", "val_loss"):
        assert fr["controls"]["control"]["curve"]["1"][key] == pytest.approx(gens[(1, "control")]["frontier"]["1"][key])
    assert len(gens[(1, "control")]["frontier"]["1"]["judge_items"]) == 16  # one judge NLL per sample
    # T = 1 of the sweep is the generator's own measurement
    assert gens[(1, "adversarial")]["frontier"]["1"]["val_ppl"] == pytest.approx(gens[(1, "adversarial")]["val_ppl"])
    assert gens[(1, "adversarial")]["frontier"]["1"]["real_word_rate"] == gens[(1, "adversarial")]["real_word_rate"]
    assert summary["frontier_verdicts"][0].startswith("cycle 1 (1 seed, provisional), T = 1: the adversarial arm (GRPO) "
                                                      "vs the same-budget MLE control: **")
    assert "## Verdict on the quality-coverage frontier" in md and "(frontier_cycle_1.png)" in md
    assert "| 1 | null |" in md and "| 1 | adversarial |" in md
    assert (out / "frontier_cycle_1.png").stat().st_size > 1000
    # the mechanism (issue 78): the detector's P(natural) on train, val and generated text, and its figure
    mech = json.loads((out / "cycle_1" / "detect.done.json").read_text())["mechanism"]
    assert {"train", "val", "generated"} <= set(mech) and 0 <= mech["memorised_auroc"] <= 1
    assert (out / "cycle_1" / "mechanism.png").stat().st_size > 1000
    # samples a reader can see: natural text and every generator on the same prompts, linked from summary.md
    assert "[samples.md](samples.md)" in md
    samples = (out / "samples.md").read_text()
    assert samples.count("## Prompt ") == 4 and samples.count("| natural text |") == 4
    for who in ("cycle 0 base", "cycle 1 adversarial", "cycle 1 control", "cycle 1 null"):
        assert samples.count(f"| {who} | 1.00 |") == 4, who
    # and the control at summary.md's T* (matched quality), the only other temperature shown
    q = v["at_quality"]
    matched = [] if q["verdict"] == "out of range" else [
        f"| cycle 1 control at T* (the quality of cycle 1 adversarial) | {q['t_star']:.2f} |"]
    assert all(samples.count(row) == 4 for row in matched)
    assert sum(line.startswith("| cycle") for line in samples.splitlines()) == 4 * (4 + len(matched))

    # TensorBoard (on by default with tensorboard installed): one directory per step under tb/, in
    # which GRPO's reward, KL and entropy curves read back, and the run's figures and verdict
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    assert {"cycle_0_base", "cycle_1_reward_model", "cycle_1_grpo", "cycle_1_control_mle",
            "summary"} <= set(os.listdir(out / "tb")), os.listdir(out / "tb")
    assert f"--tensorboard_dir {out / 'tb' / 'cycle_1_grpo'}" in (out / "steps.log").read_text()
    acc = EventAccumulator(str(out / "tb" / "cycle_1_grpo"))
    acc.Reload()
    for name in ("step/reward_mean", "step/kl", "step/entropy"):
        assert [e.step for e in acc.Scalars(name)] == [1, 2, 3], name
    acc = EventAccumulator(str(out / "tb" / "summary"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("control/val_ppl")] == [1]
    assert acc.Scalars("adversarial/real_word_rate")[0].value == pytest.approx(
        gens[(1, "adversarial")]["real_word_rate"])
    verdict = acc.Tensors("verdict/text_summary")[0].tensor_proto.string_val[0].decode()
    assert verdict.startswith("cycle 1 (1 seed, provisional), T = 1: the adversarial arm (GRPO) vs"), verdict

    # the control arm had GRPO's budget: as many updates, about as many tokens per update
    budget = json.loads((out / "cycle_1/grpo.done.json").read_text())["budget"]
    mle = json.loads((out / "cycle_1/control/mle.done.json").read_text())
    assert budget["steps"] == 3 and budget["updates"] == 3 and budget["seq_len"] == 32
    assert mle["iters"] == budget["updates"] and mle["block_size"] == budget["seq_len"]
    assert abs(mle["batch_size"] * mle["block_size"] - budget["tokens_per_step"]) <= mle["block_size"] / 2
    assert mle["learning_rate"] == PRESETS["quick"]["grpo"].get("learning_rate", GRPO_LEARNING_RATE)  # GRPO's lr
    assert gens[(1, "control")]["generator"].endswith("cycle_1/control/mle/last.pt")
    assert gens[(1, "control")]["val_ppl"] != gens[(0, "base")]["val_ppl"]  # MLE moved it

    # finished run: nothing is redone, and the summary (its figures, 3 s) is written once, at the end, not
    # also after the resumed cycle (run in this process, to count the writes)
    import run_cycles
    written = []
    monkeypatch.setattr(run_cycles, "write_summary", lambda *a, figures=True: written.append(
        (a[4].get("stop_reason"), figures)) or write_summary(*a, figures=figures))
    capsys.readouterr()
    run_cycles.main(tiny_args(tmp_path, data_dir, cfg))
    rerun = capsys.readouterr().out
    assert not launched(rerun), launched(rerun)
    assert ": evaluating " not in rerun and "measuring the detector" not in rerun
    assert written == [("max_cycles (1) reached", True)], written
    assert json.loads((out / "summary.json").read_text())["generators"] == summary["generators"]

    # lose GRPO's and the control step's markers (as if killed during GRPO): only those two run
    # again, each through its own resume; the cycle's summary is written without its figures (seconds, for a
    # cycle of seconds: the end draws them)
    for f in ("grpo.done.json", "eval.done.json", "control/mle.done.json"):
        (out / "cycle_1" / f).unlink()
    written.clear()
    run_cycles.main(tiny_args(tmp_path, data_dir, cfg))
    steps = launched(capsys.readouterr().out)
    assert written == [("running", False), ("max_cycles (1) reached", True)], written
    assert len(steps) == 2, steps
    assert "GRPO" in steps[0] and "--resume" in steps[0], steps
    assert "control MLE" in steps[1] and "--resume" in steps[1], steps
    assert json.loads((out / "summary.json").read_text())["generators"] == summary["generators"]

    # the control step lost with its directory: it reruns from the previous generator and gives
    # the same control generator; a cycle as long as FIGURES_AFTER_S (here any) redraws its figures itself
    import shutil
    shutil.rmtree(out / "cycle_1/control/mle")
    (out / "cycle_1/control/mle.done.json").unlink()
    (out / "cycle_1/control/eval.done.json").unlink()
    written.clear()
    monkeypatch.setattr(run_cycles, "FIGURES_AFTER_S", 0)
    run_cycles.main(tiny_args(tmp_path, data_dir, cfg))
    assert written == [("running", True), ("max_cycles (1) reached", True)], written
    steps = launched(capsys.readouterr().out)
    assert len(steps) == 1 and "control MLE" in steps[0], steps
    assert steps[0].endswith(f"--init_from {gens[(0, 'base')]['generator']}"), steps
    after = {(g["cycle"], g["arm"]): g for g in json.loads((out / "summary.json").read_text())["generators"]}
    assert after[(1, "control")]["val_loss"] == pytest.approx(gens[(1, "control")]["val_loss"], abs=1e-6)


@pytest.mark.slow  # a command line run in a subprocess
def test_bad_base_ckpt_is_a_clear_error(tmp_path):
    r = run(["--base_ckpt", str(tmp_path / "nope.pt"), "--out_dir", str(tmp_path / "o")])
    assert r.returncode == 2
    assert "error: --base_ckpt" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow  # a command line run in a subprocess
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


def test_presets_name_known_detectors_and_the_switch_wins(tmp_path):
    for name, p in PRESETS.items():
        assert p["detector"] in DETECTORS, name
        for key in ("base", "reward_data", "reward_model", "grpo", "control"):
            assert isinstance(p[key], dict), (name, key)
        for key in ("control_arm", "control_detector", "final_detector"):
            assert isinstance(p[key], bool), (name, key)
    assert all(p["detector"] == "ratio_features" for p in PRESETS.values())  # every preset's (issue 61)
    assert PRESETS["demo"]["detector_trunk"] is not None
    assert DETECTORS["frozen_last_token"] == {"unfreeze_last_n_blocks": 0}
    args = parse_cpu(["--preset", "demo", "--detector", "frozen_last_token"])
    c = Run(args, PRESETS["demo"], str(tmp_path))
    assert c.detector_name == "frozen_last_token"
    assert c.control and c.skip_control_detector is None and c.skip_final_detector is None
    # the --no_* flags turn off what a preset turns on, and say so in summary.json's det_skipped
    args = parse_cpu(["--no_control_detector", "--no_final_detector", "--control_learning_rate", "1e-4"])
    c = Run(args, PRESETS["default"], str(tmp_path))
    assert (c.skip_control_detector, c.skip_final_detector, c.control_lr) == \
        ("--no_control_detector", "--no_final_detector", 1e-4)
    c = Run(parse_cpu(["--preset", "quick"]), {**PRESETS["quick"], "control_detector": False}, str(tmp_path))
    assert c.skip_control_detector == "preset 'quick' has no control detectors"


def test_presets_are_data_turned_into_flags_by_one_function():
    """Every step's settings are a dict of flag -> value (no flag strings); argv() alone makes the words:
    True is a switch, None and False leave a flag out."""
    for name, p in PRESETS.items():
        for key in ("base", "detector_trunk", "judge", "reward_data", "reward_model", "grpo", "control"):
            for flag, value in (p[key] or {}).items():
                assert not flag.startswith("-") and not (isinstance(value, str) and value.startswith("--")), (name, key)
    assert argv({"max_iters": 4000, "learning_rate": 1e-3, "per_position": True, "init_trunk_from": None,
                 "allow_split_mismatch": False, "decay_lr": "False", "patience": 0}) == \
        ["--max_iters", "4000", "--learning_rate", "0.001", "--per_position", "--decay_lr", "False", "--patience", "0"]
    assert argv(DETECTORS["strong_trunk"]) == ["--per_position", "--lm_features", "--unfreeze_last_n_blocks", "0"]
    args = parse_cpu(["--arms", "logit,ptx", "--logit_beta", "0.5"])
    assert ratio_arm_settings(args) == {"logit": {"reward": "logit", "kl_in_reward": True, "beta": 0.5,
                                                  "advantage": "mean"}, "ptx": {"ptx_coef": 1.0}}


def test_help_shows_every_set_default_once(capsys):
    """python run_cycles.py --help: one line a flag, a default that is set shown once as (default: X); a flag whose
    default is "the preset's" (None) says so in docs/flags.md, not as (default: None)."""
    import re
    with pytest.raises(SystemExit):
        parse_cpu(["--help"])
    text = capsys.readouterr().out
    blocks = re.split(r"\n  (?=-)", text[text.index("options:"):])[1:]
    flags = {b.split()[0].rstrip(","): b.count("default:") for b in blocks if not b.startswith("-h")}
    assert len(flags) > 40 and {f: n for f, n in flags.items() if n > 1} == {}
    assert "(default: 1337)" in text and "(default: None)" not in text and "(default: )" not in text


@pytest.mark.slow  # a whole run_cycles.py pipeline
def test_strong_trunk_detector_reads_the_given_stronger_lm(tmp_path):
    """--detector strong_trunk: every reward model is a per-position head with LM features on the
    frozen trunk of --detector_trunk_ckpt; without a trunk it is a clear error."""
    data_dir = tmp_path / "tiny_char"
    (tmp_path / "input.txt").write_text(make_text(6000, seed=3))
    prepare_corpus(str(tmp_path / "input.txt"), str(data_dir), "char", 0.9, log=lambda *a: None)
    cfg = tmp_path / "tiny.py"
    cfg.write_text(tiny_train_config())
    args = tiny_args(tmp_path, data_dir, cfg) + ["--detector", "strong_trunk", "--no_control_detector",
                                                 "--no_final_detector", "--arms", "sir,logit,ptx", "--sir_n", "4"]
    from core.errors import ProjectError
    c = Run(parse_cpu(["--detector", "strong_trunk", "--preset", "quick"]),
              {**PRESETS["quick"], "detector_trunk": None}, str(tmp_path / "none"))
    with pytest.raises(ProjectError, match="needs a stronger LM's trunk, and preset 'quick' trains none"):
        cycle0.detector_trunk(c, "unused.py")
    # a "stronger" LM: the same tiny config trained longer
    trunk_dir = tmp_path / "trunk"
    t = run_script(["train.py", "--config", cfg, "--data_dir", data_dir, "--out_dir", trunk_dir, "--max_iters", "40",
                    "--lr_decay_iters", "40"], cwd=ROOT, env=ENV)
    assert t.returncode == 0, t.stderr[-3000:]
    r = run(args + ["--detector_trunk_ckpt", str(trunk_dir / "ckpt.pt")])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    import torch
    ck = torch.load(tmp_path / "run/cycle_1/reward_model/reward_ckpt.pt", weights_only=True, map_location="cpu")
    assert ck["model_extra"]["reward_per_position"] and ck["model_extra"]["reward_lm_features"]
    assert ck["reward_training"]["init_trunk_from"]["path"] == str(trunk_dir / "ckpt.pt")
    assert ck["reward_training"]["unfreeze_last_n_blocks"] == 0
    summary = json.loads((tmp_path / "run/summary.json").read_text())
    assert summary["detector"] == "strong_trunk"
    assert summary["detector_trunk"]["checkpoint"] == str(trunk_dir / "ckpt.pt")
    finite_numbers(summary)
    # the compute-matched control: the detector trunk on the frontier; every arm is judged against it too
    gens = {(g["cycle"], g["arm"]): g for g in summary["generators"]}
    assert gens[(0, "trunk")]["generator"] == str(trunk_dir / "ckpt.pt")
    assert gens[(0, "trunk")]["compute_flops"] is None  # given on the command line: its cost is unknown
    fr = summary["frontier"]["cycle_1"]
    assert sorted(fr["controls"]) == ["control", "trunk"]
    for arm in ("adversarial", "null"):
        assert sorted(fr["arms"][arm]["verdicts"]) == ["control", "trunk"]
        assert fr["arms"][arm]["compute_flops"] > 0
    md = (tmp_path / "run/summary.md").read_text()
    assert "| 1 | adversarial |" in md and "| trunk |" in md
    # --arms: the density-ratio arms from the cycle's entering generator (the base), on the frontier
    assert {"sir", "logit", "ptx"} <= set(fr["arms"]) and sorted(fr["arms"]["sir"]["verdicts"]) == ["control", "trunk"]
    base = gens[(0, "base")]
    assert gens[(1, "sir")]["entering"] == [0, "base"] and gens[(1, "sir")]["sir_n"] == 4
    # SIR's FLOPs: its entering generator's, the detector's (reward data and training) and its own inference
    assert gens[(1, "sir")]["sir_inference_flops"] > 0
    assert gens[(1, "sir")]["compute_flops"] == base["compute_flops"] + json.loads(
        (tmp_path / "run/cycle_1/reward_data.done.json").read_text())["flops"]["flops"] + json.loads(
        (tmp_path / "run/cycle_1/reward_model.done.json").read_text())["flops"]["flops"] \
        + gens[(1, "sir")]["sir_inference_flops"]
    steps = (tmp_path / "run/steps.log").read_text()
    logit_cmd = next(line for line in steps.splitlines() if line.startswith("$ train_grpo.py") and "/logit/" in line)
    assert "--reward logit --kl_in_reward --beta 1.0 --advantage mean" in logit_cmd
    assert "--model_path " + base["generator"] in logit_cmd
    assert any("--ptx_coef 1.0" in line and "/ptx/" in line for line in steps.splitlines())
    for arm in ("logit", "ptx"):
        assert gens[(1, arm)]["compute_flops"] > gens[(1, "sir")]["compute_flops"]
    # the detector's information: upper >= lower at every n; the SIR arm's val NLL is the residual model's
    info = summary["information"]["cycle_1"]
    assert info["n"] == 4 and info["upper"] >= info["lower"][0]
    sir = json.loads((tmp_path / "run/cycle_1/sir/sir.done.json").read_text())
    assert sorted(sir["information"], key=int) == ["1", "2", "4"]
    assert gens[(1, "sir")]["val_loss"] == pytest.approx(base["val_loss"] - sir["information"]["4"]["lower"])
    assert set(info["took"]) >= {"sir", "logit", "ptx", "adversarial", "control", "trunk"}
    assert info["took"]["sir"][0] == pytest.approx(-sir["information"]["4"]["lower"])
    assert "## What the detector knows" in md
    r2 = run(args + ["--detector_trunk_ckpt", str(trunk_dir / "ckpt.pt")])  # resumes: nothing reruns
    assert r2.returncode == 0 and not launched(r2.stdout), launched(r2.stdout)
    assert "the residual model on" not in r2.stdout


def test_extra_flags_of_a_step_that_does_not_run_are_named(tmp_path, capsys):
    """--extra_base beside --base_ckpt (or --extra_ddo without the ddo arm) used to vanish in silence."""
    import run_cycles
    ck = tmp_path / "base.pt"
    ck.write_bytes(b"")  # check_args only looks for the file
    run_cycles.check_args(parse_cpu(["--base_ckpt", str(ck), "--extra_base=--bogus 1", "--extra_ddo=--seed 3",
                                     "--extra_null=--seed 3", "--no_null_arm", "--extra_grpo=--seed 3"]))
    err = capsys.readouterr().err.splitlines()
    assert err == ["warning: --extra_base is ignored: --base_ckpt is given, so that model is not trained",
                   "warning: --extra_ddo is ignored: the ddo arm is not in --arms",
                   "warning: --extra_null is ignored: the null arm is off"]
    run_cycles.check_args(parse_cpu(["--arms", "ddo", "--extra_ddo=--seed 3", "--extra_base=--seed 3"]))
    assert capsys.readouterr().err == ""


def test_extra_words_are_read_by_their_steps_parsers_before_any_step(tmp_path, monkeypatch, capsys):
    """A misspelt flag or a bad value in --extra_<step> was found only when that step started, after the
    base model (and every step before it) had trained; now each step's own parser reads its words first,
    from wherever run_cycles is started, and every refusal is in one error."""
    import run_cycles
    monkeypatch.chdir(tmp_path)
    (tmp_path / "more.py").write_text("max_iters = 7\n")  # train.py's config file, relative to the run
    good = ["--extra_base=more.py --max_iters 3", "--extra_grpo=--learning_rate 1e-4 --max_steps 2",
            "--extra_reward_data=--block_size 64", "--extra_reward_model=--batch_size 8", "--extra_null=--seed 3"]
    run_cycles.check_args(parse_cpu(good))
    bad = ["--extra_base=--max_iters abc", "--extra_grpo=--learnin_rate 1e-4", "--extra_judge=nowhere.py",
           "--extra_reward_model=--batch_size 8 stray", "--arms", "ddo", "--extra_ddo=--objective nope",
           "--base_config", "no_base.py"]
    with pytest.raises(ProjectError) as e:
        run_cycles.check_args(parse_cpu(bad))
    refused = e.value.message.split("; --extra_")
    assert len(refused) == 5, e.value.message
    # the config file read by train.py's own parser, last
    assert refused[-1].endswith("; --base_config no_base.py: config file no_base.py not found"), refused
    assert "--extra_base='--max_iters abc': argument --max_iters: invalid int value: 'abc'" in refused[0]
    assert "grpo='--learnin_rate 1e-4': unknown flag --learnin_rate" in refused, refused
    assert any(r.startswith("judge='nowhere.py': config file nowhere.py not found") for r in refused), refused
    assert any(r.endswith("unrecognized arguments: stray") for r in refused), refused
    assert any("argument --objective: invalid choice: 'nope'" in r for r in refused), refused
    # each script's own suggestion (train.py's closest flag, its config/ hint), else its --help
    fixes = e.value.suggestion.split("; ")
    assert "did you mean --learning_rate? see python train_grpo.py --help for the flags" in fixes, fixes
    assert "see config/ for the presets" in fixes and "see python train_spin.py --help" in fixes, fixes
    assert os.listdir(tmp_path) == ["more.py"]  # nothing ran past the parsers
    assert capsys.readouterr().err == ""  # nor printed anything: the steps print their own warnings


def test_extra_words_are_read_in_this_process_by_the_scripts_own_definitions(monkeypatch):
    """The child process that ran each script's main() with argparse's parse_args monkeypatched is gone: the
    words are read here, by the parsers the scripts themselves build (lib/settings.py, lib/rl_settings.py), defaults included."""
    import subprocess
    from experiment.cli import parse_settings, step_settings
    from lib.rl_settings import grpo_args
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail(f"a child process: {a}"))
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail(f"a child process: {a}"))
    words = ["--learning_rate", "2e-5", "--beta", "0.2"]
    read = parse_settings("train_grpo.py", words)
    script = vars(grpo_args(["--model_path", "m", "--reward_model_path", "r", *words]))
    assert read["learning_rate"] == 2e-5 and read["beta"] == 0.2 and read["group_size"] == script["group_size"]
    common = set(read) & set(script) - {"model_path", "reward_model_path", "reward_threshold"}  # (set after parsing)
    assert len(common) > 40 and {k: read[k] for k in common} == {k: script[k] for k in common}
    with pytest.raises(ProjectError, match="^train_grpo.py --group_size x: argument --group_size: invalid int"):
        parse_settings("train_grpo.py", ["--group_size", "x"])
    with pytest.raises(ProjectError, match="would print its help") as e:
        step_settings("train_spin.py", ["--help"])
    assert e.value.suggestion == "--help is not for a step"
    assert step_settings("prepare_reward_data.py", ["--samples_per_chunk", "3"])["samples_per_chunk"] == 3


def test_a_base_config_that_is_no_config_file_is_refused_in_this_process(tmp_path, monkeypatch):
    """Missing, a directory, a syntax error: read in the run's own process, at once."""
    import subprocess
    import run_cycles
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail(f"a child process: {a}"))
    (tmp_path / "bad.py").write_text("n_layer = = 2\n")
    for path, why in [(tmp_path / "none.py", " not found"), (tmp_path, " is a directory"),
                      (tmp_path / "bad.py", ": syntax error on line 1")]:
        with pytest.raises(ProjectError, match="^" + re.escape(f"--base_config {path}: config file {path}{why}") + "$"):
            run_cycles.check_args(parse_cpu(["--base_config", str(path)]))


def test_arms_flag_is_checked_and_long_windows_are_refused_at_the_first_reward_dataset(tmp_path):
    import run_cycles
    with pytest.raises(ProjectError, match="unknown arm"):
        run_cycles.check_args(parse_cpu(["--arms", "sir,dpo"]))
    for bad in (["--ddo_rounds", "0"], ["--ddo_alpha", "0"], ["--ddo_beta", "-1"], ["--ddo_learning_rate", "0"]):
        with pytest.raises(ProjectError, match=bad[0]):
            run_cycles.check_args(parse_cpu(["--arms", "ddo"] + bad))
    for flag in ("--ddo_alpha", "--spin_beta", "--logit_beta", "--ptx_coef", "--control_learning_rate",
                 "--spin_nll_coef", "--progress_interval"):  # NaN fails every comparison: refused, not run
        with pytest.raises(ProjectError, match=f"^{flag} must be .*, got nan$"):
            run_cycles.check_args(parse_cpu([flag, "nan"]))
    with pytest.raises(ProjectError, match="^--progress_interval must be > 0, got -1.0$"):
        run_cycles.check_args(parse_cpu(["--progress_interval", "-1"]))
    with pytest.raises(ProjectError, match="positive, finite and include 1.0"):
        run_cycles.check_args(parse_cpu(["--temps", "0.5,1,inf"]))
    a = parse_cpu(["--preset", "demo", "--arms", " spin,ptx,sir "])
    run_cycles.check_args(a)
    assert a.arms == ["ptx", "sir", "spin"]
    c = Run(a, preset("demo"), str(tmp_path))
    c.eval_block_size = c.sample_len = 64
    c.check_ratio_windows(64)  # blocks as long as the windows
    c.check_ratio_windows(None)  # an older run's record without N: the SIR step checks
    with pytest.raises(ProjectError, match="val windows of 64 tokens and samples of 64 with a detector of 32"):
        c.check_ratio_windows(32)
    # N is the reward-data step's own record, checked before the reward model (and GRPO, the arms) run
    c.reward_data = lambda d, gen, seed, label, natural_dir=None: {"dir": d, "block_size": 32, "flops": None}
    c.reward_model = lambda *a: pytest.fail("the reward model ran before the check")
    with pytest.raises(ProjectError, match="with a detector of 32-token blocks"):
        c.detector(str(tmp_path / "cycle_1"), "gen.pt", "1", "cycle 1")
    c.arms = {"spin"}
    c.check_ratio_windows(32)
    b = parse_cpu(["--arms", "logit", "--detector", "frozen_last_token"])
    run_cycles.check_args(b)
    with pytest.raises(ProjectError, match="last-token head"):
        Run(b, preset("quick"), str(tmp_path))


def test_summary_md_names_the_corpus_and_says_which_way_inside_goes():
    from experiment.report import corpus_line
    from experiment.verdicts import frontier_section
    line = corpus_line({"data_dir": "/d/shakespeare_char", "data_source": "input.txt (existing file, 9 characters)"})
    assert line == "Corpus: /d/shakespeare_char, prepared from input.txt (existing file, 9 characters).\n\n"
    text = " ".join(frontier_section({}, ["a verdict"]).split())  # as a reader sees it: wrapped lines joined
    assert "**inside** = the arm lies inside the control's frontier (the control wins)" in text
    assert "**beyond** = the arm lies beyond the control's frontier (the arm wins)" in text


def fake_generator(cycle, arm, judge, val, flops, det=None, detector=None, final_stage=False):
    """A summary.json generator entry whose frontier is `judge` and `val` ({T: nats/token}), with
    per-item noise of its own, and optionally a fresh detector's (val MAE, lexicon MAE)."""
    import numpy as np
    rng = np.random.default_rng(abs(hash((cycle, arm))) % 2**32)
    curve = {f"{t:g}": {"judge_nll": j, "judge_items": list(j + rng.normal(0, 0.05, 16)), "val_loss": val[t],
                        "val_items": list(val[t] + rng.normal(0, 0.005, 16)), "val_ppl": math.exp(val[t])}
             for t, j in judge.items()}
    g = {"cycle": cycle, "arm": arm, "replicate": 0, "generator": f"{arm}.pt", "val_loss": val[1.0],
         "val_ppl": math.exp(val[1.0]), "judge_nll": judge[1.0], "real_word_rate": 0.6, "words": 400,
         "distinct_2": 0.9, "bigrams": 400, "degenerate_share": 0.0, "samples": 16, "examples": [],
         "frontier": curve, "mauve": None, "compute_flops": flops, "detector": None, "det_final_stage": None,
         "det_skipped": "not measured"}
    if det:
        g.update(detector=detector, det_final_stage=final_stage, det_skipped=None, det_val_mae=det[0],
                 det_val_mae_se=0.01, det_const_mae=0.25, det_lexicon_mae=det[1], det_auroc=0.7, det_auroc_se=0.02)
    return g


def fake_run(trunk_flops=1.68e13):
    """The records of a finished one-cycle run: base, trunk, the adversarial arm and the control."""
    temps = (0.5, 1.0, 2.0)
    mle = lambda shift: ({t: 1.6 + 0.4 * math.log2(t) * 1.5 + 0.4 + shift for t in temps},  # noqa: E731
                         {t: 2.0 + 0.3 * math.log2(t) ** 2 + shift for t in temps})
    gens = [fake_generator(0, "base", *mle(0.1), 8.4e12, det=(0.226, 0.151), detector="cycle_1"),
            fake_generator(0, "trunk", *mle(-0.1), trunk_flops),
            fake_generator(1, "adversarial", {0.5: 1.5, 1.0: 1.9, 2.0: 2.6}, {0.5: 2.6, 1.0: 2.2, 2.0: 2.9}, 3.55e13,
                           det=(0.20, 0.14), detector="cycle_2", final_stage=True),
            fake_generator(1, "control", *mle(0.09), 9.46e12, det=(0.21, 0.23), detector="cycle_2/control",
                           final_stage=True)]
    rows = [{"cycle": 1, "grpo_reward_start": 0.4, "grpo_reward_end": 0.6}]
    reference = {"samples": 16, "sample_len": 64, "real_word_rate": 0.9, "distinct_2": 0.85, "degenerate_share": 0.0}
    meta = {"preset": "default", "commit": "abc1234", "seconds_this_invocation": 706.4, "data_dir": "/d/char",
            "settings": {"device": "cuda", "device_name": "NVIDIA H100 80GB HBM3", "dtype": "bfloat16"},
            "stop_reason": "max_cycles (1) reached"}
    return rows, gens, reference, meta


def test_summary_md_names_what_training_a_detector_loses_and_the_game_by_cycle(tmp_path):
    """With the ideal-detector arm (--arms ratio): each detector arm's gain over its entering generator at matched
    quality as a fraction of the ideal arm's; and a run of two cycles gets the game's table: each cycle's
    detector's AUROC on the generator entering it, the adversarial arm's degenerate share, its verdicts."""
    from experiment.verdicts import ideal_fractions
    rows, gens, reference, meta = fake_run()
    temps = (0.5, 1.0, 2.0)
    mle = lambda shift: ({t: 1.6 + 0.4 * math.log2(t) * 1.5 + 0.4 for t in temps},  # noqa: E731
                         {t: 2.0 + 0.3 * math.log2(t) ** 2 + shift for t in temps})
    # the same quality as the base at T = 1, better coverage: 0.1 nats the ideal arm, 0.05 the adversarial one
    gens += [{**fake_generator(1, "ratio", *mle(0.0), 3.0e13), "entering": [0, "base"]}]
    adv = next(g for g in gens if g["arm"] == "adversarial")
    adv["frontier"] = fake_generator(1, "adversarial", *mle(0.05), 3.55e13)["frontier"]
    fr_ = ideal_fractions(gens)[1]
    assert fr_["ideal"][0] == pytest.approx(0.1, abs=0.01) and fr_["adversarial"][2] == pytest.approx(0.5, abs=0.1)
    rows = [{**rows[0], "rm_auroc": 0.91}, {"cycle": 2, "rm_auroc": 0.97, "replicate": 0}]
    before = copy.deepcopy(gens)
    write_summary(str(tmp_path), rows, gens, reference, meta)
    assert gens == before  # the run's own entries: a summary written mid-run must not leak into replicate records
    md = (tmp_path / "summary.md").read_text()
    assert "## What training a detector loses" in md and "| 1 | adversarial | +0.05" in md
    assert "## The game, cycle by cycle" in md and "| 1 | 0.910 | 0.000 | " in md and "| 2 | 0.970 | - | - | - |" in md
    assert "| final stage | 0.700 | - | - | - |" in md
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["ideal_fractions"]["cycle_1"]["adversarial"][2] == pytest.approx(0.5, abs=0.1)


def test_the_commit_stamp_of_a_checkout_copied_without_git(tmp_path, monkeypatch):
    """A checkout copied to a GPU machine stamps its results with $CODE_COMMIT, which the copier recorded,
    whether it came without .git or with a stale one (as the H100 run's did); without the variable, None
    outside a git checkout."""
    from experiment import report
    monkeypatch.setenv("CODE_COMMIT", "0123abc")
    assert report.code_commit() == "0123abc"  # a git checkout too (if this is one): the copier's record wins
    monkeypatch.setattr(report, "ROOT", str(tmp_path))  # not a git checkout
    assert report.code_commit() == "0123abc"
    monkeypatch.delenv("CODE_COMMIT")
    assert report.code_commit() is None


def test_the_commit_stamp_of_a_git_checkout_is_its_head(monkeypatch):
    """Without $CODE_COMMIT the stamp is git's HEAD (a copy without .git, as the GPU machine gets, skips)."""
    from experiment import report
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=report.ROOT, capture_output=True, text=True)
    if head.returncode != 0 or not os.path.exists(os.path.join(report.ROOT, ".git")):
        pytest.skip("not a git checkout (a copy of the tracked files)")
    monkeypatch.delenv("CODE_COMMIT", raising=False)
    own = report.code_commit()
    assert own is not None and own.split("+")[0] in head.stdout


def prose_lines(md):
    """summary.md's lines that are not table rows, headings, figures or the run's one-line stamp."""
    return [line for line in md.splitlines() if not line.startswith(("|", "#", "![", "Run: "))]


def test_summary_md_explains_itself(tmp_path, monkeypatch):
    """Read cold, summary.md says what ran (commit, preset, device, precision, time) on one line at the
    top, why the compute-matched control had less compute (with the ratio), that the lexicon baseline
    beat the trained detector, and its prose comes in lines a reader can read."""
    from experiment import report
    monkeypatch.setattr(report, "plot_frontiers", lambda *a: [])
    monkeypatch.setattr(report, "plot_cycle_summary", lambda *a, **k: None)
    md = report.write_summary(str(tmp_path), *fake_run())
    lines = md.splitlines()
    assert lines[2] == ("Run: commit `abc1234`, preset default, device cuda (NVIDIA H100 80GB HBM3), precision "
                        "bfloat16, run time 11 min 46 s (this invocation)."), lines[:4]
    text = " ".join(md.split())
    # the compute-matched control's compute against the arm's, the ratio and what it means for the verdict
    assert ("the longer-trained control had less compute than the arm: after cycle 1 it cost 1.68e+13 FLOPs, 0.47 "
            "times what the adversarial arm (GRPO) cost (3.55e+13). The comparison therefore favours the arm") in text
    assert "| trunk | 1.68e+13 (0.47x) |" in md  # beside the verdict too
    # the lexicon baseline against the detector, in a sentence beside the table
    assert ("The lexicon baseline detects better than the trained detector: its val MAE is lower for 2 of the 3 "
            "generators measured, cycle 0 base (0.151 vs 0.226, the detector GRPO trained against), cycle 1 "
            "adversarial (0.140 vs 0.200).") in text
    table_end = md.index("\n\n", md.index("| 1 | control |"))
    assert md[table_end:].lstrip().startswith("The lexicon baseline detects better")
    # no paragraph on one line: prose wraps at 100 characters, and no wrapped line starts a list or a sum
    assert max(len(line) for line in prose_lines(md)) <= 100
    assert [line for line in prose_lines(md) if line.lstrip().startswith(("+ ", "* ", "> "))] == []
    assert sum(line.startswith("- cycle 1 (1 seed, provisional), T = 1: ") for line in lines) == 2  # the verdicts

    # a trunk given on the command line has no known cost: said so, no ratio
    md = report.write_summary(str(tmp_path), *fake_run(trunk_flops=None))
    assert "its training cost is unknown and no arm's FLOPs count it" in " ".join(md.split())
    assert "times what the" not in md


def test_samples_md_shows_the_summarys_t_star_and_its_definition(tmp_path):
    """samples.md's matched rows are the controls at summary.md's T* (matched quality with the
    adversarial arm, as the verdict table prints it), and its introduction defines T* as summary.md
    does (the judge's NLL), not by the real-word rate."""
    from experiment.samples import sample_plan, write_samples
    from experiment.verdicts import frontier_report, verdict_table
    rows, gens, reference, meta = fake_run()
    report = frontier_report(gens)
    plan = [(g["cycle"], g["arm"], round(t, 6), label) for g, t, label in sample_plan(gens, report)]
    verdicts = report[1]["arms"]["adversarial"]["verdicts"]
    t_control, t_trunk = (verdicts[c]["at_quality"]["t_star"] for c in ("control", "trunk"))
    assert [(c, a, t) for c, a, t, _ in plan] == [
        (0, "base", 1.0), (0, "trunk", 1.0), (0, "trunk", round(t_trunk, 6)), (1, "adversarial", 1.0),
        (1, "control", 1.0), (1, "control", round(t_control, 6))]
    assert plan[5][3] == "cycle 1 control at T* (the quality of cycle 1 adversarial)"
    table = verdict_table(report)  # the same T*, as printed
    assert f"| control | 9.46e+12 (0.27x) | 1.9000 | {t_control:.2f}, val NLL " in table
    assert f"| trunk | 1.68e+13 (0.47x) | 1.9000 | {t_trunk:.2f}, val NLL " in table
    write_samples(str(tmp_path / "samples.md"), ["p"], ["n"], [(label, t, ["x"]) for _, _, t, label in plan])
    text = " ".join((tmp_path / "samples.md").read_text().split())
    assert "the same judge NLL" in text and "real-word rate" not in text
    assert f"| cycle 1 control at T* (the quality of cycle 1 adversarial) | {t_control:.2f} | x |" in text


class WritingRunner:
    """A StepRunner stand-in: each 'script' only writes the summary record it would write at its end."""

    def __init__(self, records):
        self.records, self.commands = records, []

    def run(self, name, cmd, parallel=True, timeout=None):
        self.commands.append(cmd)
        out = cmd[cmd.index("--out_dir") + 1]
        os.makedirs(out, exist_ok=True)
        for fname, rec in self.records.items():
            with open(os.path.join(out, fname), "w") as f:
                json.dump(rec, f)
        return 1.5


def test_the_grpo_step_reads_its_summary_once_and_opens_no_checkpoint(tmp_path, monkeypatch):
    """The GRPO step's record: what the run did from grpo_summary.json alone (steps, updates, tokens), and the
    settings it was given (the optimizer the other arms take over, what its FLOPs count needs) as
    train_grpo.py's own parser reads the preset's and the user's words, not read back from its summary (a
    summary that carries other values changes nothing); no checkpoint is opened (torch.load fails here)."""
    import torch

    from experiment import flops
    shape = {"model_args": {"n_layer": 1, "n_head": 1, "n_embd": 4, "vocab_size": 8, "block_size": 16,
                            "bias": False, "dropout": 0.0}}
    summary = {"steps": 2, "updates": 2, "rows_per_step": 32, "completion_tokens": 40, "seq_len": 16,
               "learning_rate": 1.0, "weight_decay": 1.0,  # not what the budget reads
               **shape, "detector": {**shape, "reward_head": {"lm_features": True, "hidden_dim": 8}},
               "checkpoint": str(tmp_path / "cycle_1" / "grpo" / "ckpt.pt"), "kl_final": 0.01, "ptx_coef": 0.0}
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("a checkpoint was opened"))
    runner = WritingRunner({"grpo_summary.json": summary})
    c = Run(parse_cpu(["--preset", "quick", "--tensorboard_dir", "none", "--extra_grpo=--weight_decay 0.1"]),
              preset("quick"), str(tmp_path), runner)
    gr = c.run_steps([c.grpo_spec(str(tmp_path / "cycle_1"), "gen.pt", {"checkpoint": "rm.pt"}, "1001", "cycle 1")])[0]
    assert gr["budget"] == {"steps": 2, "updates": 2, "rows_per_step": 32, "completion_tokens": 40,
                            "tokens_per_step": 20.0, "seq_len": 16, "learning_rate": 5e-5, "weight_decay": 0.1,
                            "beta1": 0.9, "beta2": 0.95, "grad_clip": 1.0}  # the quick preset's, the user's
    # quick: 4 prompts x 8, eval every 10 steps (so at 0 and 2), 10 val batches of 32, 64 reward samples
    settings = {"prompts_per_step": 4, "group_size": 8, "num_updates_per_batch": 1, "eval_interval": 10,
                "eval_max_batches": 10, "eval_batch_size": 32, "eval_reward_samples": 64}
    assert gr["flops"] == flops.step_rl({**settings, **summary}, "grpo")
    assert gr["flops"]["detail"]["eval_reward_tokens"] == 2 * 64 * 16
    assert gr["seconds"] == 1.5 and gr["kl_final"] == 0.01
    assert json.loads((tmp_path / "cycle_1" / "grpo.done.json").read_text()) == gr
    assert runner.commands[0][:3] == ["train_grpo.py", "--model_path", "gen.pt"]
    assert c.run_steps([c.grpo_spec(str(tmp_path / "cycle_1"), "gen.pt", {"checkpoint": "rm.pt"}, "1001",
                                    "cycle 1")])[0] == gr  # done


def test_the_self_play_arms_take_grpos_budget_and_their_own_settings(tmp_path):
    """SPIN and DDO (train_spin.py) match the GRPO step's budget: its steps, rows per step, seq_len,
    seed and optimizer; each takes its own run_cycles flags; DDO's rounds are at most the steps."""
    import run_cycles
    from experiment import flops
    budget = {"steps": 2, "updates": 2, "rows_per_step": 4, "completion_tokens": 40, "tokens_per_step": 20.0,
              "seq_len": 16, "learning_rate": 5e-5, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95, "grad_clip": 1.0}
    summary = {"steps": 2, "seq_len": 16, "prompts_per_step": 4, "eval_interval": 2, "eval_max_batches": 1,
               "eval_batch_size": 2, "eval_pairs": 3, "model_args": {"n_layer": 1, "n_head": 1, "n_embd": 4,
                                                                     "vocab_size": 8, "block_size": 16},
               "checkpoint": "out.pt", "updates": 2}
    runner = WritingRunner({"spin_summary.json": summary, "ddo_summary.json": summary})
    args = parse_cpu(["--preset", "quick", "--tensorboard_dir", "none", "--arms", "ddo,spin",
                                  "--ddo_alpha", "2", "--ddo_learning_rate", "1e-4"])
    run_cycles.check_args(args)
    c = Run(args, preset("quick"), str(tmp_path), runner)
    rec = {arm: c.run_steps([c.self_play_spec(str(tmp_path / "cycle_1" / arm), "gen.pt", budget, "1001", "cycle 1",
                                             arm)])[0]
           for arm in ("spin", "ddo")}
    spin, ddo = (dict(zip(cmd[1::2], cmd[2::2])) for cmd in runner.commands)
    for cmd in (spin, ddo):
        assert {k: cmd[k] for k in ("--seed", "--max_steps", "--prompts_per_step", "--seq_len", "--weight_decay")} == \
            {"--seed": "1001", "--max_steps": "2", "--prompts_per_step": "4", "--seq_len": "16", "--weight_decay": "0.1"}
    assert "--objective" not in spin and spin["--beta"] == "0.1" and spin["--learning_rate"] == "5e-05"
    assert ddo["--objective"] == "ddo" and ddo["--ddo_alpha"] == "2.0" and ddo["--ddo_beta"] == "1.0"
    assert ddo["--rounds"] == "2" and ddo["--learning_rate"] == "0.0001"  # 3 rounds asked, 2 steps made
    assert ddo["--out_dir"] == str(tmp_path / "cycle_1" / "ddo" / "ddo")
    # the same FLOPs count for both: the same rows, both models' log-probs of both, the updates
    assert rec["ddo"]["flops"] == rec["spin"]["flops"] == flops.step_rl(summary, "ddo")
    assert json.loads((tmp_path / "cycle_1" / "ddo" / "ddo.done.json").read_text()) == rec["ddo"]


# ----------------------------------------------------------------------------- step output

class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def bar_stream(n):
    """What tqdm writes for a bar of n updates, with a tqdm.write() in the middle."""
    parts = ["starting\n"]
    for i in range(n + 1):
        parts.append(f"\rwork: {i}/{n}")
        if i == n // 2:
            parts.append("\r" + " " * 12 + "\r" + "a message\n")
    return parts + ["\n", "done\n"]


def test_step_output_not_a_terminal_gets_final_lines_and_rare_snapshots():
    clock, log, console = Clock(), io.StringIO(), io.StringIO()
    out = StepOutput(log, console, tty=False, interval=30.0, clock=clock)
    for i, part in enumerate(bar_stream(100)):
        clock.t = i * 1.0  # one redraw per second: 100 s in all
        out.feed(part)
    out.close()
    text = console.getvalue()
    assert "\r" not in text and text == log.getvalue()
    lines = text.splitlines()
    assert lines[0] == "starting" and "a message" in lines and lines[-2:] == ["work: 100/100", "done"]
    snaps = [x for x in lines if x.startswith("work:")]
    assert 3 <= len(snaps) <= 5, snaps  # ~ one per 30 s of 100 s, plus the final state


def test_step_output_on_a_terminal_redraws_in_place():
    log, console = io.StringIO(), io.StringIO()
    out = StepOutput(log, console, tty=True, interval=30.0, clock=Clock())
    parts = bar_stream(20)
    for part in parts:
        out.feed(part)
    out.close()
    assert console.getvalue() == "".join(parts)  # the raw stream
    assert "\r" not in log.getvalue() and log.getvalue().splitlines()[-2:] == ["work: 20/20", "done"]


@pytest.mark.slow  # a command line run in a subprocess
def test_run_step_uses_the_terminal_when_stdout_is_one(tmp_path):
    """Through a real pseudo-terminal the bar's redraws reach the console; through a pipe only lines do."""
    import pty
    child = tmp_path / "bar.py"
    child.write_text("import sys, time\nfor i in range(5):\n    sys.stdout.write(f'\\rbar {i}/4')\n"
                     "    sys.stdout.flush()\n    time.sleep(0.01)\nprint()\nprint('end')\n")
    code = (f"from experiment.runner import StepRunner; "
            f"StepRunner({str(tmp_path / 'log.txt')!r}).run('bar', [{str(child)!r}])")
    master, slave = pty.openpty()
    p = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=slave, stderr=slave, env=ENV)
    os.close(slave)
    chunks = []
    while True:
        try:
            b = os.read(master, 4096)
        except OSError:
            break
        if not b:
            break
        chunks.append(b)
    assert p.wait(timeout=60) == 0
    os.close(master)
    tty_out = b"".join(chunks).decode()
    assert "bar 0/4\rbar 1/4" in tty_out
    piped = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, env=ENV)
    assert piped.returncode == 0
    assert "\r" not in piped.stdout and "bar 0/4" not in piped.stdout
    assert piped.stdout.splitlines()[-3:-1] == ["bar 4/4", "end"]
    # then the step's end: its exit status and time (a script without cli.run_cli's report_peak
    # reports no peak memory)
    assert piped.stdout.splitlines()[-1].startswith("--- bar: exit 0 after ")


@pytest.mark.slow  # a command line run in a subprocess
def test_run_step_shows_the_steps_own_peak_memory(tmp_path):
    child = tmp_path / "step.py"
    child.write_text(f"import sys; sys.path.insert(0, {ROOT!r})\nfrom core.cli import run_cli\n"
                     "run_cli(lambda: print('work'), report_peak=True)\n")
    code = f"from experiment.runner import StepRunner; StepRunner({str(tmp_path / 'log.txt')!r}).run('s', [{str(child)!r}])"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, env=ENV)
    assert r.returncode == 0, r.stderr
    last = r.stdout.splitlines()[-1]
    assert last.startswith("--- s: exit 0 after ") and "; peak memory: " in last and " GiB RSS" in last
    assert last in (tmp_path / "log.txt").read_text()


@pytest.mark.slow  # a command line run in a subprocess
def test_pretrained_base_without_a_data_record_needs_consent(tmp_path):
    """A Hugging Face GPT-2 directory records no training data: without --base_data_unknown the run
    stops before cycle 0 and names both routes; nothing is written but the run's lock."""
    transformers = pytest.importorskip("transformers")
    hf_dir = tmp_path / "gpt2-tiny"
    transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=50257,
                                                         n_positions=32)).save_pretrained(hf_dir)
    out = tmp_path / "run"
    r = run(["--base_ckpt", str(hf_dir), "--out_dir", str(out), "--data_dir", str(tmp_path / "unused")])
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"--base_ckpt {hf_dir} records no train/val split" in r.stderr
    assert "--base_data_unknown" in r.stderr and f"train.py --init_from {hf_dir}" in r.stderr
    assert "Traceback" not in r.stderr
    assert not out.exists() or sorted(os.listdir(out)) == []


@pytest.mark.slow
def test_self_play_arms_replay_and_temperature_mixed_detector(tmp_path):
    """The method's options in one tiny two-cycle run: the self-play arms SPIN and DDO (on GRPO's
    budget, judged on the control's frontier; DDO in self-play rounds, its generators measured by
    fresh detectors), replay (cycle 2's detector also learns cycle 1's samples), the
    temperature-mixed reward data and the entropy floor; then a rerun redoes nothing."""
    data_dir = tmp_path / "tiny_char"
    (tmp_path / "input.txt").write_text(make_text(6000, seed=3))
    prepare_corpus(str(tmp_path / "input.txt"), str(data_dir), "char", 0.9, log=lambda *a: None)
    cfg = tmp_path / "tiny.py"
    cfg.write_text(tiny_train_config())
    args = [a.replace("--samples_per_chunk 2", "--samples_per_chunk 2 --temperatures 0.7,1.3")
            .replace("--max_steps 3", "--max_steps 3 --entropy_floor 1.0")
            for a in tiny_args(tmp_path, data_dir, cfg)]
    args = [a for a in args if a != "1"] + ["--max_cycles", "2", "--arms", "ddo,spin", "--replay",
                                            "--no_control_detector", "--no_final_detector", "--temps", "0.8,1.0,1.2",
                                            "--no_null_arm"]
    args.remove("--max_cycles")
    r = run(args)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = tmp_path / "run"
    summary = json.loads((out / "summary.json").read_text())
    finite_numbers(summary)
    gens = {(g["cycle"], g["arm"]): g for g in summary["generators"]}
    assert {(1, "spin"), (2, "spin")} <= set(gens)
    spin = json.loads((out / "cycle_1/spin/spin.done.json").read_text())
    grpo = json.loads((out / "cycle_1/grpo.done.json").read_text())["budget"]
    assert spin["updates"] == grpo["updates"] and spin["completion_tokens"] == grpo["completion_tokens"]
    # SPIN's beta and likelihood anchor are run_cycles' flags, forwarded; its learning rate GRPO's by default
    assert spin["beta"] == 0.1 and spin["nll_coef"] == 1.0 and spin["learning_rate"] == grpo["learning_rate"]
    assert gens[(2, "spin")]["generator"].endswith("cycle_2/spin/spin/ckpt.pt")
    assert set(summary["frontier"]["cycle_2"]["arms"]) == {"adversarial", "spin", "ddo"}
    assert any(v.startswith("cycle 2 (1 seed, provisional), T = 1: the SPIN arm vs the same-budget MLE control")
               for v in summary["frontier_verdicts"])
    # DDO: GRPO's budget in 3 rounds of its 3 steps, each from the policy then; the paper's objective
    done = lambda step: json.loads((out / f"{step}.done.json").read_text())  # noqa: E731
    ddo = [done(f"cycle_{n}/ddo/ddo") for n in (1, 2)]
    assert ddo[0]["objective"] == "ddo" and ddo[0]["updates"] == grpo["updates"] == 3
    assert ddo[0]["completion_tokens"] == grpo["completion_tokens"] and ddo[0]["round_starts"] == [0, 1, 2]
    assert ddo[0]["ddo_alpha"] == ddo[0]["ddo_beta"] == 1.0 and ddo[0]["learning_rate"] == grpo["learning_rate"]
    assert gens[(2, "ddo")]["generator"].endswith("cycle_2/ddo/ddo/ckpt.pt")
    # its own chain: cycle 2 starts from its cycle-1 generator; FLOPs: the base and both DDO steps
    assert "--model_path " + gens[(1, "ddo")]["generator"] + " --out_dir " + str(out / "cycle_2/ddo/ddo") in \
        (out / "steps.log").read_text()
    base_flops = done("cycle_0/base")["flops"]["flops"]
    assert gens[(2, "ddo")]["compute_flops"] == pytest.approx(base_flops + sum(d["flops"]["flops"] for d in ddo))
    assert gens[(1, "ddo")]["compute_flops"] == pytest.approx(gens[(1, "spin")]["compute_flops"])  # the same rows
    # a fresh detector of its cycle-1 generator (not replayed, like the control's); the final stage was skipped
    assert gens[(1, "ddo")]["detector"] == "cycle_2/ddo" and gens[(1, "ddo")]["det_auroc"] is not None
    assert gens[(2, "ddo")]["det_skipped"] == "--no_final_detector" and gens[(2, "spin")]["det_skipped"]
    assert any(v.startswith("cycle 2 (1 seed, provisional), T = 1: the DDO arm (the model's log-likelihood ratio as its "
                            "own discriminator) vs the same-budget MLE control") for v in summary["frontier_verdicts"])
    assert summary["settings"]["ddo_rounds"] == 3 and "| 2 | ddo |" in (out / "summary.md").read_text()
    assert not (out / "cycle_1/null").exists()  # --no_null_arm
    replay = json.loads((out / "cycle_2/replay.done.json").read_text())
    assert replay["from"] == [str(out / "cycle_1/reward_data")]
    meta = (out / "cycle_2/reward_data_replay/train_metadata.txt").read_text()
    assert "replay_samples: 24, 24" in meta
    assert "temperatures: 0.7,1.3" in (out / "cycle_1/reward_data/train_metadata.txt").read_text()
    assert "--data_dir " + str(out / "cycle_2/reward_data_replay") in (out / "steps.log").read_text()
    r2 = run(args)
    assert r2.returncode == 0 and not launched(r2.stdout), launched(r2.stdout)


def save_tiny_gpt2(path, seed, n_layer=1):
    """A tiny random GPT-2 of the real vocabulary, saved as a local Hugging Face directory."""
    transformers = pytest.importorskip("transformers")
    import torch
    torch.manual_seed(seed)
    transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=n_layer, n_head=2, n_embd=32, vocab_size=50257,
                                                         n_positions=64)).save_pretrained(path)
    return path


@pytest.mark.slow
def test_gpt2_preset_needs_both_local_models_and_resolves_its_defaults(tmp_path):
    args = parse_cpu(["--preset", "gpt2"])
    assert (args.data_dir, args.eval_batch_size, args.sample_len) == ("data/shakespeare", 16, 256)
    args = parse_cpu(["--preset", "quick"])  # the other presets keep their defaults
    assert (args.data_dir, args.eval_batch_size, args.sample_len) == ("data/shakespeare_char", 64, None)
    # --mauve_features that cannot run is refused before any step (it was skipped with a note, and the
    # tables came out without the MAUVE column asked for)
    import run_cycles
    with pytest.raises(ProjectError, match=r"--mauve_features \S*none: (the mauve-text package is not installed|"
                                           r"\S*none is not a local Hugging Face model directory)") as e:
        run_cycles.check_args(parse_cpu(["--mauve_features", str(tmp_path / "none")]))
    assert "or drop --mauve_features" in e.value.suggestion
    base = save_tiny_gpt2(tmp_path / "base", 0)
    for given, missing in (([], "--base_ckpt"), (["--base_ckpt", str(base)], "--detector_trunk_ckpt"),
                           (["--base_ckpt", str(base), "--detector_trunk_ckpt", str(base)], "--judge_ckpt")):
        r = run(["--preset", "gpt2", "--out_dir", str(tmp_path / "run")] + given)
        assert r.returncode == 2 and f"--preset gpt2 needs {missing}" in r.stderr, r.stderr[-2000:]
        assert "Traceback" not in r.stderr
    # both given: it still asks for consent to the base model's unknown training data
    r = run(["--preset", "gpt2", "--out_dir", str(tmp_path / "run"), "--base_ckpt", str(base),
             "--detector_trunk_ckpt", str(base), "--judge_ckpt", str(base), "--data_dir", str(tmp_path / "unused")])
    assert r.returncode == 2 and "--base_data_unknown" in r.stderr, r.stderr[-2000:]


def bpe_corpus(tmp_path):
    pytest.importorskip("tiktoken")
    data_dir = tmp_path / "tiny_bpe"
    (tmp_path / "input.txt").write_text(make_text(20000, seed=3))
    prepare_corpus(str(tmp_path / "input.txt"), str(data_dir), "bpe", 0.9, log=lambda *a: None)
    return data_dir


@pytest.mark.slow
def test_gpt2_preset_end_to_end_on_tiny_stand_ins(tmp_path):
    """The pretrained path, --preset gpt2 through every step on CPU: tiny random GPT-2s (the real
    vocabulary of 50257) stand in for gpt2 and gpt2-medium as the base and the detector trunk, on a
    BPE corpus, with the step counts and sequence lengths shrunk by --extra_* flags."""
    data_dir = bpe_corpus(tmp_path)
    base, trunk = save_tiny_gpt2(tmp_path / "base", 0), save_tiny_gpt2(tmp_path / "trunk", 1, n_layer=2)
    judge = save_tiny_gpt2(tmp_path / "judge", 2, n_layer=2)
    import importlib.util
    has_mauve = importlib.util.find_spec("mauve") is not None
    r = run(["--preset", "gpt2", "--out_dir", str(tmp_path / "run"), "--data_dir", str(data_dir), "--device", "cpu",
             "--base_ckpt", str(base), "--base_data_unknown", "--detector_trunk_ckpt", str(trunk),
             "--judge_ckpt", str(judge), "--temps", "0.5,1.0,2.0", "--sample_len", "32", "--quality_samples", "16", "--detect_blocks", "16", "--no_control_detector",
             "--no_final_detector",
             "--extra_reward_data=--block_size 32 --max_blocks_per_split 12 --samples_per_chunk 2 --gen_batch_size 16",
             "--extra_reward_model=--max_iters 20 --eval_interval 10 --batch_size 8",
             "--extra_grpo=--seq_len 32 --max_steps 2 --prompts_per_step 2 --group_size 4 --micro_batch_size 4 "
             "--eval_interval 2 --save_interval 1 --eval_max_batches 2 --eval_reward_samples 8"]
            + (["--mauve_features", str(trunk)] if has_mauve else []))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summary = json.loads((tmp_path / "run/summary.json").read_text())
    finite_numbers(summary)
    if has_mauve:  # the trunk's directory doubles as the featurizer
        assert all(0 <= g["mauve"] <= 1 for g in summary["generators"]), summary["generators"]
        assert "MAUVE (T = 1)" in (tmp_path / "run/summary.md").read_text()
    assert summary["detector"] == "ratio_features" and summary["detector_trunk"]["checkpoint"] == str(trunk)
    assert summary["settings"]["judge"]["checkpoint"] == str(judge)
    assert "--base_data_unknown" in (tmp_path / "run/summary.md").read_text()
    assert (tmp_path / "run/samples.md").stat().st_size > 0
    # every step reported its own peak memory, and run_cycles its in-process one
    ends = [line for line in r.stdout.splitlines() if line.startswith("--- ")]
    assert ends and all("; peak memory: " in line for line in ends)
    assert "run_cycles peak memory: " in r.stdout


def test_a_checkpoint_evaluated_twice_is_swept_once(tmp_path, capsys):
    """--detector_trunk_ckpt = --base_ckpt: the trunk's frontier point is the base's sweep, copied,
    not a second sweep; another checkpoint is swept anew."""
    import torch

    import run_cycles
    from core.files import atomic_torch_save
    from helpers import TINY
    from lib.checkpoint import make_checkpoint
    from model import GPT, GPTConfig
    data_dir = tmp_path / "tiny_char"
    (tmp_path / "input.txt").write_text(make_text(3000, seed=3))
    prepare_corpus(str(tmp_path / "input.txt"), str(data_dir), "char", 0.9, log=lambda *a: None)
    from lib.corpus import Corpus
    vocab = Corpus(str(data_dir)).tokenizer.vocab_size
    paths = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        atomic_torch_save(make_checkpoint(GPT(GPTConfig(block_size=16, vocab_size=vocab, **TINY)), None),
                          tmp_path / f"g{seed}.pt")
        paths.append(str(tmp_path / f"g{seed}.pt"))
    args = parse_cpu(["--data_dir", str(data_dir), "--temps", "0.5,1.0", "--quality_samples", "4",
                                  "--eval_batch_size", "8"])
    run_cycles.check_args(args)
    run = Run(args, preset("default"), str(tmp_path))
    run.judge_model, run.judge_rec = GPT(GPTConfig(block_size=16, vocab_size=vocab, **TINY)), {"checkpoint": "j"}
    run.eval_block_size = run.sample_len = 16
    first = run.evaluate(str(tmp_path / "a"), paths[0], "base")
    capsys.readouterr()
    twin = run.evaluate(str(tmp_path / "b"), paths[0], "trunk")
    assert "its sweep is reused" in capsys.readouterr().out
    assert twin == first and json.loads((tmp_path / "b/eval.done.json").read_text()) == first
    other = run.evaluate(str(tmp_path / "c"), paths[1], "other")
    assert "its sweep is reused" not in capsys.readouterr().out and other["val_loss"] != first["val_loss"]


def test_cycle0_val_perplexity_once_per_checkpoint(tmp_path, capsys):
    """The base, the detector trunk and the judge given as one checkpoint: its val perplexity is measured
    once (the same numbers as measures.val_perplexity), and again when the file is replaced."""
    import torch

    import run_cycles
    from core.files import atomic_torch_save
    from experiment.measures import val_perplexity
    from helpers import TINY
    from lib.checkpoint import make_checkpoint
    from lib.corpus import Corpus
    from model import GPT, GPTConfig
    data_dir = tmp_path / "tiny_char"
    (tmp_path / "input.txt").write_text(make_text(3000, seed=3))
    prepare_corpus(str(tmp_path / "input.txt"), str(data_dir), "char", 0.9, log=lambda *a: None)
    vocab = Corpus(str(data_dir)).tokenizer.vocab_size
    path = str(tmp_path / "g.pt")
    args = parse_cpu(["--data_dir", str(data_dir), "--eval_batch_size", "8"])
    run_cycles.check_args(args)
    run = Run(args, preset("default"), str(tmp_path))
    seen = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        atomic_torch_save(make_checkpoint(GPT(GPTConfig(block_size=16, vocab_size=vocab, **TINY)), None), path)
        os.utime(path, ns=(seed, seed))  # another version of the file, even within the clock's resolution
        capsys.readouterr()
        first = run.val_perplexity(path)
        assert "reused" not in capsys.readouterr().out
        assert first == val_perplexity(path, str(data_dir), "cpu", 8)
        assert run.val_perplexity(path) == first and "reused" in capsys.readouterr().out
        seen.append(first)
    assert seen[0] != seen[1]


@pytest.mark.slow
def test_cycle0_note_names_the_flag_that_skips_training(tmp_path, capsys):
    """A run that brings its own generator is told, before cycle 0 trains the preset's judge, which
    flag skips that training; nothing is said for a model given, nor when the run resumes."""
    data_dir = tmp_path / "tiny_char"
    (tmp_path / "input.txt").write_text(make_text(3000, seed=3))
    prepare_corpus(str(tmp_path / "input.txt"), str(data_dir), "char", 0.9, log=lambda *a: None)
    cfg = tmp_path / "tiny.py"
    cfg.write_text(tiny_train_config())
    quick = preset("quick")
    assert "--detector_trunk_ckpt PATH" in cycle0_note("detector_trunk", "quick", "c.py", {})
    settings = {"max_iters": 3, "eval_interval": 3, "eval_iters": 1}

    def judge(given, base, out="run"):  # the preset's judge recipe shrunk to `settings`; given: --judge_ckpt
        args = parse_cpu(["--preset", "quick", "--data_dir", str(data_dir)] + (["--base_ckpt", base] if base else [])
                         + (["--judge_ckpt", given] if given else []))
        os.makedirs(tmp_path / out / "cycle_0", exist_ok=True)
        run = Run(args, {**quick, "judge": settings}, str(tmp_path / out), StepRunner(str(tmp_path / out / "steps.log")))
        capsys.readouterr()
        rec = cycle0.cycle0_model(run, str(cfg), "judge")
        return rec, capsys.readouterr().out

    rec, out = judge(None, "base.pt")  # trained: the note first, with the recipe and the flag
    assert "note: no --judge_ckpt: cycle 0 trains the judge with the quick preset's recipe" in out
    assert f"--config {cfg} --max_iters 3" in out and "pass --judge_ckpt PATH" in out
    assert out.index("note: no --judge_ckpt") < out.index("=== cycle 0: the judge")
    assert "note:" not in judge(None, "base.pt")[1]  # resumed: done already
    assert "note:" not in judge(rec["checkpoint"], "base.pt", "given")[1]  # given
    assert "note:" not in judge(None, None, "own")[1]  # cycle 0 trains the generator too: nothing to skip


def test_main_changes_no_module_global(tmp_path):
    """main() holds the run's lock and hands its descriptor to every step through its StepRunner, with
    --progress_interval: no module global changes at run time, so a later in-process call (tests,
    notebooks) cannot pass a descriptor another script's end_run() has closed (EBADF); nor does the
    environment (the preset's GPT_DECODE is its run's)."""
    import run_cycles
    from experiment import run as run_module, runner, steps

    def snapshot():
        return {m.__name__: {k: v for k, v in vars(m).items() if not k.startswith("__")}
                for m in (run_cycles, steps, run_module, runner)}

    before, env = snapshot(), dict(os.environ)
    with pytest.raises(ProjectError, match="has no train.bin"):  # fails after taking the lock
        run_cycles.main(["--out_dir", str(tmp_path / "run"), "--data_dir", str(tmp_path / "no_data"),
                         "--device", "cpu", "--progress_interval", "5"])
    assert os.path.exists(tmp_path / "run" / "run.lock") and snapshot() == before
    assert dict(os.environ) == env  # the preset's GPT_DECODE was the run's alone


@pytest.mark.slow  # a whole run_cycles.py pipeline
@pytest.mark.parametrize("device", [pytest.param("cuda", marks=pytest.mark.cuda)])  # on CPU: the gpu smoke run's
def test_the_whole_pipeline_under_bfloat16_autocast(tmp_path, device):
    """--dtype bfloat16 (what a GPU runs by default), on a GPU (its own paths: compile, captured
    decoding, whole logits): every step gets it and runs under autocast (the reward model records it, so its
    val predictions are reused by the measurement at that precision), run_cycles' own measurements autocast
    too, and the summary comes out finite, with the verdicts. Started in another directory than the repository's,
    with relative paths: every step runs there too, so they mean the same to each (the steps ran in the
    repository's, and wrote the base model there)."""
    data_dir = tmp_path / "tiny_char"
    (tmp_path / "input.txt").write_text(make_text(6000, seed=3))
    prepare_corpus(str(tmp_path / "input.txt"), str(data_dir), "char", 0.9, log=lambda *a: None)
    # train.py compiles by default on CUDA: not here (the GPU check's probe times training compiled; four
    # compiles, one per train.py step, would spend its tests stage)
    (tmp_path / "tiny.py").write_text(tiny_train_config(compile=False))
    here = pathlib.Path(".")  # tmp_path, the run's directory
    args = [a if a != "cpu" else device for a in tiny_args(here, here / "tiny_char", here / "tiny.py")]
    assert "run" in args and "tiny.py" in args
    # on a GPU the steps decode as the gpu preset's do: captured, uncompiled. The compiled step has tests of its
    # own (test_static_decode.py); compiling it in each of the four processes that decode here would spend the
    # GPU check's tests stage (270 s for every cuda-marked test) on compiles
    decode = "static" if device == "cuda" else ENV.get("GPT_DECODE", "compiled")
    r = run(args + ["--dtype", "bfloat16", "--no_control_detector", "--no_final_detector"], cwd=tmp_path,
            env={"GPT_DECODE": decode})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = tmp_path / "run"
    steps = launched(r.stdout)
    assert steps and all("--dtype bfloat16" in line for line in steps if ".py" in line and "prepare.py" not in line)
    assert json.loads((out / "cycle_1/reward_model/reward_summary.json").read_text())["dtype"] == "bfloat16"
    assert "compiling the model" not in r.stdout  # train.py's steps ran eager, on a GPU too
    summary = json.loads((out / "summary.json").read_text())
    finite_numbers(summary)
    assert (summary["settings"]["device"], summary["settings"]["dtype"], summary["settings"]["decode"]) == \
        (device, "bfloat16", decode)
    arms = {(g["cycle"], g["arm"]) for g in summary["generators"]}
    assert {(1, "adversarial"), (1, "control"), (1, "null")} <= arms
    assert "inside" in (out / "summary.md").read_text() or "beyond" in (out / "summary.md").read_text()


def test_gpu_gap_is_the_gpu_preset_but_its_base_iterations():
    """So the smoke run below covers both (under --smoke their settings are the same): gpu_gap differs from gpu in
    its base's iterations (and their evaluation interval) alone, and not in any smoke setting."""
    gpu, gap = preset("gpu"), preset("gpu_gap")
    assert {k for k in gpu if gpu[k] != gap[k]} == {"base"}
    assert {k for k in gpu["base"] if gpu["base"][k] != gap["base"][k]} == {"max_iters", "lr_decay_iters", "eval_interval"}
    assert preset("gpu", smoke=True) == preset("gpu_gap", smoke=True)


@pytest.mark.slow  # a whole run_cycles.py pipeline
@pytest.mark.parametrize("name", ["gpu"])  # gpu_gap's smoke run is the same (the test above)
def test_the_gpu_presets_run_every_step_under_smoke_in_bfloat16_on_cpu(tmp_path, name):
    """--preset gpu (gpu_gap's smoke settings are the same) with --smoke (the one override that shrinks iterations, model and blocks, and the
    cycles to two; not another preset): every step of the preset with its own flags (nanoGPT's GPU config, the
    trunk's and judge's longer recipe, eager, the demo's GRPO, the SIR and ideal-detector arms, a second cycle
    whose detector learns the current generator) at tiny sizes, under bfloat16 autocast as a GPU runs it, so
    the presets cannot rot."""
    data_dir = tmp_path / "tiny_char"
    (tmp_path / "input.txt").write_text(make_text(6000, seed=3))
    prepare_corpus(str(tmp_path / "input.txt"), str(data_dir), "char", 0.9, log=lambda *a: None)
    # started in another directory than the repository's, with relative paths: every step runs there too, so the
    # paths mean the same to each (the steps once ran in the repository's, and wrote there)
    r = run(["--preset", name, "--smoke", "--out_dir", "run", "--data_dir", "tiny_char", "--device", "cpu",
             "--dtype", "bfloat16"], cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    # bfloat16 autocast on CPU, as a GPU runs: every step gets it, the reward model records it
    steps = launched(r.stdout)
    assert steps and all("--dtype bfloat16" in line for line in steps if ".py" in line and "prepare.py" not in line)
    assert json.loads((tmp_path / "run/cycle_1/reward_model/reward_summary.json").read_text())["dtype"] == "bfloat16"
    assert "compiling the model" not in r.stdout
    assert any(w in (tmp_path / "run" / "summary.md").read_text() for w in ("inside", "beyond", "tie"))
    log = (tmp_path / "run" / "steps.log").read_text()
    cycle0 = [line for line in log.splitlines() if re.match(r"\$ \S*train.py --config", line)]  # (a path from elsewhere)
    assert len(cycle0) == 3 and all(f"--{k} {v}" in line for line in cycle0 for k, v in SMOKE_TRAIN.items())
    assert all("config/train_shakespeare_char.py" in line and "--dtype bfloat16" in line for line in cycle0)
    # the three at once: all launched before the first ends, their lines tagged with their step
    lines = log.splitlines()
    assert lines.index(cycle0[-1]) < min(i for i, line in enumerate(lines) if line.startswith("--- cycle 0: "))
    assert "\n[judge] " in log and "\n[detector_trunk] " in log
    assert "--max_blocks_per_split 12" in log and "--samples_per_chunk 2" in log  # the preset's and the smoke's
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    finite_numbers(summary)
    assert summary["preset"] == name and summary["smoke"] is True
    # the preset decodes uncompiled, as it trains eager, where the environment does not say otherwise
    assert summary["settings"]["decode"] == ENV.get("GPT_DECODE", "static") and summary["settings"]["parallel_cycle0"]
    assert summary["settings"]["parallel_arms"] and "\n[cycle_1/null/grpo] " in log
    # the preset's SIR arm (the detector's information beside its trunk's advantage: the trend table's share)
    # and its ideal-detector arm (the ceiling of every detector arm)
    assert summary["settings"]["arms"] == ["ratio", "sir"]
    info = summary["information"]["cycle_1"]
    assert math.isfinite(info["gain_n1"]) and "trunk" in info["took"]
    arms = {(g["cycle"], g["arm"]) for g in summary["generators"]}
    assert {(c, a) for c in (1, 2) for a in ("adversarial", "control", "null", "ratio", "sir")} <= arms
    assert "--beta 0.1" in log and "--no_degeneracy_guard" not in log  # the demo's GRPO; the guard on
    assert [c["cycle"] for c in summary["cycles"]] == [1, 2]
    # the ideal arm's frontier every cycle; its fractions where the arms' quality ranges overlap the entering
    # generator's, which at smoke sizes a cycle may miss (then "out of range", as in the frontier table)
    ratio = [g for g in summary["generators"] if g["arm"] == "ratio"]
    assert {g["cycle"] for g in ratio} == {1, 2} and all(g.get("frontier") for g in ratio)
    assert summary["ideal_fractions"] and set(summary["ideal_fractions"]) <= {"cycle_1", "cycle_2"}
    assert "## The game, cycle by cycle" in (tmp_path / "run" / "summary.md").read_text()


def figures(tree):
    """A summary's numbers and words, its paths and times left out (two runs' directories differ)."""
    if isinstance(tree, dict):
        return {k: figures(v) for k, v in tree.items()
                if not any(w in k for w in ("seconds", "time", "path", "generator", "checkpoint", "out_dir", "argv"))}
    if isinstance(tree, list):
        return [figures(v) for v in tree]
    return tree if not isinstance(tree, str) or os.sep not in tree else None


@pytest.mark.slow  # two whole run_cycles.py pipelines
def test_steps_run_at_once_give_the_same_bits_as_in_turn(tmp_path):
    """--parallel_cycle0 --parallel_arms on a CPU (each step one torch thread) against --no-... (in turn, one
    thread, as the test environment runs everything): every checkpoint bit for bit and every figure of
    summary.json the same; the cycle's GRPO steps (adversarial, null, ideal) and then the MLE control and SPIN
    ran at once."""
    import torch
    data_dir = tmp_path / "tiny_char"
    (tmp_path / "input.txt").write_text(make_text(6000, seed=3))
    prepare_corpus(str(tmp_path / "input.txt"), str(data_dir), "char", 0.9, log=lambda *a: None)
    cfg = tmp_path / "tiny.py"
    cfg.write_text(tiny_train_config())
    outs = {}
    for way in ("parallel", "no-parallel"):
        args = tiny_args(tmp_path, data_dir, cfg)
        args[args.index("--out_dir") + 1] = str(tmp_path / way)
        args[args.index("--detector") + 1] = "strong_trunk"
        r = run(args + [f"--{way}_cycle0", f"--{way}_arms", "--arms", "ratio,spin", "--no_final_detector",
                        "--no_control_detector", "--extra_detector_trunk=--max_iters 40 --lr_decay_iters 40",
                        "--extra_spin=--max_steps 2"])
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        outs[way] = tmp_path / way
    log = (outs["parallel"] / "steps.log").read_text()
    for tag in ("[judge] ", "[cycle_1/grpo] ", "[cycle_1/null/grpo] ", "[cycle_1/ratio/grpo] ",
                "[cycle_1/control/mle] ", "[cycle_1/spin/spin] "):
        assert "\n" + tag in log, tag
    assert "\n[" not in (outs["no-parallel"] / "steps.log").read_text()
    ckpts = sorted(p.relative_to(outs["parallel"]) for p in outs["parallel"].rglob("ckpt.pt"))
    assert len(ckpts) >= 7 and ckpts == sorted(p.relative_to(outs["no-parallel"]) for p in outs["no-parallel"].rglob("ckpt.pt"))
    for rel in ckpts:
        a, b = (torch.load(outs[w] / rel, map_location="cpu", weights_only=True)["model"] for w in outs)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), rel
    a, b = (json.loads((outs[w] / "summary.json").read_text()) for w in outs)
    assert figures(a["generators"]) == figures(b["generators"]) and figures(a["cycles"]) == figures(b["cycles"])


RENDEZVOUS = """import os, sys, time
me, others, fail = sys.argv[1], sys.argv[2].split(","), sys.argv[3] == "fail"
open(os.path.join(os.path.dirname(__file__), me + ".started"), "w").close()
print("start", me, flush=True)
t0 = time.time()  # each waits for the others to start: only steps that run at once all get past this
while not all(os.path.exists(os.path.join(os.path.dirname(__file__), o + ".started")) for o in others):
    if time.time() - t0 > 60:
        sys.exit("the others never started")
    time.sleep(0.02)
print("end", me, flush=True)
sys.exit(3 if fail else 0)
"""


@pytest.mark.slow  # subprocesses
@pytest.mark.parametrize("warm", [False, True])  # fresh processes; forked from the warm launcher
def test_run_together_runs_steps_at_once_and_reports_a_failure_after_all_end(tmp_path, capsys, warm):
    """StepRunner.run_together (cycle 0's trainings in the gpu preset): the steps run at once (each waits
    until all have started, so steps run in turn would time out), each line tagged with its step in the log
    and on the console, each step's end line; a step that fails is a ProjectError naming it, raised once the
    others have ended (their work stays for the rerun)."""
    script = tmp_path / "step.py"
    script.write_text(RENDEZVOUS)
    log = tmp_path / "steps.log"
    names = ["a", "b", "c"]
    runner = StepRunner(str(log), warm=warm)
    secs = runner.run_together([(n, [str(script), n, ",".join(names), "ok"]) for n in names])
    assert len(secs) == 3 and all(s > 0 for s in secs)
    text = log.read_text()
    for n in names:
        assert f"[{n}] start {n}\n" in text and f"[{n}] end {n}\n" in text and f"--- {n}: exit 0 after " in text
    assert "[a] end a" in capsys.readouterr().out
    for f in tmp_path.glob("*.started"):
        f.unlink()
    with pytest.raises(ProjectError, match=r"step 'b' failed \(exit 3\)") as e:
        runner.run_together([(n, [str(script), n, ",".join(names), "fail" if n == "b" else "ok"]) for n in names])
    assert "end b" in str(e.value)  # the end of its output
    text = log.read_text()
    assert "--- b: exit 3 after " in text and text.count("--- a: exit 0 after ") == 2 and \
        text.count("--- c: exit 0 after ") == 2
    # each step's seconds are its own, not the last one's (steps.log's times are what the main job is timed by)
    quick, slow = tmp_path / "quick.py", tmp_path / "slow.py"
    quick.write_text("print('done')\n")
    slow.write_text("import time\ntime.sleep(2)\nprint('done')\n")
    secs = runner.run_together([("quick", [str(quick)]), ("slow", [str(slow)])])
    runner.close()
    assert secs[0] < 1.5 <= 2 <= secs[1], secs


def test_max_at_once_runs_that_many_and_the_next_as_soon_as_a_place_frees(tmp_path):
    """--max_at_once 2 (a 2-core machine, one step per core): of three steps, the first two start, and the third as
    soon as either ends (not once both have: a waits for c, so steps in fixed groups would never meet); every step's
    seconds come back in its order."""
    script = tmp_path / "step.py"
    script.write_text(RENDEZVOUS)
    runner = StepRunner(str(tmp_path / "steps.log"))
    run = SimpleNamespace(args=SimpleNamespace(max_at_once=2), device="cpu", runner=runner)
    jobs = [(n, [str(script), n, others, "ok"]) for n, others in (("a", "a,c"), ("b", "b"), ("c", "a,c"))]
    secs = Run.run_together(run, jobs, ["a", "b", "c"])
    text = (tmp_path / "steps.log").read_text()
    assert len(secs) == 3 and "[a] end a\n" in text and "[c] end c\n" in text
    assert text.index("--- b: exit 0") < text.index(f"$ {script} c a,c ok")  # c took b's place, never a third
    assert secs[1] < secs[0]  # (b's own seconds, a's its own)
    run.args.max_at_once = None  # default: all at once (c waits for a and b to start: in turn it would time out)
    for f in tmp_path.glob("*.started"):
        f.unlink()
    jobs = [(n, [str(script), n, "a,b,c", "ok"]) for n in "abc"]
    assert len(Run.run_together(run, jobs, ["a", "b", "c"])) == 3


AFTER = """import os, sys, time
me, needs, sleep, code = sys.argv[1], [n for n in sys.argv[2].split(",") if n], float(sys.argv[3]), int(sys.argv[4])
here = os.path.dirname(__file__)
if not all(os.path.exists(os.path.join(here, n + ".ended")) for n in needs):
    sys.exit(4)  # started before a step it needs had ended
time.sleep(sleep)
if code == 0:
    open(os.path.join(here, me + ".ended"), "w").close()
sys.exit(code)
"""


def test_a_step_after_others_starts_once_they_have_ended_well_and_never_after_a_failure(tmp_path):
    """run_together's after (limit.train_together: a continuation after its grid point, the ensemble's student after
    its members): b waits for a, though a place is free from the start; once a fails, b never starts, c still runs,
    and the failure names a."""
    script = tmp_path / "dep.py"
    script.write_text(AFTER)
    runner = StepRunner(str(tmp_path / "steps.log"))
    steps = [("a", [str(script), "a", "", "0.5", "0"]), ("b", [str(script), "b", "a", "0", "0"]),
             ("c", [str(script), "c", "", "0", "0"])]
    assert len(runner.run_together(steps, after=[(), (0,), ()])) == 3
    assert (tmp_path / "b.ended").exists()
    for f in tmp_path.glob("*.ended"):
        f.unlink()
    steps[0] = ("a", [str(script), "a", "", "0.2", "3"])
    with pytest.raises(ProjectError, match=r"step 'a' failed \(exit 3\)"):
        runner.run_together(steps, at_once=2, after=[(), (0,), ()])
    log = (tmp_path / "steps.log").read_text()
    assert log.count(f"$ {script} b a ") == 1 and (tmp_path / "c.ended").exists()  # b ran only the first time


def test_run_steps_waits_only_on_steps_that_still_run(tmp_path):
    """Run.run_steps' after, on a resumed run: a step done before (its record there) is not waited on, and the
    indices move to the steps that run."""
    script = tmp_path / "dep.py"
    script.write_text(AFTER)
    (tmp_path / "s0").mkdir()
    (tmp_path / "s0" / "x.done.json").write_text(json.dumps(["done before"]))
    run = Run.__new__(Run)
    run.args, run.device, run.out_dir, run.records = SimpleNamespace(max_at_once=None), "cpu", str(tmp_path), 0
    run.runner = StepRunner(str(tmp_path / "steps.log"))
    steps = [ScriptStep(str(tmp_path / f"s{k}"), "x", f"s{k}", [str(script), f"s{k}", needs, sleep, "0"], None,
                        lambda s, secs, k=k: [f"s{k}", secs]) for k, needs, sleep in
             ((0, "", "0"), (1, "", "0.5"), (2, "s1", "0"))]
    recs = run.run_steps(steps, together=True, after={2: (0, 1)})
    assert recs[0] == ["done before"] and [r[0] for r in recs[1:]] == ["s1", "s2"] and (tmp_path / "s2.ended").exists()

@pytest.mark.slow  # a subprocess
def test_a_step_runs_where_run_cycles_runs_and_its_command_is_shown_as_a_shell_reads_it(tmp_path, monkeypatch, capsys):
    """A step's working directory is the caller's (a relative --out_dir means the same to run_cycles and its
    steps); the command shown on the console and in steps.log quotes what a shell would split."""
    where, scripts = tmp_path / "run here", tmp_path / "a dir"
    where.mkdir()
    scripts.mkdir()
    script = scripts / "step.py"
    script.write_text("import os, sys\nprint(repr(os.getcwd()), repr(sys.argv[1:]))\n")
    monkeypatch.chdir(where)
    StepRunner(str(tmp_path / "steps.log")).run("s", [str(script), "two words", "plain"])
    log = (tmp_path / "steps.log").read_text()
    assert f"$ '{script}' 'two words' plain\n" in log and f"=== s: '{script}' 'two words' plain" in capsys.readouterr().out
    assert f"{str(where)!r} ['two words', 'plain']" in log


@pytest.mark.slow  # subprocesses
@pytest.mark.parametrize("warm", [False, True])
def test_run_together_stops_every_step_at_an_interrupt(tmp_path, warm):
    """Ctrl-C to a process running steps together (run_cycles in the gpu preset's cycle 0): every step's
    process group gets it and ends, each step's stop is logged, and the interrupt is raised again."""
    import signal
    script = tmp_path / "step.py"
    script.write_text("import os, sys, time\nopen(sys.argv[1], 'w').write(str(os.getpid()))\nprint('up', flush=True)\n"
                      "time.sleep(120)\n")
    pids = [tmp_path / f"{n}.pid" for n in "ab"]
    steps = [(n, [str(script), str(p)]) for n, p in zip("ab", pids)]
    code = (f"import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"
            f"from experiment.runner import StepRunner\n"
            f"try:\n    StepRunner({str(tmp_path / 'log.txt')!r}, warm={warm}).run_together({steps!r})\n"
            f"except KeyboardInterrupt:\n    print('interrupted')\n")
    p = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=ENV, stdout=subprocess.PIPE, text=True)
    try:
        t0 = time.time()
        while not all(f.exists() and f.read_text() for f in pids):
            assert p.poll() is None and time.time() - t0 < 60
            time.sleep(0.05)
        p.send_signal(signal.SIGINT)
        out = p.communicate(timeout=60)[0]
    finally:
        p.kill()
    assert out.rstrip().endswith("interrupted"), out
    assert "--- a: stopped by SIGINT after " in out and "--- b: stopped by SIGINT after " in out
    for f in pids:  # both steps' processes have ended
        with pytest.raises(ProcessLookupError):
            os.kill(int(f.read_text()), 0)


def sha256(path):
    import hashlib
    return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()


@pytest.mark.slow  # a whole run_cycles.py pipeline, two replicates
def test_seeds_retrain_cycle_0_and_judge_with_one_held_out_judge(tmp_path, monkeypatch):
    """--seeds 2: each replicate trains its own base and detector trunk (different bits), draws its own SIR
    candidates and measures what replicate 0 measures (the control's and the final stage's detectors); the
    judge is one model, trained once. --judge_holdout 0.5: the judge alone trains on the train split's second
    half, every other model on the first. --compute_control: an MLE control on the adversarial arm's FLOPs."""
    data_dir = tmp_path / "tiny_char"
    (tmp_path / "input.txt").write_text(make_text(6000, seed=3))
    prepare_corpus(str(tmp_path / "input.txt"), str(data_dir), "char", 0.9, log=lambda *a: None)
    cfg = tmp_path / "tiny.py"
    cfg.write_text(tiny_train_config())
    args = tiny_args(tmp_path, data_dir, cfg)
    args[args.index("--detector") + 1] = "strong_trunk"
    r = run(args + ["--seeds", "2", "--arms", "sir", "--sir_n", "2", "--no_null_arm", "--judge_holdout", "0.5",
                    "--compute_control", "--extra_detector_trunk=--max_iters 40 --lr_decay_iters 40",
                    "--no_control_detector"])  # (each replicate's later detector: the final stage's)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = tmp_path / "run"
    roots = {0: out, 1: out / "seed_1"}
    for name in ("base", "detector_trunk"):
        assert sha256(roots[0] / f"cycle_0/{name}/ckpt.pt") != sha256(roots[1] / f"cycle_0/{name}/ckpt.pt"), name
    assert (out / "cycle_0/judge/ckpt.pt").exists() and not (out / "seed_1/cycle_0/judge").exists()
    judges = {json.loads((roots[k] / "cycle_1/eval.done.json").read_text())["judge"] for k in roots}
    assert judges == {str((out / "cycle_0/judge/ckpt.pt").resolve())}
    sirs = [json.loads((roots[k] / "cycle_1/sir/sir.done.json").read_text()) for k in roots]
    assert sirs[0]["point"]["judge_items"] != sirs[1]["point"]["judge_items"] and sirs[1]["noise_seed"] != 1337
    for k in roots:  # every replicate measures what replicate 0 measures
        for step in ("cycle_2/detect", "cycle_0/compute_control"):
            assert (roots[k] / f"{step}.done.json").exists(), (k, step)
        assert not (roots[k] / "cycle_2/control").exists(), k
    # the judge's held-out half: the two parts are the train split, and no other model trained on the judge's
    import numpy as np
    parts = {p: np.fromfile(out / f"data/{p}/train.bin", dtype=np.uint16) for p in ("arms", "judge")}
    whole = np.fromfile(data_dir / "train.bin", dtype=np.uint16)
    assert np.array_equal(np.concatenate([parts["arms"], parts["judge"]]), whole)
    assert abs(len(parts["arms"]) - len(parts["judge"])) <= 1
    import torch
    data_of = lambda p: torch.load(p, weights_only=True, map_location="cpu")["config"]["data_dir"]  # noqa: E731
    assert data_of(out / "cycle_0/judge/ckpt.pt") == str(out / "data/judge")
    for p in ("cycle_0/base/ckpt.pt", "seed_1/cycle_0/detector_trunk/ckpt.pt", "cycle_1/control/mle/last.pt"):
        assert data_of(out / p) == str(out / "data/arms"), p
    summary = json.loads((out / "summary.json").read_text())
    assert summary["judge_data"]["holdout"] == 0.5 and "no arm" in summary["judge_data"]["what"]
    gens = {(g["cycle"], g["arm"], g["replicate"]) for g in summary["generators"]}
    assert {(0, "base", 1), (0, "trunk", 1), (0, "compute", 0), (0, "compute", 1), (1, "sir", 1)} <= gens
    fr = summary["frontier"]["cycle_1"]
    assert sorted(fr["controls"]) == ["compute", "control", "trunk"] and fr["replicates"] == 2
    comp = next(g for g in summary["generators"] if g["arm"] == "compute" and g["replicate"] == 0)
    assert comp["compute_flops"] == pytest.approx(comp["target_flops"], rel=0.2)
    v = fr["arms"]["adversarial"]["verdicts"]["control"]
    assert v["family"] == 6 and v["at_quality"]["seeds"] == 2 and not v["at_quality"]["provisional"]
    assert summary["frontier_verdicts"][0].startswith("cycle 1 (2 seeds, cycle 0 retrained per seed), T = 1:")
    md = (out / "summary.md").read_text()
    assert "| 1 | 2 seeds, cycle 0 retrained per seed | adversarial |" in md
    # the A/A test on this run: two pairs of same-budget continuations of its base, with its judge, forked from a
    # warm launcher on a CPU as run_cycles' steps are, the launcher ended with them (run here, to see its runner)
    import aa_test
    runners = []

    class Runner(aa_test.StepRunner):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            runners.append(self)
            self.asked_warm = kw.get("warm")

    monkeypatch.setattr(aa_test, "StepRunner", Runner)
    aa_test.main(["--run", str(out), "--pairs", "2", "--kinds", "continuation", "--device", "cpu"])
    assert [(x.asked_warm, x.launcher) for x in runners] == [(True, None)]
    aa = json.loads((out / "aa/aa.json").read_text())
    rep = aa["reports"]["continuation"]
    assert len(rep["pairs"]) == 2 and rep["rates"]["or_1_seed"][1] == 2 and set(aa["aa_noise"]) == {"continuation"}
    first = torch.load(out / "aa/continuation/model_0/last.pt", weights_only=True, map_location="cpu")
    assert first["config"]["init_from"] == summary["base"]["generator"]
    assert first["config"]["max_iters"] == json.loads((out / "cycle_1/control/mle.done.json").read_text())["iters"]
    assert "| 1 seed, the OR of before" in (out / "aa/aa.md").read_text()
    assert (out / "aa/null_p.png").exists() == bool(rep.get("null_p"))  # the null p's histogram, where it has p's
    r = run_script(["aa_test.py", "--run", tmp_path / "nowhere"], cwd=ROOT, timeout=120, env=ENV)
    assert r.returncode == 2 and "no cycle_0/base.done.json yet" in r.stderr, r.stderr
