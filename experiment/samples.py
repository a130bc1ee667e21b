"""
samples.md: a few fixed val prompts and every generator's continuations of them, at T = 1 and, for the
controls, at the temperature where they matched the adversarial arm's quality. The one part of the report
that runs the models (it loads each checkpoint and generates).
"""
import os

from core.files import atomic_write_text
from experiment.markdown import md_cell, wrap
from experiment.measures import corpus_tokenizer, decode_rows, generated_blocks, natural_blocks, val_tokens
from lib.checkpoint import load_model
from lib.ensemble import load_ensemble

SAMPLE_PROMPTS = 4  # prompts in samples.md


def write_samples(path, prompts, natural, columns, missing=()):
    """samples.md: for each fixed val prompt, the natural continuation and every generator's, one
    table per prompt. columns: [(label, temperature, [continuation text per prompt])]."""
    out = ["# Samples", "", wrap(
           "The same val prompts and sampling noise for every generator; the prompt is shown once, each row "
           "is what follows it. T is the sampling temperature: T = 1 is the model as trained; T* is summary.md's "
           "matched quality, the temperature at which that control's samples score the same judge NLL (mean "
           "per-token NLL under the independent judge) as the adversarial arm's at T = 1, where the verdict "
           "compares the two arms' val NLL."), ""]
    for i, prompt in enumerate(prompts):
        out += [f"## Prompt {i + 1}", "", "```", prompt, "```", "",
                "| source | T | continuation |", "|---|---|---|",
                f"| natural text | - | {md_cell(natural[i])} |"]
        out += [f"| {label} | {t:.2f} | {md_cell(texts[i])} |" for label, t, texts in columns]
        out.append("")
    if missing:
        out += [wrap("Not shown, their checkpoints not kept (a run resumed from its archive, experiment/archive.py): "
                     + "; ".join(missing) + "."), ""]
    atomic_write_text(path, "\n".join(out) + "\n")


def sample_plan(gens, report):
    """samples.md's rows: [(generator entry, T, label)], every generator of replicate 0 at T = 1 (the SIR
    arm has no checkpoint: a sampler over its entering generator's samples), each control also at the
    T* where it matched the adversarial arm's quality (frontier_report's matched_temperature; the
    detector trunk, of cycle 0, once per cycle it was matched in)."""
    matched = {}  # a control's (cycle, arm) -> [(T*, the cycle of the adversarial arm it matched)]
    for n, r in report.items():
        for cname, t in r["matched_temperature"].items():
            matched.setdefault((0, cname) if cname in ("trunk", "compute") else (n, cname), []).append((t, n))
    plan = []
    for g in gens:
        if g["arm"] == "sir" or g.get("replicate"):
            continue
        name = f"cycle {g['cycle']} {g['arm']}"
        plan.append((g, 1.0, name))
        plan += [(g, t, f"{name} at T* (the quality of cycle {n} adversarial)")
                 for t, n in matched.get((g["cycle"], g["arm"]), [])]
    return plan


def load_generator(run, gen):
    """A generator of summary.json (its "generator": a checkpoint, or an ensemble's '+'-joined), or None where
    its checkpoints are not on disk (a run resumed from its archive, experiment/archive.py)."""
    one = os.path.exists(gen)  # (a path may hold '+' itself)
    if not one and not all(map(os.path.exists, gen.split("+"))):
        return None
    return load_model(gen, device=run.device, require_mode="generator")[0] if one else \
        load_ensemble(gen.split("+"), run.device)


def continuations(run, model, t):
    """A generator's continuations of samples.md's prompts at temperature t, decoded."""
    L = run.sample_len
    P = max(1, L // 4)
    rows = generated_blocks(model, val_tokens(run.corpus), SAMPLE_PROMPTS, L, run.args.seed, run.device, t, prompt_len=P)
    return decode_rows(corpus_tokenizer(run.corpus), rows[:, P:])


def write_samples_md(run, gens, report, kept=None):
    """samples.md: a few fixed val prompts (a quarter of a sample each), the natural continuation and
    every generator's at T = 1 and, for the controls, at summary.md's T* (sample_plan; report:
    frontier_report of the same generators). run: the Run (experiment/steps.py), for its
    corpus, device and sample settings. kept: {generator: its T = 1 continuations}, for generators whose
    checkpoints are gone (an archived replicate's); a row with neither is left out and named at the end."""
    L, seed = run.sample_len, run.args.seed
    P = max(1, L // 4)
    val, tok = val_tokens(run.corpus), corpus_tokenizer(run.corpus)
    nat = natural_blocks(val, SAMPLE_PROMPTS, L, seed)
    columns, loaded, missing = [], {}, []
    for g, t, label in sample_plan(gens, report):
        if g["generator"] not in loaded:  # each checkpoint once, for all of its rows
            loaded = {g["generator"]: load_generator(run, g["generator"])}
        if loaded[g["generator"]] is not None:
            columns.append((label, t, continuations(run, loaded[g["generator"]], t)))
        elif t == 1.0 and g["generator"] in (kept or {}):
            columns.append((label, t, kept[g["generator"]]))
        else:
            missing.append(f"{label} (T = {t:.2f})")
    path = os.path.join(run.out_dir, "samples.md")
    write_samples(path, decode_rows(tok, nat[:, :P]), decode_rows(tok, nat[:, P:]), columns, missing)
    return path
