#!/usr/bin/env bash
# Builds .whl/ here (ignored by git): what llmopt needs on a lent GPU machine that its image and the
# workplace kit lack. The image has python3.12, torch, transformers, typer, rich, pandas, psutil,
# httpx, aiohttp, narwhals, prometheus-client, matplotlib (/work/.library/device/KINDS.md); the kit
# brings vLLM 0.26 with pydantic, bitsandbytes, torchao and flash-attn (../shared/device/). So:
# llmopt's own wheel (its entry points register the stages) and the pure-Python wheels of what it
# imports beside them: report.html's plotly and gguf (bundled:smollm2-135m's GGUF).
# Versions are the checkout's .venv's, the ones the tests ran with. .whl/COMMIT names the commit,
# which turn.sh gives run.json (the tree travels without .git).
#   bash scripts/device/make-whl.sh        from the checkout root (PY=... picks the venv to pin from)
set -euo pipefail
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || { echo "error: no $PY to read the tested versions from" >&2; echo "  fix: make (or PY=/path/to/venv/bin/python)" >&2; exit 2; }
NEED=(plotly gguf)

rm -rf .whl build && mkdir -p .whl  # build/: setuptools would ship a removed module's old copy from there
"$PY" -m pip wheel -q --no-deps -w .whl . >/dev/null
pins=()
for name in "${NEED[@]}"; do pins+=("$name==$("$PY" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name")"); done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
  -d .whl "${pins[@]}" 2>&1 | grep -v "^WARNING: Location" || true
[ "$(ls .whl/*.whl | wc -l)" -eq $(( ${#NEED[@]} + 1 )) ] || { echo "error: .whl/ lacks a wheel: $(ls .whl)" >&2; exit 1; }
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- llmopt_bench pyproject.toml || echo -dirty)" > .whl/COMMIT
ls -s --block-size=K .whl | sed 1d
echo ".whl/: $(du -sb .whl | cut -f1) bytes, commit $(cat .whl/COMMIT)"
