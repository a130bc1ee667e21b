"""flops.py: FLOPs per token of a tiny model against a hand count, and each step's total from the summary
record its script writes (no checkpoint is opened)."""
import json

import pytest
import torch

from experiment import flops
from lib.checkpoint import model_shape
from lib.reward_head import Detector
from model import GPT, GPTConfig

ARGS = dict(n_layer=1, n_head=1, n_embd=4, vocab_size=8, block_size=4)


def test_forward_flops_of_a_tiny_model_by_hand():
    # blocks: attention 4x12 + 4x4, MLP 4x16 + 16x4 = 192 weights; LM head 8 x 4 = 32 -> 2 x 224 = 448;
    # attention scores and values: 4 x n_layer 1 x n_embd 4 x context 4 = 64
    assert flops.forward_flops(ARGS) == 512
    assert flops.forward_flops(ARGS, context=2) == 448 + 32
    # a reward head of 4 + 4 LM-feature inputs, 16 hidden: 8x16 + 16x2 = 160, and the LM head it needs (32)
    assert flops.forward_flops(ARGS, reward_head=(8, 16)) == 2 * (192 + 160 + 32) + 64
    # the same count from the model's own Linear layers (what "weight-matrix entries" means)
    model = GPT(GPTConfig(**ARGS, bias=False))
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert 2 * linear + 64 == 512


def test_a_train_run_costs_three_forwards_per_token_plus_its_evaluations():
    rec = {"iters": 10, "batch_size": 3, "block_size": 4, "gradient_accumulation_steps": 2, "eval_interval": 5,
           "eval_iters": 2, **model_shape(GPT(GPTConfig(**ARGS)))}
    rec = flops.step_train(json.loads(json.dumps(rec)))  # as read back from train_summary.json
    # 10 iterations x 3 rows x 2 accumulation x 4 tokens = 240 tokens at 3 x 512; evaluations at 0, 5 and 10:
    # 3 x 2 splits x 2 batches x 3 rows x 4 tokens = 144 tokens at 512
    assert rec["detail"]["train_tokens"] == 240 and rec["detail"]["eval_tokens"] == 144
    assert rec["flops"] == 240 * 3 * 512 + 144 * 512
    assert flops.step_train(None) is None  # no run (a checkpoint given on the command line)
    assert flops.total({"a": rec, "b": None}) == pytest.approx(rec["flops"])


def test_a_detector_and_its_reward_data_from_their_records():
    det = GPT(GPTConfig(**ARGS, mode="reward", reward_head_hidden_dim=16, reward_lm_features=True))
    shape = json.loads(json.dumps(model_shape(det)))
    assert shape["reward_head"] == {"lm_features": True, "hidden_dim": 16}
    f = 2 * (192 + 160 + 32) + 64  # the detector's forward (see above)
    rm = {"iters": 10, "batch_size": 2, "eval_interval": 5, "eval_max_batches": 1, "unfreeze_last_n_blocks": 0,
          "reward_data": {"val_samples": 7}, **shape}
    rec = flops.step_reward_model(rm)
    # a frozen trunk: 1 forward per train token (10 x 2 x 4); 3 evaluations of min(7, 1 x 2) samples x 4 tokens
    assert rec["detail"]["train_tokens"] == 80 and rec["detail"]["eval_tokens"] == 24
    assert rec["flops"] == (80 + 24) * f
    assert flops.step_reward_model({**rm, "unfreeze_last_n_blocks": -1})["flops"] == (3 * 80 + 24) * f
    data = flops.step_reward_data({"tokens": 40, "generator_model_args": ARGS})
    assert data["flops"] == 40 * 512 and data["detail"]["generated_tokens"] == 40
    # GRPO: per token the rollout (1), the policy's update (3) and the reference (1), the detector (f); 2 steps
    # of 2 x 2 rows x 4 tokens; its evaluations (at 0 and 2): 1 val batch of 2 x 4 tokens, 3 reward samples x 4
    grpo = {"steps": 2, "seq_len": 4, "prompts_per_step": 2, "group_size": 2, "num_updates_per_batch": 1,
            "eval_interval": 2, "eval_max_batches": 1, "eval_batch_size": 2, "eval_reward_samples": 3, "ptx_coef": 0.0,
            "model_args": ARGS, "detector": shape}
    rec = flops.step_rl(grpo, "grpo")
    assert rec["detail"]["rollout_tokens"] == 32 and rec["detail"]["eval_val_tokens"] == 16
    assert rec["flops"] == (512 * 5 + f) * 32 + 512 * 16 + (512 + f) * 24


def test_evaluations_count_the_first_the_multiples_and_the_last():
    """Every training script evaluates at step 0, every eval_interval and at its last step (train.py and
    train_reward_model.py: `it % eval_interval == 0 or it >= max_iters`; GRPO, SPIN and DDO at their stop):
    a run that stops between multiples made one more evaluation than steps // interval + 1."""
    assert [flops.evaluations(s, 2) for s in (0, 1, 2, 3, 4, 5)] == [1, 2, 2, 3, 3, 4]
    assert flops.evaluations(6, 100) == 2 and flops.evaluations(6, None) == 2 and flops.evaluations(6, 6) == 2
    rec = {"iters": 5, "batch_size": 2, "block_size": 4, "eval_interval": 2, "eval_iters": 1, "model_args": ARGS}
    assert flops.step_train(rec)["detail"]["eval_tokens"] == 4 * 2 * 1 * 2 * 4  # at 0, 2, 4 and 5


def test_spin_and_ddo_count_both_rows_under_both_models_and_their_val_pairs():
    # per token of the step's rows: the sample's generation (1) and, for the natural and the sampled row,
    # the policy's update (3) and the reference's scoring (1): 9 forwards; 2 steps of 3 rows x 4 tokens.
    # Evaluations at 0 and 2: 1 val batch of 2 x 4 tokens each; the 5 fixed val pairs: their sample
    # generated (1) and both rows scored by the reference (2) once, both by the policy at each evaluation
    rec = {"steps": 2, "seq_len": 4, "prompts_per_step": 3, "eval_interval": 2, "eval_max_batches": 1,
           "eval_batch_size": 2, "eval_pairs": 5, "model_args": ARGS}
    for kind in ("spin", "ddo"):
        out = flops.step_rl(rec, kind)
        assert out["detail"]["rollout_tokens"] == 24 and out["detail"]["eval_pair_tokens"] == 20
        assert out["flops"] == 512 * (9 * 24 + 2 * 8 + 20 * (3 + 2 * 2))


def test_sirs_count_includes_generating_and_scoring_every_candidate():
    """The SIR arm's samples cost n candidates each: generated (1 forward of the generator per token) and scored
    by the detector: its trunk and head, and with generator features (ratio_features) the generator again.
    Without the scoring passes the count would be the generation alone."""
    det = Detector(GPTConfig(**ARGS, mode="reward", reward_head_hidden_dim=16, reward_lm_features=True,
                             reward_gen_features=ARGS))
    shape = json.loads(json.dumps(model_shape(det)))
    # the trunk's blocks (192), a head of 4 + 4 LM-feature + 4 generator-feature inputs (12 x 16 + 16 x 2), the LM
    # head its features need (32), attention (64), and the generator's own forward (512)
    f_det = 2 * (192 + 12 * 16 + 16 * 2 + 32) + 64 + 512
    assert flops.detector_forward(shape["model_args"], shape["reward_head"]) == f_det
    rec = flops.step_sir(ARGS, shape, n=3, samples=5, length=4)
    assert rec["detail"]["candidate_tokens"] == 60
    assert rec["flops"] == 60 * (512 + f_det) and rec["flops"] > 60 * 512
