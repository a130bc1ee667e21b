"""docs/flags.md is generated from the scripts' --help by docs/gen_flags.py; fail when it is stale.
The README's test command is the one CI runs; its links resolve; its example of one's own loop runs."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_flags_md_is_up_to_date(tmp_path):
    out = tmp_path / "flags.md"
    env = dict(os.environ, COLUMNS="80", OMP_NUM_THREADS="1")  # the output must not depend on the terminal
    subprocess.run([sys.executable, os.path.join(ROOT, "docs", "gen_flags.py"), "--out", str(out)],
                   cwd=ROOT, env=env, check=True, capture_output=True, timeout=600)
    with open(os.path.join(ROOT, "docs", "flags.md"), encoding="utf-8") as f:
        current = f.read()
    assert out.read_text(encoding="utf-8") == current, \
        "docs/flags.md is stale: run `python docs/gen_flags.py` and commit the result"


def test_docs_links_resolve():
    """Every relative link in README.md and docs/*.md names a file that exists."""
    import re
    files = [os.path.join(ROOT, "README.md")] + [os.path.join(ROOT, "docs", n)
                                                 for n in sorted(os.listdir(os.path.join(ROOT, "docs")))
                                                 if n.endswith(".md")]
    broken = []
    for path in files:
        text = open(path, encoding="utf-8").read()
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if "://" in target:
                continue
            if not os.path.exists(os.path.join(os.path.dirname(path), target)):
                broken.append(f"{os.path.relpath(path, ROOT)} -> {target}")
    assert not broken, "broken links: " + ", ".join(broken)


def test_ci_runs_the_readmes_test_command():
    """.ci/run ends with the README's first test command (the full suite), word for word."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        quick_start = f.read().split("## Quick start", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    readme = [line for line in quick_start.splitlines() if line.startswith("python -m pytest")]
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
        ci = [line for line in f.read().splitlines() if "pytest" in line and not line.startswith("#")]
    assert readme and ci == readme[:1], (ci, readme)


def readme_block(heading):
    """The first ```python block of README.md's section `heading`."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        doc = f.read()
    section = doc.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.mark.parametrize("per_position", [True, False])
def test_readme_own_reward_loop_runs(tmp_path, monkeypatch, capsys, per_position):
    """The README's example of a user's own loop on RewardDataset runs as written, where its paths (the
    main job's base generator and reward data) hold a tiny generator checkpoint (today's layout) and a
    tiny reward dataset."""
    import numpy as np
    import torch
    from core.checkpoint import make_checkpoint
    from core.common import atomic_torch_save
    from helpers import write_reward_split
    from model import GPT, GPTConfig
    from tokenization_manager import TokenizationInfo
    V, N = 16, 24
    info = TokenizationInfo("char", V, str(tmp_path / "meta.pkl"))
    torch.manual_seed(0)
    gen = GPT(GPTConfig(block_size=N, vocab_size=V, n_layer=1, n_head=2, n_embd=16))
    run = tmp_path / "runs" / "shakespeare_char_default"  # the main job's layout
    (run / "cycle_0" / "base").mkdir(parents=True)
    atomic_torch_save(make_checkpoint(gen, None, iter_num=0, tokenization=info.to_dict()),
                      str(run / "cycle_0" / "base" / "ckpt.pt"))
    rng = np.random.default_rng(0)
    for split, n in (("train", 96), ("val", 32)):
        k = rng.integers(1, N, size=n)  # crossover K in [1, N-1]; the generated part is token 15
        x = rng.integers(0, 8, size=(n, N))
        x[np.arange(N)[None, :] >= k[:, None]] = 15
        write_reward_split(str(run / "cycle_1" / "reward_data"), split, x, np.stack([k / N, (N - k) / N], 1), info)
    code = readme_block("Your own training loop on the reward data")
    assert "PER_POSITION = True" in code
    monkeypatch.chdir(tmp_path)
    exec(compile(code.replace("PER_POSITION = True", f"PER_POSITION = {per_position}"), "README.md", "exec"), {})
    out = capsys.readouterr().out
    m = re.fullmatch(r"train loss (\S+), val MAE of P\(natural\) (\S+)\n", out)
    assert m and all(np.isfinite(float(v)) for v in m.groups()), out
