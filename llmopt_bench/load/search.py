"""Capacity under an SLO: the highest request rate whose load point still meets it.

The search brackets, then bisects (a fixed grid would spend most of its trials far from the
answer): from a start rate it doubles while the SLO holds (or halves while it fails) until one
rate passes and a higher one fails; then it tries the middle of [last passing, first failing]
until that interval is narrower than `precision` times its lower end (5% by default). The
answer is the highest passing rate below the lowest failing one, with the interval it is known
within. A trial whose pass cannot be trusted (`Trial.invalid`: the client fell behind its
schedule, so the server saw less load than asked) is neither a pass nor a fail: nothing above
its rate can be told, so the search bisects below it and the capacity is a lower bound.

The search keeps its trials, and a trial added from outside counts like its own: load/hold.py
holds the answer for longer and adds each hold, so a failed hold is a failing bound and
`passing()` then answers below it. Each trial is a whole load point, so it costs its duration
in machine time: about log2(answer / start) + log2(1 / precision) + 1 trials, 9 or so for a
start within 8x.

The knee of the latency curve is found on the tried points with Kneedle (Satopaa et al.,
"Finding a 'Kneedle' in a Haystack", 2011) for an increasing convex curve: both axes are scaled
to [0, 1] and the knee is the rate where the curve lies farthest below the straight line from
the lowest to the highest rate tried, i.e. the rate past which latency climbs faster than the
load. It needs three rates, and a curve that bends (else None)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

from pydantic import AliasChoices, Field

from llmopt_bench.core.errors import UsageError
from llmopt_bench.core.records import StrictModel

KNEE_METHOD = ("Kneedle on the tried points: the rate farthest below the chord from the lowest to the highest "
               "rate tried, both axes scaled to [0, 1]")


class Trial(StrictModel):
    """One load point of the search (or a hold of its answer): its rate, the verdict, and the
    latency the knee is found on (for example TTFT p99, seconds); detail holds whatever the
    caller wants kept."""

    rate: float
    ok: bool
    latency_s: float | None = None
    detail: dict[str, Any] = Field(default_factory=dict)
    # why this trial measured something other than the server (the client fell behind): neither a
    # pass nor a fail; the search treats its rate as a ceiling it cannot test above
    invalid: str | None = None
    kind: Literal["probe", "hold"] = "probe"
    duration_s: float | None = None


class Capacity(StrictModel):
    # None has a meaning here, and stages dump their extra with exclude_none: the defaults bring
    # a dropped None back when the record is read (a required None made it unreadable)
    capacity_rps: float | None = None  # the deployable answer (held, or said not to be); None: no rate met the SLO
    passing_rps: float | None = None  # the interval the search's answer is known within: [last passing,
    failing_rps: float | None = None  #   first failing]; failing None: it held at every rate tried
    precision: float
    converged: bool  # the interval is within `precision` of its lower end
    # every trial in the order it ran (runs before the hold kept them as "probes")
    trials: list[Trial] = Field(validation_alias=AliasChoices("trials", "probes"))
    knee_rps: float | None = None
    knee_method: str = KNEE_METHOD
    notes: list[str] = Field(default_factory=list)
    # the hold (load/hold.py): its length, and whether the answer held; None: not held (no hold
    # run, or a run from before holds existed)
    hold_s: float | None = None
    held: bool | None = None
    # the saturation check: the highest completion rate the stage measured, and where
    saturation_rps: float | None = None
    saturation_how: str | None = None

    @property
    def holds(self) -> list[Trial]:
        return [t for t in self.trials if t.kind == "hold"]


def _lowest(*rates: float | None) -> float | None:
    known = [r for r in rates if r is not None]
    return min(known) if known else None


class Search:
    """Bracket then bisect, resumable: the state is the trials so far."""

    def __init__(self, start_rate: float, precision: float = 0.05, min_rate: float | None = None,
                 max_rate: float | None = None, max_trials: int = 20):
        if start_rate <= 0:
            raise UsageError(f"the capacity search needs a start rate above zero (got {start_rate:g})", "pass a start rate in req/s, e.g. 1")
        if not 0 < precision < 1:
            raise UsageError(f"the capacity search precision must lie in (0, 1) (got {precision:g})", "use 0.05 for 5%")
        if min_rate is not None and max_rate is not None and min_rate >= max_rate:
            raise UsageError(f"min_rate {min_rate:g} must be below max_rate {max_rate:g}")
        if max_trials < 2:
            raise UsageError("the capacity search needs at least two trials to bracket the answer")
        self.start, self.precision, self.min_rate, self.max_rate = start_rate, precision, min_rate, max_rate
        self.budget = max_trials
        self.trials: list[Trial] = []
        self.out_of_budget = False

    # --- the state ------------------------------------------------------------------------

    def failing(self) -> float | None:
        """The lowest rate that failed, a hold included."""
        return _lowest(*(t.rate for t in self.trials if not t.invalid and not t.ok))

    def ceiling(self) -> float | None:
        """The lowest rate whose trial was not judged: nothing above it can be told."""
        return _lowest(*(t.rate for t in self.trials if t.invalid))

    def passing(self) -> float | None:
        """The highest rate that passed, below every failure and every untrusted trial."""
        top = _lowest(self.failing(), self.ceiling())
        ok = [t.rate for t in self.trials if t.ok and not t.invalid and (top is None or t.rate < top)]
        return max(ok) if ok else None

    def add(self, trial: Trial) -> None:
        self.trials.append(trial)

    # --- the search -----------------------------------------------------------------------

    def next_rate(self) -> float | None:
        """The next rate to try, None when the search is done."""
        if not self.trials:
            return self.start
        lo, hi, rate = self.passing(), _lowest(self.failing(), self.ceiling()), self.trials[-1].rate
        if hi is None:  # every rate so far passed: double
            if self.max_rate is not None and rate >= self.max_rate:
                return None
            return rate * 2 if self.max_rate is None else min(rate * 2, self.max_rate)
        if lo is None:  # every rate so far failed: halve
            if self.min_rate is not None and rate <= self.min_rate:
                return None
            return rate / 2 if self.min_rate is None else max(rate / 2, self.min_rate)
        if hi - lo <= self.precision * lo:
            return None
        return (lo + hi) / 2

    def run(self, measure: Callable[[float], Trial]) -> None:
        """Try rates until the answer is known to the precision, or the budget is spent."""
        while (rate := self.next_rate()) is not None:
            if sum(1 for t in self.trials if t.kind == "probe") >= self.budget:
                self.out_of_budget = True
                return
            self.trials.append(measure(rate))

    def result(self) -> Capacity:
        lo, hi, ceiling = self.passing(), self.failing(), self.ceiling()
        converged = lo is not None and hi is not None and _lowest(hi, ceiling) == hi and hi - lo <= self.precision * lo
        judged = [t for t in self.trials if not t.invalid]
        probes = [t for t in judged if t.kind == "probe"]
        return Capacity(capacity_rps=lo, passing_rps=lo, failing_rps=hi, precision=self.precision, converged=converged,
                        trials=list(self.trials), notes=self._notes(lo, hi, ceiling, judged),
                        knee_rps=knee([(t.rate, t.latency_s) for t in probes if t.latency_s is not None]))

    def _notes(self, lo: float | None, hi: float | None, ceiling: float | None, judged: list[Trial]) -> list[str]:
        notes = []
        if self.out_of_budget:
            notes.append(f"stopped after {self.budget} probes before the interval narrowed to {self.precision:.0%}")
        if ceiling is not None:
            why = next(t.invalid for t in self.trials if t.invalid and t.rate == ceiling)
            notes.append(f"at {ceiling:g} req/s {why}: rates from there up measure the client, not the server")
        if not judged:
            notes.append("no trial measured the server: no capacity")
        elif lo is None:
            notes.append(f"the SLO failed at every rate tried, down to {min(t.rate for t in judged):g} req/s")
        elif hi is None:
            notes.append(f"the SLO held at every rate tried, up to {lo:g} req/s: the capacity is at least that")
        return notes


def find_capacity(measure: Callable[[float], Trial], start_rate: float, precision: float = 0.05,
                  min_rate: float | None = None, max_rate: float | None = None, max_probes: int = 20) -> Capacity:
    """Bracket, then bisect, the highest rate for which measure(rate).ok holds (no hold)."""
    search = Search(start_rate, precision, min_rate, max_rate, max_probes)
    search.run(measure)
    return search.result()


def knee(points: Sequence[tuple[float, float]]) -> float | None:
    """The knee of an increasing latency-vs-rate curve (see the module doc), None when there is
    no bend to find."""
    by_rate: dict[float, float] = {}
    for x, y in points:
        by_rate[x] = y  # a rate tried twice keeps its last latency
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
