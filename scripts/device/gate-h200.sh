#!/usr/bin/env bash
# The regression gate's H200 half (issue 33): what the CPU host could not give. Runs ON the
# device, from the checkout root, after the workplace's kit (as scripts/device-turn.sh); each
# step is one command a lead can also paste into device-turn.sh's plan.
#
#   bash scripts/device/gate-h200.sh baseline   the standard preset cold (the nightly's: the stopping rule
#                                        on): the new baseline, and the journey's time with the rule
#                                        (~26 min: docs/regression.md, "Time"); then compare of the
#                                        committed baseline with it (--drift: the declared params)
#   bash scripts/device/gate-h200.sh pairs      real pairs for the calibration: 3 rounds of hf-fp16, 2 of
#                                        bnb-nf4 (each round: 2 runs of the same code, a 1.1x and a
#                                        1.2x slower build, 6 repeats of 4 x 100; each run ~110 s and
#                                        ~160 s with its probe and load: ~22 + ~21 min), and 4 runs of
#                                        vllm (A/A across engine starts, ~165 s each: ~11 min)
#   bash scripts/device/gate-h200.sh table      the calibration table from them (CPU only, ~1 min)
#
# Then: commit $DEV/gate-pairs's run.json files under results/h200/gate-pairs, the table into
# docs/regression.md ("Calibration"), and, once reviewed, $DEV/baseline/run.json over
# results/baselines/nvidia-h200-synthetic-llama2-7b.json with $DEV/baseline.gate.toml beside it as
# nvidia-h200-synthetic-llama2-7b.gate.toml (and drop its entries from
# results/baselines/drift.toml: tests/unit/test_baseline_params.py says which).
# Env: DEV (/tmp/llmopt-gate), MODEL (synthetic:llama2-7b), PY (python3).
# Dry run on a CPU machine (the CPU preset, synthetic:tiny, 1 round):
#   DRY=1 DEV=/tmp/gate-dry bash scripts/device/gate-h200.sh baseline|pairs|table
set -euo pipefail
DEV=${DEV:-/tmp/llmopt-gate}
PY=${PY:-python3}
DRY=${DRY:-0}
if [ "$DRY" = 1 ]; then MODEL=${MODEL:-synthetic:tiny}; else MODEL=${MODEL:-synthetic:llama2-7b}; fi
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
mkdir -p "$DEV"
llmopt() { "$PY" -m llmopt_bench "$@"; }

case "${1:-}" in
  baseline)
    # the nightly's own command (scripts/maintainers/nightly.sh), cold; run.json's wall_s and each stage's duration_s are the time
    /usr/bin/time -p -o "$DEV/baseline.time" "$PY" -m llmopt_bench bench --preset standard --model "$MODEL" \
      --output "$DEV/baseline" 2>&1 | tail -40 || true
    force=(); [ "$DRY" = 1 ] && force=(--force)  # a CPU dry run is another device than the H200 baseline's
    llmopt compare results/baselines/nvidia-h200-synthetic-llama2-7b.json "$DEV/baseline" --drift results/baselines/drift.toml \
      --no-history --format md --output "$DEV/compare-committed.md" "${force[@]}" > /dev/null || echo "compare exit $?"
    # the new baseline's gate file, its noise pooled with the committed baseline's (another machine, same journey)
    "$PY" scripts/gate/gate-file.py "$DEV/baseline/run.json" --name nvidia-h200-synthetic-llama2-7b.json \
      --runs results/baselines/nvidia-h200-synthetic-llama2-7b.json --output "$DEV/baseline.gate.toml" || echo "gate file: exit $?"
    ;;
  pairs)
    prompts=4 tokens=100 repeats=6 vllm_runs=4 rounds_hf=3 rounds_nf4=2
    if [ "$DRY" = 1 ]; then tokens=32 repeats=4 vllm_runs=2 rounds_hf=1 rounds_nf4=1; fi
    for stage_rounds in "hf-fp16 $rounds_hf" "bnb-nf4 $rounds_nf4"; do
      set -- $stage_rounds
      MODEL=$MODEL PROMPTS=$prompts TOKENS=$tokens REPEATS=$repeats PYTHON=$PY bash scripts/gate/gate-pairs.sh "$2" "$DEV/gate-pairs" "$1"
    done
    for i in $(seq 1 "$vllm_runs"); do  # GPU-bound: no slower build of known size reaches vLLM's engine; A/A across starts
      dir=$DEV/gate-pairs/vllm-round$i-a1 tmp=$DEV/vllm-run-$i
      llmopt bench --stages vllm --model "$MODEL" --num-prompts 8 --max-new-tokens "$tokens" --repeats "$repeats" --no-report \
        --output "$tmp" > "$DEV/vllm-$i.log" 2>&1 || echo "vllm run $i: exit $?"
      if [ -f "$tmp/run.json" ]; then mkdir -p "$dir" && cp "$tmp/run.json" "$dir/"; fi
    done
    ;;
  table)
    "$PY" scripts/gate/calibrate-gate.py --real-pairs "$DEV/gate-pairs" --statistics --json "$DEV/gate-pairs/calibration.json" \
      | tee "$DEV/calibration.md"
    ;;
  *) sed -n '2,24p' "$0"; exit 2 ;;
esac
