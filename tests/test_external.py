"""A user's arm (run_cycles --arm NAME='TEMPLATE') and a checkpoint from elsewhere (compare.py): the template's
checks, its filling, the model read back, the FLOPs it reports, the refusal of another tokenizer or context, and a
command stopped at its limit."""
import json
import os
import sys
import time
from types import SimpleNamespace

import pytest

from core.errors import ProjectError, TokenizationMismatchError
from experiment import external
from experiment.runner import Command, StepRunner
from helpers import make_text, prepare_char_data, run_script, strip_to_nanogpt, train_tiny_checkpoint
from lib.corpus import Corpus

GOOD = "python examples/label_smoothing.py --init {generator} --out_dir {out_dir} --max_updates {updates}"


@pytest.mark.parametrize("spec, says", [
    ("smooth", "is not --arm NAME=TEMPLATE"),
    ("Smooth=" + GOOD, "is not --arm NAME=TEMPLATE"),
    ("control=" + GOOD, "the name is taken"),
    ("sir=" + GOOD, "the name is taken"),
    ("mine=python x.py --init {generator} --out_dir {out_dir} --steps {steps}", r"names \{steps\}"),
    ("mine=python x.py --out_dir {out_dir}", r"lacks \{generator\}"),
    ("mine=python x.py --init {generator}", r"lacks \{out_dir\}"),
    ("mine=python 'x.py --init {generator} --out_dir {out_dir}", "cannot be read"),
    ("mine=python x.py --init {generator --out_dir {out_dir}", "cannot be read"),
])
def test_a_bad_template_is_refused_naming_the_arm_and_the_fix(spec, says):
    with pytest.raises(ProjectError, match=says) as e:
        external.parse_arm(spec, taken={"sir", "adversarial"})
    assert e.value.suggestion  # every refusal says what to do


def test_a_template_fills_one_word_per_value_and_drops_an_empty_resume():
    name, template = external.parse_arm("mine=python x.py --init {generator} --out_dir {out_dir} {resume} "
                                        "--lr={learning_rate}")
    words = external.fill(template, {"generator": "/a b/c.pt", "out_dir": "/o", "resume": "", "learning_rate": 1e-3})
    assert name == "mine" and words == ["python", "x.py", "--init", "/a b/c.pt", "--out_dir", "/o", "--lr=0.001"]
    words = external.fill(template, {"generator": "g", "out_dir": "o", "resume": "--resume", "learning_rate": 1})
    assert "--resume" in words


@pytest.fixture(scope="module")
def corpus_and_ckpt(tmp_path_factory):
    root = tmp_path_factory.mktemp("external")
    _, data_dir = prepare_char_data(str(root))
    ckpt = train_tiny_checkpoint(data_dir, str(root / "ckpt.pt"), steps=2)
    return root, data_dir, ckpt


def test_the_model_a_command_wrote_is_found_and_its_absence_named(corpus_and_ckpt, tmp_path):
    root, _, ckpt = corpus_and_ckpt
    with pytest.raises(ProjectError, match="arm mine wrote no model in .*ckpt.pt.*config.json") as e:
        external.find_model(str(tmp_path), "arm mine")
    assert "{out_dir}/ckpt.pt" in e.value.suggestion
    os.link(ckpt, tmp_path / "ckpt.pt")
    assert external.find_model(str(tmp_path), "arm mine") == str(tmp_path / "ckpt.pt")
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    assert external.find_model(str(hf), "arm mine") == str(hf)


def test_reported_flops_are_read_checked_or_unknown(tmp_path):
    assert external.reported_flops(str(tmp_path), "arm mine") is None
    (tmp_path / "flops.json").write_text(json.dumps({"flops": 1.5e12}))
    assert external.reported_flops(str(tmp_path), "arm mine") == 1.5e12
    for bad in ('{"flops": -1}', '{"flops": "many"}', '{"n": 3}', "not json", '{"flops": true}'):
        (tmp_path / "flops.json").write_text(bad)
        with pytest.raises(ProjectError, match="arm mine: .*flops.json is not"):
            external.reported_flops(str(tmp_path), "arm mine")


def test_a_generator_of_another_tokenizer_or_context_is_refused_saying_which(corpus_and_ckpt, tmp_path):
    root, data_dir, ckpt = corpus_and_ckpt
    corpus = Corpus(data_dir)
    external.check_generator(ckpt, corpus, 32, "mine")  # the run's own kind: accepted
    with pytest.raises(ProjectError, match="a context of 32 tokens, the run's generators 64"):
        external.check_generator(ckpt, corpus, 64, "mine")
    # another char vocabulary of the same size: the characters differ, and the message shows them
    _, other_dir = prepare_char_data(str(tmp_path / "other"), text=make_text(10000, seed=5, upper=True))
    other = train_tiny_checkpoint(other_dir, str(tmp_path / "other.pt"), steps=1)
    with pytest.raises(TokenizationMismatchError, match="different tokenizers"):
        external.check_generator(other, corpus, 32, "mine")
    # nanoGPT's format records no tokenizer: its vocabulary size is checked, and it is said to be assumed
    nano = strip_to_nanogpt(ckpt, str(tmp_path / "nano.pt"))
    external.check_generator(nano, corpus, 32, "mine")
    if Corpus(other_dir).tokenizer.vocab_size != corpus.tokenizer.vocab_size:
        with pytest.raises(TokenizationMismatchError, match="a vocabulary of"):
            external.check_generator(strip_to_nanogpt(other, str(tmp_path / "nano_other.pt")), corpus, 32, "mine")


def test_a_command_past_its_limit_is_stopped_and_named(tmp_path):
    runner = StepRunner(str(tmp_path / "steps.log"), stop_grace=2.0)
    t0 = time.time()
    with pytest.raises(ProjectError, match="'arm mine' was stopped after its limit of 1 s") as e:
        runner.run("arm mine", Command(["python", "-c", "import time; print('started', flush=True); time.sleep(60)"]),
                   timeout=1.0)
    assert time.time() - t0 < 20 and "--arm_timeout" in e.value.suggestion
    assert "started" in (tmp_path / "steps.log").read_text()
    # one that never stops printing is stopped at its limit too
    t0 = time.time()
    with pytest.raises(ProjectError, match="stopped after its limit of 1 s"):
        runner.run("arm chatty", Command(["python", "-c", "while True: print('x' * 200, flush=True)"]), timeout=1.0)
    assert time.time() - t0 < 20
    # the user's words run as given (python is this interpreter), and a quick one is not stopped
    assert runner.run("arm ok", Command([sys.executable, "-c", "print('ok')"]), timeout=30.0) < 30


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, OMP_NUM_THREADS="1")


def script(name, *args, cwd=ROOT):
    return run_script([os.path.join(ROOT, name), *args], cwd=cwd, env=ENV, timeout=900)


@pytest.fixture(scope="module")
def quick_run_with_an_arm(tmp_path_factory):
    """The quick preset (--smoke sizes) with the example arm of examples/label_smoothing.py beside its own."""
    root = tmp_path_factory.mktemp("arm_run")
    _, data_dir = prepare_char_data(str(root), text=make_text(6000, seed=3))
    template = ("python examples/label_smoothing.py --init {generator} --data_dir {data_dir} --out_dir {out_dir} "
                "--seed {seed} --max_updates {updates} --batch_size {batch_size} --block_size {block_size} "
                "--learning_rate {learning_rate} --device {device}")
    out = root / "run"
    r = script("run_cycles.py", "--preset", "quick", "--smoke", "--max_cycles", "1", "--out_dir", str(out),
               "--data_dir", data_dir, "--device", "cpu", "--arm", "smooth=" + template,
               "--no_null_arm", "--no_control_detector", "--no_final_detector")  # steps these tests do not read
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return root, data_dir, out, json.loads((out / "summary.json").read_text())


@pytest.mark.slow  # a run_cycles.py pipeline, then compare.py on it
def test_the_example_arm_runs_on_the_controls_budget_and_is_judged_against_both(quick_run_with_an_arm):
    root, _, out, summary = quick_run_with_an_arm
    arm = next(g for g in summary["generators"] if g["arm"] == "smooth")
    control = next(g for g in summary["generators"] if g["arm"] == "control" and g["cycle"] == 1)
    rec = json.loads((out / "cycle_1" / "smooth" / "command.done.json").read_text())
    b = rec["budget"]
    # the same-budget control's budget: its updates, rows and block, its learning rate
    assert (b["updates"], b["batch_size"], b["block_size"]) == (control["mle_iters"], control["mle_batch_size"],
                                                                 control["mle_block_size"])
    assert b["learning_rate"] == control["mle_learning_rate"] and b["tokens"] == control["mle_tokens"]
    assert rec["command"][:2] == ["python", "examples/label_smoothing.py"] and "--init" in rec["command"]
    # the FLOPs its command reported, on top of the base's
    base = next(g for g in summary["generators"] if g["arm"] == "base")
    reported = json.loads((out / "cycle_1" / "smooth" / "out" / "flops.json").read_text())["flops"]
    assert arm["flops_reported"] and arm["compute_flops"] == pytest.approx(base["compute_flops"] + reported)
    verdicts = summary["frontier"]["cycle_1"]["arms"]["smooth"]["verdicts"]
    assert set(verdicts) == {"control", "trunk"}
    assert all(v["verdict"] in ("beyond", "inside", "tie", "mixed", "degenerate") for v in verdicts.values())
    assert "smooth" in (out / "summary.md").read_text()


@pytest.mark.slow
def test_compare_reproduces_an_arms_verdict_from_its_hf_export_and_refuses_another_tokenizer(quick_run_with_an_arm,
                                                                                            tmp_path):
    root, data_dir, out, summary = quick_run_with_an_arm
    gens = summary["generators"]
    adv = next(g for g in gens if g["arm"] == "adversarial" and g["cycle"] == 1)
    control = next(g for g in gens if g["arm"] == "control" and g["cycle"] == 1)
    hf = tmp_path / "hf"
    r = script("export_hf.py", "--ckpt", adv["generator"], "--out_dir", str(hf))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    nano = strip_to_nanogpt(control["generator"], str(tmp_path / "nano.pt"))
    before = {p: os.path.getmtime(p) for p in (out / "summary.json", out / "summary.md")}
    r = script("compare.py", "--run", str(out), f"hf_adv={hf}", f"nano_ctl={nano}", "--device", "cpu")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rec = json.loads((out / "compare" / "compare.json").read_text())
    run_verdicts = summary["frontier"]["cycle_1"]["arms"]["adversarial"]["verdicts"]
    for cname in ("control", "trunk"):  # the export's words are the arm's own, its differences within float noise
        mine = rec["frontier"]["1"]["arms"]["hf_adv"]["verdicts"][cname]
        assert mine["verdict"] == run_verdicts[cname]["verdict"]
        for m in ("at_quality", "at_coverage"):
            if run_verdicts[cname][m]["verdict"] != "out of range":
                assert mine[m]["diff"] == pytest.approx(run_verdicts[cname][m]["diff"], abs=1e-4)
    # the control in nanoGPT's format against itself: no difference at all
    same = rec["frontier"]["1"]["arms"]["nano_ctl"]["verdicts"]["control"]
    assert same["verdict"] == "tie" and same["at_quality"].get("diff", 0.0) == pytest.approx(0.0, abs=1e-6)
    assert before == {p: os.path.getmtime(p) for p in before}  # the run's own records untouched
    # a generator of another corpus' tokenizer is refused before anything is swept, saying which
    _, other_dir = prepare_char_data(str(tmp_path / "other"), text=make_text(6000, seed=5, upper=True))
    other = train_tiny_checkpoint(other_dir, str(tmp_path / "other.pt"), steps=1, block_size=32)
    r = script("compare.py", "--run", str(out), f"other={other}", "--device", "cpu")
    assert r.returncode != 0 and "different tokenizers" in r.stdout + r.stderr


def test_the_template_names_the_cycles_detector_and_an_arm_that_reads_it_pays_for_it():
    """{detector}: the cycle's detector checkpoint (issue 78: TRL's GRPOTrainer as an arm reads it); an arm whose
    template names it counts the detector's FLOPs, one that does not, none."""
    from experiment.arms import command_arm
    from experiment.external import fill, parse_arm
    name, template = parse_arm("trl=python examples/trl_grpo.py --init {generator} --reward {detector} "
                               "--out_dir {out_dir}")
    words = fill(template, {"generator": "g/ckpt.pt", "detector": "c 1/reward_ckpt.pt", "out_dir": "o"})
    assert words == ["python", "examples/trl_grpo.py", "--init", "g/ckpt.pt", "--reward", "c 1/reward_ckpt.pt",
                     "--out_dir", "o"]
    reads, other = command_arm((name, template, 60.0)), command_arm(("smooth", "python x.py --init {generator} "
                                                                    "--out_dir {out_dir}", 60.0))
    assert reads.detector_flops and not other.detector_flops
    # and the detector trunk's (when the run trains one), as the adversarial arm pays: the arms' cycle-0 costs
    from experiment.arms import start_state
    run = SimpleNamespace(arms=(), null=False, control=False, user_arms=[(name, template, 60.0), ("smooth", "x", 60.0)],
                          out_dir="r", args=SimpleNamespace(patience=0, min_delta=0.0))
    base = {"generator": "b/ckpt.pt", "flops": {"flops": 10.0}, "val_loss": 1.0, "val_ppl": 2.7}
    state = start_state(run, 0, (base, {"flops": {"flops": 5.0}}), {}, 1)
    assert (state.arms["trl"].flops, state.arms["smooth"].flops, state.arms["adversarial"].flops) == (15.0, 10.0, 15.0)


def test_a_script_of_ours_started_by_a_users_command_runs(tmp_path):
    """A user's arm command that starts one of this project's scripts (TRL's arm runs export_hf.py) passes on what it
    inherits: the step's die-with-run_cycles variable made that script quit at once (exit 1, no output), its parent
    not being run_cycles."""
    runner = StepRunner(str(tmp_path / "steps.log"), stop_grace=2.0)
    child = ("import subprocess, sys; r = subprocess.run([sys.executable, '-c', 'from core.process import "
             "exit_with_launcher; exit_with_launcher(); print(\"the script ran\")'], cwd=%r); sys.exit(r.returncode)"
             % ROOT)
    runner.run("arm nested", Command([sys.executable, "-c", child]), timeout=60.0)
    assert "the script ran" in (tmp_path / "steps.log").read_text()
