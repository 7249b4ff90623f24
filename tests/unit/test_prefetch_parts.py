"""The pieces of --prefetch that need no second process: what counts as imported ahead, what an
early worker imports and on which cores (the processes themselves: tests/integration/test_prefetch.py)."""

from __future__ import annotations

import os
import sys

import pytest

from llmopt_bench.run.prefetch import prefetched_seconds
from llmopt_bench.run.preload import import_all, on_other_cores, other_cores
from llmopt_bench.run.registry import load_stage


def test_imports_ahead_count_until_the_go_less_the_time_stopped():
    assert prefetched_seconds(100.0, 110.0, 200.0, []) == 10.0  # done long before its go
    assert prefetched_seconds(100.0, 130.0, 120.0, []) == 20.0  # not done by its go: the rest is in load_s
    assert prefetched_seconds(100.0, None, 120.0, []) == 20.0  # no word from it by its go
    assert prefetched_seconds(100.0, 130.0, 200.0, [(105.0, 115.0), (140.0, 150.0)]) == 20.0  # stopped 10 s of it
    assert prefetched_seconds(100.0, 130.0, 200.0, [(90.0, 135.0)]) == 0.0


def test_an_early_worker_imports_modules_and_attributes_and_notes_what_fails():
    seen = import_all(["json", "email:message_from_string", "surely_missing_mod", "json:no_such_attribute"])
    assert seen.failed == ["surely_missing_mod: ModuleNotFoundError", "json:no_such_attribute: AttributeError"]
    assert "email" in sys.modules and seen.ended >= seen.started
    assert seen.cuda_initialized is False


def test_an_import_ahead_that_would_initialize_cuda_is_refused(tmp_path, monkeypatch):
    import torch

    # as bitsandbytes does at import: every GPU's capability (torch initializes CUDA for it)
    (tmp_path / "llmopt_asks_the_gpu.py").write_text("import torch\ntorch.cuda.get_device_capability(0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    real = torch.cuda._lazy_init
    seen = import_all(["torch", "llmopt_asks_the_gpu"])
    assert seen.failed == ["llmopt_asks_the_gpu: CudaRefused"] and seen.cuda_initialized is False
    assert torch.cuda._lazy_init is real and "llmopt_asks_the_gpu" not in sys.modules  # its turn imports it afresh


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no CPU affinity API here")
def test_the_imports_run_on_the_upper_half_of_the_cores_and_every_thread_gets_them_back():
    import threading

    full = os.sched_getaffinity(0)
    upper = other_cores()
    if upper is None:
        pytest.skip("one core: nothing to leave to the stage before")
    assert upper == set(sorted(full)[len(full) // 2:])
    started: list[set[int]] = []
    seen, done = threading.Event(), threading.Event()

    def thread() -> None:
        started.append(os.sched_getaffinity(0))
        seen.set()
        done.wait(30)

    with on_other_cores():
        assert os.sched_getaffinity(0) == upper
        t = threading.Thread(target=thread)
        t.start()  # a thread an import starts inherits the narrow set ...
        seen.wait(30)
    try:
        assert os.sched_getaffinity(0) == full
        assert started == [upper]
        assert os.sched_getaffinity(t.native_id) == full  # ... and gets the full set back at the go
    finally:
        done.set()
        t.join()


def test_the_journey_stages_import_their_engines_ahead():
    assert load_stage("hf-fp16").prefetch_imports()[:2] == ("torch", "transformers:AutoModelForCausalLM")
    assert "bitsandbytes" not in load_stage("bnb-int8").prefetch_imports()  # its import initializes CUDA
    for name in ("vllm", "vllm-fp8", "awq-int4", "vllm-attn", "continuous-batching"):
        assert "vllm:LLM" in load_stage(name).prefetch_imports(), name
    assert "vllm:LLM" not in load_stage("vllm-serve").prefetch_imports()  # its process is llmopt's: vLLM runs in the server
