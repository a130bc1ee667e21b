"""
Shared test helpers: tiny corpora and tiny but really trained checkpoints on disk,
written the way train.py writes them (make_checkpoint with the 'data' split record and
the tokenization, saved atomically).

    from helpers import make_text, prepare_char_data, train_tiny_checkpoint
"""
import contextlib
import io
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

from core.files import atomic_torch_save
from lib.checkpoint import make_checkpoint, read_checkpoint
from lib.corpus import describe_split
from lib.prepare import prepare_corpus
from model import GPT, GPTConfig
from tokenization_manager import TokenizationManager

WORDS = ["the", "king", "queen", "doth", "speak", "of", "love", "and", "war", "my", "lord",
         "good", "night", "sweet", "prince", "hath", "thou", "art", "fair", "to", "be"]
TINY = dict(n_layer=2, n_head=2, n_embd=32)


@contextlib.contextmanager
def backend_flags_kept():
    """The process-wide backend flags an entry point's main sets (train.py turns TF32 on for CUDA), as
    they were before the block: a main run in-process leaves no later test in TF32."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch.get_float32_matmul_precision())
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(saved[2])  # first: it sets matmul.allow_tf32 too
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]


def run_train_main(*args):
    """`python train.py ARGS`, in this process (no second start of Python and torch: about 3 s on 2 cores),
    for fixtures of any scope -> what it printed."""
    import train
    out, argv = io.StringIO(), sys.argv
    sys.argv = ["train.py", *args]
    try:
        with backend_flags_kept(), contextlib.redirect_stdout(out):
            train.main()
    finally:
        sys.argv = argv
    return out.getvalue()


def make_text(n_chars, seed=0, upper=False, lower=False):
    """Play-like text of exactly n_chars characters (speaker lines + random words);
    upper/lower put all of it in one case."""
    rng = np.random.default_rng(seed)
    parts, n = [], 0
    i = 0
    while n < n_chars:
        who = ["ROMEO", "JULIET", "KING"][i % 3]
        line = " ".join(rng.choice(WORDS, size=int(rng.integers(4, 10)))).capitalize()
        chunk = f"{who}:\n{line}.\n\n"
        if upper:
            chunk = chunk.upper()
        elif lower:
            chunk = chunk.lower()
        parts.append(chunk)
        n += len(chunk)
        i += 1
    return "".join(parts)[:n_chars]


def make_split_text(n_train_chars=9000, n_val_chars=1000, seed=0):
    """Text whose nanoGPT 90/10 split (split_text) falls exactly between an all lower-case
    train part and an all UPPER-case val part, so any run of a few natural tokens (every
    8 characters hold a letter) reveals its split."""
    n = n_train_chars + n_val_chars
    assert int(n * 0.9) == n_train_chars, "choose sizes with a 9:1 ratio"
    return make_text(n_train_chars, seed, lower=True) + make_text(n_val_chars, seed + 1, upper=True)


def prepare_char_data(root, text=None, name="tiny_char", train_split=0.9):
    """input.txt in root, prepared (char) into root/name; returns (text_path, data_dir)."""
    os.makedirs(root, exist_ok=True)
    text_path = os.path.join(root, "input.txt")
    with open(text_path, "w", encoding="utf-8") as f:
        f.write(text if text is not None else make_split_text())
    data_dir = os.path.join(root, name)
    prepare_corpus(text_path, data_dir, "char", train_split, log=lambda *a: None)
    return text_path, data_dir


def train_tiny_checkpoint(data_dir, out_path, steps=40, block_size=32, seed=0, lr=1e-2, batch_size=16, **arch):
    """Train a tiny GPT for `steps` AdamW steps on data_dir/train.bin and save it like
    train.py does. Returns out_path."""
    tok = TokenizationManager("char", meta_path=os.path.join(data_dir, "meta.pkl"))
    train_bin, val_bin = os.path.join(data_dir, "train.bin"), os.path.join(data_dir, "val.bin")
    train = torch.from_numpy(np.fromfile(train_bin, dtype=np.uint16).astype(np.int64))
    val = torch.from_numpy(np.fromfile(val_bin, dtype=np.uint16).astype(np.int64))
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    cfg = GPTConfig(block_size=block_size, vocab_size=tok.vocab_size, dropout=0.0, **{**TINY, **arch})
    model = GPT(cfg)
    opt = model.configure_optimizers(0.1, lr, (0.9, 0.99), "cpu")

    def batch(data):
        ix = torch.randint(len(data) - block_size - 1, (batch_size,), generator=g)
        x = torch.stack([data[i:i + block_size] for i in ix])
        y = torch.stack([data[i + 1:i + 1 + block_size] for i in ix])
        return x, y

    model.train()
    for _ in range(steps):
        x, y = batch(train)
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        val_loss = float(model(*batch(val))[1])
    ckpt = make_checkpoint(model, opt, iter_num=steps, best_val_loss=val_loss,
                           data=describe_split(train_bin, val_bin, tok.info, data_dir),
                           tokenization=tok.info.to_dict(),
                           train_config={"steps": steps, "block_size": block_size, "lr": lr, "seed": seed})
    atomic_torch_save(ckpt, out_path)
    return out_path


def strip_to_nanogpt(src, dst):
    """A copy of a checkpoint as nanoGPT's train.py writes it: no split or tokenization record."""
    ckpt = read_checkpoint(src)
    keep = {k: ckpt[k] for k in ("model", "optimizer", "model_args", "iter_num", "best_val_loss")}
    keep["config"] = {"dataset": "unknown"}
    atomic_torch_save(keep, dst)
    return dst


def make_reward_checkpoint(src, dst):
    """A reward-mode checkpoint built from a generator checkpoint (new head)."""
    from lib.checkpoint import load_model
    model, ckpt, _ = load_model(src, mode="reward")
    atomic_torch_save(make_checkpoint(model, None, data=ckpt.get("data"), tokenization=ckpt.get("tokenization")), dst)
    return dst


ALPHABET = "abcdefghijklmnop"  # char vocab of 16 for the GRPO tests


def prepare_alphabet_data(root, n_chars=6000, name="data"):
    """Uniformly random letters of ALPHABET, prepared (char) into root/name; returns data_dir."""
    rng = np.random.default_rng(0)
    _, data_dir = prepare_char_data(str(root), "".join(rng.choice(list(ALPHABET), size=n_chars)), name)
    return data_dir


def train_gameable_reward(data_dir, out_path, x_char="d", block_size=32, steps=80, per_position=False):
    """A tiny reward model trained so that P(natural) = the share of `x_char` in a
    sequence: a reward GRPO can raise quickly. Saved like train_reward_model.py does.
    per_position: a per-position head that calls position t natural iff token t is x_char
    (so its mean over positions is again the share)."""
    tok = TokenizationManager("char", meta_path=os.path.join(data_dir, "meta.pkl"))
    x_id, V = tok.encode(x_char)[0], tok.vocab_size
    data = describe_split(os.path.join(data_dir, "train.bin"), os.path.join(data_dir, "val.bin"), tok.info,
                          data_dir)
    torch.manual_seed(0)
    rm = GPT(GPTConfig(block_size=block_size, vocab_size=V, mode="reward", reward_head_hidden_dim=32,
                       reward_per_position=per_position, **TINY))
    opt = torch.optim.AdamW(rm.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        share = torch.rand(64, 1, generator=g)
        xs = torch.randint(0, V, (64, block_size), generator=g)
        xs = torch.where(torch.rand(64, block_size, generator=g) < share, torch.full_like(xs, x_id), xs)
        if per_position:
            loss = F.cross_entropy(rm.position_logits(xs).reshape(-1, 2), (xs != x_id).long().reshape(-1))
        else:
            frac = (xs == x_id).float().mean(1)
            _, loss = rm(xs, torch.stack([frac, 1 - frac], 1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    atomic_torch_save(make_checkpoint(rm, None, data=data, tokenization=tok.info.to_dict(),
                                      reward_data={"block_size": block_size}), out_path)
    return out_path


REWARD_FILES = ("train_x.bin", "train_y.bin", "val_x.bin", "val_y.bin")


def tiny_train_config(max_iters=30, log_interval=10, **extra):
    """A train.py --config preset for a tiny CPU model (run_cycles' --base_config)."""
    lines = ["n_layer = 2", "n_head = 2", "n_embd = 32", "block_size = 32", "batch_size = 8",
             f"max_iters = {max_iters}", f"lr_decay_iters = {max_iters}", "warmup_iters = 5",
             "eval_interval = 10", "eval_iters = 2", f"log_interval = {log_interval}",
             "learning_rate = 3e-3", "device = 'cpu'"] + [f"{k} = {v!r}" for k, v in extra.items()]
    return "\n".join(lines) + "\n"


def live_processes():
    """(pid, process group, command line) of every running process; zombies left out."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                state, _ppid, pgrp = f.read().rsplit(")", 1)[1].split()[:3]
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().decode(errors="replace")
        except (OSError, ValueError):
            continue
        if state != "Z":
            yield int(pid), int(pgrp), cmd


def write_reward_split(data_dir, split, x, y, info):
    """The reward dataset format of prepare_reward_data.py: {split}_x.bin uint16 (n, N),
    {split}_y.bin float32 (n, 2), {split}_metadata.txt of `key: value` lines."""
    os.makedirs(data_dir, exist_ok=True)
    x = np.ascontiguousarray(x, dtype=np.uint16)
    y = np.ascontiguousarray(y, dtype=np.float32)
    x.tofile(os.path.join(data_dir, f"{split}_x.bin"))
    y.tofile(os.path.join(data_dir, f"{split}_y.bin"))
    meta = {"num_samples": x.shape[0], "block_size": x.shape[1], "x_shape": f"({x.shape[0]}, {x.shape[1]})",
            "y_shape": f"({y.shape[0]}, 2)", "x_dtype": "uint16", "y_dtype": "float32",
            "tokenization_method": info.method, "vocab_size": info.vocab_size, "meta_path": info.meta_path}
    with open(os.path.join(data_dir, f"{split}_metadata.txt"), "w") as f:
        f.writelines(f"{k}: {v}\n" for k, v in meta.items())


_WARM = []  # this test process's launcher (experiment/launcher.py), started at its first command


def run_script(argv, cwd=None, env=None, timeout=300):
    """What subprocess.run([python, *argv], cwd, env, capture_output=True, text=True, timeout) returns, the script
    (argv[0], a path) forked from a launcher this test process keeps, as run_cycles forks its steps: torch and the
    scripts' modules are imported once, not at every command (2.5 to 4.5 s each). Its stdout and stderr come on
    pipes of their own, decoded as text=True decodes them; a step past `timeout` is killed with its process group."""
    import atexit
    import signal
    import subprocess
    import threading
    from experiment import launcher
    argv, cwd = [sys.executable, *map(str, argv)], str(cwd or os.path.dirname(os.path.dirname(__file__)))
    env = dict(os.environ if env is None else env)
    warm = launcher.available()
    if warm and (not _WARM or _WARM[0].gone):
        _WARM[:] = [launcher.Launcher(env={**os.environ, "OMP_NUM_THREADS": "1"})]
        atexit.register(_WARM[0].close)
    step = _WARM[0].spawn(argv, env, cwd=cwd, stderr=True) if warm else None
    if step is None:  # not Linux, or the launcher has gone: a fresh Python
        return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    got = {}
    readers = [threading.Thread(target=lambda f=f: got.__setitem__(f, f.read())) for f in (step.stdout, step.stderr)]
    for t in readers:
        t.start()
    try:
        code = step.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(step.pid, signal.SIGKILL)
        step.wait()
        raise
    finally:
        for t in readers:
            t.join()
        step.stdout.close()
        step.stderr.close()
    text = [io.TextIOWrapper(io.BytesIO(got[f])).read() for f in (step.stdout, step.stderr)]  # as text=True reads
    return subprocess.CompletedProcess(argv, code, *text)
