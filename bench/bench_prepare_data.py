"""
Corpus preparation at scale: prepare_data.py (streamed, --num_proc processes) against what a
nanoGPT user would run, on generated corpora of several GB.

  corpus:   the lines of tiny Shakespeare (--source), shuffled again for every 1 MB block, a tenth
            of them in upper case and a tenth in lower case, until the size is reached (ASCII;
            the file is still in the page cache when it is read, as a corpus read twice would be).
  ours:     python prepare_data.py --input FILE --tokenization bpe|char (default --num_proc: all
            cores), at every --sizes_gb and at the baseline's size (also with --num_proc 1).
  baseline: nanoGPT's data/shakespeare/prepare.py (read the whole file, 90/10 cut of the text,
            tiktoken encode_ordinary in one process, np.array(ids, dtype=np.uint16).tofile) and
            data/shakespeare_char/prepare.py (sorted(set(data)), [stoi[c] for c in s]); both need
            the whole text and all its ids in memory, so they run at --baseline_mb only. The
            GPT-2 encoding comes from tokenization_manager (the same tiktoken object, built offline).

Every command runs as its own process; the figures are for the whole command (start-up and
loading the tokenizer included):
  MB/s      input bytes / wall time;
  CPU       user + system seconds of the command and its descendants, and CPU / wall: the cores it
            actually got (on a machine shared with other jobs, fewer than it could use);
  tree RSS  peak of the summed resident memory of the command and all its descendants, sampled
            every 0.1 s (pool processes share the pages they inherit, which this counts again for
            each; PSS, also reported, splits shared pages among the processes that use them);
  max HWM   the largest single-process high-water mark (VmHWM, exact, not sampled).
At the baseline size the outputs of ours and the baseline are compared: train.bin and val.bin
must be byte-identical (the same split rule, the same tokenizer).

    python bench/bench_prepare_data.py                                  # 0.5 and 2 GB, baseline at 200 MB
    python bench/bench_prepare_data.py --sizes_gb 1 --baseline_mb 100   # quicker
"""
import argparse
import hashlib
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = [os.path.join(ROOT, "data", "shakespeare_char", "input.txt"),
           os.path.join(ROOT, "..", "shared", "data", "tinyshakespeare", "input.txt"),
           os.path.join(ROOT, "..", "..", "shared", "data", "tinyshakespeare", "input.txt")]

ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
ap.add_argument("--sizes_gb", default="0.5,2", help="corpus sizes (GB, 1e9 bytes) for prepare_data.py, comma-separated")
ap.add_argument("--baseline_mb", type=float, default=200,
                help="corpus size (MB) for the whole-file baselines (and ours beside them)")
ap.add_argument("--tokenizations", default="bpe,char", help="which tokenizations to run, comma-separated")
ap.add_argument("--source", default=None, help="text whose lines make the corpus (default: tiny Shakespeare, "
                "from data/shakespeare_char/input.txt or ../shared/data/tinyshakespeare/input.txt)")
ap.add_argument("--work_dir", default=None, help="where corpora and outputs go (default: a new temporary "
                "directory, deleted at the end); corpora already there are reused")
ap.add_argument("--num_proc", type=int, default=None, help="prepare_data.py --num_proc (default: all cores)")
ap.add_argument("--no_baseline", action="store_true", help="skip the whole-file baselines")
ap.add_argument("--repeats", type=int, default=1,
                help="runs of each command at the baseline size, taking turns (the median is compared)")
ap.add_argument("--out", default=None, help="also write the results as JSON here")
args = ap.parse_args()

BASELINE = {
    # nanoGPT data/shakespeare/prepare.py, with the GPT-2 encoding built offline
    "bpe": """
import sys
import numpy as np
sys.path.insert(0, sys.argv[3])
from tokenization_manager import gpt2_encoding
with open(sys.argv[1], 'r', encoding='utf-8') as f:
    data = f.read()
n = len(data)
train_data = data[:int(n*0.9)]
val_data = data[int(n*0.9):]
enc = gpt2_encoding()
train_ids = enc.encode_ordinary(train_data)
val_ids = enc.encode_ordinary(val_data)
np.array(train_ids, dtype=np.uint16).tofile(sys.argv[2] + '/train.bin')
np.array(val_ids, dtype=np.uint16).tofile(sys.argv[2] + '/val.bin')
""",
    # nanoGPT data/shakespeare_char/prepare.py (meta.pkl left out)
    "char": """
import sys
import numpy as np
with open(sys.argv[1], 'r') as f:
    data = f.read()
chars = sorted(list(set(data)))
stoi = { ch:i for i,ch in enumerate(chars) }
def encode(s):
    return [stoi[c] for c in s]
n = len(data)
train_data = data[:int(n*0.9)]
val_data = data[int(n*0.9):]
train_ids = encode(train_data)
val_ids = encode(val_data)
np.array(train_ids, dtype=np.uint16).tofile(sys.argv[2] + '/train.bin')
np.array(val_ids, dtype=np.uint16).tofile(sys.argv[2] + '/val.bin')
""",
}


def machine():
    cpu = platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    with open("/proc/meminfo") as f:
        mem = int(f.readline().split()[1]) / 2**20
    return f"{cpu}, {os.cpu_count()} logical CPUs, {mem:.0f} GiB RAM, Python {platform.python_version()}"


def make_corpus(path, size, source_lines, seed=0):
    """At least `size` bytes (whole lines) of shuffled, case-varied source lines; reused if present."""
    if os.path.exists(path):
        return
    rng = np.random.default_rng(seed)
    variants = [source_lines, [s.upper() for s in source_lines], [s.lower() for s in source_lines]]
    written = 0
    with open(path + ".part", "wb") as f:
        while written < size:  # blocks of about 1 MB: one permutation of the lines each
            kind = rng.choice(3, size=len(source_lines), p=[0.8, 0.1, 0.1])
            block = "".join(variants[kind[i]][i] for i in rng.permutation(len(source_lines))).encode("utf-8")
            f.write(block)
            written += len(block)
    os.replace(path + ".part", path)


def tree(root_pid):
    """pids of root_pid and all its descendants (from /proc/PID/task/TID/children: cheap, unlike
    a scan of all of /proc, so sampling takes little CPU from the 2 cores being measured)."""
    out, todo = [], [root_pid]
    while todo:
        pid = todo.pop()
        out.append(pid)
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return out


def proc_kb(pid, path, key):
    try:
        with open(f"/proc/{pid}/{path}") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def run(cmd):
    """Run cmd; returns (wall seconds, CPU seconds of it and its descendants, peak tree RSS,
    peak tree PSS, max single HWM), memory in bytes."""
    peak = {"rss": 0, "pss": 0, "hwm": 0}
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    p = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"},
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    done = threading.Event()

    def sample():
        while not done.is_set():
            pids = tree(p.pid)
            peak["rss"] = max(peak["rss"], sum(proc_kb(q, "status", "VmRSS:") for q in pids))
            peak["pss"] = max(peak["pss"], sum(proc_kb(q, "smaps_rollup", "Pss:") for q in pids))
            peak["hwm"] = max([peak["hwm"]] + [proc_kb(q, "status", "VmHWM:") for q in pids])
            done.wait(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, _ = p.communicate()
    wall = time.time() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)  # pool processes count once the pool has joined them
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    done.set()
    sampler.join()
    if p.returncode != 0:
        raise SystemExit(f"command failed ({p.returncode}): {' '.join(cmd)}\n{out[-3000:]}")
    return wall, cpu, peak["rss"] * 1024, peak["pss"] * 1024, peak["hwm"] * 1024


def sha(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 24), b""):
            h.update(b)
    return h.hexdigest()


source = args.source or next((p for p in SOURCES if os.path.exists(p)), None)
if source is None:
    raise SystemExit("no tiny Shakespeare found: pass --source TEXT (or run data/shakespeare_char/prepare.py)")
with open(source, encoding="utf-8") as f:
    source_lines = f.read().splitlines(keepends=True)
work = args.work_dir or tempfile.mkdtemp(prefix="bench_prepare_")
os.makedirs(work, exist_ok=True)
toks = args.tokenizations.split(",")
sizes = [int(float(s) * 1e9) for s in args.sizes_gb.split(",") if s]
base_size = int(args.baseline_mb * 1e6)
print(machine())
print(f"corpus lines from {os.path.normpath(source)}; work dir {work}; load average {os.getloadavg()[0]:.2f}")

ours = f"ours, --num_proc {args.num_proc or os.cpu_count()}"
jobs = []  # (name, tokenization, corpus size, --num_proc or "baseline"); at the baseline size in turns
for rep in range(args.repeats):
    for tok in toks:
        if not args.no_baseline:
            jobs += [("baseline (1 process, whole file)", tok, base_size, "baseline"),
                     ("ours, --num_proc 1", tok, base_size, 1), (ours, tok, base_size, args.num_proc)]
jobs += [(ours, tok, size, args.num_proc) for tok in toks for size in sizes]

results = []
try:
    for name, tok, target, mode in jobs:
        corpus = os.path.join(work, f"corpus_{target}.txt")
        make_corpus(corpus, target, source_lines)
        out = os.path.join(work, f"out_{tok}_{target}_{mode}")
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
        if mode == "baseline":
            cmd = [sys.executable, "-c", BASELINE[tok], corpus, out, ROOT]
        else:
            cmd = [sys.executable, "prepare_data.py", "--input", corpus, "--out_dir", out, "--tokenization", tok]
            if mode is not None:
                cmd += ["--num_proc", str(mode)]
        load = os.getloadavg()[0]
        wall, cpu, rss, pss, hwm = run(cmd)
        size = os.path.getsize(corpus)
        r = {"name": name, "tokenization": tok, "target": target, "size_bytes": size, "wall_s": wall,
             "cpu_s": cpu, "mb_per_s": size / 1e6 / wall, "tree_rss_peak": rss, "tree_pss_peak": pss, "max_hwm": hwm,
             "load_before": load, "load_after": os.getloadavg()[0],
             "sha256": {s: sha(os.path.join(out, f"{s}.bin")) for s in ("train", "val")}}
        results.append(r)
        print(f"{tok:4s} {size / 1e9:6.2f} GB  {name:34s} {wall:7.1f} s {r['mb_per_s']:7.1f} MB/s  CPU {cpu:7.1f} s "
              f"({cpu / wall:.2f} cores)  tree RSS "
              f"{rss / 2**20:6.0f} MiB  PSS {pss / 2**20:6.0f} MiB  max HWM {hwm / 2**20:6.0f} MiB  "
              f"(load {load:.1f} -> {r['load_after']:.1f})", flush=True)
        shutil.rmtree(out)  # keep the disk use down; the hashes are recorded
finally:
    if args.work_dir is None:
        shutil.rmtree(work, ignore_errors=True)

print()
for tok in toks:
    at_base = [r for r in results if r["tokenization"] == tok and r["target"] == base_size]
    if len({json.dumps(r["sha256"]) for r in at_base}) > 1:
        print(f"{tok}: OUTPUTS DIFFER at {base_size / 1e6:.0f} MB: " + "; ".join(
            f"{r['name']}: {r['sha256']['train'][:12]}" for r in at_base))
    elif at_base:
        print(f"{tok}: at {base_size / 1e6:.0f} MB all {len(at_base)} runs wrote identical train.bin/val.bin")
    names = dict.fromkeys(r["name"] for r in at_base)
    median = {name: {k: statistics.median(r[k] for r in at_base if r["name"] == name)
                     for k in ("mb_per_s", "cpu_s", "tree_rss_peak")} for name in names}
    base = next((m for name, m in median.items() if name.startswith("baseline")), None)
    for name, m in median.items():
        if base and not name.startswith("baseline"):
            print(f"{tok}: {name} / baseline at {base_size / 1e6:.0f} MB (medians): "
                  f"{m['mb_per_s'] / base['mb_per_s']:.2f}x throughput, {m['cpu_s'] / base['cpu_s']:.2f}x CPU time, "
                  f"{m['tree_rss_peak'] / base['tree_rss_peak']:.2f}x tree RSS")
if args.out:
    with open(args.out, "w") as f:
        json.dump({"machine": machine(), "source": source, "results": results}, f, indent=1)
    print(f"wrote {args.out}")
