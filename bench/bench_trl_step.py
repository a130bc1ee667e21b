"""
The project's GRPO step beside TRL's GRPOTrainer step (examples/trl_grpo.py, the TRL arm), in one run on one
machine: TRL is this project's speed peer.

Both fine-tune the same generator against the same detector, in float32 on --device: the default preset's model
shape (4 layers x 4 heads x 128, block 64, the corpus's char vocabulary; fresh weights, or --policy), a
per-position detector with LM features on the policy's own trunk and a perturbed head (so rewards differ within a
group), --prompts_per_step x --group_size rows of --seq_len tokens per update, one update per batch. TRL's prompt
is a quarter of the sequence (fixed); train_grpo.py draws its prompt length in [1, seq_len / 2] each step, a
quarter on average, so the completions have the same mean length. Each side runs --steps updates, --repeats times,
alternating (project, TRL, project, ...) so a drift of the machine's load falls on both; the first update of each
run (warm-up) is left out, and each side's figure is the median over the rest. The ratio is TRL's step over the
project's: above 1, the project's step is faster. train_grpo.py's metrics split its step into rollout, scoring
and update; TRL's is timed whole (generation, reward and update run inside its optimizer step).

    OMP_NUM_THREADS=1 python bench/bench_trl_step.py --data_dir data/shakespeare_char --out bench/results/trl_step.json
"""
import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # run as `python bench/bench_trl_step.py` from the repository root

from core.files import atomic_torch_save, read_jsonl  # noqa: E402
from lib.checkpoint import load_model, make_checkpoint  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402

PHASES = ("rollout_s", "score_s", "update_s", "step_time_s")

ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
ap.add_argument("--data_dir", default="data/shakespeare_char", help="a prepared char corpus (train.bin, meta.pkl)")
ap.add_argument("--policy", default=None, help="generator checkpoint (default: fresh weights of the default shape)")
ap.add_argument("--seq_len", type=int, default=64, help="tokens per sequence, prompt and completion")
ap.add_argument("--prompts_per_step", type=int, default=8, help="prompts per update")
ap.add_argument("--group_size", type=int, default=8, help="completions per prompt")
ap.add_argument("--steps", type=int, default=6, help="updates per run (the first is not timed)")
ap.add_argument("--repeats", type=int, default=2, help="runs of each side, alternating")
ap.add_argument("--device", default="cpu", help="cpu or cuda")
ap.add_argument("--threads", type=int, default=1, help="torch threads of both sides (OMP_NUM_THREADS)")
ap.add_argument("--seed", type=int, default=0, help="weights of the fresh policy and of the perturbed head")
ap.add_argument("--work_dir", default=None, help="where the runs go (default: a temporary directory)")
ap.add_argument("--out", default=None, help="also write the results as JSON to this file")


def models(args, work):
    """(policy, detector) checkpoints: the policy (fresh unless --policy), and a per-position detector with LM
    features on its trunk whose head's output layer is perturbed (a fresh head says 0.5 to everything)."""
    meta_path = os.path.join(args.data_dir, "meta.pkl")
    with open(meta_path, "rb") as f:
        vocab = pickle.load(f)["vocab_size"]
    tok = {"method": "char", "vocab_size": vocab, "meta_path": os.path.abspath(meta_path)}
    torch.manual_seed(args.seed)
    policy = args.policy
    if policy is None:
        policy = os.path.join(work, "policy.pt")
        gpt = GPT(GPTConfig(n_layer=4, n_head=4, n_embd=128, block_size=64, vocab_size=vocab, bias=False))
        atomic_torch_save(make_checkpoint(gpt, None, iter_num=0, tokenization=tok), policy)
    det, ckpt, _ = load_model(policy, mode="reward", reward_per_position=True, reward_lm_features=True)
    torch.nn.init.normal_(det.reward_head[2].weight, std=0.5)
    path = os.path.join(work, "detector.pt")
    atomic_torch_save(make_checkpoint(det, None, tokenization=ckpt.get("tokenization") or tok,
                                      reward_data={"block_size": args.seq_len}), path)
    return policy, path


def child(cmd, env, name):
    t0 = time.time()
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{name} exited {p.returncode}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return time.time() - t0


def project_run(args, policy, det, out, env):
    wall = child([sys.executable, "train_grpo.py", "--model_path", policy, "--reward_model_path", det,
                  "--out_dir", out, "--data_dir", args.data_dir, "--device", args.device, "--dtype", "float32",
                  "--seq_len", str(args.seq_len), "--prompts_per_step", str(args.prompts_per_step),
                  "--group_size", str(args.group_size), "--max_steps", str(args.steps), "--seed", str(args.seed),
                  "--eval_interval", str(10 ** 6), "--eval_reward_samples", "0", "--eval_max_batches", "1",
                  "--no_save", "--patience", "0", "--reward_threshold", "0", "--kl_cap", "0",
                  "--tensorboard_dir", "none"], env, "train_grpo.py")
    steps = [r for r in read_jsonl(os.path.join(out, "metrics.jsonl")) if r.get("kind") == "step"]
    return {"wall_s": wall, "steps": len(steps), **{k: [r[k] for r in steps[1:]] for k in PHASES}}


def trl_run(args, policy, det, out, env):
    wall = child([sys.executable, os.path.join("examples", "trl_grpo.py"), "--init", policy, "--detector", det,
                  "--data_dir", args.data_dir, "--out_dir", out, "--seed", str(args.seed),
                  "--max_updates", str(args.steps), "--block_size", str(args.seq_len),
                  "--prompts_per_step", str(args.prompts_per_step), "--num_generations", str(args.group_size),
                  "--device", args.device], env, "examples/trl_grpo.py")
    steps = [r["step_s"] for r in read_jsonl(os.path.join(out, "rewards.jsonl"))]
    return {"wall_s": wall, "steps": len(steps), "step_time_s": steps[1:]}


def main():
    args = ap.parse_args()
    if args.steps < 2:
        ap.error("--steps must be at least 2 (the first update is not timed)")
    work = args.work_dir or tempfile.mkdtemp(prefix="trl_step_")
    policy, det = models(args, work)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}
    runs = {"project": [], "trl": []}
    for i in range(args.repeats):
        for side, fn in (("project", project_run), ("trl", trl_run)):
            runs[side].append(fn(args, policy, det, os.path.join(work, f"{side}{i}"), env))
            print(f"{side} run {i + 1}/{args.repeats}: {runs[side][-1]['wall_s']:.1f} s", flush=True)
    timed = {"project": PHASES, "trl": ("step_time_s",)}  # TRL's step is timed whole
    med = {side: {k: statistics.median(t for r in runs[side] for t in r[k]) for k in keys}
           for side, keys in timed.items()}
    result = {"args": vars(args), "runs": runs, "median": med, "torch_threads": args.threads,
              "ratio_trl_over_project": med["trl"]["step_time_s"] / med["project"]["step_time_s"]}
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    p, t = med["project"], med["trl"]
    print(f"GRPO update, {args.prompts_per_step} x {args.group_size} rows of {args.seq_len} tokens, {args.device}, "
          f"{args.threads} thread(s), median of updates 2..{args.steps} over {args.repeats} run(s) each:")
    print("| | rollout s | score s | update s | step s |\n|---|---|---|---|---|")
    print(f"| train_grpo.py | {p['rollout_s']:.3f} | {p['score_s']:.3f} | {p['update_s']:.3f} | "
          f"{p['step_time_s']:.3f} |")
    print(f"| TRL GRPOTrainer | – | – | – | {t['step_time_s']:.3f} |")
    print(f"TRL's step / the project's: {result['ratio_trl_over_project']:.2f}x")


if __name__ == "__main__":
    main()
