"""What a load point keeps: the row every load stage writes (PointRow, the base of
continuous-batching's CurveRow and the serving stages' LoadRow, so that a figure means the same
in both), the SLO's verdict with the steady state in it (goodput: analysis/slo.py), and the
per-request figures `llmopt recommend --slo` judges again (SLOPoint)."""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict

from pydantic import Field

from llmopt_bench.analysis import metrics as M
from llmopt_bench.analysis.slo import Verdict, goodput_rps, judge
from llmopt_bench.core.records import CacheRecord, SLOPoint, StrictModel, TurnRow
from llmopt_bench.core.slo import SLO
from llmopt_bench.load.point import PointResult
from llmopt_bench.load.turns import turn_rows
from llmopt_bench.measure.energy import EnergyFigures


class PointRow(StrictModel):
    """One measured load point's figures (load/point.py defines each; docs/serving.md lists them)."""

    concurrency: int | None = None  # a closed loop's users (or an all-at-once point's requests)
    rate_rps: float | None = None  # an open loop's arrival rate, as asked
    input_len: int | None = None  # the prompt and output lengths, where the point has its own
    output_len: int | None = None
    requests: int  # measured requests sent (per repeat)
    completed: int  # complete answers, over every repeat
    failed: int = 0
    failure_rate: float | None = None
    errors: dict[str, int] = Field(default_factory=dict)  # error kind -> count
    repeats: int = 1
    warmup_excluded: int = 0
    window_s: float | None = None
    achieved_rate: float | None = None  # open loop: arrivals a second of the window
    output_tok_s: float | None = None
    qps: float | None = None
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None
    tpot_p50_s: float | None = None
    tpot_p99_s: float | None = None
    itl_p50_s: float | None = None
    itl_p99_s: float | None = None
    e2e_p50_s: float | None = None
    e2e_p99_s: float | None = None
    goodput_rps: float | None = None
    in_flight_at_end: int | None = None  # open loop: sent, not answered, when the window closed
    queued_at_end: int | None = None  # open loop: arrived, not yet sent, when it closed
    drain_s: float | None = None
    send_delay_p50_s: float | None = None  # open loop: when sent - when due (the client's own lateness)
    send_delay_p99_s: float | None = None
    steady: bool | None = None  # open loop: the steady-state judgement (load/steady.py); None: not judged
    steady_reason: str | None = None  # "not steady: completions 43.1/s for 59.4/s arriving"
    completion_rps: float | None = None  # open loop: answers a second over the window's later half
    # J per output token over this point's timed window: measure/energy.Meter.per_key's figures, as typed there
    energy: EnergyFigures | None = None
    error: str | None = None  # the point itself could not run
    cache: CacheRecord | None = None  # the engine's prefix cache and KV use over the point (load/turns.with_requests)
    turns: list[TurnRow] | None = None  # a multi-turn point's requests by turn (load/turns.turn_rows)


def _p(dist: Any, attr: str) -> float | None:
    return getattr(dist, attr) if dist is not None else None


class PointFigures(TypedDict):
    """The PointRow fields a result gives (figures); the open-loop ones only for an open loop, the
    turns only for a multi-turn point."""

    requests: int
    completed: int
    failed: int
    failure_rate: float | None
    errors: dict[str, int]
    repeats: int
    warmup_excluded: int
    window_s: float | None
    output_tok_s: float | None
    qps: float | None
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    tpot_p50_s: float | None
    tpot_p99_s: float | None
    itl_p50_s: float | None
    itl_p99_s: float | None
    e2e_p50_s: float | None
    e2e_p99_s: float | None
    goodput_rps: float | None
    turns: NotRequired[list[TurnRow]]
    achieved_rate: NotRequired[float | None]
    in_flight_at_end: NotRequired[int | None]
    queued_at_end: NotRequired[int | None]
    drain_s: NotRequired[float | None]
    send_delay_p50_s: NotRequired[float | None]
    send_delay_p99_s: NotRequired[float | None]
    steady: NotRequired[bool | None]
    steady_reason: NotRequired[str | None]
    completion_rps: NotRequired[float | None]


def figures(res: PointResult, slo: SLO | None) -> PointFigures:
    """The PointRow fields of a result; an open loop's arrival figures stay empty for a closed
    loop, where they mean nothing."""
    m, open_loop, st = res.metrics, res.point.rate is not None, res.steady
    repeats = max(1, len({s.repeat for s in res.samples}))
    out = PointFigures(
        requests=res.sent // repeats, completed=res.completed, failed=res.failed, failure_rate=res.failure_rate,
        errors=res.errors, repeats=repeats, warmup_excluded=res.warmup_excluded, window_s=res.window_s,
        output_tok_s=res.output_tok_s, qps=res.qps,
        ttft_p50_s=_p(m and m.ttft_s, "p50"), ttft_p99_s=_p(m and m.ttft_s, "p99"),
        tpot_p50_s=_p(m and m.tpot_s, "p50"), tpot_p99_s=_p(m and m.tpot_s, "p99"),
        itl_p50_s=_p(m and m.itl_s, "p50"), itl_p99_s=_p(m and m.itl_s, "p99"),
        e2e_p50_s=_p(m and m.e2e_s, "p50"), e2e_p99_s=_p(m and m.e2e_s, "p99"),
        goodput_rps=goodput_rps(slo, res.samples) if slo else None)
    turns = turn_rows(res.samples)
    if turns is not None:  # a multi-turn point only: the other rows keep the keys they always had
        out["turns"] = turns
    if open_loop:
        out.update({"achieved_rate": res.achieved_rate, "in_flight_at_end": res.in_flight_at_end,
                    "queued_at_end": res.queued_at_end, "drain_s": res.drain_s, "send_delay_p50_s": _p(res.send_delay_s, "p50"),
                    "send_delay_p99_s": _p(res.send_delay_s, "p99"), "steady": st.ok if st else None,
                    "steady_reason": st.reason if st else None, "completion_rps": st.completion_rps if st else None})
    return out


def slo_verdict(slo: SLO, res: PointResult, max_failure_rate: float) -> Verdict:
    """The one verdict on a load point, llmopt's or vLLM's client's alike (scenarios/peer/judge.py):
    the SLO's (analysis/slo.judge, with its goodput); a point that is not in steady state misses
    whatever its latencies, the reason said first."""
    v = judge(slo, res.samples, max_failure_rate)
    st = res.steady
    if st is not None and st.ok is False:
        v = v.model_copy(update={"ok": False, "reason": "; ".join(r for r in (st.reason, v.reason) if r)})
    return v


def slo_point(res: PointResult, v: Verdict, hold: bool = False) -> SLOPoint:
    """An open-loop point's per-request figures, enough for analysis/recommend/choose.py to judge it
    under any SLO on TTFT, TPOT and E2E (and ITL at p50, p90, p99), its steady state with them."""
    ok = [s for s in res.samples if s.ok]
    itl = res.metrics.itl_s if res.metrics else None
    st = res.steady
    return SLOPoint(rate_rps=res.point.rate or 0.0, burstiness=res.point.burstiness, window_s=res.busy_s or res.window_s,
                    requests=res.sent, failed=res.failed, ttft_s=[M.ttft(s) for s in ok], tpot_s=[M.tpot(s) for s in ok],
                    e2e_s=[M.e2e(s) for s in ok],
                    itl_s={"p50": itl.p50, "p90": itl.p90, "p99": itl.p99} if itl else {},
                    output_tok_s=res.output_tok_s, slo_ok=v.ok, goodput_rps=v.goodput_rps, queued_at_end=res.queued_at_end,
                    steady=st.ok if st else None, steady_reason=st.reason if st else None, hold=hold)
