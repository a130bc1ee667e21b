"""docs/flags.md is generated from the scripts' --help by docs/gen_flags.py; fail when it is stale.
The README's test command is the one CI runs; its links resolve."""
import os
import subprocess
import sys

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
