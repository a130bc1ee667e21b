"""
run_cycles.py's presets and detector recipes, as data: every step's settings are a dict of flag
name -> value, turned into a command line by argv() alone. The user's --extra_* strings are not
data of this kind: they stay raw words, appended after a step's settings (their documented
interface), so they win over the preset.
"""
from lib.rl_settings import GRPO_BETA, GRPO_LEARNING_RATE

# The detector recipes --detector chooses from (the preset names its own). Their settings come after
# the preset's reward-model settings and before --extra_reward_model, so they win over the preset.
DETECTORS = {
    # the design's configuration: frozen generator trunk, MLP head on the last token's state.
    # It stays at chance: K <= N-1, so the last token is always generated text, and a generator's
    # frozen features cannot tell its own samples from natural text (docs/detector.md, issue 9).
    "frozen_last_token": {"unfreeze_last_n_blocks": 0},
    # every position scored (position t natural iff t < K), P(natural) = the mean; whole trunk trained
    "per_position": {"per_position": True, "unfreeze_last_n_blocks": -1},
    # per-position head on the frozen trunk of a STRONGER language model of the same data (the
    # detector trunk, trained in cycle 0 or given by --detector_trunk_ckpt), reading that model's
    # surprisal and entropy of every token: it knows what the generator does not
    "strong_trunk": {"per_position": True, "lm_features": True, "unfreeze_last_n_blocks": 0},
    # strong_trunk's, plus the generator's own surprisal of every token and the trunk's log-ratio to it: the
    # ideal detector's statistic on that trunk, which strong_trunk's features cannot form. Every preset's since
    # it won on the default preset (3 seeds: val MAE 0.185 against 0.228, AUROC 0.965 against 0.852, 12-59 %
    # of the trunk's advantage against 1-8 %; docs/detector.md)
    "ratio_features": {"per_position": True, "lm_features": True, "gen_features": True, "unfreeze_last_n_blocks": 0},
}
NEEDS_TRUNK = {"strong_trunk", "ratio_features"}  # recipes that get --init_trunk_from <detector trunk>

# The control arm's settings, the same in every preset for now: whether it runs, whether its
# generators (and each arm's last one) get fresh detectors, extra train.py settings, and its
# learning rate (None: the learning rate of the cycle's GRPO step). --no_* flags turn them off.
CONTROL_ARM = dict(control_arm=True, control_detector=True, final_detector=True, control={},
                   control_learning_rate=None, null_arm=True)
# GRPO runs a fixed budget in every preset (the arms compare at equal updates): no reward-based stops
FIXED_BUDGET = {"patience": 0, "reward_threshold": 0}

# Settings per preset. Flags given on the command line override single entries
# (--base_config, --max_cycles, ...); `extra_*` flags append raw arguments per step.
PRESETS = {
    # nanoGPT's CPU model (4x128, block 64) as the generator; the detector reads the frozen trunk
    # of the same model trained twice as long (the strongest LM of this data that fits a ~10 minute
    # budget on 2 CPU cores: 8 min 18 s measured); one cycle, then fresh detectors of both arms' generators
    "default": dict(
        base_config="config/train_shakespeare_char_cpu.py",
        base={},
        detector_trunk={"max_iters": 4000, "lr_decay_iters": 4000},
        # the independent judge of sample quality: the trunk's recipe from another seed
        judge={"max_iters": 4000, "lr_decay_iters": 4000},
        max_cycles=1,
        detector="ratio_features",
        reward_data={"samples_per_chunk": 2, "max_blocks_per_split": 2500, "gen_batch_size": 128},
        reward_model={"max_iters": 300, "batch_size": 64, "eval_interval": 50, "learning_rate": 1e-3, "patience": 4},
        grpo={"max_steps": 60, "prompts_per_step": 8, "group_size": 8, "eval_interval": 20,
              "save_interval": 20, "eval_max_batches": 20,  # run_cycles scores the full val set itself
              **FIXED_BUDGET},
        **CONTROL_ARM,
        quality_samples=256,
        detect_blocks=256,
        # the one-seed verdicts' training noise (aa_test.py --run runs/shakespeare_char_default --pairs 8, at
        # 9f22703: 8 pairs of each kind): the SD of a difference between two MLE trainings that differ only in their
        # seeds, past the paired SE, at matched quality (val NLL) and at matched coverage (judge NLL), nats/token
        aa_noise={"continuation": {"quality": 0.0017, "coverage": 0.0179}, "base": {"quality": 0.0085, "coverage": 0.0666}},
    ),
    # a few minutes: the tiny 2x64 model, its 3x-longer-trained copy as the detector trunk, one
    # cycle, small step counts (a smoke run of every step, not a measurement)
    "quick": dict(
        base_config="config/train_shakespeare_char_tiny.py",
        base={},
        detector_trunk={"max_iters": 1800, "lr_decay_iters": 1800, "eval_interval": 300},
        judge={"max_iters": 1800, "lr_decay_iters": 1800, "eval_interval": 300},
        max_cycles=1,
        detector="ratio_features",
        reward_data={"samples_per_chunk": 1, "max_blocks_per_split": 600, "gen_batch_size": 128},
        reward_model={"max_iters": 150, "batch_size": 64, "eval_interval": 50, "learning_rate": 1e-3, "patience": 3},
        grpo={"max_steps": 20, "prompts_per_step": 4, "group_size": 8, "eval_interval": 10,
              "save_interval": 10, "eval_max_batches": 10, "eval_reward_samples": 64, **FIXED_BUDGET},
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
        base={"max_iters": 500, "lr_decay_iters": 500},
        detector_trunk={},
        judge={},
        max_cycles=2,
        detector="ratio_features",
        reward_data={"samples_per_chunk": 2, "max_blocks_per_split": 2500, "gen_batch_size": 128},
        reward_model={"max_iters": 300, "batch_size": 64, "eval_interval": 50, "learning_rate": 1e-3, "patience": 4},
        # 16 prompts and beta 0.1: of the settings tried on this detector (docs/detector.md), the most
        # reward-model gain per unit of val-loss rise
        grpo={"max_steps": 60, "prompts_per_step": 16, "group_size": 8, "beta": 0.1,
              "eval_interval": 20, "save_interval": 20, "eval_max_batches": 20, **FIXED_BUDGET},
        **CONTROL_ARM,
        quality_samples=256,
        detect_blocks=256,
    ),
    # ONE GPU (24-80 GB; measured once on an H100 with random weights, docs/usage.md): GPT-2 124M from a
    # local Hugging Face directory (--base_ckpt, required, with --base_data_unknown: its training data is unknown) on
    # BPE Shakespeare, the detector on the frozen trunk of a larger local GPT-2 (--detector_trunk_ckpt,
    # e.g. gpt2-medium, required). Sequences of 256 tokens everywhere but the val perplexity, which
    # uses the generator's own 1024-token windows. docs/usage.md: the measured peak memory per step.
    "gpt2": dict(
        base_config=None,
        requires=("base_ckpt", "detector_trunk_ckpt", "judge_ckpt"),
        data_dir="data/shakespeare",
        out_name="shakespeare_gpt2",
        base={},
        detector_trunk=None,
        judge=None,
        max_cycles=1,
        detector="ratio_features",
        sample_len=256,
        eval_batch_size=16,
        reward_data={"block_size": 256, "samples_per_chunk": 1, "max_blocks_per_split": 2000, "gen_batch_size": 64},
        reward_model={"max_iters": 600, "batch_size": 32, "eval_interval": 100, "learning_rate": 1e-3, "patience": 3},
        # 64 sequences per step, their backward in micro-batches of 16 (the activations' bound)
        grpo={"seq_len": 256, "max_steps": 100, "prompts_per_step": 8, "group_size": 8, "micro_batch_size": 16,
              "learning_rate": 1e-5, "eval_interval": 25, "save_interval": 25, "eval_max_batches": 20,
              "eval_batch_size": 16, "eval_reward_samples": 128, **FIXED_BUDGET},
        **CONTROL_ARM,
        quality_samples=512,
        detect_blocks=512,
    ),
    # ONE GPU (issue 34, then 61): the trend across scale. The base is nanoGPT's GPU recipe
    # (config/train_shakespeare_char.py: 6 x 6 x 384, block 256, dropout 0.2, batch 64: 10.7 M parameters, 13x the
    # default's 0.8 M) stopped at 1,000 iterations: 16.4 M training tokens, its loss still falling, as the
    # default's generator's is. The detector trunk and the judge: the same recipe to 2,500 iterations (a
    # stronger LM of the same data; the judge from another seed). On tiny Shakespeare that trunk is only 0.078
    # nats/token better than the base (the corpus runs out: 41 epochs), so give it the complete works
    # (--data_dir data/shakespeare_plays, 4.5x the text) to widen the gap with scale, and see gpu_gap for the
    # gap held at the demo's. Eager, not compiled: a compile costs ~20 s per train.py run, more than it saves
    # over 1,000-2,500 small iterations. Evaluations thinned (every 500 iterations, 40 batches): run_cycles
    # scores the full val split itself. Sample lengths, the reward data's N and GRPO's seq_len follow the block
    # size (256, 4x the default's 64). GRPO takes the demo's settings (16 prompts x 8, beta 0.1: of those tried
    # on the demo's detector, the most detector gain per unit of val-loss rise, docs/detector.md); the
    # detector's counts stay the default's (patience 4 stops it near its best). Three cycles: each cycle's
    # detector learns the current generator (no replay: it measured worse on the demo, docs/results.md).
    # gen_batch_size 256: a whole split's rows in a few batches, the decode being launch-bound at this size.
    # Time: 1 cycle with 8 prompts took 5 min 16 s on one H100 (docs/benchmarks.md); 3 cycles of 16 prompts
    # with the ratio arm are estimated at 9-12 min there (not yet run).
    "gpu": dict(
        base_config="config/train_shakespeare_char.py",
        base={"max_iters": 1000, "lr_decay_iters": 1000, "eval_interval": 500, "eval_iters": 40, "compile": "False"},
        detector_trunk={"max_iters": 2500, "lr_decay_iters": 2500, "eval_interval": 500, "eval_iters": 40,
                        "compile": "False"},
        judge={"max_iters": 2500, "lr_decay_iters": 2500, "eval_interval": 500, "eval_iters": 40, "compile": "False"},
        max_cycles=3,
        detector="ratio_features",
        # the default's settings: 2 samples per chunk, 2,500 blocks a split (of 256 tokens now)
        reward_data={"samples_per_chunk": 2, "max_blocks_per_split": 2500, "gen_batch_size": 256},
        reward_model={"max_iters": 300, "batch_size": 64, "eval_interval": 50, "learning_rate": 1e-3, "patience": 4},
        grpo={"max_steps": 60, "prompts_per_step": 16, "group_size": 8, "beta": 0.1,
              "eval_interval": 20, "save_interval": 20, "eval_max_batches": 20, **FIXED_BUDGET},
        **CONTROL_ARM,
        quality_samples=256,
        detect_blocks=256,
        # decoding uncompiled, as training is eager: compiling the decode step costs seconds in each of the
        # processes that decode (reward data, GRPO, run_cycles), more than it saves at a 6-layer model
        decode="static",
        # the base, trunk and judge train at once: each leaves the GPU idle between its small kernels (a
        # 6 x 384 model runs far below the card's rate, docs/benchmarks.md), and two process starts go
        parallel_cycle0=True,
        # and so do a cycle's GRPO steps, then its MLE control (each independent of the others)
        parallel_arms=True,
        # SIR: the detector's information (the residual model's val gain) beside its trunk's advantage, the trend
        # table's "share"; ratio: the ideal detector on that trunk, the ceiling of every detector arm
        arms="sir,ratio",
    ),
}
# data_limit (issue 69): where data, not compute, limits MLE. The first --data_chars D characters of the train split
# (default 50,000; its last dev_fraction the dev slice every choice is made on, the real val split left to the
# verdict), the CPU model trained on a dropout x weight-decay grid, each run stopped at its dev minimum (patience 4
# evaluations of 100 iterations): the best on dev is "MLE at its limit", at once the base, the trunk the detector
# reads (ratio_features then reads the base's own features twice) and the longer-trained control. The judge trains
# on the train split after its first judge_after characters, which no arm sees at any D (its own dev slice from that
# text). Arms: the null, SIR, logit, DDO and SPIN arms; not the ideal detector (the trunk is the base: its
# log-ratio is 0).
START_POINT = {"max_steps": 0}  # an arm_grids point: the generator the arm starts from, trained no further
GRPO_GRID = ({}, START_POINT, {"learning_rate": 3 * GRPO_LEARNING_RATE}, {"beta": GRPO_BETA / 4})
PRESETS["data_limit"] = {
    **{k: PRESETS["default"][k] for k in ("base_config", "judge", "max_cycles", "detector", "reward_data",
                                          "reward_model", "grpo", "quality_samples", "detect_blocks")},
    **CONTROL_ARM,
    # 10 dev batches an evaluation and no dropout 0.4 (0.28 nats worse on dev in all four first grids): a seed in
    # 22 min on 2 cores, not ~50 (measured at D = 50,000; amended before the 3-seed runs, docs/results.md)
    "base": {"max_iters": 3000, "lr_decay_iters": 3000, "eval_interval": 100, "eval_iters": 10, "patience": 4},
    "base_grid": {"dropout": (0.0, 0.2), "weight_decay": (0.1, 1.0)},
    # the best point continued as the same-budget continuation trains (GRPO's learning rate, constant; 48 rows of 64
    # tokens, about GRPO's completion tokens per update), stopped at its dev minimum: first runs showed that regime
    # still gaining on the grid's best point (docs/results.md)
    "base_continued": {"learning_rate": GRPO_LEARNING_RATE, "decay_lr": "False", "warmup_iters": 0, "batch_size": 48,
                       "max_iters": 1000, "eval_interval": 25, "eval_iters": 10, "patience": 4},
    "parallel_cycle0": True, "parallel_arms": True,  # (one torch thread each: on 2 cores more work per second)
    # the table reads cycle 1's detector alone: no detectors of the arms' generators after it (3 a seed)
    "control_detector": False, "final_detector": False,
    "detector_trunk": None, "trunk_is_base": True,
    # the judge's text from 400,000 on: past the more-data control's 2D characters at every D row (D <= 200,000)
    "data_chars": 50_000, "judge_after": 400_000, "dev_fraction": 0.1,
    # the heldout arm (issue 78): its generator trains on the first (1 - h) of the D characters, its detector's natural
    # text is the other h, which that generator never saw (h = 0.2: val AUROC 0.836 against 0.184, docs/results.md)
    "heldout_share": 0.2,
    # every schedule at least 20 passes over its text (the 3,000 iterations of before were 12.8 at D = 200,000, where
    # every seed's dev minimum sat at the cap): the dev minimum strictly inside (report.saturation checks it)
    "base_min_epochs": 20,
    # the pre-registered arms (docs/results.md, the criteria of issue 76 and their amendment for issue 78): GRPO, the
    # heldout arm and DDO, the positive controls; the others (sir, logit, spin, unfrozen, the null arm: --arms, without
    # --no_null_arm) are exploratory
    "arms": "ddo,heldout,more_data,ensemble_kd", "null_arm": False,
    # the pre-registration the verdict reads (verdicts.frontier_report): the more-data control sets each row's margin
    # (a quarter of what doubling D buys MLE at its limit, per matching) and must itself be beyond, else the row is
    # underpowered; Holm covers the primary comparisons alone; the ensemble's student, where beyond MLE at its limit,
    # becomes the strongest control
    # the arms tuned as MLE is (issue 78, experiment/tuning.py): at most MLE's four points each, the recipe ({}) and
    # its start (0 steps) among them, chosen on seed 0's dev slice by the verdict's rule; steps x learning rate x beta
    # for GRPO, the learning rate for DDO
    "arm_grids": {"adversarial": GRPO_GRID, "heldout": GRPO_GRID,
                  "ddo": ({}, START_POINT, {"learning_rate": 3 * GRPO_LEARNING_RATE},
                          {"learning_rate": GRPO_LEARNING_RATE / 3})},
    "design": {"positive": "more_data", "margin_fraction": 0.25, "primary": ("adversarial", "heldout", "ddo"),
               "strongest": "ensemble_kd"},
}
# gpu_gap (issue 61): the gpu preset with the trunk's advantage held at the demo's (0.41 nats/token) rather than
# the 0.078 tiny Shakespeare leaves at this scale, so scale and gap stop moving together in the trend table. The
# base stops at 300 iterations, its own cosine schedule to there (as the demo's base is the CPU model's recipe
# stopped at 500 of 2,000): nanoGPT's GPU run of this recipe is near val loss 1.85-2.0 at iterations 250-300
# (its training curve), about 0.4 above the trunk's 1.46 at 2,500 (measured, docs/gpu_h100). An estimate, not
# yet measured on a GPU: the run's summary measures the gap, and the trend table is keyed by the measured one.
PRESETS["gpu_gap"] = {**PRESETS["gpu"], "base": {**PRESETS["gpu"]["base"], "max_iters": 300, "lr_decay_iters": 300,
                                                 "eval_interval": 150}}
# what a preset leaves out takes these (its run directory is runs/shakespeare_char_<preset>)
# decode: GPT_DECODE for the run and its steps, where the environment does not set it (engine.decoder_choice)
# parallel_cycle0: train the base, detector trunk and judge at once (run_cycles --parallel_cycle0)
# parallel_arms: run a cycle's independent steps at once (run_cycles --parallel_arms)
# arms: run_cycles' --arms where the command line gives none
# data_chars, judge_after, dev_fraction: the data-limited corpus (--data_chars); base_grid: the base's train.py
# settings tried, the best on its val split kept (cycle0.base_grid); base_continued: train.py's settings continuing it
# (cycle0.grid_continued); trunk_is_base: the base is the detector trunk; heldout_share: the heldout arm's h;
# arm_grids: {arm: its grid points} of the arms tuned on the dev slice (experiment/tuning.py)
PRESET_DEFAULTS = dict(requires=(), data_dir="data/shakespeare_char", out_name=None, sample_len=None,
                       eval_batch_size=64, decode="compiled", parallel_cycle0=False, parallel_arms=False, arms="",
                       aa_noise=None, data_chars=None, judge_after=None, dev_fraction=None, base_grid=None,
                       base_continued=None, trunk_is_base=False, base_min_epochs=None, design=None, heldout_share=None,
                       arm_grids=None)

TEMPS = "0.3,0.4,0.5,0.6,0.7,0.8,0.9,1.0,1.1,1.2,1.4,1.7,2.0"  # --temps: every preset's sweep but quick's
JUDGE_SEED_OFFSET = 7919  # the judge's train.py seed is --seed + this: no arm's model shares its draw

# --arms: the arms a run adds to the adversarial, null and control arms
OPTIONAL_ARMS = ("sir", "logit", "ptx", "spin", "ddo", "ratio", "unfrozen", "heldout", "more_data", "ensemble_kd")
POSITIVE_ARMS = ("more_data", "ensemble_kd")  # the data-limited test's positive controls (limit.py trains them)
DATA_LIMIT_ARMS = POSITIVE_ARMS + ("heldout",)  # the arms that need --preset data_limit's cut of the corpus
RATIO_ARMS = {"sir", "logit", "ptx"}  # the arms that use the cycle's detector as a density ratio
# how the report names each arm (experiment/arms.py's table holds the arms themselves)
ARM_TEXT = {"adversarial": "the adversarial arm (GRPO)", "null": "the null arm (GRPO, shuffled rewards)",
            "spin": "the SPIN arm", "ddo": "the DDO arm (the model's log-likelihood ratio as its own discriminator)",
            "sir": "the SIR arm (resampling by the detector's log-ratio)",
            "logit": "the logit arm (GRPO, log-ratio reward, KL in the reward)",
            "ptx": "the ptx arm (GRPO plus MLE)",
            "ratio": "the ideal-detector arm (GRPO on the detector trunk's own log-ratio)",
            "unfrozen": "the unfrozen-trunk arm (GRPO against a detector whose whole trunk trains on the reward data)",
            "heldout": "the held-out-detector arm (GRPO from MLE on (1 - h) D, its detector's natural text the other h D)",
            "more_data": "the more-data control (MLE at its limit on twice the data)",
            "ensemble": "the ensemble of MLE models (a reference)",
            "ensemble_kd": "the ensemble's student (distilled into the base's size)"}


def arm_text(arm):
    """How the report names an arm: a user's arm (run_cycles --arm, compare.py) by its own name."""
    return ARM_TEXT.get(arm, f"the {arm} arm")

# the steps that take --extra_<step>
STEPS = ("base", "detector_trunk", "judge", "reward_data", "reward_model", "grpo", "control", "spin", "ddo", "null")


# --smoke: any preset's steps and flags at tiny sizes (CPU tests of a GPU preset; its figures mean nothing).
# These entries replace the preset's own in each step's settings; everything else stays the preset's.
SMOKE_TRAIN = {"max_iters": 6, "lr_decay_iters": 6, "warmup_iters": 2, "eval_interval": 3, "eval_iters": 2,
               "n_layer": 1, "n_head": 2, "n_embd": 32, "block_size": 32, "batch_size": 8, "compile": "False"}
SMOKE = dict(
    base=SMOKE_TRAIN, detector_trunk=SMOKE_TRAIN, judge=SMOKE_TRAIN,
    base_continued={"max_iters": 4, "eval_interval": 2, "eval_iters": 2, "batch_size": 8},
    reward_data={"max_blocks_per_split": 12, "gen_batch_size": 16},
    reward_model={"max_iters": 10, "eval_interval": 5, "batch_size": 8},
    grpo={"max_steps": 2, "prompts_per_step": 2, "group_size": 4, "eval_interval": 2, "save_interval": 1,
          "eval_max_batches": 2, "eval_reward_samples": 8},
)
# two cycles at most: the iterated game's path (a later cycle's detector on the current generator) at the least cost
SMOKE_RUN = {"quality_samples": 16, "detect_blocks": 16, "eval_batch_size": 16, "temps": "0.5,1.0,2.0"}
SMOKE_CYCLES = 2
SMOKE_MIN_EPOCHS = 2


def preset(name, smoke=False):
    """A preset's settings with PRESET_DEFAULTS filled in; smoke: shrunk by SMOKE (a step the preset does
    not train, such as gpt2's given trunk, stays untrained)."""
    settings = {**PRESET_DEFAULTS, **PRESETS[name]}
    if smoke:
        for step, small in SMOKE.items():
            if settings.get(step) is not None:  # (not a step the preset does not train)
                settings[step] = {**settings[step], **small}
        if settings["base_grid"]:  # two of the grid's points: the choice between them still made
            settings["base_grid"] = {"dropout": settings["base_grid"]["dropout"][:2], "weight_decay": (0.1,)}
        if settings["judge_after"]:  # a tiny corpus: the judge's text right after the D characters
            settings["judge_after"] = None
        if settings["base_min_epochs"]:  # 20 passes stretched a smoke run's 6 iterations to hundreds; 2 still stretch
            settings["base_min_epochs"] = SMOKE_MIN_EPOCHS
        settings.update(SMOKE_RUN, max_cycles=min(settings["max_cycles"], SMOKE_CYCLES))
    return settings


def argv(settings):
    """The command-line words of a step's settings, in their order: True is a switch (--flag), None
    and False leave the flag out, any other value gives --flag value (train.py's boolean flags take
    a value: give them the string "False" or "True")."""
    words = []
    for name, value in settings.items():
        if value is None or value is False:
            continue
        words += [f"--{name}"] if value is True else [f"--{name}", str(value)]
    return words


def ideal_arm_settings(trunk, seq_len):
    """train_grpo.py settings of the ideal-detector arm (--arms ratio): the detector trunk's log-ratio to the
    entering generator as the reward, no detector; the KL to that generator in the reward at beta 1 and a mean
    baseline, so GRPO distils the trunk (objectives.trunk_ratio_rewards); the adversarial arm's sequence length."""
    return {"reward": "trunk_ratio", "trunk_path": trunk, "kl_in_reward": True, "beta": 1.0, "advantage": "mean",
            "seq_len": seq_len}


def ratio_arm_settings(args):
    """train_grpo.py settings of the GRPO arms of --arms (after the preset's and the user's)."""
    logit = {"reward": "logit", "kl_in_reward": True, "beta": args.logit_beta, "advantage": "mean"}
    if args.logit_learning_rate:
        logit["learning_rate"] = args.logit_learning_rate
    return {"logit": logit, "ptx": {"ptx_coef": args.ptx_coef}}

# Each setting has one default, its script's (lib/settings.py, lib/rl_settings.py; for train.py, under the preset's
# config file). A preset that sets a step's flag to another value says why here, by flag, or by (step, flag) where
# the reason is the step's (tests/test_one_default.py checks that every difference has its line, and no line is stale).
SCALE = "the preset's scale: a run of minutes on its hardware, not a standalone run's length and cadence"
WHY_DIFFERS = {
    **dict.fromkeys(("max_iters", "lr_decay_iters", "max_steps", "eval_interval", "eval_iters", "save_interval",
                     "eval_max_batches", "eval_reward_samples", "max_blocks_per_split", "samples_per_chunk"), SCALE),
    **dict.fromkeys(("gen_batch_size", "micro_batch_size", "eval_batch_size"),
                    "memory and speed on the preset's hardware (no result depends on them)"),
    "compile": "eager on the GPU presets' small models: compiling costs more seconds than it saves there",
    ("grpo", "patience"): "GRPO runs a fixed budget in every preset (FIXED_BUDGET): the arms compare at equal updates",
    ("grpo", "reward_threshold"): "the same fixed budget (FIXED_BUDGET): no reward-based stop",
    ("grpo", "prompts_per_step"): "16 on the demo's detector: the most detector gain per unit of val-loss rise "
                                  "(docs/detector.md); 4 in the quick smoke run",
    ("grpo", "beta"): "0.1 on the demo's detector, tried with 16 prompts (docs/detector.md)",
    ("grpo", "learning_rate"): "gpt2: a 124M pretrained model, smaller steps (1e-5)",
    ("grpo", "seq_len"): "gpt2: 256-token sequences everywhere but the val perplexity",
    ("reward_data", "block_size"): "gpt2: 256-token sequences everywhere but the val perplexity",
    ("reward_model", "learning_rate"): "1e-3: the ratio_features head on a frozen trunk's cached features; the "
                                       "script's 1e-4 is for a trunk trained with its head",
    ("reward_model", "batch_size"): "64 cached-feature rows a step: the presets' head trains in seconds",
    ("reward_model", "patience"): "stopped sooner at the presets' few evaluations (every 50-100 iterations)",
    ("base", "patience"): "data_limit: every grid point stopped at its dev minimum (4 evaluations of 100 iterations)",
    **{("base_continued", flag): "data_limit: the grid's best point continued as the same-budget continuation "
                                 "trains (GRPO's learning rate, constant; 48 rows)"
       for flag in ("learning_rate", "decay_lr", "warmup_iters", "batch_size", "patience")},
}
