"""The report's tensor-parallel section: each result compared with its smallest-TP twin of the
same stage. Built here from the committed H200 journey: a TP=2 twin whose records are copies
must scale by exactly 1.00x (so 50% per GPU added), and a twin with its own numbers by theirs."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmopt_bench.analysis.scaling import scaling_rows
from llmopt_bench.core.results import MemoryRecord, load_run
from llmopt_bench.render.report import render_markdown

JOURNEY = Path(__file__).resolve().parents[2] / "results" / "h200"


def twin(run, name, tp=2, **changes):
    s = run.stage(name).model_copy(deep=True)
    s.name, s.stage, s.params = f"{name}-tp{tp}", name, {**s.params, "tensor_parallel_size": tp}
    for k, v in changes.items():
        setattr(s, k, v)
    run.stages.append(s)
    return s


@pytest.fixture
def run():
    return load_run(JOURNEY)


def test_a_run_without_twins_has_no_tensor_parallel_section(run):
    assert scaling_rows(run) == [] and "## Tensor parallelism" not in render_markdown(run, charts={})


def test_copies_scale_by_one(run):
    twin(run, "vllm")
    twin(run, "continuous-batching")
    rows = {r.stage: r for r in scaling_rows(run)}
    assert set(rows) == {"vllm", "continuous-batching"}
    for r in rows.values():
        assert (r.tp, r.base_tp, r.base) == (2, 1, r.stage)
        assert r.latency_speedup == pytest.approx(1.0) and r.throughput_scaling == pytest.approx(1.0)
        assert r.efficiency == pytest.approx(0.5)
    cb = run.stage("continuous-batching").extra
    assert rows["continuous-batching"].saturated_tok_s == cb["throughput_point"]["continuous"]["output_tok_s"]
    assert rows["continuous-batching"].batch1_tpot_s == next(x["tpot_p50_s"] for x in cb["curve"]
                                                             if x["mode"] == "continuous" and x["concurrency"] == 1)
    assert rows["vllm"].saturated_how == "the fixed workload (not saturated)"
    text = render_markdown(run, charts={})
    section = text[text.index("## Tensor parallelism"):text.index("## Stages that did not run")]
    assert "| vllm | vllm-tp2 | 2 | vllm (TP 1) |" in section and "| 1.00x | " in section and "50.0%" in section


def test_a_twin_with_its_own_numbers_scales_by_them(run):
    cb = run.stage("continuous-batching")
    facts = cb.facts.model_copy(update={"saturated_tok_s": 1.6 * cb.facts.saturated_tok_s})
    twin(run, "continuous-batching", facts=facts, memory=MemoryRecord(process_peak_bytes_by_device={"0": 70e9, "1": 71e9}))
    (r,) = scaling_rows(run)
    assert r.throughput_scaling == pytest.approx(1.6) and r.efficiency == pytest.approx(0.8)
    assert "| 70.0, 71.0 |" in render_markdown(run, charts={})


def test_throughput_of_different_kinds_is_not_compared(run):
    cb = run.stage("continuous-batching")
    top = max(r["output_tok_s"] for r in cb.extra["curve"] if r["mode"] == "continuous")
    twin(run, "continuous-batching", facts=cb.facts.model_copy(update={"saturated_tok_s": top, "saturated_how": "top of the load curve"}))
    (r,) = scaling_rows(run)
    assert r.saturated_how == "top of the load curve" and r.throughput_scaling is None
