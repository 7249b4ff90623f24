"""Capacity under an SLO: the highest request rate whose load point still meets it.

The search brackets, then bisects (a fixed grid would spend most of its probes far from the
answer): from a start rate it doubles while the SLO holds (or halves while it fails) until one
rate passes and a higher one fails; then it probes the middle of [last passing, first failing]
until that interval is narrower than `precision` times its lower end (5% by default). The
answer is the last passing rate, with the interval it is known to within. A probe whose pass
cannot be trusted (`Probe.invalid`: the client fell behind its schedule, so the server saw less
load than asked) is neither a pass nor a fail: nothing above its rate can be told, so the search
bisects below it and the capacity is a lower bound (not converged).

Each probe is a whole load point (`measure(rate)`), so it costs its duration in machine time:
about log2(answer / start) + log2(1 / precision) + 1 probes, 9 or so for a start within 8x.

The knee of the latency curve is found on the probed points with Kneedle (Satopaa et al.,
"Finding a 'Kneedle' in a Haystack", 2011) for an increasing convex curve: both axes are scaled
to [0, 1] and the knee is the probed rate where the curve lies farthest below the straight line
from the lowest to the highest probed rate, i.e. the rate past which latency climbs faster
than the load. It needs three probed rates, and a curve that bends (else None)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pydantic import Field

from llmopt_bench.core.errors import UsageError
from llmopt_bench.core.records import StrictModel

KNEE_METHOD = ("Kneedle on the probed points: the rate farthest below the chord from the lowest to the highest "
               "probed rate, both axes scaled to [0, 1]")


class Probe(StrictModel):
    """One load point of the search: its rate, the SLO's verdict, and the latency the knee is
    found on (for example TTFT p99, seconds); detail holds whatever the caller wants kept."""

    rate: float
    ok: bool
    latency_s: float | None = None
    detail: dict[str, Any] = Field(default_factory=dict)
    # why this probe measured something other than the server (the client fell behind): neither a
    # pass nor a fail; the search treats its rate as a ceiling it cannot test above
    invalid: str | None = None


class Capacity(StrictModel):
    # None has a meaning here, and stages dump their extra with exclude_none: the defaults bring
    # a dropped None back when the record is read (a required None made it unreadable)
    capacity_rps: float | None = None  # the highest rate that met the SLO; None: not even the lowest
    passing_rps: float | None = None  # the interval the capacity is known within: [last passing,
    failing_rps: float | None = None  #   first failing]; failing None: it held at every rate tried
    precision: float
    converged: bool  # the interval is within `precision` of its lower end
    probes: list[Probe]  # in the order they ran
    knee_rps: float | None = None
    knee_method: str = KNEE_METHOD
    notes: list[str] = Field(default_factory=list)


def _check(start_rate: float, precision: float, min_rate: float | None, max_rate: float | None, max_probes: int) -> None:
    if start_rate <= 0:
        raise UsageError(f"the capacity search needs a start rate above zero (got {start_rate:g})", "pass a start rate in req/s, e.g. 1")
    if not 0 < precision < 1:
        raise UsageError(f"the capacity search precision must lie in (0, 1) (got {precision:g})", "use 0.05 for 5%")
    if min_rate is not None and max_rate is not None and min_rate >= max_rate:
        raise UsageError(f"min_rate {min_rate:g} must be below max_rate {max_rate:g}")
    if max_probes < 2:
        raise UsageError("the capacity search needs at least two probes to bracket the answer")


def find_capacity(measure: Callable[[float], Probe], start_rate: float, precision: float = 0.05,
                  min_rate: float | None = None, max_rate: float | None = None, max_probes: int = 20) -> Capacity:
    """Bracket, then bisect, the highest rate for which measure(rate).ok holds."""
    _check(start_rate, precision, min_rate, max_rate, max_probes)
    probes: list[Probe] = []
    lo: float | None = None  # highest rate that passed
    hi: float | None = None  # lowest rate that failed
    ceiling: float | None = None  # lowest rate whose probe was invalid: nothing above it can be told
    rate, notes = start_rate, []
    while len(probes) < max_probes:
        p = measure(rate)
        probes.append(p)
        if p.invalid:
            ceiling = rate if ceiling is None else min(ceiling, rate)
        elif p.ok:
            lo = rate if lo is None else max(lo, rate)
        else:
            hi = rate if hi is None else min(hi, rate)
        nxt = _next_rate(lo, _lowest(hi, ceiling), rate, precision, min_rate, max_rate)
        if nxt is None:
            break
        rate = nxt
    else:
        notes.append(f"stopped after {max_probes} probes before the interval narrowed to {precision:.0%}")
    # converged only on the server's own failure: below a ceiling the capacity may lie higher
    converged = lo is not None and hi is not None and _lowest(hi, ceiling) == hi and hi - lo <= precision * lo
    judged = [p for p in probes if not p.invalid]
    if ceiling is not None:
        why = next(p.invalid for p in probes if p.invalid and p.rate == ceiling)
        notes.append(f"at {ceiling:g} req/s {why}: rates from there up measure the client, not the server")
    if not judged:
        notes.append("no probe measured the server: no capacity")
    elif lo is None:
        notes.append(f"the SLO failed at every rate tried, down to {min(p.rate for p in judged):g} req/s")
    elif hi is None:
        notes.append(f"the SLO held at every rate tried, up to {lo:g} req/s: the capacity is at least that")
    return Capacity(capacity_rps=lo, passing_rps=lo, failing_rps=hi, precision=precision, converged=converged,
                    probes=probes, knee_rps=knee([(p.rate, p.latency_s) for p in judged if p.latency_s is not None]),
                    notes=notes)


def _lowest(*rates: float | None) -> float | None:
    known = [r for r in rates if r is not None]
    return min(known) if known else None


def _next_rate(lo: float | None, hi: float | None, rate: float, precision: float,
               min_rate: float | None, max_rate: float | None) -> float | None:
    """The next rate to probe, None when the search is done."""
    if hi is None:  # every rate so far passed: double
        if max_rate is not None and rate >= max_rate:
            return None
        return rate * 2 if max_rate is None else min(rate * 2, max_rate)
    if lo is None:  # every rate so far failed: halve
        if min_rate is not None and rate <= min_rate:
            return None
        return rate / 2 if min_rate is None else max(rate / 2, min_rate)
    if hi - lo <= precision * lo:
        return None
    return (lo + hi) / 2


def knee(points: Sequence[tuple[float, float]]) -> float | None:
    """The knee of an increasing latency-vs-rate curve (see the module doc), None when there is
    no bend to find."""
    by_rate: dict[float, float] = {}
    for x, y in points:
        by_rate[x] = y  # a rate probed twice keeps its last latency
    xs = sorted(by_rate)
    if len(xs) < 3:
        return None
    ys = [by_rate[x] for x in xs]
    x0, x1, y0, y1 = xs[0], xs[-1], min(ys), max(ys)
    if y1 <= y0:
        return None  # flat: no knee
    below = [((x - x0) / (x1 - x0)) - ((y - y0) / (y1 - y0)) for x, y in zip(xs, ys)]
    best = max(range(len(xs)), key=lambda i: below[i])
    return xs[best] if below[best] > 0 else None
