#!/usr/bin/env bash
# flash-attn for the flash-attn stage's flash_attention_2, on a CUDA machine, from a prebuilt
# wheel that matches this torch, CUDA, C++ ABI and Python (the project's GitHub release wheels).
# PyPI has only flash-attn's source, whose build needs nvcc and takes an hour or more: when no
# wheel matches, nothing is installed and the reason is printed; the flash-attn stage then
# measures eager and SDPA and says flash_attention_2 is not installed. Never fails the install.
#
# Usage: scripts/maintainers/install-flash-attn.sh [PYTHON]          (default python3)
# Env:   FLASH_ATTN_VERSION (default 2.8.3), FLASH_ATTN_WHEEL (a wheel file or URL to use instead)
set -uo pipefail

PY="${1:-python3}"
VER="${FLASH_ATTN_VERSION:-2.8.3}"

if [[ -n "${FLASH_ATTN_WHEEL:-}" ]]; then
  exec "$PY" -m pip install -q --no-deps "$FLASH_ATTN_WHEEL"
fi

# torch 2.8.0+cu128 -> "2.8 12 TRUE cp311"
read -r TORCH CUDA ABI PYTAG < <("$PY" - <<'PYEOF'
import sys
try:
    import torch
except ImportError:
    print("none none none none"); raise SystemExit
major, minor = torch.__version__.split("+")[0].split(".")[:2]
cuda = (torch.version.cuda or "none").split(".")[0]
print(f"{major}.{minor}", cuda, str(torch._C._GLIBCXX_USE_CXX11_ABI).upper(), f"cp{sys.version_info[0]}{sys.version_info[1]}")
PYEOF
)

if [[ "$CUDA" == none ]]; then
  echo "flash-attn: skipped: torch in $PY is not a CUDA build (flash_attention_2 needs CUDA)"
  exit 0
fi
WHEEL="flash_attn-${VER}+cu${CUDA}torch${TORCH}cxx11abi${ABI}-${PYTAG}-${PYTAG}-linux_x86_64.whl"
URL="https://github.com/Dao-AILab/flash-attention/releases/download/v${VER}/${WHEEL}"
LOG="$(mktemp -t flash-attn-install.XXXXXX.log)"
if "$PY" -m pip install -q --no-deps "$URL" 2>"$LOG"; then
  echo "flash-attn: installed $WHEEL"
else
  echo "flash-attn: skipped: no prebuilt wheel for torch $TORCH, CUDA $CUDA, $PYTAG could be installed"
  echo "  from $URL ($(tail -1 "$LOG" | cut -c1-100); pip's log: $LOG)"
  echo "  the flash-attn stage measures eager and SDPA without flash_attention_2; to add it, build it"
  echo "  (needs nvcc, an hour or more): $PY -m pip install flash-attn --no-build-isolation,"
  echo "  or pass a wheel you have: FLASH_ATTN_WHEEL=path/to/flash_attn-*.whl bash scripts/maintainers/install-flash-attn.sh $PY"
fi
exit 0
