"""analysis/metrics.py on hand-built RequestSamples whose answers are worked out by hand."""

from __future__ import annotations

import statistics

import pytest

from llmopt_bench.analysis import metrics
from llmopt_bench.core.records import RequestSample


def sample(rid: str, submit: float, token_times: list[float], repeat: int = 0, prompt_tokens: int = 10,
           ok: bool = True, output_tokens: int | None = None) -> RequestSample:
    return RequestSample(request_id=rid, prompt_id=f"p-{rid}", repeat=repeat, prompt_tokens=prompt_tokens,
                         output_tokens=len(token_times) if output_tokens is None else output_tokens,
                         t_submit=submit, t_first=token_times[0] if token_times else submit,
                         t_done=token_times[-1] if token_times else submit, token_times=token_times, ok=ok,
                         error=None if ok else "engine said no")


# Request a: submit 0, tokens at 0.5, 0.6, 0.8, 1.1 -> TTFT 0.5, E2E 1.1, TPOT 0.6/3 = 0.2, ITL .1 .2 .3
# Request b: submit 1.1, tokens at 1.4, 1.5, 1.6 -> TTFT 0.3, E2E 0.5, TPOT 0.2/2 = 0.1, ITL .1 .1
A = dict(rid="a", submit=0.0, token_times=[0.5, 0.6, 0.8, 1.1])
B = dict(rid="b", submit=1.1, token_times=[1.4, 1.5, 1.6])


def test_single_request_definitions():
    s = sample(**A)
    assert metrics.ttft(s) == pytest.approx(0.5)
    assert metrics.e2e(s) == pytest.approx(1.1)
    assert metrics.tpot(s) == pytest.approx((1.1 - 0.5) / 3)
    assert metrics.itls(s) == pytest.approx([0.1, 0.2, 0.3])


def test_compute_two_requests_one_repeat():
    m = metrics.compute([sample(**A), sample(**B)])
    assert m.requests == 2 and m.failed_requests == 0 and m.repeats == 1
    assert m.output_tokens == 7 and m.prompt_tokens == 20
    assert m.ttft_s.n == 2 and m.ttft_s.mean == pytest.approx(0.4)
    assert m.ttft_s.min == pytest.approx(0.3) and m.ttft_s.max == pytest.approx(0.5)
    assert m.e2e_s.mean == pytest.approx((1.1 + 0.5) / 2)
    assert m.tpot_s.n == 2 and m.tpot_s.p50 == pytest.approx((0.2 + 0.1) / 2)
    # every gap between consecutive tokens, pooled across requests: 3 + 2
    assert m.itl_s.n == 5
    gaps = [0.1, 0.2, 0.3, 0.1, 0.1]
    assert m.itl_s.mean == pytest.approx(statistics.fmean(gaps))
    assert m.itl_s.p50 == pytest.approx(statistics.median(gaps))
    assert m.itl_s.max == pytest.approx(0.3)
    # window: first submit 0.0 to last token 1.6
    assert m.output_tok_s == pytest.approx(7 / 1.6)
    assert m.qps == pytest.approx(2 / 1.6)
    assert m.output_tok_s_repeats == pytest.approx([7 / 1.6])
    assert m.qps_repeats == pytest.approx([2 / 1.6])


def test_tpot_differs_from_mean_itl_when_first_gap_is_excluded():
    # TPOT is (E2E - TTFT)/(n-1): the time to the first token is not part of it
    s = sample("c", 0.0, [2.0, 2.5, 3.0])
    assert metrics.tpot(s) == pytest.approx(0.5)
    assert metrics.compute([s]).tpot_s.p50 == pytest.approx(0.5)
    assert metrics.compute([s]).ttft_s.p50 == pytest.approx(2.0)


def test_one_token_request_has_no_tpot_and_no_itl():
    s = sample("one", 0.0, [0.25])
    assert metrics.tpot(s) is None
    assert metrics.itls(s) == []
    m = metrics.compute([s])
    assert m.tpot_s is None and m.itl_s is None
    assert m.ttft_s.p50 == pytest.approx(0.25) and m.e2e_s.p50 == pytest.approx(0.25)
    assert m.tpot_p50_repeats_s == []
    assert m.output_tok_s == pytest.approx(1 / 0.25)


def test_one_token_request_does_not_dilute_others_tpot():
    m = metrics.compute([sample(**A), sample("one", 2.0, [2.1])])
    assert m.tpot_s.n == 1 and m.tpot_s.p50 == pytest.approx(0.2)
    assert m.ttft_s.n == 2


def test_failed_samples_are_excluded_but_counted():
    bad = sample("bad", 0.0, [9.0, 19.0, 29.0], ok=False)
    m = metrics.compute([sample(**A), bad, sample(**B)])
    assert m.requests == 2 and m.failed_requests == 1
    assert m.output_tokens == 7
    assert m.ttft_s.max == pytest.approx(0.5)  # the failed 9 s TTFT is not in it
    assert m.e2e_s.max == pytest.approx(1.1)
    assert m.itl_s.max == pytest.approx(0.3)
    assert m.output_tok_s == pytest.approx(7 / 1.6)  # nor is its window (to 29 s)


def test_all_failed_is_none():
    assert metrics.compute([sample("x", 0.0, [1.0, 2.0], ok=False)]) is None
    assert metrics.compute([]) is None


def test_throughput_per_repeat_window_then_mean():
    # repeat 0: 2 requests, 4 + 4 tokens over [0, 2] -> 4 tok/s, 1 qps
    # repeat 1: 2 requests, 4 + 4 tokens over [10, 14] -> 2 tok/s, 0.5 qps
    # a single window over both repeats would give 16/14 tok/s: the idle gap must not count
    r0 = [sample("a0", 0.0, [0.2, 0.4, 0.6, 1.0]), sample("b0", 1.0, [1.2, 1.4, 1.6, 2.0])]
    r1 = [sample("a1", 10.0, [10.4, 10.8, 11.2, 12.0], repeat=1), sample("b1", 12.0, [12.4, 12.8, 13.2, 14.0], repeat=1)]
    m = metrics.compute(r0 + r1)
    assert m.repeats == 2 and m.requests == 4
    assert sorted(m.output_tok_s_repeats) == pytest.approx([2.0, 4.0])
    assert sorted(m.qps_repeats) == pytest.approx([0.5, 1.0])
    assert m.output_tok_s == pytest.approx(3.0)
    assert m.qps == pytest.approx(0.75)
    # TPOT p50 of each repeat: repeat 0 -> 0.8/3 both; repeat 1 -> 1.6/3 both
    assert sorted(m.tpot_p50_repeats_s) == pytest.approx([0.8 / 3, 1.6 / 3])


def test_concurrent_requests_share_the_window():
    # a batch of 3 submitted together, done at 1.0: window 1 s, not the sum of their E2Es
    batch = [sample(f"b{i}", 0.0, [0.4, 0.6, 0.8, 1.0]) for i in range(3)]
    m = metrics.compute(batch)
    assert m.output_tok_s == pytest.approx(12.0)
    assert m.qps == pytest.approx(3.0)
    assert m.ttft_s.std == pytest.approx(0.0, abs=1e-12)


def test_output_tokens_counts_what_the_sample_says():
    # tok/s uses output_tokens (what the engine produced), not the number of timestamps
    s = sample("n", 0.0, [0.5, 1.0], output_tokens=4)
    m = metrics.compute([s])
    assert m.output_tokens == 4
    assert m.output_tok_s == pytest.approx(4.0)
    assert metrics.tpot(s) == pytest.approx(0.5 / 3)
