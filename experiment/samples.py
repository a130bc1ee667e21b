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


def write_samples(path, prompts, natural, columns):
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


def write_samples_md(run, gens, report):
    """samples.md: a few fixed val prompts (a quarter of a sample each), the natural continuation and
    every generator's at T = 1 and, for the controls, at summary.md's T* (sample_plan; report:
    frontier_report of the same generators). run: the Run (experiment/steps.py), for its
    corpus, device and sample settings."""
    L, seed = run.sample_len, run.args.seed
    P = max(1, L // 4)
    val, tok = val_tokens(run.corpus), corpus_tokenizer(run.corpus)
    nat = natural_blocks(val, SAMPLE_PROMPTS, L, seed)
    columns, loaded = [], {}
    for g, t, label in sample_plan(gens, report):
        if g["generator"] not in loaded:  # each checkpoint once, for all of its rows (an ensemble's: '+'-joined)
            one = os.path.exists(g["generator"])  # (a path may hold '+' itself)
            loaded = {g["generator"]: load_model(g["generator"], device=run.device, require_mode="generator")[0]
                      if one else load_ensemble(g["generator"].split("+"), run.device)}
        rows = generated_blocks(loaded[g["generator"]], val, SAMPLE_PROMPTS, L, seed, run.device, t, prompt_len=P)
        columns.append((label, t, decode_rows(tok, rows[:, P:])))
    path = os.path.join(run.out_dir, "samples.md")
    write_samples(path, decode_rows(tok, nat[:, :P]), decode_rows(tok, nat[:, P:]), columns)
    return path
