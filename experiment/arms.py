"""
One cycle's step of each arm of run_cycles.py, on the run's Run (experiment/steps.py) and one
replicate's RunState: the fresh detectors of the generators entering a cycle, the adversarial arm
(GRPO against the cycle's detector), the null arm (the same GRPO, rewards shuffled), the control arm
(plain MLE on GRPO's budget), the self-play arms (SPIN, DDO), the density-ratio arms (SIR, logit,
ptx) and the ideal-detector arm (ratio: the detector trunk's own log-ratio). Each records its new generator's summary.json entry, with the FLOPs the arm has spent
so far.
"""
import os
from dataclasses import dataclass, field

from core.schedule import EarlyStopping
from experiment import flops
from experiment.presets import ideal_arm_settings, ratio_arm_settings
from experiment.report import attach_detector, generator_entry

REPLICATE_SKIP = "replicates > 0 measure no control or final-stage detectors (replicate 0 does)"


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
    play_gen: dict            # the self-play arms' ("spin", "ddo": --arms)
    null_gen: str             # the null arm's (GRPO with shuffled rewards)
    flops: dict               # arm -> its total training and generation FLOPs so far (flops.py)
    stopper: EarlyStopping
    entering: dict = field(default_factory=lambda: {"adversarial": (0, "base"), "control": (0, "base")})
    rows: list = field(default_factory=list)
    last: int = 0
    stop_reason: str = ""
    info: dict = field(default_factory=dict)  # cycle -> the detector's information (--arms)


def start_state(rep, out_dir, base, gens0, trunk_flops, args, max_cycles):
    """Replicate rep's RunState: every arm at the cycle-0 generator (base: its record; gens0: cycle 0's
    summary entries), with the cycle-0 FLOPs each arm builds on (the adversarial and null arms' detectors
    read the detector trunk)."""
    base_flops = (base["flops"] and base["flops"]["flops"]) or 0
    state = RunState(rep=rep, root=out_dir if rep == 0 else os.path.join(out_dir, f"seed_{rep}"), gens=gens0,
                     gen=base["generator"], gen_loss=base["val_loss"], gen_ppl=base["val_ppl"],
                     ctl_gen=base["generator"], play_gen={"spin": base["generator"], "ddo": base["generator"]},
                     null_gen=base["generator"],
                     flops={"adversarial": base_flops + (trunk_flops or 0), "null": base_flops + (trunk_flops or 0),
                            "control": base_flops, "spin": base_flops, "ddo": base_flops},
                     stopper=EarlyStopping(patience=args.patience, min_delta=args.min_delta, mode="min"),
                     stop_reason=f"max_cycles ({max_cycles}) reached")
    state.stopper.step(base["val_ppl"])
    return state


def state_tag(state):
    return f"seed {state.rep}: " if state.rep else ""


def step_seed(run, state, n, k=0):
    """Cycle n's seed in this replicate (k = 1: the control arm's MLE); replicate 0 keeps the seeds
    of a run without replicates."""
    return str(run.args.seed + 1000 * n + 100_000 * state.rep + k)


def summary_records(states):
    """summary.json's rows and generators over all replicates (cycle 0 once, from replicate 0)."""
    rows = [r for s in states for r in s.rows]
    gens = [g for s in states for k, g in s.gens.items() if s.rep == 0 or k[0] > 0]
    return rows, gens


def measure_entering(run, state, n, final_stage):
    """Fresh detectors of the generators entering cycle n (cycle n's seed and directories): the
    adversarial arm's, the control's and the DDO arm's (the latter two from cycle 2 and in the final
    stage; cycle 1's is shared)."""
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
    if state.entering.get("ddo", state.entering["adversarial"]) != state.entering["adversarial"]:
        if state.rep:
            state.gens[state.entering["ddo"]]["det_skipped"] = REPLICATE_SKIP
        else:
            _, ddet = run.detector(os.path.join(cdir, "ddo"), state.play_gen["ddo"], seed, f"{tag} DDO")
            attach_detector(state.gens[state.entering["ddo"]], ddet, f"cycle_{n}/ddo", final_stage)
    return rm, det


def final_stage(run, state):
    """After the last cycle: a fresh detector of each arm's last generator (or why none)."""
    skip = run.skip_final_detector or (state.rep and REPLICATE_SKIP)
    if skip:
        for key in set(state.entering.values()):
            if state.gens[key]["detector"] is None:
                state.gens[key]["det_skipped"] = skip
    else:
        measure_entering(run, state, state.last + 1, final_stage=True)


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


def self_play_step(run, state, n, budget, arm):
    """Cycle n's step of a self-play arm on the GRPO step's budget, from its own previous generator,
    and its evaluation: arm "spin" (one SPIN iteration) or "ddo" (DDO's --ddo_rounds self-play
    rounds, its generators measured by fresh detectors like the control's)."""
    sd = os.path.join(state.root, f"cycle_{n}", arm)
    sp = run.self_play(sd, state.play_gen[arm], budget, step_seed(run, state, n), f"{state_tag(state)}cycle {n}", arm)
    sev = run.evaluate(sd, sp["checkpoint"], f"{state_tag(state)}cycle {n} {arm.upper()}")
    state.gens[(n, arm)] = {**generator_entry(n, arm, sev, state.rep), **spend(state, arm, sp),
                            **{f"{arm}_{k}": sp.get(k) for k in ("updates", "completion_tokens", "natural_tokens",
                                                                 "margin_start", "margin_end")}}
    if arm == "spin":
        state.gens[(n, arm)]["det_skipped"] = "the SPIN arm's detectability is not measured"
    else:
        state.gens[(n, arm)]["ddo_round_starts"] = sp.get("round_starts")
        state.entering[arm] = (n, arm)  # the next cycle's (or the final stage's) detector measures it
    state.play_gen[arm] = sp["checkpoint"]


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
    for arm, settings in ratio_arm_settings(run.args).items():
        if arm not in run.arms:
            continue
        d = os.path.join(cdir, arm)
        gr = run.grpo(d, gen, rm, seed, f"{tag} {arm} arm", settings=settings)
        ev = run.evaluate(d, gr["checkpoint"], f"{tag} {arm}")
        state.gens[(n, arm)] = {**generator_entry(n, arm, ev, state.rep), **shared,
                                "compute_flops": cost + flops.total({"step": gr.get("flops")}),
                                "grpo_updates": gr["budget"]["updates"], "grpo_kl_final": gr.get("kl_final")}


def ideal_step(run, state, n, entering_key, entering_flops, seq_len):
    """Cycle n's ideal-detector arm (--arms ratio): GRPO from the generator that made the cycle's detector's
    negatives (the adversarial arm's entering generator, whose FLOPs so far are entering_flops, the trunk's
    included) with the detector trunk's log-ratio to it as the reward, no detector: the most that any detector
    built on that trunk can hand the generator. Its cost: the entering generator's and the GRPO step's (the
    trunk scoring every rollout), no reward data or detector."""
    cdir, tag = os.path.join(state.root, f"cycle_{n}"), f"{state_tag(state)}cycle {n}"
    entering = state.gens[entering_key]
    d = os.path.join(cdir, "ratio")
    gr = run.grpo(d, entering["generator"], None, step_seed(run, state, n), f"{tag} ideal-detector arm",
                  settings=ideal_arm_settings(run.trunk["checkpoint"], seq_len))
    ev = run.evaluate(d, gr["checkpoint"], f"{tag} ratio")
    state.gens[(n, "ratio")] = {**generator_entry(n, "ratio", ev, state.rep), "entering": list(entering_key),
                                "det_skipped": "the ideal-detector arm's detectability is not measured",
                                "compute_flops": entering_flops + flops.total({"step": gr.get("flops")}),
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
