"""
The reward server's latency and throughput (serve_reward.py): --clients concurrent clients send --requests
requests of --texts texts each to a server started here on a free port (one server per --waits value of
--batch_wait_ms), beside in-process scoring of the same texts (lib/detector_reward.py's DetectorReward); and a
check that nothing was lost: every request answered, every reward the in-process one to 1e-6.

    OMP_NUM_THREADS=1 python bench/bench_reward_server.py --clients 8 --requests 16 --texts 8
    python bench/bench_reward_server.py --ckpt out-reward/reward_ckpt.pt --corpus input.txt

Without --ckpt it scores with a detector of its own, random weights (speed does not depend on them) in the
default preset's shape: nanoGPT's CPU char model (4 layers, 4 heads, 128 wide, context 64) with the
ratio_features head (per position, LM features and a generator copy of the same shape), over the characters
of the corpus. Texts are windows of --corpus (default: a synthetic play-like text) of random lengths from a
quarter of the context to 1.5 times it (the longer ones are truncated). Prints a markdown table.
"""
import argparse
import atexit
import json
import os
import pickle
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # run as `python bench/bench_reward_server.py` from the repository root

from core.devices import device_name  # noqa: E402
from core.files import atomic_torch_save  # noqa: E402
from lib.checkpoint import make_checkpoint  # noqa: E402
from lib.detector_reward import DetectorReward  # noqa: E402
from model import GPTConfig, split_model_args  # noqa: E402
from lib.reward_head import Detector  # noqa: E402
from tokenization_manager import build_char_meta  # noqa: E402

WORDS = ("the king queen doth speak of love and war my lord good night sweet prince hath thou art fair to be "
         "o what light through yonder window breaks").split()

ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
ap.add_argument("--ckpt", default=None, help="detector checkpoint (default: a random one, the default preset's shape)")
ap.add_argument("--corpus", default=None, help="text file the texts are cut from (default: synthetic play-like text)")
ap.add_argument("--clients", type=int, default=8, help="concurrent clients")
ap.add_argument("--requests", type=int, default=16, help="requests per client")
ap.add_argument("--texts", type=int, default=8, help="texts per request")
ap.add_argument("--waits", default="0,5", help="--batch_wait_ms of each server run, comma-separated")
ap.add_argument("--batch_cap", type=int, default=64, help="the server's --batch_cap, and the in-process batch size")
ap.add_argument("--threads", type=int, default=1, help="torch threads, here and in the server (OMP_NUM_THREADS)")
ap.add_argument("--seed", type=int, default=0, help="seed for the texts and the random detector")
ap.add_argument("--out", default=None, help="also write the results as JSON to this file")
args = ap.parse_args()
torch.set_num_threads(args.threads)
rng = np.random.default_rng(args.seed)
work = tempfile.mkdtemp(prefix="bench_reward_server_")
atexit.register(shutil.rmtree, work, True)


def play_text(n_chars):
    """Speaker lines of random words, like tiny Shakespeare's layout."""
    parts, n, i = [], 0, 0
    while n < n_chars:
        line = " ".join(rng.choice(WORDS, size=int(rng.integers(4, 10)))).capitalize()
        parts.append(f"{('ROMEO', 'JULIET', 'KING')[i % 3]}:\n{line}.\n\n")
        n, i = n + len(parts[-1]), i + 1
    return "".join(parts)


def random_detector(text):
    """A detector checkpoint of the default preset's shape over text's characters (random weights, a head
    whose output varies), with its meta.pkl: the path."""
    meta = build_char_meta(text)
    meta_path = os.path.join(work, "meta.pkl")
    with open(meta_path, "wb") as f:
        pickle.dump(meta, f)
    torch.manual_seed(args.seed)
    shape = dict(n_layer=4, n_head=4, n_embd=128, block_size=64, vocab_size=meta["vocab_size"], bias=False, dropout=0.0)
    gen = GPTConfig(**shape)
    det = Detector(GPTConfig(**shape, mode="reward", reward_per_position=True, reward_lm_features=True,
                             reward_gen_features={**split_model_args(gen)[0], **split_model_args(gen)[1]}))
    torch.nn.init.normal_(det.reward_head[2].weight, std=0.5)  # a fresh head says 0.5 to everything
    path = os.path.join(work, "reward_ckpt.pt")
    atomic_torch_save(make_checkpoint(det, None, tokenization={"method": "char", "vocab_size": meta["vocab_size"],
                                                               "meta_path": meta_path},
                                      reward_data={"block_size": 64}), path)
    return path


def start_server(ckpt, wait_ms):
    """serve_reward.py on a free port: (process, url)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    cmd = [sys.executable, os.path.join(ROOT, "serve_reward.py"), "--ckpt", ckpt, "--port", "0", "--device", "cpu",
           "--batch_cap", str(args.batch_cap), "--batch_wait_ms", str(wait_ms), "--max_batch", str(args.texts)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=ROOT)
    for line in proc.stdout:
        m = re.search(r"ready: .* on (http://\S+:\d+)", line)
        if m:
            threading.Thread(target=proc.stdout.read, daemon=True).start()  # drain the rest
            return proc, m.group(1)
    raise SystemExit(f"serve_reward.py exited with {proc.wait()} before it was ready: {' '.join(cmd)}")


def post(url, texts):
    req = urllib.request.Request(url + "/get_reward", json.dumps({"query": texts}).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def run_clients(url, requests):
    """Every client's requests, clients concurrently: (latencies s, answers by request, wall s)."""
    latencies, answers = [], {}

    def client(c):
        for r in range(args.requests):
            k = c * args.requests + r
            t0 = time.perf_counter()
            try:
                answers[k] = post(url, requests[k])["rewards"]
            except Exception as e:  # counted as lost
                answers[k] = e
            latencies.append(time.perf_counter() - t0)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(args.clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies, answers, time.perf_counter() - t0


def row(name, latencies, wall, n_texts, diff, answered):
    ms = sorted(1000 * x for x in latencies)
    p99 = ms[min(len(ms) - 1, int(round(0.99 * (len(ms) - 1))))]
    return {"scoring": name, "p50_ms": statistics.median(ms), "p99_ms": p99, "texts_per_s": n_texts / wall,
            "max_abs_diff": diff, "answered": answered}


def main():
    text = open(args.corpus, encoding="utf-8").read() if args.corpus else play_text(200_000)
    ckpt = args.ckpt or random_detector(text)
    scorer = DetectorReward(ckpt, device="cpu", batch_size=args.batch_cap)
    B, n_req = scorer.block_size, args.clients * args.requests
    lengths = rng.integers(max(1, B // 4), B * 3 // 2 + 1, size=(n_req, args.texts))
    starts = rng.integers(0, len(text) - B * 2, size=(n_req, args.texts))
    requests = [[text[s:s + n] for s, n in zip(starts[k], lengths[k])] for k in range(n_req)]
    flat = [t for req in requests for t in req]
    scorer.score(flat[:args.batch_cap])  # warm-up
    t0 = time.perf_counter()
    expected = scorer.score(flat)[0]  # in-process, batches of --batch_cap
    rows = [row("in-process, all texts at once", [time.perf_counter() - t0], time.perf_counter() - t0, len(flat), 0.0,
                f"{n_req}/{n_req}")]
    t0, lat = time.perf_counter(), []
    for req in requests:  # in-process, request by request
        lat.append(time.perf_counter())
        scorer.score(req)
        lat[-1] = time.perf_counter() - lat[-1]
    rows.append(row("in-process, request by request", lat, time.perf_counter() - t0, len(flat), 0.0,
                    f"{n_req}/{n_req}"))
    for wait in [float(w) for w in args.waits.split(",") if w]:
        proc, url = start_server(ckpt, wait)
        try:
            post(url, requests[0])  # warm-up
            latencies, answers, wall = run_clients(url, requests)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
        ok = [k for k, a in answers.items() if isinstance(a, list) and len(a) == args.texts]
        diff = max((abs(a - b) for k in ok for a, b in zip(answers[k], expected[k * args.texts:(k + 1) * args.texts])),
                   default=float("inf"))
        rows.append(row(f"server, --batch_wait_ms {wait:g}", latencies, wall, len(flat), diff, f"{len(ok)}/{n_req}"))
        rows[-1]["lost"] = n_req - len(ok)
    return rows, {"ckpt": args.ckpt or "random, default preset's shape", "block_size": B, "texts": len(flat),
                  "truncated": int(sum(len(t) > B for t in flat)), "machine": device_name("cpu")}


rows, info = main()
print(f"{args.clients} clients x {args.requests} requests x {args.texts} texts ({info['texts']} texts, "
      f"{info['truncated']} longer than the context of {info['block_size']}), {info['ckpt']}, {info['machine']}, "
      f"torch threads {args.threads}, --batch_cap {args.batch_cap}\n")
print("| scoring | p50 latency, ms | p99 latency, ms | texts/s | max abs diff vs in-process | answered |")
print("|---|---:|---:|---:|---:|---:|")
for r in rows:
    print(f"| {r['scoring']} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['texts_per_s']:.0f} | "
          f"{r['max_abs_diff']:.1e} | {r['answered']} |")
lost = sum(r.get("lost", 0) for r in rows)
bad = [r["scoring"] for r in rows if r["max_abs_diff"] > 1e-6]
print(f"\nlost requests: {lost}; rewards off the in-process ones by more than 1e-6: {bad or 'none'}")
if args.out:
    with open(args.out, "w") as f:
        json.dump({"args": vars(args), **info, "rows": rows}, f, indent=2)
sys.exit(1 if lost or bad else 0)
