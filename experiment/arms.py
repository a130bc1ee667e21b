"""
One cycle's step of each arm of run_cycles.py, on the run's Run (experiment/steps.py) and one
replicate's RunState: the fresh detectors of the generators entering a cycle, the adversarial arm
(GRPO against the cycle's detector), the null arm (the same GRPO, rewards shuffled), the control arm
(plain MLE on GRPO's budget), the self-play arms (SPIN, DDO), the density-ratio arms (SIR, logit,
ptx) and the ideal-detector arm (ratio: the detector trunk's own log-ratio). Each records its new
generator's summary.json entry, with the FLOPs the arm has spent so far.
"""
import os
import time
from dataclasses import dataclass, field
from typing import Optional

from core.errors import ProjectError
from core.schedule import EarlyStopping
from experiment import flops, frontier, residual
from experiment.measures import corpus_tokenizer, judge_nll, sample_stats, train_vocabulary, val_tokens
from experiment.presets import ideal_arm_settings, ratio_arm_settings
from experiment.report import attach_detector, generator_entry
from experiment.steps import note_peak, read_done, replicate_root, replicate_seed
from lib.checkpoint import load_model, read_checkpoint


@dataclass
class RunState:
    """What the cycle loop changes: every generator's summary entry, the per-cycle rows, each
    arm's current generator, and the early stopper on the adversarial arm's val perplexity."""
    rep: int                  # the replicate (--seeds), and its directory
    root: str
    trunk: Optional[dict]     # the replicate's detector trunk (its cycle-0 record), None for a recipe without one
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


def start_state(rep, out_dir, base, trunk, gens0, args, max_cycles):
    """Replicate rep's RunState: every arm at the replicate's cycle-0 generator (base, trunk: its cycle-0
    records; gens0: their summary entries), with the cycle-0 FLOPs each arm builds on (the adversarial and
    null arms' detectors read the detector trunk)."""
    base_flops = (base["flops"] and base["flops"]["flops"]) or 0
    trunk_flops = (trunk and trunk["flops"] and trunk["flops"]["flops"]) or 0
    state = RunState(rep=rep, root=replicate_root(out_dir, rep), trunk=trunk, gens=gens0,
                     gen=base["generator"], gen_loss=base["val_loss"], gen_ppl=base["val_ppl"],
                     ctl_gen=base["generator"], play_gen={"spin": base["generator"], "ddo": base["generator"]},
                     null_gen=base["generator"],
                     flops={"adversarial": base_flops + trunk_flops, "null": base_flops + trunk_flops,
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
    return str(replicate_seed(run.args.seed + 1000 * n + k, state.rep))


def summary_records(states):
    """summary.json's rows and generators over all replicates (each with its own cycle 0)."""
    rows = [r for s in states for r in s.rows]
    gens = [g for s in states for g in s.gens.values()]
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
    rm, det = run.detector(cdir, state.gen, seed, tag, replay, state.trunk)
    attach_detector(state.gens[state.entering["adversarial"]], det, f"cycle_{n}", final_stage)
    if run.control and state.entering["control"] != state.entering["adversarial"]:
        if run.skip_control_detector:
            state.gens[state.entering["control"]]["det_skipped"] = run.skip_control_detector
        else:
            _, cdet = run.detector(os.path.join(cdir, "control"), state.ctl_gen, seed, f"{tag} control",
                                   trunk=state.trunk)
            attach_detector(state.gens[state.entering["control"]], cdet, f"cycle_{n}/control", final_stage)
    if state.entering.get("ddo", state.entering["adversarial"]) != state.entering["adversarial"]:
        _, ddet = run.detector(os.path.join(cdir, "ddo"), state.play_gen["ddo"], seed, f"{tag} DDO", trunk=state.trunk)
        attach_detector(state.gens[state.entering["ddo"]], ddet, f"cycle_{n}/ddo", final_stage)
    return rm, det


def final_stage(run, state):
    """After the last cycle: a fresh detector of each arm's last generator (or why none)."""
    skip = run.skip_final_detector
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


def grpo_arms(run, state, n, rm, entering_key):
    """{arm: ScriptStep} of cycle n's GRPO steps, which need nothing but the cycle's detector rm: the
    adversarial, null, logit, ptx and ideal-detector arms', as their steps below run them (run.run_steps runs
    them at once where the run says so; each step then finds its record)."""
    cdir, seed, tag = os.path.join(state.root, f"cycle_{n}"), step_seed(run, state, n), f"{state_tag(state)}cycle {n}"
    entering = state.gens[entering_key]["generator"]
    specs = {"adversarial": run.grpo_spec(cdir, state.gen, rm, seed, tag)}
    if run.null:
        specs["null"] = run.grpo_spec(os.path.join(cdir, "null"), state.null_gen, rm, seed, f"{tag} null arm", null=True)
    for arm, settings in ratio_arm_settings(run.args).items():
        if arm in run.arms:
            specs[arm] = run.grpo_spec(os.path.join(cdir, arm), entering, rm, seed, f"{tag} {arm} arm", settings=settings)
    if "ratio" in run.arms:
        specs["ratio"] = run.grpo_spec(os.path.join(cdir, "ratio"), entering, None, seed, f"{tag} ideal-detector arm",
                                       settings=ideal_arm_settings(state.trunk["checkpoint"], rm.get("block_size")))
    return specs


def budget_arms(run, state, n, budget):
    """{arm: ScriptStep} of cycle n's steps on the GRPO step's budget, which need nothing but that: the
    control's MLE, SPIN's and DDO's, as their steps below run them."""
    cdir, seed, tag = os.path.join(state.root, f"cycle_{n}"), step_seed(run, state, n), f"{state_tag(state)}cycle {n}"
    specs = {"control": run.control_spec(os.path.join(cdir, "control"), state.ctl_gen, budget,
                                         step_seed(run, state, n, 1), tag)} if run.control else {}
    for arm in ("spin", "ddo"):
        if arm in run.arms:
            specs[arm] = run.self_play_spec(os.path.join(cdir, arm), state.play_gen[arm], budget, seed, tag, arm)
    return specs


def adversarial_step(run, state, n, rm):
    """Cycle n's GRPO against detector rm, and the new generator's evaluation."""
    cdir = os.path.join(state.root, f"cycle_{n}")
    gr = run.run_steps([grpo_arms(run, state, n, rm, state.entering["adversarial"])["adversarial"]])[0]
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
    gr = run.run_steps([grpo_arms(run, state, n, rm, state.entering["adversarial"])["null"]])[0]
    ev = run.evaluate(nd, gr["checkpoint"], f"{state_tag(state)}cycle {n} null")
    state.gens[(n, "null")] = {**generator_entry(n, "null", ev, state.rep), **spend(state, "null", rm["detector_flops"], gr),
                               "det_skipped": "the null arm's detectability is not measured",
                               "grpo_updates": gr["budget"]["updates"]}
    state.null_gen = gr["checkpoint"]


def control_step(run, state, n, budget):
    """Cycle n's plain MLE of the control arm on the GRPO step's budget, and its evaluation."""
    cd = os.path.join(state.root, f"cycle_{n}", "control")
    mle = run.run_steps([budget_arms(run, state, n, budget)["control"]])[0]
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
    sp = run.run_steps([budget_arms(run, state, n, budget)[arm]])[0]
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


def sir_step(run, d, gen, rm, entering, seed, label, rep=0):
    """What detector rm knows about gen, the generator that made its negatives: the residual model
    P_gen exp(s) / Z on the frontier's val windows (experiment/residual.py), with Z from --sir_n of gen's own
    continuations per window; and the SIR arm's T = 1 point: the sweep's prompts, --sir_n samples
    each, one kept in proportion to exp(s), scored by the judge; its coverage is the residual
    model's (the lower estimate) over the same windows as every sweep. entering: gen's own T = 1
    sweep point. Its candidates are drawn with the replicate's seed (replicate 0: the sweep's, so its first
    candidate is gen's own T = 1 sample), on the sweep's prompts in every replicate. In d/sir.done.json."""
    noise = replicate_seed(run.args.seed, rep)
    want = {"generator": os.path.abspath(gen), "detector": rm["checkpoint"], "n": run.args.sir_n,
            "samples": run.quality_samples, "sample_len": run.sample_len, "seed": run.args.seed,
            "judge": run.judge_rec["checkpoint"], **({"noise_seed": noise} if rep else {})}
    rec = read_done(d, "sir")
    if rec is not None and all(rec.get(k) == v for k, v in want.items()):
        return rec
    os.makedirs(d, exist_ok=True)
    t0 = time.time()
    model, _, _ = load_model(gen, device=run.device, require_mode="generator")
    det, N = residual.load_detector(rm["checkpoint"], device=run.device)
    if max(run.eval_block_size, run.sample_len) > N:
        raise ProjectError(f"the residual model scores windows of {run.eval_block_size} tokens and samples of "
                           f"{run.sample_len}, longer than the {N} its detector was trained on",
                           "drop sir, logit and ptx from --arms for this preset, or pass --sample_len")
    print(f"{label}: the residual model on {run.eval_block_size}-token val windows and the SIR arm "
          f"({run.quality_samples} prompts), {run.args.sir_n} generator samples each", flush=True)
    val = val_tokens(run.corpus)
    res = residual.val_residual(model, det, N, val, run.eval_block_size, run.args.sir_n, int(seed))
    info = residual.information(res, run.eval_block_size, entering["val_tokens"])
    rows = residual.sir_rows(model, det, N, val, run.quality_samples, run.sample_len, run.args.sir_n,
                             run.args.seed, noise_seed=noise)
    items = judge_nll(run.judge_model, rows, run.device)
    point = {**sample_stats(rows, corpus_tokenizer(run.corpus), train_vocabulary(run.corpus)),
             "judge_nll": float(items.mean()), "judge_items": items.tolist(),
             **residual.residual_point(entering, res, run.eval_block_size, frontier.VAL_ITEMS),
             "sample_len": run.sample_len, "seed": run.args.seed}
    rec = run.mark_done(d, "sir", {**want, "information": {str(m): v for m, v in info.items()}, "point": point,
                                    "seconds": round(time.time() - t0, 1)})
    note_peak(f"{label}: the residual model and SIR")
    return rec


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
    sir = sir_step(run, os.path.join(cdir, "sir"), gen, rm, entering["frontier"]["1"], seed, f"{tag} SIR", state.rep)
    state.info[n] = sir["information"]
    if "sir" in run.arms:
        point = sir["point"]
        ev = {"generator": f"SIR of {gen} (n = {sir['n']}, detector {rm['checkpoint']})", **point,
              "frontier": {"1": {k: v for k, v in point.items() if k != "examples"}}}
        inference = flops.step_sir(read_checkpoint(gen)["model_args"], rm, sir["n"], point.get("samples", run.quality_samples),
                                   point["sample_len"])
        state.gens[(n, "sir")] = {**generator_entry(n, "sir", ev, state.rep), **shared,
                                  "compute_flops": cost + inference["flops"], "sir_inference_flops": inference["flops"],
                                  "sir_n": sir["n"]}
    for arm in ratio_arm_settings(run.args):
        if arm not in run.arms:
            continue
        d = os.path.join(cdir, arm)
        gr = run.run_steps([grpo_arms(run, state, n, rm, entering_key)[arm]])[0]
        ev = run.evaluate(d, gr["checkpoint"], f"{tag} {arm}")
        state.gens[(n, arm)] = {**generator_entry(n, arm, ev, state.rep), **shared,
                                "compute_flops": cost + flops.total({"step": gr.get("flops")}),
                                "grpo_updates": gr["budget"]["updates"], "grpo_kl_final": gr.get("kl_final")}


def ideal_step(run, state, n, rm, entering_key, entering_flops):
    """Cycle n's ideal-detector arm (--arms ratio): GRPO from the generator that made the cycle's detector's
    negatives (the adversarial arm's entering generator, whose FLOPs so far are entering_flops, the trunk's
    included) with the detector trunk's log-ratio to it as the reward, no detector: the most that any detector
    built on that trunk can hand the generator. Its cost: the entering generator's and the GRPO step's (the
    trunk scoring every rollout), no reward data or detector."""
    d, tag = os.path.join(state.root, f"cycle_{n}", "ratio"), f"{state_tag(state)}cycle {n}"
    gr = run.run_steps([grpo_arms(run, state, n, rm, entering_key)["ratio"]])[0]
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
