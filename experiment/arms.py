"""
The arms of run_cycles.py, as data: ARMS, one entry per arm, says what the arm starts from each cycle, its step on
the cycle's detector or budget, how its FLOPs are counted and its summary.json fields. A replicate's cycle (run_cycle)
runs the table on the run's Run (experiment/run.py) and the replicate's RunState: the fresh detectors of the
generators entering the cycle, then the arms that need only the cycle's detector (the adversarial arm's GRPO, whose
record sets the budget, beside them), then the arms on that budget, each phase's scripts by one Run.run_steps (at
once or in turn), then each new generator's evaluation and summary entry, with the FLOPs its arm has spent so far.
"""
import os
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Optional

from core.errors import ProjectError
from core.schedule import EarlyStopping
from experiment import flops, frontier, residual, tuning
from experiment.measures import corpus_tokenizer, judge_nll, sample_stats, train_vocabulary, val_tokens
from experiment.presets import RATIO_ARMS, ideal_arm_settings, ratio_arm_settings
from experiment.report import attach_detector, generator_entry
from experiment.steps import note_peak, read_done, replicate_root, replicate_seed
from lib.checkpoint import load_model, read_checkpoint


@dataclass(frozen=True)
class Cycle:
    """What every arm's step of cycle n of a replicate reads."""
    n: int
    dir: str                 # the cycle's directory (an arm's own: dir/<arm>, the adversarial arm's: dir)
    seed: str                # the cycle's seed
    tag: str                 # its label in the logs
    rm: dict                 # the cycle's detector (its reward model's record, with its FLOPs)
    entering: tuple          # the summary key of the generator the detector learned (the adversarial arm's)
    entering_flops: float    # that generator's FLOPs so far
    budget: Optional[dict] = None  # the adversarial GRPO step's budget, which the budget phase's arms match
    rms: dict = field(default_factory=dict)   # recipe -> (rm, det) of the arms' own detectors (Arm.recipe)
    point: dict = field(default_factory=dict)  # a tuned arm's grid point: its settings over its recipe (tuning.py)


@dataclass
class ArmState:
    """One arm's changing state in a replicate."""
    gen: str                         # its current generator
    flops: Optional[float]           # its FLOPs so far (None: unknown; unused by arms from the entering generator)
    entering: Optional[tuple] = None  # the summary key of its current generator (the arms a detector measures)


@dataclass(frozen=True)
class Arm:
    """One arm, as data. phase: "detector", its step needs the cycle's detector only; "budget", also the adversarial
    GRPO step's budget. start: "own", each cycle from its own last generator; "entering", from the generator the cycle's
    detector learned. spec(run, state, c, arm): its step (a ScriptStep), or None with measure(run, state, c, recs) ->
    (record, eval) for an arm made in this process (SIR). fields(record): its summary.json fields. on(run): whether the
    run has it. FLOPs: its start's (trunk_flops: the detector trunk's too), then the cycle's detector's
    (detector_flops) and its step's (its record's "flops", or extra_flops(record))."""
    name: str
    label: str
    phase: str
    start: str
    spec: Optional[Callable]
    fields: Callable
    on: Callable
    measure: Optional[Callable] = None
    trunk_flops: bool = False
    detector_flops: bool = True
    extra_flops: Optional[Callable] = None
    measured: bool = False  # a fresh detector measures its generators (the next cycle's, the final stage's)
    recipe: Optional[str] = None  # its own detector's recipe (on the cycle's reward data), else the cycle's
    # its own detector on reward data of its own (run, state, c, arm) -> (rm, det), in c.rms[name], else the cycle's
    detector: Optional[Callable] = None
    skip_detector: Callable = lambda run: None  # why its detectors are skipped (None: they are not)
    det_skipped: Optional[str] = None  # why its generators get none

    def dir(self, c):
        return c.dir if self.name == "adversarial" else os.path.join(c.dir, self.name)

    def own_rm(self, c):
        """(rm, det) of its own detector in cycle c (Arm.recipe, Arm.detector), None where it reads the cycle's."""
        return c.rms[self.recipe] if self.recipe else c.rms[self.name] if self.detector else None


def grpo_fields(rec):
    return {"grpo_updates": rec["budget"]["updates"], "grpo_kl_final": rec.get("kl_final")}


def entering_gen(state, c):
    return state.gens[c.entering]["generator"]


ADVERSARIAL = Arm(
    "adversarial", "adversarial", "detector", "own", trunk_flops=True, measured=True,
    spec=lambda run, state, c, arm: run.grpo_spec(c.dir, state.arms["adversarial"].gen, c.rm, c.seed, c.tag,
                                                  settings=c.point),
    fields=lambda rec: {**{f"grpo_{k}": rec.get(k) for k in ("reward_start", "reward_end", "eval_reward_start",
                                                             "eval_reward_end", "kl_final")},
                        "grpo_steps": rec["budget"]["steps"], "grpo_updates": rec["budget"]["updates"],
                        "grpo_completion_tokens": rec["budget"]["completion_tokens"],
                        "grpo_stop": rec.get("stop_reason")},
    on=lambda run: True)
ARMS = (
    ADVERSARIAL,
    # the residual model of the cycle's detector and the SIR arm's T = 1 point (sir_step), in this process
    Arm("sir", "SIR", "detector", "entering", spec=None, measure=lambda *a: sir_point(*a),
        extra_flops=lambda rec: rec["sir_inference_flops"],
        fields=lambda rec: {"sir_inference_flops": rec["sir_inference_flops"], "sir_n": rec["sir_n"]},
        on=lambda run: "sir" in run.arms, det_skipped="the density-ratio arms' detectability is not measured"),
    *(Arm(name, name, "detector", "entering", fields=grpo_fields, on=lambda run, name=name: name in run.arms,
          spec=lambda run, state, c, arm: run.grpo_spec(arm.dir(c), entering_gen(state, c), c.rm, c.seed,
                                                        f"{c.tag} {arm.name} arm",
                                                        settings=ratio_arm_settings(run.args)[arm.name]),
          det_skipped="the density-ratio arms' detectability is not measured") for name in ("logit", "ptx")),
    # the adversarial step against a detector of another recipe on the same reward data: the per_position recipe
    # trains the generator's whole trunk on them (the data_limit preset's frozen trunk, the base's, may know too little)
    Arm("unfrozen", "unfrozen-trunk", "detector", "entering", recipe="per_position", fields=grpo_fields,
        on=lambda run: "unfrozen" in run.arms, det_skipped="the unfrozen-trunk arm's detectability is not measured",
        spec=lambda run, state, c, arm: run.grpo_spec(arm.dir(c), entering_gen(state, c), c.rms[arm.recipe][0], c.seed,
                                                      f"{c.tag} unfrozen-trunk arm")),
    # the adversarial step from MLE on (1 - h) D against a detector whose natural text is the other h D, which its
    # generator never trained on (issue 78: the cycle's detector reads memorised text as natural); its own chain
    Arm("heldout", "held-out-detector", "detector", "own", fields=grpo_fields, on=lambda run: "heldout" in run.arms,
        detector=lambda run, state, c, arm: heldout_detector(run, state, c, arm),
        det_skipped="the held-out-detector arm's detectability is not measured",
        spec=lambda run, state, c, arm: run.grpo_spec(arm.dir(c), state.arms[arm.name].gen, c.rms[arm.name][0], c.seed,
                                                      f"{c.tag} held-out-detector arm", settings=c.point,
                                                      data_dir=run.args.heldout_dirs[0])),
    # the detector trunk's own log-ratio as the reward: no detector, so none of its FLOPs
    Arm("ratio", "ratio", "detector", "entering", detector_flops=False, fields=grpo_fields,
        on=lambda run: "ratio" in run.arms, det_skipped="the ideal-detector arm's detectability is not measured",
        spec=lambda run, state, c, arm: run.grpo_spec(arm.dir(c), entering_gen(state, c), None, c.seed,
                                                      f"{c.tag} ideal-detector arm",
                                                      settings=ideal_arm_settings(state.trunk["checkpoint"],
                                                                                  c.rm.get("block_size")))),
    # the adversarial step's settings, seed (prompts and noise) and detector, its rewards shuffled within each group
    Arm("null", "null", "detector", "own", trunk_flops=True, on=lambda run: run.null,
        spec=lambda run, state, c, arm: run.grpo_spec(arm.dir(c), state.arms["null"].gen, c.rm, c.seed,
                                                      f"{c.tag} null arm", null=True),
        fields=lambda rec: {"grpo_updates": rec["budget"]["updates"]},
        det_skipped="the null arm's detectability is not measured"),
    Arm("control", "control", "budget", "own", detector_flops=False, measured=True, on=lambda run: run.control,
        skip_detector=lambda run: run.skip_control_detector,
        spec=lambda run, state, c, arm: run.control_spec(arm.dir(c), state.arms["control"].gen, c.budget,
                                                         step_seed(run, state, c.n, 1), c.tag),
        fields=lambda rec: {**{f"mle_{k}": rec[k] for k in ("iters", "batch_size", "block_size", "tokens",
                                                             "learning_rate")},
                            "mle_train_loss_final": rec.get("train_loss_final")}),
    *(Arm(name, name.upper(), "budget", "own", detector_flops=False, measured=name == "ddo",
          on=lambda run, name=name: name in run.arms,
          spec=lambda run, state, c, arm: run.self_play_spec(arm.dir(c), state.arms[arm.name].gen, c.budget, c.seed,
                                                             c.tag, arm.name, over=c.point),
          fields=lambda rec, name=name: {**{f"{name}_{k}": rec.get(k) for k in ("updates", "completion_tokens",
                                                                               "natural_tokens", "margin_start",
                                                                               "margin_end")},
                                         **({"ddo_round_starts": rec.get("round_starts")} if name == "ddo" else {})},
          det_skipped=None if name == "ddo" else "the SPIN arm's detectability is not measured")
      for name in ("spin", "ddo")),
)


def command_arm(spec):
    """The arm of a user's command (run_cycles --arm NAME='TEMPLATE'; spec: (name, template, limit in seconds)):
    each cycle from its own last generator, on the same-budget control's budget (Run.command_spec), its FLOPs
    the ones its command reports (else unknown)."""
    reads = "{detector}" in spec[1]  # the cycle's detector, and the detector trunk it reads: the adversarial arm's
    return Arm(spec[0], spec[0], "budget", "own", detector_flops=reads, trunk_flops=reads, on=lambda run: True,
               spec=lambda run, state, c, arm: run.command_spec(arm.dir(c), state.arms[arm.name].gen, c.budget,
                                                                c.seed, c.tag, spec, c.rm),
               extra_flops=lambda rec: rec["flops"],
               fields=lambda rec: {"command": rec["command"], "flops_reported": rec["flops"] is not None},
               det_skipped="a command arm's detectability is not measured")


def heldout_detector(run, state, c, arm):
    """The heldout arm's detector of cycle c: reward data of its own current generator, whose natural text is the held-out
    h D (run_cycles' args.heldout_dirs[1]), on that generator's trunk where the recipe reads one (the preset's
    trunk_is_base: its own MLE, not the base that trained on all of D); its mechanism's "train" text is that MLE's own,
    the other (1 - h) D."""
    own = state.arms[arm.name]
    trunk = state.trunk and ({"checkpoint": own.gen, "is_base": True} if state.trunk.get("is_base") else state.trunk)
    return run.detector(os.path.join(arm.dir(c), "detector"), own.gen, c.seed, f"{c.tag} {arm.label} detector",
                        trunk=trunk, natural_dir=run.args.heldout_dirs[1], seen_dir=run.args.heldout_dirs[0])


def run_arms(run):
    """The arms this run has: the table's, in its order (the order of summary.json's generators), then the user's."""
    return [a for a in ARMS if a.on(run)] + [command_arm(spec) for spec in run.user_arms]


@dataclass
class RunState:
    """What the cycle loop changes: every generator's summary entry, the per-cycle rows, each arm's state
    (arms[name]), the adversarial arm's val loss and ppl and the early stopper on its val perplexity."""
    rep: int                  # the replicate (--seeds), and its directory
    root: str
    trunk: Optional[dict]     # the replicate's detector trunk (its cycle-0 record), None for a recipe without one
    gens: dict                # (cycle, arm) -> summary.json entry
    arms: dict                # arm -> ArmState
    gen_loss: float           # the adversarial arm's current generator's val loss and ppl
    gen_ppl: float
    stopper: EarlyStopping
    rows: list = field(default_factory=list)
    last: int = 0
    stop_reason: str = ""
    info: dict = field(default_factory=dict)  # cycle -> the detector's information (--arms)

    @property
    def gen(self):
        """The adversarial arm's current generator."""
        return self.arms["adversarial"].gen


def start_state(run, rep, cycle0, gens0, max_cycles, starts=None):
    """Replicate rep's RunState: every arm of the run at the replicate's cycle-0 generator (cycle0: its (base,
    trunk) records; gens0: their summary entries), with the cycle-0 FLOPs each arm builds on (the arms whose
    detectors read the detector trunk: its FLOPs too); starts: {arm: (generator, FLOPs)}, an arm's own start (the
    heldout arm's MLE on (1 - h) D)."""
    base, trunk = cycle0
    base_flops = (base["flops"] and base["flops"]["flops"]) or 0
    # (a trunk that is the base, --preset data_limit's, costs nothing more)
    trunk_flops = (trunk and not trunk.get("is_base") and trunk["flops"] and trunk["flops"]["flops"]) or 0
    arms = {a.name: ArmState(base["generator"], base_flops + trunk_flops if a.trunk_flops else base_flops,
                             (0, "base") if a.measured else None) for a in run_arms(run)}
    for name, (gen, cost) in (starts or {}).items():
        arms[name] = ArmState(gen, cost)
    state = RunState(rep=rep, root=replicate_root(run.out_dir, rep), trunk=trunk, gens=gens0, arms=arms,
                     gen_loss=base["val_loss"], gen_ppl=base["val_ppl"],
                     stopper=EarlyStopping(patience=run.args.patience, min_delta=run.args.min_delta, mode="min"),
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
    """Fresh detectors of the generators entering cycle n (cycle n's seed and directories): the adversarial arm's,
    then each other measured arm's (the control's, DDO's) where it differs from it (from cycle 2, and in the final
    stage; cycle 1's is shared)."""
    cdir = os.path.join(state.root, f"cycle_{n}")
    seed = step_seed(run, state, n)
    tag = state_tag(state) + (f"final stage (cycle {n}'s detector)" if final_stage else f"cycle {n}")
    replay = ([os.path.join(state.root, f"cycle_{k}", "reward_data") for k in range(1, n)]
              if run.args.replay and not final_stage else [])
    adv = state.arms["adversarial"]
    rm, det = run.detector(cdir, adv.gen, seed, tag, replay, state.trunk)
    attach_detector(state.gens[adv.entering], det, f"cycle_{n}", final_stage)
    for arm in run_arms(run):
        own = state.arms[arm.name]
        if arm.name == "adversarial" or not arm.measured or own.entering == adv.entering:
            continue
        if arm.skip_detector(run):
            state.gens[own.entering]["det_skipped"] = arm.skip_detector(run)
            continue
        _, adet = run.detector(os.path.join(cdir, arm.name), own.gen, seed, f"{tag} {arm.label}", trunk=state.trunk)
        attach_detector(state.gens[own.entering], adet, f"cycle_{n}/{arm.name}", final_stage)
    return rm, det


def final_stage(run, state):
    """After the last cycle: a fresh detector of each arm's last generator (or why none)."""
    skip = run.skip_final_detector
    if skip:
        for key in {a.entering for a in state.arms.values() if a.entering is not None}:
            if state.gens[key]["detector"] is None:
                state.gens[key]["det_skipped"] = skip
    else:
        measure_entering(run, state, state.last + 1, final_stage=True)


def run_phase(run, state, c, phase):
    """One phase of cycle c's arms: their steps at once or in turn (Run.run_steps), then each new generator's
    evaluation (an in-process arm: its measurement) and summary entry. Returns {arm: its step's record}."""
    arms = [a for a in run_arms(run) if a.phase == phase]
    # every arm's step; a tuned arm's grid points (tuning.to_run) beside them
    specs = {key: a.spec(run, state, pc, a) for a in arms if a.spec is not None
             for key, pc in tuning.to_run(run, state, c, a).items()}
    recs = dict(zip(specs, run.run_steps(list(specs.values()))))
    if phase == "detector" and run.arms & RATIO_ARMS:  # what the detector knows, and SIR's point (sir_step)
        recs["residual"] = sir_step(run, state, c)
        state.info[c.n] = recs["residual"]["information"]
    for arm in arms:
        tuned = None
        if arm.spec is None:
            rec, ev = arm.measure(run, state, c, recs)
            recs[arm.name] = rec
        else:  # a tuned arm goes on from its chosen point; recs[name] stays its recipe's (the budget)
            start = state.arms[arm.name].gen if arm.start == "own" else entering_gen(state, c)
            rec, selection, tuned = tuning.choose(run, state, c, arm, recs, start)
            ev = run.evaluate(arm.dir(c), rec["checkpoint"], f"{c.tag} {arm.label}")
        state.gens[(c.n, arm.name)] = arm_entry(state, arm, c, rec, ev, tuned)
        recs[(arm.name, "eval")] = ev
    return recs


def step_flops(arm, rec):
    """The FLOPs of an arm's step of a cycle (None: unknown)."""
    if arm.extra_flops is not None:
        return arm.extra_flops(rec)
    return flops.total({"step": rec.get("flops")})


def arm_entry(state, arm, c, rec, ev, tuned=None):
    """summary.json's entry of the arm's new generator: its evaluation, why it has no detector (where it has none),
    where it started (an arm from the entering generator), its FLOPs so far (a tuned arm's selection too), its own
    fields and a tuned arm's grid (tuning.choose's record)."""
    own_rm = arm.own_rm(c)
    rm = own_rm[0] if own_rm else c.rm
    parts = ([rm["detector_flops"]] if arm.detector_flops else []) + [step_flops(arm, rec)] \
        + ([tuned["selection_flops"]] if tuned and tuned.get("selection_flops") else [])
    if arm.start == "own":
        own = state.arms[arm.name]
        for f in parts:
            own.flops = None if own.flops is None or f is None else own.flops + f
        cost = own.flops
    else:
        cost = c.entering_flops
        for f in parts:
            cost = None if f is None else cost + f
    return {**generator_entry(c.n, arm.name, ev, state.rep),
            **({"entering": list(c.entering)} if arm.start == "entering" else {}),
            **({"det_skipped": arm.det_skipped} if arm.det_skipped else {}),
            "compute_flops": cost, **arm.fields(rec), **(own_detector(own_rm) if own_rm else {}),
            **({"tuned": tuned} if tuned else {})}


def own_detector(rm_det):
    """An arm's own detector (Arm.recipe), as its summary entry shows it: the recipe, its MAEs and AUROC."""
    rm, det = rm_det
    return {"own_detector": {"recipe": rm.get("detector"), "val_mae": det["val_mae"], "train_mae": det.get("train_mae"),
                             "const_mae": det["const_mae"], "lexicon_mae": det["lexicon_mae"], "auroc": det["auroc"],
                             "auroc_se": det.get("auroc_se")}}


def advance(run, state, c, recs):
    """After cycle c: each own-start arm at its new generator, each measured arm's entering key at it (the next
    cycle's, or the final stage's, detector measures it)."""
    for arm in run_arms(run):
        own = state.arms[arm.name]
        if arm.start == "own":
            own.gen = recs[(arm.name, "eval")]["generator"]
        if arm.measured:
            own.entering = (c.n, arm.name)
    ev = recs[("adversarial", "eval")]
    state.gen_loss, state.gen_ppl = ev["val_loss"], ev["val_ppl"]


def run_cycle(run, state, n):
    """Cycle n of a replicate: the entering generators' detectors, the detector phase, the budget phase. Returns
    (its detector's records (rm, det), the arms' records)."""
    rm, det = measure_entering(run, state, n, final_stage=False)
    adv = state.arms["adversarial"]
    c = Cycle(n=n, dir=os.path.join(state.root, f"cycle_{n}"), seed=step_seed(run, state, n),
              tag=f"{state_tag(state)}cycle {n}", rm=rm, entering=adv.entering, entering_flops=adv.flops)
    for arm in run_arms(run):  # the arms' own detectors: on the cycle's reward data of the entering generator, or own
        if arm.recipe and arm.recipe not in c.rms:
            c.rms[arm.recipe] = run.detector(os.path.join(arm.dir(c), "detector"), adv.gen, c.seed,
                                             f"{c.tag} {arm.label} detector", trunk=state.trunk, recipe=arm.recipe,
                                             data_from=c.dir)
        elif arm.detector:
            c.rms[arm.name] = arm.detector(run, state, c, arm)
    recs = run_phase(run, state, c, "detector")
    recs.update(run_phase(run, state, replace(c, budget=recs["adversarial"]["budget"]), "budget"))
    return rm, det, c, recs


def sir_step(run, state, c):
    """What cycle c's detector knows about the generator that made its negatives (gen, the entering generator): the
    residual model P_gen exp(s) / Z on the frontier's val windows (experiment/residual.py), with Z from --sir_n of
    gen's own continuations per window; and the SIR arm's T = 1 point: the sweep's prompts, --sir_n samples each,
    one kept in proportion to exp(s), scored by the judge; its coverage is the residual model's (the lower
    estimate) over the same windows as every sweep, against gen's own T = 1 sweep point. Its candidates are drawn
    with the replicate's seed (replicate 0: the sweep's, so its first candidate is gen's own T = 1 sample), on the
    sweep's prompts in every replicate. In <cycle>/sir/sir.done.json."""
    d, gen, rm, rep = os.path.join(c.dir, "sir"), entering_gen(state, c), c.rm, state.rep
    entering, seed, label = state.gens[c.entering]["frontier"]["1"], c.seed, f"{c.tag} SIR"
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
    scorer = residual.Scorer(model, det, N)
    res = residual.val_residual(scorer, val, run.eval_block_size, run.args.sir_n, int(seed))
    info = residual.information(res, run.eval_block_size, entering["val_tokens"])
    rows = residual.sir_rows(scorer, val, run.quality_samples, run.sample_len, run.args.sir_n, run.args.seed,
                             noise_seed=noise)
    items = judge_nll(run.judge_model, rows, run.device)
    point = {**sample_stats(rows, corpus_tokenizer(run.corpus), train_vocabulary(run.corpus)),
             "judge_nll": float(items.mean()), "judge_items": items.tolist(),
             **residual.residual_point(entering, res, run.eval_block_size, frontier.VAL_ITEMS),
             "sample_len": run.sample_len, "seed": run.args.seed}
    rec = run.mark_done(d, "sir", {**want, "information": {str(m): v for m, v in info.items()}, "point": point,
                                    "seconds": round(time.time() - t0, 1)})
    note_peak(f"{label}: the residual model and SIR")
    return rec


def sir_point(run, state, c, recs):
    """The SIR arm's T = 1 point (recs["residual"]: sir_step's record) as an evaluation, with its inference FLOPs:
    its n candidates' generation and scoring."""
    sir, gen = recs["residual"], entering_gen(state, c)
    point = sir["point"]
    ev = {"generator": f"SIR of {gen} (n = {sir['n']}, detector {c.rm['checkpoint']})", **point,
          "frontier": {"1": {k: v for k, v in point.items() if k != "examples"}}}
    inference = flops.step_sir(read_checkpoint(gen)["model_args"], c.rm, sir["n"],
                               point.get("samples", run.quality_samples), point["sample_len"])
    return {"sir_inference_flops": inference["flops"], "sir_n": sir["n"]}, ev


def cycle_row(state, n, rm, det, gr, ev):
    """summary.json's record of cycle n's adversarial steps."""
    ctl = state.gens.get((n, "control"))
    return {"cycle": n, "replicate": state.rep, "generator": state.gen, "gen_val_loss": state.gen_loss, "gen_val_ppl": state.gen_ppl,
            **{f"rm_{k}": rm.get(k) for k in ("val_mae", "const_mae", "val_loss", "val_corr")},
            "rm_auroc": det["auroc"], "rm_lexicon_mae": det["lexicon_mae"], "rm_train_mae": det.get("train_mae"),
            **{f"grpo_{k}": gr.get(k) for k in ("reward_start", "reward_end", "eval_reward_start",
                                                "eval_reward_end", "kl_final")},
            "grpo_stop": gr.get("stop_reason"), "grpo_steps": gr.get("steps"),
            "grpo_updates": gr["budget"]["updates"], "grpo_completion_tokens": gr["budget"]["completion_tokens"],
            "new_generator": ev["generator"], "new_val_loss": ev["val_loss"], "new_val_ppl": ev["val_ppl"],
            "control_generator": ctl["generator"] if ctl else None,
            "control_val_ppl": ctl["val_ppl"] if ctl else None,
            # the residual model's gain over the entering generator, nats per val token (--arms)
            "detector_information": state.info.get(n)}
