"""The quality gate: perplexity against the quality reference's, judged in run.json."""

from __future__ import annotations

import pytest

from llmopt_bench.analysis.quality_gate import apply_gate, judge
from llmopt_bench.cli.bench import parse_min_quality
from llmopt_bench.core.errors import UsageError
from llmopt_bench.core.records import QualityRecord
from llmopt_bench.core.results import RunResult, StageResult
from llmopt_bench.core.workload import WorkloadConfig

REF = QualityRecord(perplexity=10.0)


@pytest.mark.parametrize("ppl,flagged", [(10.0, False), (10.09, False), (10.11, True), (9.5, False), (14.0, True)])
def test_perplexity_more_than_one_percent_above_the_reference_is_a_regression(ppl, flagged):
    got = judge(QualityRecord(perplexity=ppl), REF, "base", 0.99)
    assert got["quality_regression"] is flagged
    assert got["quality_ratio"] == pytest.approx(ppl / 10.0)
    assert got["gate"].startswith("perplexity within 1% of base's") and f"{ppl:.4g} vs 10" in got["gate"]


def test_a_looser_gate_lets_more_through():
    q = QualityRecord(perplexity=10.4)
    assert judge(q, REF, "base", 0.99)["quality_regression"] is True
    assert judge(q, REF, "base", 0.95)["quality_regression"] is False


def test_random_weights_and_missing_reference_are_not_judged():
    synthetic = judge(QualityRecord(perplexity_meaningful=False, perplexity_note="random weights"), REF, "base", 0.99)
    assert synthetic["quality_regression"] is None and "random weights" in synthetic["gate"]
    no_ref = judge(QualityRecord(perplexity=12.0), None, None, 0.99)
    assert no_ref["quality_regression"] is None and "no quality reference" in no_ref["gate"]


def test_the_reference_is_the_result_flagged_so_not_a_name():
    """The gate follows the flag: a reference named anything, standing anywhere in the run."""
    def stage(name, ppl, status="ok", ref=False):
        return StageResult(name=name, status=status, quality_reference=ref, quality=QualityRecord(perplexity=ppl))

    run = RunResult(run_id="r", created_at="now", command="llmopt bench", workload=WorkloadConfig(),
                    stages=[stage("fast", 10.05), stage("my-fp16", 10.0, ref=True), stage("lossy", 13.0),
                            stage("broken", 11.0, "error")])
    apply_gate(run, 0.99)
    q = {s.name: s.quality for s in run.stages}
    assert q["my-fp16"].quality_regression is False and q["fast"].quality_regression is False
    assert q["lossy"].quality_regression is True and q["lossy"].quality_ratio == pytest.approx(1.3)
    assert "my-fp16's" in q["lossy"].gate
    assert q["broken"].gate is None  # not ok: not judged


@pytest.mark.parametrize("text,value", [("0.99", 0.99), ("99%", 0.99), ("1", 1.0), ("95%", 0.95), (None, None)])
def test_min_quality_option_parses(text, value):
    assert parse_min_quality(text) == (pytest.approx(value) if value is not None else None)


@pytest.mark.parametrize("text", ["0", "1.5", "120%", "abc", "-3%"])
def test_min_quality_option_rejects_nonsense(text):
    with pytest.raises(UsageError, match="--min-quality"):
        parse_min_quality(text)
