#!/usr/bin/env bash
# Runs ON a lent GPU machine without a registry (docs/gpu-runs.md), after the device kit: a run
# longer than one call's 10-minute limit starts in the background in a session of its own (it
# outlives the call while the machine stays warm) and later calls wait for it, packing the run
# directory into $OUT every 15 s and at the end.
#   bash scripts/device/device-session.sh start JOURNEY [bench options]   install .whl/, llmopt doctor, start the run
#   bash scripts/device/device-session.sh wait SECONDS                     wait for the run (at most SECONDS), pack it
#   bash scripts/device/device-session.sh peer [llmopt check peer options] the serving peer check, into $OUT/peer
# Env: RUN (default /tmp/llmopt-run), MODEL (synthetic:llama2-7b), LLMOPT_COMMIT (the checkout's sha).
set -uo pipefail
RUN=${RUN:-/tmp/llmopt-run}
MODEL=${MODEL:-synthetic:llama2-7b}
export LLMOPT_CACHE=${LLMOPT_CACHE:-/tmp/llmopt-cache} PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if [ ! -e /tmp/llmsite/.done ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/llmsite .whl/*.whl && touch /tmp/llmsite/.done
fi
export PYTHONPATH=$PWD:/tmp/llmsite${PYTHONPATH:+:$PYTHONPATH}  # the checkout's code; the wheel for its entry points

pack() {  # atomic: a half-written archive never replaces a whole one
  [ -n "${OUT:-}" ] && [ -d "$RUN" ] || return 0
  cp "$RUN.console.log" "$OUT/" 2>/dev/null
  tar czf "$OUT/.run.tgz" --exclude='*.pt' -C "$(dirname "$RUN")" "$(basename "$RUN")" 2>/dev/null && mv -f "$OUT/.run.tgz" "$OUT/run.tgz"
}

case "${1:-}" in
  start)
    journey=$2; shift 2
    python3 -m llmopt_bench doctor --json > "${OUT:-/tmp}/doctor.json" 2> "${OUT:-/tmp}/doctor.err"; echo "doctor exit $?"
    nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv
    setsid nohup python3 -m llmopt_bench bench --stages "$journey" --model "$MODEL" --output "$RUN" "$@" \
      > "$RUN.console.log" 2>&1 < /dev/null &
    echo $! > "$RUN.pid"
    echo "started llmopt bench (pid $(cat "$RUN.pid")) into $RUN"
    ;;
  wait)
    limit=$2; start=$SECONDS
    while kill -0 "$(cat "$RUN.pid")" 2>/dev/null && [ $(( SECONDS - start )) -lt "$limit" ]; do
      sleep 5; [ $(( (SECONDS - start) % 15 )) -lt 5 ] && pack
    done
    pack
    if kill -0 "$(cat "$RUN.pid")" 2>/dev/null; then echo "still running after $(( SECONDS - start )) s"; else echo "finished"; fi
    grep -E "^\[|ETA|error|: ok|: skipped|: failed" "$RUN.console.log" | tail -40
    ;;
  peer)
    shift
    mkdir -p "${OUT:-/tmp}/peer"
    python3 -m llmopt_bench check peer --model "$MODEL" --out "${OUT:-/tmp}/peer" "$@" 2>&1 | tail -40
    ;;
  *) echo "usage: $0 start JOURNEY [options] | wait SECONDS | peer [options]"; exit 2 ;;
esac
