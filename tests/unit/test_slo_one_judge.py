"""One judge and one goodput: a serving point judged by the run itself (load/record.slo_verdict and
its row's goodput) and judged again by `llmopt recommend --slo` from what run.json keeps of it
(analysis/recommend/rejudge.py on its SLOPoint) come out the same, verdict and goodput, under
targets on every metric, ITL included."""

from __future__ import annotations

import pytest
from simserver import vllm_client_run

from llmopt_bench.analysis.recommend.rejudge import rejudge
from llmopt_bench.core.slo import parse_slo
from llmopt_bench.load.record import figures, slo_point, slo_verdict
from llmopt_bench.scenarios.peer.judge import vllm_point


def stalled(run: dict, every: int) -> dict:
    """Every `every`-th request stalls 0.4 s once mid-answer: its own p99 gap is long, the point's
    p99 over every gap is not (1 request in 20 has 1 long gap of 9)."""
    itls = [list(g) for g in run["itls"]]
    for i in range(0, len(itls), every):
        itls[i][4] = 0.4
    return {**run, "itls": itls, "latencies": [t + sum(g) for t, g in zip(run["ttfts"], itls)]}


@pytest.mark.parametrize("slo", ["ttft_p99=2s,tpot_p99=100ms", "ttft_p90=600ms,itl_p99=50ms", "e2e_p50=1s,itl_p90=20ms",
                                 "tpot_p99=40ms,itl_p99=50ms"])
def test_recommend_s_rejudging_agrees_with_the_run_s_own_verdict_and_goodput(slo):
    res = vllm_point(stalled(vllm_client_run(10.0, 30.0, 25.0), every=20), 10.0, warmup_s=2.0)
    target = parse_slo(slo)
    v = slo_verdict(target, res, 0.01)
    again = rejudge([slo_point(res, v)], target, 0.01).points[0]
    assert again.ok == v.ok, (again.reason, v.reason)
    assert again.goodput_rps == pytest.approx(v.goodput_rps) and v.goodput_rps == pytest.approx(figures(res, target)["goodput_rps"])
    assert 0 < v.good_requests <= res.completed


def test_a_request_whose_own_gaps_stall_is_still_good_under_an_itl_target():
    # the ITL target is the point's: 25 stalled requests of 280 do not leave goodput
    res = vllm_point(stalled(vllm_client_run(10.0, 30.0, 25.0), every=20), 10.0, warmup_s=2.0)
    v = slo_verdict(parse_slo("itl_p99=50ms"), res, 0.01)
    assert v.ok and v.good_requests == res.completed
