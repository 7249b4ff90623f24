"""Capacity under an SLO: the highest request rate whose load point still meets it, searched from
the server's ceiling down (the entry point that runs it, with its budget and its hold, is
load/capacity/find.find_capacity).

Where it starts. What the server can complete bounds the answer: an arrival rate above the
highest completion rate measured (the **ceiling**: the all-at-once point, the sweep's top,
every trial's answers a second) cannot be sustained, so the ceiling is the interval's upper end
before any trial fails. The first trial is just under it, at ceiling / (1 + precision): where
the SLO does not bind before saturation it passes, and the answer is known to the precision
after that one trial. No trial is spent at the ceiling itself: the server is critically loaded
there, and a short window cannot tell a queue that keeps up from one that slowly grows (on the
simulated server of tests/simserver.py 10-s trials passed at 100% and at 105% of what it
completes). An all-at-once point of fewer requests than the server batches can measure the
ceiling low; the answer then errs low, never high, and a trial whose completions exceed it
raises it (and the search goes up toward it).

How it moves. While every trial failed it steps down from the lowest (and, from a start rate
with nothing above it, up from the highest); the step is (1 + precision) at first and doubles
in log at each step (1.05, 1.1025, 1.2155, 1.477, 2.18, 4.75 at 5%), so an answer near the
ceiling costs one to three trials, and one far under it (an SLO that binds early) about 2
log2(log(ceiling / answer) / log(1 + precision)). Once a pass lies under a failure (or the
ceiling), it bisects the interval in log (its geometric middle: the criterion is a ratio) until
upper / lower <= 1 + precision. Without a ceiling it starts from a given rate and doubles or
halves (the search before issue 34).

The saturation check. A trial that met the SLO at a rate above every completion rate measured
is not counted as sustained (the steady-state judgement allows completions 5% short of arrivals
over a short window): such a pass bounds the interval from above like a failure, so the
capacity never exceeds the highest completion rate measured.

The answer is the highest passing rate below the interval's upper end (the lowest failure, or
the ceiling), with the precision reached (upper / lower - 1). A trial whose pass cannot be trusted
(`Trial.invalid`: the client fell behind its schedule, so the server saw less load than asked)
is neither a pass nor a fail: nothing above its rate can be told, so the search steps below it
and the capacity is a lower bound, never converged.

The search keeps its trials, and a trial added from outside counts like its own: load/capacity/hold.py
holds the answer for longer and adds each hold, so a failed hold is a failing bound and
`passing()` then answers below it.

The knee of the latency curve is found on the tried points with Kneedle (Satopaa et al.,
"Finding a 'Kneedle' in a Haystack", 2011) for an increasing convex curve: both axes are scaled
to [0, 1] and the knee is the rate where the curve lies farthest below the straight line from
the lowest to the highest rate tried, i.e. the rate past which latency climbs faster than the
load. It needs three rates, and a curve that bends (else None)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from pydantic import AliasChoices, Field

from llmopt_bench.core.errors import UsageError
from llmopt_bench.core.records import StrictModel

KNEE_METHOD = ("Kneedle on the tried points: the rate farthest below the chord from the lowest to the highest "
               "rate tried, both axes scaled to [0, 1]")
MAX_STEP = 16.0  # the step up or down never exceeds this factor (the doubling in log would overflow)

Saturation = Callable[[], tuple[float | None, str | None]]  # the highest completion rate measured so far, and where


class Trial(StrictModel):
    """One load point of the search (or a hold of its answer): its rate, the verdict, and the
    latency the knee is found on (for example TTFT p99, seconds); detail holds whatever the
    caller wants kept."""

    rate: float
    ok: bool
    latency_s: float | None = None
    # the caller's own record of the trial (the search here is generic; the serving scenario's is
    # load/capacity.TrialDetail), kept as it came: runs of every schema version keep what theirs wrote
    detail: Mapping[str, Any] = Field(default_factory=dict)
    # why this trial measured something other than the server (the client fell behind): neither a
    # pass nor a fail; the search treats its rate as a ceiling it cannot test above
    invalid: str | None = None
    kind: Literal["probe", "hold"] = "probe"
    duration_s: float | None = None  # its measured window
    cost_s: float | None = None  # seconds of load it took (warm-up, window, drain): what the budget counts


class Capacity(StrictModel):
    # None has a meaning here, and stages dump their extra with exclude_none: the defaults bring
    # a dropped None back when the record is read (a required None made it unreadable)
    capacity_rps: float | None = None  # the deployable answer (held, or said not to be); None: no rate met the SLO
    passing_rps: float | None = None  # the interval the search's answer is known within: [last passing,
    failing_rps: float | None = None  #   first failing (a miss, or a pass above every completion rate measured)];
    #                                   failing None: it held at every rate tried
    precision: float  # the precision asked: upper / lower - 1
    converged: bool  # the capacity is known within `precision` (upper / capacity - 1 <= precision)
    # every trial in the order it ran (runs before the hold kept them as "probes")
    trials: list[Trial] = Field(validation_alias=AliasChoices("trials", "probes"))
    knee_rps: float | None = None
    knee_method: str = KNEE_METHOD
    notes: list[str] = Field(default_factory=list)
    # the hold (load/capacity/hold.py): its length, and whether the answer held; None: not held (no hold
    # run, or a run from before holds existed)
    hold_s: float | None = None
    held: bool | None = None
    # the saturation check: the highest completion rate the stage measured, and where
    saturation_rps: float | None = None
    saturation_how: str | None = None
    # the search from the ceiling down (issue 34); None in runs from before it
    ceiling_rps: float | None = None  # the completion ceiling the first trial was placed under
    ceiling_how: str | None = None
    known_within: float | None = None  # the precision reached: upper / capacity - 1 (None: no upper bound)
    upper_rps: float | None = None  # that upper end: the lowest failing rate, or the ceiling where it is lower
    budget_s: float | None = None  # seconds of load the trials and holds were given (None: unbounded)
    spent_s: float | None = None  # seconds of load they took
    more_s: float | None = None  # stopped short of `precision`: about what reaching it would have cost more

    @property
    def holds(self) -> list[Trial]:
        return [t for t in self.trials if t.kind == "hold"]


def _lowest(*rates: float | None) -> float | None:
    known = [r for r in rates if r is not None]
    return min(known) if known else None


def step(j: int, precision: float, anchored: bool) -> float:
    """The j-th step (j >= 1) up or down: from a ceiling (1 + precision)^(2^(j-1)), doubling in
    log; from a start rate 2 (the search before issue 34)."""
    if not anchored:
        return 2.0
    return math.exp(min(2 ** min(j - 1, 60) * math.log1p(precision), math.log(MAX_STEP)))


def close_enough(lo: float, hi: float, precision: float) -> bool:
    """upper / lower <= 1 + precision (a rounding's worth of slack: a geometric middle lands on it)."""
    return hi <= (1 + precision) * lo * (1 + 1e-9)


def bisections(lo: float, hi: float, precision: float) -> int:
    """Geometric bisections that bring [lo, hi] within the precision."""
    n = 0
    while not close_enough(lo, hi, precision):
        hi, n = math.sqrt(lo * hi), n + 1
    return n


class Search:
    """From the ceiling down (or from a start rate), then bisect; resumable: the state is the
    trials so far."""

    def __init__(self, ceiling: float | None = None, precision: float = 0.05, *, start_rate: float | None = None,
                 min_rate: float | None = None, max_rate: float | None = None, ceiling_how: str | None = None,
                 saturation: Saturation | None = None):
        if ceiling is None and start_rate is None:
            raise UsageError("the capacity search needs a ceiling (the highest completion rate measured) or a start rate",
                             "measure an all-at-once point first, or pass a start rate in req/s, e.g. 1")
        for name, value in (("ceiling", ceiling), ("start rate", start_rate)):
            if value is not None and not value > 0:
                raise UsageError(f"the capacity search needs a {name} above zero (got {value:g})", "pass a rate in req/s, e.g. 1")
        if not 0 < precision < 1:
            raise UsageError(f"the capacity search precision must lie in (0, 1) (got {precision:g})", "use 0.05 for 5%")
        if min_rate is not None and max_rate is not None and min_rate >= max_rate:
            raise UsageError(f"min_rate {min_rate:g} must be below max_rate {max_rate:g}")
        self.ceiling, self.ceiling_how, self.precision = ceiling, ceiling_how, precision
        self.saturation: Saturation = saturation or (lambda: (ceiling, ceiling_how))
        self.anchored = start_rate is None  # steps of (1 + precision)^(2^k) from the ceiling, else doubling
        first = start_rate if start_rate is not None else (ceiling or 0) / (1 + precision)
        first = first if min_rate is None else max(first, min_rate)
        self.start = first if max_rate is None else min(first, max_rate)
        self.min_rate, self.max_rate = min_rate, max_rate
        self.trials: list[Trial] = []

    # --- the state ------------------------------------------------------------------------

    def unsustained(self) -> list[Trial]:
        """Passes at a rate above every completion rate measured (the saturation check)."""
        top, _ = self.saturation()
        return [t for t in self.trials if t.ok and not t.invalid and top is not None and t.rate > top * (1 + 1e-9)]

    def failing(self) -> float | None:
        """The lowest rate that failed (a hold included), or passed above every completion rate measured."""
        return _lowest(*(t.rate for t in self.trials if not t.invalid and not t.ok), *(t.rate for t in self.unsustained()))

    def untrusted(self) -> float | None:
        """The lowest rate whose trial was not judged: nothing above it can be told."""
        return _lowest(*(t.rate for t in self.trials if t.invalid))

    def passing(self) -> float | None:
        """The highest rate that passed, below every failure and every untrusted trial."""
        top = _lowest(self.failing(), self.untrusted())
        ok = [t.rate for t in self.trials if t.ok and not t.invalid and (top is None or t.rate < top)]
        return max(ok) if ok else None

    def upper(self) -> float | None:
        """The interval's upper end: the lowest failure, untrusted trial, or the highest completion
        rate measured (None: nothing above the answer bounds it)."""
        return _lowest(self.failing(), self.untrusted(), self.saturation()[0])

    def add(self, trial: Trial) -> None:
        self.trials.append(trial)

    def within(self, lower: float | None) -> float | None:
        """The precision reached over [lower, upper]: None without an upper end, or where an
        untrusted trial is the upper end (the answer is then a lower bound)."""
        hi = self.upper()
        if lower is None or hi is None or hi == self.untrusted():
            return None
        return max(0.0, hi / lower - 1)

    def bound(self, lower: float | None) -> float | None:
        """The upper end the precision is stated against (None where there is none to state)."""
        return None if self.within(lower) is None else self.upper()

    def converged(self, lower: float | None) -> bool:
        """Whether [lower, upper] is within the precision."""
        hi = self.bound(lower)
        return lower is not None and hi is not None and close_enough(lower, hi, self.precision)

    # --- the search -----------------------------------------------------------------------

    def next_rate(self) -> float | None:
        """The next rate to try, None when the search is done."""
        if not self.trials:
            return self.start
        lo, hi = self.passing(), self.upper()
        if lo is not None and self.max_rate is not None and lo >= self.max_rate:
            return None  # it held as high as it may go: a lower bound
        if lo is None and hi is not None and self.min_rate is not None and hi <= self.min_rate:
            return None  # it failed as low as it may go: no capacity
        if hi is None:  # every rate so far passed, nothing above bounds it: step up from the highest
            assert lo is not None
            rate = lo * step(len(self.trials), self.precision, self.anchored)
        elif lo is None:  # every rate so far failed (or was not judged): step down from the lowest
            rate = hi / step(len(self.trials), self.precision, self.anchored)
        elif close_enough(lo, hi, self.precision):
            return None
        else:
            rate = math.sqrt(lo * hi)
        if self.min_rate is not None:
            rate = max(rate, self.min_rate)
        return rate if self.max_rate is None else min(rate, self.max_rate)

    def trials_to_precision(self, lower: float | None) -> int | None:
        """About how many more trials would bring [lower, upper] within the precision: the
        bisections left, plus a step where one end is still open (at least that many)."""
        hi = self.upper()
        if lower is None or hi is None:
            return 1 + bisections(1.0, step(len(self.trials) + 1, self.precision, self.anchored), self.precision)
        return bisections(lower, hi, self.precision)

    def result(self) -> Capacity:
        lo, hi = self.passing(), self.failing()
        judged = [t for t in self.trials if not t.invalid]
        probes = [t for t in judged if t.kind == "probe"]
        return Capacity(capacity_rps=lo, passing_rps=lo, failing_rps=hi, precision=self.precision,
                        converged=self.converged(lo), known_within=self.within(lo), upper_rps=self.bound(lo),
                        trials=list(self.trials), notes=self._notes(lo, hi, judged), ceiling_rps=self.ceiling,
                        ceiling_how=self.ceiling_how,
                        knee_rps=knee([(t.rate, t.latency_s) for t in probes if t.latency_s is not None]))

    def _notes(self, lo: float | None, hi: float | None, judged: list[Trial]) -> list[str]:
        notes = []
        top, where = self.saturation()
        over = self.unsustained()
        if over:
            notes.append(f"{', '.join(f'{t.rate:g}' for t in over)} req/s met the SLO in a {over[0].kind} above the highest "
                         f"completion rate measured ({top:.4g} req/s, {where}): a rate the server was never seen to "
                         "complete is not counted as sustained")
        untrusted = self.untrusted()
        if untrusted is not None:
            why = next(t.invalid for t in self.trials if t.invalid and t.rate == untrusted)
            notes.append(f"at {untrusted:g} req/s {why}: rates from there up measure the client, not the server")
        if not judged:
            notes.append("no trial measured the server: no capacity")
        elif lo is None and not any(t.ok for t in judged):
            notes.append(f"the SLO failed at every rate tried, down to {min(t.rate for t in judged):g} req/s")
        elif lo is None:
            notes.append(f"no rate met the SLO below the lowest that failed, {hi:g} req/s")
        elif hi is None and top is None:
            notes.append(f"the SLO held at every rate tried, up to {lo:g} req/s: the capacity is at least that")
        return notes


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
