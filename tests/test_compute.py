"""flops.py: FLOPs per token of a tiny model against a hand count, and a train.py run's total."""
import pytest
import torch

from experiment import flops
from core.checkpoint import make_checkpoint
from core.common import atomic_torch_save
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


def test_a_train_run_costs_three_forwards_per_token_plus_its_evaluations(tmp_path):
    model = GPT(GPTConfig(**ARGS))
    cfg = {"batch_size": 3, "block_size": 4, "gradient_accumulation_steps": 2, "eval_interval": 5, "eval_iters": 2}
    atomic_torch_save(make_checkpoint(model, None, cfg, iter_num=10), tmp_path / "last.pt")
    rec = flops.step_train(str(tmp_path))
    # 10 iterations x 3 rows x 2 accumulation x 4 tokens = 240 tokens at 3 x 512; evaluations at 0, 5 and 10:
    # 3 x 2 splits x 2 batches x 3 rows x 4 tokens = 144 tokens at 512
    assert rec["detail"]["train_tokens"] == 240 and rec["detail"]["eval_tokens"] == 144
    assert rec["flops"] == 240 * 3 * 512 + 144 * 512
    assert flops.step_train(str(tmp_path / "missing")) is None
    assert flops.total({"a": rec, "b": None}) == pytest.approx(rec["flops"])
