"""
The GPU check's one table (bench/gpu_check.sh), from what its stages left in OUT: the machine, each stage's
exit status and time, the suite's counts, the anchors (training against nanoGPT's model, decode against HF
generate with a static cache and the memory floor), the GRPO step's split with either decoder, and the gpu
preset's run: its time, stamp, verdicts and steps with their time and peak memory.

    python bench/gpu_report.py bench/results/gpu_check > bench/results/gpu_check/gpu_check.md
"""
import json
import os
import re
import sys


def read(out, name):
    path = os.path.join(out, name)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8", errors="replace") as f:
        return json.load(f) if name.endswith(".json") else f.read()


def stages(out):
    rows = {}
    for line in (read(out, "stages.txt") or "").splitlines():
        name, rc, secs = line.split()[:3]
        rows[name] = (rc, int(secs), " ".join(line.split()[3:]))
    return rows


def status(st, name):
    rc, secs, why = st.get(name, ("not run", 0, ""))
    word = {"0": "exit 0", "124": "TIMED OUT", "skipped": "skipped " + why}.get(rc, f"exit {rc}")
    return word, secs


def suite_line(out, log="suite.log"):
    counts = re.findall(r"(\d+) (passed|failed|skipped|errors?|xfailed|deselected)", read(out, log) or "")
    return ", ".join(f"{n} {w}" for n, w in counts[-5:]) or "no summary"


def failures(out, limit=10):
    """The suites' FAILED / ERROR lines (pytest's short summary), so the table names what broke, and where
    each test that ran past faulthandler_timeout was (its stack dump's innermost frame in tests/)."""
    lines = []
    for log in ("cuda_tests.log", "suite.log"):
        text = read(out, log) or ""
        lines += [line.strip()[:200] for line in text.splitlines() if re.match(r"(FAILED|ERROR) tests/", line)]
        for dump in text.split("Timeout (")[1:]:
            frame = re.search(r'File ".*?(tests/\w+\.py)", line (\d+) in (\w+)', dump)
            if frame:
                lines.append(f"still running at the timeout: {frame[1]}:{frame[2]} in {frame[3]}")
    return lines[:limit] + ([f"... and {len(lines) - limit} more (logs.tgz)"] if len(lines) > limit else [])


def anchor_rows(out):
    """(what, ours, anchor, ratio) rows from the probe, else bench_generate.py --gpt2."""
    rows = []
    p = {**(read(out, "probe_train.json") or {}), **(read(out, "probe.json") or {})}  # its two stages' files
    if p:
        for mode in ("eager", "compile"):
            o, n = p.get(f"train_ours_{mode}"), p.get(f"train_nanogpt_{mode}")
            if isinstance(o, dict) and isinstance(n, dict):
                rows.append((f"training, GPT-2 124M bf16, {mode} (ms/iter)", f"{o['ms_per_iter']:.1f}",
                             f"nanoGPT {n['ms_per_iter']:.1f}", f"{n['ms_per_iter'] / o['ms_per_iter']:.2f}x"))
        hf, what = p.get("decode_hf_bf16_static_compile"), "HF static"
        if not isinstance(hf, dict):  # its compile failed or timed out (or a CPU run): the dynamic cache
            hf, what = p.get("decode_hf_bf16_dynamic"), "HF dynamic"
        for k in ("fp32", "bf16_autocast", "bf16_weights"):
            d = p.get(f"decode_ours_{k}")
            if isinstance(d, dict) and isinstance(hf, dict):
                rows.append((f"decode, batch 64, 32 + 224, ours {k} (ms/step)", f"{d['ms_per_step']:.2f}",
                             f"{what} {hf['ms_per_step']:.2f}", f"{hf['ms_per_step'] / d['ms_per_step']:.2f}x"))
        fl = p.get("floor")
        if isinstance(fl, dict):
            rows.append(("decode: the memory floor (ms/step)", "", f"{fl['ms_per_step']:.3f}", ""))
    d = read(out, "decode.json")
    if d:
        hf = d.get("hf_bf16_static", {}).get("ms_per_step")
        for k in ("ours_static_fp32", "ours_static_bf16_autocast", "ours_static_bf16_weights", "ours_eager_bf16_autocast"):
            if k in d and hf:
                rows.append((f"decode, batch 64, 32 + 224, {k} (ms/step)", f"{d[k]['ms_per_step']:.2f}",
                             f"HF static {hf:.2f}", f"{hf / d[k]['ms_per_step']:.2f}x"))
        if "compiled_vs_uncompiled" in d:
            u = d["ours_static_bf16_weights_uncompiled"]["ms_per_step"]
            rows.append(("decode, bf16 weights, the compiled step (ms/step)",
                         f"{d['ours_static_bf16_weights']['ms_per_step']:.2f}", f"uncompiled {u:.2f}",
                         f"{d['compiled_vs_uncompiled']:.2f}x"))
        rows.append(("decode: the memory floor (ms/step)", "", f"{d['floor_ms_per_step']:.3f}",
                     f"best ours at {100 * d['ours_of_floor']:.0f} %"))
    return rows


def compile_failures(out):
    """The benchmarks' own record of a compiled decode step that failed to compile (it then ran uncompiled,
    so its 'compiled' figures are the uncompiled step's)."""
    lines = []
    d = read(out, "decode.json") or {}
    for why in (d.get("decode") or {}).get("compile_failed", []):
        lines.append(f"decode: the compiled step FAILED to compile, its rows ran uncompiled: {why[:300]}")
    for r in (read(out, "grpo_step.json") or {}).get("rows", []):
        for why in (r.get("decode") or {}).get("compile_failed", []):
            lines.append(f"GRPO step, {r['decoder']}: the compiled step FAILED to compile, it ran uncompiled: {why[:300]}")
    return lines


def grpo_rows(out):
    g = read(out, "grpo_step.json")
    if not g:
        return []
    return [(r["decoder"], *(f"{r[k]:.3f}" for k in ("rollout_s", "score_s", "update_s", "step_time_s")))
            for r in g["rows"]], g.get("speedup"), g.get("compiled_speedup")


STEP = re.compile(r"^--- (.+?): exit (\d+) after ([\d.]+) s(?:; peak memory: (.*))?$")


def preset_rows(out, log):
    rows = [m.groups() for m in (STEP.match(line) for line in (read(out, log) or "").splitlines()) if m]
    own = re.findall(r"^run_cycles peak memory: (.*) \(after (.*)\)$", read(out, "preset.log") or "", re.M)
    return rows, own


def main(out):
    st = stages(out)
    print(f"# GPU check\n\n```\n{(read(out, 'machine.txt') or '').strip()}\n```\n")
    print("| stage | status | seconds |\n|---|---|---|")
    for name in st:
        word, secs = status(st, name)
        print(f"| {name} | {word} | {secs} |")
    print(f"\n**Test suite with CUDA visible:** the cuda-marked tests: {suite_line(out, 'cuda_tests.log')}; "
          f"the rest: {suite_line(out)}\n")
    for line in failures(out):
        print(f"- {line}")
    rows = anchor_rows(out)
    if rows:
        print("| anchor | ours | anchor | anchor / ours |\n|---|---|---|---|")
        for r in rows:
            print("| " + " | ".join(r) + " |")
    for line in compile_failures(out):
        print(f"\n- {line}")
    g = grpo_rows(out)
    if g:
        print("\n**GRPO step, 64 x 256 tokens (gpt2 policy and reference, gpt2-medium detector), median s:**\n")
        print("| decoder | rollout | scoring | update | step |\n|---|---|---|---|---|")
        for r in g[0]:
            print("| " + " | ".join(r) + " |")
        if g[1]:
            print(f"\nstatic decoder: {g[1]:.2f}x the eager loop's step")
        if g[2]:
            print(f"\ncompiled step: {g[2]:.2f}x the uncompiled one's rollout")
    rows, own = preset_rows(out, "preset_steps.log")
    if rows:
        word, secs = status(st, "preset")
        print(f"\n**run_cycles.py --preset gpu --device cuda: {word} after {secs} s**\n")
        summary = read(out, "preset_summary.json")
        if summary and "settings" in summary:  # a run cut short leaves a summary of its cycles only
            s = summary["settings"]
            print(f"{s.get('device_name')}, {s.get('dtype')}, commit {summary.get('commit')}, corpus "
                  f"{summary.get('data_source')}; base val ppl {summary['base']['val_ppl']:.3f}; "
                  f"run_cycles' own time {summary['seconds_this_invocation']:.0f} s\n")
            for arm, a in (summary.get("frontier") or {}).get("cycle_1", {}).get("arms", {}).items():
                for control, v in a.get("verdicts", {}).items():  # each arm against each MLE control
                    at = []
                    for match, axis in (("quality", "val NLL"), ("coverage", "judge NLL")):
                        c = v.get(f"at_{match}") or {}
                        if "diff" in c:
                            at.append(f"matched {match}: {axis} {c['diff']:+.4f}, threshold {c['threshold']:.4f}, "
                                      f"T* {c['t_star']:.2f}, {c['verdict']}")
                    d = (v.get("at_coverage") or {}).get("degenerate") or {}
                    if d:
                        at.append(f"degenerate samples {d['arm']:.3f} (the control's at T* {d['control']:.3f})")
                    print(f"- {arm} vs {control}: {v['verdict']}" + (f" ({'; '.join(at)})" if at else ""))
            info = (summary.get("information") or {}).get("cycle_1")
            if info and "trunk" in info.get("took", {}):  # the trend table's share (docs/results.md)
                print(f"- the detector's information {info['lower'][0]:.4f}-{info['upper']:.4f} nats/token of its "
                      f"trunk's advantage {-info['took']['trunk'][0]:.4f}")
            print()
        print("| step | exit | seconds | peak memory |\n|---|---|---|---|")
        for name, rc, secs, peak in rows:
            print(f"| {name} | {rc} | {secs} | {peak or ''} |")
        for peak, what in own:
            print(f"| run_cycles: {what} | | | {peak} |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench/results/gpu_check")
