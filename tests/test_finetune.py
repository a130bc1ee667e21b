"""lib/finetune.py, the layer train_grpo.py and train_spin.py share (state and run bases, save, restore,
the records a resumed run keeps, the val summary), and lib/rl_data.py's checked prompt corpus."""
import argparse
import contextlib
import dataclasses
import os

import numpy as np
import pytest
import torch

from core.devices import DistInfo, grad_scaler
from core.errors import DataError, ProjectError
from core.training import RunContext, kept_records
from helpers import TINY, prepare_alphabet_data
from lib import finetune
from lib.checkpoint import read_checkpoint
from lib.corpus import describe_split
from lib.rl_data import prompt_corpus
from model import GPT, GPTConfig
from tokenization_manager import TokenizationManager


def _run(tmp_path, master=True, max_steps=10):
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, vocab_size=16, **TINY))
    opt = model.configure_optimizers(0.0, 1e-3, (0.9, 0.95), "cpu")
    ctx = RunContext(DistInfo(rank=0 if master else 1), "cpu", "float32", contextlib.nullcontext(),
                     grad_scaler("cpu", "float32"), writes=master)
    args = argparse.Namespace(max_steps=max_steps, out_dir=str(tmp_path))
    probe = torch.arange(16)[None] % 16
    return finetune.FinetuneRun(args, ctx, model, opt, {"data": {"d": 1}, "tokenization": None}, "sha", probe, 16,
                                str(tmp_path / "ckpt.pt"))


def test_kept_records_keep_up_to_the_checkpoint_step_and_a_finished_runs_last_eval():
    recs = [{"kind": "eval", "step": 0}, {"kind": "step", "step": 1}, {"kind": "step", "step": 2},
            {"kind": "eval", "step": 2}, {"kind": "round", "step": 2}, {"kind": "step", "step": 3}]
    keep = kept_records(2, finetune.relogged(finetune.FinetuneState(step=2)))
    assert [r for r in recs if keep(r)] == recs[:3]  # the step-2 eval is redone by the resumed run
    keep = kept_records(2, finetune.relogged(finetune.FinetuneState(step=2, finished=True)))
    assert [r for r in recs if keep(r)] == recs[:5]  # a finished run redoes nothing of its last step


def test_save_then_restore_round_trips_and_reopens_a_larger_max_steps(tmp_path, capsys):
    run = _run(tmp_path)
    state = finetune.FinetuneState(step=4, stop_reason="max_steps", finished=True,
                                   val_hist=[{"val_loss": 2.0, "val_ppl": 7.4}, {"val_loss": 1.5, "val_ppl": 4.5}])
    run.model(run.probe[:, :-1], run.probe[:, 1:])[1].backward()
    run.optimizer.step()
    finetune.save(state, run, "mine", {**state.to_dict(), "base_sha256": run.base_sha})
    ck = read_checkpoint(run.ckpt_path)
    assert ck["iter_num"] == 4 and ck["best_val_loss"] == 1.5 and ck["data"] == {"d": 1}
    assert ck["mine"]["val_history"] == state.val_hist and ck["config"]["max_steps"] == 10
    # resumed with a larger --max_steps: the step budget was the only reason to stop, so it continues
    model2 = GPT(GPTConfig(block_size=16, vocab_size=16, **TINY))
    run2 = dataclasses.replace(run, model=model2, optimizer=model2.configure_optimizers(0.0, 1e-3, (0.9, 0.95), "cpu"))
    make = lambda d: finetune.FinetuneState(**finetune.FinetuneState.fields_from_dict(d))  # noqa: E731
    back = finetune.restore(run2, ck, "mine", make)
    assert (back.step, back.stop_reason, back.finished, back.val_hist) == (4, None, False, state.val_hist)
    assert torch.equal(run2.optimizer.state_dict()["state"][0]["exp_avg"],
                       run.optimizer.state_dict()["state"][0]["exp_avg"])
    assert f"resuming from {run.ckpt_path} at step 4" in capsys.readouterr().out
    # at the same --max_steps a finished run stays finished; another rank prints nothing
    other_rank = dataclasses.replace(run2, args=argparse.Namespace(max_steps=4), ctx=_run(tmp_path, False).ctx)
    back = finetune.restore(other_rank, ck, "mine", make)
    assert (back.stop_reason, back.finished) == ("max_steps", True) and capsys.readouterr().out == ""


def test_save_refuses_a_policy_whose_log_probs_are_not_finite(tmp_path):
    run = _run(tmp_path)
    with torch.no_grad():
        run.model.transformer.wte.weight.fill_(float("nan"))
    with pytest.raises(ProjectError, match="policy log-prob became nan at step 2"):
        finetune.save(finetune.FinetuneState(step=2), run, "mine", {})
    assert not os.path.exists(run.ckpt_path)


def test_val_summary_before_and_after():
    assert finetune.val_summary([]) == dict.fromkeys(("val_loss_before", "val_ppl_before", "val_loss_after",
                                                      "val_ppl_after"))
    vh = [{"val_loss": 2.0, "val_ppl": 7.0}, {"val_loss": 1.8, "val_ppl": 6.0}, {"val_loss": 1.5, "val_ppl": 4.5}]
    assert finetune.val_summary(vh) == {"val_loss_before": 2.0, "val_ppl_before": 7.0, "val_loss_after": 1.5,
                                        "val_ppl_after": 4.5}


def test_prompt_corpus_reads_the_recorded_directory_and_refuses_other_splits(tmp_path):
    d = prepare_alphabet_data(tmp_path / "a")
    info = TokenizationManager("char", meta_path=os.path.join(d, "meta.pkl")).info
    record = describe_split(os.path.join(d, "train.bin"), os.path.join(d, "val.bin"), info, d)
    corpus = prompt_corpus(record, None)
    assert corpus.train_bin == record["train_bin"]
    assert np.array_equal(corpus.val, np.fromfile(record["val_bin"], np.uint16))
    assert prompt_corpus(record, d).val_bin == os.path.join(d, "val.bin")
    other = prepare_alphabet_data(tmp_path / "b", n_chars=5000)
    with pytest.raises(DataError, match="is not the train split the policy was trained on"):
        prompt_corpus(record, other)
    assert prompt_corpus(record, other, splits=()).data_dir == other  # nothing asked, nothing checked
    with pytest.raises(DataError, match="train split not found: .*nowhere/train.bin"):
        prompt_corpus(record, str(tmp_path / "nowhere"))
    with pytest.raises(DataError, match="records no training data"):
        prompt_corpus(None, None)
    with pytest.raises(DataError, match="outside one prepared directory"):
        prompt_corpus({**record, "val_bin": str(tmp_path / "elsewhere" / "val.bin")}, None)
