"""
A run's finished replicates, kept without their checkpoints, so that a long run survives the loss of its
directory (a machine that comes back empty) and resumes at its first unfinished seed.

  save_replicate / finished_replicate   run_cycles' record of one finished replicate (`replicate.done.json`):
                                        what its report needs (samples.md's rows too), so a resumed run
                                        reloads none of its checkpoints
  save / restore                        run_cycles --archive DIR: after each finished replicate, DIR keeps what a
                                        resume needs (about a megabyte a seed, to commit); at the start, what
                                        the run directory lacks comes back from DIR

What is kept: each finished replicate's record; replicate 0's choices that later seeds train at (MLE's grid
records, each tuned arm's grid.done.json) and the natural reference; the judge, whose checkpoint (weights only)
every later seed's sweep reads. An unfinished replicate keeps nothing: its steps feed each other checkpoints, so
it starts again.
The records name absolute paths: a restore moves them to its run directory (archive.json names the first).
"""
import json
import os
import re
import shutil

import torch

from core.errors import ProjectError
from core.files import atomic_write_text, check_writable_dir
from experiment import cycle0
from experiment.arms import ArmState, RunState
from experiment.samples import continuations, load_generator
from experiment.steps import done_path, read_done, read_json, replicate_root
from lib.checkpoint import read_checkpoint

REPLICATE = "replicate"
# replicate 0's records that later replicates read: the grid choices they train at (cycle0.grid_choice; and tuned_arms)
CHOICES = ("base", "more_data")


def save_replicate(run, state, base, trunk):
    """Mark replicate state.rep finished: its summary entries and rows, what run_meta reads of it, and the
    settings a resumed run must share to reuse it; with --archive, save the run there."""
    rec = {"arms": sorted(run.arms), "seeds_from": run.args.seed, "base": base, "trunk": trunk,
           "eval_block_size": run.eval_block_size, "sample_len": run.sample_len,
           "gens": [[n, arm, entry] for (n, arm), entry in state.gens.items()], "rows": state.rows,
           "stop_reason": state.stop_reason, "gen": state.gen, "gen_ppl": state.gen_ppl,
           "control_gen": state.arms["control"].gen if "control" in state.arms else None}
    if state.rep == 0 and run.args.archive:  # samples.md's T = 1 rows (replicate 0's; T* moves with every seed)
        gens = sorted({g["generator"] for g in state.gens.values() if g["arm"] != "sir"})
        rec["samples"] = {g: continuations(run, load_generator(run, g), 1.0) for g in gens}
    atomic_write_text(done_path(state.root, REPLICATE), json.dumps(rec) + "\n")  # (compact: it is committed)
    if run.args.archive:
        save(run.out_dir, run.args.archive)
    return rec


def finished_replicate(run, rep, base_config):
    """(RunState, base, trunk, the natural reference) of replicate rep from its record, where its checkpoints are
    gone (a run restored from its archive: --archive, read at replicate 0's call); None where they are here (its
    steps' own records resume it, and measure again what changed) or it has no record. A record made with other
    arms or seeds, its checkpoints gone, is refused: nothing could remake it. Sets the run's windows and sample
    length, as the replicate's base did, and in replicate 0 its judge (loaded at its first use: a later seed's
    sweep) and reference, as cycle 0 does."""
    if rep == 0 and run.args.archive:
        check_writable_dir(run.args.archive, "--archive")
        restore(run.args.archive, run.out_dir)
    root = replicate_root(run.out_dir, rep)
    rec = read_done(root, REPLICATE)
    if rec is None or os.path.exists(rec["base"]["generator"]):
        return None
    if (rec["arms"], rec["seeds_from"]) != (sorted(run.arms), run.args.seed):
        raise ProjectError(f"{done_path(root, REPLICATE)} was made with --arms {','.join(rec['arms'])} --seed "
                           f"{rec['seeds_from']}, and its checkpoints were not kept: this run's --arms "
                           f"{','.join(sorted(run.arms))} --seed {run.args.seed} cannot resume it",
                           "rerun with its --arms and --seed, or give another --out_dir (and --archive)")
    run.eval_block_size, run.sample_len = rec["eval_block_size"], run.sample_len or rec["sample_len"]
    run.kept_samples.update(rec.get("samples", {}))
    arms = {"adversarial": ArmState(rec["gen"], None)}
    if rec["control_gen"] is not None:
        arms["control"] = ArmState(rec["control_gen"], None)
    state = RunState(rep=rep, root=root, trunk=rec["trunk"], gens={(n, arm): e for n, arm, e in rec["gens"]},
                     arms=arms, gen_loss=None, gen_ppl=rec["gen_ppl"], stopper=None, rows=rec["rows"],
                     stop_reason=rec["stop_reason"])
    print(f"{cycle0.rep_tag(rep)}finished, its checkpoints not kept: reported from its {REPLICATE}.done.json")
    if rep:
        return state, None, None, None
    cycle0.judge(run, base_config)
    return state, rec["base"], rec["trunk"], run.reference()


def kept_files(run_dir):
    """The files of run_dir that save keeps (relative paths): each finished replicate's record; with
    replicate 0's, its grid choices, the natural reference and the judge's record."""
    keep = []
    for name in sorted(os.listdir(run_dir)):
        rep = 0 if name == f"{REPLICATE}.done.json" else int(name[5:]) if name.startswith("seed_") else None
        if rep is not None and os.path.exists(done_path(replicate_root(run_dir, rep), REPLICATE)):
            keep.append(os.path.relpath(done_path(replicate_root(run_dir, rep), REPLICATE), run_dir))
    if f"{REPLICATE}.done.json" in keep:
        keep += [p for p in ["reference.done.json", *(os.path.join("cycle_0", f"{c}.done.json") for c in CHOICES),
                             os.path.join("cycle_0", "judge.done.json")] if os.path.exists(os.path.join(run_dir, p))]
        keep += sorted(tuned_arms(run_dir))
    return keep


def tuned_arms(run_dir):
    """Replicate 0's choices of each tuned arm's grid point (<arm dir>/grid.done.json, experiment/tuning.py), which
    every later replicate trains at: relative paths."""
    for name in sorted(os.listdir(run_dir)):
        if name.startswith("cycle_") and name != "cycle_0":
            for root, _, files in os.walk(os.path.join(run_dir, name)):
                if "grid.done.json" in files:
                    yield os.path.relpath(os.path.join(root, "grid.done.json"), run_dir)


def save(run_dir, archive_dir):
    """Copy kept_files into archive_dir, and the judge's checkpoint as its weights alone (no optimizer state)."""
    keep = kept_files(run_dir)
    for rel in keep:
        os.makedirs(os.path.dirname(os.path.join(archive_dir, rel)) or archive_dir, exist_ok=True)
        shutil.copyfile(os.path.join(run_dir, rel), os.path.join(archive_dir, rel))
    judge = read_done(os.path.join(run_dir, "cycle_0"), "judge")
    rel = judge and os.path.relpath(judge["checkpoint"], os.path.abspath(run_dir))
    # (a judge outside the run, --judge_ckpt's, is the user's own file, kept by the user)
    if rel and not rel.startswith("..") and os.path.join("cycle_0", "judge.done.json") in keep and \
            not os.path.exists(os.path.join(archive_dir, rel)):  # (trained once: saved once)
        ckpt = {**read_checkpoint(judge["checkpoint"]), "optimizer": None}
        os.makedirs(os.path.dirname(os.path.join(archive_dir, rel)), exist_ok=True)
        torch.save(ckpt, os.path.join(archive_dir, rel))
    if rel and not rel.startswith("..") and os.path.exists(os.path.join(archive_dir, rel)):
        keep.append(rel)
    atomic_write_text(os.path.join(archive_dir, "archive.json"),
                      json.dumps({"run_dir": os.path.abspath(run_dir), "files": sorted(keep)}, indent=2) + "\n")
    print(f"kept {len(keep)} files of {run_dir} in {archive_dir}")
    return keep


def restore(archive_dir, run_dir):
    """Copy an archive into run_dir (made if missing), leaving what run_dir already has; its records' paths
    moved from the directory the run was made in (archive.json) to run_dir."""
    meta = os.path.join(archive_dir, "archive.json")
    if not os.path.exists(meta):
        if os.listdir(archive_dir):
            raise ProjectError(f"--archive {archive_dir} holds files but no archive.json: it is not a run's archive",
                               "name a new or empty directory, or the one an earlier run of this command kept")
        return 0
    made_in = read_json(meta)["run_dir"]
    old, new = (json.dumps(os.path.abspath(p))[1:-1] for p in (made_in, run_dir))  # (as written in JSON)
    # a whole path, or what lies under it: at the start of a JSON string or of an ensemble's '+'-joined member
    at = re.compile(r'(?<=["+])' + re.escape(old) + r'(?=[/"+])')
    n = 0
    for root, _, files in os.walk(archive_dir):
        for f in files:
            src = os.path.join(root, f)
            dst = os.path.join(run_dir, os.path.relpath(src, archive_dir))
            if f == "archive.json" or os.path.exists(dst):
                continue
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            if f.endswith(".json"):
                with open(src) as fh:
                    atomic_write_text(dst, at.sub(lambda _: new, fh.read()))
            else:
                shutil.copyfile(src, dst)
            n += 1
    if n:
        print(f"restored {n} files of the archive {archive_dir} into {run_dir}")
    return n
