"""lib/ensemble.py's Ensemble (the mean of K generators' probabilities as one generator) where the project takes a
generator (forward, the val scoring, the Engine's cached decoding, the frontier sweep), and train_distill.py, which
distils it into one student: its checkpoint, summary, resume and refusals. Three tiny members trained by train.py
on a tiny char corpus, once for the module."""
import json
import math
import os
import sys

import pytest
import torch
from torch.nn import functional as F

import lib.ensemble as ens_mod
import train_distill
from core.cli import run_cli
from core.files import atomic_torch_save, read_jsonl
from engine import Engine, decoder_choice, generate_recompute
from experiment import flops, frontier
from experiment import measures as cm
from helpers import TINY, make_text, prepare_char_data, run_script, run_train_main
from lib.checkpoint import load_model, make_checkpoint
from lib.heldout import evaluate_loss, make_eval_loader
from lib.ensemble import Ensemble, EnsembleError, distillation_loss, load_ensemble, mixture_logprobs, training_flops
from model import GPT, GPTConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BLOCK = 32
FAST = ["--batch_size", "16", "--eval_iters", "2", "--learning_rate", "1e-2", "--min_lr", "1e-3", "--warmup_iters",
        "2", "--lr_decay_iters", "40", "--log_interval", "5", "--device", "cpu", "--tensorboard_dir", "none"]


@pytest.fixture(scope="module")
def w(tmp_path_factory):
    """A tiny char corpus (play-like text, val like train) and three members trained by train.py (seeds 0-2)."""
    root = tmp_path_factory.mktemp("distill")
    _, data = prepare_char_data(str(root / "corpus"), make_text(20000))
    paths = []
    for seed in range(3):
        out = str(root / f"member{seed}")
        run_train_main("--data_dir", data, "--out_dir", out, "--n_layer", "2", "--n_head", "2", "--n_embd", "32",
                       "--block_size", str(BLOCK), "--batch_size", "16", "--max_iters", "80", "--lr_decay_iters", "80",
                       "--warmup_iters", "5", "--eval_interval", "40", "--eval_iters", "4", "--learning_rate", "1e-2",
                       "--min_lr", "1e-3", "--log_interval", "40", "--device", "cpu", "--seed", str(seed),
                       "--tensorboard_dir", "none", "--compile", "False", "--dropout", "0.0")
        paths.append(os.path.join(out, "ckpt.pt"))
    return {"root": root, "data": data, "paths": paths, "ens": load_ensemble(paths)}


def val_batch(w, B=4):
    val = torch.from_numpy(cm.val_tokens(w["data"])[:B * (BLOCK + 1)].astype("int64")).view(B, BLOCK + 1)
    return val[:, :-1].contiguous(), val[:, 1:].contiguous()


# ----------------------------------------------------------------------------- the ensemble

def test_ensemble_logits_are_the_log_of_the_members_mean_probabilities(w, monkeypatch):
    ens, (X, Y) = w["ens"], val_batch(w)
    with torch.no_grad():
        probs = torch.stack([F.softmax(m(X, Y)[0], dim=-1) for m in ens.members]).mean(0)
        logits, loss = ens(X, Y)
        last, none = ens(X)
        torch.testing.assert_close(logits, probs.log(), atol=1e-5, rtol=0)
        assert torch.allclose(F.softmax(logits, -1).sum(-1), torch.ones(4, BLOCK), atol=1e-5)
        assert math.isclose(float(loss), float(-probs.log().gather(2, Y[..., None]).mean()), rel_tol=1e-5)
        assert none is None and last.shape == (4, 1, logits.size(-1))
        torch.testing.assert_close(last[:, 0], logits[:, -1], atol=1e-5, rtol=0)
        # GPT's other scores, at a temperature and in chunks of 5 positions (the large-vocabulary path)
        for t in (1.0, 0.7):
            ref = F.log_softmax(logits / t, -1).gather(2, Y[..., None])[..., 0]
            torch.testing.assert_close(ens.token_logprobs(X, Y, temperature=t), ref, atol=1e-5, rtol=0)
            torch.testing.assert_close(ens.logprobs_at_temperatures(X, Y, [t], max_elements=5 * 60)[0], ref,
                                       atol=1e-5, rtol=0)
        # past the logit budget forward returns GPT's (None, loss)
        monkeypatch.setattr(ens_mod, "logit_budget", lambda device: 10)
        big_logits, big_loss = ens(X, Y)
        assert big_logits is None and math.isclose(float(big_loss), float(loss), rel_tol=1e-5)


def test_an_ensemble_of_copies_of_one_model_is_that_model(w):
    m = w["ens"].members[0]
    X, Y = val_batch(w)
    with torch.no_grad():
        one, loss = m(X, Y)
        for k in (1, 3):
            logits, ens_loss = Ensemble([m] * k)(X, Y)
            torch.testing.assert_close(logits, F.log_softmax(one, -1), atol=1e-5, rtol=0)
            assert math.isclose(float(ens_loss), float(loss), rel_tol=1e-5)


def test_members_of_another_vocabulary_context_or_mode_are_refused():
    def gpt(**kw):
        return GPT(GPTConfig(**{"block_size": 16, "vocab_size": 20, **TINY, **kw}))
    for other, what in ((gpt(vocab_size=21), "vocab_size 21"), (gpt(block_size=8), "block_size 8"),
                        (gpt(mode="reward"), "reward model")):
        with pytest.raises(EnsembleError, match=what):
            Ensemble([gpt(), other], names=["a.pt", "b.pt"])
    with pytest.raises(EnsembleError, match="at least one"):
        Ensemble([])
    with pytest.raises(EnsembleError, match="identity"):  # GPT-2's vocabulary: no identity head, the scores work
        Ensemble([gpt(vocab_size=50304)] * 2).lm_head


def test_the_ensembles_val_nll_is_no_worse_than_its_members_mean(w):
    """Jensen: -log mean_k p_k <= mean_k -log p_k at every token, so over the val split too; measured by
    measures.val_perplexity_at_temperatures (hidden_states and the identity head) and lib/heldout (token_logprobs)."""
    ens = w["ens"]
    curve = cm.val_perplexity_at_temperatures(ens, w["data"], "cpu", 16, temps=(0.8, 1.0))
    members = [cm.val_perplexity_at_temperatures(m, w["data"], "cpu", 16)[1.0]["val_loss"] for m in ens.members]
    assert curve[1.0]["val_loss"] <= sum(members) / len(members)
    heldout, _ = evaluate_loss(ens, make_eval_loader(os.path.join(w["data"], "val.bin"), BLOCK, 16), "cpu")
    assert math.isclose(heldout, curve[1.0]["val_loss"], rel_tol=1e-6)


SETTINGS = [(1.0, None), (0.7, 5), (1.3, None), (0.0, None)]


@pytest.mark.parametrize("temperature,top_k", SETTINGS)
def test_cached_ensemble_generation_equals_the_recomputed_prefix(w, temperature, top_k):
    """Engine's eager loop, each member over its own KV cache and the mixture sampled per step, draws the tokens
    of nanoGPT's loop that recomputes the whole prefix, from the same uniforms (and past block_size, rolling)."""
    ens = w["ens"]
    idx = torch.from_numpy(cm.val_tokens(w["data"])[:12].astype("int64")).view(3, 4)
    u = torch.rand(3, BLOCK, generator=torch.Generator().manual_seed(5))
    cached = Engine(ens).generate(idx, BLOCK - 4, temperature=temperature, top_k=top_k, uniforms=u)
    assert torch.equal(cached, generate_recompute(ens, idx, BLOCK - 4, temperature, top_k, uniforms=u))
    assert Engine(ens).generate(idx, BLOCK + 8, temperature=temperature, top_k=top_k, seed=1).shape == (3, BLOCK + 12)
    assert ens.generate(idx, 6).shape == (3, 10)


def test_the_engine_decodes_an_ensemble_with_its_eager_loop_on_any_device(w):
    """engine.Engine.decoder: an Ensemble (static_decoding False) gets the eager loop where a GPT gets GPT_DECODE's
    static-cache decoder (CUDA), and asking it for another decoder is an error."""
    ens = w["ens"]
    assert Engine(ens).decoder(torch.device("cuda")) == "eager"
    assert Engine(ens.members[0]).decoder(torch.device("cuda")) == decoder_choice()
    with pytest.raises(ValueError, match="eager loop only"):
        Engine(ens, decoder="static").generate(torch.zeros(1, 1, dtype=torch.long), 2)


def test_the_frontier_sweep_takes_an_ensemble(w):
    ens, rows = w["ens"], {}
    curve = frontier.sweep(ens, w["data"], temps=(0.7, 1.0), n_samples=6, sample_len=20, judge=ens.members[0],
                           rows=rows)
    assert sorted(curve) == [0.7, 1.0]
    for t, point in curve.items():
        assert point["samples"] == 6 and len(point["judge_items"]) == 6 and point["val_items"]
        assert all(math.isfinite(point[k]) for k in ("val_loss", "judge_nll", "real_word_rate", "distinct_2"))
        again = cm.generated_blocks(ens, cm.val_tokens(w["data"]), 6, 20, 0, temperature=t)
        assert (again == rows[t]).all()
    assert curve[0.7]["val_loss"] != curve[1.0]["val_loss"]
    nll = cm.judge_nll(ens, rows[1.0])  # an ensemble judges too (token_logprobs)
    assert nll.shape == (6,) and (nll > 0).all()


def test_load_ensemble_and_the_members_training_flops(w, tmp_path):
    paths = w["paths"]
    ens = load_ensemble(",".join(paths))
    assert len(ens.members) == 3 and not ens.training and ens.tokenization.method == "char"
    assert [s["path"] for s in ens.sources] == [os.path.abspath(p) for p in paths]
    summaries = ens_mod.member_summaries(paths)
    total = training_flops(paths, flops.step_train)
    assert total["flops"] == sum(flops.step_train(s)["flops"] for s in summaries) > 0
    lone = str(tmp_path / "lone.pt")  # a member without train_summary.json: the cost is unknown
    with open(paths[0], "rb") as src, open(lone, "wb") as dst:
        dst.write(src.read())
    assert training_flops([paths[0], lone], flops.step_train) is None
    with pytest.raises(EnsembleError, match="--teachers .*nope.pt: no such checkpoint"):
        load_ensemble([paths[0], str(tmp_path / "nope.pt")], flag="--teachers")
    assert ens_mod.forward_flops(summaries[0]["model_args"], BLOCK) == flops.forward_flops(summaries[0]["model_args"],
                                                                                           BLOCK)


# ----------------------------------------------------------------------------- the distillation loss

def student_and_loss(w, alpha, **kw):
    torch.manual_seed(3)
    student = GPT(GPTConfig(block_size=BLOCK, vocab_size=w["ens"].config.vocab_size, **TINY))
    X, Y = val_batch(w)
    with torch.no_grad():
        th = w["ens"].member_states(X)
    stats = distillation_loss(student.hidden_states(X), student.lm_head.weight, th, w["ens"].heads, Y, alpha, **kw)
    return student, stats, X, Y


def grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def test_alpha_0_is_the_plain_next_token_loss_with_its_gradients(w):
    student, stats, X, Y = student_and_loss(w, 0.0)
    distilled = grads(student)
    student.zero_grad()
    _, loss = student(X, Y)
    loss.backward()
    loss = float(loss.detach())
    assert math.isclose(stats["loss"], loss, rel_tol=1e-6) and math.isclose(stats["ce"], loss, rel_tol=1e-6)
    for n, g in grads(student).items():
        torch.testing.assert_close(distilled[n], g, atol=1e-6, rtol=1e-4)


def test_alpha_1_is_the_kl_to_the_ensemble_and_chunks_change_nothing(w, monkeypatch):
    student, stats, X, Y = student_and_loss(w, 1.0)
    with torch.no_grad():
        logp, logq = w["ens"].log_probs(X), F.log_softmax(student(X, Y)[0], -1)
        kl = float((logp.exp() * (logp - logq)).sum(-1).mean())
    assert math.isclose(stats["loss"], kl, rel_tol=1e-5) and math.isclose(stats["kl"], kl, rel_tol=1e-5) and kl > 0
    whole = grads(student)
    monkeypatch.setattr(ens_mod, "positions_per_chunk", lambda *a, **k: 7)  # 128 positions in 19 chunks
    student, chunked, _, _ = student_and_loss(w, 1.0)
    assert math.isclose(chunked["loss"], stats["loss"], rel_tol=1e-6)
    for n, g in grads(student).items():
        torch.testing.assert_close(g, whole[n], atol=1e-6, rtol=1e-4)


def test_mixture_logprobs_of_one_member_is_its_log_softmax():
    h, wt = torch.randn(5, 8), torch.randn(11, 8)
    torch.testing.assert_close(mixture_logprobs([h], [wt]), F.log_softmax(h @ wt.T, -1))


# ----------------------------------------------------------------------------- train_distill.py

def distill_args(w, out, *extra, teachers=None, base=None):
    return ["--teachers", ",".join(teachers or w["paths"]), "--init_config_from", base or w["paths"][0],
            "--data_dir", w["data"], "--out_dir", str(out), *FAST, *extra]


def val_kl(w, model):
    X, Y = val_batch(w, B=8)
    with torch.no_grad():
        logp, logq = w["ens"].log_probs(X), F.log_softmax(model(X, Y)[0], -1)
    return float((logp.exp() * (logp - logq)).sum(-1).mean())


@pytest.mark.slow
def test_train_distill_writes_a_checkpoint_every_loader_reads_and_its_summary(w, tmp_path):
    out = tmp_path / "out"
    r = run_script(["train_distill.py", *distill_args(w, out, "--max_iters", "30", "--eval_interval", "10", "--alpha", "0.8")],
                   cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr
    student, ckpt, _ = load_model(str(out / "ckpt.pt"), require_mode="generator")
    assert ckpt["best_iter"] == ckpt["iter_num"] and ckpt["tokenization"]["method"] == "char"
    assert ckpt["distill"]["alpha"] == 0.8 and len(ckpt["distill"]["teachers"]) == 3
    with open(out / "train_summary.json") as f:
        s = json.load(f)
    for key in ("best_val_loss", "best_iter", "iters", "stop_reason", "batch_size", "block_size",
                "gradient_accumulation_steps", "model_args", "eval_interval", "eval_iters"):
        assert s[key] is not None, key
    assert s["iters"] == 30 and s["block_size"] == BLOCK and s["stop_reason"] == "max_iters reached"
    # the student's cost as flops.step_train counts a train.py run, plus the teachers' 3 forwards a token
    assert s["teacher_forward_flops_per_token"] == 3 * flops.forward_flops(s["model_args"], BLOCK)
    assert s["teacher_flops"] == s["teacher_forward_flops_per_token"] * (30 + 4 * 2 * 2) * 16 * BLOCK
    assert math.isclose(flops.step_train(s)["flops"] + s["teacher_flops"], s["flops"], rel_tol=1e-12)
    evals = [rec for rec in read_jsonl(out / "metrics.jsonl") if "val_loss" in rec]
    assert [rec["step"] for rec in evals] == [0, 10, 20, 30]
    assert evals[-1]["val_kl"] < 0.5 * evals[0]["val_kl"]
    torch.manual_seed(0)  # the KL to the ensemble on val, measured here: far below a fresh model's
    assert val_kl(w, student) < 0.5 * val_kl(w, GPT(student.config).eval())


def run_main(argv, capsys=None):
    """train_distill.main on argv in this process (run_cli's exit code and stderr with capsys)."""
    old = sys.argv
    sys.argv = ["train_distill.py", *argv]
    try:
        if capsys is None:
            return train_distill.main()
        capsys.readouterr()
        try:
            run_cli(train_distill.main)
            code = 0
        except SystemExit as e:
            code = e.code
        return code, capsys.readouterr().err
    finally:
        sys.argv = old


@pytest.mark.slow
def test_resume_continues_exactly_and_a_finished_run_is_never_overwritten(w, tmp_path, capsys):
    straight, split = tmp_path / "straight", tmp_path / "split"
    run_main(distill_args(w, straight, "--max_iters", "10", "--eval_interval", "5", "--dropout", "0.1"))
    run_main(distill_args(w, split, "--max_iters", "5", "--eval_interval", "5", "--dropout", "0.1"))
    code, err = run_main(distill_args(w, split, "--max_iters", "10", "--eval_interval", "5", "--dropout", "0.1"),
                         capsys)
    assert code == 2 and "already holds a run" in err and "--resume" in err
    run_main(distill_args(w, split, "--max_iters", "10", "--eval_interval", "5", "--dropout", "0.1", "--resume"))
    a, b = (torch.load(d / "last.pt", weights_only=True) for d in (straight, split))
    assert a["iter_num"] == b["iter_num"] == 10
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), k
    steps = [(r["step"], "val_loss" in r) for r in read_jsonl(split / "metrics.jsonl")]
    assert steps == [(r["step"], "val_loss" in r) for r in read_jsonl(straight / "metrics.jsonl")]
    code, err = run_main(distill_args(w, split, "--max_iters", "10", "--eval_interval", "5", "--dropout", "0.1",
                                      "--alpha", "0.2", "--resume"), capsys)
    assert code == 2 and "other --teachers, --alpha or --data_dir" in err


def fake_base(path, **kw):
    """A generator checkpoint of another shape (no tokenization record), as the student's base."""
    atomic_torch_save(make_checkpoint(GPT(GPTConfig(**{"block_size": BLOCK, "vocab_size": 40, **TINY, **kw}))),
                      path)
    return path


def test_bad_inputs_exit_with_the_flag_and_the_fix(w, tmp_path, capsys):
    other_vocab, other_block = fake_base(str(tmp_path / "v.pt")), fake_base(str(tmp_path / "b.pt"), block_size=16,
                                                                           vocab_size=w["ens"].config.vocab_size)
    p = w["paths"]
    cases = [
        (dict(teachers=p[:1]), "--teachers names 1 checkpoint(s); an ensemble needs K >= 2"),
        (dict(teachers=[p[0], str(tmp_path / "missing.pt")]), "--teachers " + str(tmp_path / "missing.pt")),
        (dict(extra=("--alpha", "1.5")), "--alpha must be in [0, 1], got 1.5"),
        (dict(extra=("--alpha", "nan")), "--alpha must be in [0, 1]"),
        (dict(base=other_vocab), f"--teachers have vocab_size {w['ens'].config.vocab_size} but the student"),
        (dict(base=other_block), "--teachers have block_size 32 but the student (--init_config_from"),
        (dict(teachers=[p[0], other_vocab]), "has vocab_size 40 but --teachers"),
        (dict(extra=("--init_from", p[0])), "pass exactly one of --init_config_from and --init_from"),
        (dict(base=str(tmp_path / "nobase.pt")), "--init_config_from " + str(tmp_path / "nobase.pt")),
        (dict(extra=("--data_dir", str(tmp_path / "nodata"))), "--data_dir " + str(tmp_path / "nodata")),
        (dict(extra=("--learning_rate", "5e-5", "--min_lr", "1e-4")), "--min_lr must be <= --learning_rate (5e-05)"),
    ]
    for i, (case, message) in enumerate(cases):
        out = tmp_path / f"out{i}"
        code, err = run_main(distill_args(w, out, "--max_iters", "2", *case.get("extra", ()),
                                          teachers=case.get("teachers"), base=case.get("base")), capsys)
        assert code == 2 and message in err and "suggestion:" in err and "Traceback" not in err, (case, err)
        assert not os.path.exists(out), case  # refused before the output directory was made


@pytest.mark.slow  # subprocesses
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_train_distill_runs_under_reduced_precision(w, tmp_path, dtype):
    """bf16 autocast, and fp16 with its gradient scaler (the paths a GPU takes, run here on the CPU): the student
    trains, its losses stay finite, and its checkpoint loads."""
    out = tmp_path / dtype
    r = run_script(["train_distill.py", *distill_args(w, out, "--max_iters", "6", "--eval_interval", "3", "--dtype", dtype)],
                   cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    evals = [rec for rec in read_jsonl(out / "metrics.jsonl") if "val_loss" in rec]
    assert evals and all(math.isfinite(rec["val_loss"]) and math.isfinite(rec["val_kl"]) for rec in evals)
    load_model(str(out / "ckpt.pt"), require_mode="generator")
