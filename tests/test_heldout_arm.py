"""The heldout arm (issue 78): its generator trains on the first (1 - h) of the D characters and its detector's natural
text is the other h, so the detector never reads its generator's training text as natural; an arm whose detector is not
above chance keeps its word, marked void."""
import os

import numpy as np
import pytest

from experiment import cycle0, power
from experiment.presets import preset
from experiment.run import Run
from experiment.verdicts import arm_detector, qualify_words
from helpers import make_text, prepare_char_data, run_script, train_tiny_checkpoint
from lib.corpus import Corpus

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_heldout_detector_never_reads_its_generators_training_text_as_natural(tmp_path):
    """The D characters' train part: 7,200 lower-case tokens, then 1,800 UPPER-case ones (h = 0.2 cuts exactly there).
    The generator's text is the lower case alone; the reward data the run builds for the heldout arm's detector (the
    command Run.reward_data makes, run for real) holds natural tokens of the upper case alone."""
    text = make_text(7200, 1, lower=True) + make_text(1800, 2, upper=True) + make_text(1000, 3, lower=True)
    _, limit = prepare_char_data(str(tmp_path), text=text)
    fit, held = cycle0.heldout_dirs(limit, str(tmp_path / "run"), 0.2)
    f, h, src = Corpus(fit), Corpus(held), Corpus(limit)
    assert len(f.train) == 7200 and len(h.train) == 1800
    assert np.array_equal(np.concatenate([f.train, h.train]), src.train)
    assert np.array_equal(f.val, src.val) and np.array_equal(h.val, src.val)  # both keep the dev slice
    itos = src.tokenizer.decode
    assert itos(f.train.tolist()).islower() and itos(h.train.tolist()).isupper()
    assert cycle0.heldout_dirs(limit, str(tmp_path / "run"), 0.2) == (fit, held)  # written once
    from core.errors import ProjectError
    with pytest.raises(ProjectError, match="heldout_share 0.99999 leaves an empty part of the 9,000 train tokens"):
        cycle0.heldout_dirs(limit, str(tmp_path / "run3"), 0.99999)
    with pytest.raises(ProjectError, match="--judge_holdout 0 leaves an empty part"):
        cycle0.judge_holdout(limit, str(tmp_path / "run3"), 0)
    gen = train_tiny_checkpoint(fit, str(tmp_path / "gen.pt"), steps=3)

    import run_cycles
    run = Run(run_cycles.parse_args(["--device", "cpu", "--preset", "data_limit", "--data_dir", limit]),
              preset("data_limit"), str(tmp_path / "run"))
    made = {}
    run.script_step = lambda d, step, label, cmd, *a, **k: made.update(cmd=cmd) or {"block_size": 32}
    run.reward_data(str(tmp_path / "rd"), gen, "1", "heldout", natural_dir=held)
    cmd = made["cmd"]
    assert cmd[cmd.index("--train_bin") + 1] == os.path.join(held, "train.bin")
    assert cmd[cmd.index("--val_bin") + 1] == os.path.join(limit, "val.bin")
    cmd += ["--block_size", "32", "--max_blocks_per_split", "24", "--device", "cpu"]
    r = run_script(cmd, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rd = str(tmp_path / "rd" / "reward_data")
    meta = dict(line.split(": ", 1) for line in open(os.path.join(rd, "train_metadata.txt")).read().splitlines()
                if ": " in line)
    n = int(meta["num_samples"])
    x = np.fromfile(os.path.join(rd, "train_x.bin"), dtype=np.uint16).reshape(n, 32)
    y = np.fromfile(os.path.join(rd, "train_y.bin"), dtype=np.float32).reshape(n, 2)
    natural = [itos(x[i, :int(round(y[i, 0] * 32))].tolist()) for i in range(n)]
    letters = "".join(natural)
    assert sum(c.isalpha() for c in letters) > 50 and not any(c.islower() for c in letters), letters[:200]
    # the arms' own reward data (no natural_dir) keeps reading the D characters, the split check on
    run.reward_data(str(tmp_path / "rd2"), gen, "1", "cycle")
    assert made["cmd"][made["cmd"].index("--train_bin") + 1] == os.path.join(limit, "train.bin")
    assert "--allow_split_mismatch" not in made["cmd"]


def entry(arm, rep, **kw):
    return {"arm": arm, "cycle": 1, "replicate": rep, **kw}


def test_an_arm_whose_detector_is_not_above_chance_keeps_its_word_marked_void():
    """The cycle's detector (on the entering generator's entry) judges the adversarial arm; an arm's own detector judges
    it (heldout, unfrozen); DDO has none. Failed unless the 95 % interval of the val AUROC lies above 0.5."""
    gens = [{"arm": "base", "cycle": 0, "replicate": r, "det_auroc": a, "det_auroc_se": 0.02}
            for r, a in enumerate((0.18, 0.21, 0.17))]
    gens += [entry("adversarial", r) for r in range(3)] + [entry("ddo", r) for r in range(3)]
    gens += [entry("heldout", r, own_detector={"auroc": a, "auroc_se": 0.02}) for r, a in enumerate((0.84, 0.81, 0.86))]
    adv, held = arm_detector(gens, 1, "adversarial"), arm_detector(gens, 1, "heldout")
    assert adv["failed"] and adv["auroc"] == pytest.approx(0.1867, abs=1e-4) and adv["seeds"] == 3
    assert not held["failed"] and held["ci95"][0] > 0.5 and arm_detector(gens, 1, "ddo") is None
    # at chance: an interval that reaches 0.5 fails, as one wholly below it does; one seed uses its own SE
    assert power.detector_check([(0.55, 0.03)])["failed"] and not power.detector_check([(0.56, 0.02)])["failed"]
    assert power.detector_check([(0.52, 0.0), (0.60, 0.0), (0.49, 0.0)])["failed"]
    report = {1: {"arms": {"adversarial": {"detector": adv, "verdicts": {"trunk": {"verdict": "inside",
                                                                                   "run_verdict": "inside"}}},
                           "heldout": {"detector": held, "verdicts": {"trunk": {"verdict": "inconclusive",
                                                                                "run_verdict": "inconclusive"}}}}}}
    out = qualify_words(report)[1]["arms"]
    v = out["adversarial"]["verdicts"]["trunk"]
    assert v["run_verdict"] == "inside" and "does not count" in v["void"] and "0.187" in v["void"]
    assert "void" not in out["heldout"]["verdicts"]["trunk"]


def test_the_heldout_arm_needs_the_data_limited_preset():
    import run_cycles
    from core.errors import ProjectError
    with pytest.raises(ProjectError, match="--arms heldout: the data-limited test's arms"):
        run_cycles.check_args(run_cycles.parse_args(["--device", "cpu", "--preset", "quick", "--arms", "heldout"]))


def test_a_dev_selected_grid_never_reads_the_val_split_and_other_seeds_train_its_choice(tmp_path):
    """tuning.choose on real tiny models: replicate 0 measures every grid point and MLE at its limit on the dev slice
    (the arms' val split) with the val split gone (its directory deleted, the run's corpus None), keeps the lowest by
    the verdict's rule, and charges the others' FLOPs as the selection; replicate 1 trains the chosen point alone."""
    import shutil

    import run_cycles
    from experiment import tuning
    from experiment.arms import ADVERSARIAL, Cycle, RunState
    from experiment.steps import read_done
    from lib.checkpoint import load_model

    _, real = prepare_char_data(str(tmp_path / "real"), text=make_text(12000, 5))
    _, limit = prepare_char_data(str(tmp_path / "limit"), text=make_text(6000, 6))  # its val split: the dev slice
    base = train_tiny_checkpoint(limit, str(tmp_path / "base.pt"), steps=30)
    # the grid ({}, {"max_steps": 0}, learning rate x 3, beta / 4): the third point barely trained, far worse
    recipe, lr3, beta4 = (train_tiny_checkpoint(limit, str(tmp_path / f"p{i}.pt"), steps=steps, seed=i)
                          for i, steps in ((0, 30), (2, 2), (3, 31)))
    judge = train_tiny_checkpoint(limit, str(tmp_path / "judge.pt"), steps=40, seed=3)
    args = run_cycles.parse_args(["--device", "cpu", "--preset", "data_limit", "--data_dir", limit])
    args.temps = [0.5, 0.8, 1.0, 1.3, 2.0]
    run = Run(args, preset("data_limit"), str(tmp_path / "run"))
    run.eval_data_dir, run.corpus = real, None
    shutil.rmtree(real)  # the verdict's val split: nothing here may read it
    run.judge_model = load_model(judge, device="cpu")[0]
    run.quality_samples, run.sample_len, run.eval_block_size = 16, 16, 32
    grid = run.preset["arm_grids"]["adversarial"]
    assert len(grid) <= 4 and {} in grid and {"max_steps": 0} in grid  # at most MLE's four points
    state = RunState(rep=0, root=str(tmp_path / "run"), trunk=None, gens={(0, "base"): {"generator": base}}, arms={},
                     gen_loss=0.0, gen_ppl=0.0, stopper=None)
    c = Cycle(n=1, dir=str(tmp_path / "run" / "cycle_1"), seed="1", tag="cycle 1", rm={}, entering=(0, "base"),
              entering_flops=0.0)
    assert set(tuning.to_run(run, state, c, ADVERSARIAL)) == {"adversarial", ("adversarial", 2), ("adversarial", 3)}
    recs = {"adversarial": {"checkpoint": recipe, "flops": {"flops": 10.0}},
            ("adversarial", 2): {"checkpoint": lr3, "flops": {"flops": 20.0}},
            ("adversarial", 3): {"checkpoint": beta4, "flops": {"flops": 40.0}}}
    rec, selection, tuned = tuning.choose(run, state, c, ADVERSARIAL, recs, base)
    sel = read_done(c.dir, "grid")
    scores = [(p["rank"], p["diff"]) for p in sel["points"]]
    assert tuned["chosen"] == sel["chosen"] == scores.index(min(scores)) != 2  # the barely-trained point loses
    assert rec["checkpoint"] == sel["points"][sel["chosen"]]["checkpoint"]
    assert selection == sum(p["flops"] for k, p in enumerate(sel["points"]) if k != sel["chosen"])
    assert sel["points"][1]["checkpoint"] == base and sel["points"][1]["flops"] == 0  # the start: no step, no FLOPs
    dev = read_done(os.path.join(state.root, "cycle_0"), "dev_frontier")
    assert dev["generator"] == base and set(dev["curve"]) == {"0.5", "0.8", "1", "1.3", "2"}
    # replicate 1 trains replicate 0's choice alone (and the recipe: the adversarial arm's budget), charged no selection
    state1 = RunState(rep=1, root=str(tmp_path / "run" / "seed_1"), trunk=None, gens={}, arms={}, gen_loss=0.0,
                      gen_ppl=0.0, stopper=None)
    c1 = Cycle(n=1, dir=os.path.join(state1.root, "cycle_1"), seed="2", tag="seed 1: cycle 1", rm={},
               entering=(0, "base"), entering_flops=0.0)
    chosen = sel["chosen"]
    keys = set(tuning.to_run(run, state1, c1, ADVERSARIAL))
    assert keys == {"adversarial"} | ({("adversarial", chosen)} if chosen in (2, 3) else set())
    rec1 = {k: {"checkpoint": f"{k}.pt", "flops": {"flops": 1.0}} for k in keys}
    got, selection1, tuned1 = tuning.choose(run, state1, c1, ADVERSARIAL, rec1, "start.pt")
    assert selection1 == 0.0 and tuned1["chosen"] == chosen and tuned1["from_replicate"] == 0
    assert got["checkpoint"] == {0: "adversarial.pt", 1: "start.pt"}.get(chosen, f"{('adversarial', chosen)}.pt")


def test_results_md_names_each_tuned_arms_choice_its_selections_flops_and_its_detector():
    import importlib.util
    spec = importlib.util.spec_from_file_location("results_script", os.path.join(ROOT, "docs", "results.py"))
    results = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(results)
    s = {"generators": [{"arm": "adversarial", "cycle": 1, "replicate": 1, "tuned": {"settings": {}, "chosen": 0}},
                        {"arm": "adversarial", "cycle": 1, "replicate": 0,
                         "tuned": {"settings": {"learning_rate": 1.5e-4}, "chosen": 2, "selection_flops": 6.5e12}},
                        {"arm": "ddo", "cycle": 1, "tuned": {"settings": {}, "chosen": 0, "selection_flops": 1e12}}]}
    assert results.tuned_cell(s, "adversarial") == "learning_rate 0.00015 (6.5e+12)"  # seed 0's choice
    assert results.tuned_cell(s, "ddo") == "the recipe (1e+12)" and results.tuned_cell(s, "sir") == "-"
    failed = {"detector": {"auroc": 0.18, "ci95": [0.15, 0.21], "failed": True}}
    assert results.detector_cell(failed) == "0.180 [0.150, 0.210] **failed**" and results.detector_cell({}) == "-"
    # a comparison whose MDE is past its margin names the seeds that would reach it (the pre-registered next step)
    c = {"diff": 0.01, "ci95": [-0.05, 0.07], "mde": 0.08, "delta": 0.03, "seeds_for_margin": 41,
         "verdict": "inconclusive"}
    cell = results.limit_cell({"trunk": {"verdict": "inconclusive", "at_quality": c, "at_coverage": c}}, "trunk")
    assert "quality +0.010 [-0.050, +0.070], MDE 0.080, δ 0.030 (δ at 41 seeds)" in cell
    none = {**c, "seeds_for_margin": None}
    assert "(δ out of reach by seeds)" in results.limit_cell({"trunk": {"verdict": "inconclusive", "at_quality": none,
                                                                        "at_coverage": none}}, "trunk")
    # and why, where the evaluation's own noise (every seed's items) floors the MDE past the margin
    floored = {**none, "within_se": 0.03, "interp_err": 0.0}  # (1.960 + 0.842) x 0.03 = 0.084 > 0.03
    assert "(δ out of reach by seeds: the evaluation's noise floors the MDE at 0.084)" in results.limit_cell(
        {"trunk": {"verdict": "inconclusive", "at_quality": floored, "at_coverage": floored}}, "trunk")
    assert "seeds)" not in results.limit_cell({"trunk": {"verdict": "inconclusive", "at_coverage": c, "at_quality":
                                                         {**c, "mde": 0.02}}}, "trunk").split(";")[0]


def test_an_arm_tuned_to_its_start_says_its_word_is_its_starts():
    from experiment.verdicts import tuned_to_start
    start = {"settings": {"max_steps": 0}, "chosen": 1}
    gens = [entry("adversarial", r, tuned=start) for r in range(2)] + [entry("ddo", 0, tuned=start),
                                                                         entry("ddo", 1, tuned={"settings": {}})]
    assert tuned_to_start(gens, 1, "adversarial") and not tuned_to_start(gens, 1, "ddo")
    assert not tuned_to_start(gens, 1, "sir")  # an untuned arm
    report = {1: {"arms": {"adversarial": {"tuned_to_start": True, "verdicts": {"trunk": {"verdict": "equivalent",
                                                                                         "run_verdict": "equivalent"}}}}}}
    v = qualify_words(report)[1]["arms"]["adversarial"]["verdicts"]["trunk"]
    assert v["run_verdict"] == "equivalent" and "its start generator's word, not its method's" in v["start"]
