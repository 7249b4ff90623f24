"""hf-compiled, the baseline's compiled twin, run on CPU as a user runs it (torch.compile with
inductor and the system's gcc), registered through the entry point group like every built-in:
generate() really compiles (a stage that did not would be skipped), every shape is compiled
before the repeats, its greedy decode matches the reference's, and the report says so."""

from __future__ import annotations

import json

import pytest
from testkit import run_cli

pytestmark = pytest.mark.slow


def test_the_compiled_twin_runs_beside_the_baseline_on_cpu(tmp_path):
    out = tmp_path / "run"
    r = run_cli("bench", "--stages", "hf-fp16,hf-compiled", "--model", "synthetic:tiny", "--num-prompts", "2",
                "--max-new-tokens", "8", "--repeats", "2", "--warmup", "1", "-o", str(out), timeout=1800)
    assert r.returncode == 0, r.stderr
    run = json.loads((out / "run.json").read_text())
    twin = next(s for s in run["stages"] if s["name"] == "hf-compiled")
    assert twin["status"] == "ok" and twin["metrics"]["output_tokens"] == 2 * 2 * 8
    assert twin["load"]["implementation"]["cache_implementation"] == "static"
    assert "mode default" in twin["load"]["implementation"]["compile"]  # CPU: inductor without CUDA graphs
    record = twin["extra"]["compile"]
    assert record["compile_s"] > 0 and (record["max_cache_len"] is None or record["max_cache_len"] >= 8)  # None: per call
    assert record["decode_agreement"]["match_rate"] == 1.0 and record["decode_agreement"]["tokens"] > 0
    assert len(twin["extra"]["conditions"]) == 2 and all(c["host_kops"] > 0 for c in twin["extra"]["conditions"])
    report = (out / "report.md").read_text()
    assert "Compiled with torch.compile mode default, static KV cache sized " in report
    assert "Compiled decode against the reference: 100.0% of" in report
    r = run_cli("stages")
    assert "hf-compiled" in r.stdout
