#!/usr/bin/env bash
# One call on the H200: hf-fp16 on synthetic:tiny (host-bound decode), 10 repeats, each repeat's
# conditions (load, preemptions, CPU share, SM clock) recorded; nvidia-smi's clocks beside it.
set -u
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --target /tmp/llmsite .whl/*.whl
python3 -m pip install -q --no-index --no-deps --target /tmp/deps .devcarry/wheels/*.whl
mkdir -p /tmp/sc && printf 'import sys\nsys.path.append("/tmp/deps")\n' > /tmp/sc/sitecustomize.py
export PYTHONPATH=/tmp/sc:$PWD:/tmp/llmsite LLMOPT_CACHE=/tmp/llmopt-cache PYTHONUNBUFFERED=1
python3 - <<'PY'
import importlib
for m in ("typer", "rich", "pydantic", "psutil", "httpx", "transformers", "torch"):
    mod = importlib.import_module(m)
    print(m, getattr(mod, "__version__", "?"), getattr(mod, "__file__", ""))
PY
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.draw --format=csv
nproc; cat /proc/loadavg
timeout 150 python3 -m llmopt_bench bench --stages hf-fp16 --model synthetic:tiny --num-prompts 8 --max-new-tokens 100 \
  --repeats 10 --warmup 2 --output "$OUT/run" > "$OUT/console.log" 2>&1
echo "bench exit $?"
tail -15 "$OUT/console.log"
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm --format=csv
python3 - "$OUT/run/run.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for s in r["stages"]:
    x = s.get("extra", {})
    print(s["name"], s["status"], s.get("reason"))
    print("per_repeat", [round(v * 1e3, 3) for v in (x.get("stopping") or {}).get("per_repeat", []) if v])
    for c in x.get("conditions", []):
        print(c)
PY
grep -n "Repeat conditions" "$OUT/run/report.md"
