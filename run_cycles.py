"""
The whole adversarial process in one command, as a controlled experiment.

  cycle 0   train the base generator (train.py, early stopping) or take --base_ckpt
  cycle n   two arms start from the same cycle-0 generator:
            adversarial  1. reward dataset from its current generator   (prepare_reward_data.py)
                         2. a fresh reward model (detector) on it         (train_reward_model.py)
                         3. GRPO of the generator against that detector   (train_grpo.py)
            control      the control arm's own generator trained further by plain MLE
                         (train.py --init_from) for as many optimizer updates as this cycle's
                         GRPO made, on about as many tokens per update as GRPO generated per step
            every new generator: val perplexity and the quality of its samples
  final     a fresh detector of each arm's last generator (steps 1-2 only)

Detectability of every generator is measured by a fresh detector trained on its samples: for
the adversarial arm that is the reward model of the next cycle; the control arm gets its own
reward data and reward model with the same settings and seeds (cycle 1's is shared: both arms
enter it with the same generator). Every generator is evaluated by the same function on the
same val data, prompts and sampling noise (experiment/measures.py).

It stops after --max_cycles, or when the adversarial arm's val perplexity has not improved by
--min_delta for --patience cycles. Everything lands in --out_dir, one subdirectory per cycle;
every finished step leaves a `<step>.done.json`, so rerunning the same command resumes after
the last finished step (and an interrupted step resumes through that script's own resume option).

    python run_cycles.py                      # Shakespeare characters on 2 CPU cores (~26 min)
    python run_cycles.py --preset quick       # a few minutes, a much smaller setting
    python run_cycles.py --preset demo        # a weak cycle-0 generator a detector can catch (~30 min)

Outputs: OUT/summary.md, OUT/summary.json and OUT/summary.png: per cycle and arm the
generator's val perplexity, real-word rate, distinct bigrams and degenerate share, its fresh
detector's val MAE (against the constant 0.5 and the lexicon baseline) and AUROC, the GRPO
reward and KL, the detectors' learning curves, and one verdict line per measure.
"""
import argparse
import codecs
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field

from core.checkpoint import load_model, read_checkpoint, sequence_length
from core.common import (PEAK_MEMORY_PREFIX, EarlyStopping, ProjectError, atomic_write_text, check_writable_dir,
                         hold_dir_lock, peak_memory_text, read_jsonl, resolve_device, run_cli)
from core.corpus import Corpus
from core.hf_interop import hub_name_error
from core.tracking import add_tracking_args, open_tracker, resolve_tensorboard_dir
from experiment import flops, frontier, residual
from experiment.mauve_score import mauve_score, unavailable
from experiment.measures import (corpus_tokenizer, decode_rows, generated_blocks, judge_nll, measure_detector,
                                 natural_blocks, natural_reference, sample_stats, train_vocabulary, val_perplexity,
                                 val_tokens)
from experiment.report import (attach_detector, data_source, frontier_lines, frontier_report, generator_entry,
                               write_samples, write_summary)
from reward_dataset_loader import merge_train_splits

ROOT = os.path.dirname(os.path.abspath(__file__))

# The detector recipes --detector chooses from (the preset names its own). Their flags come after
# the preset's reward-model flags and before --extra_reward_model, so they win over the preset.
DETECTORS = {
    # the design's configuration: frozen generator trunk, MLP head on the last token's state.
    # It stays at chance: K <= N-1, so the last token is always generated text, and a generator's
    # frozen features cannot tell its own samples from natural text (README, issue 9).
    "frozen_last_token": ["--unfreeze_last_n_blocks", "0"],
    # every position scored (position t natural iff t < K), P(natural) = the mean; whole trunk trained
    "per_position": ["--per_position", "--unfreeze_last_n_blocks", "-1"],
    # per-position head on the frozen trunk of a STRONGER language model of the same data (the
    # detector trunk, trained in cycle 0 or given by --detector_trunk_ckpt), reading that model's
    # surprisal and entropy of every token: it knows what the generator does not
    "strong_trunk": ["--per_position", "--lm_features", "--unfreeze_last_n_blocks", "0"],
}
NEEDS_TRUNK = {"strong_trunk"}  # recipes that get --init_trunk_from <detector trunk>

# The control arm's settings, the same in every preset for now: whether it runs, whether its
# generators (and each arm's last one) get fresh detectors, extra train.py flags, and its
# learning rate (None: the learning rate of the cycle's GRPO step). --no_* flags turn them off.
CONTROL_ARM = dict(control_arm=True, control_detector=True, final_detector=True, control=[],
                   control_learning_rate=None, null_arm=True)
# GRPO runs a fixed budget in every preset (the arms compare at equal updates): no reward-based stops
FIXED_BUDGET = ["--patience", "0", "--reward_threshold", "0"]

# Settings per preset. Flags given on the command line override single entries
# (--base_config, --max_cycles, ...); `extra_*` flags append raw arguments per step.
PRESETS = {
    # nanoGPT's CPU model (4x128, block 64) as the generator; the detector reads the frozen trunk
    # of the same model trained twice as long (the strongest LM of this data that fits the ~25 minute
    # budget on 2 CPU cores); one cycle, then fresh detectors of both arms' generators
    "default": dict(
        base_config="config/train_shakespeare_char_cpu.py",
        base=[],
        detector_trunk=["--max_iters", "4000", "--lr_decay_iters", "4000"],
        # the independent judge of sample quality: the trunk's recipe from another seed
        judge=["--max_iters", "4000", "--lr_decay_iters", "4000"],
        max_cycles=1,
        detector="strong_trunk",
        reward_data=["--samples_per_chunk", "2", "--max_blocks_per_split", "2500",
                     "--gen_batch_size", "128"],
        reward_model=["--max_iters", "300", "--batch_size", "64", "--eval_interval", "50",
                      "--learning_rate", "1e-3", "--patience", "4"],
        grpo=["--max_steps", "60", "--prompts_per_step", "8", "--group_size", "8",
              "--learning_rate", "5e-5", "--eval_interval", "20", "--save_interval", "20",
              "--eval_max_batches", "20"] + FIXED_BUDGET,  # run_cycles scores the full val set itself
        **CONTROL_ARM,
        quality_samples=256,
        detect_blocks=256,
    ),
    # a few minutes: the tiny 2x64 model, its 3x-longer-trained copy as the detector trunk, one
    # cycle, small step counts (a smoke run of every step, not a measurement)
    "quick": dict(
        base_config="config/train_shakespeare_char_tiny.py",
        base=[],
        detector_trunk=["--max_iters", "1800", "--lr_decay_iters", "1800", "--eval_interval", "300"],
        judge=["--max_iters", "1800", "--lr_decay_iters", "1800", "--eval_interval", "300"],
        max_cycles=1,
        detector="strong_trunk",
        reward_data=["--samples_per_chunk", "1", "--max_blocks_per_split", "600",
                     "--gen_batch_size", "128"],
        reward_model=["--max_iters", "150", "--batch_size", "64", "--eval_interval", "50",
                      "--learning_rate", "1e-3", "--patience", "3"],
        grpo=["--max_steps", "20", "--prompts_per_step", "4", "--group_size", "8",
              "--learning_rate", "5e-5", "--eval_interval", "10", "--save_interval", "10",
              "--eval_max_batches", "10", "--eval_reward_samples", "64"] + FIXED_BUDGET,
        **CONTROL_ARM,
        quality_samples=128,
        detect_blocks=128,
        temps="0.5,0.7,1.0,1.4,2.0",  # a smoke run's frontier: 5 points (at GPT-2's vocabulary a sweep dominates)
    ),
    # the dynamics on CPU: the generator is cycle 0 stopped early (500 iterations, samples clearly
    # worse than text), the detector reads the frozen trunk of the same model trained to the end
    # (2000 iterations): a stronger LM of the same data, as RLHF reward models usually are
    "demo": dict(
        base_config="config/train_shakespeare_char_cpu.py",
        base=["--max_iters", "500", "--lr_decay_iters", "500"],
        detector_trunk=[],
        judge=[],
        max_cycles=2,
        detector="strong_trunk",
        reward_data=["--samples_per_chunk", "2", "--max_blocks_per_split", "2500",
                     "--gen_batch_size", "128"],
        reward_model=["--max_iters", "300", "--batch_size", "64", "--eval_interval", "50",
                      "--learning_rate", "1e-3", "--patience", "4"],
        # 16 prompts and beta 0.1: of the settings tried on this detector (docs/detector.md), the most
        # reward-model gain per unit of val-loss rise
        grpo=["--max_steps", "60", "--prompts_per_step", "16", "--group_size", "8", "--beta", "0.1",
              "--learning_rate", "5e-5", "--eval_interval", "20", "--save_interval", "20",
              "--eval_max_batches", "20"] + FIXED_BUDGET,
        **CONTROL_ARM,
        quality_samples=256,
        detect_blocks=256,
    ),
    # ONE GPU (24-80 GB; measured once on an H100 with random weights, README): GPT-2 124M from a local Hugging Face
    # directory (--base_ckpt, required, with --base_data_unknown: its training data is unknown) on
    # BPE Shakespeare, the detector on the frozen trunk of a larger local GPT-2 (--detector_trunk_ckpt,
    # e.g. gpt2-medium, required). Sequences of 256 tokens everywhere but the val perplexity, which
    # uses the generator's own 1024-token windows. README: the expected peak memory per step.
    "gpt2": dict(
        base_config=None,
        requires=("base_ckpt", "detector_trunk_ckpt", "judge_ckpt"),
        data_dir="data/shakespeare",
        out_name="shakespeare_gpt2",
        base=[],
        detector_trunk=None,
        judge=None,
        max_cycles=1,
        detector="strong_trunk",
        sample_len=256,
        eval_batch_size=16,
        reward_data=["--block_size", "256", "--samples_per_chunk", "1", "--max_blocks_per_split", "2000",
                     "--gen_batch_size", "64"],
        reward_model=["--max_iters", "600", "--batch_size", "32", "--eval_interval", "100",
                      "--learning_rate", "1e-3", "--patience", "3"],
        # 64 sequences per step, their backward in micro-batches of 16 (the activations' bound)
        grpo=["--seq_len", "256", "--max_steps", "100", "--prompts_per_step", "8", "--group_size", "8",
              "--micro_batch_size", "16", "--learning_rate", "1e-5", "--eval_interval", "25",
              "--save_interval", "25", "--eval_max_batches", "20", "--eval_batch_size", "16",
              "--eval_reward_samples", "128"] + FIXED_BUDGET,
        **CONTROL_ARM,
        quality_samples=512,
        detect_blocks=512,
    ),
}
# what a preset leaves out takes these (its run directory is runs/shakespeare_char_<preset>)
PRESET_DEFAULTS = dict(requires=(), data_dir="data/shakespeare_char", out_name=None, sample_len=None,
                       eval_batch_size=64)

TEMPS = "0.3,0.4,0.5,0.6,0.7,0.8,0.9,1.0,1.1,1.2,1.4,1.7,2.0"  # --temps: every preset's sweep but quick's
JUDGE_SEED_OFFSET = 7919  # the judge's train.py seed is --seed + this: no arm's model shares its draw

ARMS = ("sir", "logit", "ptx", "spin")  # --arms
RATIO_ARMS = {"sir", "logit", "ptx"}  # the arms that use the cycle's detector as a density ratio

STEPS = ("base", "detector_trunk", "judge", "reward_data", "reward_model", "grpo", "control", "spin", "null")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description="Run the generator / detector / GRPO cycle end to end, resumably, against a plain-MLE "
                    "control arm.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="default",
                    help="step settings: 'default' (nanoGPT's CPU model), 'quick' (a few minutes), 'demo' "
                         "(a generator stopped at 500 iterations against a detector on the fully trained model's "
                         "trunk) or 'gpt2' (one GPU: GPT-2 from --base_ckpt, a detector on --detector_trunk_ckpt's "
                         "trunk, BPE Shakespeare; both flags required)")
    ap.add_argument("--out_dir", default=None,
                    help="run directory (default: runs/shakespeare_char_<preset>, runs/shakespeare_gpt2 for gpt2)")
    ap.add_argument("--data_dir", default=None,
                    help="prepared corpus (train.bin, val.bin, meta.pkl for char; default: data/shakespeare_char, "
                         "data/shakespeare (BPE) for the gpt2 preset); the built-in Shakespeare directories are "
                         "prepared automatically when missing")
    ap.add_argument("--base_ckpt", default=None,
                    help="start from this generator checkpoint (a .pt file, or a local Hugging Face GPT-2 "
                         "directory with a BPE --data_dir) instead of training cycle 0")
    ap.add_argument("--base_data_unknown", action="store_true",
                    help="consent to start from a --base_ckpt that records no train/val split (a Hugging Face "
                         "directory, a nanoGPT checkpoint): its training data is unknown and may include this val "
                         "text, so held-out measures are not guaranteed held out; summary.md says so")
    ap.add_argument("--base_config", default=None,
                    help="train.py preset for cycle 0 (default: the preset's)")
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
    ap.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps (passed to every step)")
    ap.add_argument("--eval_batch_size", type=int, default=None,
                    help="batch size of the val perplexity evaluation (default: 64; 16 for the gpt2 preset)")
    ap.add_argument("--nproc_per_node", type=int, default=1,
                    help="run the heavy steps under torchrun with this many processes (1: plain python); "
                         "results do not depend on it, except in cycle 0: train.py's --batch_size counts per "
                         "process and its --gradient_accumulation_steps must be divisible by it (set both with "
                         "--extra_base, e.g. '--gradient_accumulation_steps 2 --batch_size 6' for 2 processes, and "
                         "the same with --extra_detector_trunk and --extra_judge)")
    g = ap.add_argument_group("detector")
    g.add_argument("--detector", choices=["preset"] + sorted(DETECTORS), default="preset",
                   help="detector recipe of every reward model: the preset's; 'per_position' (whole trunk "
                        "trained, every position labelled); 'strong_trunk' (per-position head with LM features "
                        "on the frozen trunk of a stronger LM of the same data); 'frozen_last_token' (the "
                        "design's frozen trunk and last-token head, which stays at chance)")
    g.add_argument("--detector_trunk_ckpt", default=None,
                   help="generator checkpoint of the same data and tokenizer whose trunk the 'strong_trunk' "
                        "detector uses (default: the one cycle 0 trains with the preset's detector_trunk "
                        "settings)")
    g.add_argument("--judge_ckpt", default=None,
                   help="generator checkpoint of the same data and tokenizer that judges sample quality (the "
                        "frontier's quality axis: the mean NLL of each generator's samples under it); it must be "
                        "independent of every arm: no arm trains on, starts from or is rewarded by it (default: "
                        "the one cycle 0 trains with the preset's judge settings, from another seed)")
    g.add_argument("--replay", action="store_true",
                   help="the reward model GRPO trains against in cycle n >= 2 also learns the train samples of the "
                        "earlier cycles' generators (the final stage's and the control's detectors do not: they "
                        "measure detectability the same way for both arms)")
    g = ap.add_argument_group("control arm")
    g.add_argument("--no_control", action="store_true",
                   help="skip the plain-MLE control arm (and its detectors)")
    g.add_argument("--no_control_detector", action="store_true",
                   help="skip the fresh detectors of the control arm's generators (each costs a reward "
                        "dataset and a reward model)")
    g.add_argument("--no_final_detector", action="store_true",
                   help="skip the final stage: fresh detectors of each arm's last generator")
    g.add_argument("--spin_arm", action="store_true",
                   help="a third arm: SPIN (train_spin.py: DPO with the natural continuation chosen and the "
                        "arm's own sample rejected, the previous iterate as reference) from the same cycle-0 "
                        "generator, on each cycle's GRPO budget (as many updates, the same prompts' lengths and "
                        "as many completion tokens per update), judged on the frontier like the adversarial arm")
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
    g = ap.add_argument_group("the detector as a density ratio (docs/design.md section 3)")
    g.add_argument("--arms", default="",
                   help="comma-separated arms beside the adversarial one, each judged on the frontier against both "
                        "controls: 'sir' (the ceiling: of --sir_n T = 1 samples of the cycle's entering generator, "
                        "one kept with probability proportional to exp(s), s the detector's log-ratio; its "
                        "coverage is the residual model P_gen exp(s) / Z on the val windows, the lower estimate), "
                        "'logit' (GRPO with the detector's log-ratio as the reward, the KL to the entering "
                        "generator inside it with --logit_beta, mean baseline), 'ptx' (the adversarial GRPO plus "
                        "--ptx_coef times MLE on natural text), 'spin' (SPIN with a likelihood anchor, its own "
                        "chain; the same as --spin_arm). sir, logit and ptx start in every cycle from the "
                        "generator that made the detector's negatives; any of them also measures the detector's "
                        "information (the residual model's gain, nats per val token, with bounds over n)")
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
                        "(skipped with one line when it or the directory is missing; docs/design.md)")
    g.add_argument("--progress_interval", type=float, default=30.0,
                   help="when stdout is not a terminal: seconds between two snapshots of a step's progress bar")
    for step in STEPS:
        what = {"control": "the control arm's train.py", "spin": "the SPIN arm's train_spin.py",
                "null": "the null arm's train_grpo.py (after --extra_grpo)"}.get(
            step, f"the {step} step's")
        ap.add_argument(f"--extra_{step}", default="",
                        help=f"extra arguments appended to {what} command line "
                             f"(one quoted string; use the = form because it starts with --, "
                             f"e.g. --extra_{step}='--seed 3')")
    add_tracking_args(ap)  # run_cycles passes them on: tb/<cycle>_<step> per step, one W&B group per run
    args = ap.parse_args(argv)
    preset = {**PRESET_DEFAULTS, **PRESETS[args.preset]}
    for flag in ("data_dir", "eval_batch_size", "sample_len"):  # the preset's where not given
        if getattr(args, flag) is None:
            setattr(args, flag, preset[flag])
    return args


# ----------------------------------------------------------------------------- running a step

RUN_LOCK_FD = None  # held for the whole run and inherited by the steps


class StepOutput:
    """Where a step's output goes. The log gets each line's final state (a progress bar's last
    redraw, not every one). A terminal gets the raw stream, so bars redraw in place. Any other
    stdout (`run_cycles.py > log.txt`, a pipe) gets what the log gets, plus a snapshot of a
    running progress bar at most every `interval` seconds."""

    def __init__(self, log, console, tty, interval=30.0, clock=time.monotonic):
        self.log, self.console, self.tty = log, console, tty
        self.interval, self.clock = interval, clock
        self.pending, self.tail = "", []
        self.last_snapshot, self.last_snapshot_text = clock(), None

    def _line(self, line):
        self.log.write(line)
        if not self.tty:
            self.console.write(line)
        self.tail = (self.tail + [line])[-20:]

    def feed(self, text):
        if self.tty:
            self.console.write(text)
        *lines, self.pending = (self.pending + text).split("\n")
        self.pending = "\r".join(self.pending.split("\r")[-2:])  # a bar's older redraws are not needed
        for line in lines:
            self._line(line.rstrip("\r").rsplit("\r", 1)[-1] + "\n")
        if "\r" in self.pending and self.clock() - self.last_snapshot >= self.interval:
            # the last complete redraw of the bar (the piece after the last \r may be cut short)
            snap = self.pending.rsplit("\r", 1)[0].rsplit("\r", 1)[-1].rstrip()
            if snap.strip() and snap != self.last_snapshot_text:
                self._line(snap + "\n")
                self.last_snapshot_text = snap
            self.last_snapshot = self.clock()
        self.log.flush()
        self.console.flush()

    def close(self):
        if self.pending.rsplit("\r", 1)[-1]:
            self._line(self.pending.rsplit("\r", 1)[-1] + "\n")
        self.pending = ""
        self.log.flush()
        self.console.flush()


PROGRESS_INTERVAL = 30.0  # set from --progress_interval


def run_step(name, cmd, log_path, nproc=1):
    """Run one script (under torchrun when nproc > 1), streaming its output to the console
    and to a log file (see StepOutput)."""
    if nproc > 1:
        cmd = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"] + cmd
    print(f"\n=== {name}: {' '.join(cmd)}", flush=True)
    t0 = time.time()
    with open(log_path, "a") as log:
        log.write(f"\n$ {' '.join(cmd)}\n")
        log.flush()
        # unbuffered: output streams as it comes, and a step orphaned by `kill -9` of this
        # process fails at its next line (broken pipe) instead of running on unseen
        proc = subprocess.Popen([sys.executable] + cmd, cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, bufsize=0,
                                env=dict(os.environ, PYTHONUNBUFFERED="1"),
                                pass_fds=() if RUN_LOCK_FD is None else (RUN_LOCK_FD,))
        out = StepOutput(log, sys.stdout, sys.stdout.isatty(), PROGRESS_INTERVAL)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        while True:
            chunk = proc.stdout.read(65536)
            out.feed(decoder.decode(chunk, final=not chunk))
            if not chunk:
                break
        out.close()
        rc = proc.wait()
        secs = time.time() - t0
        # the step's own report (common.run_cli's report_peak), one line per process under torchrun
        peaks = [line.strip()[len(PEAK_MEMORY_PREFIX):] for line in out.tail if line.startswith(PEAK_MEMORY_PREFIX)]
        done = f"--- {name}: exit {rc} after {secs:.1f} s"  # not '=== ': that line is the step's launch
        done += f"; {PEAK_MEMORY_PREFIX}{' | '.join(peaks)}" if peaks else ""
        log.write(done + "\n")
    print(done, flush=True)
    if rc != 0:
        raise ProjectError(f"step '{name}' failed (exit {rc}); its output is in {log_path}:\n"
                           + "".join(out.tail).rstrip(),
                           "fix the cause and rerun the same command: finished steps are skipped")
    return secs


def note_peak(what):
    """run_cycles' own peak memory after one of its in-process measurements (the steps report theirs)."""
    print(f"run_cycles {PEAK_MEMORY_PREFIX}{peak_memory_text()} (after {what})", flush=True)


def fmt(v, spec=".4f"):
    return "-" if v is None else format(v, spec)


def done_path(d, step):
    return os.path.join(d, f"{step}.done.json")


def read_done(d, step):
    p = done_path(d, step)
    if os.path.exists(p):
        with open(p) as f:
            return json.load(f)
    return None


def mark_done(d, step, record):
    atomic_write_text(done_path(d, step), json.dumps(record, indent=2) + "\n")
    return record


def read_json(path):
    with open(path) as f:
        return json.load(f)


def ensure_data(data_dir, log_path):
    if os.path.exists(os.path.join(data_dir, "train.bin")) and os.path.exists(os.path.join(data_dir, "val.bin")):
        return
    prep = os.path.join(data_dir, "prepare.py")
    if not os.path.exists(prep):
        raise ProjectError(f"--data_dir {data_dir} has no train.bin/val.bin and no prepare.py",
                           "prepare it first: python prepare_data.py --input TEXT --out_dir DIR")
    run_step("prepare data", [os.path.relpath(prep, ROOT)], log_path)


def grpo_budget(g_dir):
    """What a finished GRPO step actually used: steps, optimizer updates (steps x
    --num_updates_per_batch), generated completion tokens, seq_len and its optimizer settings."""
    ck = read_checkpoint(os.path.join(g_dir, "ckpt.pt"))
    cfg, state = ck.get("config") or {}, ck.get("grpo") or {}
    steps = int(state.get("step", 0))
    seq_len = int(state["seq_len"])
    plen = {}
    for r in read_jsonl(os.path.join(g_dir, "metrics.jsonl")):
        if r.get("kind") == "step" and r.get("step", 0) <= steps:
            plen[r["step"]] = int(r["prompt_len"])
    if len(plen) != steps:
        raise ProjectError(f"{g_dir}/metrics.jsonl holds {len(plen)} GRPO step records, the checkpoint "
                           f"{steps} steps", "rerun the GRPO step: delete its directory and its grpo.done.json")
    rows = int(cfg["prompts_per_step"]) * int(cfg["group_size"])
    tokens = sum(rows * (seq_len - p) for p in plen.values())
    return {"steps": steps, "updates": steps * int(cfg.get("num_updates_per_batch", 1)), "rows_per_step": rows,
            "completion_tokens": tokens, "tokens_per_step": tokens / steps if steps else 0.0,
            "seq_len": seq_len,
            **{k: cfg[k] for k in ("learning_rate", "weight_decay", "beta1", "beta2", "grad_clip") if k in cfg}}


def generator_block_size(path):
    return sequence_length(read_checkpoint(path), path)


# ----------------------------------------------------------------------------- the run

class Cycles:
    """The steps of one run, each resumable through its `<step>.done.json`."""

    def __init__(self, args, preset, out_dir):
        self.args, self.preset, self.out_dir = args, preset, out_dir
        self.data_dir = args.data_dir
        self.corpus = Corpus(args.data_dir)  # opened once: every measurement of the run shares it
        self.log_path = os.path.join(out_dir, "steps.log")
        self.extra = {s: getattr(args, f"extra_{s}").split() for s in STEPS}
        self.dev = ["--device", args.device]
        self.device = resolve_device(args.device)
        self.nproc = args.nproc_per_node
        name = preset["detector"] if args.detector == "preset" else args.detector
        self.detector_name = name
        self.detector_flags = DETECTORS[name]
        self.trunk = None  # the detector trunk's record, set by detector_trunk()
        # the parts of the experiment this run does, and why a part is skipped
        self.control = preset["control_arm"] and not args.no_control
        self.skip_control_detector = ("--no_control_detector" if args.no_control_detector else
                                      None if preset["control_detector"] else
                                      f"preset {args.preset!r} has no control detectors")
        self.skip_final_detector = ("--no_final_detector" if args.no_final_detector else
                                    None if preset["final_detector"] else
                                    f"preset {args.preset!r} has no final stage")
        self.control_lr = args.control_learning_rate or preset["control_learning_rate"]
        self.quality_samples = args.quality_samples or preset["quality_samples"]
        self.detect_blocks = args.detect_blocks or preset["detect_blocks"]
        self.sample_len = args.sample_len  # fixed from the cycle-0 generator in base()
        self.mauve_features = None  # the featurizer's directory when MAUVE can run (--mauve_features)
        if args.mauve_features:
            why = unavailable(args.mauve_features)
            if why:
                print(f"note: --mauve_features skipped: {why}")
            else:
                self.mauve_features = os.path.abspath(args.mauve_features)
        self.eval_block_size = None
        self.null = preset["null_arm"] and not args.no_null_arm
        self.arms = set(args.arms)
        if self.arms & RATIO_ARMS and "--per_position" not in self.detector_flags:
            raise ProjectError(f"--arms {','.join(sorted(self.arms & RATIO_ARMS))} read the detector's per-position "
                               f"log-ratios, and the {name!r} detector has a last-token head",
                               "use --detector strong_trunk or per_position")
        self.judge_model, self.judge_rec = None, None  # set by judge()
        self.evaluated = {}  # checkpoint -> its eval record, so a checkpoint used twice is swept once
        self.val_ppls = {}  # checkpoint (and its file's version) -> (val loss, ppl): cycle 0's models are often one
        # checkpoint -> {(n, length, seed): its T = 1 samples} from its sweep, which its detector measurement reuses
        self.samples = {}
        self.det_features = {}  # the head input of the natural blocks per detector trunk (measure_detector)
        self.tb_root = resolve_tensorboard_dir(args.tensorboard_dir, out_dir)
        self.wandb_group = args.wandb_group or args.wandb_run_name or os.path.basename(os.path.abspath(out_dir))

    def track(self, step_dir):
        """The tracking flags of a training step: its TensorBoard directory under the run's tb/
        (cycle_1/grpo -> tb/cycle_1_grpo, so one TensorBoard shows the whole run) and, with
        --wandb_log, the run's W&B group with the step as the run name."""
        name = os.path.relpath(step_dir, self.out_dir).replace(os.sep, "_")
        flags = ["--tensorboard_dir", "none" if self.tb_root is None else os.path.join(self.tb_root, name)]
        if self.args.wandb_log:
            flags += ["--wandb_log", "True", "--wandb_project", self.args.wandb_project,
                      "--wandb_group", self.wandb_group, "--wandb_run_name", name]
        return flags

    # ---- cycle 0
    def base(self, base_config):
        args = self.args
        c0 = os.path.join(self.out_dir, "cycle_0")
        os.makedirs(c0, exist_ok=True)
        base = read_done(c0, "base")
        if base is None:
            if args.base_ckpt:
                gen = os.path.abspath(args.base_ckpt)
            else:
                bdir = os.path.join(c0, "base")
                cmd = ["train.py", "--config", base_config, "--out_dir", bdir, "--data_dir", self.data_dir,
                       "--seed", str(args.seed)] + self.dev + self.track(bdir) + self.preset["base"] + self.extra["base"]
                if os.path.exists(os.path.join(bdir, "last.pt")) or os.path.exists(os.path.join(bdir, "ckpt.pt")):
                    cmd.append("--resume")
                run_step("cycle 0: base model", cmd, self.log_path, self.nproc)
                gen = os.path.abspath(os.path.join(bdir, "ckpt.pt"))
            loss, ppl = self.val_perplexity(gen)
            cost = None if args.base_ckpt else flops.step_train(os.path.join(c0, "base"))
            base = mark_done(c0, "base", {"generator": gen, "val_loss": loss, "val_ppl": ppl, "flops": cost})
            note_peak("the cycle-0 generator's val perplexity")
        # every generator is scored in the cycle-0 generator's windows, sampled to one length
        self.eval_block_size = generator_block_size(base["generator"])
        self.sample_len = self.sample_len or self.eval_block_size
        self.check_ratio_windows()
        return base

    def val_perplexity(self, path):
        """measures.val_perplexity of a checkpoint, once per checkpoint (and version of its file) in this
        run: the base generator, the detector trunk and the judge may be one checkpoint (the issue's BPE
        run gives one Hugging Face GPT-2 for all three), and the same pass over the same file gives the same bits."""
        path = os.path.abspath(path)
        st = os.stat(path)
        key = (path, st.st_size, st.st_mtime_ns)
        if key not in self.val_ppls:
            self.val_ppls[key] = val_perplexity(path, self.corpus, self.device, self.args.eval_batch_size)
        else:
            print(f"{path}: val perplexity measured already in this run (the same checkpoint): reused")
        return self.val_ppls[key]

    def check_ratio_windows(self):
        """--arms sir, logit, ptx score the val windows and samples with the detector: refuse, before any
        cycle, windows longer than the blocks its reward data will hold (prepare_reward_data.py's
        --block_size, else the generator's context)."""
        flags = self.preset["reward_data"] + self.extra["reward_data"]
        last = [k for k, f in enumerate(flags) if f == "--block_size"]
        N = int(flags[last[-1] + 1]) if last else self.eval_block_size
        if self.arms & RATIO_ARMS and max(self.eval_block_size, self.sample_len) > N:
            raise ProjectError(f"--arms {','.join(sorted(self.arms & RATIO_ARMS))} score val windows of "
                               f"{self.eval_block_size} tokens and samples of {self.sample_len} with a detector of "
                               f"{N}-token blocks", "drop sir, logit and ptx from --arms for this preset, or make "
                               "the reward data's blocks as long (--extra_reward_data='--block_size ...')")

    def cycle0_model(self, base_config, name, what, flags, given, seed):
        """A cycle-0 model of the same data beside the generator (the detector trunk, the judge): the
        checkpoint `given` on the command line, or train.py with the preset's `flags` from `seed`."""
        c0 = os.path.join(self.out_dir, "cycle_0")
        rec = read_done(c0, name)
        if rec is None:
            cost = None
            if given:
                path = os.path.abspath(given)
            else:
                if self.args.base_ckpt:
                    print(cycle0_note(name, self.args.preset, base_config, flags), flush=True)
                tdir = os.path.join(c0, name)
                cmd = ["train.py", "--config", base_config, "--out_dir", tdir, "--data_dir", self.data_dir,
                       "--seed", str(seed)] + self.dev + self.track(tdir) + flags + self.extra[name]
                if os.path.exists(os.path.join(tdir, "last.pt")) or os.path.exists(os.path.join(tdir, "ckpt.pt")):
                    cmd.append("--resume")
                run_step(f"cycle 0: {what}", cmd, self.log_path, self.nproc)
                path = os.path.abspath(os.path.join(tdir, "ckpt.pt"))
                cost = flops.step_train(tdir)
            loss, ppl = self.val_perplexity(path)
            rec = mark_done(c0, name, {"checkpoint": path, "val_loss": loss, "val_ppl": ppl, "flops": cost})
            note_peak(f"the {name.replace('_', ' ')}'s val perplexity")
        print(f"{name.replace('_', ' ')} {rec['checkpoint']}: val loss {rec['val_loss']:.4f}, ppl {rec['val_ppl']:.3f}")
        return rec

    def detector_trunk(self, base_config):
        """The stronger LM whose frozen trunk the 'strong_trunk' detector reads: given, or trained
        in cycle 0 from the same data with the preset's detector_trunk settings (nothing otherwise)."""
        args = self.args
        if self.detector_name not in NEEDS_TRUNK:
            return None
        if not args.detector_trunk_ckpt and self.preset.get("detector_trunk") is None:
            raise ProjectError(f"the {self.detector_name!r} detector needs a stronger LM's trunk, and preset "
                               f"{args.preset!r} trains none",
                               "pass --detector_trunk_ckpt PATH (a generator of the same data, trained "
                               "longer or larger), or use --preset demo")
        self.trunk = self.cycle0_model(base_config, "detector_trunk", "detector trunk (a stronger LM of the same data)",
                                       self.preset.get("detector_trunk") or [], args.detector_trunk_ckpt, args.seed)
        return self.trunk

    def judge(self, base_config):
        """The independent judge of sample quality: given, or trained in cycle 0 with the preset's judge
        settings from its own seed (--seed + JUDGE_SEED_OFFSET), so no arm trains on, starts from or is
        rewarded by it. Loaded once: every sweep scores its samples with it."""
        args = self.args
        if not args.judge_ckpt and self.preset.get("judge") is None:
            raise ProjectError(f"preset {args.preset!r} trains no judge", "pass --judge_ckpt PATH (a generator of "
                               "the same data and tokenizer that no arm starts from, e.g. a larger model)")
        rec = self.cycle0_model(base_config, "judge", "the judge (an independent LM of the train split)",
                                self.preset.get("judge") or [], args.judge_ckpt, args.seed + JUDGE_SEED_OFFSET)
        self.judge_model, _, _ = load_model(rec["checkpoint"], device=self.device, require_mode="generator")
        self.judge_rec = rec
        return rec

    # ---- measurements
    def reference(self):
        """The natural val text's sample statistics (the reference lines)."""
        ref = read_done(self.out_dir, "reference")
        want = {"samples": self.quality_samples, "sample_len": self.sample_len, "seed": self.args.seed}
        if ref is None or any(ref.get(k) != v for k, v in want.items()):
            ref = mark_done(self.out_dir, "reference",
                            natural_reference(self.corpus, self.quality_samples, self.sample_len, self.args.seed))
        return ref

    def evaluate(self, d, gen, label):
        """Val perplexity and sample quality of one generator, the same way for every generator."""
        ev = read_done(d, "eval")
        # (re)computed when missing, from an older version, or made with other sample settings
        want = {"generator": os.path.abspath(gen), "samples": self.quality_samples, "sample_len": self.sample_len,
                "seed": self.args.seed, "temps": self.args.temps, "mauve_features": self.mauve_features,
                "judge": self.judge_rec["checkpoint"]}
        twin = self.evaluated.get(want["generator"])  # the same checkpoint swept elsewhere in this run
        if (ev is None or any(ev.get(k) != v for k, v in want.items())) and twin is not None \
                and all(twin.get(k) == v for k, v in want.items()):
            print(f"{label}: {gen} was evaluated already in this run (the same checkpoint): its sweep is reused")
            ev = mark_done(d, "eval", twin)
        if ev is None or any(ev.get(k) != v for k, v in want.items()):
            print(f"{label}: evaluating {gen} (full val split, {self.quality_samples} samples of "
                  f"{self.sample_len} tokens, at T = {', '.join(f'{t:g}' for t in self.args.temps)})", flush=True)
            t0 = time.time()
            model, _, _ = load_model(gen, device=self.device, require_mode="generator")
            rows = {}
            curve = frontier.sweep(model, self.corpus, self.args.temps, self.quality_samples, self.sample_len,
                                   self.args.seed, self.device, eval_batch_size=self.args.eval_batch_size,
                                   eval_block_size=self.eval_block_size, keep_examples=True, judge=self.judge_model,
                                   rows=rows)
            self.samples[want["generator"]] = {(self.quality_samples, self.sample_len, self.args.seed): rows[1.0]}
            # the generator's own measurement is the sweep's T = 1 point (--temps always holds 1.0)
            ev = {"generator": os.path.abspath(gen), **curve[1.0]}
            ev = mark_done(d, "eval", {**ev, "temps": self.args.temps,
                                       "frontier": {f"{t:g}": {k: v for k, v in row.items() if k != "examples"}
                                                    for t, row in curve.items()},
                                       "mauve_features": self.mauve_features, "mauve": self.mauve(model),
                                       "judge": self.judge_rec["checkpoint"],
                                       "seconds": round(time.time() - t0, 1)})
            note_peak(f"evaluating {label}")
        self.evaluated[want["generator"]] = ev
        return ev

    def mauve(self, model):
        """MAUVE of the generator's T = 1 samples (generated_blocks, the same as the sweep's at T = 1)
        against the natural windows their prompts come from; None without --mauve_features."""
        if self.mauve_features is None:
            return None
        n, L, seed, val = self.quality_samples, self.sample_len, self.args.seed, self.corpus.val
        gen_rows = generated_blocks(model, val, n, L, seed, self.device)
        tok = self.corpus.tokenizer
        nat_rows = natural_blocks(val, n, L, seed)  # the windows whose first token prompted each sample
        out = mauve_score(decode_rows(tok, gen_rows), decode_rows(tok, nat_rows), self.mauve_features, self.device)
        print(f"MAUVE (T = 1, {n} samples, {out['buckets']} buckets): {out['mauve']:.4f}", flush=True)
        return out

    def detector(self, d, gen, seed, label, replay=()):
        """Reward dataset + fresh reward model on `gen`'s samples in d, then its measurements.
        replay: earlier cycles' reward data directories whose train splits the reward model also
        learns (--replay). Returns (reward_model record, detect record)."""
        os.makedirs(d, exist_ok=True)
        rd_dir = os.path.join(d, "reward_data")
        if read_done(d, "reward_data") is None:
            cmd = ["prepare_reward_data.py", "--model_path", gen, "--input_mode", "binary",
                   "--train_bin", os.path.join(self.data_dir, "train.bin"),
                   "--val_bin", os.path.join(self.data_dir, "val.bin"),
                   "--output_dir", rd_dir, "--seed", seed] + self.dev + self.preset["reward_data"] \
                + self.extra["reward_data"]
            if os.path.isdir(rd_dir) and os.listdir(rd_dir):
                cmd.append("--resume")
            secs = run_step(f"{label}: reward dataset", cmd, self.log_path, self.nproc)
            mark_done(d, "reward_data", {"dir": rd_dir, "generator": gen, "seconds": secs,
                                         "flops": flops.step_reward_data(rd_dir, gen)})
        if replay:
            rd_dir = self.replay_data(d, rd_dir, replay)

        rm_dir = os.path.join(d, "reward_model")
        rm = read_done(d, "reward_model")
        if rm is None:
            cmd = ["train_reward_model.py", "--model_path", gen, "--data_dir", rd_dir, "--out_dir", rm_dir,
                   "--seed", seed] + self.dev + self.track(rm_dir) + self.preset["reward_model"] + self.detector_flags \
                + (["--init_trunk_from", self.trunk["checkpoint"]] if self.trunk else []) + self.extra["reward_model"]
            if os.path.exists(os.path.join(rm_dir, "reward_last.pt")):
                cmd.append("--resume")
            secs = run_step(f"{label}: reward model ({self.detector_name} detector)", cmd, self.log_path,
                            self.nproc)
            rm = mark_done(d, "reward_model", {**read_json(os.path.join(rm_dir, "reward_summary.json")),
                                               "detector": self.detector_name, "seconds": secs,
                                               "flops": flops.step_reward_model(rm_dir)})
        # what this detector cost: its reward data and its training (run_cycles adds it to the arms using it)
        rm = {**rm, "detector_flops": flops.total({"data": read_done(d, "reward_data").get("flops"),
                                                     "model": rm.get("flops")})}

        det = read_done(d, "detect")
        if det is None or det.get("auroc_blocks") != self.detect_blocks:
            print(f"{label}: measuring the detector (AUROC on {self.detect_blocks} + {self.detect_blocks} "
                  f"blocks, lexicon baseline)", flush=True)
            t0 = time.time()
            det = measure_detector(rm_dir, rd_dir, gen, self.corpus, self.device, self.detect_blocks,
                                   self.args.seed, known_blocks=self.samples.get(os.path.abspath(gen)),
                                   feature_cache=self.det_features)
            det = mark_done(d, "detect", {**det, "seconds": round(time.time() - t0, 1)})
            note_peak(f"measuring {label}'s detector")
        if rm.get("val_mae") is not None and rm["val_mae"] >= rm["const_mae"] - 1e-4:
            print(f"WARNING: {label}'s reward model is no better than the constant 0.5 predictor; "
                  f"try more reward data (--extra_reward_data='--samples_per_chunk 10'), the per-position "
                  f"detector (--detector per_position) or a larger base model")
        return rm, det

    def replay_data(self, d, rd_dir, replay):
        """The reward data with earlier generators' train samples added (val: the current generator's)."""
        out = os.path.join(d, "reward_data_replay")
        if read_done(d, "replay") is None:
            print(f"replay: the detector also trains on {', '.join(replay)}", flush=True)
            merge_train_splits(rd_dir, list(replay), out)
            mark_done(d, "replay", {"dir": out, "from": list(replay)})
        return out

    # ---- the adversarial arm
    def grpo(self, cdir, gen, rm, seed, label, null=False, flags=()):
        """GRPO against detector rm in cdir/grpo; null: the null arm's run (--shuffle_rewards); flags: an
        arm's own train_grpo.py flags after the preset's (--arms logit, ptx)."""
        g_dir = os.path.join(cdir, "grpo")
        gr = read_done(cdir, "grpo")
        if gr is None or "budget" not in gr:
            if gr is None:
                cmd = ["train_grpo.py", "--model_path", gen, "--reward_model_path", rm["checkpoint"],
                       "--out_dir", g_dir, "--data_dir", self.data_dir, "--seed", seed] + self.dev \
                    + self.track(g_dir) + self.preset["grpo"] + self.extra["grpo"] \
                    + (["--shuffle_rewards"] + self.extra["null"] if null else []) + list(flags)
                if os.path.exists(os.path.join(g_dir, "ckpt.pt")):
                    cmd.append("--resume")
                secs = run_step(f"{label}: GRPO", cmd, self.log_path, self.nproc)
                gr = {**read_json(os.path.join(g_dir, "grpo_summary.json")), "seconds": secs}
            budget = grpo_budget(g_dir)
            # train_grpo.py's own summary records the same budget (newer versions): they must agree
            for k in ("updates", "completion_tokens", "seq_len"):
                if k in gr and gr[k] != budget[k]:
                    raise ProjectError(f"{g_dir}: grpo_summary.json says {k} = {gr[k]}, its checkpoint and "
                                       f"metrics.jsonl say {budget[k]}",
                                       "rerun the GRPO step: delete its directory and its grpo.done.json")
            gr = mark_done(cdir, "grpo", {**gr, "budget": budget,
                                          "flops": flops.step_rl(g_dir, "ckpt.pt", "grpo", rm["checkpoint"])})
        return gr

    # ---- the SPIN arm
    def spin(self, d, gen, budget, seed, label):
        """SPIN from the SPIN arm's previous generator for the GRPO step's budget: as many steps,
        GRPO's rows per step and seq_len, and the same seed, so every step draws the prompt length
        GRPO's step drew (rl_data.step_prompt_len) and generates as many completion tokens."""
        rec = read_done(d, "spin")
        if rec is not None:
            return rec
        os.makedirs(d, exist_ok=True)
        if budget["updates"] == 0:  # GRPO made no update: neither does SPIN
            return mark_done(d, "spin", {"checkpoint": gen, "updates": 0, "completion_tokens": 0, "seconds": 0.0})
        s_dir = os.path.join(d, "spin")
        steps = int(budget["steps"])
        cmd = ["train_spin.py", "--model_path", gen, "--out_dir", s_dir, "--data_dir", self.data_dir, "--seed", seed,
               "--seq_len", str(budget["seq_len"]), "--max_steps", str(steps),
               "--prompts_per_step", str(budget["rows_per_step"]),
               "--learning_rate", repr(float(self.args.spin_learning_rate or budget["learning_rate"])),
               "--beta", repr(self.args.spin_beta), "--nll_coef", repr(self.args.spin_nll_coef),
               "--eval_interval", str(steps), "--save_interval", str(max(1, steps // 3))]
        for k in ("weight_decay", "beta1", "beta2", "grad_clip"):
            if k in budget:
                cmd += [f"--{k}", repr(float(budget[k]))]
        cmd += self.dev + self.track(s_dir) + self.extra["spin"]
        if os.path.exists(os.path.join(s_dir, "ckpt.pt")):
            cmd.append("--resume")
        secs = run_step(f"{label}: SPIN ({steps} steps x {budget['rows_per_step']} prompts)", cmd, self.log_path)
        return mark_done(d, "spin", {**read_json(os.path.join(s_dir, "spin_summary.json")), "seconds": secs,
                                     "flops": flops.step_rl(s_dir, "ckpt.pt", "spin")})

    # ---- the density-ratio arms
    def sir(self, d, gen, rm, entering, seed, label):
        """What detector rm knows about gen, the generator that made its negatives: the residual model
        P_gen exp(s) / Z on the frontier's val windows (experiment/residual.py), with Z from --sir_n of gen's own
        continuations per window; and the SIR arm's T = 1 point: the sweep's prompts, --sir_n samples
        each, one kept in proportion to exp(s), scored by the judge; its coverage is the residual
        model's (the lower estimate) over the same windows as every sweep. entering: gen's own T = 1
        sweep point. In d/sir.done.json."""
        want = {"generator": os.path.abspath(gen), "detector": rm["checkpoint"], "n": self.args.sir_n,
                "samples": self.quality_samples, "sample_len": self.sample_len, "seed": self.args.seed,
                "judge": self.judge_rec["checkpoint"]}
        rec = read_done(d, "sir")
        if rec is not None and all(rec.get(k) == v for k, v in want.items()):
            return rec
        os.makedirs(d, exist_ok=True)
        t0 = time.time()
        model, _, _ = load_model(gen, device=self.device, require_mode="generator")
        det, N = residual.load_detector(rm["checkpoint"], device=self.device)
        if max(self.eval_block_size, self.sample_len) > N:
            raise ProjectError(f"the residual model scores windows of {self.eval_block_size} tokens and samples of "
                               f"{self.sample_len}, longer than the {N} its detector was trained on",
                               "drop sir, logit and ptx from --arms for this preset, or pass --sample_len")
        print(f"{label}: the residual model on {self.eval_block_size}-token val windows and the SIR arm "
              f"({self.quality_samples} prompts), {self.args.sir_n} generator samples each", flush=True)
        val = val_tokens(self.corpus)
        res = residual.val_residual(model, det, N, val, self.eval_block_size, self.args.sir_n, int(seed))
        info = residual.information(res, self.eval_block_size, entering["val_tokens"])
        rows = residual.sir_rows(model, det, N, val, self.quality_samples, self.sample_len, self.args.sir_n,
                                 self.args.seed)
        items = judge_nll(self.judge_model, rows, self.device)
        point = {**sample_stats(rows, corpus_tokenizer(self.corpus), train_vocabulary(self.corpus)),
                 "judge_nll": float(items.mean()), "judge_items": items.tolist(),
                 **residual.residual_point(entering, res, self.eval_block_size, frontier.VAL_ITEMS),
                 "sample_len": self.sample_len, "seed": self.args.seed}
        rec = mark_done(d, "sir", {**want, "information": {str(m): v for m, v in info.items()}, "point": point,
                                   "seconds": round(time.time() - t0, 1)})
        note_peak(f"{label}: the residual model and SIR")
        return rec

    # ---- the control arm
    def control_mle(self, d, gen, budget, seed, label):
        """Plain MLE from the control arm's previous generator for the GRPO step's budget:
        as many optimizer updates, batch_size * block_size ~ its completion tokens per step,
        block_size = its seq_len, a constant learning rate, no early stopping."""
        rec = read_done(d, "mle")
        if rec is not None:
            return rec
        os.makedirs(d, exist_ok=True)
        updates, N = int(budget["updates"]), int(budget["seq_len"])
        lr = self.control_lr or float(budget["learning_rate"])
        if updates == 0:  # GRPO made no update: neither does the control
            return mark_done(d, "mle", {"checkpoint": gen, "iters": 0, "batch_size": 0, "block_size": N,
                                        "tokens": 0, "learning_rate": lr, "seconds": 0.0})
        # train.py crops a pretrained model to a shorter --block_size; keep the generator's own
        # context (so every generator is scored alike) when GRPO's seq_len is shorter than it
        T = max(N, generator_block_size(gen))
        if T != N:
            print(f"note: {label}'s control trains in blocks of {T} tokens, the generator's context (GRPO's "
                  f"sequences had {N}), with about as many tokens per update")
        N = T
        rows = max(1, round(budget["tokens_per_step"] / N))
        per_proc = max(1, round(rows / self.nproc))  # train.py's --batch_size counts per process
        m_dir = os.path.join(d, "mle")
        cmd = ["train.py", "--out_dir", m_dir, "--data_dir", self.data_dir, "--seed", seed,
               "--block_size", str(N), "--batch_size", str(per_proc),
               "--gradient_accumulation_steps", str(self.nproc), "--max_iters", str(updates),
               "--learning_rate", repr(lr), "--decay_lr", "False", "--patience", "0",
               # train.py evaluates at iteration 0 and at the end; its estimates are not used here
               "--eval_interval", str(updates), "--eval_iters", "5",
               "--log_interval", str(max(1, updates // 10)), "--dropout", "0.0", "--compile", "False"]
        # the optimizer settings GRPO used (AdamW; the learning rate is the one above)
        for k in ("weight_decay", "beta1", "beta2", "grad_clip"):
            if k in budget:
                cmd += [f"--{k}", repr(float(budget[k]))]
        cmd += self.dev + self.track(m_dir) + self.preset["control"] + self.extra["control"]
        last = os.path.join(m_dir, "last.pt")
        # a killed step resumes from its last.pt (written at iteration 0 and at the end)
        cmd += ["--resume"] if os.path.exists(last) else ["--init_from", gen]
        secs = run_step(f"{label}: control MLE ({updates} updates x {per_proc * self.nproc} x {N} tokens)",
                        cmd, self.log_path, self.nproc)
        losses = [r["loss"] for r in read_jsonl(os.path.join(m_dir, "metrics.jsonl")) if "loss" in r]
        # last.pt is the final state (ckpt.pt is train.py's best estimate, possibly iteration 0)
        return mark_done(d, "mle", {"checkpoint": os.path.abspath(last), "iters": updates,
                                    "batch_size": per_proc * self.nproc, "block_size": N,
                                    "tokens": updates * per_proc * self.nproc * N, "learning_rate": lr,
                                    "train_loss_final": losses[-1] if losses else None, "seconds": secs,
                                    "flops": flops.step_train(m_dir)})


# ----------------------------------------------------------------------------- the loop

@dataclass
class RunState:
    """What the cycle loop changes: every generator's summary entry, the per-cycle rows, each
    arm's current generator, and the early stopper on the adversarial arm's val perplexity."""
    rep: int                  # the replicate (--seeds), and its directory
    root: str
    gens: dict                # (cycle, arm) -> summary.json entry
    gen: str                  # the adversarial arm's current generator, its val loss and ppl
    gen_loss: float
    gen_ppl: float
    ctl_gen: str              # the control arm's current generator
    spin_gen: str             # the SPIN arm's (--spin_arm)
    null_gen: str             # the null arm's (GRPO with shuffled rewards)
    flops: dict               # arm -> its total training and generation FLOPs so far (flops.py)
    stopper: EarlyStopping
    entering: dict = field(default_factory=lambda: {"adversarial": (0, "base"), "control": (0, "base")})
    rows: list = field(default_factory=list)
    last: int = 0
    stop_reason: str = ""
    info: dict = field(default_factory=dict)  # cycle -> the detector's information (--arms)


def check_args(args):
    """Refuse bad settings before any step runs."""
    if args.max_cycles is not None and args.max_cycles < 0:
        raise ProjectError(f"--max_cycles must be >= 0, got {args.max_cycles}")
    if args.nproc_per_node < 1:
        raise ProjectError(f"--nproc_per_node must be >= 1, got {args.nproc_per_node}")
    args.temps = args.temps or PRESETS[args.preset].get("temps") or TEMPS
    try:
        temps = sorted({float(t) for t in args.temps.split(",")})
    except ValueError:
        raise ProjectError(f"--temps {args.temps!r} is not a comma-separated list of numbers",
                           "e.g. --temps 0.6,0.8,1.0,1.2") from None
    if 1.0 not in temps or temps[0] <= 0:
        raise ProjectError(f"--temps {args.temps!r} must be positive and include 1.0",
                           "e.g. --temps 0.6,0.8,1.0,1.2")
    args.temps = temps
    if args.seeds < 1:
        raise ProjectError(f"--seeds must be >= 1, got {args.seeds}")
    for flag in ("quality_samples", "detect_blocks"):
        if getattr(args, flag) is not None and getattr(args, flag) < 2:
            raise ProjectError(f"--{flag} must be >= 2, got {getattr(args, flag)}")
    if args.sample_len is not None and args.sample_len < 2:
        raise ProjectError(f"--sample_len must be >= 2, got {args.sample_len}")
    for flag in ("spin_beta", "spin_learning_rate"):
        if getattr(args, flag) is not None and getattr(args, flag) <= 0:
            raise ProjectError(f"--{flag} must be > 0, got {getattr(args, flag)}")
    arms = {a.strip() for a in args.arms.split(",") if a.strip()}
    if arms - set(ARMS):
        raise ProjectError(f"--arms {args.arms!r}: unknown arm(s) {', '.join(sorted(arms - set(ARMS)))}",
                           f"choose from {', '.join(ARMS)}, comma-separated")
    args.arms = sorted(arms | ({"spin"} if args.spin_arm else set()))
    args.spin_arm = "spin" in args.arms
    for flag in ("sir_n", "logit_beta", "ptx_coef"):
        if getattr(args, flag) <= 0:
            raise ProjectError(f"--{flag} must be > 0, got {getattr(args, flag)}")
    if args.logit_learning_rate is not None and args.logit_learning_rate <= 0:
        raise ProjectError(f"--logit_learning_rate must be > 0, got {args.logit_learning_rate}")
    if args.spin_nll_coef < 0:
        raise ProjectError(f"--spin_nll_coef must be >= 0, got {args.spin_nll_coef}")
    if args.control_learning_rate is not None and args.control_learning_rate <= 0:
        raise ProjectError(f"--control_learning_rate must be > 0, got {args.control_learning_rate}")
    for flag in PRESETS[args.preset].get("requires", ()):
        if getattr(args, flag) is None:
            raise ProjectError(f"--preset {args.preset} needs --{flag}",
                               "pass local Hugging Face GPT-2 directories (nothing is downloaded): --base_ckpt "
                               "DIR (e.g. gpt2, 124M), --detector_trunk_ckpt DIR (a larger one, e.g. gpt2-medium) "
                               "and --judge_ckpt DIR (an independent judge, e.g. gpt2-large), saved beforehand "
                               "with save_pretrained")
    if args.eval_batch_size < 1:
        raise ProjectError(f"--eval_batch_size must be >= 1, got {args.eval_batch_size}")
    if args.base_ckpt is not None and not os.path.exists(args.base_ckpt):
        raise hub_name_error(args.base_ckpt, "--base_ckpt") or ProjectError(
            f"--base_ckpt {args.base_ckpt} not found", "pass an existing generator checkpoint")


CYCLE0_GIVEN = {  # the cycle-0 models a user may bring instead: the flag, and what the model must be
    "detector_trunk": ("--detector_trunk_ckpt", "a stronger LM of the same data and tokenizer"),
    "judge": ("--judge_ckpt", "an LM of the same data and tokenizer that no arm starts from or is rewarded by"),
}


def cycle0_note(name, preset, base_config, flags):
    """The line printed before cycle 0 trains its detector trunk or judge in a run that brought its own
    generator (--base_ckpt): at GPT-2's vocabulary that training can take longer than the rest of the
    run on a CPU (the quick preset's judge: 10-20 min on 2 cores), and the user may have such a model."""
    flag, what = CYCLE0_GIVEN[name]
    return (f"note: no {flag}: cycle 0 trains the {name.replace('_', ' ')} with the {preset} preset's recipe "
            f"(train.py --config {base_config} {' '.join(flags)}); at a large vocabulary (GPT-2's BPE) it can "
            f"take longer than the rest of the run. To skip it, pass {flag} PATH: {what}")


def base_data_note(args):
    """None for a base model with a recorded train/val split (train.py's checkpoints); for one
    without, the note summary.md carries, given the user's consent (else a clear error before any work)."""
    if args.base_ckpt is None:
        return None
    rec = read_checkpoint(args.base_ckpt).get("data")
    if isinstance(rec, dict) and (rec.get("train_sha256") or rec.get("train_tokens")):
        return None
    if not args.base_data_unknown:
        raise ProjectError(
            f"--base_ckpt {args.base_ckpt} records no train/val split of its training data (a Hugging Face "
            f"directory or a nanoGPT checkpoint): it may have trained on the val text this run measures on",
            f"either fine-tune it on this corpus first, which records the split (python train.py --init_from "
            f"{args.base_ckpt} --data_dir {args.data_dir} --out_dir OUT, then --base_ckpt OUT/ckpt.pt), or pass "
            f"--base_data_unknown to run on it as it is")
    return (f"the base model ({args.base_ckpt}) records no training data: it may have seen the val text, so "
            f"val perplexity and the held-out sample measures may be optimistic for every arm alike "
            f"(--base_data_unknown)")


def step_seed(run, state, n, k=0):
    """Cycle n's seed in this replicate (k = 1: the control arm's MLE); replicate 0 keeps the seeds
    of a run without replicates."""
    return str(run.args.seed + 1000 * n + 100_000 * state.rep + k)


def measure_entering(run, state, n, final_stage):
    """Fresh detectors of the generators entering cycle n (cycle n's seed and directories)."""
    cdir = os.path.join(state.root, f"cycle_{n}")
    seed = step_seed(run, state, n)
    tag = state_tag(state) + (f"final stage (cycle {n}'s detector)" if final_stage else f"cycle {n}")
    replay = ([os.path.join(state.root, f"cycle_{k}", "reward_data") for k in range(1, n)]
              if run.args.replay and not final_stage else [])
    rm, det = run.detector(cdir, state.gen, seed, tag, replay)
    attach_detector(state.gens[state.entering["adversarial"]], det, f"cycle_{n}", final_stage)
    if run.control and state.entering["control"] != state.entering["adversarial"]:
        skip = run.skip_control_detector or (state.rep and REPLICATE_SKIP)
        if skip:
            state.gens[state.entering["control"]]["det_skipped"] = skip
        else:
            _, cdet = run.detector(os.path.join(cdir, "control"), state.ctl_gen, seed, f"{tag} control")
            attach_detector(state.gens[state.entering["control"]], cdet, f"cycle_{n}/control", final_stage)
    return rm, det


def spend(state, arm, *records):
    """Add the steps' FLOPs (their done records' "flops", or a number) to the arm's total, which
    its new generator's summary entry carries."""
    for r in records:
        state.flops[arm] += r if isinstance(r, (int, float)) else flops.total({"step": r.get("flops")})
    return {"compute_flops": state.flops[arm]}


def adversarial_step(run, state, n, rm):
    """Cycle n's GRPO against detector rm, and the new generator's evaluation."""
    cdir = os.path.join(state.root, f"cycle_{n}")
    gr = run.grpo(cdir, state.gen, rm, step_seed(run, state, n), f"{state_tag(state)}cycle {n}")
    ev = run.evaluate(cdir, gr["checkpoint"], f"{state_tag(state)}cycle {n} adversarial")
    b = gr["budget"]
    state.gens[(n, "adversarial")] = {
        **generator_entry(n, "adversarial", ev, state.rep), **spend(state, "adversarial", rm["detector_flops"], gr),
        **{f"grpo_{k}": gr.get(k) for k in ("reward_start", "reward_end", "eval_reward_start",
                                            "eval_reward_end", "kl_final")},
        "grpo_steps": b["steps"], "grpo_updates": b["updates"], "grpo_completion_tokens": b["completion_tokens"],
        "grpo_stop": gr.get("stop_reason")}
    return gr, ev


def null_step(run, state, n, rm):
    """Cycle n's null arm: GRPO from the null arm's generator with the adversarial step's settings,
    seed (prompts and noise) and detector, its rewards shuffled within each group."""
    nd = os.path.join(state.root, f"cycle_{n}", "null")
    gr = run.grpo(nd, state.null_gen, rm, step_seed(run, state, n), f"{state_tag(state)}cycle {n} null arm", null=True)
    ev = run.evaluate(nd, gr["checkpoint"], f"{state_tag(state)}cycle {n} null")
    state.gens[(n, "null")] = {**generator_entry(n, "null", ev, state.rep), **spend(state, "null", rm["detector_flops"], gr),
                               "det_skipped": "the null arm's detectability is not measured",
                               "grpo_updates": gr["budget"]["updates"]}
    state.null_gen = gr["checkpoint"]


def control_step(run, state, n, budget):
    """Cycle n's plain MLE of the control arm on the GRPO step's budget, and its evaluation."""
    cd = os.path.join(state.root, f"cycle_{n}", "control")
    mle = run.control_mle(cd, state.ctl_gen, budget, step_seed(run, state, n, 1), f"{state_tag(state)}cycle {n}")
    cev = run.evaluate(cd, mle["checkpoint"], f"{state_tag(state)}cycle {n} control")
    state.gens[(n, "control")] = {**generator_entry(n, "control", cev, state.rep), **spend(state, "control", mle),
                                  **{f"mle_{k}": mle[k] for k in ("iters", "batch_size", "block_size", "tokens",
                                                                  "learning_rate")},
                                  "mle_train_loss_final": mle.get("train_loss_final")}
    state.ctl_gen = mle["checkpoint"]
    state.entering["control"] = (n, "control")


def spin_step(run, state, n, budget):
    """Cycle n's SPIN iteration of the SPIN arm on the GRPO step's budget, and its evaluation."""
    sd = os.path.join(state.root, f"cycle_{n}", "spin")
    sp = run.spin(sd, state.spin_gen, budget, step_seed(run, state, n), f"{state_tag(state)}cycle {n}")
    sev = run.evaluate(sd, sp["checkpoint"], f"{state_tag(state)}cycle {n} SPIN")
    state.gens[(n, "spin")] = {**generator_entry(n, "spin", sev, state.rep), **spend(state, "spin", sp),
                               "det_skipped": "the SPIN arm's detectability is not measured",
                               **{f"spin_{k}": sp.get(k) for k in ("updates", "completion_tokens", "natural_tokens",
                                                                   "margin_start", "margin_end")}}
    state.spin_gen = sp["checkpoint"]


def ratio_arm_flags(args):
    """train_grpo.py flags of the GRPO arms of --arms, after the preset's."""
    logit = ["--reward", "logit", "--kl_in_reward", "--beta", repr(args.logit_beta), "--advantage", "mean"]
    if args.logit_learning_rate:
        logit += ["--learning_rate", repr(args.logit_learning_rate)]
    return {"logit": logit, "ptx": ["--ptx_coef", repr(args.ptx_coef)]}


def ratio_steps(run, state, n, rm, entering_key, entering_flops):
    """Cycle n's density-ratio arms (--arms sir, logit, ptx), each from the generator that made the
    cycle's detector's negatives (the adversarial arm's entering generator, whose FLOPs so far are
    entering_flops) with the cycle's detector: the residual measure and the SIR point, then GRPO
    with the log-ratio reward and GRPO plus MLE, each evaluated like every generator."""
    cdir = os.path.join(state.root, f"cycle_{n}")
    seed, tag = step_seed(run, state, n), f"{state_tag(state)}cycle {n}"
    entering = state.gens[entering_key]
    gen = entering["generator"]
    cost = entering_flops + rm["detector_flops"]
    shared = {"entering": list(entering_key), "det_skipped": "the density-ratio arms' detectability is not measured"}
    sir = run.sir(os.path.join(cdir, "sir"), gen, rm, entering["frontier"]["1"], seed, f"{tag} SIR")
    state.info[n] = sir["information"]
    if "sir" in run.arms:
        point = sir["point"]
        ev = {"generator": f"SIR of {gen} (n = {sir['n']}, detector {rm['checkpoint']})", **point,
              "frontier": {"1": {k: v for k, v in point.items() if k != "examples"}}}
        state.gens[(n, "sir")] = {**generator_entry(n, "sir", ev, state.rep), **shared, "compute_flops": cost,
                                  "sir_n": sir["n"]}
    for arm, flags in ratio_arm_flags(run.args).items():
        if arm not in run.arms:
            continue
        d = os.path.join(cdir, arm)
        gr = run.grpo(d, gen, rm, seed, f"{tag} {arm} arm", flags=flags)
        ev = run.evaluate(d, gr["checkpoint"], f"{tag} {arm}")
        state.gens[(n, arm)] = {**generator_entry(n, arm, ev, state.rep), **shared,
                                "compute_flops": cost + flops.total({"step": gr.get("flops")}),
                                "grpo_updates": gr["budget"]["updates"], "grpo_kl_final": gr.get("kl_final")}


def cycle_row(state, n, rm, det, gr, ev):
    """summary.json's record of cycle n's adversarial steps."""
    ctl = state.gens.get((n, "control"))
    return {"cycle": n, "replicate": state.rep, "generator": state.gen, "gen_val_loss": state.gen_loss, "gen_val_ppl": state.gen_ppl,
            **{f"rm_{k}": rm.get(k) for k in ("val_mae", "const_mae", "val_loss", "val_corr")},
            "rm_auroc": det["auroc"], "rm_lexicon_mae": det["lexicon_mae"],
            **{f"grpo_{k}": gr.get(k) for k in ("reward_start", "reward_end", "eval_reward_start",
                                                "eval_reward_end", "kl_final")},
            "grpo_stop": gr.get("stop_reason"), "grpo_steps": gr.get("steps"),
            "grpo_updates": gr["budget"]["updates"], "grpo_completion_tokens": gr["budget"]["completion_tokens"],
            "new_generator": ev["generator"], "new_val_loss": ev["val_loss"], "new_val_ppl": ev["val_ppl"],
            "control_generator": ctl["generator"] if ctl else None,
            "control_val_ppl": ctl["val_ppl"] if ctl else None,
            # the residual model's gain over the entering generator, nats per val token (--arms)
            "detector_information": state.info.get(n)}


SAMPLE_PROMPTS = 4  # prompts in samples.md


def write_samples_md(run, gens, matched):
    """samples.md: a few fixed val prompts (a quarter of a sample each), the natural continuation and
    every generator's at T = 1 and, where known, at its matched temperature (matched: (cycle, arm) -> T)."""
    L, seed = run.sample_len, run.args.seed
    P = max(1, L // 4)
    val, tok = val_tokens(run.corpus), corpus_tokenizer(run.corpus)
    nat = natural_blocks(val, SAMPLE_PROMPTS, L, seed)
    columns = []
    for g in gens:
        if g["arm"] == "sir":  # no checkpoint: a sampler over the entering generator's samples
            continue
        model, _, _ = load_model(g["generator"], device=run.device, require_mode="generator")
        temps = [1.0] + ([matched[(g["cycle"], g["arm"])]] if (g["cycle"], g["arm"]) in matched else [])
        for t in temps:
            rows = generated_blocks(model, val, SAMPLE_PROMPTS, L, seed, run.device, t, prompt_len=P)
            columns.append((f"cycle {g['cycle']} {g['arm']}", t, decode_rows(tok, rows[:, P:])))
    path = os.path.join(run.out_dir, "samples.md")
    write_samples(path, decode_rows(tok, nat[:, :P]), decode_rows(tok, nat[:, P:]), columns)
    return path


def code_commit():
    """The commit of the code that ran (with '+dirty' for uncommitted changes), for the results'
    stamp; None outside a git checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def run_meta(run, state, base, trunk, t_start):
    """The run's settings and outcome, for summary.json."""
    args = run.args
    return {"base": base, "stop_reason": state.stop_reason, "final_generator": state.gen,
            "final_val_ppl": state.gen_ppl, "control_final_generator": state.ctl_gen if run.control else None,
            "preset": args.preset, "detector": run.detector_name, "detector_trunk": trunk,
            "data_dir": os.path.abspath(args.data_dir),
            "settings": {"quality_samples": run.quality_samples, "detect_blocks": run.detect_blocks,
                         "sample_len": run.sample_len, "eval_block_size": run.eval_block_size,
                         "seed": args.seed, "seeds": args.seeds, "control": run.control,
                         "control_detector": run.control and not run.skip_control_detector,
                         "final_detector": not run.skip_final_detector,
                         "control_learning_rate": run.control_lr, "replay": args.replay, "spin_arm": args.spin_arm,
                         **({k: getattr(args, k) for k in ("spin_beta", "spin_learning_rate", "spin_nll_coef")}
                            if args.spin_arm else {}),
                         "null_arm": run.null, "judge": run.judge_rec, "arms": args.arms,
                         **({k: getattr(args, k) for k in ("sir_n", "logit_beta", "logit_learning_rate", "ptx_coef")}
                            if set(args.arms) & RATIO_ARMS else {}),
                         "temps": args.temps, "extra": run.extra},
            "base_data_note": run.base_data_note, "commit": code_commit(), "data_source": data_source(run.corpus),
            "command": " ".join(["python", "run_cycles.py"] + sys.argv[1:]),
            "seconds_this_invocation": round(time.time() - t_start, 1)}


REPLICATE_SKIP = "replicates > 0 measure no control or final-stage detectors (replicate 0 does)"


def state_tag(state):
    return f"seed {state.rep}: " if state.rep else ""


def summary_records(states):
    """summary.json's rows and generators over all replicates (cycle 0 once, from replicate 0)."""
    rows = [r for s in states for r in s.rows]
    gens = [g for s in states for k, g in s.gens.items() if s.rep == 0 or k[0] > 0]
    return rows, gens


def run_replicate(run, state, states, max_cycles, reference, base):
    """The cycles of one replicate: detector -> GRPO (adversarial), plain MLE on the same budget
    (control), until --max_cycles or the adversarial arm's val perplexity stops improving."""
    args = run.args
    for n in range(1, max_cycles + 1):
        rm, det = measure_entering(run, state, n, final_stage=False)
        entering_key, entering_flops = state.entering["adversarial"], state.flops["adversarial"]
        gr, ev = adversarial_step(run, state, n, rm)
        if run.arms & RATIO_ARMS:
            ratio_steps(run, state, n, rm, entering_key, entering_flops)
        if run.null:
            null_step(run, state, n, rm)
        if run.control:
            control_step(run, state, n, gr["budget"])
        if run.args.spin_arm:
            spin_step(run, state, n, gr["budget"])
        state.rows.append(cycle_row(state, n, rm, det, gr, ev))
        ctl = f" (control {state.gens[(n, 'control')]['val_ppl']:.3f})" if run.control else ""
        print(f"\n{state_tag(state)}cycle {n}: detector val MAE {fmt(rm.get('val_mae'))} (constant 0.5: "
              f"{fmt(rm.get('const_mae'))}, lexicon {det['lexicon_mae']:.4f}, AUROC {det['auroc']:.3f}), GRPO reward "
              f"{fmt(gr.get('reward_start'))} -> {fmt(gr.get('reward_end'))}, val ppl {state.gen_ppl:.3f} -> "
              f"{ev['val_ppl']:.3f}{ctl}")
        write_summary(run.out_dir, *summary_records(states), reference,
                      {"base": base, "stop_reason": "running", "base_data_note": run.base_data_note})
        state.gen, state.gen_loss, state.gen_ppl = ev["generator"], ev["val_loss"], ev["val_ppl"]
        state.entering["adversarial"] = (n, "adversarial")
        state.last = n
        state.stopper.step(state.gen_ppl)
        if state.stopper.should_stop and n < max_cycles:
            state.stop_reason = (f"val perplexity did not improve by {args.min_delta} for {args.patience} "
                                 f"cycle(s) (best {state.stopper.best:.3f})")
            break
    # the final stage: a fresh detector of each arm's last generator
    skip = run.skip_final_detector or (state.rep and REPLICATE_SKIP)
    if skip:
        for key in set(state.entering.values()):
            if state.gens[key]["detector"] is None:
                state.gens[key]["det_skipped"] = skip
    else:
        measure_entering(run, state, state.last + 1, final_stage=True)


def track_summary(run, gens):
    """The run's figures in TensorBoard (tb/summary) and its W&B group (run 'summary'): each arm's val
    ppl, judge NLL and real-word rate by cycle (replicate 0), each arm's matched-quality val NLL
    difference to each control, and the frontier verdicts as text."""
    tb_dir = "none" if run.tb_root is None else os.path.join(run.tb_root, "summary")
    args = argparse.Namespace(**{**vars(run.args), "tensorboard_dir": tb_dir, "wandb_group": run.wandb_group,
                                 "wandb_run_name": run.args.wandb_run_name or "summary"})
    tracker = open_tracker(args, run.out_dir)
    for g in gens:
        if g["replicate"] == 0:
            tracker.log({"kind": g["arm"], "step": g["cycle"], "val_ppl": g["val_ppl"], "judge_nll": g["judge_nll"],
                         "real_word_rate": g["real_word_rate"]})
    report = frontier_report(gens)
    for n, r in report.items():
        for arm, a in r["arms"].items():
            tracker.log({"kind": f"verdict_{arm}", "step": n,
                         **{f"val_nll_diff_vs_{c}": v["at_quality"]["diff"] for c, v in a["verdicts"].items()
                            if v["at_quality"]["verdict"] != "out of range"}})
    tracker.log_text("verdict", "\n\n".join(frontier_lines(report)) or "no verdict (no control arm)")
    tracker.close()


def main(argv=None):
    global RUN_LOCK_FD
    try:
        run_experiment(argv)
    finally:
        # called in-process (tests, notebooks), another script's end_run() may close the lock's
        # descriptor later: no later run_step may hand its number to a child
        RUN_LOCK_FD = None


def run_experiment(argv=None):
    global RUN_LOCK_FD, PROGRESS_INTERVAL
    args = parse_args(argv)
    check_args(args)
    preset = PRESETS[args.preset]
    out_dir = args.out_dir or os.path.join("runs", preset.get("out_name") or f"shakespeare_char_{args.preset}")
    max_cycles = preset["max_cycles"] if args.max_cycles is None else args.max_cycles
    base_config = args.base_config or preset["base_config"]
    check_writable_dir(out_dir, "--out_dir")
    data_note = base_data_note(args)
    # The steps inherit the lock, so a step orphaned by kill -9 of this process keeps the
    # directory locked until it exits, and a rerun cannot write beside it.
    RUN_LOCK_FD = hold_dir_lock(out_dir, "--out_dir", "run.lock",
                                "another run_cycles.py, or by a step of an interrupted one that is still running")
    PROGRESS_INTERVAL = args.progress_interval
    run = Cycles(args, preset, out_dir)
    run.base_data_note = data_note
    if data_note:  # the split check of the reward data cannot pass: the user consented to that
        run.extra["reward_data"] = run.extra["reward_data"] + ["--allow_split_mismatch"]
        print(f"note: {data_note}")
    t_start = time.time()

    # ---- cycle 0: the base generator, the detector trunk, the natural reference
    ensure_data(args.data_dir, run.log_path)
    base = run.base(base_config)
    print(f"cycle 0 generator: val loss {base['val_loss']:.4f}, ppl {base['val_ppl']:.3f}")
    trunk = run.detector_trunk(base_config)
    run.judge(base_config)
    reference = run.reference()
    c0 = os.path.join(out_dir, "cycle_0")
    # a checkpoint given on the command line has no known cost: its entry says None, the arms count 0 for it
    base_flops = base["flops"] and base["flops"]["flops"]
    trunk_flops = trunk and trunk["flops"] and trunk["flops"]["flops"]
    base_entry = {**generator_entry(0, "base", run.evaluate(c0, base["generator"], "cycle 0")), "compute_flops": base_flops}
    # the compute-matched control: the detector trunk, itself an MLE model of the same data, on the frontier
    trunk_entry = trunk and {**generator_entry(0, "trunk", run.evaluate(os.path.join(c0, "trunk_frontier"),
                                                                        trunk["checkpoint"], "detector trunk")),
                             "compute_flops": trunk_flops,
                             "det_skipped": "the detector trunk is a control, not an arm: its detectability is not measured"}

    # ---- the cycles, once per replicate, each from the cycle-0 generator
    states = []
    for r in range(args.seeds):
        gens0 = {(0, "base"): base_entry if r == 0 else dict(base_entry)}
        if trunk_entry:
            gens0[(0, "trunk")] = trunk_entry
        state = RunState(rep=r, root=out_dir if r == 0 else os.path.join(out_dir, f"seed_{r}"), gens=gens0,
                         gen=base["generator"], gen_loss=base["val_loss"], gen_ppl=base["val_ppl"],
                         ctl_gen=base["generator"], spin_gen=base["generator"], null_gen=base["generator"],
                         flops={"adversarial": (base_flops or 0) + (trunk_flops or 0),
                                "null": (base_flops or 0) + (trunk_flops or 0),
                                "control": base_flops or 0, "spin": base_flops or 0},
                         stopper=EarlyStopping(patience=args.patience, min_delta=args.min_delta, mode="min"),
                         stop_reason=f"max_cycles ({max_cycles}) reached")
        state.stopper.step(base["val_ppl"])
        states.append(state)
        run_replicate(run, state, states, max_cycles, reference, base)

    rows, gens = summary_records(states)
    matched = {(n, arm): t for n, r in frontier_report(gens).items()
               for arm, t in r["matched_temperature"].items() if t is not None}
    write_samples_md(run, [g for g in gens if g["replicate"] == 0], matched)
    md = write_summary(out_dir, rows, gens, reference, run_meta(run, states[0], base, trunk, t_start))
    track_summary(run, gens)
    print("\n" + md)
    print(f"final generator: {states[0].gen}\nsummary: {os.path.join(out_dir, 'summary.md')}, summary.json, "
          f"summary.png, samples.md")


if __name__ == "__main__":
    run_cli(main)
