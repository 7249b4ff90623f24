#!/usr/bin/env bash
# Does `pip install 'llmopt-bench[gpu]'` resolve on a CUDA Linux machine? pip resolves it
# against PyPI alone (this machine's pip config, local wheels and installed packages ignored),
# installs nothing (--dry-run) and reads only metadata. Then the resolved set must hold vLLM,
# the torch that vLLM pins (a CUDA build: no +cpu), bitsandbytes, GPTQModel and matplotlib, and
# vLLM must be PyPI's newest release (an old one means a requirement holds it back).
# When the resolve is behind PyPI's newest vLLM, that vLLM is resolved alone: if it does not
# install from PyPI on its own (a pin on a release its dependency never published, as vLLM
# 0.34.0's flashinfer-python==0.7.3), no requirement of ours holds it back and the check passes
# saying so.
# Exit 0: it resolves and holds them (or the index cannot be reached: skipped, said so);
# 1: it does not (pip's or the check's message says why). ~1.5 min with an empty pip cache.
#
# Usage: scripts/maintainers/check-gpu-install.sh             Env: PYTHON (default python3), INDEX_URL
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${PYTHON:-python3}"
REPORT="$(mktemp -t gpu-resolve.XXXXXX.json)"
trap 'rm -f "$REPORT"' EXIT

INDEX="${INDEX_URL:-https://pypi.org/simple}"
if ! "$PY" -c "import urllib.request, sys; urllib.request.urlopen(sys.argv[1], timeout=15)" "$INDEX/vllm/" 2>/dev/null; then
  echo "check-gpu-install: skipped: $INDEX cannot be reached (the check needs the package index)"
  exit 0
fi
NEWEST="$("$PY" -c "import json, urllib.request; print(json.load(urllib.request.urlopen('https://pypi.org/pypi/vllm/json', timeout=30))['info']['version'])" 2>/dev/null || true)"

dry_run() {  # resolve against the index alone, install nothing
  PIP_CONFIG_FILE=/dev/null "$PY" -m pip install --isolated --disable-pip-version-check --dry-run --ignore-installed \
    --quiet --index-url "$INDEX" "$@"
}
dry_run --report "$REPORT" "$REPO[gpu]"

set +e
"$PY" - "$REPORT" "$NEWEST" <<'PYEOF'
import json, re, sys
report = json.load(open(sys.argv[1]))
newest = sys.argv[2] if len(sys.argv) > 2 else ""
got = {i["metadata"]["name"].lower().replace("_", "-"): i for i in report["install"]}
version = {k: v["metadata"]["version"] for k, v in got.items()}
missing = [p for p in ("vllm", "torch", "bitsandbytes", "gptqmodel", "matplotlib", "llmopt-bench") if p not in got]
if missing:
    sys.exit(f"check-gpu-install: the resolved set lacks {', '.join(missing)}")
pins = [r for r in got["vllm"]["metadata"].get("requires_dist", []) if re.match(r"torch\s*==", r)]
pinned = pins[0].split("==")[1].split(";")[0].strip() if pins else None
if pinned and version["torch"] != pinned:
    sys.exit(f"check-gpu-install: vllm {version['vllm']} pins torch {pinned}, the resolve chose {version['torch']}")
if "+cpu" in version["torch"]:
    sys.exit(f"check-gpu-install: resolved a CPU torch ({version['torch']})")
print(f"check-gpu-install: '.[gpu]' resolves to {len(got)} packages: " + ", ".join(
    f"{p} {version[p]}" for p in ("vllm", "torch", "transformers", "bitsandbytes", "gptqmodel") if p in version)
    + (f" (vllm pins torch {pinned})" if pinned else ""))
if newest and version["vllm"] != newest:
    print(f"check-gpu-install: vllm {version['vllm']} is not the newest ({newest})")
    sys.exit(3)
PYEOF
code=$?
set -e
if [ "$code" = 3 ]; then  # behind the newest vLLM: does that vLLM install at all?
  if why="$(dry_run "vllm==$NEWEST" 2>&1)"; then
    echo "check-gpu-install: vllm $NEWEST installs on its own but not with '.[gpu]': a requirement holds it back" \
         "(see which with: pip install --dry-run 'llmopt-bench[gpu]' vllm==$NEWEST)"
    exit 1
  fi
  echo "check-gpu-install: ok: vllm $NEWEST does not install from PyPI even alone ($(echo "$why" | grep -m1 'No matching distribution' || echo "$why" | tail -1));" \
       "'.[gpu]' resolves to the newest vLLM that does"
  exit 0
fi
exit "$code"
