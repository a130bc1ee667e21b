"""
run_cycles.py's --extra_<step> words (and its --base_config), read by the step script's own parser
before any step runs, so a misspelt flag or a bad value in --extra_grpo fails in seconds instead of
after the base model has trained. One child process (torch imported once) runs each script's `main`
with its words and stops it inside argparse: flags, types and choices are checked, nothing after
parsing runs. The flags the step itself adds (paths, seeds) are not there, so none is required here.
The same child hands back what the parser read (parse_settings): a step's settings as its script sees
them, its defaults included, which run_cycles takes instead of reading them back from the script's summary.
"""
import argparse
import json
import os
import runpy
import subprocess
import sys

from configurator import check_flags, read_config_tree
from core.errors import ProjectError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEP_SCRIPTS = {"base": "train.py", "detector_trunk": "train.py", "judge": "train.py", "control": "train.py",
                "reward_data": "prepare_reward_data.py", "reward_model": "train_reward_model.py",
                "grpo": "train_grpo.py", "null": "train_grpo.py", "spin": "train_spin.py", "ddo": "train_spin.py"}
MARK = "@@extra-args@@"
# the child: the repository's modules first (in place of the caller's directory), from wherever it runs
CHILD = (f"import json, sys; sys.path[0] = {ROOT!r}; "
         "from experiment.extra_args import child; child(json.loads(sys.argv[1]))")


def check_extra_args(args, skip=()):
    """Refuse the --extra_<step> words (args.extra_<step>) that their step's script would refuse, and a
    --base_config train.py would refuse (missing or not Python: read here; an unknown setting, a wrong
    type: by train.py's parser in the child), all of them in one error;
    `skip`: the steps that do not run (their words are only warned about)."""
    todo = [(f"--extra_{step}='{getattr(args, f'extra_{step}')}'", script, getattr(args, f"extra_{step}").split())
            for step, script in STEP_SCRIPTS.items() if step not in skip and getattr(args, f"extra_{step}").strip()]
    refused, unreadable = [], []
    if args.base_config:
        label = f"--base_config {args.base_config}"
        try:  # missing, a directory, not text, a syntax error: found here, without the child's 2 s
            read_config_tree(args.base_config)
            todo.append((label, "train.py", ["--config", args.base_config]))
        except ProjectError as e:
            unreadable.append((label, "train.py", (e.message, e.suggestion)))
    if todo:
        out = run_child(todo)
        if isinstance(out, str):  # the check itself broke: say so, and let the steps find what it could not
            print(f"warning: --extra_* and --base_config were not checked before the steps ({out})", file=sys.stderr)
        else:
            refused += [(label, script, said) for (label, script, _), (said, _) in zip(todo, out) if said]
    refused += unreadable  # in the order of the flags' table: --base_config last
    if refused:  # the script's own suggestion where it has one, else its --help
        fixes = dict.fromkeys(fix or f"see python {script} --help" for _, script, (_, fix) in refused)
        raise ProjectError("; ".join(f"{label}: {why}" for label, _, (why, _) in refused), "; ".join(fixes))


def parse_settings(todo):
    """[(script, words)] -> [the settings each script's parser reads from its words: {flag: value}, its
    defaults included]; a ProjectError if a script refuses its words or the child fails."""
    out = run_child([(" ".join(words), script, words) for script, words in todo])
    if isinstance(out, str):
        raise ProjectError(f"the steps' settings could not be read by their scripts' parsers ({out})",
                           "check that python can run the scripts here (python train_grpo.py --help)")
    for (script, words), (said, _) in zip(todo, out):
        if said:
            raise ProjectError(f"{script} {' '.join(words)}: {said[0]}", said[1] or f"see python {script} --help")
    return [settings for _, settings in out]


def run_child(todo):
    """The child on [(label, script, words)]: [(None or (what the parser said, its suggestion), the settings it
    read)], or, where the child itself broke, the end of its output (a string)."""
    r = subprocess.run([sys.executable, "-c", CHILD, json.dumps(todo)],
                       capture_output=True, text=True)  # in the caller's directory, as the steps run
    line = next((ln for ln in reversed(r.stdout.splitlines()) if ln.startswith(MARK)), None)
    if line is None:
        return (r.stderr.strip() or "no output")[-300:]
    return [(said and tuple(said), settings) for said, settings in json.loads(line[len(MARK):])]


class Parsed(BaseException):
    """Raised inside the script's argparse (a BaseException: no `except Exception` of the script catches it),
    with what it read."""

    def __init__(self, problem=None, settings=None):
        super().__init__(problem)
        self.problem, self.settings = problem, settings


def _parse_only(parser, args=None, namespace=None):
    args = sys.argv[1:] if args is None else list(args)
    check_flags(parser, args)  # an unknown flag by its name, with the closest known ones
    for action in parser._actions:
        action.required = False  # the step adds those itself
    parsed, rest = parser.parse_known_args(args, namespace)
    raise Parsed(f"unrecognized arguments: {' '.join(rest)}" if rest else None, vars(parsed))


def _error(parser, message):
    raise Parsed(message)


def child(todo):
    """[(label, script, words)] -> [(None, or (what the script's parser said of them, its suggestion or None);
    the settings it read, or None)] on stdout after MARK."""
    argparse.ArgumentParser.parse_args = _parse_only
    argparse.ArgumentParser.error = _error
    out = []
    for _, script, words in todo:
        path = os.path.join(ROOT, script)
        sys.argv = [path] + words
        settings = None
        try:
            runpy.run_path(path, run_name="extra_args")["main"]()
            said = (f"{script} did not parse its arguments first", None)  # never reached by the step scripts
        except Parsed as p:
            said, settings = p.problem and (p.problem, None), p.settings
        except ProjectError as e:
            said = (e.message, e.suggestion)
        except SystemExit:
            said = (f"{script} exited while reading them", "--help is not for a step")
        out.append((said, settings))
    print(MARK + json.dumps(out, default=str), flush=True)
