"""The quality gate: perplexity against the FP16 reference's, judged in run.json."""

from __future__ import annotations

import pytest

from llmopt_bench.analysis.quality_gate import apply_gate, judge
from llmopt_bench.cli.bench import parse_min_quality
from llmopt_bench.errors import UsageError
from llmopt_bench.results import RunResult, StageResult
from llmopt_bench.workload import WorkloadConfig

REF = {"perplexity": 10.0, "perplexity_meaningful": True}


@pytest.mark.parametrize("ppl,flagged", [(10.0, False), (10.09, False), (10.11, True), (9.5, False), (14.0, True)])
def test_perplexity_more_than_one_percent_above_fp16_is_a_regression(ppl, flagged):
    got = judge({"perplexity": ppl, "perplexity_meaningful": True}, REF, 0.99)
    assert got["quality_regression"] is flagged
    assert got["quality_ratio"] == pytest.approx(ppl / 10.0)
    assert got["gate"].startswith("perplexity within 1% of hf-fp16's") and f"{ppl:.4g} vs 10" in got["gate"]


def test_a_looser_gate_lets_more_through():
    q = {"perplexity": 10.4, "perplexity_meaningful": True}
    assert judge(q, REF, 0.99)["quality_regression"] is True
    assert judge(q, REF, 0.95)["quality_regression"] is False


def test_random_weights_and_missing_reference_are_not_judged():
    synthetic = judge({"perplexity": None, "perplexity_meaningful": False, "perplexity_note": "random weights"}, REF, 0.99)
    assert synthetic["quality_regression"] is None and "random weights" in synthetic["gate"]
    no_ref = judge({"perplexity": 12.0, "perplexity_meaningful": True}, None, 0.99)
    assert no_ref["quality_regression"] is None and "no hf-fp16 perplexity" in no_ref["gate"]


def test_apply_gate_writes_every_ok_stage_and_skips_the_rest():
    def stage(name, ppl, status="ok"):
        return StageResult(name=name, status=status, extra={"quality": {"perplexity": ppl, "perplexity_meaningful": True}})

    run = RunResult(run_id="r", created_at="now", command="llmopt bench", workload=WorkloadConfig(),
                    stages=[stage("hf-fp16", 10.0), stage("bnb-int8", 10.05), stage("bnb-nf4", 13.0), stage("awq-int4", 11.0, "error")])
    apply_gate(run, 0.99)
    q = {s.name: s.extra["quality"] for s in run.stages}
    assert q["hf-fp16"]["quality_regression"] is False and q["bnb-int8"]["quality_regression"] is False
    assert q["bnb-nf4"]["quality_regression"] is True and q["bnb-nf4"]["quality_ratio"] == pytest.approx(1.3)
    assert "gate" not in q["awq-int4"]  # not ok: not judged


@pytest.mark.parametrize("text,value", [("0.99", 0.99), ("99%", 0.99), ("1", 1.0), ("95%", 0.95), (None, None)])
def test_min_quality_option_parses(text, value):
    assert parse_min_quality(text) == (pytest.approx(value) if value is not None else None)


@pytest.mark.parametrize("text", ["0", "1.5", "120%", "abc", "-3%"])
def test_min_quality_option_rejects_nonsense(text):
    with pytest.raises(UsageError, match="--min-quality"):
        parse_min_quality(text)
