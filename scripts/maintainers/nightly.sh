#!/usr/bin/env bash
# The nightly regression job on any GPU machine, by hand (.github/workflows/nightly-gpu.yml runs
# the same steps on a self-hosted GPU runner): benchmark every stage at the standard preset (the
# stopping rule on: each stage repeats until its gated figures are settled, within its cap),
# compare with the baseline for this GPU and model (the history's earlier runs giving the
# baseline's noise; the baseline's declared params drift, results/baselines/drift.toml,
# accepted), add the run to the history, check the history for sustained shifts, draw the
# history charts.
#
# usage: scripts/maintainers/nightly.sh [--baseline FILE] [--output DIR] [--model SOURCE] [--stages LIST]
#                           [--db FILE] [--gpu SLUG] [--max-regression SPEC]... [--allow-missing LIST]
#                           [--init-baseline] [-- more llmopt bench options]
#   --baseline FILE   default results/baselines/<gpu-slug>-<model-slug>.json (docs/regression.md)
#   --output DIR      the new run's directory, default results/runs/nightly-<timestamp>
#   --model SOURCE    default synthetic:llama2-7b
#   --db FILE         the history, default $LLMOPT_HISTORY_DB, else $LLMOPT_CACHE/history.sqlite
#                     (~/.cache/llmopt/history.sqlite)
#   --gpu SLUG        default: the first GPU's name from nvidia-smi, e.g. nvidia-h200
#   --allow-missing   stages the new run may lack (passed to llmopt compare)
#   --stages LIST     default all: `llmopt bench --preset standard`; a list: those stages with the
#                     stopping rule's 2 to 10 repeats
#   --init-baseline   when the baseline file is missing, make this run the baseline
# Exit: 0 every gated metric settled and none regressed; 5 a metric regressed (compare) or a
# sustained regression in the history (history check); 6 the run lacks or failed a stage of the
# baseline, or did not finish; 8 the hosts explain a change (compare); 9 a gated metric is
# inconclusive (compare: more repeats, or a quieter host, would settle it); 4 a stage failed
# (bench); 2 no baseline or runs not comparable; as llmopt otherwise. A stage that failed is
# measured again in place with `llmopt bench --resume DIR --rerun failed`, then run the
# comparison again.
set -euo pipefail
cd "$(dirname "$0")/../.."

LLMOPT=${LLMOPT:-llmopt}
command -v "$LLMOPT" >/dev/null 2>&1 || LLMOPT=.venv/bin/llmopt
baseline="" out="" model="synthetic:llama2-7b" stages="all" db="" gpu="" init=0
PY=${PY:-python3}
[ -x .venv/bin/python ] && PY=.venv/bin/python
# more figures to watch only, beyond what the baseline's gate file watches (e.g. WATCH=vllm-attn:ttft)
WATCH=${WATCH:-}
compare_args=() check_args=() bench_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --baseline) baseline=$2; shift 2 ;;
    --output) out=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --stages) stages=$2; shift 2 ;;
    --db) db=$2; shift 2 ;;
    --gpu) gpu=$2; shift 2 ;;
    --max-regression) compare_args+=(--max-regression "$2"); check_args+=(--max-regression "$2"); shift 2 ;;
    --allow-missing) compare_args+=(--allow-missing "$2"); shift 2 ;;
    --init-baseline) init=1; shift ;;
    --) shift; bench_args=("$@"); break ;;
    -h|--help) sed -n '2,32p' "$0"; exit 0 ;;
    *) echo "error: unknown argument $1" >&2; echo "  fix: see scripts/maintainers/nightly.sh --help" >&2; exit 2 ;;
  esac
done

# One GPU per stage: keep NVLink multicast (NVLS) off.
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
export TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}
export NVSHMEM_DISABLE_NVLS=${NVSHMEM_DISABLE_NVLS:-1}
[ -z "$db" ] || export LLMOPT_HISTORY_DB="$db"

slug() { tr '[:upper:]' '[:lower:]' | sed -E 's/[^a-z0-9]+/-/g; s/^-+//; s/-+$//'; }
if [ -z "$gpu" ]; then
  if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "error: nvidia-smi not found: the nightly job measures a GPU" >&2
    echo "  fix: run it on a machine with an NVIDIA GPU, or name the baseline's device with --gpu SLUG" >&2
    exit 2
  fi
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n1 | slug)
fi
baseline=${baseline:-results/baselines/${gpu}-$(printf '%s' "$model" | slug).json}
out=${out:-results/runs/nightly-$(date +%Y%m%d-%H%M%S)}
if [ -e "$out/run.json" ]; then
  echo "error: $out already holds a run" >&2
  echo "  fix: pass another --output, or remove $out" >&2
  exit 2
fi

echo "nightly: $model on $gpu -> $out (baseline $baseline)" >&2
bench_rc=0
# the gate's preset: the stopping rule on (docs/regression.md, "Enough evidence")
if [ "$stages" = all ]; then chosen=(--preset standard); else chosen=(--stages "$stages" --repeats 2 --max-repeats 10); fi
"$LLMOPT" bench "${chosen[@]}" --model "$model" --output "$out" ${bench_args[@]+"${bench_args[@]}"} || bench_rc=$?
if [ ! -f "$out/run.json" ]; then
  echo "error: the benchmark wrote no run.json (exit $bench_rc)" >&2
  exit $(( bench_rc ? bench_rc : 1 ))
fi

if [ ! -f "$baseline" ]; then
  if [ "$init" = 1 ]; then
    mkdir -p "$(dirname "$baseline")"
    cp "$out/run.json" "$baseline"
    "$PY" scripts/gate/gate-file.py "$baseline" >&2  # what its noise lets the gate gate, beside it
    "$LLMOPT" history add "$out"
    echo "nightly: no baseline yet; this run is now the baseline: $baseline and its gate file (review and commit both)" >&2
    exit "$bench_rc"
  fi
  "$LLMOPT" history add "$out"
  echo "error: no baseline at $baseline" >&2
  echo "  fix: review $out, then: mkdir -p $(dirname "$baseline") && cp $out/run.json $baseline (or pass --init-baseline)" >&2
  exit 2
fi

# compare before the run joins the history: the history's earlier runs give the baseline's noise.
# The baseline's gate file beside it (<baseline>.gate.toml, scripts/gate/gate-file.py) says which figures
# its measured noise lets a pair gate, and at what threshold; the others (hf-fp16's and bnb-int8's
# host-bound decode, flash-attn's eager decode) are watched: a regression of theirs still fails.
# docs/regression.md, "A gate that can pass".
compare_rc=0
drift=(); [ -f results/baselines/drift.toml ] && drift=(--drift results/baselines/drift.toml)
watch=(); [ -z "$WATCH" ] || watch=(--watch "$WATCH")
"$LLMOPT" compare "$baseline" "$out" --output "$out/compare.md" "${drift[@]}" ${watch[@]+"${watch[@]}"} \
  ${compare_args[@]+"${compare_args[@]}"} || compare_rc=$?
echo "nightly: comparison in $out/compare.md; report in $out/report.md" >&2

"$LLMOPT" history add "$out"
check_rc=0
"$LLMOPT" history check ${check_args[@]+"${check_args[@]}"} | tee "$out/history-check.txt" || check_rc=${PIPESTATUS[0]}
mkdir -p "$out/charts"
for metric in tpot_p50 ttft_p50 output_tok_s; do
  "$LLMOPT" history show --metric "$metric" --chart "$out/charts/history-$metric.png" >/dev/null \
    || echo "warning: history chart for $metric not drawn" >&2
done

for rc in "$compare_rc" "$check_rc"; do
  if [ "$rc" -ne 0 ]; then
    exit "$rc"
  fi
done
exit "$bench_rc"
