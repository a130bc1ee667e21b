"""
run_cycles.py's command line: its flags (run_cycles_parser, one function a group), and its --extra_<step> words
(and its --base_config), read by the step script's own parser, in this process, before any step runs: a misspelt
flag or a bad value in --extra_grpo fails in seconds instead of after the base model has trained. The parsers are
the scripts' own definitions (lib/settings.py, lib/rl_settings.py, RewardDataConfig.build_parser), built to raise
instead of exit; the flags a step adds itself (paths, seeds) are not there, so none is required here.
step_settings also hands back what the parser read: a step's settings as its script sees them, its defaults
included, which run_cycles takes instead of reading them back from a summary.
"""
import argparse
import contextlib
import io

from configurator import check_flags, parse_args_with_config
from core.cli import EPILOG, OneLineHelp
from core.devices import DTYPES
from core.errors import ProjectError
from core.tracking import add_tracking_args
from experiment.presets import DETECTORS, PRESETS, STEPS, TEMPS
from lib.rl_settings import grpo_parser, spin_parser
from lib.settings import reward_model_parser, train_parser
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


# ---------------------------------------------------------------- run_cycles.py's flags

def run_cycles_parser():
    """run_cycles.py's parser: every flag, one default each (the preset's where None)."""
    ap = argparse.ArgumentParser(
        prog="run_cycles.py",
        description="Run the generator / detector / GRPO cycle end to end, resumably, against a plain-MLE "
                    "control arm.",
        formatter_class=OneLineHelp, epilog=EPILOG)
    add_run_flags(ap)
    add_detector_flags(ap)
    add_arm_flags(ap)
    add_ratio_flags(ap)
    add_measurement_flags(ap)
    add_step_words(ap)
    add_tracking_args(ap)  # run_cycles passes them on: tb/<cycle>_<step> per step, one W&B group per run
    return ap


def add_run_flags(ap):
    """run_cycles.py's flags of the run's own flags: the preset, its files, seeds, device and processes."""
    ap.add_argument("--preset", choices=sorted(PRESETS), default="default",
                    help="the settings every step runs at: 'default' (nanoGPT's CPU model), 'quick' (a few "
                         "minutes), 'demo' "
                         "(a generator stopped at 500 iterations against a detector on the fully trained model's "
                         "trunk), 'gpu' (one GPU: nanoGPT's 6x6x384 GPU recipe, 3 cycles, the SIR and ideal-detector "
                         "arms; its detector trunk 0.078 nats/token past the base on tiny Shakespeare: give it "
                         "--data_dir data/shakespeare_plays), 'gpu_gap' (gpu with the base stopped at 300 iterations, "
                         "the trunk's advantage near the demo's 0.4) or "
                         "'gpt2' (one GPU: GPT-2 from --base_ckpt, a detector on --detector_trunk_ckpt's "
                         "trunk, BPE Shakespeare; both flags required), or 'data_limit' (the CPU model on the first "
                         "--data_chars characters, MLE tuned to its dev minimum as base, trunk and control; "
                         "docs/results.md)")
    ap.add_argument("--smoke", action="store_true",
                    help="the preset's steps and flags at tiny sizes (experiment/presets.py SMOKE: a 1 x 32 model, "
                         "a few iterations, steps and blocks): a check that every step of a preset runs, e.g. a GPU "
                         "preset on a CPU; its figures mean nothing")
    ap.add_argument("--out_dir", default=None,
                    help="run directory (default: runs/shakespeare_char_<preset>, runs/shakespeare_gpt2 for gpt2)")
    ap.add_argument("--data_dir", default=None,
                    help="prepared corpus (train.bin, val.bin, meta.pkl for char; default: the repository's "
                         "data/shakespeare_char, data/shakespeare (BPE) for the gpt2 preset, from any directory); the "
                         "built-in Shakespeare directories are prepared automatically when missing. Every step runs "
                         "in the directory run_cycles.py is started in, so relative paths mean the same to all")
    ap.add_argument("--base_ckpt", default=None,
                    help="start from this generator checkpoint (a .pt file, or a local Hugging Face GPT-2 "
                         "directory with a BPE --data_dir) instead of training cycle 0")
    ap.add_argument("--base_data_unknown", action="store_true",
                    help="consent to start from a --base_ckpt that records no train/val split (a Hugging Face "
                         "directory, a nanoGPT checkpoint): its training data is unknown and may include this val "
                         "text, so held-out measures are not guaranteed held out; summary.md says so")
    ap.add_argument("--base_config", default=None,
                    help="train.py config file for cycle 0, checked by train.py's parser before any step (default: the "
                         "preset's, in the repository's config/)")
    ap.add_argument("--max_cycles", type=int, default=None,
                    help="number of cycles after cycle 0 (default: the preset's)")
    ap.add_argument("--patience", type=int, default=2,
                    help="stop when the adversarial arm's val perplexity has not improved by --min_delta "
                         "for this many cycles")
    ap.add_argument("--min_delta", type=float, default=0.0,
                    help="smallest val-perplexity decrease that counts as an improvement")
    ap.add_argument("--seed", type=int, default=1337,
                    help="base seed; each cycle and step derives its own, and the evaluation samples use it")
    ap.add_argument("--seeds", type=int, default=1,
                    help="replicates of the cycles (both arms, from the same cycle-0 generator), each with its own "
                         "step seeds; measures are reported as mean +- standard error over them and the verdicts "
                         "use that noise. Replicate r > 0 lands in OUT/seed_r and skips the fresh detectors of "
                         "the control arm and the final stage (replicate 0 measures detectability)")
    ap.add_argument("--archive", default=None, metavar="DIR",
                    help="keep each finished seed in DIR without its checkpoints (about 1 MB a seed, for git); "
                         "a run whose --out_dir was lost resumes from DIR at its first unfinished seed")
    ap.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps (passed to every step)")
    ap.add_argument("--dtype", default="auto", choices=DTYPES,
                    help="precision, passed to every step and used by run_cycles' own measurements: autocast "
                         "('auto': bfloat16 on CUDA if supported, else float16; float32 elsewhere)")
    ap.add_argument("--eval_batch_size", type=int, default=None,
                    help="batch size of the val perplexity evaluation (default: 64; 16 for the gpt2 preset)")
    ap.add_argument("--nproc_per_node", type=int, default=1,
                    help="run the heavy steps under torchrun with this many processes (1: plain python); "
                         "results do not depend on it, except in cycle 0: train.py's --batch_size counts per "
                         "process and its --gradient_accumulation_steps must be divisible by it (set both with "
                         "--extra_base, e.g. '--gradient_accumulation_steps 2 --batch_size 6' for 2 processes, and "
                         "the same with --extra_detector_trunk and --extra_judge)")
    ap.add_argument("--parallel_cycle0", action=argparse.BooleanOptionalAction, default=None,
                    help="train cycle 0's base, detector trunk and judge at once, three processes sharing the device "
                         "(they are independent; a small model leaves a GPU idle between its kernels; under "
                         "--data_chars a grid's points, and a seed past 0's grid points and ensemble members), or in turn "
                         "(--no-parallel_cycle0). Default: the preset's choice, at once only for gpu (on CPU they "
                         "would split the cores). In turn under --nproc_per_node > 1")
    ap.add_argument("--parallel_arms", action=argparse.BooleanOptionalAction, default=None,
                    help="run a cycle's independent steps at once, processes sharing the device (one torch thread "
                         "each on a CPU): the GRPO steps (adversarial, null, logit, ptx, ratio), then those on "
                         "GRPO's budget (the control, SPIN, DDO); or in turn (--no-parallel_arms). The same results "
                         "either way at one thread each. Default: the preset's. In turn under --nproc_per_node > 1")
    ap.add_argument("--max_at_once", type=int, default=None,
                    help="the most steps --parallel_cycle0 and --parallel_arms run at once, the next in their order "
                         "starting as one ends (e.g. 2 on a 2-core machine, one per core); default: all of them")


def add_detector_flags(ap):
    """run_cycles.py's flags of the detector and the judge, and the data-limited test's D."""
    g = ap.add_argument_group("detector")
    g.add_argument("--detector", choices=["preset"] + sorted(DETECTORS), default="preset",
                   help="detector recipe of every reward model: the preset's (every preset's is 'ratio_features'); "
                        "'per_position' (whole trunk trained, every position labelled); 'strong_trunk' (per-position "
                        "head with LM features "
                        "on the frozen trunk of a stronger LM of the same data); 'ratio_features' (strong_trunk's, "
                        "plus the generator's own surprisal and the trunk's log-ratio to it: the ideal detector's "
                        "statistic, --gen_features); 'frozen_last_token' (the design's frozen trunk and last-token "
                        "head, which stays at chance)")
    g.add_argument("--detector_trunk_ckpt", default=None,
                   help="generator checkpoint of the same data and tokenizer whose trunk the 'strong_trunk' and "
                        "'ratio_features' detectors use (default: the one cycle 0 trains with the preset's "
                        "detector_trunk settings)")
    g.add_argument("--judge_ckpt", default=None,
                   help="generator checkpoint of the same data and tokenizer that judges sample quality (the "
                        "frontier's quality axis: the mean NLL of each generator's samples under it); it must be "
                        "independent of every arm: no arm trains on, starts from or is rewarded by it (default: "
                        "the one cycle 0 trains with the preset's judge settings, from another seed)")
    g.add_argument("--judge_holdout", type=float, default=0.0,
                   help="the judge's own text, a fraction of the train split: train it on the last FRACTION of the "
                        "train split, which no arm, "
                        "control or detector then sees (they all train on the first 1 - FRACTION: OUT/data/arms, the "
                        "judge on OUT/data/judge; the val split is the same). 0: the twin judge, the trunk's recipe "
                        "from another seed on the same text as every arm")
    g.add_argument("--data_chars", type=int, default=None,
                   help="the data-limited test's D, in characters (--preset data_limit; its default 50000): every "
                        "arm, control and "
                        "detector sees only the first DATA_CHARS tokens (characters) of the train split, its last "
                        "tenth the dev slice every stop and choice is made on (OUT/data/limit); the val split is read "
                        "by the verdict alone; the judge trains on the train split past the preset's judge_after "
                        "(OUT/data/judge)")
    g.add_argument("--replay", action="store_true",
                   help="the reward model GRPO trains against in cycle n >= 2 also learns the train samples of the "
                        "earlier cycles' generators (the final stage's and the control's detectors do not: they "
                        "measure detectability the same way for both arms)")


def add_arm_flags(ap):
    """run_cycles.py's flags of the control arm and the self-play arms."""
    g = ap.add_argument_group("control arm")
    g.add_argument("--compute_control", action="store_true",
                   help="a third MLE control, compute-matched: the base recipe trained from scratch for as many "
                        "FLOPs as the adversarial arm spent in all (its schedule stretched to match), after each "
                        "replicate's cycles, every arm judged against it too; needed before a run may say an arm "
                        "lies beyond the longer-trained control (the trunk has a fraction of the arm's FLOPs)")
    g.add_argument("--no_control", action="store_true",
                   help="skip the plain-MLE control arm (and its detectors)")
    g.add_argument("--no_control_detector", action="store_true",
                   help="skip the fresh detectors of the control arm's generators (each costs a reward "
                        "dataset and a reward model)")
    g.add_argument("--no_final_detector", action="store_true",
                   help="skip the final stage's fresh detectors: fresh detectors of each arm's last generator")
    g.add_argument("--no_null_arm", action="store_true",
                   help="skip the null arm: GRPO with the adversarial arm's settings and detector but its rewards "
                        "shuffled within each group (train_grpo.py --shuffle_rewards), which shows what any GRPO "
                        "run of that size does to the model without the detector's signal")
    g.add_argument("--spin_beta", type=float, default=0.1, help="the SPIN arm's DPO beta (train_spin.py --beta)")
    g.add_argument("--spin_learning_rate", type=float, default=None,
                   help="the SPIN arm's learning rate (default: the learning rate of the cycle's GRPO step)")
    g.add_argument("--spin_nll_coef", type=float, default=1.0,
                   help="the SPIN arm's likelihood anchor (train_spin.py --nll_coef): weight of the natural "
                        "continuations' NLL beside the DPO loss (0 = plain SPIN, which can push the natural "
                        "text's likelihood down as well)")
    g.add_argument("--ddo_alpha", type=float, default=1.0,
                   help="the DDO arm's weight of the sample term (train_spin.py --ddo_alpha; 1: the paper's "
                        "objective, whose optimum is the data distribution)")
    g.add_argument("--ddo_beta", type=float, default=1.0,
                   help="the DDO arm's scale of its log-likelihood-ratio logit (train_spin.py --ddo_beta; 1: the "
                        "paper's objective; below 1 it aims past the data)")
    g.add_argument("--ddo_rounds", type=int, default=3,
                   help="the DDO arm's self-play rounds per cycle (train_spin.py --rounds, at most the cycle's GRPO "
                        "steps): each round's reference is the arm's policy at its start, with fresh samples")
    g.add_argument("--ddo_learning_rate", type=float, default=None,
                   help="the DDO arm's learning rate (default: the learning rate of the cycle's GRPO step)")


def add_ratio_flags(ap):
    """run_cycles.py's flags of the density-ratio arms."""
    g = ap.add_argument_group("the detector as a density ratio (docs/design.md section 3)")
    g.add_argument("--arms", default=None,
                   help="comma-separated arms beside the adversarial one, each judged on the frontier against both "
                        "controls: 'sir' (the ceiling: of --sir_n T = 1 samples of the cycle's entering generator, "
                        "one kept with probability proportional to exp(s), s the detector's log-ratio; its "
                        "coverage is the residual model P_gen exp(s) / Z on the val windows, the lower estimate), "
                        "'logit' (GRPO with the detector's log-ratio as the reward, the KL to the entering "
                        "generator inside it with --logit_beta, mean baseline), 'ptx' (the adversarial GRPO plus "
                        "--ptx_coef times MLE on natural text), 'spin' (SPIN with a likelihood anchor, its own "
                        "chain), 'ddo' (Direct Discriminative Optimization: the model's own "
                        "log-likelihood ratio to the previous round's model as a GAN discriminator's logit, no "
                        "detector, its own chain on GRPO's budget in --ddo_rounds self-play rounds; fresh detectors "
                        "measure it like the control), 'ratio' (the ideal detector: GRPO with the detector trunk's "
                        "own log-ratio to the entering generator as the reward, KL in it at beta 1, mean baseline: "
                        "the most any detector on that trunk can give, no detector trained; needs a trunk), "
                        "'unfrozen' (the adversarial GRPO against a second detector, the per_position recipe: the "
                        "generator's whole trunk trained on the cycle's reward data), 'heldout' (--preset "
                        "data_limit: GRPO from MLE on (1 - h) of the D characters, against a detector whose natural "
                        "text is the other h), 'more_data' and 'ensemble_kd' "
                        "(--preset data_limit's positive controls: MLE on twice the data; an ensemble's student). sir, "
                        "logit, ptx and ratio start in every cycle from the generator that made the detector's "
                        "negatives; sir, logit and ptx also measure the detector's information (the residual "
                        "model's gain, nats per val token, with bounds over n). "
                        "Default: the preset's (sir for gpu, ddo,heldout,more_data,ensemble_kd for data_limit, none "
                        "for the others); --arms '' for none")
    g.add_argument("--arm", action="append", default=[], metavar="NAME=TEMPLATE",
                   help="your own method as an arm (repeatable): a command template run_cycles fills in each cycle "
                        "and runs as a step, judged like every arm against both controls. It gets the same-budget "
                        "control's budget: {generator} (required: the arm's entering generator), {out_dir} (required: "
                        "where it writes ckpt.pt in this project's or nanoGPT's format, or a Hugging Face directory, "
                        "and optionally flops.json {\"flops\": N}, else its FLOPs are unknown), {data_dir}, {seed}, "
                        "{updates}, {tokens}, {batch_size}, {block_size}, {learning_rate}, {device}, {detector} (the "
                        "cycle's detector checkpoint), {resume} (--resume where {out_dir} holds an interrupted try). "
                        "docs/usage.md#your-own-method")
    g.add_argument("--arm_timeout", type=float, default=3600.0,
                   help="seconds each --arm command may run in a cycle before it is stopped (the run then stops "
                        "with an error; the same command resumes)")
    g.add_argument("--sir_n", type=int, default=8,
                   help="generator continuations per prompt for the SIR arm and per val window for the residual "
                        "model's normaliser Z (its gain is reported for n = 1, 2, 4, ... up to this)")
    g.add_argument("--logit_beta", type=float, default=1.0,
                   help="the logit arm's KL coefficient inside the reward (1: the optimum pi_ref exp(r) is the "
                        "data distribution when r is the exact log-ratio)")
    g.add_argument("--logit_learning_rate", type=float, default=None,
                   help="the logit arm's learning rate (default: the preset's GRPO learning rate)")
    g.add_argument("--ptx_coef", type=float, default=1.0,
                   help="the ptx arm's weight of the MLE term (train_grpo.py --ptx_coef; its natural windows "
                        "per step: --prompts_per_step)")
    g.add_argument("--control_learning_rate", type=float, default=None,
                   help="constant learning rate of the control arm's MLE (default: the preset's, else the "
                        "learning rate the cycle's GRPO step used)")


def add_measurement_flags(ap):
    """run_cycles.py's flags of the measurements."""
    g = ap.add_argument_group("measurements")
    g.add_argument("--quality_samples", type=int, default=None,
                   help="samples per generator for real-word rate, distinct-2 and degenerate share "
                        "(default: the preset's)")
    g.add_argument("--detect_blocks", type=int, default=None,
                   help="natural and generated blocks each for a detector's AUROC (default: the preset's)")
    g.add_argument("--sample_len", type=int, default=None,
                   help="tokens per quality sample (1 natural prompt token + generated; default: the "
                        "cycle-0 generator's block_size; 256 for the gpt2 preset)")
    g.add_argument("--temps", default=None,
                   help=f"sampling temperatures of every generator's frontier (comma-separated, must include 1.0; "
                        f"default: {TEMPS}, and {PRESETS['quick']['temps']} for the quick preset, a smoke run): "
                        "judge NLL of the samples (quality) and val NLL at T (coverage), with real-word rate, "
                        "distinct-2 and degenerate share as descriptive columns, the same prompts and noise for "
                        "every generator; the verdicts compare the arms with the controls' curves on it")
    g.add_argument("--mauve_features", default=None,
                   help="a local Hugging Face GPT-2 directory (e.g. gpt2-large, saved beforehand): MAUVE between "
                        "each generator's T = 1 samples (--quality_samples of them) and the natural val windows, "
                        "with this model's features, beside the frontier measures; needs pip install mauve-text "
                        "(checked before any step; docs/design.md)")
    g.add_argument("--progress_interval", type=float, default=30.0,
                   help="when stdout is not a terminal: seconds between two snapshots of a step's progress bar")
    g.add_argument("--cold_steps", action="store_true",
                   help="start every step as a fresh Python process. Default on Linux with the CPU as the device: a "
                        "step that runs in one process is forked from a launcher that has imported torch once "
                        "(experiment/launcher.py), the same results seconds sooner a step; torchrun steps, --arm "
                        "commands and a GPU run's steps always start fresh")


def add_step_words(ap):
    """run_cycles.py's flags of each step's --extra_<step> words."""
    for step in STEPS:
        what = {"control": "the control arm's train.py", "spin": "the SPIN arm's train_spin.py",
                "ddo": "the DDO arm's train_spin.py", "null": "the null arm's train_grpo.py (after --extra_grpo)"}.get(
            step, f"the {step} step's")
        ap.add_argument(f"--extra_{step}", default="",
                        help=f"extra words for {what} command line; appended to it, read by its parser before "
                             f"any step runs (one quoted string; use the = form because it starts with --, "
                             f"e.g. --extra_{step}='--seed 3'; default: none)")
