#!/usr/bin/env bash
# The turn's ONE device script: every GPU measurement the open issues need, in priority order, in
# one detached run on the lent H200, each step within the device time left (docs/gpu-runs.md).
# Runs ON the device, from the checkout root, after the workplace's kit (../shared/device).
#
#   bash scripts/device-turn.sh start     byte-compile the kit, install .whl/, doctor, start `plan` detached
#   bash scripts/device-turn.sh wait S    wait for the plan (at most S s), pack $DEV into $OUT/turn.tgz
#   bash scripts/device-turn.sh plan      (what `start` runs) the steps below, one after the other
#
# The steps, highest priority first; each runs only if its estimate fits the budget left, else
# it is logged as skipped with the minutes it needs (plan.log, steps.tsv):
#   1. prefix     the prefix-caching stage on the shared-prefix workload (issue 27)
#   2. quick      `llmopt bench --preset quick` cold: the refactored package on CUDA (issue 26)
#   3. compare    llmopt compare of that run against the committed H200 baseline (no GPU)
#   4. capacity   scripts/capacity-check.py: llmopt's capacity under the SLO on one vllm serve,
#                 held, then vLLM's own client at C and 1.15 C (issue 23, ended blocked)
#   5. pinning    scripts/pinning-spread.py on the Llama-2-7B shape (issue 25, ended blocked)
#   6. journey    `llmopt bench --stages all` cold (issue 24, ended blocked; ~23 min: a session of its own)
#
# Env: DEV (/tmp/llmopt-turn), MODEL (synthetic:llama2-7b), BUDGET_S (seconds from `start` the
# plan may use; default 1560: 30 minutes less the kit's ~3 and a margin), LLMOPT_COMMIT.
# Dry run on a CPU machine (synthetic:tiny, the CPU journey, small budgets):
#   DRY=1 DEV=/tmp/turn-dry bash scripts/device-turn.sh plan
set -uo pipefail
DEV=${DEV:-/tmp/llmopt-turn}
DRY=${DRY:-0}
if [ "$DRY" = 1 ]; then MODEL=${MODEL:-synthetic:tiny}; BUDGET_S=${BUDGET_S:-2400}; else MODEL=${MODEL:-synthetic:llama2-7b}; BUDGET_S=${BUDGET_S:-1560}; fi
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
  if [ "$DRY" = 1 ]; then  # every step's command as on the device, at a CPU's size
    step prefix 600 $PY -m llmopt_bench bench --stages journeys/prefix-caching-cpu.toml --model "$MODEL" --output "$DEV/prefix"
    step quick 600 $PY -m llmopt_bench bench --preset quick --model "$MODEL" --num-prompts 2 --max-new-tokens 8 \
      --output "$DEV/quick"
    step compare 60 $PY -m llmopt_bench compare "$DEV/quick" "$DEV/quick" --format json -o "$DEV/compare.json"
    step capacity 600 $PY scripts/capacity-check.py --model "$MODEL" --dtype float32 --slo ttft_p99=250ms,tpot_p99=20ms \
      --input-len 64 --output-len 16 --hold 10 --bench-s 10 --budget-s 420 --out "$DEV/capacity"
    step pinning 300 $PY scripts/pinning-spread.py --model "$MODEL" --blocks 2 --repeats 3 --num-prompts 2 --max-new-tokens 16 \
      --json "$DEV/pinning.json"
    step journey 9999 $PY -m llmopt_bench bench --stages all --model "$MODEL" --output "$DEV/journey"  # skipped: the budget check
    return
  fi
  # 2026-12-05: issues 23-25 ended blocked last session; the open ones need the prefix-caching
  # figures (27) and the refactored package run on CUDA (26), so those come first, the journey last.
  # PREFIX_TRIM=1: the same stage with 6 search trials and concurrency 1 and 64 only (~1.5 min less),
  # for a session whose device time is short (2026-12-05's second machine)
  local pc=journeys/prefix-caching.toml need=780
  if [ "${PREFIX_TRIM:-0}" = 1 ]; then
    need=420
    sed 's/search_max_probes = 8/search_max_probes = 6/; s/concurrency = \[1, 16, 64\]/concurrency = [1, 64]/' "$pc" > "$DEV/prefix-trim.toml"
    pc=$DEV/prefix-trim.toml
  fi
  step prefix "$need" $PY -m llmopt_bench bench --stages "$pc" --model "$MODEL" --output "$DEV/prefix"
  # the default workload (not the preset's lighter one), so compare pairs it with the baseline's stages
  step quick 540 $PY -m llmopt_bench bench --preset quick --model "$MODEL" --num-prompts 8 --max-new-tokens 100 \
    --warmup 2 --repeats 3 --output "$DEV/quick"
  step compare 30 $PY -m llmopt_bench compare results/baselines/nvidia-h200-synthetic-llama2-7b.json "$DEV/quick" \
    --format json -o "$DEV/compare.json"
  step capacity 300 $PY scripts/capacity-check.py --model "$MODEL" --budget-s "$(( $(left) - 20 ))" --out "$DEV/capacity"
  step pinning 240 $PY scripts/pinning-spread.py --model "$MODEL" --blocks 4 --repeats 5 --num-prompts 4 --max-new-tokens 100 \
    --json "$DEV/pinning.json"
  step journey 1380 $PY -m llmopt_bench bench --stages all --model "$MODEL" --output "$DEV/journey"
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
    if [ -f scripts/device-compile.sh ]; then bash scripts/device-compile.sh | tail -4; fi
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
