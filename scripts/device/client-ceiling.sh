#!/usr/bin/env bash
# The client's own ceiling on a lent GPU host (issue 47: >= 5,000 req/s of 100-token streams, send
# delay p99 under 1 ms, on its 16 cores). One call, no GPU and no vLLM needed: the test servers
# (client/test_server.py) on six cores (one Python server writes ~100k events a second: six carry
# the goal's 500k), the client on the other ten: one process, then ten worker processes.
#   here:  bash scripts/device/make-whl.sh, then pydantic's four wheels (the image lacks it; the kit brings it):
#          .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#            --platform manylinux2014_x86_64 --platform any -d .whl pydantic==2.14.4 pydantic-core==2.50.5 \
#            annotated-types==0.8.0 typing-inspection==0.4.5
#   there: carry [".whl"], command `bash scripts/device/client-ceiling.sh` ($OUT: json + log)
# LIMIT (s) bounds the measurement; what it measured is written point by point to the log.
set -uo pipefail
OUT=${OUT:-/tmp/ceiling-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
SERVERS=${SERVERS:-0,1,2,3,4,5}
CLIENT=${CLIENT:-6,7,8,9,10,11,12,13,14,15}
{ echo "commit $(cat .whl/COMMIT) · $(nproc) cores · $(date -u +%FT%TZ)"; uptime; } | tee "$OUT/ceiling-gpu-host.log"
timeout "${LIMIT:-150}" python3 -m llmopt_bench check client --no-vllm --server-cpus "$SERVERS" --client-cpus "$CLIENT" \
  --start-rps "${START:-600}" --point-s "${POINT_S:-2}" --warmup-s 0.5 --interval-ms 10 --tokens 100 \
  --json "$OUT/ceiling-gpu-host.json" 2>&1 | tee -a "$OUT/ceiling-gpu-host.log"
echo "rc ${PIPESTATUS[0]}" | tee -a "$OUT/ceiling-gpu-host.log"
