"""find_capacity: the capacity a deployment can be sized by, in one call, for anything that can
measure one open-loop rate (the serving scenario, scenarios/serving/run.py; a tuner that sizes
each configuration it tries):

1. the search (load/capacity/search.py): its first trial just under the ceiling (the highest completion
   rate measured), then steps and bisection, each trial a short open-loop point judged against
   the SLO in steady state, for as long as the budget (load/capacity/budget.py, seconds of load) allows
   the next trial with the hold's time kept back;
2. the saturation check: a pass above the highest completion rate measured is not sustained;
3. the hold (load/capacity/hold.py), and holds below a failed one while the budget allows.

The first trial and the first hold run whatever the budget says (a search needs one trial, and
an answer that was never held is not one to deploy on); the notes say when they overran it.
What comes back is a Capacity: the capacity, held or not; the interval it is known within and
the precision reached (`known_within`); every trial and hold in order with its cost; the budget
and what was spent; and, where the budget (or a trial cap) stopped it short of the precision
asked, a note with the precision reached and about what reaching the asked one would cost
(`more_s`)."""

from __future__ import annotations

from llmopt_bench.core.fmt import pct
from llmopt_bench.load.capacity.budget import Estimate, LoadBudget, Measure
from llmopt_bench.load.capacity.hold import capacity_after, holds_to_precision, next_hold
from llmopt_bench.load.capacity.search import Capacity, Saturation, Search, Trial


def find_capacity(measure: Measure, ceiling: float | None, budget_s: float | None, *, precision: float = 0.05,
                  hold_s: float = 0.0, hold_attempts: int | None = None, ceiling_how: str | None = None,
                  saturation: Saturation | None = None, estimate: Estimate | None = None, start_rate: float | None = None,
                  min_rate: float | None = None, max_rate: float | None = None, max_trials: int | None = None) -> Capacity:
    """The highest rate at which measure(rate, None) meets the SLO, searched from `ceiling` (req/s:
    the highest completion rate measured, and `ceiling_how`, where) down to `precision` (upper /
    lower - 1) within `budget_s` seconds of load (None: unbounded), then held for `hold_s` (0: not
    held) by measure(rate, hold_s).

    saturation: the highest completion rate measured so far and where, asked again after every
    trial (default: the ceiling given); estimate(rate, hold_s): the seconds of load a call of
    measure will take (default: from the trials so far); start_rate: start there and double or
    halve instead (no ceiling needed); min_rate, max_rate: the rates the search keeps within;
    hold_attempts, max_trials: caps on holds and trials besides the budget (default: none)."""
    search = Search(ceiling, precision, start_rate=start_rate, min_rate=min_rate, max_rate=max_rate, ceiling_how=ceiling_how,
                    saturation=saturation)
    budget = LoadBudget(budget_s, estimate, max_trials)
    narrow(search, measure, budget, hold_s)
    return hold(search, measure, budget, hold_s, hold_attempts)


def narrow(search: Search, measure: Measure, budget: LoadBudget, hold_s: float = 0.0) -> None:
    """Trials until the search is done or the budget refuses the next one (the time of a hold of
    hold_s kept back). A search with trials already (an earlier, coarser call's: tune's rungs)
    goes on from them."""
    while (rate := search.next_rate()) is not None:
        reserve = budget.estimate(rate, hold_s) if hold_s > 0 else 0.0
        if search.trials and not budget.allows_trial(rate, reserve):  # a search's first trial runs whatever the budget says
            break
        search.add(budget.run(measure, rate, None).model_copy(update={"kind": "probe"}))


def hold(search: Search, measure: Measure, budget: LoadBudget, hold_s: float, hold_attempts: int | None = None) -> Capacity:
    """The search's answer held for hold_s (0: not held), and held lower after a failed hold while
    the budget allows; the Capacity with the budget's account and notes."""
    holds: list[Trial] = []
    rate = search.passing()
    hold_stopped = False
    while rate is not None and hold_s > 0:
        if holds:
            rate, pinned = next_hold(holds, search.precision)
            if pinned or (hold_attempts is not None and len(holds) >= hold_attempts):
                break
            if not budget.allows_hold(rate, hold_s):
                hold_stopped = True
                break
        trial = budget.run(measure, rate, hold_s).model_copy(update={"kind": "hold"})
        holds.append(trial)
        search.add(trial)
        if trial.invalid or (trial.ok and all(h.ok for h in holds)):
            break  # the first hold held (the answer stands), or the client could not deliver it
    cap = capacity_after(search, holds, rate, hold_s)
    cap.budget_s, cap.spent_s = budget.seconds, round(budget.spent, 3)
    cap.notes += _budget_notes(cap, search, budget, holds if hold_stopped else [], hold_s)
    return cap


def _budget_notes(cap: Capacity, search: Search, budget: LoadBudget, failed_holds: list[Trial], hold_s: float) -> list[str]:
    """The overrun, if any; and where the budget (or the trial cap) stopped the narrowing short
    of the precision: the precision reached and about what reaching the asked one would cost."""
    out = []
    if budget.seconds is not None and budget.spent > budget.seconds:
        out.append(f"the budget ({budget.seconds:g} s of load) was overrun: {budget.spent:.0f} s spent (the first trial and "
                   "the first hold run whatever it leaves)")
    if cap.converged or budget.stopped is None:
        return out
    what = (f"its trial cap ({budget.max_trials} trials)" if budget.stopped == "trials" else
            f"its budget ({budget.spent:.0f} s of load spent of {budget.seconds:g} s)")
    c, hi = cap.capacity_rps, cap.upper_rps
    if all(t.invalid for t in search.trials):
        out.append(f"stopped by {what}: no trial measured the server, so what reaching {search.precision * 100:g}% would "
                   "cost cannot be told")
        return out
    if c is None:
        known = "no rate held" if failed_holds else "no rate met the SLO yet"
    elif cap.known_within is not None and hi is not None:
        known = f"the capacity is known within {pct(cap.known_within)} ([{c:.4g}, {hi:.4g}] req/s)"
    else:
        known = f"the capacity is known only as a lower bound ({c:.4g} req/s)"
    if failed_holds:  # the holds were narrowing
        n, each, kind = holds_to_precision(failed_holds), budget.estimate(next_hold(failed_holds, search.precision)[0], hold_s), "hold"
        at_least = "at least "
    else:
        n, each, kind = search.trials_to_precision(c) or 1, budget.estimate(c or search.start, None), "trial"
        at_least = "at least " if c is None or hi is None else ""
    cap.more_s = round(n * each, 1)
    more = f"{at_least or 'about '}{n} more {kind}{'s' if n > 1 else ''}, ~{cap.more_s:.0f} s of load"
    if budget.stopped == "budget" and budget.seconds is not None:
        more += f" (a budget of ~{budget.seconds + cap.more_s:.0f} s)"
    out.append(f"stopped by {what}: {known}; reaching {search.precision * 100:g}% needs {more}")
    return out
