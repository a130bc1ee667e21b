"""
run_cycles.py's --extra_<step> words (and its --base_config), read by the step script's own parser, in this
process, before any step runs: a misspelt flag or a bad value in --extra_grpo fails in seconds instead of after
the base model has trained. The parsers are the scripts' own definitions (lib/settings.py,
RewardDataConfig.build_parser), built to raise instead of exit; the flags a step adds itself (paths, seeds) are
not there, so none is required here. step_settings also hands back what the parser read: a step's settings as its
script sees them, its defaults included, which run_cycles takes instead of reading them back from a summary.
"""
import argparse
import contextlib
import io

from configurator import check_flags, parse_args_with_config
from core.errors import ProjectError
from lib.settings import grpo_parser, reward_model_parser, spin_parser, train_parser
from reward_data_config import RewardDataConfig

STEP_SCRIPTS = {"base": "train.py", "detector_trunk": "train.py", "judge": "train.py", "control": "train.py",
                "reward_data": "prepare_reward_data.py", "reward_model": "train_reward_model.py",
                "grpo": "train_grpo.py", "null": "train_grpo.py", "spin": "train_spin.py", "ddo": "train_spin.py"}
STEP_PARSERS = {"train.py": train_parser, "train_reward_model.py": reward_model_parser, "train_grpo.py": grpo_parser,
                "train_spin.py": spin_parser, "prepare_reward_data.py": RewardDataConfig.build_parser}


class StrictParser(argparse.ArgumentParser):
    """A step's parser that raises (a ProjectError) where the script's would print and exit."""

    def error(self, message):
        raise ProjectError(message)


def step_settings(script, words):
    """The settings the step script `script` reads from `words`, its defaults included, read as the script reads
    them (train.py's config files too): an unknown flag, a bad type or choice is a ProjectError with the script's
    fix where it has one. Nothing after the parse runs."""
    if "-h" in words or "--help" in words:
        raise ProjectError(f"{script} would print its help and exit", "--help is not for a step")
    parser = STEP_PARSERS[script](StrictParser)
    for action in parser._actions:
        action.required = False  # the step adds those itself
    with contextlib.redirect_stderr(io.StringIO()):  # a config file's warnings are the step's to print, once
        if script == "train.py":
            return vars(parse_args_with_config(parser, words, free_choices=("init_from",)))
        check_flags(parser, words)  # an unknown flag by its name, with the closest known ones
        return vars(parser.parse_args(words))


def check_extra_args(args, skip=()):
    """Refuse the --extra_<step> words (args.extra_<step>) that their step's script would refuse, and a
    --base_config train.py would refuse (missing or not Python, an unknown setting, a wrong type), all of them
    in one error; `skip`: the steps that do not run (their words are only warned about)."""
    todo = [(f"--extra_{step}='{getattr(args, f'extra_{step}')}'", script, getattr(args, f"extra_{step}").split())
            for step, script in STEP_SCRIPTS.items() if step not in skip and getattr(args, f"extra_{step}").strip()]
    if args.base_config:
        todo.append((f"--base_config {args.base_config}", "train.py", ["--config", args.base_config]))
    refused = []
    for label, script, words in todo:
        try:
            step_settings(script, words)
        except ProjectError as e:
            refused.append((label, script, e))
    if refused:  # the script's own suggestion where it has one, else its --help
        fixes = dict.fromkeys(e.suggestion or f"see python {script} --help" for _, script, e in refused)
        raise ProjectError("; ".join(f"{label}: {e.message}" for label, _, e in refused), "; ".join(fixes))


def parse_settings(script, words):
    """The settings `script`'s parser reads from `words` (step_settings), a refusal naming the script and its
    words."""
    try:
        return step_settings(script, words)
    except ProjectError as e:
        raise ProjectError(f"{script} {' '.join(words)}: {e.message}", e.suggestion or f"see python {script} --help")
