#!/usr/bin/env bash
# Independent CPU runs for the host-speed calibration (docs/regression.md, "The host"): the same
# command N times, alternately on the host as it is ("quiet") and beside a noisy neighbour we
# control (HOGS busy Python loops at nice 0, each in a session of its own as another user's job
# is, started before the run and killed after it), so that the pairs hold host changes of a
# known cause as well as the shared host's own. Only each run's run.json is kept.
#
# Each hog needs its own session: with the kernel's autogroup scheduling (on by default on most
# desktops and VMs, /proc/sys/kernel/sched_autogroup_enabled) CPU time is shared between
# sessions first, and llmopt starts each stage in a session of its own, so busy loops that share
# one session take one share between them, however many they are.
#
#   scripts/gate/host-noise-runs.sh [PAIRS] [OUT_DIR] [extra llmopt bench options...]
#   scripts/gate/host-noise-runs.sh 8 results/cpu/host-calibration --pin-cpu
#   MODEL=synthetic:llama2-7b PROMPTS=8 TOKENS=100 HOGS=32 scripts/gate/host-noise-runs.sh 4 results/h200/host-calibration
set -euo pipefail
pairs=${1:-8}
out=${2:-results/cpu/host-calibration}
shift $(( $# >= 2 ? 2 : $# ))
hogs=${HOGS:-2}
model=${MODEL:-synthetic:tiny}
prompts=${PROMPTS:-8}
tokens=${TOKENS:-16}
python=${PYTHON:-python}
here=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out"
pids=()
stop_hogs() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; pids=(); }
trap stop_hogs EXIT
for i in $(seq -w 1 "$pairs"); do
  for mode in quiet hogs; do
    dir="$out/run$i-$mode"
    [ -f "$dir/run.json" ] && continue
    if [ "$mode" = hogs ]; then
      for _ in $(seq "$hogs"); do setsid nice -n 0 "$python" -c 'while 1: pass' & pids+=($!); done
      sleep 2
    fi
    tmp=$(mktemp -d)
    echo "$(date +%T) $dir (load $(cut -d' ' -f1 /proc/loadavg))"
    PYTHONPATH="$here" nice -n 5 "$python" -m llmopt_bench bench --stages hf-fp16 --model "$model" \
      --num-prompts "$prompts" --max-new-tokens "$tokens" --repeats 3 --no-report -o "$tmp/run" "$@" > "$tmp/log" 2>&1 \
      || { echo "failed: $tmp/log"; tail -5 "$tmp/log"; }
    stop_hogs
    if [ -f "$tmp/run/run.json" ]; then mkdir -p "$dir" && cp "$tmp/run/run.json" "$dir/"; fi
    rm -rf "$tmp"
  done
done
