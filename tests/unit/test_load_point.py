"""A load point's arithmetic (load/point.summarize), exactly, on timelines built by hand: the
window, the achieved rate (n arrivals that open and close a window span n - 1 gaps), the
warm-up, the drain (answers after the window's end are measured requests too), in flight vs
queued on the client at the window's end, the send delay, short answers, the busy window's
rates, and repeats combined. Every expected value is computed by hand from the timeline; no
tolerance wider than float rounding."""

from __future__ import annotations

import pytest

from llmopt_bench.core.records import RequestSample
from llmopt_bench.load.dispatchers import Timeline
from llmopt_bench.load.point import LoadPoint, combine, point_result

T0 = 100.0


def tl(i: int, arrival: float, sent: float, answered: float, tokens: int = 4, ttft: float = 0.1, ok: bool = True,
       repeat: int = 0) -> Timeline:
    """Request i (times as offsets from T0): its first token ttft after it was sent, its
    tokens evenly spaced up to `answered`."""
    a, s, d = T0 + arrival, T0 + sent, T0 + answered
    first = s + ttft
    times = [first + k * (d - first) / (tokens - 1) for k in range(tokens)] if tokens > 1 else [d]
    sample = RequestSample(request_id=f"r{i}", prompt_id="p", repeat=repeat, prompt_tokens=3, output_tokens=tokens if ok else 0,
                           t_submit=s, t_first=times[0], t_done=times[-1], token_times=times if ok else [], ok=ok,
                           error=None if ok else "timeout: test")
    return Timeline(i, a, s, d, sample)


def test_a_count_bound_point_spans_n_minus_1_gaps():
    # 5 arrivals from 0.0 to 0.5: the window is 0.5 s and holds 4 gaps: 8 req/s, not 10
    tls = [tl(i, a, a, a + 0.3) for i, a in enumerate([0.0, 0.1, 0.25, 0.4, 0.5])]
    res = point_result(LoadPoint(rate=10.0, num_requests=5), tls, T0)
    assert res.window_s == pytest.approx(0.5, abs=1e-12)
    assert res.achieved_rate == pytest.approx(4 / 0.5, abs=1e-9)
    assert (res.sent, res.completed, res.failed, res.warmup_excluded) == (5, 5, 0, 0)


def test_a_duration_bound_point_counts_its_arrivals_over_its_window():
    # warm-up 0.2 s of a 1 s point: two arrivals left out, four in [0.2, 1.0]
    tls = [tl(i, a, a, a + 0.3) for i, a in enumerate([0.0, 0.1, 0.2, 0.35, 0.6, 0.9])]
    res = point_result(LoadPoint(rate=5.0, duration_s=1.0, warmup_s=0.2), tls, T0)
    assert res.window_s == pytest.approx(0.8, abs=1e-12)
    assert res.achieved_rate == pytest.approx(4 / 0.8, abs=1e-9)
    assert (res.sent, res.warmup_excluded) == (4, 2)
    assert [s.request_id for s in res.samples] == ["r2", "r3", "r4", "r5"]


def test_answers_after_the_window_are_measured_and_the_drain_is_their_wait():
    # the window closes at 1.0; r3 and r4 are answered at 1.7 and 2.35: both measured
    tls = [tl(0, 0.0, 0.0, 0.4), tl(1, 0.3, 0.3, 0.9), tl(2, 0.5, 0.5, 1.2), tl(3, 0.8, 0.8, 1.7), tl(4, 0.95, 0.95, 2.35)]
    res = point_result(LoadPoint(rate=5.0, duration_s=1.0), tls, T0)
    assert [s.request_id for s in res.samples] == ["r0", "r1", "r2", "r3", "r4"] and res.completed == 5
    assert res.drain_s == pytest.approx(1.35, abs=1e-9)
    assert res.metrics.requests == 5
    assert res.metrics.e2e_s.max == pytest.approx(2.35 - 0.95, abs=1e-9)


def test_a_request_queued_on_the_client_is_not_in_flight():
    # at the window's end (1.0): r0 done, r1 sent and unanswered (in flight), r2 arrived at 0.9
    # but sent at 1.2 (waiting on the client: queued), r3 arrived at 0.95, sent at 0.97, unanswered
    tls = [tl(0, 0.3, 0.3, 0.8), tl(1, 0.5, 0.6, 1.5), tl(2, 0.9, 1.2, 1.8), tl(3, 0.95, 0.97, 1.6)]
    res = point_result(LoadPoint(rate=4.0, duration_s=1.0, max_concurrency=2), tls, T0)
    assert (res.in_flight_at_end, res.queued_at_end) == (2, 1)
    # the send delay: sent - due, per measured request
    assert res.send_delay_s.n == 4 and res.send_delay_s.max == pytest.approx(0.3, abs=1e-9)
    assert res.send_delay_s.p50 == pytest.approx((0.02 + 0.1) / 2, abs=1e-9)  # of 0, 0.1, 0.3, 0.02


def test_an_answer_short_of_the_forced_length_is_a_failed_request():
    tls = [tl(0, 0.0, 0.0, 0.4, tokens=4), tl(1, 0.2, 0.2, 0.6, tokens=3), tl(2, 0.4, 0.4, 0.9, ok=False)]
    res = point_result(LoadPoint(rate=5.0, num_requests=3), tls, T0, expected_tokens=4)
    assert (res.completed, res.failed) == (1, 2) and res.failure_rate == pytest.approx(2 / 3)
    assert res.errors == {"short": 1, "timeout": 1}
    assert res.samples[1].error == "short: 3 of 4 tokens" and not res.samples[1].ok
    assert res.metrics.requests == 1 and res.metrics.failed_requests == 2


def test_rates_are_over_the_busy_window_of_complete_requests():
    # complete requests sent from 0.0, last token at 1.6: 3 requests, 12 tokens
    tls = [tl(0, 0.0, 0.0, 0.7), tl(1, 0.5, 0.5, 1.6), tl(2, 0.8, 0.8, 1.1), tl(3, 0.9, 0.9, 2.5, ok=False)]
    res = point_result(LoadPoint(rate=4.0, num_requests=4), tls, T0)
    assert res.busy_s == pytest.approx(1.6, abs=1e-9)
    assert res.qps == pytest.approx(3 / 1.6, abs=1e-9) and res.output_tok_s == pytest.approx(12 / 1.6, abs=1e-9)


def test_a_closed_loop_has_no_send_delay_or_steady_verdict_and_leaves_its_ramp_out():
    # 2 users: their first requests (the ramp) at 0; each next one when the last answer came
    tls = [tl(0, 0.0, 0.0, 0.5), tl(1, 0.0, 0.0, 0.6), tl(2, 0.5, 0.5, 1.0), tl(3, 0.6, 0.6, 1.2), tl(4, 1.0, 1.0, 1.4)]
    res = point_result(LoadPoint(concurrency=2, num_requests=5, warmup_requests=2), tls, T0)
    assert (res.sent, res.warmup_excluded) == (3, 2)
    assert res.window_s == pytest.approx(0.5, abs=1e-12) and res.achieved_rate == pytest.approx(2 / 0.5, abs=1e-9)
    assert res.send_delay_s is None and res.steady is None
    # at the window's end (1.0): r3 in flight (sent 0.6); r4 arrived and was sent as it closed: neither
    assert res.in_flight_at_end == 1 and res.queued_at_end == 0


def test_repeats_combine_into_one_point():
    a = point_result(LoadPoint(concurrency=1, num_requests=2), [tl(0, 0.0, 0.0, 0.4), tl(1, 0.4, 0.4, 0.8)], T0)
    b = point_result(LoadPoint(concurrency=1, num_requests=2),
                  [tl(0, 0.0, 0.0, 0.2, repeat=1), tl(1, 0.2, 0.2, 1.0, repeat=1, ok=False)], T0)
    both = combine([a, b])
    assert (both.sent, both.completed, both.failed) == (4, 3, 1) and both.errors == {"timeout": 1}
    assert both.failure_rate == pytest.approx(0.25)
    # per-repeat rates, averaged: 2 / 0.8 s and 1 / 0.2 s
    assert both.qps == pytest.approx((2 / 0.8 + 1 / 0.2) / 2, abs=1e-9)
    assert [s.repeat for s in both.samples] == [0, 0, 1, 1]
