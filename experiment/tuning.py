"""
The arms tuned as MLE is (issue 78). A tuned arm has a grid in its preset (arm_grids: at most MLE's four points, each
the arm's settings over its recipe; {} is the recipe, {"max_steps": 0} the generator it starts from, trained no
further). Replicate 0 trains every point and chooses one on the dev slice by the verdict's own rule; every other
replicate trains that point alone, as MLE's grid is searched once per D.

The rule: each point's T = 1 samples and dev NLL against the frontier of MLE at its limit (the replicate's base) swept
over the run's temperatures on the dev slice; the dev NLL difference at matched judge quality (frontier.paired), else
the judge NLL difference at matched dev coverage; the lowest wins. Nothing here reads the val split: the dev slice is the
val split of the arms' data directory (run.data_dir), and the verdict's own measurements come later.

The arm is charged its chosen point's step and, in replicate 0, every other point's (the selection), as MLE is charged
its grid.
"""
import os
from dataclasses import replace

from experiment import frontier
from experiment.presets import START_POINT
from experiment.steps import read_done, replicate_root
from lib.checkpoint import load_model

RECIPE = {}  # the arm's own settings: the point every grid holds


def grid(run, arm):
    """The arm's grid (the preset's arm_grids), or None for an arm run at its recipe alone."""
    return (run.preset.get("arm_grids") or {}).get(arm.name)


def point_cycle(c, points, i):
    """Cycle c as point i of a grid sees it: the recipe in the arm's own directory, point i under its grid/p<i>."""
    return c if points[i] == RECIPE else replace(c, dir=os.path.join(c.dir, "grid", f"p{i}"), point=points[i])


def point_key(arm, points, i):
    """recs' key of point i's step record: the arm's name for its recipe (as an untuned arm's), (name, i) otherwise."""
    return arm.name if points[i] == RECIPE else (arm.name, i)


def chosen_index(run, c, arm):
    """The point replicate 0 chose in this cycle (its <arm dir>/grid.done.json), None before it has."""
    c0 = replace(c, dir=os.path.join(replicate_root(run.out_dir, 0), f"cycle_{c.n}"))
    rec = read_done(arm.dir(c0), "grid")
    return None if rec is None else rec["chosen"]


def to_run(run, state, c, arm):
    """{key: the point's Cycle} of the points this replicate trains: every point with a step in replicate 0, the chosen
    one in the others; the recipe always for the adversarial arm, whose record sets the budget arms' budget. Keyed by
    point_key."""
    points = grid(run, arm)
    if points is None:
        return {arm.name: c}
    chosen = None if state.rep == 0 else chosen_index(run, c, arm)
    keep = [i for i, p in enumerate(points) if p != START_POINT and (chosen is None or i == chosen
                                                                or (p == RECIPE and arm.name == "adversarial"))]
    return {point_key(arm, points, i): point_cycle(c, points, i) for i in keep}


def start_record(gen):
    """The record of the START_POINT: the generator it starts from, no step, no update, no FLOPs."""
    return {"checkpoint": gen, "flops": {"flops": 0.0}, "updates": 0, "completion_tokens": 0, "stop_reason": "max_steps 0",
            "budget": {"steps": 0, "updates": 0, "completion_tokens": 0}}


def step_flops_of(rec):
    return (rec.get("flops") or {}).get("flops") or 0.0


def dev_curve(run, gen, temps, label):
    """The frontier sweep of one generator on the dev slice (the arms' val split), at temps."""
    print(f"{label}: {gen} on the dev slice (T = {', '.join(f'{t:g}' for t in temps)})", flush=True)
    model = load_model(gen, device=run.device, require_mode="generator")[0]
    return frontier.sweep(model, run.dev_corpus(), temps, run.quality_samples, run.sample_len, run.args.seed,
                          run.device, eval_batch_size=run.args.eval_batch_size, eval_block_size=run.eval_block_size,
                          judge=run.judge_model)


def mle_dev_curve(run, state):
    """MLE at its limit's frontier on the dev slice (the replicate's base), swept once per replicate (cycle_0)."""
    d = os.path.join(state.root, "cycle_0")
    gen = state.gens[(0, "base")]["generator"]
    rec = read_done(d, "dev_frontier")
    if rec is None or rec.get("generator") != gen:
        curve = dev_curve(run, gen, run.args.temps, "MLE at its limit")
        rec = run.mark_done(d, "dev_frontier", {"generator": gen, "curve": {f"{t:g}": p for t, p in curve.items()}})
    return {float(t): p for t, p in rec["curve"].items()}


def score(point, curve):
    """The verdict's rule on the dev slice: (0, dev NLL difference at matched judge quality), else (1, judge NLL
    difference at matched dev coverage), else (2, 0): out of the control's range at both."""
    for rank, match in enumerate(("quality", "coverage")):
        p = frontier.paired(point, curve, match)
        if p is not None:
            return rank, p["diff"]
    return 2, 0.0


def choose(run, state, c, arm, recs, start_gen):
    """(the chosen point's step record, the selection's FLOPs, the selection record or None) of a tuned arm; for an
    untuned arm (recs[name], 0, None). Replicate 0 measures every point on the dev slice and keeps its choice in
    <arm dir>/grid.done.json; the others read it (a cycle replicate 0 never reached: they choose, as to_run says)."""
    points = grid(run, arm)
    if points is None:
        return recs[arm.name], 0.0, None
    point_rec = {i: start_record(start_gen) if p == START_POINT else recs[point_key(arm, points, i)]
                 for i, p in enumerate(points) if p == START_POINT or point_key(arm, points, i) in recs}
    i = chosen_index(run, c, arm) if state.rep > 0 else None
    if i is not None:
        return point_rec[i], 0.0, {"chosen": i, "settings": points[i], "from_replicate": 0}
    # replicate 0, or a cycle replicate 0 never reached (it stopped early): this replicate chooses for itself
    sel = read_done(arm.dir(c), "grid")
    want = [point_rec[i]["checkpoint"] for i in range(len(points))]
    if sel is None or [p["checkpoint"] for p in sel["points"]] != want:
        curve = mle_dev_curve(run, state)
        rows = []
        for i, p in enumerate(points):
            pt = dev_curve(run, point_rec[i]["checkpoint"], [1.0], f"{c.tag} {arm.label}, grid point {i} {p}")[1.0]
            rank, diff = score(pt, curve)
            rows.append({"settings": p, "checkpoint": point_rec[i]["checkpoint"], "flops": step_flops_of(point_rec[i]),
                         "dev_judge_nll": pt["judge_nll"], "dev_loss": pt["val_loss"], "rank": rank, "diff": diff})
        best = min(range(len(rows)), key=lambda i: (rows[i]["rank"], rows[i]["diff"]))
        sel = run.mark_done(arm.dir(c), "grid", {"points": rows, "chosen": best, "settings": points[best]})
        print(f"{c.tag} {arm.label}: grid point {best} {points[best]} chosen on the dev slice ("
              + ", ".join(f"{r['diff']:+.4f}" + ("" if r["rank"] == 0 else " (coverage)" if r["rank"] == 1 else " (out)")
                          for r in rows) + ")", flush=True)
    i = sel["chosen"]
    selection = sum(r["flops"] for k, r in enumerate(sel["points"]) if k != i)
    return point_rec[i], selection, {"chosen": i, "settings": points[i], "selection_flops": selection,
                                     "points": [{k: r[k] for k in ("settings", "dev_judge_nll", "dev_loss", "diff",
                                                                   "rank", "flops")} for r in sel["points"]]}
