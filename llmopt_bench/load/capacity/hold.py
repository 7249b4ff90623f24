"""The hold: the search's answer run again for longer, and what to hold after a failed one
(load/capacity/find.find_capacity runs it).

The answer is held for hold_s (60 s by default; 600 for an MLPerf-like check) and judged by
the same rules. If it holds, that is the capacity, held. If not, short trials were too hopeful
there, and the holds go on below it, each (1 + precision) under the lowest that failed: the
first that holds is then within the precision of a failure, so every hold either pins the
answer or steps down by the precision (a wider step would need more holds to bisect back). The
capacity is the highest rate that held; when none did, the highest short trial that met the SLO
below every failed hold (a rate measured, never one only planned), not held. A capacity whose
hold did not pass, or that was never held (hold_s = 0: a journey that keeps its serving entry
short), is reported as "~N req/s, not held", never as the deployable figure.

No hold is above the highest completion rate measured: the search counts a pass above it as
not sustained (load/capacity/search.py), and the holds only go down from its answer."""

from __future__ import annotations

from llmopt_bench.load.capacity.search import Capacity, Search, Trial


def next_hold(holds: list[Trial], precision: float) -> tuple[float, bool]:
    """After a failed hold: the next rate to hold, and whether the holds already pin the answer
    to the precision (one held within it of the lowest failure)."""
    hi = min(h.rate for h in holds if not h.ok and not h.invalid)
    held = [h.rate for h in holds if h.ok and not h.invalid and h.rate < hi]
    if held:
        return max(held), True
    return hi / (1 + precision), False


def holds_to_precision(holds: list[Trial]) -> int:
    """How many more holds at least would pin the answer after a failed one: none once one held."""
    hi = min(h.rate for h in holds if not h.ok and not h.invalid)
    return 0 if any(h.ok and not h.invalid and h.rate < hi for h in holds) else 1


def capacity_after(search: Search, holds: list[Trial], rate: float | None, hold_s: float) -> Capacity:
    """The search's record with the holds' verdict: the capacity (the highest that held; else,
    after failed holds, the highest short trial below them, not held; else the answer, not
    held) and the precision it is known to."""
    cap = search.result()
    held = [h.rate for h in holds if h.ok and not h.invalid]
    below = search.passing()  # after failed holds: the highest short trial that met the SLO below them
    failed = any(not h.ok and not h.invalid for h in holds)
    cap.capacity_rps = max(held) if held else (below if failed else rate)
    c = cap.capacity_rps
    cap.known_within, cap.upper_rps, cap.converged = search.within(c), search.bound(c), search.converged(c)
    cap.hold_s = hold_s if hold_s > 0 else None
    cap.held = True if held else (None if not holds or holds[-1].invalid else False)
    cap.saturation_rps, cap.saturation_how = search.saturation()
    cap.notes += hold_notes(holds, hold_s, cap)
    return cap


def hold_notes(holds: list[Trial], hold_s: float, cap: Capacity) -> list[str]:
    if hold_s <= 0:
        return ["not held: hold_s = 0 (the answer of short trials only; hold it, e.g. --hold 60, to deploy on it)"]
    out = [f"the hold at {t.rate:g} req/s for {hold_s:g} s failed ({t.detail.get('reason') or 'missed'})"
           for t in holds if not t.ok and not t.invalid]
    out += [f"the hold at {t.rate:g} req/s could not be judged: {t.invalid}" for t in holds if t.invalid]
    failed = sum(1 for t in holds if not t.ok and not t.invalid)
    if cap.held and failed:
        out.append(f"the search went on below the failed hold(s): {cap.capacity_rps:g} req/s held")
    elif cap.held is False and cap.capacity_rps is not None:
        out.append(f"{failed} hold(s) failed: ~{cap.capacity_rps:g} req/s, the highest short trial that met the SLO below "
                   "them, is not held")
    return out
