"""hf-compiled, the baseline's compiled twin, run on CPU as a user runs it (torch.compile with
inductor and the system's gcc), registered through the entry point group like every built-in:
generate() really compiles (a stage that did not would be skipped), every shape is compiled
before the repeats, its decode agrees with the reference's (teacher-forced: no flip but near
ties), and the report says so."""

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
    agree = record["decode_agreement"]
    # teacher-forced: every step's argmax is the reference's token, or a near tie that rounding
    # flipped (synthetic:tiny's random weights have many); the reference token's log-prob moved by
    # rounding only (~0.001 nats here), where a miscompile moves it by whole nats
    assert agree["tokens"] > 0 and agree["disagreements"] == 0, agree
    assert round(agree["match_rate"] * agree["tokens"]) + agree["near_ties"] == agree["tokens"]
    assert agree["logprob_delta_max"] < agree["tie_nats"]
    assert len(twin["extra"]["conditions"]) == 2 and all(c["host_kops"] > 0 for c in twin["extra"]["conditions"])
    report = (out / "report.md").read_text()
    assert "Compiled with torch.compile mode default, static KV cache sized " in report
    assert "Compiled decode against the reference, teacher-forced: " in report
    assert f"{agree['near_ties']} near tie" in report and "and 0 disagreements (a clear reference choice" in report
    r = run_cli("stages")
    assert "hf-compiled" in r.stdout
