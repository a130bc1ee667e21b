"""
One GRPO step at the gpt2 preset's shapes, split into where its time goes, with the static-cache decoder
(engine.StaticDecoder, CUDA graphs) and with the eager decode loop it replaced, on the same machine.

train_grpo.py itself runs (a subprocess per decoder, GPT_DECODE=eager for the eager one) on a policy
(--policy: a generator checkpoint or a local Hugging Face GPT-2 directory, e.g. one of bench/gpu_models.py's
random GPT-2s) against a per-position detector with LM features on --detector_trunk's frozen trunk (a fresh
head, as train_reward_model.py starts), on --data_dir's BPE corpus, with the preset's step: --prompts_per_step
8 x --group_size 8 rows of --seq_len 256, micro-batches of 16. Its step records (metrics.jsonl) split each
step into rollout_s (sampling), score_s (detector, reference, advantages) and update_s; the first step
(graph capture, cuBLAS warm-up) is left out of the medians. The runs save no checkpoint (train_grpo.py
--no_save), each child's output streams through as it comes, and each row records the child's decoder and
any compile failure (then its 'compiled' row decoded uncompiled).

    python bench/gpu_models.py --out_dir /tmp/gpt2s
    python bench/bench_grpo_step.py --device cuda --policy /tmp/gpt2s/gpt2 --detector_trunk /tmp/gpt2s/gpt2-medium \
        --data_dir data/shakespeare --out bench/results/grpo_step.json

The detector's checkpoint (1.4 GB at gpt2-medium) can be built beforehand, on the side (the GPU check's setup):
--setup_only --detector PATH writes it, a later --detector PATH uses it.
"""
import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # run as `python bench/bench_grpo_step.py` from the repository root

from core.files import atomic_torch_save, read_jsonl  # noqa: E402
from lib.checkpoint import load_model, make_checkpoint  # noqa: E402
from tokenization_manager import TokenizationInfo  # noqa: E402

PHASES = ("rollout_s", "score_s", "update_s", "step_time_s")

ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
ap.add_argument("--policy", required=True, help="generator checkpoint or local Hugging Face GPT-2 directory")
ap.add_argument("--detector_trunk", default=None,
                help="the detector's frozen trunk (a generator of the same tokenizer); needed unless --detector exists")
ap.add_argument("--detector", default=None,
                help="the detector checkpoint: used if it exists, else built there from --detector_trunk "
                     "(default: built in --work_dir)")
ap.add_argument("--setup_only", action="store_true", help="build --detector and exit (no GRPO run)")
ap.add_argument("--data_dir", default="data/shakespeare", help="prepared BPE corpus (train.bin, val.bin)")
ap.add_argument("--device", default="cuda", help="cuda (or cpu for a smoke run)")
ap.add_argument("--dtype", default="auto", help="train_grpo.py --dtype")
ap.add_argument("--seq_len", type=int, default=256, help="tokens per sequence (the gpt2 preset's)")
ap.add_argument("--prompts_per_step", type=int, default=8, help="prompts per step (the preset's)")
ap.add_argument("--group_size", type=int, default=8, help="completions per prompt (the preset's)")
ap.add_argument("--micro_batch_size", type=int, default=16, help="rows per forward/backward chunk (the preset's)")
ap.add_argument("--steps", type=int, default=4, help="GRPO steps per decoder (the first is not timed)")
ap.add_argument("--decoders", default="compiled,static,eager",
                help="comma-separated GPT_DECODE values, run in this order: compiled (captured and compiled: the "
                     "default), static (captured, not compiled), eager (the eager loop)")
ap.add_argument("--work_dir", default=None, help="where the runs go (default: a temporary directory)")
ap.add_argument("--out", default=None, help="also write the results as JSON to this file")


def detector_checkpoint(trunk, seq_len, path):
    """A per-position reward checkpoint with LM features on `trunk` (the strong_trunk detector), fresh head."""
    model, ckpt, _ = load_model(trunk, mode="reward", reward_per_position=True, reward_lm_features=True)
    tok = ckpt.get("tokenization") or TokenizationInfo("bpe", model.config.vocab_size).to_dict()
    atomic_torch_save(make_checkpoint(model, None, tokenization=tok, reward_data={"block_size": seq_len}), path)
    return path


def run(decoder, args, rm, work):
    out = os.path.join(work, decoder)
    cmd = [sys.executable, "train_grpo.py", "--model_path", args.policy, "--reward_model_path", rm,
           "--out_dir", out, "--data_dir", args.data_dir, "--device", args.device, "--dtype", args.dtype,
           "--seq_len", str(args.seq_len), "--prompts_per_step", str(args.prompts_per_step),
           "--group_size", str(args.group_size), "--micro_batch_size", str(args.micro_batch_size),
           "--max_steps", str(args.steps), "--eval_interval", str(10 ** 6), "--eval_reward_samples", "0",
           "--eval_max_batches", "1", "--no_save", "--patience", "0", "--reward_threshold", "0",
           "--kl_cap", "0", "--tensorboard_dir", "none"]
    env = {**os.environ, "GPT_DECODE": decoder, "PYTHONUNBUFFERED": "1"}
    t0 = time.time()
    # the child's lines as they come (a stage cut short by its time limit shows how far each run got)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1)
    tail = collections.deque(maxlen=60)
    for line in proc.stdout:
        print(f"[{decoder}] {line}", end="", flush=True)
        tail.append(line)
    if proc.wait() != 0:
        sys.exit(f"train_grpo.py ({decoder}) exited {proc.returncode}:\n{''.join(tail)}")
    steps = [r for r in read_jsonl(os.path.join(out, "metrics.jsonl")) if r.get("kind") == "step"]
    timed = steps[1:] or steps
    with open(os.path.join(out, "grpo_summary.json")) as f:
        decode = json.load(f).get("decode")
    row = {"decoder": decoder, "steps": len(steps), "wall_s": time.time() - t0,
           **{k: statistics.median(r[k] for r in timed) for k in PHASES},
           "first_step_s": steps[0]["step_time_s"], "rows_per_step": args.prompts_per_step * args.group_size,
           "decode": decode}  # the child's decoder, and why its compiled step failed if it did
    row["rollout_tok_s"] = statistics.median(r["gen_tokens_per_s"] for r in timed)
    return row


def summary(rows, args):
    """The JSON record of the decoders run so far, with the speedups that they allow."""
    result = {"rows": rows, "args": vars(args)}
    by = {r["decoder"]: r for r in rows}
    if {"eager", "static"} <= set(by):
        result["speedup"] = by["eager"]["step_time_s"] / by["static"]["step_time_s"]
    if {"static", "compiled"} <= set(by):
        result["compiled_speedup"] = by["static"]["rollout_s"] / by["compiled"]["rollout_s"]
    return result


def main():
    args = ap.parse_args()
    work = args.work_dir or tempfile.mkdtemp(prefix="grpo_step_")
    rm = args.detector or os.path.join(work, "detector.pt")
    if not os.path.exists(rm):
        if args.detector_trunk is None:
            ap.error(f"--detector {rm} does not exist: give --detector_trunk to build it")
        t0 = time.time()
        detector_checkpoint(args.detector_trunk, args.seq_len, rm)
        print(f"built the detector {rm} on {args.detector_trunk}'s trunk in {time.time() - t0:.1f} s", flush=True)
    if args.setup_only:
        return
    rows = []
    for d in filter(None, args.decoders.split(",")):
        rows.append(run(d, args, rm, work))
        failed = (rows[-1]["decode"] or {}).get("compile_failed")
        print(f"{d}: step {rows[-1]['step_time_s']:.3f} s, {rows[-1]['wall_s']:.1f} s in all"
              + (f" (its compile FAILED, it decoded uncompiled: {failed[0][:200]})" if failed else ""), flush=True)
        if args.out:  # after each decoder: a run stopped by a time limit keeps the decoders it finished
            os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
            with open(args.out, "w") as f:
                json.dump(summary(rows, args), f, indent=1)
    print(f"GRPO step, {args.prompts_per_step} x {args.group_size} rows of {args.seq_len} tokens, "
          f"micro-batches of {args.micro_batch_size}, {args.device}, median of steps 2..{args.steps}:")
    print("| decoder | rollout s | score s | update s | step s | first step s | rollout tok/s |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['decoder']} | {r['rollout_s']:.3f} | {r['score_s']:.3f} | {r['update_s']:.3f} | "
              f"{r['step_time_s']:.3f} | {r['first_step_s']:.2f} | {r['rollout_tok_s']:,.0f} |")
    result = summary(rows, args)
    if "speedup" in result:
        print(f"step: {result['speedup']:.2f}x faster with the static decoder")
    if "compiled_speedup" in result:
        print(f"rollout: {result['compiled_speedup']:.2f}x faster with the compiled step than the uncompiled one")


if __name__ == "__main__":
    main()
