"""Judge measured load points again under another SLO than the one a serving stage searched
with: its open-loop points (stage.SLOPoint) keep each request's TTFT, TPOT and E2E, so any
target on those at p50/p90/p95/p99 is judged exactly as the stage judged its own (analysis/slo.py:
the same percentile over the successful requests, the same failure-rate limit); ITL targets
are judged on the pooled gaps' p50, p90 and p99 kept per point (p95 is not kept: unjudgeable).

The capacity is then the highest measured rate whose point meets the SLO, known within
[that rate, the lowest measured rate above it that fails]: the precision is the spacing of the
rates the search happened to probe, not one the search aimed for. A point that meets the SLO
while its client fell behind (analysis/slo.client_late) is not judged: its server saw less load
than the point asked for. A point whose server did not keep up (steady false: load/steady.py)
misses any SLO. The capacity is held when the point it rests on is a hold (load/capacity/hold.py), or a
hold at the same rate met the SLO too; runs from before holds have none."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from llmopt_bench.analysis.slo import client_late, goodput, request_meets
from llmopt_bench.core.distribution import percentile
from llmopt_bench.core.records import SLOPoint
from llmopt_bench.core.slo import SLO, Target


@dataclass
class PointVerdict:
    rate_rps: float
    ok: bool | None  # None: a target this point cannot be judged on
    worst: float | None  # the largest value / limit over the targets (and failures / their limit): > 1 misses
    reason: str
    goodput_rps: float | None
    hold: bool = False


@dataclass
class Rejudged:
    capacity_rps: float | None
    interval: list[float | None]  # [last passing, first failing above it]
    goodput_rps: float | None
    points: list[PointVerdict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    held: bool | None = None  # the capacity rests on a hold that met the SLO; None: no hold at all

    def closest_miss(self) -> PointVerdict | None:
        """The point nearest to meeting the SLO: the smallest worst ratio."""
        judged = [p for p in self.points if p.worst is not None and p.ok is False]
        return min(judged, key=lambda p: p.worst or 0.0) if judged else None


def _values(point: SLOPoint, metric: str) -> list[float]:
    columns: dict[str, Sequence[float | None]] = {"ttft": point.ttft_s, "tpot": point.tpot_s, "e2e": point.e2e_s}
    return [v for v in columns[metric] if v is not None]


def _target_value(point: SLOPoint, t: Target) -> float | None:
    if t.metric == "itl":
        return point.itl_s.get(f"p{t.percentile}")
    values = _values(point, t.metric)
    return percentile(values, t.percentile) if values else None


def _good(point: SLOPoint, slo: SLO) -> int:
    """The successful requests that met the SLO's per-request targets, as the run counted them
    (analysis/slo.request_meets: the one goodput test)."""
    column = lambda xs, i: xs[i] if i < len(xs) else None  # noqa: E731
    return sum(request_meets(slo, {"ttft": point.ttft_s[i], "tpot": column(point.tpot_s, i), "e2e": column(point.e2e_s, i)})
               for i in range(len(point.ttft_s)))


def judge_point(point: SLOPoint, slo: SLO, max_failure_rate: float) -> PointVerdict:
    ratios, reasons, unknown = [], [], []
    for t in slo.targets:
        value = _target_value(point, t)
        if value is None:
            unknown.append(t.name)
            continue
        ratios.append(value / t.limit_s)
        if value > t.limit_s:
            reasons.append(f"{t.name} {value * 1e3:.1f} ms > {t.limit_s * 1e3:g} ms")
    rate = point.failed / point.requests if point.requests else 1.0
    if rate > max_failure_rate:
        reasons.append(f"{point.failed} of {point.requests} requests failed")
        ratios.append(rate / max_failure_rate if max_failure_rate else float("inf"))
    good = goodput(_good(point, slo), point.window_s)
    worst = max(ratios, default=None)
    if point.steady is False:  # the server fell behind: a miss whatever its latencies
        return PointVerdict(point.rate_rps, False, worst if reasons else None,
                            "; ".join([point.steady_reason or "not steady", *reasons]), good, point.hold)
    if unknown and not reasons:
        return PointVerdict(point.rate_rps, None, worst, f"cannot judge {', '.join(unknown)} here", good, point.hold)
    # a pass needs the load the point asked for; a miss under less load than asked is still a miss
    late = None if reasons else client_late(point.queued_at_end, point.requests)
    if late:
        return PointVerdict(point.rate_rps, None, worst, f"cannot judge: {late}", good, point.hold)
    return PointVerdict(point.rate_rps, not reasons, worst, "; ".join(reasons) or "met", good, point.hold)


def rejudge(points: Sequence[SLOPoint], slo: SLO, max_failure_rate: float = 0.01) -> Rejudged:
    verdicts = sorted((judge_point(p, slo, max_failure_rate) for p in points), key=lambda v: v.rate_rps)
    # a hold that failed outweighs the short trials at its rate and above it
    failed_hold = min((v.rate_rps for v in verdicts if v.hold and v.ok is False), default=None)
    passing = [v for v in verdicts if v.ok and (failed_hold is None or v.rate_rps < failed_hold)]
    notes = []
    if any(v.ok is None for v in verdicts):
        notes.append("some points could not be judged: " + "; ".join(sorted({v.reason for v in verdicts if v.ok is None})))
    if failed_hold is not None and any(v.ok and v.rate_rps >= failed_hold for v in verdicts):
        notes.append(f"the hold at {failed_hold:g} req/s missed: the short trials that met it at that rate or above do not count")
    if not passing:
        return Rejudged(None, [None, min((v.rate_rps for v in verdicts if v.ok is False), default=None)], None, verdicts, notes)
    best = max(passing, key=lambda v: v.rate_rps)
    above = [v.rate_rps for v in verdicts if v.ok is False and v.rate_rps > best.rate_rps]
    if any(v.ok is False and v.rate_rps < best.rate_rps for v in verdicts):
        notes.append("a lower rate missed the SLO where a higher one met it: the measurements are noisy near the limit")
    if not above:
        notes.append(f"every measured rate up to {best.rate_rps:g} req/s meets it: the capacity is at least that")
    holds = [v for v in verdicts if v.hold]
    held = any(v.ok and v.rate_rps == best.rate_rps for v in holds) if holds else None
    return Rejudged(best.rate_rps, [best.rate_rps, min(above) if above else None], best.goodput_rps, verdicts, notes, held)
