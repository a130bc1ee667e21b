"""
Cycle 0 of a run_cycles.py run, on its Run (experiment/steps.py): the base generator, the detector trunk (a
stronger LM of the same data, the strong_trunk detector's) and the judge (an independent LM no arm trains
on), each trained by train.py with the preset's recipe (at once first by train_together where the preset
says parallel_cycle0) or given on the command line, and measured (its val perplexity) once.

Every replicate (--seeds) trains its own base and trunk from its own seed, in its own directory (replicate 0:
OUT/cycle_0, replicate r: OUT/seed_r/cycle_0), since every arm and control depends on them and their seeds move
the verdict; the judge is the instrument, trained once (OUT/cycle_0/judge) and shared.
"""
import ast
import os
from typing import NamedTuple

from configurator import read_config_tree
from core.errors import ProjectError
from core.files import read_jsonl
from experiment import flops
from experiment.presets import JUDGE_SEED_OFFSET, NEEDS_TRUNK, argv
from experiment.steps import ScriptStep, generator_block_size, note_peak, read_done, read_json, replicate_root, replicate_seed
from lib.corpus import Corpus, write_train_slice

CYCLE0_GIVEN = {  # the cycle-0 models a user may bring instead: the flag, and what the model must be
    "detector_trunk": ("--detector_trunk_ckpt", "a stronger LM of the same data and tokenizer"),
    "judge": ("--judge_ckpt", "an LM of the same data and tokenizer that no arm starts from or is rewarded by"),
}


def cycle0_note(name, preset, base_config, settings):
    """The line printed before cycle 0 trains its detector trunk or judge in a run that brought its own
    generator (--base_ckpt): at GPT-2's vocabulary that training can take longer than the rest of the
    run on a CPU (the quick preset's judge: 10-20 min on 2 cores), and the user may have such a model."""
    flag, what = CYCLE0_GIVEN[name]
    return (f"note: no {flag}: cycle 0 trains the {name.replace('_', ' ')} with the {preset} preset's recipe "
            f"(train.py --config {base_config} {' '.join(argv(settings))}); at a large vocabulary (GPT-2's BPE) it "
            f"can take longer than the rest of the run. To skip it, pass {flag} PATH: {what}")


def cut_train(data_dir, out_dir, fraction, flag, parts):
    """data_dir's train split cut at 1 - fraction into two prepared directories, each with data_dir's val split and
    tokenizer: parts ((name, why), (name, why)), the first part's and the rest's (OUT/data/<name>). Written once."""
    n = len(Corpus(data_dir).train)
    cut = int(round(n * (1 - fraction)))
    if not 0 < cut < n:
        raise ProjectError(f"{flag} {fraction} leaves an empty part of the {n:,} train tokens of {data_dir}",
                           "choose a fraction strictly between 0 and 1, e.g. 0.2")
    (first, why_first), (rest, why_rest) = parts
    return (write_train_slice(data_dir, os.path.join(out_dir, "data", first), 0, cut, why_first),
            write_train_slice(data_dir, os.path.join(out_dir, "data", rest), cut, n, why_rest))


def judge_holdout(data_dir, out_dir, fraction):
    """(the arms' data directory, the judge's) for --judge_holdout: data_dir's train split cut at 1 - fraction, the
    first part every arm, control and detector trains on (OUT/data/arms), the rest the judge's alone
    (OUT/data/judge), both with data_dir's val split and tokenizer; written once."""
    why = f"run_cycles --judge_holdout {fraction}"
    return cut_train(data_dir, out_dir, fraction, "--judge_holdout", (
        ("arms", f"the arms' part ({why})"), ("judge", f"the judge's held-out part, which no arm sees ({why})")))


def config_value(base_config, settings, extra_words=(), key="block_size", default=1024):
    """A train.py setting of the cycle-0 models: in the step's extra words, else its settings, else the config
    file's assignment (read, not run), else `default` (train.py's)."""
    words = list(extra_words)
    for i, w in enumerate(words):
        if w.startswith(f"--{key}="):
            return int(w.split("=", 1)[1])
        if w == f"--{key}" and i + 1 < len(words):
            return int(words[i + 1])
    if (settings or {}).get(key) is not None:
        return int(settings[key])
    if base_config:
        for node in read_config_tree(base_config)[1].body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == key for t in node.targets):
                return int(ast.literal_eval(node.value))
    return default


def config_block_size(base_config, settings, extra_words=()):
    """The context the cycle-0 models train at (config_value's block_size; train.py's default 1024)."""
    return config_value(base_config, settings, extra_words)


def schedule_for(settings, base_config, train_tokens, min_epochs):
    """settings with max_iters = lr_decay_iters stretched to at least min_epochs passes over train_tokens (the
    data-limited rows: the dev minimum must fall strictly inside the schedule, not at its cap)."""
    if not min_epochs:
        return settings
    per_iter = config_value(base_config, settings, key="batch_size", default=12) * config_block_size(base_config, settings)
    iters = max(int(settings.get("max_iters", 0)), -(-int(min_epochs * train_tokens) // per_iter))
    return {**settings, "max_iters": iters, "lr_decay_iters": iters}


def smallest_data_chars(block_size, dev_fraction):
    """The smallest --data_chars whose dev slice and train part each hold one window of block_size + 1 tokens."""
    need = block_size + 1
    d = need
    while round(d * dev_fraction) < need or d - round(d * dev_fraction) < need:
        d += 1
    return d


def check_data_chars(chars, preset, block_size):
    """Refuse a --data_chars too small for its dev slice and the models' context, before any step runs (the judge's
    ten minutes would come first, and then every grid point would fail)."""
    frac = preset["dev_fraction"] or 0.1
    least = smallest_data_chars(block_size, frac)
    if chars < least:
        raise ProjectError(f"--data_chars {chars}: its dev slice ({frac:g} of it) holds {round(chars * frac)} tokens "
                           f"and its train part {chars - round(chars * frac)}, fewer than the {block_size + 1} a "
                           f"context of {block_size} needs", f"pass --data_chars {least} or more")


def more_data_dir(data_dir, out_dir, chars, preset):
    """The more-data control's text (issue 76): the first 2D tokens of data_dir's train split, its last dev_fraction
    its own dev slice (OUT/data/limit_2x), which must end before the judge's text begins. Written once."""
    n, after, frac = len(Corpus(data_dir).train), preset["judge_after"] or 2 * chars, preset["dev_fraction"] or 0.1
    if 2 * chars > after or 2 * chars >= n:
        raise ProjectError(f"--data_chars {chars}: the more-data control trains on the first {2 * chars:,} tokens, "
                           f"past the judge's text (from token {after:,}) or the corpus' {n:,}",
                           f"choose --data_chars <= {min(after, n - 1) // 2:,}, or drop more_data from --arms")
    dev = max(1, round(2 * chars * frac))
    return write_train_slice(data_dir, os.path.join(out_dir, "data", "limit_2x"), 0, 2 * chars - dev,
                             f"the more-data control's text (run_cycles --data_chars {chars}: twice the arms'); val: "
                             f"its dev slice", dev=(2 * chars - dev, 2 * chars))


def heldout_dirs(limit_dir, out_dir, share):
    """The heldout arm's two texts (issue 78): the D characters' train part cut at 1 - share, the first part its
    generator's (OUT/data/limit_fit), the rest its detector's natural text (OUT/data/limit_held), which that generator
    never trains on; both with the dev slice as their val split. Written once."""
    why = f"the heldout arm's, h = {share:g}"
    return cut_train(limit_dir, out_dir, share, "heldout_share", (
        ("limit_fit", f"{why}: its generator's text; val: the dev slice"),
        ("limit_held", f"{why}: its detector's natural text, never its generator's; val: the dev slice")))


def data_limit(data_dir, out_dir, chars, preset):
    """(the arms' data directory, the judge's) for --data_chars D: the first D tokens of data_dir's train split, its
    last dev_fraction as the val split (the dev slice: OUT/data/limit), and the train split past judge_after, its
    own last dev_fraction as its val split (OUT/data/judge); the real val split is left to the verdict. Written
    once."""
    n, after, frac = len(Corpus(data_dir).train), preset["judge_after"] or chars, preset["dev_fraction"] or 0.1
    if not 0 < chars <= after < n:
        raise ProjectError(f"--data_chars {chars}: the first {chars:,} of the {n:,} train tokens, and the judge's "
                           f"text from token {after:,} on", f"choose 0 < --data_chars <= {after:,} (the judge's text "
                           f"starts there), on a corpus longer than that")
    dev, jdev = max(1, round(chars * frac)), max(1, round((n - after) * frac))
    why = f"run_cycles --data_chars {chars}"
    return (write_train_slice(data_dir, os.path.join(out_dir, "data", "limit"), 0, chars - dev,
                              f"every arm's, control's and detector's text ({why}); val: the dev slice",
                              dev=(chars - dev, chars)),
            write_train_slice(data_dir, os.path.join(out_dir, "data", "judge"), after, n - jdev,
                              f"the judge's text, which no arm sees ({why}); val: its own dev slice",
                              dev=(n - jdev, n)))


# ----------------------------------------------------------------------------- the steps


def cycle0_dir(run, rep):
    """Replicate rep's cycle-0 directory."""
    return os.path.join(replicate_root(run.out_dir, rep), "cycle_0")


def train_cycle0(run, name, label, base_config, settings, seed, rep=0, step=None):
    """train.py in cycle_0/<name> with the preset's settings (and --extra_<name>), resumed when it
    has a checkpoint (unless train_together ran it already). Returns (its best checkpoint, its FLOPs
    record). step: the done record it leaves in its directory (None: its caller's record holds it)."""
    s = cycle0_step(run, name, label, base_config, settings, seed, rep, step)
    if (rep, name) in run.trained:  # train_together (or the grid's batch) ran it
        return s.record(read_json(s.summary), None)
    return tuple(run.run_steps([s])[0])

def cycle0_step(run, name, label, base_config, settings, seed, rep=0, step=None):
    """The ScriptStep of train_cycle0 (its record: (the best checkpoint, the FLOPs record))."""
    tdir, cmd = cycle0_command(run, name, base_config, settings, seed, rep)
    record = lambda s, secs: (os.path.abspath(os.path.join(tdir, "ckpt.pt")), flops.step_train(s))  # noqa: E731
    return ScriptStep(tdir, step, label, cmd, os.path.join(tdir, "train_summary.json"), record)

def model_data_dir(run, name):
    """The text cycle-0 model `name` trains on: the judge's own, the more-data control's 2D, the heldout arm's (1 - h) D
    (its name's prefix), else the arms'."""
    if name == "judge" and run.judge_data_dir:
        return run.judge_data_dir
    if name.startswith("more_data"):
        return run.args.more_data_dir
    return run.args.heldout_dirs[0] if name.startswith("heldout") else run.data_dir


def best_point(grid):
    """The grid point (base_grid's record) of the lowest dev loss."""
    return min(grid, key=lambda p: p["dev_loss"] if p["dev_loss"] is not None else float("inf"))


def cycle0_command(run, name, base_config, settings, seed, rep=0):
    """(its directory, train.py's command) of replicate rep's cycle-0 model `name`; settings' init_from (a
    model to start from) is left out once the model has a checkpoint of its own to resume."""
    tdir = os.path.join(cycle0_dir(run, rep), name)
    data_dir = model_data_dir(run, name)
    resume = os.path.exists(os.path.join(tdir, "last.pt")) or os.path.exists(os.path.join(tdir, "ckpt.pt"))
    settings = {k: v for k, v in settings.items() if not (resume and k == "init_from")}
    cmd = ["train.py"] + argv({"config": base_config, "out_dir": tdir, "data_dir": data_dir, "seed": seed}) \
        + run.dev + run.track(tdir) + argv(settings) + run.extra.get(name, [])
    return tdir, cmd + (["--resume"] if resume else [])

def cycle0_spec(run, name, rep=0):
    """(what it is, the preset's train.py settings or None, the checkpoint given instead or None, its seed)
    of a cycle-0 model: replicate rep's base generator or detector trunk (the replicate's seed), or the judge
    (its own seed, the same in every replicate)."""
    a, p = run.args, run.preset
    seed = replicate_seed(a.seed, rep)
    return {"base": ("base model", p["base"], a.base_ckpt, seed),
            "detector_trunk": ("detector trunk (a stronger LM of the same data)", p.get("detector_trunk"),
                               a.detector_trunk_ckpt, seed),
            "judge": ("the judge (an independent LM of the train split)", p.get("judge"), a.judge_ckpt,
                      a.seed + JUDGE_SEED_OFFSET)}[name]

def train_together(run, base_config, rep=0):
    """The cycle-0 models replicate rep still trains (not given, not done; the judge in replicate 0 only),
    trained at once (parallel_cycle0), before base(), detector_trunk() and judge() measure them as they would
    have trained them."""
    jobs = []
    for name in ("base", "detector_trunk") + (("judge",) if rep == 0 else ()):
        what, settings, given, seed = cycle0_spec(run, name, rep)
        if run.preset.get("base_grid") and name in ("base", "judge"):  # base_grid trains them
            continue
        if given or settings is None or read_done(cycle0_dir(run, rep), name) is not None or \
                (name == "detector_trunk" and run.detector_name not in NEEDS_TRUNK):
            continue
        jobs.append((name, f"{rep_tag(rep)}cycle 0: {what}",
                     cycle0_command(run, name, base_config, settings, seed, rep)[1]))
    if len(jobs) > 1:
        os.makedirs(cycle0_dir(run, rep), exist_ok=True)
        run.run_together([(label, cmd) for _, label, cmd in jobs], [name for name, _, _ in jobs])
        run.trained.update((rep, name) for name, _, _ in jobs)


def rep_tag(rep):
    return f"seed {rep}: " if rep else ""

def base(run, base_config, rep=0):
    """Replicate rep's cycle-0 generator: --base_ckpt (every replicate's), or train.py with the preset's base
    settings from the replicate's seed; its val perplexity. Fixes the windows every generator is scored in (its
    context) and the sample length."""
    args = run.args
    c0 = cycle0_dir(run, rep)
    os.makedirs(c0, exist_ok=True)
    base = read_done(c0, "base")
    if base is None:
        grid = {}
        if args.base_ckpt:
            gen, cost = os.path.abspath(args.base_ckpt), None
        elif run.preset.get("base_grid"):
            gen, cost, grid = base_grid(run, base_config, rep)
        else:
            what, settings, _, seed = cycle0_spec(run, "base", rep)
            gen, cost = train_cycle0(run, "base", f"{rep_tag(rep)}cycle 0: {what}", base_config, settings, seed, rep)
        loss, ppl = run.val_perplexity(gen)
        base = run.mark_done(c0, "base", {"generator": gen, "val_loss": loss, "val_ppl": ppl, "flops": cost,
                                          **grid})
        note_peak("the cycle-0 generator's val perplexity")
    # every generator is scored in the cycle-0 generator's windows, sampled to one length
    run.eval_block_size = generator_block_size(base["generator"])
    run.sample_len = run.sample_len or run.eval_block_size
    return base

def base_grid(run, base_config, rep=0, what="base"):
    """MLE at its limit (the preset's base_grid): train.py at every dropout x weight decay of the grid from the
    replicate's seed, each stopped at the minimum of its val split (under --data_chars the dev slice), at once under
    parallel_cycle0 (replicate 0's judge beside them); the best there, continued by grid_continued. what: "base", or
    "more_data" (the positive control: the same recipe and selection on twice the data). Returns (its
    checkpoint, the FLOPs of the grid and continuation: tuning is part of its cost, every point's record: its
    settings, dev loss, the iteration and epoch of its minimum; the continuation's last)."""
    steps, regs, settings, seed, prefix, text, data_dir, train_tokens = grid_steps(run, base_config, rep, what)
    _, judge_settings, judge_given, judge_seed = cycle0_spec(run, "judge", rep)
    judge = what == "base" and rep == 0 and run.parallel_cycle0 and judge_settings is not None and not judge_given \
        and read_done(cycle0_dir(run, rep), "judge") is None
    if judge:  # the judge trains once, beside replicate 0's grid; cycle0_model measures it as trained
        steps.append(cycle0_step(run, "judge", "cycle 0: the judge", base_config, judge_settings, judge_seed))
    recs = run.run_steps(steps, together=run.parallel_cycle0)
    if judge:
        run.trained.add((0, "judge"))
    points = [grid_point(step, rec, train_tokens, reg) for step, rec, reg in zip(steps, recs, regs)]  # (not the judge)
    best = best_point(points)
    print(f"{rep_tag(rep)}{text} at its limit: dropout {best['dropout']:g}, weight decay {best['weight_decay']:g} (dev "
          f"loss {best['dev_loss']:.4f} at iteration {best['best_iter']}, epoch {best['epochs_at_best']:.1f}; the grid: "
          + ", ".join(f"{p['dev_loss']:.4f}" for p in points) + ")", flush=True)
    path, cost, cont = best["checkpoint"], sum(p["flops"] or 0 for p in points), None
    if run.preset.get("base_continued"):
        cont = grid_continued(run, base_config, best, (settings, seed, rep), prefix, data_dir)
        path, cost = cont["checkpoint"], cost + (cont["flops"] or 0)
    # the dev minimum strictly inside the schedule: a run that ended at max_iters may still have been gaining
    at_cap = any(p["stop_reason"] == "max_iters reached" for p in (best, cont) if p)
    return path, {"flops": cost, "chosen_flops": best["flops"]}, {"grid": points, "continued": cont, "at_cap": at_cap}


GRID = {"base": ("base_grid", "MLE"), "more_data": ("more_data_grid", "MLE on twice the data"),
        "heldout": ("heldout_base", "MLE on the heldout arm's (1 - h) D")}  # base_grid's what: its directory, its name


class GridSteps(NamedTuple):
    """base_grid's training steps and what selects among them (grid_steps)."""
    steps: list  # one ScriptStep per grid point
    regs: list  # their (dropout, weight decay)
    settings: dict  # the schedule's train.py settings
    seed: int
    prefix: str  # the grid's directory in cycle_0
    text: str  # its name in the log
    data_dir: str
    train_tokens: int


def grid_steps(run, base_config, rep, what):
    """base_grid's GridSteps: one step per grid point; a replicate past 0 trains replicate 0's chosen point alone,
    the heldout arm's generator the base's."""
    _, settings, _, seed = cycle0_spec(run, "base", rep)
    prefix, text = GRID[what]
    data_dir = model_data_dir(run, prefix)
    grid, train_tokens = run.preset["base_grid"], len(Corpus(data_dir).train)
    settings = schedule_for(settings, base_config, train_tokens, run.preset.get("base_min_epochs"))
    regs = [(d, wd) for d in grid["dropout"] for wd in grid["weight_decay"]]
    # chosen once per D, on replicate 0's dev slice: every other seed trains at that point alone (the heldout arm's
    # generator, in every seed, at the base's: the same recipe and selection, its FLOPs charged to the arm)
    chosen = grid_choice(run) if what == "heldout" else grid_choice(run, what) if rep > 0 else None
    if chosen:
        regs = [chosen]
    steps = [cycle0_step(run, os.path.join(prefix, f"dropout{d:g}_wd{wd:g}"), f"{rep_tag(rep)}cycle 0: {text} at "
                         f"dropout {d:g}, weight decay {wd:g}", base_config, {**settings, "dropout": d, "weight_decay": wd},
                         seed, rep, "train") for d, wd in regs]
    return GridSteps(steps, regs, settings, seed, prefix, text, data_dir, train_tokens)


def grid_choice(run, what="base"):
    """Replicate 0's best grid point (dropout, weight decay) of `what` (base_grid's), or None before it has one."""
    rec = read_done(cycle0_dir(run, 0), what)
    if not rec or not rec.get("grid"):
        return None
    best = best_point(rec["grid"])
    return best["dropout"], best["weight_decay"]


def grid_point(step, rec, train_tokens, reg):
    """A trained grid point's record, from its train_summary.json; reg: its (dropout, weight decay)."""
    s = read_json(step.summary)
    per_iter = s["batch_size"] * s.get("gradient_accumulation_steps", 1) * s["block_size"]
    return {"dropout": reg[0], "weight_decay": reg[1],
            "checkpoint": rec[0], "dev_loss": s["best_val_loss"], "best_iter": s["best_iter"], "iters": s["iters"],
            "stop_reason": s["stop_reason"], "epochs_at_best": (s["best_iter"] or 0) * per_iter / train_tokens,
            "flops": rec[1] and rec[1]["flops"]}

def grid_continued(run, base_config, best, spec, prefix="base_grid", data_dir=None):
    """The grid's best point continued in the same-budget continuation's regime (the preset's base_continued: its
    learning rate and batch, constant), stopped at its dev minimum: where more MLE in that regime still gains, it is
    part of MLE's limit, not the arms'. Its record (dev_loss its minimum, dev_loss_before its iteration 0's; its
    iterations and epochs counted from the grid point). spec: (the base's settings, seed, replicate)."""
    rep = spec[2]
    step = continued_step(run, base_config, best, spec, prefix)
    rec = run.run_steps([step])[0]
    # its own evaluation at iteration 0 (the grid point, on the continuation's eval batches) is the "before"
    first = next(r for r in read_jsonl(os.path.join(step.d, "metrics.jsonl")) if r.get("step") == 0 and "val_loss" in r)
    point = {**grid_point(step, rec, len(Corpus(data_dir or run.data_dir).train), (best["dropout"], best["weight_decay"])),
             "dev_loss_before": first["val_loss"]}
    print(f"{rep_tag(rep)}MLE at its limit, continued: dev loss {first['val_loss']:.4f} -> {point['dev_loss']:.4f} "
          f"(its minimum at iteration {point['best_iter']} of {point['iters']})", flush=True)
    return point


def continued_step(run, base_config, best, spec, prefix):
    """grid_continued's training step: the grid point `best` (grid_point's record) continued."""
    settings, seed, rep = spec
    what = "" if prefix == "base_grid" else f" ({prefix})"
    return cycle0_step(run, os.path.join(prefix, "continued"), f"{rep_tag(rep)}cycle 0: MLE at its limit{what}, "
                       "continued at the continuation's learning rate and batch", base_config,
                       {**settings, "dropout": best["dropout"], "weight_decay": best["weight_decay"],
                        **run.preset["base_continued"], "init_from": best["checkpoint"]}, seed, rep, "train")


def cycle0_model(run, base_config, name, rep=0):
    """A cycle-0 model of the same data beside the generator (replicate rep's detector trunk, the judge): the
    checkpoint given on the command line, or train.py with the preset's settings from its seed (cycle0_spec)."""
    what, settings, given, seed = cycle0_spec(run, name, rep)
    settings = settings or {}
    c0 = cycle0_dir(run, rep)
    rec = read_done(c0, name)
    if rec is not None and given and rec["checkpoint"] != os.path.abspath(given):
        print(f"{name.replace('_', ' ')}: {given} is given in place of {rec['checkpoint']}: everything it measures is "
              f"measured again", flush=True)
        rec = None
    if rec is None:
        if given:
            path, cost = os.path.abspath(given), None
        else:
            if run.args.base_ckpt:
                print(cycle0_note(name, run.args.preset, base_config, settings), flush=True)
            path, cost = train_cycle0(run, name, f"{rep_tag(rep)}cycle 0: {what}", base_config, settings, seed, rep)
        loss, ppl = run.val_perplexity(path)
        rec = run.mark_done(c0, name, {"checkpoint": path, "val_loss": loss, "val_ppl": ppl, "flops": cost})
        note_peak(f"the {name.replace('_', ' ')}'s val perplexity")
    print(f"{rep_tag(rep)}{name.replace('_', ' ')} {rec['checkpoint']}: val loss {rec['val_loss']:.4f}, ppl {rec['val_ppl']:.3f}")
    return rec

def detector_trunk(run, base_config, rep=0):
    """Replicate rep's stronger LM whose frozen trunk the 'strong_trunk' detector reads: given (every
    replicate's), or trained in cycle 0 from the same data with the preset's detector_trunk settings from the
    replicate's seed (None for a recipe without a trunk)."""
    args = run.args
    if run.detector_name not in NEEDS_TRUNK:
        return None
    if run.preset.get("trunk_is_base") and not args.detector_trunk_ckpt:  # MLE at its limit is the trunk
        base = read_done(cycle0_dir(run, rep), "base")
        return {"checkpoint": base["generator"], "val_loss": base["val_loss"], "val_ppl": base["val_ppl"],
                "flops": base["flops"], "is_base": True}
    if not args.detector_trunk_ckpt and run.preset.get("detector_trunk") is None:
        raise ProjectError(f"the {run.detector_name!r} detector needs a stronger LM's trunk, and preset "
                           f"{args.preset!r} trains none",
                           "pass --detector_trunk_ckpt PATH (a generator of the same data, trained "
                           "longer or larger), or use --preset demo")
    return cycle0_model(run, base_config, "detector_trunk", rep)

def judge(run, base_config):
    """The independent judge of sample quality: given, or trained in cycle 0 with the preset's judge
    settings from its own seed (--seed + JUDGE_SEED_OFFSET), so no arm trains on, starts from or is
    rewarded by it. Loaded once, at its first use (Run.judge_model): every sweep scores its samples with it."""
    args = run.args
    if not args.judge_ckpt and run.preset.get("judge") is None:
        raise ProjectError(f"preset {args.preset!r} trains no judge", "pass --judge_ckpt PATH (a generator of "
                           "the same data and tokenizer that no arm starts from, e.g. a larger model)")
    rec = cycle0_model(run, base_config, "judge")
    run.judge_model, run.judge_rec = None, rec
    return rec


def compute_control(run, base_config, rep, target_flops):
    """Replicate rep's compute-matched MLE control (--compute_control): the base recipe from the base's seed, its
    schedule stretched to as many iterations as target_flops (the adversarial arm's whole FLOPs) buys at the base's
    FLOPs per iteration, trained after the replicate's cycles. Its record: the checkpoint, its own FLOPs (train.py
    may stop it early at its val minimum: then fewer) and the target."""
    c0 = cycle0_dir(run, rep)
    rec = read_done(c0, "compute_control")
    if rec is None:
        what, settings, _, seed = cycle0_spec(run, "base", rep)
        base = read_done(c0, "base")
        per_iter = base["flops"]["flops"] / read_json(os.path.join(c0, "base", "train_summary.json"))["iters"]
        iters = max(1, round(target_flops / per_iter))
        path, cost = train_cycle0(run, "compute_control", f"{rep_tag(rep)}compute-matched MLE control ({iters} "
                                  f"iterations of the base recipe)", base_config,
                                  {**settings, "max_iters": iters, "lr_decay_iters": iters}, seed, rep)
        rec = run.mark_done(c0, "compute_control", {"checkpoint": path, "flops": cost, "target_flops": target_flops,
                                                    "iters": iters})
    return rec
