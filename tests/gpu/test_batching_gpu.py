"""continuous-batching on a CUDA GPU with synthetic:llama2-7b: the 256 x 128/128 throughput
point (H200 reference: 11311 output tok/s for vLLM FP16), continuous vs static batching at
concurrency 16, and the mixed-length pitfall (static batch of 32 padded to the long documents
with eager attention runs out of memory; capping the context and bucketing do not)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from testkit import read_run, run_cli

pytestmark = pytest.mark.gpu

JOURNEY = """
[[stage]]
name = "continuous-batching"
timeout_s = 3000
params = { concurrency = [16], main_concurrency = 16, throughput_point = true, capacity = false, mixed = "on", mixed_batch = 32, cap_context = 1024 }
"""


def _vllm_python() -> str | None:
    py = os.environ.get("LLMOPT_VLLM_PYTHON") or sys.executable
    ok = subprocess.run([py, "-c", "import vllm"], capture_output=True).returncode == 0
    return py if ok else None


@pytest.fixture(scope="module")
def stage(tmp_path_factory):
    py = _vllm_python()
    if py is None:
        pytest.skip("vLLM is not importable here (set LLMOPT_VLLM_PYTHON to a python with a CUDA vLLM)")
    tmp = tmp_path_factory.mktemp("batching-gpu")
    (tmp / "journey.toml").write_text(JOURNEY)
    out = tmp / "out"
    r = run_cli("bench", "--stages", str(tmp / "journey.toml"), "--model", "synthetic:llama2-7b", "--repeats", "1",
                "--output", str(out), "--no-report", env={"LLMOPT_VLLM_PYTHON": py}, timeout=3300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    s = read_run(out)["stages"][0]
    assert s["status"] == "ok", (s.get("reason"), s.get("log"))
    return s


def test_throughput_point_over_5000_tok_s(stage):
    tp = stage["extra"]["throughput_point"]["continuous"]
    assert tp["requests"] == 256 and tp["failed"] == 0, tp
    assert tp["output_tok_s"] > 5000, tp  # H200 reference 11311


def test_continuous_beats_static_at_16(stage):
    rows = {r["mode"]: r for r in stage["extra"]["curve"] if r["concurrency"] == 16}
    assert rows["continuous"]["failed"] == 0 and rows["static"]["failed"] == 0
    assert rows["continuous"]["output_tok_s"] > rows["static"]["output_tok_s"]


def test_mixed_static_ooms_and_the_fixes_fit(stage):
    rows = {r["config"]: r for r in stage["extra"]["mixed"]}
    assert rows["static-mixed"]["status"] == "oom", rows["static-mixed"]
    assert rows["static-mixed"]["memory_at_oom_bytes"] > 0
    assert rows["cap-context"]["status"] == "ok" and rows["bucketed"]["status"] == "ok"
    assert rows["cap-context"]["all_tokens_produced"] and rows["bucketed"]["all_tokens_produced"]


def test_engine_memory_freed_before_transformers(stage):
    life = stage["extra"]["lifecycle"]
    assert life["freed"] is True
    assert life["after_shutdown"]["free_bytes"] > life["with_engine"]["free_bytes"]


def test_energy_per_point_and_the_headline_is_the_main_point(stage):
    """Every point's serving is a timed window of the NVML energy counter: joules per output
    token at each concurrency, and the stage's headline energy is the main point's (16)."""
    extra = stage["extra"]
    rows = extra["curve"] + [extra["throughput_point"]["continuous"], extra["throughput_point"]["static"]]
    for r in rows:
        if r["oom"]:
            assert "energy" not in r, r  # its window never closed
            continue
        e, new = r["energy"], r.get("output_len") or extra["sweep"]["output_len"]
        assert r["failed"] == 0 and e["output_tokens"] == r["completed"] * new and e["joules"] > 0, r
        assert e["joules_per_output_token"] == pytest.approx(e["joules"] / e["output_tokens"])
    main = next(r for r in extra["curve"] if r["mode"] == "continuous" and r["concurrency"] == 16)
    assert stage["energy"]["scope"] == "timed windows"
    assert stage["energy"]["joules"] == main["energy"]["joules"]
    assert stage["energy"]["output_tokens"] == main["energy"]["output_tokens"]
