"""vllm-attn on a CUDA GPU with synthetic:llama2-7b (journey defaults: FLASH_ATTN, TRITON_ATTN,
FLASHINFER where installed; 512, 2048, 8192 tokens): each backend forced, verified from what
the workers run, and prefill grows with the context. Marked gpu: skips without CUDA."""

from __future__ import annotations

import os

import pytest
from testkit import read_run, run_cli

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def stage(tmp_path_factory):
    out = tmp_path_factory.mktemp("vllm-attn-gpu") / "out"
    env = {"LLMOPT_VLLM_PYTHON": os.environ["LLMOPT_VLLM_PYTHON"]} if os.environ.get("LLMOPT_VLLM_PYTHON") else None
    r = run_cli("bench", "--stages", "vllm-attn", "--model", "synthetic:llama2-7b", "--output", str(out), "--no-report",
                env=env, timeout=3000)
    assert r.returncode == 0, r.stdout + r.stderr
    return read_run(out)["stages"][0]


@pytest.mark.parametrize("backend", ["FLASH_ATTN", "TRITON_ATTN"])
def test_backend_forced_verified_and_measured(stage, backend):
    rows = {r["context"]: r for r in stage["extra"]["sweep"] if r["impl"] == backend}
    assert sorted(rows) == [512, 2048, 8192]
    for r in rows.values():
        assert r["status"] == "ok" and r["effective_impl"] == backend, r
    assert rows[512]["ttft_s"]["p50"] < rows[2048]["ttft_s"]["p50"] < rows[8192]["ttft_s"]["p50"]


def test_engines_freed_between_backends(stage):
    for e in stage["extra"]["engines"]:
        assert e["lifecycle"]["freed"] is True, e
