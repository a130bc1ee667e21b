"""
GRPO by TRL (issue 78): examples/trl_grpo.py runs TRL's GRPOTrainer for 2 updates on the tiny char generator
(conftest's tiny_char_ckpt) against a detector whose P(natural) is the share of 'e' (helpers.train_gameable_reward),
as run_cycles runs an arm: a subprocess. Its Hugging Face directory loads as a generator and passes run_cycles'
checks (find_model, check_generator), and the rewards TRL received (its rewards.jsonl, and TRL's own logged mean
of each update) are DetectorReward's scores of the same prompts and completions, rescored here, to 1e-5.
"""
import json
import os

import pytest

from experiment.external import check_generator, find_model, reported_flops
from helpers import run_script, train_gameable_reward
from lib.checkpoint import load_model
from lib.corpus import Corpus
from lib.detector_reward import DetectorReward

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOL = 1e-5

try:
    import trl  # noqa: F401
    HAVE_TRL = True
except ImportError:
    HAVE_TRL = False


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_TRL, reason="TRL is not installed (pip install trl)")
def test_trl_grpo_arm_writes_a_generator_rewarded_by_the_detector(tiny_char_ckpt, tmp_path):
    data_dir = tiny_char_ckpt["data_dir"]
    detector = train_gameable_reward(data_dir, str(tmp_path / "det.pt"), x_char="e", steps=40)
    out = tmp_path / "arm"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    r = run_script([os.path.join(ROOT, "examples", "trl_grpo.py"), "--init", tiny_char_ckpt["ckpt"],
                    "--detector", detector, "--data_dir", data_dir, "--out_dir", str(out), "--seed", "0",
                    "--max_updates", "2", "--block_size", "32", "--prompts_per_step", "2",
                    "--num_generations", "4", "--learning_rate", "1e-3", "--device", "cpu"],
                   env=env, cwd=str(tmp_path), timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]

    # (a) a generator run_cycles accepts, of the run's tokenizer and context, which TRL's updates changed
    path = find_model(str(out), "trl")
    assert path == str(out)
    check_generator(path, Corpus(data_dir), 32, "trl")
    model, _, _ = load_model(path, require_mode="generator")
    base, _, _ = load_model(tiny_char_ckpt["ckpt"], require_mode="generator")
    assert model.config.vocab_size == base.config.vocab_size and model.config.block_size == 32
    moved = max(float((p - q).abs().max().detach()) for p, q in zip(model.parameters(), base.parameters()))
    assert moved > 1e-6, "TRL's updates left the weights as they were"
    assert reported_flops(str(out), "trl") > 0

    # (b) the rewards TRL received are DetectorReward's of the same texts
    records = [json.loads(line) for line in open(out / "rewards.jsonl", encoding="utf-8")]
    assert len(records) == 2
    scorer = DetectorReward(detector)
    for rec in records:
        assert len(rec["completions"]) == 8 and all(len(c) == 24 for c in rec["completions"])  # 32 - 8 prompt chars
        again = scorer(prompts=rec["prompts"], completions=rec["completions"])
        assert max(abs(a - b) for a, b in zip(again, rec["rewards"])) <= TOL
        assert abs(sum(again) / len(again) - rec["trl_reward_mean"]) <= TOL  # what TRL logged
    assert len({round(x, 6) for rec in records for x in rec["rewards"]}) > 1, "a constant reward checks nothing"
