"""Each setting has one default: the step script's (lib/settings.py, lib/rl_settings.py; train.py's under its config
file). A preset that sets a step's flag to another value says why (presets.WHY_DIFFERS); the docs are generated from
the same parsers (docs/flags.md, tests/test_docs.py)."""
import argparse
import ast
import os

from experiment.cli import STEP_PARSERS, STEP_SCRIPTS, step_settings
from experiment.presets import PRESETS, WHY_DIFFERS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN_STEPS = ("base", "detector_trunk", "judge", "control", "base_continued")


def script_defaults(script, preset):
    """The settings a step of `preset` starts from before the preset's own: the script's defaults, under the
    preset's config file for train.py."""
    config = preset.get("base_config")
    return step_settings(script, ["--config", config] if script == "train.py" and config else [])


def differences():
    """{(step, flag): [preset, ...]} where a preset's step setting differs from the script's default."""
    out, cache = {}, {}
    for name, preset in PRESETS.items():
        for step, script in [*STEP_SCRIPTS.items(), ("base_continued", "train.py")]:
            given = preset.get(step)
            if not isinstance(given, dict):
                continue
            key = (script, preset.get("base_config") if script == "train.py" else None)
            defaults = cache.setdefault(key, script_defaults(script, preset))
            for flag, value in given.items():
                assert flag in defaults, f"preset {name}'s {step} sets {flag}, which {script} has no flag for"
                if str(value) != str(defaults[flag]):
                    out.setdefault((step, flag), []).append(name)
    return out


def test_every_preset_setting_that_differs_from_its_scripts_default_says_why():
    found = differences()
    assert ("grpo", "max_steps") in found  # the check sees a difference where there is one
    silent = sorted(k for k in found if k not in WHY_DIFFERS and k[1] not in WHY_DIFFERS)
    assert not silent, "say why in presets.WHY_DIFFERS (or drop the preset's value):\n" + "\n".join(
        f"{step} --{flag}: {', '.join(found[(step, flag)])}" for step, flag in silent)
    stale = sorted(k for k in WHY_DIFFERS if isinstance(k, tuple) and k not in found)
    assert not stale, f"WHY_DIFFERS explains differences no preset has: {stale}"


def test_grpo_learning_rate_and_beta_have_one_default_each():
    """Presets, train_grpo.py and TRL's arm read the same two constants; the loss takes β from its caller."""
    from core.objectives import grpo_loss
    from lib.rl_settings import GRPO_BETA, GRPO_LEARNING_RATE
    g = step_settings("train_grpo.py", [])
    assert (g["learning_rate"], g["beta"]) == (GRPO_LEARNING_RATE, GRPO_BETA)
    assert grpo_loss.__defaults__ == (None,)  # mask only: no second default of clip_eps or β
    for name, preset in PRESETS.items():
        lr = (preset.get("grpo") or {}).get("learning_rate")
        assert lr is None or lr != GRPO_LEARNING_RATE, f"preset {name} repeats the GRPO default learning rate"
    with open(os.path.join(ROOT, "examples", "trl_grpo.py"), encoding="utf-8") as f:
        src = f.read()
    defaults = {kw.value.id for node in ast.walk(ast.parse(src)) if isinstance(node, ast.Call)
                for kw in node.keywords if kw.arg == "default" and isinstance(kw.value, ast.Name)}
    assert {"GRPO_LEARNING_RATE", "GRPO_BETA"} <= defaults


def help_entries(text):
    """{flag line: its continuation lines} of a --help text's option entries."""
    entries, current = {}, None
    for line in text.splitlines():
        if line.startswith("  -"):
            current = entries.setdefault(line, [])
        elif line.startswith(" " * 8) and current is not None:
            current.append(line)
        else:
            current = None
    return entries


def test_help_gives_each_flag_one_line_and_docs_flags_md_the_whole_text():
    """--help of the step scripts and run_cycles: each flag on one line (its help's first clause and default, at
    160 columns); docs/flags.md keeps every help text in full (it is written from the same parsers)."""
    from core.cli import OneLineHelp, first_clause
    from helpers import run_script
    assert first_clause("p_natural: the detector's P(natural) of the sequence (mean over positions); logit: x") \
        == "p_natural: the detector's P(natural) of the sequence"
    assert first_clause("random seed; each step's prompts") == "random seed"
    assert first_clause("let a completion (--a, --b) keep its reward; by default") == "let a completion keep its reward"
    plain = STEP_PARSERS["train_grpo.py"]()  # the check itself: argparse's own formatter gives paragraphs
    plain.formatter_class = lambda prog: argparse.HelpFormatter(prog, width=160)
    assert any(len(more) > 1 for more in help_entries(plain.format_help()).values())
    texts = {}
    for script, build in STEP_PARSERS.items():
        parser = build()
        parser.formatter_class = lambda prog: OneLineHelp(prog, width=160)
        texts[script] = parser.format_help()
    env = {**os.environ, "COLUMNS": "160"}
    r = run_script(["run_cycles.py", "--help"], cwd=ROOT, env=env)
    assert r.returncode == 0, r.stderr
    texts["run_cycles.py"] = r.stdout
    grpo = {f.split()[0]: f for f in help_entries(texts["train_grpo.py"])}
    assert grpo["--ptx_coef"].endswith("(default: 0.0)")  # a zero default is shown (0.0 == False in Python)
    assert "default" not in grpo["--shuffle_rewards"]  # a switch's False is not
    for script, text in texts.items():
        entries = help_entries(text)
        assert len(entries) > 20, script
        # a long flag name puts its help on the next line: then that one line, else none
        over = [f for f, more in entries.items() if len(more) > 1 or (more and len(f.split("  ")) > 2)]
        assert not over, f"{script}: flags whose --help is over one line: {over}"
        assert "docs/flags.md" in text, script
    with open(os.path.join(ROOT, "docs", "flags.md"), encoding="utf-8") as f:
        flags_md = f.read()
    assert "instead of the k3 penalty in the loss (which is then off)" in flags_md  # a detail --help leaves out
