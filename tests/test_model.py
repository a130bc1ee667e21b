"""Tests for model.py: both modes, checkpoints (ours and nanoGPT's), safe loading,
and KV-cache generation against the full-recompute reference."""
import os
import pickle
import weakref

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from core import logprobs as logprobs_mod
from core.errors import CheckpointError
from core.files import atomic_torch_save
from core.sampling import sample_next
from engine import Engine, generate_recompute
from lib.checkpoint import load_model, make_checkpoint, model_from_checkpoint, read_checkpoint
from model import GPT, GPTConfig

VOCAB = 65


def tiny_config(**kw):
    base = dict(n_layer=2, n_head=2, n_embd=32, block_size=64, vocab_size=VOCAB, dropout=0.0)
    base.update(kw)
    return GPTConfig(**base)


def peaky_generator(seed=0, **kw):
    """A tiny generator whose weights are scaled up, so its next-token distributions
    are sharp and depend strongly on the context: a wrong cache position or a mixed-up
    row then changes the sampled tokens (with N(0, 0.02) weights every distribution is
    nearly uniform and such bugs could hide)."""
    torch.manual_seed(seed)
    model = GPT(tiny_config(**kw)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.mul_(12.0 if "wte" in name or "wpe" in name else 6.0)
    return model


def random_idx(B, T, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (B, T), generator=g)


def save_generator_ckpt(path, model=None):
    model = model or GPT(tiny_config())
    opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu")
    # one real step so the optimizer state holds tensors
    idx = random_idx(2, 16)
    _, loss = model(idx, idx)
    loss.backward()
    opt.step()
    ckpt = make_checkpoint(model, opt, iter_num=1, best_val_loss=3.5,
                           tokenization={"method": "char", "vocab_size": VOCAB, "meta_path": None})
    atomic_torch_save(ckpt, path)
    return model, ckpt


# ----------------------------------------------------------------------------- shapes and heads

def test_generator_shapes_and_loss():
    model = GPT(tiny_config()).eval()
    idx = random_idx(3, 20)
    logits, loss = model(idx)
    assert logits.shape == (3, 1, VOCAB) and loss is None
    targets = random_idx(3, 20, seed=2)
    targets[0, :5] = -1  # ignored positions
    logits, loss = model(idx, targets)
    assert logits.shape == (3, 20, VOCAB)
    expected = F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1), ignore_index=-1)
    assert loss.shape == () and torch.allclose(loss, expected)
    # the last-position logits without targets are the same numbers
    assert torch.allclose(model(idx)[0][:, 0], logits[:, -1], atol=1e-5)


def test_reward_shapes_probabilities_and_loss():
    torch.manual_seed(0)
    model = GPT(tiny_config(mode="reward")).eval()
    # move the output layer off its zero init so the probabilities are not all 0.5
    torch.nn.init.normal_(model.reward_head[2].weight, std=1.0)
    idx = random_idx(5, 24)
    probs, loss = model(idx)
    assert probs.shape == (5, 2) and loss is None
    assert torch.allclose(probs.sum(-1), torch.ones(5), atol=1e-6)
    assert (probs > 0).all() and not torch.allclose(probs, torch.full_like(probs, 0.5))
    targets = torch.tensor([[1.0, 0.0]] * 5)
    probs2, loss = model(idx, targets)
    assert torch.allclose(loss, F.mse_loss(probs2, targets))
    # reward_logits are the pre-softmax scores of the same head
    assert torch.allclose(F.softmax(model.reward_logits(idx), -1), probs, atol=1e-6)
    # the head reads the hidden state of the LAST position
    h = model.hidden_states(idx)[:, -1, :]
    assert torch.allclose(model.reward_head(h), probs, atol=1e-6)


@pytest.mark.parametrize("hidden", [16, 48])
def test_reward_head_hidden_dim_and_fresh_head(hidden):
    model = GPT(tiny_config(mode="reward", reward_head_hidden_dim=hidden)).eval()
    first = model.reward_head[0]
    assert isinstance(first, torch.nn.Linear)
    assert first.in_features == 32 and first.out_features == hidden
    assert model.reward_head[2].in_features == hidden and model.reward_head[2].out_features == 2
    assert not hasattr(model, "lm_head")
    probs, _ = model(random_idx(4, 10))
    assert torch.equal(probs, torch.full((4, 2), 0.5))


def test_invalid_mode_is_value_error():
    with pytest.raises(ValueError, match="mode"):
        GPTConfig(mode="critic")
    cfg = tiny_config()
    cfg.mode = "classifier"  # set after construction: GPT itself must refuse it
    with pytest.raises(ValueError, match="mode"):
        GPT(cfg)


def test_generator_only_operations_refuse_reward_model():
    model = GPT(tiny_config(mode="reward"))
    idx = random_idx(1, 4)
    with pytest.raises(ValueError, match="generator"):
        model.generate(idx, 2)
    with pytest.raises(ValueError, match="generator"):
        model.token_logprobs(idx, idx)


def test_token_logprobs_match_full_logits():
    model = peaky_generator()
    idx = random_idx(3, 40)
    targets = random_idx(3, 40, seed=5)
    with torch.no_grad():
        logits, _ = model(idx, targets)  # all positions
        ref = F.log_softmax(logits.float(), -1)
        expected = ref.gather(-1, targets[..., None]).squeeze(-1)
        expected_ent = -(ref.exp() * ref).sum(-1)
        # 7 positions per chunk: chunk boundaries fall inside rows
        logp, ent = model.token_logprobs(idx, targets, return_entropy=True,
                                         max_elements=7 * model.config.vocab_size)
        logp_default = model.token_logprobs(idx, targets)
    assert logp.shape == (3, 40)
    assert torch.allclose(logp, expected, atol=1e-4)
    assert torch.allclose(logp_default, expected, atol=1e-4)
    assert torch.allclose(ent, expected_ent, atol=1e-4)
    # start: only the later positions through the head, the same bits as the full call's columns
    with torch.no_grad():
        tail, tail_ent = model.token_logprobs(idx, targets, return_entropy=True, start=13)
        full, full_ent = model.token_logprobs(idx, targets, return_entropy=True)
    assert tail.shape == (3, 27) and torch.equal(tail, full[:, 13:]) and torch.equal(tail_ent, full_ent[:, 13:])


def test_cpu_optimizer_is_fused_and_matches_torchs_default_adamw():
    """configure_optimizers uses the fused AdamW kernel on CPU (speed); the updates equal the
    default for-loop AdamW's up to float rounding, and a for-loop optimizer's state loads."""
    torch.manual_seed(0)
    a, b = GPT(tiny_config(bias=True)), GPT(tiny_config(bias=True))
    b.load_state_dict(a.state_dict())
    start = {k: v.clone() for k, v in a.state_dict().items()}
    opt_a = a.configure_optimizers(0.1, 1e-2, (0.9, 0.95), "cpu")
    assert all(g["fused"] for g in opt_a.param_groups)
    opt_b = torch.optim.AdamW([{"params": g["params"], "weight_decay": g["weight_decay"]}
                               for g in b.configure_optimizers(0.1, 1e-2, (0.9, 0.95), "cpu").param_groups],
                              lr=1e-2, betas=(0.9, 0.95))
    assert not opt_b.param_groups[0]["fused"]
    for step in range(5):
        idx = random_idx(4, 16, seed=step)
        for model, opt in ((a, opt_a), (b, opt_b)):
            model(idx, idx)[1].backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert (pa - start[name]).abs().max() > 1e-3, name  # 5 steps of lr 1e-2 moved every tensor
        # within 1% of one step (lr): Adam divides by sqrt(v), so where a gradient is mostly
        # rounding noise (the key biases, which softmax ignores) the kernels differ by more than ulps
        assert (pa - pb).abs().max() < 1e-4, name
    opt_a.load_state_dict(opt_b.state_dict())  # a checkpoint written before the change resumes


# ----------------------------------------------------------------------------- checkpoints

def test_checkpoint_roundtrip_weights_only(tmp_path):
    p = tmp_path / "ckpt.pt"
    model, _ = save_generator_ckpt(p)
    raw = torch.load(p, weights_only=True, map_location="cpu")
    assert {"model", "optimizer", "model_args", "model_extra", "config", "iter_num", "best_val_loss"} <= set(raw)
    assert isinstance(raw["config"], dict) and isinstance(raw["model_args"], dict)
    assert raw["model_args"]["n_embd"] == 32 and raw["iter_num"] == 1
    loaded, ckpt, new_params = load_model(str(p))
    assert new_params == [] and loaded.config.mode == "generator"
    for k, v in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k
    idx = random_idx(2, 12)
    assert torch.equal(model.eval()(idx)[0], loaded.eval()(idx)[0])


def test_issue_snippet_loads_generator_ckpt_into_reward_model(tmp_path):
    p = tmp_path / "ckpt.pt"
    model, _ = save_generator_ckpt(p)
    # the issue's usage, in the nanoGPT layout: model_args (nanoGPT's fields) + model_extra (ours)
    ckpt = torch.load(p)
    config = GPTConfig(**ckpt['model_args'], **ckpt['model_extra'])
    config.mode = 'reward'
    reward = GPT(config)
    reward.load_state_dict(ckpt['model'], strict=False)
    trunk = model.transformer.state_dict()
    for k, v in reward.transformer.state_dict().items():
        assert torch.equal(v, trunk[k]), k
    probs, _ = reward(random_idx(2, 8))
    assert probs.shape == (2, 2)


def test_strict_trunk_loading_and_new_head_report(tmp_path):
    p = tmp_path / "ckpt.pt"
    model, ckpt = save_generator_ckpt(p)

    reward, new_params = model_from_checkpoint(read_checkpoint(str(p)), mode="reward",
                                               reward_head_hidden_dim=24)
    assert reward.config.mode == "reward" and reward.reward_head[0].out_features == 24
    assert sorted(new_params) == ["reward_head.0.bias", "reward_head.0.weight",
                                  "reward_head.2.bias", "reward_head.2.weight"]
    for k, v in model.transformer.state_dict().items():
        assert torch.equal(reward.transformer.state_dict()[k], v), k
    _, _, new_params2 = load_model(str(p), mode="reward", reward_head_hidden_dim=24)
    assert sorted(new_params2) == sorted(new_params)

    # a missing trunk tensor
    broken = read_checkpoint(str(p))
    del broken["model"]["transformer.h.1.mlp.c_fc.weight"]
    atomic_torch_save(broken, tmp_path / "missing.pt")
    with pytest.raises(CheckpointError, match="c_fc"):
        load_model(str(tmp_path / "missing.pt"), mode="reward")
    with pytest.raises(CheckpointError):
        load_model(str(tmp_path / "missing.pt"))

    # a mis-shaped trunk tensor (the config says 32 wide)
    broken = read_checkpoint(str(p))
    broken["model"]["transformer.h.0.attn.c_proj.weight"] = torch.zeros(32, 31)
    atomic_torch_save(broken, tmp_path / "shape.pt")
    with pytest.raises(CheckpointError, match="c_proj"):
        load_model(str(tmp_path / "shape.pt"), mode="reward")

    # an unexpected extra tensor in the trunk
    broken = read_checkpoint(str(p))
    broken["model"]["transformer.h.7.ln_1.weight"] = torch.ones(32)
    with pytest.raises(CheckpointError):
        model_from_checkpoint(broken, mode="generator")

    # a saved reward checkpoint loads its head strictly, with nothing new
    atomic_torch_save(make_checkpoint(reward, None), tmp_path / "reward.pt")
    again, _, new3 = load_model(str(tmp_path / "reward.pt"))
    assert new3 == [] and again.config.mode == "reward"
    assert again.reward_head[0].out_features == 24
    with pytest.raises(CheckpointError, match="reward"):
        load_model(str(tmp_path / "reward.pt"), require_mode="generator")


def test_nanogpt_checkpoint_loads(tmp_path):
    """A checkpoint laid out exactly like nanoGPT's train.py writes it (compiled
    model -> '_orig_mod.' keys, model_args dict, plain-dict config)."""
    torch.manual_seed(3)
    src = GPT(tiny_config(dropout=0.1))
    opt = torch.optim.AdamW(src.parameters(), lr=1e-3)
    _, loss = src(random_idx(2, 16), random_idx(2, 16, seed=9))
    loss.backward()
    opt.step()
    state = {"_orig_mod." + k: v for k, v in src.state_dict().items()}
    # nanoGPT without flash attention registers a causal-mask buffer per block
    for i in range(2):
        state[f"_orig_mod.transformer.h.{i}.attn.bias"] = torch.tril(torch.ones(64, 64)).view(1, 1, 64, 64)
    checkpoint = {
        "model": state,
        "optimizer": opt.state_dict(),
        "model_args": dict(n_layer=2, n_head=2, n_embd=32, block_size=64, bias=True,
                           vocab_size=VOCAB, dropout=0.1),
        "iter_num": 250,
        "best_val_loss": torch.tensor(1.88),
        "config": {"out_dir": "out-shakespeare-char", "eval_interval": 250, "batch_size": 64,
                   "learning_rate": 1e-3, "compile": True, "dataset": "shakespeare_char",
                   "device": "cuda", "dtype": "bfloat16", "decay_lr": True},
    }
    p = tmp_path / "nanogpt_ckpt.pt"
    torch.save(checkpoint, p)

    model, ckpt, new_params = load_model(str(p))
    assert new_params == [] and model.config.mode == "generator"
    assert model.config.dropout == 0.1 and model.config.n_embd == 32
    src.eval()
    model.eval()
    idx = random_idx(2, 30)
    assert torch.equal(model(idx)[0], src(idx)[0])
    # and as a reward model on top of the nanoGPT trunk
    reward, _, new_params = load_model(str(p), mode="reward", reward_head_hidden_dim=8)
    assert len(new_params) == 4
    assert torch.equal(reward.transformer.wte.weight, src.transformer.wte.weight)


def test_malicious_pickle_is_refused_without_running_code(tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    # both as a torch.save zip archive and as a bare pickle stream
    zip_path = tmp_path / "evil_zip.pt"
    torch.save({"model": {}, "payload": Evil()}, zip_path)
    raw_path = tmp_path / "evil_raw.pt"
    with open(raw_path, "wb") as f:
        pickle.dump({"model": {}, "payload": Evil()}, f, protocol=2)
    for path in (zip_path, raw_path):
        with pytest.raises(CheckpointError, match="safe loader"):
            read_checkpoint(str(path))
        with pytest.raises(CheckpointError):
            load_model(str(path))
        assert not marker.exists()
    # sanity: the payload really does create the file when unpickled unsafely
    with open(raw_path, "rb") as f:
        obj = pickle.load(f)
    obj["payload"].close()
    assert marker.exists()


def test_bad_checkpoint_files(tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        read_checkpoint(str(tmp_path / "nope.pt"))
    junk = tmp_path / "junk.pt"
    junk.write_bytes(os.urandom(300))
    with pytest.raises(CheckpointError):
        read_checkpoint(str(junk))
    not_model = tmp_path / "list.pt"
    torch.save([1, 2, 3], not_model)
    with pytest.raises(CheckpointError, match="not a model checkpoint"):
        read_checkpoint(str(not_model))


# ----------------------------------------------------------------------------- generation

SETTINGS = [(1.0, None), (0.8, 5), (1.3, 1), (0.0, None), (1.0, 64)]


@pytest.mark.parametrize("temperature,top_k", SETTINGS)
def test_cached_generation_equals_recompute(temperature, top_k):
    model = peaky_generator()
    idx = random_idx(4, 6)
    new = 30
    u = torch.rand(4, 6 + new, generator=torch.Generator().manual_seed(11))
    cached = Engine(model).generate(idx, new, temperature=temperature, top_k=top_k, uniforms=u)
    ref = generate_recompute(model, idx, new, temperature=temperature, top_k=top_k, uniforms=u)
    assert cached.shape == (4, 36)
    assert torch.equal(cached[:, :6], idx)
    assert torch.equal(cached, ref)
    # the same seed gives the same tokens, as do uniforms drawn from a generator with that seed
    a = Engine(model).generate(idx, new, temperature=temperature, top_k=top_k, seed=7)
    b = Engine(model).generate(idx, new, temperature=temperature, top_k=top_k, seed=7)
    u7 = torch.rand(4, 6 + new, generator=torch.Generator().manual_seed(7))
    c = generate_recompute(model, idx, new, temperature=temperature, top_k=top_k, uniforms=u7)
    assert torch.equal(a, b) and torch.equal(a, c)
    if temperature != 0 and top_k != 1:  # other draws give other tokens (the check can fail)
        assert not torch.equal(Engine(model).generate(idx, new, temperature=temperature, top_k=top_k,
                                              seed=8), a)


def test_cached_hidden_states_match_full_forward():
    model = peaky_generator()
    idx = random_idx(2, 40)
    with torch.no_grad():
        full = model.hidden_states(idx)
        caches = model.new_kv_cache(2, 40)
        parts = [model.hidden_states(idx[:, :9], caches, 0)]       # prefill
        parts.append(model.hidden_states(idx[:, 9:20], caches, 9))  # a chunk on a filled cache
        for t in range(20, 40):                                     # single steps
            parts.append(model.hidden_states(idx[:, t:t + 1], caches, t))
    assert torch.allclose(torch.cat(parts, 1), full, atol=1e-4)


def test_generate_fills_block_size_and_top_k_one_is_greedy():
    model = peaky_generator()
    idx = random_idx(2, 10)
    out = Engine(model).generate(idx, seed=0)
    assert out.shape == (2, 64)  # max_new_tokens=None fills the context
    greedy = Engine(model).generate(idx, 20, temperature=0.0)
    assert torch.equal(Engine(model).generate(idx, 20, top_k=1, seed=3), greedy)
    logits = torch.randn(6, VOCAB)
    for k in (1, 3):
        tok = sample_next(logits, 1.0, k, torch.rand(6))
        allowed = torch.topk(logits, k, -1).indices
        assert (allowed == tok[:, None]).any(-1).all()


def test_gpt_generate_top_k_keeps_k_tokens_and_nanogpts_draws():
    """GPT.generate's top-k mask (a slice, not nanoGPT's list index v[:, [-1]], which is a host copy per
    token on CUDA) leaves exactly k tokens to draw from, and gives nanoGPT's tokens at a fixed seed."""
    model = peaky_generator()
    idx = random_idx(3, 5)
    kept, real = [], torch.multinomial

    def spy(probs, num_samples):
        kept.append((probs > 0).sum(-1))
        return real(probs, num_samples)
    torch.manual_seed(11)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch, "multinomial", spy)
        out = model.generate(idx, 8, temperature=0.8, top_k=4)
    assert len(kept) == 8 and all((k == 4).all() for k in kept)
    torch.manual_seed(11)  # nanoGPT's loop (full recompute, list index), drawing from the same generator
    ref = idx
    with torch.no_grad():
        for _ in range(8):
            logits = model(ref)[0][:, -1, :].float() / 0.8
            v, _ = torch.topk(logits, 4)
            logits[logits < v[:, [-1]]] = -float("inf")
            ref = torch.cat((ref, torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)), dim=1)
    assert torch.equal(out, ref)


def _reference_sample(logits, temperature, top_k, u):
    """sample_next written the plain way (softmax -> a float64 CDF over the whole vocabulary ->
    inverse CDF); sample_next's two-level CDF draws the same tokens."""
    if temperature == 0:
        return logits.argmax(-1)
    x = logits.float() / temperature
    if top_k is not None and top_k < x.size(-1):
        x = x.masked_fill(x < torch.topk(x, top_k, -1).values[:, [-1]], float("-inf"))
    cdf = F.softmax(x, -1).double().cumsum(-1)
    tok = torch.searchsorted(cdf, (u.double() * cdf[:, -1])[:, None], right=True)[:, 0]
    return tok.clamp(max=x.size(-1) - 1)


def test_sample_next_workspace_is_exact_and_leaves_logits_alone():
    g = torch.Generator().manual_seed(0)
    workspace = {}
    for V, B in ((VOCAB, 4), (1000, 3), (VOCAB, 4)):  # the buffers follow shape changes
        for temperature in (1.0, 0.7, 1.5, 0.0):
            for top_k in (None, 1, 7):
                logits = torch.randn(B, V, generator=g) * 4
                before = logits.clone()
                u = torch.rand(B, 5, generator=g)[:, 2]  # a strided column, as generate passes
                want = _reference_sample(logits, temperature, top_k, u)
                assert torch.equal(sample_next(logits, temperature, top_k, u), want)
                assert torch.equal(sample_next(logits, temperature, top_k, u, workspace), want)
                assert torch.equal(logits, before)
    # inverse CDF: u just below / above a CDF step picks the neighbouring tokens
    logits = torch.log(torch.tensor([[0.25, 0.25, 0.5]]))
    for u, tok in ((0.0, 0), (0.2499, 0), (0.2501, 1), (0.7499, 2), (0.9999, 2)):
        assert sample_next(logits, 1.0, None, torch.tensor([u])).item() == tok


def test_mixed_prefix_generation_keeps_prefixes_and_matches_per_row_runs():
    model = peaky_generator()
    B, T = 5, 48
    idx = random_idx(B, T, seed=4)
    prefix_lens = torch.tensor([1, 7, 20, 33, 48])
    u = torch.rand(B, T, generator=torch.Generator().manual_seed(21))
    out = Engine(model).generate(idx, max_new_tokens=0, prefix_lens=prefix_lens, uniforms=u)
    assert out.shape == (B, T)
    for i, k in enumerate(prefix_lens.tolist()):
        assert torch.equal(out[i, :k], idx[i, :k])
        if k < T:  # the rest was sampled, not copied from idx
            assert not torch.equal(out[i, k:], idx[i, k:])
        single = Engine(model).generate(idx[i:i + 1, :k], T - k, uniforms=u[i:i + 1])
        assert torch.equal(out[i], single[0]), f"row {i} differs from its own run"
        ref = generate_recompute(model, idx[i:i + 1, :k], T - k, uniforms=u[i:i + 1])
        assert torch.equal(out[i], ref[0])
    # a different prefill length gives the same tokens
    assert torch.equal(Engine(model).generate(idx, 0, prefix_lens=prefix_lens, uniforms=u, prefill_len=1), out)
    # rows are independent: new uniforms for row 0 leave every other row unchanged
    u2 = u.clone()
    u2[0] = torch.rand(T, generator=torch.Generator().manual_seed(99))
    out2 = Engine(model).generate(idx, 0, prefix_lens=prefix_lens, uniforms=u2)
    assert torch.equal(out2[1:], out[1:]) and not torch.equal(out2[0], out[0])
    # with extra new tokens on top of the given columns
    more = Engine(model).generate(idx, 10, prefix_lens=prefix_lens, uniforms=torch.cat([u, u[:, :10]], 1))
    assert more.shape == (B, T + 10) and torch.equal(more[:, :T], out)


def test_per_row_temperature_equals_each_row_alone():
    model = peaky_generator()
    B, T = 4, 40
    idx = random_idx(B, T, seed=5)
    prefix_lens = torch.tensor([1, 9, 17, 30])
    temps = torch.tensor([0.5, 1.0, 1.5, 0.7])
    u = torch.rand(B, T + 6, generator=torch.Generator().manual_seed(8))
    for top_k in (None, 5):
        out = Engine(model).generate(idx, 6, temperature=temps, top_k=top_k, prefix_lens=prefix_lens, uniforms=u)
        for i, k in enumerate(prefix_lens.tolist()):
            alone = Engine(model).generate(idx[i:i + 1, :k], T + 6 - k, temperature=float(temps[i]), top_k=top_k,
                                   uniforms=u[i:i + 1])
            assert torch.equal(out[i], alone[0]), f"row {i} (T={float(temps[i])}, top_k={top_k})"
    # the temperatures matter, and a (B, 1) tensor is the same as (B,)
    assert not torch.equal(Engine(model).generate(idx, 6, temperature=torch.full((B,), 0.5), uniforms=u),
                           Engine(model).generate(idx, 6, temperature=torch.full((B,), 1.5), uniforms=u))
    assert torch.equal(Engine(model).generate(idx, 6, temperature=temps[:, None], uniforms=u),
                       Engine(model).generate(idx, 6, temperature=temps, uniforms=u))
    # sample_next: each row of a per-row call equals the scalar call, bit for bit
    logits = torch.randn(B, VOCAB, generator=torch.Generator().manual_seed(3)) * 4
    uu = torch.rand(B, generator=torch.Generator().manual_seed(4))
    per_row = sample_next(logits, temps[:, None], None, uu)
    assert per_row.tolist() == [sample_next(logits[i:i + 1], float(temps[i]), None, uu[i:i + 1]).item()
                                for i in range(B)]
    for bad in (torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.ones(3)):
        with pytest.raises(ValueError, match="per-row temperature"):
            Engine(model).generate(idx, 2, temperature=bad)



@pytest.mark.parametrize("V", [65, 50257])
def test_sample_next_is_batch_invariant_and_equals_the_plain_inverse_cdf(V):
    g = torch.Generator().manual_seed(V)
    B = 32
    logits = torch.randn(B, V, generator=g) * 3
    u = torch.rand(B, generator=g)
    temps = torch.rand(B, 1, generator=g) + 0.5
    for temperature, top_k in ((1.0, None), (0.8, None), (temps, None), (1.0, 40)):
        whole = sample_next(logits, temperature, top_k, u, {})
        t_of = (lambda s: temperature[s]) if isinstance(temperature, torch.Tensor) else (lambda s: temperature)
        # any batch split: one row alone, odd-sized groups, the batch reversed
        for sizes in ([1] * B, [5, 7, 20]):
            s0, parts = 0, []
            for n in sizes:
                parts.append(sample_next(logits[s0:s0 + n], t_of(slice(s0, s0 + n)), top_k, u[s0:s0 + n]))
                s0 += n
            assert torch.equal(torch.cat(parts), whole)
        rev = torch.arange(B - 1, -1, -1)
        assert torch.equal(sample_next(logits[rev], t_of(rev), top_k, u[rev]), whole[rev])
        if not isinstance(temperature, torch.Tensor):
            assert torch.equal(whole, _reference_sample(logits, temperature, top_k, u))
    # block edges and the partial last block of the two-level CDF: u at the CDF's steps there
    x = torch.full((1, 700), -30.0)
    x[0, [0, 255, 256, 511, 512, 699]] = 0.0
    cdf = F.softmax(x, -1).double().cumsum(-1)
    for tok in (0, 255, 256, 511, 512, 699):
        for u0 in (cdf[0, tok] - 1e-6, cdf[0, tok - 1] + 1e-6 if tok else 0.0):
            assert sample_next(x, 1.0, None, torch.tensor([float(u0)])).item() == tok


@pytest.mark.parametrize("B", [3, 16, 35, 37])  # one group; exact groups; a remainder of 3 joins; of 5 stands
def test_head_sample_equals_sample_next_on_the_whole_logits(B, monkeypatch):
    from core import sampling
    from core.sampling import head_groups, head_sample
    monkeypatch.setattr(sampling, "HEAD_ROWS", 16)
    g = torch.Generator().manual_seed(B)
    V, C = 50257, 8
    x, w = torch.randn(B, C, generator=g), torch.randn(V, C, generator=g)
    u = torch.rand(B, generator=g)
    groups = head_groups(B, "cpu")
    assert groups[0][0] == 0 and groups[-1][1] == B and all(e - s >= min(B, 4) for s, e in groups)
    assert all(a[1] == b[0] for a, b in zip(groups, groups[1:]))
    temps = torch.rand(B, 1, generator=g) + 0.5
    workspace = {}
    for temperature, top_k in ((1.0, None), (0.7, None), (temps, None), (1.0, 30)):
        want = sample_next(x @ w.T, temperature, top_k, u)
        for _ in range(2):  # the second call reuses the workspace's buffers
            assert torch.equal(head_sample(x, w, temperature, top_k, u, workspace), want)
    assert head_groups(128, "cuda") == [(0, 128)]
    assert head_groups(35, "cpu") == [(0, 16), (16, 35)] and head_groups(37, "cpu")[-1] == (32, 37)


def test_linear_logprob_backward_in_ragged_row_and_column_blocks(monkeypatch):
    """Backward recomputes the logits in blocks of BACKWARD_ROWS rows x HEAD_COLS columns; both
    ragged here (40 rows in blocks of 16, 50257 columns in blocks of 4096) against the unfused grads."""
    monkeypatch.setattr(logprobs_mod, "BACKWARD_ROWS", 16)
    g = torch.Generator().manual_seed(3)
    V, C = 50257, 8
    x = torch.randn(40, C, generator=g, requires_grad=True)
    w = (torch.randn(V, C, generator=g) * 0.3).requires_grad_()
    y = torch.randint(0, V, (40,), generator=g)
    u = torch.randn(40, generator=g)
    for t in (1.0, 0.8):
        logp, ent = logprobs_mod.LinearLogprob.apply(x, w, y, t, True, 6)
        ref_logp, ref_ent = _full_logprobs(x, w, y, t)
        gx, gw = torch.autograd.grad((logp * u + 0.3 * ent).sum(), (x, w))
        rx, rw = torch.autograd.grad((ref_logp * u + 0.3 * ref_ent).sum(), (x, w))
        assert torch.allclose(gx, rx, atol=1e-5, rtol=1e-4) and (gw - rw).abs().max() < 1e-4 * rw.abs().max()


def _chi_square(tokens, probs):
    counts = torch.bincount(tokens, minlength=probs.numel()).double()
    expected = probs.double() * tokens.numel()
    return float(((counts - expected) ** 2 / expected).sum())


def test_sample_next_matches_the_softmax_distribution():
    g = torch.Generator().manual_seed(0)
    V, n = 12, 40000
    logits = torch.randn(V, generator=g) * 1.5
    # 40000 draws, in batches of 1000 rows with the same logits
    toks = torch.cat([sample_next(logits.expand(1000, V), 0.8, None, torch.rand(1000, generator=g))
                      for _ in range(n // 1000)])
    critical = 31.26  # chi-square, 11 degrees of freedom, p = 0.001
    assert _chi_square(toks, F.softmax(logits / 0.8, -1)) < critical
    # the test has power: the same draws against a slightly wrong temperature, or tokens shifted by one
    assert _chi_square(toks, F.softmax(logits / 0.9, -1)) > critical
    assert _chi_square((toks + 1) % V, F.softmax(logits / 0.8, -1)) > critical


def test_generate_argument_errors():
    model = peaky_generator()
    idx = random_idx(2, 8)
    with pytest.raises(ValueError):
        Engine(model).generate(idx, 4, prefix_lens=[0, 3])
    with pytest.raises(ValueError):
        Engine(model).generate(idx, 4, prefix_lens=[3, 9])
    with pytest.raises(ValueError):
        Engine(model).generate(idx, 4, prefix_lens=[3, 5], prefill_len=4)
    with pytest.raises(ValueError):
        model.hidden_states(random_idx(1, 65))


def test_gpts_own_generate_is_nanogpts_loop_with_a_cache():
    """GPT.generate, nanoGPT's signature and sampling (torch.multinomial over softmax(logits / T), top_k):
    prompts kept, top_k=1 the greedy tokens (the engine's at T = 0), a fixed torch seed the same tokens with
    the cache as nanoGPT's cache-free loop, and past block_size a clear error naming the engine."""
    model = peaky_generator()
    idx = random_idx(3, 10)
    out = model.generate(idx, 20, temperature=0.9, top_k=7)
    assert out.shape == (3, 30) and torch.equal(out[:, :10], idx)
    assert torch.equal(model.generate(idx, 20, top_k=1), Engine(model).generate(idx, 20, temperature=0.0))
    torch.manual_seed(5)
    cached = model.generate(idx, 20, temperature=0.8)
    torch.manual_seed(5)
    seq = idx  # nanoGPT's generate: the whole context through the model at every token
    with torch.no_grad():
        for _ in range(20):
            probs = F.softmax(model(seq)[0][:, -1, :].float() / 0.8, dim=-1)
            seq = torch.cat((seq, torch.multinomial(probs, num_samples=1)), dim=1)
    assert torch.equal(cached, seq)
    with pytest.raises(ValueError, match="exceed block_size 64.*engine.Engine"):
        model.generate(idx, 60)


def test_generation_past_block_size_rolls_the_context():
    model = peaky_generator(block_size=16)
    idx = random_idx(2, 4)
    out = Engine(model).generate(idx, 30, seed=1)
    assert out.shape == (2, 34) and torch.equal(out[:, :4], idx)


# ----------------------------------------------------------------------------- per-position reward head

def test_per_position_reward_head_shapes_and_probabilities():
    torch.manual_seed(0)
    cfg = GPTConfig(block_size=16, vocab_size=11, n_layer=1, n_head=2, n_embd=16, mode="reward",
                    reward_per_position=True)
    m = GPT(cfg).eval()
    for p in m.reward_head[2].parameters():  # a non-zero output layer, so scores vary
        torch.nn.init.normal_(p, std=0.05)
    x = torch.randint(0, 11, (3, 16))
    logits = m.position_logits(x)
    pp = m.position_probs(x)
    assert logits.shape == (3, 16, 2) and pp.shape == (3, 16)
    assert ((pp > 0) & (pp < 1)).all() and pp.std() > 0
    probs, loss = m(x, torch.full((3, 2), 0.5))
    assert probs.shape == (3, 2) and torch.allclose(probs.sum(1), torch.ones(3))
    assert torch.allclose(probs[:, 0], pp.mean(1), atol=1e-6)
    assert loss.shape == () and loss.item() >= 0
    # causal: the score at position t ignores tokens after t
    y = x.clone()
    y[:, 10:] = (y[:, 10:] + 1) % 11
    assert torch.allclose(m.position_probs(y)[:, :10], pp[:, :10], atol=1e-6)
    with pytest.raises(ValueError, match="use position_logits"):
        m.reward_logits(x)
    # the design's default stays the last-token head
    assert GPTConfig().reward_per_position is False


def test_perfect_per_position_detector_mean_is_k_over_n():
    """A detector that is right at every position (natural iff t < K) scores K/N exactly."""
    torch.manual_seed(0)
    N, V = 20, 6
    m = GPT(GPTConfig(block_size=N, vocab_size=V, n_layer=1, n_head=1, n_embd=8, mode="reward",
                      reward_per_position=True)).eval()
    K = torch.tensor([1, 5, 13, 19])
    is_natural = torch.arange(N)[None, :] < K[:, None]
    big = 30.0  # saturated logits: P(natural) = 1 or 0 up to e^-60
    fixed = torch.stack([torch.where(is_natural, big, -big), torch.where(is_natural, -big, big)], -1)
    m.head_logits = lambda h: fixed  # the head itself, replaced by an oracle
    probs, _ = m(torch.zeros(4, N, dtype=torch.long))
    assert torch.allclose(probs[:, 0].double(), K.double() / N, atol=1e-6)


def test_old_checkpoint_without_the_field_loads_as_last_token(tmp_path):
    cfg = GPTConfig(block_size=8, vocab_size=11, n_layer=1, n_head=1, n_embd=8, mode="reward")
    del cfg.__dict__["reward_per_position"]  # as unpickled from a checkpoint written before the field
    ck = {"model": GPT(GPTConfig(block_size=8, vocab_size=11, n_layer=1, n_head=1, n_embd=8,
                                 mode="reward")).state_dict(), "config": cfg}
    torch.save(ck, tmp_path / "old.pt")
    m, _, _ = load_model(str(tmp_path / "old.pt"))
    assert m.config.reward_per_position is False and m.config.mode == "reward"


def _full_logprobs(x, w, targets, temperature=1.0):
    """The unfused reference: the whole log_softmax, then gather."""
    ref = F.log_softmax(F.linear(x, w).to(torch.promote_types(x.dtype, torch.float32)) / temperature, -1)
    return ref.gather(-1, targets[..., None]).squeeze(-1), -(ref.exp() * ref).sum(-1)


@pytest.mark.parametrize("per_chunk", [1, 7, 10, 1000])  # 7: boundaries inside rows; 10 divides T
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_linear_logprobs_equal_the_unfused_ones_values_and_gradients(per_chunk, temperature):
    from core.logprobs import linear_logprobs
    g = torch.Generator().manual_seed(0)
    V = 13
    x = torch.randn(3, 10, 8, generator=g, requires_grad=True)
    w = torch.randn(V, 8, generator=g, requires_grad=True)
    targets = torch.randint(0, V, (3, 10), generator=g)
    logp, ent = linear_logprobs(x, w, targets, True, temperature, max_elements=per_chunk * V)
    ref_logp, ref_ent = _full_logprobs(x, w, targets, temperature)
    assert logp.shape == ent.shape == (3, 10)
    assert torch.allclose(logp, ref_logp, atol=1e-6) and torch.allclose(ent, ref_ent, atol=1e-6)
    # gradients through either output alone and through both
    for pick in (lambda a, b: a.sum(), lambda a, b: (b * b).sum(), lambda a, b: (a * 1.3 + b).sum()):
        gx, gw = torch.autograd.grad(pick(logp, ent), (x, w), retain_graph=True)
        rx, rw = torch.autograd.grad(pick(ref_logp, ref_ent), (x, w), retain_graph=True)
        assert torch.allclose(gx, rx, atol=1e-5) and torch.allclose(gw, rw, atol=1e-5)


@pytest.mark.parametrize("temperature", [1.0, 1.3])
def test_linear_logprobs_at_gpt2_vocabulary_with_ragged_chunks(temperature):
    from core.logprobs import linear_logprobs
    g = torch.Generator().manual_seed(1)
    V, C = 50257, 16
    x = torch.randn(3, 10, C, generator=g, requires_grad=True)
    w = (torch.randn(V, C, generator=g) * 0.3).requires_grad_()
    targets = torch.randint(0, V, (3, 10), generator=g)
    logp, ent = linear_logprobs(x, w, targets, True, temperature, max_elements=7 * V)  # 7 positions a chunk
    ref_logp, ref_ent = _full_logprobs(x, w, targets, temperature)
    assert torch.allclose(logp, ref_logp, atol=2e-5, rtol=0) and torch.allclose(ent, ref_ent, atol=2e-5, rtol=0)
    u = torch.randn(3, 10, generator=g)  # a loss that weights positions differently
    gx, gw = torch.autograd.grad((logp * u - 0.5 * ent).sum(), (x, w))
    rx, rw = torch.autograd.grad((ref_logp * u - 0.5 * ref_ent).sum(), (x, w))
    assert torch.allclose(gx, rx, atol=1e-5, rtol=1e-4) and torch.allclose(gw, rw, atol=1e-6, rtol=1e-4)
    assert (gw - rw).abs().max() < 1e-3 * rw.abs().max()


def test_linear_logprob_gradcheck_float64():
    from core.logprobs import LinearLogprob
    g = torch.Generator().manual_seed(2)
    x = torch.randn(5, 3, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(4, 3, dtype=torch.float64, generator=g, requires_grad=True)
    y = torch.randint(0, 4, (5,), generator=g)
    for t in (1.0, 0.6):
        assert torch.autograd.gradcheck(lambda a, b: LinearLogprob.apply(a, b, y, t, True, 2), (x, w))
        assert torch.autograd.gradcheck(lambda a, b: LinearLogprob.apply(a, b, y, t, False, 3)[0], (x, w))
        assert torch.autograd.gradcheck(lambda a, b: LinearLogprob.apply(a, b, y, t, True, 8), (x, w))  # one chunk


def test_positions_per_chunk_bounds_the_elements_not_the_batch():
    from core.logprobs import LOGIT_ELEMENTS, positions_per_chunk
    assert positions_per_chunk(50304) == 2 ** 20 // 50304 == 20  # near the cache
    assert positions_per_chunk(50304, 512) == 512  # the (V, 512) head read once per 512 positions
    assert positions_per_chunk(50304, 768) == LOGIT_ELEMENTS // 50304 == 667  # never over the bound
    assert positions_per_chunk(10, 0, 5) == 1  # at least one position
    assert positions_per_chunk(65) * 65 <= LOGIT_ELEMENTS


def test_large_vocab_training_loss_is_chunked_and_equals_the_full_one(monkeypatch):
    model = peaky_generator()
    idx, targets = random_idx(3, 40), random_idx(3, 40, seed=5)
    targets[0, :7] = -1  # ignored positions, as nanoGPT's loaders may give
    logits, full = model(idx, targets)
    assert logits is not None
    (g_full,) = torch.autograd.grad(full, model.lm_head.weight)
    # pretend the vocabulary is large: 11 positions per chunk, so chunks cross rows
    monkeypatch.setattr(logprobs_mod, "LOGIT_ELEMENTS", 11 * model.config.vocab_size)
    model.logit_budget = logprobs_mod.LOGIT_ELEMENTS
    logits, chunked = model(idx, targets)
    assert logits is None  # the whole (B, T, V) logits are never formed
    (g_chunked,) = torch.autograd.grad(chunked, model.lm_head.weight)
    assert torch.allclose(chunked, full, atol=1e-6) and torch.allclose(g_chunked, g_full, atol=1e-6)


def test_lm_features_are_the_trunks_own_surprisal_and_entropy():
    torch.manual_seed(0)
    gen = GPT(GPTConfig(block_size=16, vocab_size=11, n_layer=1, n_head=2, n_embd=16)).eval()
    ck = make_checkpoint(gen, None)
    from lib.checkpoint import model_from_checkpoint
    rm, new = model_from_checkpoint(ck, "reward", reward_per_position=True, reward_lm_features=True)
    rm.eval()
    assert rm.reward_head[0].in_features == 16 + 4 and "reward_head.0.weight" in new
    x = torch.randint(0, 11, (3, 16))
    with torch.no_grad():
        f = rm.lm_features(x, rm.hidden_states(x), max_elements=5 * 11)  # chunks of 5 positions
        logp, ent = gen.token_logprobs(x[:, :-1], x[:, 1:], return_entropy=True)
    assert f.shape == (3, 16, 4) and torch.equal(f[:, 0], torch.zeros(3, 4))
    assert torch.allclose(f[:, 1:, 0], -logp, atol=1e-5) and torch.allclose(f[:, 1:, 1], ent, atol=1e-5)
    # running means over positions 1..t
    assert torch.allclose(f[:, 5, 2], -logp[:, :5].mean(1), atol=1e-5)
    assert torch.allclose(f[:, 15, 3], ent.mean(1), atol=1e-5)
    probs, _ = rm(x)
    assert probs.shape == (3, 2) and torch.allclose(probs[:, 0], rm.position_probs(x).mean(1), atol=1e-6)


def test_public_trunk_and_head_and_one_adamw_grouping():
    from types import SimpleNamespace

    import train_reward_model as trm
    from model import adamw_param_groups
    torch.manual_seed(0)
    m = GPT(tiny_config(mode="reward", reward_lm_features=True)).eval()
    x = random_idx(2, 10)
    with torch.no_grad():
        assert torch.equal(m.transformer.ln_f(m.trunk(x)), m.hidden_states(x))
        part = m.trunk(x, 1)
        for block in m.transformer.h[1:]:
            part = block(part)
        assert torch.equal(part, m.trunk(x))
        logits = m.head_logits(m.head_input(x, m.hidden_states(x))[:, -1, :])
        assert torch.equal(logits, m.reward_logits(x))
    m.transformer.h[0].requires_grad_(False)
    groups = adamw_param_groups(m.parameters(), 0.1)
    trainable = [p for p in m.parameters() if p.requires_grad]
    assert sum(len(g["params"]) for g in groups) == len(trainable)
    assert all(p.dim() >= 2 for p in groups[0]["params"]) and all(p.dim() < 2 for p in groups[1]["params"])
    for opt in (m.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu"),
                trm.make_optimizer(m, SimpleNamespace(optimizer="adamw", learning_rate=1e-3, weight_decay=0.1))):
        assert [[id(p) for p in g["params"]] for g in opt.param_groups] == [[id(p) for p in g["params"]] for g in groups]
        assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]


@pytest.mark.parametrize("prompt", [3, 9])  # 9 of 10 positions dead: chunks with 1-3 live rows run whole
def test_linear_logprob_backward_skips_rows_without_gradient_bit_for_bit(monkeypatch, prompt):
    """GRPO's loss reads the completion's positions only: backward forms no logits for the prompt's
    rows (exact zeros of dlogits), with the same bits as the backward over every row, ragged blocks too."""
    monkeypatch.setattr(logprobs_mod, "BACKWARD_ROWS", 16)
    g = torch.Generator().manual_seed(4)
    V, C = 9000, 8
    x = torch.randn(4, 10, C, generator=g, requires_grad=True)
    w = (torch.randn(V, C, generator=g) * 0.3).requires_grad_()
    y = torch.randint(0, V, (4, 10), generator=g)
    u = torch.randn(4, 10 - prompt, generator=g)
    calls = []
    live_rows = logprobs_mod._live_rows
    monkeypatch.setattr(logprobs_mod, "_live_rows", lambda a, b: calls.append(live_rows(a, b)) or calls[-1])
    grads = []
    for skip in (True, False):
        if not skip:
            monkeypatch.setattr(logprobs_mod, "_live_rows", lambda a, b: None)  # every row, as before
        for t, ent_coef in ((1.0, 0.0), (0.7, 0.4)):
            logp, ent = logprobs_mod.linear_logprobs(x, w, y, True, t, max_elements=6 * V)
            loss = (logp[:, prompt:] * u).sum() + ent_coef * ent[:, prompt:].sum()
            grads.append(torch.autograd.grad(loss, (x, w)))
    skipped = any(c is not None and c.numel() for c in calls)
    assert skipped == (prompt == 3)  # with one live row in ten, every 16-row block has 1-2: run whole
    for (gx, gw), (rx, rw) in zip(grads[:2], grads[2:]):
        assert torch.equal(gx, rx) and torch.equal(gw, rw)
        assert not gx[:, :prompt].any() and gx[:, prompt:].abs().sum() > 0
    ref_logp, _ = _full_logprobs(x, w, y)
    rx, rw = torch.autograd.grad((ref_logp[:, prompt:] * u).sum(), (x, w))
    assert torch.allclose(grads[0][0], rx, atol=1e-5, rtol=1e-4) and torch.allclose(grads[0][1], rw, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("prompt", [3, 9])
def test_linear_logprobs_from_start_equal_the_full_calls_columns_bit_for_bit(monkeypatch, prompt):
    """start: only the later positions through the head (forward), the same values and gradients as the
    full call's columns, even where a backward block with few computed rows runs whole and the skipped
    rows' logits are large enough to overflow exp (9 of 10 positions skipped, logits up to ~300)."""
    from core.logprobs import linear_logprobs
    monkeypatch.setattr(logprobs_mod, "BACKWARD_ROWS", 16)
    g = torch.Generator().manual_seed(5)
    V, C = 9000, 8
    x = (torch.randn(4, 10, C, generator=g) * 10).requires_grad_()
    w = (torch.randn(V, C, generator=g) * 3).requires_grad_()
    y = torch.randint(0, V, (4, 10), generator=g)
    u = torch.randn(4, 10 - prompt, generator=g)
    for t, ent_coef in ((1.0, 0.0), (0.7, 0.4)):
        full, full_ent = linear_logprobs(x, w, y, True, t, max_elements=6 * V)
        tail, tail_ent = linear_logprobs(x, w, y, True, t, max_elements=6 * V, start=prompt)
        assert tail.shape == (4, 10 - prompt)
        assert torch.equal(tail, full[:, prompt:]) and torch.equal(tail_ent, full_ent[:, prompt:])
        rx, rw = torch.autograd.grad((full[:, prompt:] * u).sum() + ent_coef * full_ent[:, prompt:].sum(), (x, w))
        gx, gw = torch.autograd.grad((tail * u).sum() + ent_coef * tail_ent.sum(), (x, w))
        assert torch.isfinite(gw).all() and torch.equal(gx, rx) and torch.equal(gw, rw)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("start", [0, 3])
def test_linear_logprobs_under_cpu_autocast_with_a_loss_on_some_rows(monkeypatch, dtype, start):
    """Mixed precision, tested on CPU (the same dtype logic as CUDA autocast): a loss that reads only
    some positions, as GRPO's completion mask does, sends backward through the live-row path, which
    once added autocast's bfloat16 products into a float32 gradient (index_add_ refused them). Values
    and gradients stay float32 and within the low-precision matmul's rounding of the float32 ones."""
    monkeypatch.setattr(logprobs_mod, "BACKWARD_ROWS", 16)  # blocks with a few dead rows: the live-row path
    g = torch.Generator().manual_seed(6)
    V, C = 9000, 16  # three HEAD_COLS column blocks
    x = torch.randn(4, 10, C, generator=g, requires_grad=True)
    w = (torch.randn(V, C, generator=g) * 0.3).requires_grad_()
    y = torch.randint(0, V, (4, 10), generator=g)
    u = torch.randn(4, 10 - 3, generator=g)
    out = {}
    for amp in (False, True):
        with torch.autocast("cpu", dtype=dtype, enabled=amp):
            logp, ent = logprobs_mod.linear_logprobs(x, w, y, True, 0.8, max_elements=6 * V, start=start)
            logp, ent = logp[:, 3 - start:], ent[:, 3 - start:]  # the positions 3.. either way
        assert logp.dtype == ent.dtype == torch.float32
        gx, gw = torch.autograd.grad((logp * u).sum() + 0.3 * ent.sum(), (x, w))
        assert gx.dtype == gw.dtype == torch.float32 and not gx[:, :3].any()
        out[amp] = (logp, ent, gx, gw)
    tol = 2e-2 if dtype == torch.bfloat16 else 3e-3
    for a, b in zip(out[True], out[False]):
        assert torch.isfinite(a).all() and (a - b).abs().max() <= tol * b.abs().max()
    assert not torch.equal(out[True][2], out[False][2])  # autocast did run the matmuls in low precision


@pytest.mark.parametrize("ent_coef", [0.0, 0.4])
def test_gpu_style_backward_from_the_saved_rows_equals_the_unfused_gradients(monkeypatch, ent_coef):
    """On a GPU a single chunk of the completion's rows keeps their log-probs for backward (no logits
    formed again, no host read of live rows); forced here on CPU, it gives the unfused gradients."""
    monkeypatch.setattr(logprobs_mod, "keeps_computed_rows", lambda device: True)
    g = torch.Generator().manual_seed(7)
    V, C, prompt = 900, 8, 4
    x = torch.randn(3, 10, C, generator=g, requires_grad=True)
    w = (torch.randn(V, C, generator=g) * 0.3).requires_grad_()
    y = torch.randint(0, V, (3, 10), generator=g)
    u = torch.randn(3, 10 - prompt, generator=g)
    calls = []
    saved = logprobs_mod._backward_saved_rows
    monkeypatch.setattr(logprobs_mod, "_backward_saved_rows", lambda *a: calls.append(1) or saved(*a))
    logp, ent = logprobs_mod.linear_logprobs(x, w, y, True, 0.8, max_elements=100 * V, start=prompt)
    gx, gw = torch.autograd.grad((logp * u).sum() + ent_coef * ent.sum(), (x, w))
    ref_logp, ref_ent = _full_logprobs(x, w, y, 0.8)
    rx, rw = torch.autograd.grad((ref_logp[:, prompt:] * u).sum() + ent_coef * ref_ent[:, prompt:].sum(), (x, w))
    assert calls == [1] and torch.allclose(logp, ref_logp[:, prompt:], atol=1e-6)
    assert torch.allclose(gx, rx, atol=1e-5, rtol=1e-4) and torch.allclose(gw, rw, atol=1e-6, rtol=1e-4)
    assert not gx[:, :prompt].any()


def test_logit_budget_chooses_the_loss_form_by_memory(monkeypatch):
    """CPU: chunks of about 2**20 logits and the chunked loss past LOGIT_ELEMENTS; a GPU's budget is a
    share of its memory, so GPT-2 124M's 12 x 1024 x 50304 logits go whole on an 80 GB card and in
    chunks on an 8 GB one (the whole logits also when the budget is raised on CPU)."""
    from core.logprobs import LOGIT_ELEMENTS, logit_budget, positions_per_chunk
    assert logit_budget("cpu") == LOGIT_ELEMENTS
    for gib, whole in ((80, True), (8, False)):
        props = type("P", (), {"total_memory": gib * 2 ** 30})()
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
        assert (12 * 1024 * 50304 <= logit_budget("cuda")) == whole
        assert positions_per_chunk(50304, 768, device="cuda") == logit_budget("cuda") // 50304
    m = GPT(GPTConfig(block_size=16, vocab_size=5000, n_layer=1, n_head=1, n_embd=8))
    x = torch.randint(0, 5000, (8, 16))
    assert 8 * 16 * 5000 > LOGIT_ELEMENTS // 64
    assert m.logit_budget == LOGIT_ELEMENTS
    m.logit_budget = LOGIT_ELEMENTS // 64  # as on a small device
    chunked, loss_c = m(x, x)
    import model as model_mod
    monkeypatch.setattr(model_mod, "logit_budget", lambda device: LOGIT_ELEMENTS)
    m.to("cpu")  # a move sets the budget of the device the weights are on
    assert m.logit_budget == LOGIT_ELEMENTS
    whole, loss_w = m(x, x)
    assert chunked is None and whole.shape == (8, 16, 5000) and torch.allclose(loss_c, loss_w, atol=1e-5)


class LiveBytes(TorchDispatchMode):
    """The peak of the bytes held by tensors made inside the mode, counted by storage (a view is free),
    each released when its storage's last tensor dies; and the dtypes of every matrix product."""

    def __init__(self):
        super().__init__()
        self.live, self.now, self.peak, self.gemms = {}, 0, 0, []

    def _free(self, key):
        self.now -= self.live.pop(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.addmm_.default):
            self.gemms.append(tuple(a.dtype for a in args if isinstance(a, torch.Tensor) and a.dim() == 2))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and id(t.untyped_storage()) not in self.live and t.untyped_storage().nbytes():
                st = t.untyped_storage()
                self.live[id(st)] = st.nbytes()
                self.now += st.nbytes()
                self.peak = max(self.peak, self.now)
                weakref.finalize(st, self._free, id(st))
        return out


@pytest.mark.parametrize("amp", [False, True])
@pytest.mark.parametrize("start", [0, 4])
@pytest.mark.parametrize("entropy", [False, True])
def test_vocabulary_log_probs_stay_within_the_bytes_per_logit_the_budget_assumes(monkeypatch, amp, start, entropy):
    """The logit budget (core.logprobs.logit_budget) counts 12 bytes a logit of a chunk. The GPU's path (one
    chunk, the computed rows' log-probs kept for backward) forward and backward under it: at 8bd02d5 the
    backward of the kept rows held about 16 bytes a logit (three float32 temporaries) and the entropy's
    third forward buffer 12 + autocast's copy. Under bfloat16 autocast every GEMM takes bfloat16 (float32
    accumulation); 8bd02d5's dW ran in float32 (an in-place addmm_, which autocast leaves alone)."""
    monkeypatch.setattr(logprobs_mod, "keeps_computed_rows", lambda device: True)
    B, T, V, C = 4, 128, 2000, 16  # one chunk on CPU too (B * T * V <= 2**20); (V, C) terms small beside it
    torch.manual_seed(0)
    x, w = torch.randn(B, T, C, requires_grad=True), torch.randn(V, C, requires_grad=True)
    y = torch.randint(0, V, (B, T))
    mode = LiveBytes()
    with mode:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            out = logprobs_mod.linear_logprobs(x, w, y, return_entropy=entropy, start=start, max_elements=10 ** 9)
        (out[0] + out[1] if entropy else out).sum().backward()
    assert mode.peak / (B * (T - start) * V) <= 12, mode.peak / (B * (T - start) * V)
    assert mode.gemms and all(set(d) == {torch.bfloat16 if amp else torch.float32} for d in mode.gemms), mode.gemms
