"""The short warm-up of transformers engines, and the report's check that it was enough: a first
measured repeat more than 10% slower than the median of the others is said, on constructed
repeats (a real tiny model would make the check itself flaky)."""

from __future__ import annotations

from llmopt_bench.analysis.first_repeat import first_repeat_excess_pct, first_repeat_warning, per_repeat_s_per_token
from llmopt_bench.core.results import Samples, StageResult
from llmopt_bench.core.workload import WorkloadConfig
from llmopt_bench.scenarios.fixed.run import FixedWorkloadStage, warmup_plan


def repeats(*per_token_ms: float, requests: int = 4, tokens: int = 100) -> Samples:
    """Each repeat's requests at that many ms per output token."""
    out = Samples()
    for rep, ms in enumerate(per_token_ms):
        for _ in range(requests):
            out.e2e_s.append(ms / 1e3 * tokens)
            out.output_tokens.append(tokens)
            out.repeat.append(rep)
    return out


def test_per_repeat_time_per_token_in_repeat_order():
    s = repeats(30.0, 20.0, 21.0)
    assert [round(v * 1e3, 6) for v in per_repeat_s_per_token(s)] == [30.0, 20.0, 21.0]
    assert round(first_repeat_excess_pct(per_repeat_s_per_token(s)), 6) == round(100 * (30 / 20.5 - 1), 6)


def test_a_first_repeat_over_10_percent_slower_is_said():
    text = first_repeat_warning(repeats(112.0, 100.0, 101.0), "1 request x 16 tokens")
    assert text is not None and text.startswith("Warning: the first measured repeat ran 11% slower than the median of "
                                                "the other 2 (112 vs 100 ms per output token")
    assert "(1 request x 16 tokens)" in text


def test_within_10_percent_or_faster_or_alone_is_not():
    # the committed H200 bnb-int8 repeats: 101.3, 99.3, 111.2 ms (repeat 0 was not the slow one)
    assert first_repeat_warning(repeats(101.3, 99.3, 111.2), "x") is None
    assert first_repeat_warning(repeats(109.0, 100.0), "x") is None
    assert first_repeat_warning(repeats(80.0, 100.0, 100.0), "x") is None
    assert first_repeat_warning(repeats(150.0), "x") is None
    assert first_repeat_warning(None, "x") is None


def test_the_fixed_stage_report_carries_the_warning():
    result = StageResult(name="bnb-int8", status="ok", samples=repeats(130.0, 100.0, 100.0),
                         extra={"warmup": "1 request x 16 tokens"})
    texts = [b.text for b in FixedWorkloadStage.report_blocks(result, None)]
    assert any(t and t.startswith("Warning: the first measured repeat ran 30% slower") for t in texts), texts


def test_a_short_warmup_is_one_generation_of_its_length():
    w = WorkloadConfig(warmup=2, max_new_tokens=100, batch_size=1)
    assert warmup_plan(w, 16) == (1, 16)  # transformers: one generation of 16 tokens
    assert warmup_plan(w, None) == (2, 100)  # vLLM: the workload's warm-up requests at full length
    assert warmup_plan(w.model_copy(update={"batch_size": 8}), 16) == (2, 16)  # one batch of them
    assert warmup_plan(w.model_copy(update={"max_new_tokens": 8}), 16) == (1, 8)
    assert warmup_plan(w.model_copy(update={"warmup": 0}), 16) == (0, 0)  # --warmup 0: none
