#!/usr/bin/env bash
# Runs ON a lent GPU machine, right after the device kit (/work/shared/device/unpack.sh): byte-
# compile what the kit and llmopt's wheels installed. They are installed with `pip --no-compile`
# and vLLM is unpacked from a tarball, so without this every process that imports vLLM or torch
# (~25 a journey: each stage's worker, each engine core, each inspection subprocess) compiles the
# same sources again; a `pip install vllm` from a registry byte-compiles at install, so this makes
# the kit's fresh machine look like a user's, not warmer. On the CPU host, `import vllm,
# vllm.v1.engine.core` took 24-26 s with no .pyc anywhere against 12.7-12.9 s with them
# (docs/gpu-runs.md, "Time on the H200"). Idempotent: a second call finds everything compiled.
#   bash scripts/device/device-compile.sh        prints the seconds it took and the .pyc counts
set -uo pipefail
t0=$(date +%s.%N)
if [ ! -e /tmp/llmsite/.done ] && ls .whl/*.whl >/dev/null 2>&1; then  # as device-session.sh and device-run.sh install it
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/llmsite .whl/*.whl && touch /tmp/llmsite/.done
fi
dirs=()
for d in /tmp/vsite /tmp/llmsite "$PWD/llmopt_bench"; do [ -d "$d" ] && dirs+=("$d"); done
# the image's own packages (torch, transformers) where this user may write there
site=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))' 2>/dev/null)
if [ -n "$site" ] && [ -w "$site" ]; then dirs+=("$site"); elif [ -n "$site" ]; then echo "not writable, left as it is: $site"; fi
python3 -m compileall -q -j 16 "${dirs[@]}" >/dev/null 2>&1 || echo "compileall reported errors (sources that do not compile on this Python: they never run here)"
for d in "${dirs[@]}"; do echo "$d: $(find "$d" -name '*.pyc' | wc -l) .pyc"; done
echo "device-compile: $(python3 -c "import time; print(round(time.time() - $t0, 1))") s"
