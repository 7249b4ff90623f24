"""The steady-state judgement (load/steady.py), criterion by criterion, on timelines built by
hand, each at both sides of its threshold; then the H200 case of issue 23 rebuilt (59.4 req/s
arriving, 43.1 completing, every latency within the SLO): today's verdict (the SLO on the
requests that finished) met it; the load machine's calls it a miss and says why."""

from __future__ import annotations

import math

import pytest

from llmopt_bench.analysis.slo import judge
from llmopt_bench.core.records import RequestSample
from llmopt_bench.core.slo import parse_slo
from llmopt_bench.load import steady as S
from llmopt_bench.load.dispatchers import Timeline
from llmopt_bench.load.point import LoadPoint, point_result
from llmopt_bench.load.record import slo_verdict


def tl(i: int, arrival: float, answered: float, first: float | None = None, tokens: int = 4) -> Timeline:
    first = arrival + 0.01 if first is None else first
    times = [first + k * (answered - first) / (tokens - 1) for k in range(tokens)]
    s = RequestSample(request_id=f"r{i}", prompt_id="p", prompt_tokens=3, output_tokens=tokens, t_submit=arrival,
                      t_first=times[0], t_done=times[-1], token_times=times)
    return Timeline(i, arrival, arrival, answered, s)


def even(rate: float, start: float, end: float, in_system: float, k0: int = 0) -> list[Timeline]:
    """Arrivals every 1/rate in [start, end), each answered in_system later."""
    n = int(round((end - start) * rate))
    return [tl(k0 + i, start + i / rate, start + i / rate + in_system) for i in range(n)]


# --- 1. completions keep up with arrivals ---------------------------------------------------

def later_half(arrived: int, answered: int) -> list[Timeline]:
    """A window [0, 4]: `arrived` arrivals and `answered` answers in its later half (2, 4]."""
    arrivals = [tl(i, 2 + (i + 1) * 2 / arrived, 10.0) for i in range(arrived)]  # answered after the window
    answers = [tl(1000 + i, 0.5, 2 + (i + 1) * 2 / answered) for i in range(answered)]  # arrived in the first half
    return arrivals + answers


def test_keep_up_allows_the_backlogs_jitter_below_95_percent():
    # rate 50/s, 0.1 s in system: L = 5, jitter allowance 3 sqrt(2 L + 1) = 9.95 requests;
    # 100 arrivals in the half: a miss below 95 - 9.95 = 85.05 answers
    allowance = S.NOISE_SIGMAS * math.sqrt(2 * 50 * 0.1 + 1)
    assert 85 < S.KEEP_UP * 100 - allowance < 86
    _, _, why = S.keep_up(later_half(100, 86), 0.0, 4.0, 50.0, 0.1)
    assert why is None
    a, c, why = S.keep_up(later_half(100, 85), 0.0, 4.0, 50.0, 0.1)
    assert (a, c) == (50.0, 42.5) and why == "completions 42.5/s for 50.0/s arriving"


# --- 2. the backlog is what Little's law gives -----------------------------------------------

def test_little_s_law_bounds_the_backlog_at_the_window_s_end():
    # first third of [0, 9]: 30 arrivals at 10/s, 0.5 s each in system: L = 10/s x 0.5 s = 5;
    # the bound: 2 x 5 + 3 sqrt(5) + 1 = 17.7 requests in flight or queued at the end
    first = even(10.0, 0.0, 3.0, 0.5)
    limit = S.LITTLE_FACTOR * 5 + S.LITTLE_SIGMAS * math.sqrt(5) + 1
    stuck = [tl(100 + i, 8.0 + i * 0.01, 20.0) for i in range(17)]
    at_end, expected, why = S.little(first + stuck, 0.0, 9.0, 10.0)
    assert (at_end, expected, why) == (17, pytest.approx(5.0), None) and at_end < limit
    at_end, _, why = S.little(first + stuck + [tl(999, 8.9, 20.0)], 0.0, 9.0, 10.0)
    assert at_end == 18 > limit
    assert why == "18 in flight or queued at the window's end, 3.6x the 5 Little's law gives (10.0/s x 0.50 s)"


def test_little_s_law_takes_the_mean_time_in_system():
    # first third: 0.1, 0.1, 0.1 and 1.3 s in system (mean 0.4 s, median 0.1 s) at 10/s: L = 4,
    # the bound 2 x 4 + 3 sqrt(4) + 1 = 15; 10 at the end is within it (on the median: 6, not)
    first = [tl(i, i * 0.5, i * 0.5 + w) for i, w in enumerate([0.1, 0.1, 0.1, 1.3])]
    stuck = [tl(100 + i, 8.0 + i * 0.01, 20.0) for i in range(10)]
    at_end, expected, why = S.little(first + stuck, 0.0, 9.0, 10.0)
    assert (at_end, expected, why) == (10, pytest.approx(4.0), None)


# --- 3. latency does not trend ----------------------------------------------------------------

def with_first_tokens(waits: list[float], span: float = 9.0) -> list[Timeline]:
    """Arrivals evenly over [0, span), each waiting waits[i] for its first token, answered 1 s later."""
    step = span / len(waits)
    return [tl(i, i * step, i * step + 1.0, first=i * step + w) for i, w in enumerate(waits)]


def test_the_wait_for_a_first_token_may_not_rise_across_the_window():
    # medians: first third 0.10 s, last third 0.16 s (x1.6 > 1.5, and 60 ms > the floor:
    # max(20 ms, a quarter of the first third's 1 s in system) = 250 ms): not a trend
    waits = [0.1] * 3 + [0.12] * 3 + [0.16] * 3
    first, last, why = S.trend(with_first_tokens(waits), 0.0, 9.0)
    assert (first, last, why) == (pytest.approx(0.1), pytest.approx(0.16), None)
    # the same ratio over a floor it crosses: 0.6 s -> 0.96 s rises by 360 ms > 250 ms
    waits = [0.6] * 3 + [0.7] * 3 + [0.96] * 3
    _, _, why = S.trend(with_first_tokens(waits), 0.0, 9.0)
    assert why == "TTFT from arrival rose from 600 ms to 960 ms across the window"
    # x1.4 by 400 ms: under the ratio
    waits = [1.0] * 3 + [1.2] * 3 + [1.4] * 3
    assert S.trend(with_first_tokens(waits), 0.0, 9.0)[2] is None


def test_the_wait_counts_from_arrival_not_from_the_send():
    """A client queue (max_concurrency) that grows: each request sent later after its arrival,
    its TTFT from the send flat at 50 ms; from arrival the wait rises from 50 ms to 1.05 s."""
    out = []
    for i in range(9):
        a = i * 1.0
        sent = a + 0.125 * i
        first = sent + 0.05
        t = tl(i, a, sent + 1.0, first=first)
        t.sent, t.sample = sent, t.sample.model_copy(update={"t_submit": sent})
        out.append(t)
    first, last, why = S.trend(out, 0.0, 9.0)
    # first third [0, 3]: waits 0.05, 0.175, 0.3, 0.425; last [6, 9]: 0.8, 0.925, 1.05
    assert (first, last) == (pytest.approx(0.2375), pytest.approx(0.925))
    assert why == "TTFT from arrival rose from 237 ms to 925 ms across the window"  # 237.49999... ms


def test_too_few_requests_in_a_third_is_no_trend_verdict():
    assert S.trend(with_first_tokens([0.1, 0.1, 5.0, 5.0, 5.0]), 0.0, 9.0) == (None, None, None)


# --- 4. the window is long enough to see a queue form ----------------------------------------

def test_a_window_shorter_than_five_times_in_system_is_too_short():
    ok = S.judge_steady(even(10.0, 0.0, 10.0, 2.0), even(10.0, 0.0, 10.0, 2.0), 0.0, 10.0, 10.0)
    assert ok.ok and ok.min_window_s == pytest.approx(10.0)
    tls = even(10.0, 0.0, 10.0, 2.1)
    short = S.judge_steady(tls, tls, 0.0, 10.0, 10.0)
    assert short.ok is False and short.reasons == [
        "the window (10.0 s) is under 5x its median time in system (2.10 s): too short to see a queue form"]


def test_a_server_that_keeps_up_is_steady_and_its_figures_are_its_own():
    tls = even(20.0, 0.0, 12.0, 0.21)  # arrivals at 0, 0.05, ... 11.95, each answered 0.21 s later
    st = S.judge_steady(tls, tls, 0.0, 12.0, 20.0)
    assert st.ok and st.reasons == [] and st.reason is None
    # later half (6, 12]: 119 arrivals (6.05 ... 11.95), 120 answers (those that arrived 5.8 ... 11.75)
    assert st.arrival_rps == pytest.approx(119 / 6.0) and st.completion_rps == pytest.approx(120 / 6.0)
    # at 12: the arrivals of 11.8 ... 11.95 unanswered; Little's law: 20/s x 0.21 s
    assert st.backlog_at_end == 4 and st.little_in_flight == pytest.approx(4.2)
    assert st.first_token_first_s == pytest.approx(0.01) and st.time_in_system_p50_s == pytest.approx(0.21)


# --- the H200 case ------------------------------------------------------------------------------

def h200_like() -> list[Timeline]:
    """Arrivals every 1/59.4 s; admitted at once (first token 50 ms after arrival) and slowed
    down, the server finishing one every 1/43.1 s: E2E grows, TTFT and TPOT stay within the SLO."""
    out = []
    for i in range(int(22 * 59.4) + 1):
        a, done = i / 59.4, 0.5 + i / 43.1
        out.append(tl(i, a, done, first=a + 0.05, tokens=100))
    return out


def test_the_h200_case_was_met_by_the_slo_alone_and_is_a_miss_in_steady_state():
    slo = parse_slo("ttft_p99=2s,tpot_p99=100ms")
    tls = h200_like()
    point = LoadPoint(rate=59.4, duration_s=22.0, warmup_s=2.0)
    res = point_result(point, tls, 0.0)
    old = judge(slo, res.samples)
    assert old.ok  # the requests that finished were fast: today's verdict
    v = slo_verdict(slo, res, 0.01)
    assert not v.ok and v.reason.startswith("not steady: completions 43.1/s for 59.4/s arriving")
    assert "in flight or queued at the window's end" in v.reason  # Little's law too
    assert res.steady.completion_rps == pytest.approx(43.1) and res.steady.arrival_rps == pytest.approx(59.4)
