"""
The data-limited preset's models beside MLE at its limit (cycle0.base_grid), in cycle 0 of each replicate: issue 76's
positive controls (the more-data control on twice the data; the ensemble of MLE models of D and its distilled student)
and issue 78's heldout arm's generator on (1 - h) of D.
"""
import os

from experiment.cycle0 import base_grid, best_point, continued_step, cycle0_dir, cycle0_spec, cycle0_step, \
    grid_choice, grid_steps, rep_tag, schedule_for
from experiment.presets import argv
from experiment.steps import ScriptStep, read_done, replicate_seed
from lib.corpus import Corpus


def more_data(run, base_config, rep=0):
    """Replicate rep's more-data control (issue 76's positive control): MLE at its limit, by the base's recipe and
    selection (its grid point chosen once, on replicate 0's dev slice of its own text), on twice the data. Its record:
    the checkpoint, the FLOPs of its grid share and continuation, the grid."""
    c0 = cycle0_dir(run, rep)
    rec = read_done(c0, "more_data")
    if rec is None:
        path, cost, grid = base_grid(run, base_config, rep, "more_data")
        rec = run.mark_done(c0, "more_data", {"generator": path, "flops": cost, **grid})
    return rec


def heldout_base(run, base_config, rep=0):
    """Replicate rep's heldout-arm generator (issue 78): MLE at its limit by the base's recipe and its chosen grid point,
    on the first (1 - h) of the D characters (heldout_dirs), continued as the base is. Its record: the checkpoint, its
    FLOPs (its own training, plus the replicate's grid that chose its point: the selection it used) and its dev loss."""
    c0 = cycle0_dir(run, rep)
    rec = read_done(c0, "heldout_base")
    if rec is None:
        path, cost, grid = base_grid(run, base_config, rep, "heldout")
        selection = sum(p["flops"] or 0 for p in read_done(c0, "base")["grid"])
        rec = run.mark_done(c0, "heldout_base", {"generator": path, "flops": cost["flops"] + selection,
                                                 "selection_flops": selection, "dev_loss": run.dev_loss(path), **grid})
    return rec


ENSEMBLE_K = 4  # members: the seed's MLE at its limit and three more from seeds of their own
ENSEMBLE_SEED_OFFSET = 104729  # a member's train.py seed: the replicate's + k x this (no other model shares its draw)


def ensemble(run, base_config, rep=0):
    """Replicate rep's ensemble (issue 76, Kim et al. 2025's data-limited recipe) and its student: the replicate's MLE
    at its limit and ENSEMBLE_K - 1 more MLE models of the D characters at replicate 0's chosen grid point, each from
    a seed of its own and stopped at its dev minimum; none is shared between replicates, so the seeds' differences
    stay independent. The student (train_distill.py) is the base's size, trained on the D characters against the
    members' averaged probabilities at the same point and schedule. Its record: the members, the student's
    checkpoint, the ensemble's FLOPs (every member's training) and the student's (those plus its own training and
    the teachers' forwards)."""
    c0 = cycle0_dir(run, rep)
    rec = read_done(c0, "ensemble")
    if rec is not None:
        return rec
    base = read_done(c0, "base")
    steps, point, seed = member_steps(run, base_config, rep)
    recs = run.run_steps(steps, together=run.parallel_cycle0)
    members = [base["generator"]] + [r[0] for r in recs]
    # its recipe (learning rate, warmup, batch, beta2) the members': the chosen grid point's checkpoint records it. MLE at
    # its limit is the continuation, whose regime (GRPO's learning rate, constant, batch 48) train_distill would take
    recipe = best_point(base["grid"])["checkpoint"] if base.get("grid") else base["generator"]
    student, summary = run.run_steps([student_step(run, rep, members, recipe, point, seed)])[0]
    # member 0 costs what MLE at its limit cost (its grid's share and continuation, as MLE is charged), the others
    # their own training
    members_flops = (base["flops"] or {}).get("flops", 0) + sum((r[1] or {}).get("flops", 0) for r in recs)
    return run.mark_done(c0, "ensemble", {"members": members, "student": os.path.abspath(student),
                                          "ensemble_flops": members_flops,
                                          "student_flops": members_flops + summary["flops"],
                                          "grid_point": [point["dropout"], point["weight_decay"]]})


def student_step(run, rep, members, recipe, point, seed):
    """The ensemble's student's training step (train_distill.py): the members' checkpoints (MLE at its limit first),
    the recipe's checkpoint, the grid point's settings and schedule, the replicate's seed."""
    sdir = os.path.join(cycle0_dir(run, rep), "ensemble", "student")
    keep = ("learning_rate", "min_lr", "warmup_iters", "max_iters", "lr_decay_iters", "batch_size", "eval_interval",
            "eval_iters", "patience")
    cmd = ["train_distill.py"] + argv({"teachers": ",".join(members), "init_config_from": recipe,
                                       "data_dir": run.data_dir, "out_dir": sdir, "seed": seed,
                                       "dropout": point["dropout"], "weight_decay": point["weight_decay"],
                                       **{k: point[k] for k in keep if point.get(k) is not None}}) + run.dev
    return ScriptStep(sdir, "train", f"{rep_tag(rep)}cycle 0: the ensemble's student", cmd,
                      os.path.join(sdir, "train_summary.json"), lambda s, secs: (os.path.join(sdir, "ckpt.pt"), s),
                      resume=os.path.join(sdir, "last.pt"))


def member_steps(run, base_config, rep):
    """The ensemble's members past the replicate's MLE at its limit: their training steps, at replicate 0's chosen
    grid point (its settings) from seeds of their own; and the replicate's seed."""
    _, settings, _, seed = cycle0_spec(run, "base", rep)
    settings = schedule_for(settings, base_config, len(Corpus(run.data_dir).train), run.preset.get("base_min_epochs"))
    d, wd = grid_choice(run) or (settings.get("dropout", 0.0), settings.get("weight_decay", 0.1))
    point = {**settings, "dropout": d, "weight_decay": wd}
    return [cycle0_step(run, os.path.join("ensemble", f"member{k}"), f"{rep_tag(rep)}cycle 0: ensemble member {k}",
                        base_config, point, replicate_seed(run.args.seed, rep) + k * ENSEMBLE_SEED_OFFSET, rep, "train")
            for k in range(1, ENSEMBLE_K)], point, seed


def train_together(run, base_config, rep):
    """A replicate past 0 under parallel_cycle0: the cycle-0 models that base(), heldout_base(), more_data() and
    ensemble() would train one after another (a process alone on a core leaves the other idle), trained at once,
    --max_at_once at a time, each as soon as a place is free and what it needs has trained: each grid's one point
    (replicate 0's choice) and its continuation, the ensemble's members and its student (after MLE at its limit and
    the members). The ensemble's chain comes first in the order, as the longest. Those functions then find their
    steps done: the same commands, so the same bits."""
    if rep == 0 or not run.parallel_cycle0 or not run.preset.get("base_grid"):
        return
    whats = ["base"] + [w for w in ("more_data", "heldout") if w in run.arms]  # (the longest text first)
    grids = {w: g for w in whats if len((g := grid_steps(run, base_config, rep, w)).steps) == 1}  # (a choice made)
    steps, after, limit = [], {}, {}  # limit: each grid's MLE at its limit (its continuation, or its point)
    for w, g in grids.items():
        steps.append(g.steps[0])
        if run.preset.get("base_continued"):
            best = {"dropout": g.regs[0][0], "weight_decay": g.regs[0][1], "checkpoint": ckpt(g.steps[0])}
            after[len(steps)] = (len(steps) - 1,)
            steps.append(continued_step(run, base_config, best, (g.settings, g.seed, rep), g.prefix))
        limit[w] = len(steps) - 1
        if w == "base" and "ensemble_kd" in run.arms:  # its members, then their student (it reads MLE at its limit)
            members, point, seed = member_steps(run, base_config, rep)
            steps += members
            after[len(steps)] = (limit["base"],) + tuple(range(len(steps) - len(members), len(steps)))
            steps.append(student_step(run, rep, [ckpt(steps[limit["base"]])] + [ckpt(m) for m in members],
                                      ckpt(g.steps[0]), point, seed))
    run.run_steps(steps, together=True, after=after)


def ckpt(step):
    """The checkpoint a cycle-0 training step writes (its record's first field), before it has run."""
    return os.path.abspath(os.path.join(step.d, "ckpt.pt"))
