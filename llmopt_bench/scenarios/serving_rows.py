"""A measured load point as the serving scenario keeps it: its row (LoadRow), its per-request
figures for judging it again under another SLO (stage.SLOPoint), and the stage's facts."""

from __future__ import annotations

from typing import Any

from llmopt_bench.analysis import metrics as M
from llmopt_bench.analysis.slo import Verdict
from llmopt_bench.core.records import SLOPoint, StageFacts
from llmopt_bench.scenarios.load import PointResult
from llmopt_bench.scenarios.serving_record import LoadRow
from llmopt_bench.scenarios.slo_search import Capacity

THROUGHPUT_HOW = "throughput point (all requests at once)"  # as continuous-batching names its own


def _p(dist: Any, attr: str) -> float | None:
    return getattr(dist, attr) if dist is not None else None


def busy_window(res: PointResult) -> float | None:
    """First submit to last answer of the measured requests: a closed loop's window (it has no
    arrival schedule, so the window of its arrivals says nothing)."""
    ok = [s for s in res.samples if s.ok]
    return (max(s.t_done for s in ok) - min(s.t_submit for s in ok)) if ok else None


def load_row(phase: str, res: PointResult, verdict: Verdict, energy: dict[str, Any] | None,
             input_len: int | None, output_len: int) -> LoadRow:
    """The row of a point; an open loop's arrival figures (achieved rate, queue at the window's
    end, the client's send delay) are left empty for a closed loop, where they mean nothing."""
    pt, m = res.point, res.metrics
    ok = [s for s in res.samples if s.ok]
    window = busy_window(res)
    open_loop = pt.rate is not None
    return LoadRow(
        phase=phase, mode="open" if pt.rate is not None else "closed", concurrency=pt.concurrency, rate_rps=pt.rate,
        burstiness=pt.burstiness if pt.rate is not None else None, input_len=input_len, output_len=output_len,
        requests=res.sent, completed=len(ok), failed=res.failed, failure_rate=res.failure_rate, errors=res.errors,
        warmup_excluded=res.warmup_excluded, window_s=res.window_s if open_loop else window,
        achieved_rate=res.achieved_rate if open_loop else None,
        output_tok_s=res.output_tok_s, qps=len(ok) / window if window else None,
        ttft_p50_s=_p(m and m.ttft_s, "p50"), ttft_p99_s=_p(m and m.ttft_s, "p99"),
        tpot_p50_s=_p(m and m.tpot_s, "p50"), tpot_p99_s=_p(m and m.tpot_s, "p99"),
        itl_p50_s=_p(m and m.itl_s, "p50"), itl_p99_s=_p(m and m.itl_s, "p99"),
        e2e_p50_s=_p(m and m.e2e_s, "p50"), e2e_p99_s=_p(m and m.e2e_s, "p99"),
        goodput_rps=verdict.goodput_rps, slo_ok=verdict.ok, slo_reason=verdict.reason,
        in_flight_at_end=res.in_flight_at_end if open_loop else None, queued_at_end=res.queued_at_end if open_loop else None,
        drain_s=res.drain_s if open_loop else None,
        send_delay_p50_s=_p(res.send_delay_s, "p50"), send_delay_p99_s=_p(res.send_delay_s, "p99"),
        energy=energy)


def slo_point(res: PointResult, verdict: Verdict) -> SLOPoint:
    """An open-loop point's per-request figures, enough for analysis/recommend.py to judge it
    under any SLO on TTFT, TPOT and E2E (and ITL at p50, p90, p99)."""
    ok = [s for s in res.samples if s.ok]
    itl = res.metrics.itl_s if res.metrics else None
    return SLOPoint(rate_rps=res.point.rate or 0.0, burstiness=res.point.burstiness, window_s=res.window_s,
                    requests=res.sent, failed=res.failed, ttft_s=[M.ttft(s) for s in ok], tpot_s=[M.tpot(s) for s in ok],
                    e2e_s=[M.e2e(s) for s in ok],
                    itl_s={"p50": itl.p50, "p90": itl.p90, "p99": itl.p99} if itl else {},
                    output_tok_s=res.output_tok_s, slo_ok=verdict.ok, goodput_rps=verdict.goodput_rps,
                    queued_at_end=res.queued_at_end)


def facts_of(rows: list[LoadRow], capacity: Capacity | None, points: list[SLOPoint], slo: str, max_failure_rate: float,
             main: str | None) -> StageFacts:
    """What the generic analyses read: latency at concurrency 1, the saturated throughput, and
    the capacity under the SLO with its interval and every open-loop point."""
    one = next((r for r in rows if r.phase == "sweep" and r.concurrency == 1 and r.completed), None)
    tp = next((r for r in rows if r.phase == "throughput" and r.output_tok_s), None)
    sweep = [r for r in rows if r.phase == "sweep" and r.output_tok_s]
    top = max(sweep, key=lambda r: r.output_tok_s or 0, default=None)
    sat, how = (tp.output_tok_s, THROUGHPUT_HOW) if tp else \
        ((top.output_tok_s, f"top of the closed-loop sweep (concurrency {top.concurrency})") if top else (None, None))
    cap = capacity.capacity_rps if capacity else None
    at_cap = next((r for r in rows if r.phase == "search" and cap is not None and r.rate_rps == cap), None)
    main_c = next((r.concurrency for r in rows if main and main == f"sweep: concurrency {r.concurrency}"), None)
    return StageFacts(
        decode_batch=main_c, batch1_tpot_s=one.tpot_p50_s if one else None, batch1_ttft_s=one.ttft_p50_s if one else None,
        saturated_tok_s=sat, saturated_how=how, slo=slo, slo_max_failure_rate=max_failure_rate, slo_capacity_rps=cap,
        slo_capacity_interval=[capacity.passing_rps, capacity.failing_rps] if capacity else None,
        slo_capacity_converged=capacity.converged if capacity else None,
        goodput_rps=at_cap.goodput_rps if at_cap else None, knee_rps=capacity.knee_rps if capacity else None,
        slo_points=points)
