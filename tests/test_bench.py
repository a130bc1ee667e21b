"""
Smoke tests of the benchmark scripts under bench/: each runs on the CPU as its own process
(python bench/X.py, forked warm by helpers.run_script, from the repository root, OMP_NUM_THREADS=1)
at the smallest settings its flags allow, writes its --out JSON into tmp_path, and the test checks
what the JSON documents: the keys are there, every timing, throughput and ratio is finite and > 0, and the script's own
correctness checks hold (the HF copy's logits match ours; prepare_data.py's outputs equal the
nanoGPT baselines' byte for byte). Where a script has a vocabulary-wide case it also runs at
GPT-2's 50257 tokens with a tiny width and length, large enough for the chunked head paths
(core.logprobs.positions_per_chunk, LOGIT_ELEMENTS).

Left out: bench_detector's compile section and bench_train --compile (a cold inductor compile
takes 35 s and more even for the tiniest model).
Nothing is downloaded: the HF models are built from our weights (common_hf.hf_copy), corpora and
token files are written here.
"""
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from helpers import make_text, run_script

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.slow
HF_TOL = 1e-4  # max |logits ours - HF| of the same weights in float32 (0 to 1e-7 seen)


def run_bench(script, args, tmp_path):
    """Run bench/<script> with args and --out tmp_path/<script>.json; returns the parsed JSON."""
    out = tmp_path / (script + ".json")
    cmd = [os.path.join("bench", script), *args, "--out", str(out)]
    p = run_script(cmd, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}, timeout=600)
    assert p.returncode == 0, f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}"
    assert out.exists(), f"{script} wrote no {out}:\n{p.stdout[-2000:]}"
    with open(out) as f:
        return json.load(f)


def positive(row, *keys):
    """Each row[key] is a finite number > 0."""
    for k in keys:
        v = row[k]
        assert isinstance(v, (int, float)) and math.isfinite(v) and v > 0, f"{k} = {v!r}"


def timed_runs(times, names, repeats):
    """times: {name: [wall s per timed run]}, exactly the expected variants, each run > 0."""
    assert set(times) == set(names), sorted(times)
    for name, runs in times.items():
        assert len(runs) == repeats, (name, runs)
        assert all(math.isfinite(t) and t > 0 for t in runs), (name, runs)


@pytest.mark.parametrize("vocab,block", [(65, 16), (50257, 8)])
def test_bench_generate(tmp_path, vocab, block):
    P, B, MB = 4, 2, 3
    res = run_bench("bench_generate.py", ["--vocab", str(vocab), "--block_size", str(block), "--batch_sizes", str(B),
                                          "--prompt_len", str(P), "--mixed_batch_sizes", str(MB), "--repeats", "1",
                                          "--warmup", "0", "--recompute_tokens", "2", "--threads", "1"], tmp_path)
    assert res["vocab"] == vocab and res["block_size"] == block and res["machine"]
    assert res["decode"] == {"decoder": os.environ.get("GPT_DECODE", "compiled"), "compile_failed": []}
    assert 0 <= res["hf_max_logit_diff"] < HF_TOL, res["hf_max_logit_diff"]
    (u,), (m,) = res["uniform"], res["mixed"]
    assert (u["batch"], u["prompt_len"], u["new_tokens_per_row"]) == (B, P, block - P)
    positive(u, "gemm_flops", "gemm_peak_gflops", "ours_gflops", "cache_bytes", "cache_read_gb_s", "floor_s",
             "floor_tok_s", "ours_of_floor", "ours_of_gemm_peak", "recompute_tok_s", "recompute_cpu_tok_s",
             *(f"{n}_{k}" for n in ("ours", "hf") for k in ("s", "cpu_s", "tok_s", "cpu_tok_s")))
    assert u["ours_tok_s"] == pytest.approx(B * (block - P) / u["ours_s"])
    timed_runs(u["times"], ["ours", "hf", "gemm", "cache"], 1)
    # mixed prefixes: K_i in 1..block-1; HF generates up to the shortest prefix's end for every row
    assert m["batch"] == MB and 1 <= m["min_prefix"] <= m["max_prefix"] <= block - 1
    assert MB * block - m["useful_new_tokens"] in range(MB * m["min_prefix"], MB * m["max_prefix"] + 1)
    assert m["hf_generated_per_row"] == block - m["min_prefix"]
    positive(m, *(f"{n}_{k}" for n in ("ours", "hf") for k in ("s", "cpu_s", "tok_s", "cpu_tok_s")))
    timed_runs(m["times"], ["ours", "hf"], 1)


# vocab 50257 at 2 x 340 positions: B * T * V > LOGIT_ELEMENTS, so our training loss is the chunked one
@pytest.mark.parametrize("vocab,block", [(65, 8), (50257, 340)])
def test_bench_train(tmp_path, vocab, block):
    res = run_bench("bench_train.py", ["--vocab", str(vocab), "--n_layer", "1", "--n_head", "2", "--n_embd", "8",
                                       "--block_size", str(block), "--batch_size", "2", "--steps", "1",
                                       "--repeats", "1", "--warmup", "0", "--threads", "1"], tmp_path)
    if vocab > 65:
        from core.logprobs import LOGIT_ELEMENTS
        assert 2 * block * vocab > LOGIT_ELEMENTS, "the large-vocab case no longer reaches the chunked loss"
    assert (res["vocab"], res["block_size"], res["batch_size"], res["steps_per_run"]) == (vocab, block, 2, 1)
    assert 0 <= res["hf_max_logit_diff"] < HF_TOL, res["hf_max_logit_diff"]
    names = ["ours", "ours, default AdamW", "hf", "hf, fused AdamW"]
    timed_runs(res["times"], names, 1)
    keys = [n.replace(", ", "_").replace(" ", "_") for n in names]
    positive(res, *(f"{k}_{s}" for k in keys for s in ("tok_s", "cpu_tok_s")))
    assert res["ours_tok_s"] == pytest.approx(2 * block / res["times"]["ours"][0])


def test_bench_vocab(tmp_path):
    """Both vocabularies and both sides of the wide threshold (width 256): at V 50257, width 32, the
    2 x 23 positions span two chunks of linear_logprobs and the head runs in HEAD_COLS blocks."""
    res = run_bench("bench_vocab.py", ["--vocabs", "65,50257", "--widths", "32,256", "--seq_len", "24",
                                       "--batch", "2", "--wide_batch", "1", "--gen_batch", "2", "--gen_tokens", "4",
                                       "--wide_gen_tokens", "2", "--repeats", "1", "--threads", "1"], tmp_path)
    assert res["args"]["vocabs"] == "65,50257" and res["time"] and res["decode"]["compile_failed"] == []
    rows = res["rows"]
    assert sorted((r["case"], r["vocab"], r["width"]) for r in rows) == sorted(
        (c, v, w) for c in ("grpo", "gen", "val") for v in (65, 50257) for w in (32, 256))
    for r in rows:
        positive(r, "s", "gflops", "head_gemm_s", "x_head", "x_head_cpu", "all_gemm_s", "x_all", "gemm_gflops",
                 "peak_mib")
        assert math.isfinite(r["peak_above_mib"]) and 0 <= r["peak_above_mib"] <= r["peak_mib"], r
        assert r["x_head"] == pytest.approx(r["s"] / r["head_gemm_s"])


def test_bench_reward_data(tmp_path):
    """The script itself asserts that every method kept the natural prefixes, produced tokens
    below --vocab, and that ours is batch-invariant (exit code 0 means these held)."""
    N, S, chunk = 16, 8, 2
    tokens = tmp_path / "train.bin"
    np.random.default_rng(0).integers(0, 65, size=S * N * 4).astype(np.uint16).tofile(tokens)
    res = run_bench("bench_reward_data.py", ["--block_size", str(N), "--num_samples", str(S), "--samples_per_chunk",
                                             str(chunk), "--batch_size", "4", "--repeats", "1", "--threads", "1",
                                             "--tokens", str(tokens)], tmp_path)
    assert (res["block_size"], res["num_samples"], res["batch_size"], res["threads"]) == (N, S, 4, 1)
    assert res["decode"]["compile_failed"] == []
    assert S <= res["generated_tokens"] <= S * (N - 1)  # every sample generates 1..N-1 tokens
    assert 0 <= res["hf_max_logit_diff"] < HF_TOL, res["hf_max_logit_diff"]
    timed_runs(res["times"], ["ours", "hf_sorted", "hf_order"], 1)
    positive(res["tok_s"], "ours", "hf_sorted", "hf_order")
    assert res["tok_s"]["ours"] == pytest.approx(res["generated_tokens"] / res["times"]["ours"][0])


def test_bench_detector(tmp_path):
    sections = ["head", "threads", "batch", "optim", "attention", "bf16", "eval", "cache"]  # all but compile
    res = run_bench("bench_detector.py", ["--sections", ",".join(sections), "--n_layer", "2", "--n_head", "2",
                                          "--n_embd", "16", "--n_tokens", "8", "--head_dim", "8", "--batch_size", "2",
                                          "--batch_sizes", "2,4", "--tokens_per_run", "16", "--repeats", "1",
                                          "--warmup", "0", "--epoch_samples", "4", "--val_samples", "2",
                                          "--run_steps", "2", "--eval_interval", "1"], tmp_path)
    assert res["machine"] and res["args"]["n_layer"] == 2
    R = res["sections"]
    assert set(R) == set(sections)
    expect = {"head": 2, "threads": 2, "batch": 2, "optim": 3, "attention": 3, "bf16": 2, "eval": 3}
    variants = [(s, R[s]) for s in expect] + [(f"cache {n}", R["cache"][f"unfreeze_{n}"]) for n in (0, 1, 2)]
    for name, sec in variants:
        timings = {k: v for k, v in sec.items() if not k.startswith("estimate_")}
        assert len(timings) == expect.get(name, 5), (name, sorted(sec))
        for variant, v in timings.items():
            positive(v, "tok_s", "cpu_tok_s")
            timed_runs({variant: v["times"]}, [variant], 1)
        for kind in ("tok_s", "cpu_tok_s") if name.startswith("cache") else ():
            positive(sec[f"estimate_{kind}"], "epoch_plain_s", "epoch_cached_first_s", "epoch_cached_later_s",
                     "run_plain_s", "run_cached_s")
    assert set(R["eval"]) == {"batch 2", "batch 4", "batch 512"}


def test_bench_detector_cache_needs_two_layers():
    """The cache section unfreezes the top 0, 1 and 2 blocks: a 1-layer model is refused by
    the script's own flag, not deep inside with an --unfreeze_last_n_blocks it does not have."""
    p = run_script([os.path.join("bench", "bench_detector.py"), "--sections", "head,cache", "--n_layer", "1"],
                   cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=120)
    assert p.returncode == 2 and "--n_layer 2 or more" in p.stderr, (p.returncode, p.stderr[-2000:])


def test_bench_prepare_data(tmp_path):
    """Both tokenizations at the baseline size (nanoGPT's whole-file scripts, ours with 1 and 2
    processes); their train.bin/val.bin must be identical. No --sizes_gb runs: they are the same
    command at another size, and each run is a process that imports torch."""
    source = tmp_path / "source.txt"
    source.write_text(make_text(3000), encoding="utf-8")
    work = tmp_path / "work"
    base_mb = 0.01
    res = run_bench("bench_prepare_data.py", ["--source", str(source), "--work_dir", str(work), "--sizes_gb", "",
                                              "--baseline_mb", str(base_mb), "--num_proc", "2"], tmp_path)
    assert res["machine"] and res["source"] == str(source)
    rows = res["results"]
    names = ["baseline (1 process, whole file)", "ours, --num_proc 1", "ours, --num_proc 2"]
    assert sorted((r["tokenization"], r["name"]) for r in rows) == sorted((t, n) for t in ("bpe", "char")
                                                                           for n in names)
    for r in rows:  # the corpus stays in --work_dir: whole lines, at least the target size
        corpus = work / f"corpus_{r['target']}.txt"
        assert r["target"] == int(base_mb * 1e6) <= r["size_bytes"] == os.path.getsize(corpus)
        positive(r, "wall_s", "cpu_s", "mb_per_s", "tree_rss_peak", "max_hwm")
        assert r["tree_pss_peak"] >= 0
        assert r["mb_per_s"] == pytest.approx(r["size_bytes"] / 1e6 / r["wall_s"])
    for tok in ("bpe", "char"):  # the script's check: every command wrote the same bytes
        hashes = {json.dumps(r["sha256"]) for r in rows if r["tokenization"] == tok}
        assert len(hashes) == 1, (tok, hashes)


def test_bench_grpo_step(tmp_path):
    """bench_grpo_step.py runs train_grpo.py per decoder on gpu_models.py's tiny GPT-2-vocabulary model (policy
    and detector trunk) and a BPE corpus written here; on CPU both decoders run the eager loop (the static one
    is CUDA's, and so is the compiled one; two of the three, to save a run): each phase's median is finite, >= 0,
    and they add up to the step; the results are written after each decoder. The detector is built first on its
    own (--setup_only, the GPU check's setup job), the runs save no checkpoint, their output streams through as
    it comes, the compiled row first, and each row records its child's decoder and compile failures."""
    from lib.prepare import prepare_corpus
    (tmp_path / "input.txt").write_text(make_text(30000))
    prepare_corpus(str(tmp_path / "input.txt"), str(tmp_path / "bpe"), "bpe", 0.9, log=lambda *a: None, num_proc=1)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = run_script(["bench/gpu_models.py", "--out_dir", str(tmp_path / "models"), "--names", "tiny"], cwd=ROOT, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    tiny, det = str(tmp_path / "models" / "tiny"), str(tmp_path / "detector.pt")
    p = run_script(["bench/bench_grpo_step.py", "--device", "cpu", "--policy", tiny, "--detector_trunk", tiny,
                    "--detector", det, "--seq_len", "24", "--setup_only"], cwd=ROOT, env=env)
    assert p.returncode == 0 and os.path.exists(det) and "built the detector" in p.stdout, p.stderr[-2000:]
    # a third decoder that fails (a misspelt GPT_DECODE, refused on a CPU too): the JSON written after each
    # decoder keeps the two that finished, as a stage cut short by its time limit on a GPU keeps them
    out = tmp_path / "grpo_step.json"
    cmd = ["bench/bench_grpo_step.py", "--device", "cpu", "--dtype", "float32", "--policy", tiny,
           "--detector", det, "--data_dir", str(tmp_path / "bpe"), "--seq_len", "24", "--prompts_per_step", "2",
           "--group_size", "2", "--micro_batch_size", "2", "--steps", "2", "--decoders", "compiled,static,compiledd",
           "--work_dir", str(tmp_path / "runs"), "--out", str(out)]
    p = run_script(cmd, cwd=ROOT, env=env, timeout=600)
    assert p.returncode != 0 and "GPT_DECODE='compiledd' is not a decoder" in p.stdout + p.stderr, p.stderr[-2000:]
    assert "[compiled] " in p.stdout and "[static] " in p.stdout  # the children's lines, tagged, as they came
    assert p.stdout.index("[compiled] ") < p.stdout.index("[static] ")
    assert not os.path.exists(tmp_path / "runs" / "compiled" / "ckpt.pt")  # --no_save
    res = json.loads(out.read_text())
    assert [r["decoder"] for r in res["rows"]] == ["compiled", "static"] and res["compiled_speedup"] > 0
    assert [r["decode"] for r in res["rows"]] == [{"decoder": d, "compile_failed": []} for d in ("compiled", "static")]
    for r in res["rows"]:
        assert r["steps"] == 2 and r["rows_per_step"] == 4
        positive(r, "step_time_s", "rollout_s", "update_s", "first_step_s", "rollout_tok_s", "wall_s")
        assert r["score_s"] >= 0 and r["rollout_s"] + r["score_s"] + r["update_s"] == pytest.approx(r["step_time_s"])


def test_bench_trl_step(tmp_path):
    """bench_trl_step.py times the project's GRPO update beside TRL's GRPOTrainer's (examples/trl_grpo.py) on the
    same fresh char model, detector and batch shape, on a char corpus written here: every timed update of each
    side is there (the first left out), each median is finite and > 0, and the ratio is TRL's over the project's."""
    pytest.importorskip("trl")
    from lib.prepare import prepare_corpus
    (tmp_path / "input.txt").write_text(make_text(20000))
    prepare_corpus(str(tmp_path / "input.txt"), str(tmp_path / "char"), "char", 0.9, log=lambda *a: None, num_proc=1)
    res = run_bench("bench_trl_step.py", ["--data_dir", str(tmp_path / "char"), "--seq_len", "16",
                                          "--prompts_per_step", "2", "--group_size", "2", "--steps", "3",
                                          "--repeats", "1", "--work_dir", str(tmp_path / "runs")], tmp_path)
    for side in ("project", "trl"):
        (run,) = res["runs"][side]
        assert run["steps"] == 3 and len(run["step_time_s"]) == 2, run
        positive(res["median"][side], "step_time_s")
    positive(res["median"]["project"], "rollout_s", "update_s")
    assert res["ratio_trl_over_project"] == pytest.approx(res["median"]["trl"]["step_time_s"]
                                                          / res["median"]["project"]["step_time_s"])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_bench_decode_kernels(tmp_path, dtype):
    """bench_decode_kernels.py at one block, 64 wide, uncompiled (the compiled count is the docs' run: a cold compile
    of GPT-2's shapes): a step's ops are the draw's, one block's and the one copy between the regions. (The count
    itself varies with the width, 61 ops at 768 and 72 at 64 in float32; the structure does not.)"""
    res = run_bench("bench_decode_kernels.py", ["--n_layer", "1", "--n_embd", "64", "--no_compile", "--dtype", dtype,
                                                "--batch_size", "4"], tmp_path)
    u = res["uncompiled"]
    assert res["dtype"] == dtype and u["between_regions"] == 1 and u["inside_regions"] > 20
    assert u["ops_per_step"] == u["inside_regions"] + u["between_regions"] and "compiled" not in res


def test_gpu_check_parts_fit_their_deadlines_and_dry_run_on_cpu(tmp_path):
    """bench/gpu_check.sh: in each part the limits of the stages it runs in turn sum to less than its deadline
    (correct+preset runs the two side by side: the longer of them), the two calls of a window fit 280 s
    (correct) and 330 s (speed), no call is over 7 minutes, and a CPU dry run of every part, its GPU stages
    skipped, writes its table and machine record."""
    import re
    text = open(os.path.join(ROOT, "bench", "gpu_check.sh"), encoding="utf-8").read()
    deadlines = {}
    for parts, secs in re.findall(r"^\s*([\w+|]+)\) DEADLINE=\$\{DEADLINE:-(\d+)\}", text, re.M):
        deadlines.update((part, int(secs)) for part in parts.split("|"))
    limits = {name: [int(n) for n in re.findall(r"^\s*stage \w+ (\d+) ", body, re.M)]
              for name, body in re.findall(r"^run_(\w+)\(\) \{\n(.*?)^\}", text, re.M | re.S)}
    assert set(limits) == {"correct", "speed", "preset"} and all(limits.values()), limits
    assert set(deadlines) == {"correct", "speed", "preset", "correct+preset"}, deadlines
    assert deadlines["correct"] <= 280 and deadlines["speed"] <= 330, deadlines
    for part, deadline in deadlines.items():
        assert max(sum(limits[p]) for p in part.split("+")) < deadline <= 420, (part, limits, deadline)
    for part, skip in (("correct", "tests"), ("speed", "setup,decode,grpo_step"), ("correct+preset", "tests,preset")):
        out = tmp_path / part
        r = subprocess.run(["bash", "bench/gpu_check.sh", part], cwd=ROOT, capture_output=True, text=True,
                           timeout=120, env={**os.environ, "OUT": str(out), "SKIP": skip})
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        assert (out / "gpu_check.md").exists() and "commit" in (out / "machine.txt").read_text()
        stages = (out / "stages.txt").read_text().splitlines()
        assert stages and all(line.split()[1] == "skipped" for line in stages), stages
        assert {line.split()[0] for line in stages} == set(skip.split(",")) - {"setup"}


def test_gpu_report_reads_every_stage_of_the_gpu_check(tmp_path):
    """bench/gpu_report.py's one table from what the GPU check's stages leave (written here as they write
    them): the two probe stages' files merged into the anchor rows, the GRPO split, the gpu preset's stamp,
    verdicts and steps, and both test logs' counts."""
    (tmp_path / "machine.txt").write_text("commit abc\n")
    (tmp_path / "stages.txt").write_text("tests 0 250\nanchors_train 0 95\nanchors_decode 124 130\npreset 0 330\n")
    (tmp_path / "cuda_tests.log").write_text("FAILED tests/test_grpo.py::test_grpo_on_a_gpu - AssertionError: x\n"
                                             "Timeout (0:02:00)!\nThread 0x7f (most recent call first):\n"
                                             '  File "/usr/lib/python3/torch/_inductor/x.py", line 9 in wait\n'
                                             '  File "/w/tests/test_static_decode.py", line 400 in test_cuda_graphs\n'
                                             '  File "/w/tests/conftest.py", line 30 in fixture\n'
                                             "6 passed, 1 failed in 200.1s\n")
    (tmp_path / "suite.log").write_text("650 passed, 20 skipped in 240.0s\n")
    train = {f"train_{w}_{m}": {"ms_per_iter": v} for w, m, v in
             (("ours", "eager", 35.0), ("nanogpt", "eager", 35.7), ("ours", "compile", 27.0), ("nanogpt", "compile", 27.0))}
    (tmp_path / "probe_train.json").write_text(json.dumps(train))
    (tmp_path / "probe.json").write_text(json.dumps({"decode_ours_bf16_weights": {"ms_per_step": 0.9},
                                                      "decode_hf_bf16_static_compile": {"ms_per_step": 2.0}}))
    (tmp_path / "grpo_step.json").write_text(json.dumps({"rows": [
        {"decoder": "compiled", "rollout_s": 0.5, "score_s": 0.1, "update_s": 0.3, "step_time_s": 0.9,
         "decode": {"decoder": "compiled", "compile_failed": ["InductorError('no triton')"]}},
        {"decoder": "static", "rollout_s": 0.5, "score_s": 0.1, "update_s": 0.3, "step_time_s": 0.9}]}))
    (tmp_path / "preset_steps.log").write_text("--- cycle 0: base model: exit 0 after 41.5 s; peak memory: 1.2 GiB\n")
    (tmp_path / "preset_summary.json").write_text(json.dumps({
        "settings": {"device_name": "NVIDIA H100 80GB HBM3", "dtype": "bfloat16"}, "commit": "abc",
        "data_source": "input.txt", "base": {"val_ppl": 4.321}, "seconds_this_invocation": 321.0,
        "frontier": {"cycle_1": {"arms": {"adversarial": {"verdicts": {
            "control": {"verdict": "inside", "at_quality": {"diff": 0.077, "threshold": 0.02, "t_star": 0.86,
                                                             "verdict": "inside"}},
            "trunk": {"verdict": "degenerate", "at_quality": {"verdict": "out of range"},  # as the H100 run's GRPO
                      "at_coverage": {"diff": -0.3008, "threshold": 0.0227, "t_star": 0.51, "verdict": "degenerate",
                                      "degenerate": {"arm": 0.898, "control": 0.0}}}}}}}},
        "information": {"cycle_1": {"lower": [0.01, 0.002], "upper": 0.03, "took": {"trunk": [-0.2, 0.01]}}}}))
    p = subprocess.run([sys.executable, "bench/gpu_report.py", str(tmp_path)], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    md = p.stdout
    assert "| anchors_decode | TIMED OUT | 130 |" in md and "6 passed, 1 failed" in md and "650 passed, 20 skipped" in md
    assert "\n- FAILED tests/test_grpo.py::test_grpo_on_a_gpu - AssertionError: x\n" in md
    assert "\n- still running at the timeout: tests/test_static_decode.py:400 in test_cuda_graphs\n" in md
    assert "| training, GPT-2 124M bf16, eager (ms/iter) | 35.0 | nanoGPT 35.7 | 1.02x |" in md
    assert "| training, GPT-2 124M bf16, compile (ms/iter) | 27.0 | nanoGPT 27.0 | 1.00x |" in md
    assert "| decode, batch 64, 32 + 224, ours bf16_weights (ms/step) | 0.90 | HF static 2.00 | 2.22x |" in md
    assert "| static | 0.500 | 0.100 | 0.300 | 0.900 |" in md
    assert "- GRPO step, compiled: the compiled step FAILED to compile, it ran uncompiled: InductorError('no triton')" in md
    assert "--preset gpu --device cuda: exit 0 after 330 s" in md and "NVIDIA H100 80GB HBM3, bfloat16, commit abc" in md
    assert "base val ppl 4.321" in md and "- adversarial vs control: inside (matched quality: val NLL +0.0770, " \
        "threshold 0.0200, T* 0.86, inside)" in md
    assert "- adversarial vs trunk: degenerate (matched coverage: judge NLL -0.3008, threshold 0.0227, T* 0.51, " \
        "degenerate; degenerate samples 0.898 (the control's at T* 0.000))" in md
    assert "| cycle 0: base model | 0 | 41.5 | 1.2 GiB |" in md
    assert "- the detector's information 0.0100-0.0300 nats/token of its trunk's advantage 0.2000" in md
    # a run cut short writes a summary without its settings: the report still comes out
    (tmp_path / "preset_summary.json").write_text(json.dumps({"cycles": []}))
    p = subprocess.run([sys.executable, "bench/gpu_report.py", str(tmp_path)], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0 and "| cycle 0: base model | 0 | 41.5 | 1.2 GiB |" in p.stdout, p.stderr
