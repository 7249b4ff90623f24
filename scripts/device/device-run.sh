#!/usr/bin/env bash
# Runs ON a lent GPU machine that has no package registry (docs/gpu-runs.md): installs llmopt
# and the wheels carried in .whl/ (llmopt itself for its entry points, pydantic, bitsandbytes,
# flash-attn), then runs `llmopt bench` into a run directory that survives between calls while
# the machine stays warm (--resume). The run is packed into $OUT every 15 s and at the end, so a
# call cut off by its limit still brings back every stage that finished.
# Usage: STAGES=hf-fp16,bnb-int8 [MODEL=...] [RUN=/tmp/llmopt-run] [LIMIT=540] [LLMOPT_COMMIT=<sha>] bash scripts/device/device-run.sh [bench options]
# (the tree travels without .git: pass LLMOPT_COMMIT=$(git rev-parse HEAD) from the checkout so run.json names the commit)
set -uo pipefail
RUN=${RUN:-/tmp/llmopt-run}
MODEL=${MODEL:-synthetic:llama2-7b}
STAGES=${STAGES:-all}
export LLMOPT_CACHE=${LLMOPT_CACHE:-/tmp/llmopt-cache} PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if [ ! -e /tmp/llmsite/.done ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/llmsite .whl/*.whl && touch /tmp/llmsite/.done
fi
export PYTHONPATH=/tmp/llmsite${PYTHONPATH:+:$PYTHONPATH}

pack() {  # atomic: a half-written archive never replaces a whole one
  [ -n "${OUT:-}" ] && [ -d "$RUN" ] || return 0
  cp "$RUN.console.log" "$OUT/" 2>/dev/null
  tar czf "$OUT/.run.tgz" -C "$(dirname "$RUN")" "$(basename "$RUN")" 2>/dev/null && mv -f "$OUT/.run.tgz" "$OUT/run.tgz"
}
rm -f "$RUN.stop"
( while [ ! -e "$RUN.stop" ]; do sleep 5; [ $(( SECONDS % 15 )) -lt 5 ] && pack; done ) &
packer=$!

if [ -f "$RUN/run.json" ]; then where=(--resume "$RUN"); else where=(--output "$RUN"); fi
start=$(date +%s)
timeout --signal=TERM "${LIMIT:-540}" python3 -m llmopt_bench bench --stages "$STAGES" --model "$MODEL" "${where[@]}" --no-report "$@" 2>&1 | tee -a "$RUN.console.log"
rc=${PIPESTATUS[0]}
touch "$RUN.stop"; wait "$packer"  # the loop ends within 5 s: never two tars on one archive
echo "llmopt exit $rc after $(( $(date +%s) - start )) s (stages: $STAGES)" | tee -a "$RUN.console.log"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv | tee -a "$RUN.console.log"
pack
exit $rc
