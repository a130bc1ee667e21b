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

    python run_cycles.py                      # Shakespeare characters on 2 CPU cores (~9 min)
    python run_cycles.py --preset quick       # a few minutes, a much smaller setting
    python run_cycles.py --preset demo        # a weak cycle-0 generator a detector can catch (~30 min)

Outputs: OUT/summary.md, .json and .png: per cycle and arm the generator's measures, its fresh detector's
val MAE (against the constant 0.5 and the lexicon baseline) and AUROC, the GRPO reward and KL, the verdicts.

This file is the outline: the flags, cycle 0, the cycle loop (run_replicate) and the report. The presets
are in experiment/presets.py, the steps and their `<step>.done.json` records in experiment/steps.py, each
arm's step of a cycle in experiment/arms.py, the report in experiment/report.py.
"""
import math
import os
import sys
import time

from core.cli import check_flag_ranges, run_cli
from core.devices import autocast_context, resolve_device, resolve_dtype
from core.errors import ProjectError
from core.files import check_writable_dir, hold_dir_lock, release_dir_lock
from core.process import STOP_SIGNALS, env_default, interrupt_on
from experiment import archive, cycle0, limit, presets
from experiment.arms import ARMS, advance, cycle_row, final_stage, run_cycle, start_state, state_tag, summary_records
from experiment.external import parse_arm
from experiment.cli import check_extra_args, run_cycles_parser
from experiment.mauve_score import unavailable
from experiment.presets import OPTIONAL_ARMS, PRESETS, STEPS, TEMPS
from experiment.report import generator_entry, run_meta, track_summary, write_summary
from experiment.runner import StepRunner, ensure_data, root_path
from experiment.samples import write_samples_md
from experiment.run import Run
from experiment.verdicts import frontier_report
from lib.checkpoint import read_checkpoint
from lib.hf_interop import hub_name_error

FIGURES_AFTER_S = 60  # a cycle this long redraws the summary's figures (seconds beside its minutes); a quicker one,
# as at smoke sizes, leaves them to the run's end


def parse_args(argv=None):
    args = run_cycles_parser().parse_args(argv)
    preset = presets.preset(args.preset, args.smoke)
    if args.data_dir is None:  # the preset's built-in corpus, wherever the run starts
        args.data_dir = root_path(preset["data_dir"])
    for flag in ("eval_batch_size", "sample_len"):  # the preset's where not given
        if getattr(args, flag) is None:
            setattr(args, flag, preset[flag])
    return args


def check_args(args):
    """Refuse bad settings before any step runs."""
    preset = presets.preset(args.preset, args.smoke)
    positive = lambda v: v is None or 0 < v < math.inf  # noqa: E731  (NaN fails too)
    check_flag_ranges(args, "run_cycles.py", empty_ok=("arms", *(f"extra_{step}" for step in STEPS)), rules=[
        ("max_cycles", args.max_cycles is None or args.max_cycles >= 0, ">= 0"),
        ("nproc_per_node", args.nproc_per_node >= 1, ">= 1"),
        ("seeds", args.seeds >= 1, ">= 1"), ("max_at_once", args.max_at_once is None or args.max_at_once >= 1, ">= 1"),
        ("judge_holdout", 0 <= args.judge_holdout < 1, "in [0, 1)"),
        *((f, getattr(args, f) is None or getattr(args, f) >= 2, ">= 2")
          for f in ("quality_samples", "detect_blocks", "sample_len")),
        *((f, positive(getattr(args, f)), "> 0")
          for f in ("spin_beta", "spin_learning_rate", "ddo_alpha", "ddo_beta", "ddo_learning_rate", "sir_n",
                    "logit_beta", "ptx_coef", "logit_learning_rate", "control_learning_rate", "progress_interval")),
        ("ddo_rounds", args.ddo_rounds >= 1, ">= 1"), ("arm_timeout", 0 < args.arm_timeout < math.inf, "> 0 seconds"),
        ("spin_nll_coef", 0 <= args.spin_nll_coef < math.inf, ">= 0")])
    args.temps = args.temps or preset.get("temps") or TEMPS
    try:
        temps = sorted({float(t) for t in args.temps.split(",")})
    except ValueError:
        raise ProjectError(f"--temps {args.temps!r} is not a comma-separated list of numbers",
                           "e.g. --temps 0.6,0.8,1.0,1.2") from None
    if 1.0 not in temps or not all(0 < t < math.inf for t in temps):
        raise ProjectError(f"--temps {args.temps!r} must be positive, finite and include 1.0",
                           "e.g. --temps 0.6,0.8,1.0,1.2")
    args.temps = temps
    if args.arms is None:  # the preset's: the gpu preset measures the detector's information (sir)
        args.arms = preset["arms"]
    arms = {a.strip() for a in args.arms.split(",") if a.strip()}
    if arms - set(OPTIONAL_ARMS):
        raise ProjectError(f"--arms {args.arms!r}: unknown arm(s) {', '.join(sorted(arms - set(OPTIONAL_ARMS)))}",
                           f"choose from {', '.join(OPTIONAL_ARMS)}, comma-separated")
    args.arms = sorted(arms)
    taken = {a.name for a in ARMS}
    for spec in args.arm:  # each --arm checked now, before any step runs
        taken.add(parse_arm(spec, taken)[0])
    for flag in PRESETS[args.preset].get("requires", ()):
        if getattr(args, flag) is None:
            raise ProjectError(f"--preset {args.preset} needs --{flag}",
                               "pass local Hugging Face GPT-2 directories (nothing is downloaded): --base_ckpt "
                               "DIR (e.g. gpt2, 124M), --detector_trunk_ckpt DIR (a larger one, e.g. gpt2-medium) "
                               "and --judge_ckpt DIR (an independent judge, e.g. gpt2-large), saved beforehand "
                               "with save_pretrained")
    if args.data_chars is not None and (PRESETS[args.preset].get("data_chars") is None or args.judge_holdout):
        raise ProjectError("--data_chars is the data-limited test's: it cuts the corpus and the judge's text itself",
                           "use --preset data_limit, without --judge_holdout")
    if set(args.arms) & set(presets.DATA_LIMIT_ARMS) and not preset["data_chars"]:
        raise ProjectError(f"--arms {','.join(sorted(set(args.arms) & set(presets.DATA_LIMIT_ARMS)))}: the "
                           "data-limited test's arms (they cut its D characters)", "use them with --preset data_limit")
    if preset["data_chars"] and not args.base_ckpt:  # a dev slice of one window at least, said before any step
        base_config = args.base_config or (preset["base_config"] and root_path(preset["base_config"]))
        cycle0.check_data_chars(args.data_chars or preset["data_chars"], preset,
                                cycle0.config_block_size(base_config, preset["base"], args.extra_base.split()))
    if args.compute_control and (args.base_ckpt or preset["base"] is None or args.no_control):
        raise ProjectError("--compute_control trains the base recipe longer, and this run trains no base of its own "
                           "(--base_ckpt, or a preset without a base recipe) or has no MLE controls (--no_control)",
                           "drop --compute_control, or let cycle 0 train the base")
    if args.base_ckpt is not None and not os.path.exists(args.base_ckpt):
        raise hub_name_error(args.base_ckpt, "--base_ckpt") or ProjectError(
            f"--base_ckpt {args.base_ckpt} not found", "pass an existing generator checkpoint")
    why = args.mauve_features and unavailable(args.mauve_features)
    if why:  # asked for: refused now, not left out of the tables after hours of steps
        raise ProjectError(f"--mauve_features {args.mauve_features}: {why}",
                           "pass a local Hugging Face GPT-2 directory saved with save_pretrained (MAUVE also needs "
                           "pip install mauve-text), or drop --mauve_features")
    unused = unused_steps(args, preset)
    for step, why in unused.items():  # said now, not found missing in the results
        if getattr(args, f"extra_{step}"):
            print(f"warning: --extra_{step} is ignored: {why}", file=sys.stderr)
    check_extra_args(args, skip=unused)  # by the steps' own parsers (--base_config too), in seconds


def unused_steps(args, preset):
    """{step: why it does not run} for the steps that take --extra_<step>."""
    given = {step: f"--{step}_ckpt is given, so that model is not trained"
             for step in ("base", "detector_trunk", "judge") if getattr(args, f"{step}_ckpt")}
    arms = {arm: f"the {arm} arm is not in --arms" for arm in ("spin", "ddo") if arm not in args.arms}
    null_off = args.no_null_arm or not preset["null_arm"]
    return {**given, **arms, **({"null": "the null arm is off"} if null_off else {})}


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


def fmt(v, spec=".4f"):
    return "-" if v is None else format(v, spec)


def cycle0_entries(run, base, trunk, rep):
    """summary.json's entries of replicate rep's cycle 0: the base generator and the detector trunk (the
    longer-trained MLE control, on the frontier; None without one). A checkpoint given on the command line has
    no known cost: its entry says None, the arms count 0 for it."""
    c0 = cycle0.cycle0_dir(run, rep)
    base_entry = {**generator_entry(0, "base", run.evaluate(c0, base["generator"], f"{cycle0.rep_tag(rep)}cycle 0"),
                                    rep), "compute_flops": base["flops"] and base["flops"]["flops"],
                  "at_cap": base.get("at_cap", False)}
    if not trunk:
        return base_entry, None
    ev = run.evaluate(os.path.join(c0, "trunk_frontier"), trunk["checkpoint"], f"{cycle0.rep_tag(rep)}detector trunk")
    return base_entry, {**generator_entry(0, "trunk", ev, rep),
                        "compute_flops": trunk["flops"] and trunk["flops"]["flops"],
                        "det_skipped": "the detector trunk is a control, not an arm: its detectability is not measured"}


def compute_entry(run, base_config, rep, target_flops):
    """summary.json's entry of replicate rep's compute-matched MLE control (--compute_control), on the frontier."""
    rec = cycle0.compute_control(run, base_config, rep, target_flops)
    ev = run.evaluate(os.path.join(cycle0.cycle0_dir(run, rep), "compute_frontier"), rec["checkpoint"],
                      f"{cycle0.rep_tag(rep)}compute-matched control")
    return {**generator_entry(0, "compute", ev, rep), "compute_flops": rec["flops"] and rec["flops"]["flops"],
            "target_flops": rec["target_flops"], "iters": rec["iters"],
            "det_skipped": "the compute-matched control is a control, not an arm: its detectability is not measured"}


def more_data_entry(run, base_config, rep):
    """summary.json's entry of replicate rep's more-data control (the data-limited test's positive control)."""
    rec = limit.more_data(run, base_config, rep)
    ev = run.evaluate(os.path.join(cycle0.cycle0_dir(run, rep), "more_data_frontier"), rec["generator"],
                      f"{cycle0.rep_tag(rep)}more-data control")
    return {**generator_entry(1, "more_data", ev, rep), "compute_flops": rec["flops"] and rec["flops"]["flops"],
            "at_cap": rec.get("at_cap", False),
            "det_skipped": "the more-data control is a positive control: its detectability is not measured"}


def ensemble_entries(run, base_config, rep):
    """summary.json's entries of replicate rep's ensemble of MLE models and its distilled student (cycle 1)."""
    rec = limit.ensemble(run, base_config, rep)
    c0, tag, why = cycle0.cycle0_dir(run, rep), cycle0.rep_tag(rep), "a positive control: its detectability is not measured"
    ens = run.evaluate(os.path.join(c0, "ensemble", "frontier"), rec["members"], f"{tag}the ensemble")
    kd = run.evaluate(os.path.join(c0, "ensemble", "student_frontier"), rec["student"], f"{tag}the ensemble's student")
    return {(1, "ensemble"): {**generator_entry(1, "ensemble", ens, rep), "compute_flops": rec["ensemble_flops"],
                              "det_skipped": why},
            (1, "ensemble_kd"): {**generator_entry(1, "ensemble_kd", kd, rep), "compute_flops": rec["student_flops"],
                                 "det_skipped": why}}


def run_replicate(run, state, states, max_cycles, reference, base):
    """The cycles of one replicate (experiment/arms.py's run_cycle: the entering generators' detectors, then every
    arm of the table), until --max_cycles or the adversarial arm's val perplexity stops improving; then the final
    stage's detectors."""
    args = run.args
    records = run.records  # the steps done so far: a cycle that only resumed leaves the summary to the end
    for n in range(1, max_cycles + 1):
        t_cycle = time.monotonic()
        rm, det, c, recs = run_cycle(run, state, n)
        gr, ev = recs["adversarial"], recs[("adversarial", "eval")]
        state.rows.append(cycle_row(state, n, rm, det, gr, ev))
        ctl = f" (control {state.gens[(n, 'control')]['val_ppl']:.3f})" if run.control else ""
        print(f"\n{state_tag(state)}cycle {n}: detector val MAE {fmt(rm.get('val_mae'))} (constant 0.5: "
              f"{fmt(rm.get('const_mae'))}, lexicon {det['lexicon_mae']:.4f}, AUROC {det['auroc']:.3f}), GRPO reward "
              f"{fmt(gr.get('reward_start'))} -> {fmt(gr.get('reward_end'))}, val ppl {state.gen_ppl:.3f} -> "
              f"{ev['val_ppl']:.3f}{ctl}")
        if run.records != records:  # a summary to watch a run by, not redrawn for a rerun of finished cycles
            write_summary(run.out_dir, *summary_records(states), reference,
                          {"base": base, "stop_reason": "running", "base_data_note": run.base_data_note,
                           "data_dir": os.path.abspath(args.data_dir)},
                          figures=time.monotonic() - t_cycle >= FIGURES_AFTER_S)
            records = run.records
        advance(run, state, c, recs)
        state.last = n
        state.stopper.step(state.gen_ppl)
        if state.stopper.should_stop and n < max_cycles:
            state.stop_reason = (f"val perplexity did not improve by {args.min_delta} for {args.patience} "
                                 f"cycle(s) (best {state.stopper.best:.3f})")
            break
    final_stage(run, state)


def main(argv=None):
    args = parse_args(argv)
    check_args(args)
    preset = presets.preset(args.preset, args.smoke)
    args.data_chars = args.data_chars or preset["data_chars"]
    out_dir = args.out_dir or os.path.join("runs", preset["out_name"] or f"shakespeare_char_{args.preset}"
                                           + (f"_{args.data_chars}" if args.data_chars else ""))
    max_cycles = preset["max_cycles"] if args.max_cycles is None else args.max_cycles
    base_config = args.base_config or (preset["base_config"] and root_path(preset["base_config"]))
    check_writable_dir(out_dir, "--out_dir")
    data_note = base_data_note(args)
    # the steps inherit the lock (StepRunner), so a step orphaned by kill -9 of this process keeps the
    # directory locked until it exits, and a rerun cannot write beside it
    lock_fd = hold_dir_lock(out_dir, "--out_dir", "run.lock",
                            "another run_cycles.py, or by a step of an interrupted one that is still running")
    runner = StepRunner(os.path.join(out_dir, "steps.log"), lock_fd, args.progress_interval, args.nproc_per_node,
                        warm=not args.cold_steps and StepRunner.warm_on(resolve_device(args.device)))
    try:
        if args.data_chars:  # every step reads the first D characters; the verdict alone the val split
            ensure_data(args.data_dir, runner)
            args.eval_data_dir = args.data_dir
            args.data_dir, args.judge_data_dir = cycle0.data_limit(args.data_dir, out_dir, args.data_chars, preset)
            if "more_data" in args.arms:
                args.more_data_dir = cycle0.more_data_dir(args.eval_data_dir, out_dir, args.data_chars, preset)
            if "heldout" in args.arms:
                args.heldout_dirs = cycle0.heldout_dirs(args.data_dir, out_dir, preset["heldout_share"])
        elif args.judge_holdout:  # every step reads the arms' part; the judge alone its held-out part
            if args.judge_ckpt:  # (a twin judge of the arms' part, say: the held-out part then goes unused)
                print(f"note: --judge_ckpt {args.judge_ckpt} judges; the held-out part of --judge_holdout is not used")
            ensure_data(args.data_dir, runner)
            args.data_dir, args.judge_data_dir = cycle0.judge_holdout(args.data_dir, out_dir, args.judge_holdout)
        run = Run(args, preset, out_dir, runner, data_note)
        if data_note:  # the reward data's split check cannot pass: the user consented to that
            print(f"note: {data_note}")
        # run_cycles' own measurements (val perplexity, sweeps, detectors, samples) at the steps' precision;
        # SIGTERM and SIGHUP stop the run as Ctrl-C does: the running step's process group with it, then
        # run_cli's message (StepRunner); the preset's decoder for this process's decodes and its steps'
        with interrupt_on(*STOP_SIGNALS), autocast_context(run.device, resolve_dtype(args.dtype, run.device)), \
                env_default("GPT_DECODE", preset["decode"]):
            experiment(run, args, out_dir, max_cycles, base_config)
    finally:
        runner.close()  # the warm launcher, if the steps had one
    release_dir_lock(out_dir, "run.lock")  # finished: no run.lock left in the directory (an interrupted run keeps it)


def experiment(run, args, out_dir, max_cycles, base_config):
    """Cycle 0, the cycles of every replicate, the report."""
    t_start = time.time()
    ensure_data(args.data_dir, run.runner)
    # ---- every replicate: its own cycle 0 (base generator, detector trunk; the judge and the natural
    # reference once, in replicate 0), then its cycles from that base
    states = []
    for r in range(args.seeds):
        done = archive.finished_replicate(run, r, base_config)  # restored from an archive: no checkpoint read
        if done:
            states.append(done[0])
            base, trunk, reference = done[1:] if r == 0 else (base, trunk, reference)
            continue
        if run.parallel_cycle0:
            cycle0.train_together(run, base_config, r)
            limit.train_together(run, base_config, r)  # (a seed past 0: its grid points and ensemble members)
        base_r = cycle0.base(run, base_config, r)
        print(f"{cycle0.rep_tag(r)}cycle 0 generator: val loss {base_r['val_loss']:.4f}, ppl {base_r['val_ppl']:.3f}")
        trunk_r = cycle0.detector_trunk(run, base_config, r)
        if r == 0:
            base, trunk = base_r, trunk_r
            cycle0.judge(run, base_config)
            reference = run.reference()
        base_entry, trunk_entry = cycle0_entries(run, base_r, trunk_r, r)
        gens0 = {(0, "base"): base_entry, **({(0, "trunk"): trunk_entry} if trunk_entry else {})}
        starts = {}
        if "heldout" in args.arms:  # its own generator: MLE on (1 - h) D
            held = limit.heldout_base(run, base_config, r)
            starts["heldout"] = (held["generator"], held["flops"])
        states.append(start_state(run, r, (base_r, trunk_r), gens0, max_cycles, starts))
        run_replicate(run, states[-1], states, max_cycles, reference, base)
        if run.eval_data_dir != run.data_dir:  # --data_chars: is MLE at its limit? (report.saturation)
            for key in [(0, "base")] + [(n, "control") for n in range(1, states[-1].last + 1)]:
                if key in states[-1].gens:
                    states[-1].gens[key]["dev_loss"] = run.dev_loss(states[-1].gens[key]["generator"])
        if "more_data" in args.arms:  # the positive control, on the frontier as an arm is (cycle 1)
            states[-1].gens[(1, "more_data")] = more_data_entry(run, base_config, r)
        if "ensemble_kd" in args.arms:  # the ensemble (a reference) and its student (an arm)
            states[-1].gens.update(ensemble_entries(run, base_config, r))
        if args.compute_control:
            states[-1].gens[(0, "compute")] = compute_entry(run, base_config, r, states[-1].arms["adversarial"].flops)
        archive.save_replicate(run, states[-1], base_r, trunk_r)

    # ---- the report
    rows, gens = summary_records(states)
    write_samples_md(run, gens, frontier_report(gens, run.train_noise, run.preset.get("design")), run.kept_samples)
    md = write_summary(out_dir, rows, gens, reference, run_meta(run, states[0], base, trunk, t_start))
    track_summary(run, gens)
    print("\n" + md)
    print(f"final generator: {states[0].gen}\nsummary: {os.path.join(out_dir, 'summary.md')}, summary.json, "
          f"summary.png, samples.md")


if __name__ == "__main__":
    run_cli(main)
