#!/usr/bin/env bash
# Files larger than one device call may carry (64 MiB with the working tree), sent in parts over
# several calls, the way the workplace's device kit sends vLLM. docs/gpu-runs.md
#
# Here:   bash scripts/device/carry-parts.sh pack NAME PATH...
#         packs PATHs (each under its own name) into .devcarry/NAME/partNN, 60 MB each, with
#         SHA256 and COUNT (ignored by git)
# There:  bash scripts/device/carry-parts.sh join NAME DEST
#         keeps the parts this call carried in /tmp/carry/NAME; once all COUNT parts are there and
#         their checksum holds, unpacks them into DEST (and says so); before that, says how many
# Each call carries one part plus the two small files, e.g.
#         carry [".devcarry/NAME/part00", ".devcarry/NAME/SHA256", ".devcarry/NAME/COUNT"]
set -euo pipefail
usage() { echo "usage: $0 pack NAME PATH... | join NAME DEST" >&2; exit 2; }
[ $# -ge 3 ] || usage
cmd=$1 name=$2
shift 2
case $cmd in
  pack)
    out=.devcarry/$name
    rm -rf "$out" && mkdir -p "$out"
    args=()  # each PATH is stored under its own name, unpacked as DEST/<name>; links followed
    for path in "$@"; do args+=(-C "$(cd "$(dirname "$path")" && pwd)" "$(basename "$path")"); done
    tar chf - "${args[@]}" | split -b "${CARRY_PART_BYTES:-60000000}" -d -a 2 - "$out/part"
    cat "$out"/part* | sha256sum | cut -d' ' -f1 >"$out/SHA256"
    ls "$out"/part* | wc -l | tr -d ' ' >"$out/COUNT"
    if [ -d .git ]; then grep -qx '/.devcarry/' .git/info/exclude 2>/dev/null || echo '/.devcarry/' >>.git/info/exclude; fi  # a worktree: .gitignore
    echo "$name: $(cat "$out/COUNT") parts in $out; carry one per call with $out/SHA256 and $out/COUNT"
    ;;
  join)
    dest=$1 store=${CARRY_STORE:-/tmp/carry}/$name
    mkdir -p "$store"
    cp .devcarry/"$name"/* "$store"/ 2>/dev/null || true
    have=$(ls "$store"/part* 2>/dev/null | wc -l) want=$(cat "$store/COUNT")
    if [ "$have" -lt "$want" ]; then echo "$name: $have of $want parts so far"; exit 0; fi
    if [ "$(cat "$store"/part* | sha256sum | cut -d' ' -f1)" != "$(cat "$store/SHA256")" ]; then
      echo "$name: the parts do not add up to the packed checksum: send them again" >&2; exit 1
    fi
    mkdir -p "$dest" && cat "$store"/part* | tar xf - -C "$dest"
    echo "$name: unpacked into $dest"
    ;;
  *) usage ;;
esac
