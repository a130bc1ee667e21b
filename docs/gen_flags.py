"""
Generate docs/flags.md, the flag reference of every command-line script, from the scripts'
own argparse parsers. Never edit docs/flags.md by hand:

    python docs/gen_flags.py            # rewrite docs/flags.md
    python docs/gen_flags.py --check    # exit 1 if docs/flags.md is stale (tests/test_docs.py)

Each script runs as `python SCRIPT [SUBCOMMAND] --help` (all of them, one after another, in one child
process, so torch is imported once), with argparse's print_help patched to write the parser's flags, defaults and help texts as JSON instead of
the terminal-formatted text. The page therefore does not depend on the terminal width, and
nothing after argument parsing runs (--help exits there).
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "docs", "flags.md")
SCRIPTS = ["prepare_data.py", "train.py", "sample.py", "evaluate.py", "prepare_reward_data.py",
           "reward_dataset_loader.py", "train_reward_model.py", "train_grpo.py", "train_spin.py", "measure_residual.py", "run_cycles.py", "aa_test.py",
           "compare.py",
           "export_hf.py", "serve_reward.py", "train_distill.py", "human_eval.py make", "human_eval.py score"]  # a subcommand: "SCRIPT SUB"

# Runs in the child: capture the parser whose help is printed, as JSON on stdout.
CHILD = r"""
import argparse, json, runpy, sys
MARK = "@@FLAGS@@"

def dump(parser, file=None):
    rows = []
    for a in parser._actions:
        if a.help == argparse.SUPPRESS or isinstance(a, argparse._HelpAction):
            continue
        params = {k: v for k, v in vars(a).items() if v is not argparse.SUPPRESS}
        params["prog"] = parser.prog
        for k in ("choices",):
            if params.get(k) is not None:
                params[k] = ", ".join(map(str, params[k]))
        text = (a.help or "")
        try:
            text = text % params
        except (KeyError, TypeError, ValueError):
            pass
        rows.append({"options": list(a.option_strings), "dest": a.dest, "metavar": a.metavar,
                     "choices": [str(c) for c in a.choices] if a.choices is not None else None,
                     "required": bool(a.required) if a.option_strings else None,
                     "nargs": a.nargs if isinstance(a.nargs, (int, str, type(None))) else str(a.nargs),
                     "const": repr(a.const) if a.const is not None else None,
                     "default": None if a.default is argparse.SUPPRESS else repr(a.default),
                     "kind": type(a).__name__, "help": text})
    sys.stdout.write(MARK + json.dumps({"description": parser.description or "", "rows": rows}) + MARK)
    sys.stdout.flush()

argparse.ArgumentParser.print_help = dump
sys.path.insert(0, ".")
for entry in sys.argv[1:]:
    sys.stdout.write("@@SCRIPT@@" + entry + "@@")
    sys.argv = entry.split() + ["--help"]
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit:  # --help exits after printing
        pass
"""


def capture(scripts):
    """{script: its parser as a dict (description, rows)} from `python SCRIPT --help`, all scripts
    run one after another in one child process (torch is imported once)."""
    env = dict(os.environ, COLUMNS="100", OMP_NUM_THREADS="1", PYTHONHASHSEED="0", PYTHONIOENCODING="utf-8")
    p = subprocess.run([sys.executable, "-c", CHILD, *scripts], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    results = {}
    for chunk in p.stdout.split("@@SCRIPT@@")[1:]:
        script = chunk.split("@@", 1)[0]
        parts = chunk.split("@@FLAGS@@")
        if len(parts) >= 3:
            results[script] = json.loads(parts[1])
    missing = [s for s in scripts if s not in results]
    if missing:
        raise SystemExit(f"gen_flags: no argparse help captured from {', '.join(missing)} "
                         f"(exit {p.returncode}):\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    return results


SHARED_MIN = 3  # a flag with the same default and help in at least this many scripts is listed once, at the top


def cell(s):
    return " ".join(str(s).split())


def flag_cell(r):
    if not r["options"]:  # positional
        return f"`{r['metavar'] or r['dest']}` (positional)"
    name = ", ".join(f"`{o}`" for o in r["options"])
    if r["choices"]:
        name += " {" + ",".join(r["choices"]) + "}"
    elif isinstance(r["metavar"], str) and r["metavar"].startswith("{"):
        name += " " + r["metavar"]
    return name


def default_cell(r):
    if r["required"]:
        return "required"
    if r["kind"] in ("_StoreTrueAction", "_StoreFalseAction"):
        return "off" if r["kind"] == "_StoreTrueAction" else "on"
    d = r["default"]
    if d is None or d == "None":
        return "None"
    return f"`{d}`"


def line(r, scripts=None):
    """One flag as one list item: name {choices} (default) [the scripts that take it]: help."""
    return f"- {flag_cell(r)} ({cell(default_cell(r))})" + (f" [{', '.join(scripts)}]" if scripts else "") \
        + f": {cell(r['help'])}"


def shared_rows(results):
    """The flags whose line is the same in at least SHARED_MIN scripts, with the scripts that take them."""
    users = {}
    for script in SCRIPTS:
        for r in results[script]["rows"]:
            users.setdefault(line(r), (r, []))[1].append(script)
    return {text: (r, scripts) for text, (r, scripts) in users.items() if len(scripts) >= SHARED_MIN}


def render(results):
    shared = shared_rows(results)
    out = ["# Command-line flags",
           "",
           "<!-- GENERATED FILE: do not edit. Regenerate with `python docs/gen_flags.py`; -->",
           "<!-- tests/test_docs.py fails when this file is stale. -->",
           "",
           "Generated by `python docs/gen_flags.py` from each script's own argparse parser (what "
           "`python SCRIPT --help` prints): flag {choices} (default): help. Defaults are Python reprs; `off` is a "
           "switch that is off unless given. `data/*/prepare.py` take no flags.",
           "",
           f"## Shared flags (the same in {SHARED_MIN} or more scripts)"]
    out += [line(r, scripts) for r, scripts in shared.values()]
    out.append("")
    for script in SCRIPTS:
        res = results[script]
        out.append(f"## `{script}`" + (f": {cell(res['description'])}" if res["description"] else ""))
        own = [line(r) for r in res["rows"] if line(r) not in shared]
        common = list(dict.fromkeys((r["options"] or [r["dest"]])[0] for r in res["rows"] if line(r) in shared))
        out += own + ([f"- shared (above): {', '.join(f'`{o}`' for o in common)}"] if common else [])
        out.append("")
    return "\n".join(out)


def generate():
    return render(capture(SCRIPTS))


def main():
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--check", action="store_true", help="do not write; exit 1 if docs/flags.md is stale")
    ap.add_argument("--out", default=OUT, help="file to write (default: docs/flags.md)")
    args = ap.parse_args()
    text = generate()
    if args.check:
        current = open(args.out, encoding="utf-8").read() if os.path.exists(args.out) else ""
        if current != text:
            print(f"{args.out} is stale: run python docs/gen_flags.py", file=sys.stderr)
            sys.exit(1)
        print(f"{args.out} is up to date")
        return
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
