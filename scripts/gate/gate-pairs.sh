#!/usr/bin/env bash
# Real pairs for the regression gate's calibration (docs/regression.md, "Calibration"): rounds of
# independent runs of one stage on the host as it is, each round the same code (A, twice: an A/A
# pair per round) and a real slower build of known size (scripts/gate/slower_build.py: every forward
# pass (1 + F) times as long, F = 0.1 and 0.2), one after another in a shuffled order so that the
# host's drift falls on every kind alike. Each run records 10 repeats: the calibration replays the
# stopping rule on them (the first k repeats are what a run that stopped at k measured). Only each
# run's run.json is kept.
#
#   scripts/gate/gate-pairs.sh [ROUNDS] [OUT_DIR] [STAGE]          STAGE: hf-fp16 (default) or bnb-nf4
#   LOCK=/tmp/llmopt-heavy.lock scripts/gate/gate-pairs.sh 8 results/cpu/gate-pairs hf-fp16   # each round under a shared lock
#   MODEL=synthetic:llama2-7b PROMPTS=8 TOKENS=100 scripts/gate/gate-pairs.sh 4 results/h200/gate-pairs   # the H200 half
set -euo pipefail
rounds=${1:-6}
out=${2:-results/cpu/gate-pairs}
stage=${3:-hf-fp16}
model=${MODEL:-synthetic:tiny}
prompts=${PROMPTS:-4}
tokens=${TOKENS:-32}
repeats=${REPEATS:-10}
python=${PYTHON:-python}
here=$(cd "$(dirname "$0")/../.." && pwd)
site=$(mktemp -d)
trap 'rm -rf "$site"' EXIT
# the slower build is a plugin, registered the way a third party's stage is (docs/architecture.md)
mkdir -p "$site/slower_build-0.0.dist-info"
printf 'Metadata-Version: 2.1\nName: slower-build\nVersion: 0.0\n' > "$site/slower_build-0.0.dist-info/METADATA"
printf '[llmopt.stages]\nhf-fp16-slower = slower_build:SlowerHF\nbnb-nf4-slower = slower_build:SlowerNF4\n' \
  > "$site/slower_build-0.0.dist-info/entry_points.txt"
cp "$here/scripts/gate/slower_build.py" "$site/"
case "$stage" in
  hf-fp16) base='name = "hf-fp16"
params = { dtype = "auto", attn_implementation = "eager", measure_overhead = false, quality = false }'
           slower='name = "hf-fp16-slower"
params = { dtype = "auto", attn_implementation = "eager", measure_overhead = false, quality = false, slower_by = F }' ;;
  bnb-nf4) base='name = "bnb-nf4"
params = { double_quant = true, measure_overhead = false, quality = false }'
           slower='name = "bnb-nf4-slower"
params = { double_quant = true, measure_overhead = false, quality = false, slower_by = F }' ;;
  *) echo "error: stage $stage: use hf-fp16 or bnb-nf4" >&2; exit 2 ;;
esac
printf '[[stage]]\n%s\n' "$base" > "$site/a.toml"
for f in 0.1 0.2; do printf '[[stage]]\n%s\n' "${slower/F/$f}" > "$site/x$f.toml"; done
mkdir -p "$out"
for i in $(seq -w 1 "$rounds"); do
  done_runs=$(find "$out" -maxdepth 2 -path "$out/$stage-round$i-*/run.json" 2>/dev/null | wc -l)
  [ "$done_runs" -ge 4 ] && continue  # a round already measured (the script resumes where it stopped)
  if [ -n "${LOCK:-}" ]; then exec 9>"$LOCK"; flock 9; fi  # a round at a time on a shared machine
  for kind in $(printf 'a1\na2\nx0.1\nx0.2\n' | shuf); do
    dir="$out/$stage-round$i-$kind"
    [ -f "$dir/run.json" ] && continue
    case "$kind" in a*) journey="$site/a.toml" ;; *) journey="$site/$kind.toml" ;; esac
    tmp=$(mktemp -d)
    echo "$(date +%T) $dir (load $(cut -d' ' -f1 /proc/loadavg))"
    PYTHONPATH="$site:$here" "$python" -m llmopt_bench bench --stages "$journey" --model "$model" \
      --num-prompts "$prompts" --max-new-tokens "$tokens" --warmup 1 --repeats "$repeats" --no-report -o "$tmp/run" \
      > "$tmp/log" 2>&1 9>&- || { echo "failed: $tmp/log"; tail -5 "$tmp/log"; }
    if [ -f "$tmp/run/run.json" ]; then mkdir -p "$dir" && cp "$tmp/run/run.json" "$dir/"; fi
    rm -rf "$tmp"
  done
  if [ -n "${LOCK:-}" ]; then exec 9>&-; fi
done
