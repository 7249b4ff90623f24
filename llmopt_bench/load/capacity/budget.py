"""What the capacity search may spend: seconds of load, not a number of trials (issue 34).

A trial's cost is the load it put on the server: its warm-up, its window and its drain
(`Trial.cost_s`, set by the caller; the wall time measure() took where it is not). The search
keeps narrowing while the next trial, and the hold it must still run, fit in what is left,
however many trials that is; a trial cap (`max_trials`) stops it only where one is asked for.
What a trial will cost is the caller's estimate where it gives one (serving: the point's planned
length plus a time in system of drain), else the dearest trial of its kind so far; a hold, its
length plus the largest warm-up and drain a trial has had."""

from __future__ import annotations

import time
from collections.abc import Callable

from llmopt_bench.core.errors import UsageError
from llmopt_bench.load.capacity.search import Trial

Measure = Callable[[float, float | None], Trial]
"""measure(rate, hold_s): one open-loop point at `rate` judged against the SLO in steady state; a
short trial (its length the caller's) when hold_s is None, else a hold whose window is hold_s."""

Estimate = Callable[[float, float | None], float]
"""estimate(rate, hold_s): the seconds of load measure(rate, hold_s) is expected to take."""


class LoadBudget:
    """Seconds of load spent by the search's trials and holds, against what it was given."""

    def __init__(self, seconds: float | None, estimate: Estimate | None = None, max_trials: int | None = None):
        if seconds is not None and not seconds > 0:
            raise UsageError(f"the capacity search's budget must be above zero seconds (got {seconds:g})",
                             "give it the seconds of load it may spend, e.g. 180")
        if max_trials is not None and max_trials < 1:
            raise UsageError(f"the capacity search's trial cap must be 1 or more (got {max_trials})", "drop it: the budget decides")
        self.seconds, self.max_trials, self._estimate = seconds, max_trials, estimate
        self.spent = 0.0
        self.done: list[Trial] = []
        self.stopped: str | None = None  # why it refused a step: "budget" or "trials"

    def run(self, measure: Measure, rate: float, hold_s: float | None) -> Trial:
        """measure(rate, hold_s), charged at its cost."""
        t0 = time.perf_counter()
        trial = measure(rate, hold_s)
        cost = trial.cost_s if trial.cost_s is not None else time.perf_counter() - t0
        trial = trial.model_copy(update={"cost_s": cost})
        self.spent += cost
        self.done.append(trial)
        return trial

    def estimate(self, rate: float, hold_s: float | None) -> float:
        if self._estimate is not None:
            return self._estimate(rate, hold_s)
        if hold_s is None:
            return max((t.cost_s or 0.0 for t in self.done if t.kind == "probe"), default=0.0)
        overhead = max(((t.cost_s or 0.0) - t.duration_s for t in self.done if t.duration_s is not None), default=0.0)
        return hold_s + max(0.0, overhead)

    def left(self) -> float | None:
        return None if self.seconds is None else self.seconds - self.spent

    def fits(self, seconds: float) -> bool:
        return self.seconds is None or self.spent + seconds <= self.seconds

    def allows_trial(self, rate: float, reserve_s: float) -> bool:
        """Whether a trial at `rate` may run, `reserve_s` (the hold still to come) kept back."""
        if self.max_trials is not None and sum(1 for t in self.done if t.kind == "probe") >= self.max_trials:
            self.stopped = "trials"
            return False
        if not self.fits(self.estimate(rate, None) + reserve_s):
            self.stopped = "budget"
            return False
        return True

    def allows_hold(self, rate: float, hold_s: float) -> bool:
        if not self.fits(self.estimate(rate, hold_s)):
            self.stopped = "budget"
            return False
        return True
