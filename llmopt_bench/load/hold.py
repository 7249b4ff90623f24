"""The capacity a deployment can be sized by: the search's answer, held.

1. The search (load/search.py) finds the highest rate whose short trials meet the SLO in
   steady state.
2. The saturation check: the capacity never exceeds the highest completion rate the stage
   measured (its sweep's QPS, every trial's answers a second): a rate the server was never seen
   to complete cannot be sustained. Above it, the answer is brought down to it, and said.
3. The hold: the answer is run again for hold_s (60 s by default; 600 for an MLPerf-like
   check) and judged by the same rules. If it holds, that is the capacity, held. If not, short
   trials are too hopeful here, and the search goes on with holds, below the failed one: first
   backing off (by 2x the precision, doubling at each failure) until one holds, then bisecting
   between the highest that held and the lowest that failed, up to `attempts` holds. The
   capacity is the highest rate that held; when none did, the highest short trial that met the
   SLO below every failed hold (a rate measured, never one only planned), not held. A capacity
   whose hold did not pass, or that was never held (hold_s = 0: a journey that keeps its
   serving entry short), is reported as "~N req/s, not held", never as the deployable figure."""

from __future__ import annotations

from collections.abc import Callable

from llmopt_bench.load.search import Capacity, Search, Trial

Saturation = Callable[[], tuple[float | None, str | None]]  # the highest completion rate so far, and where


def _clip(rate: float, saturation: Saturation, notes: list[str]) -> float:
    ceiling, where = saturation()
    if ceiling is None or rate <= ceiling:
        return rate
    note = (f"the search's answer, {rate:g} req/s, is above the highest completion rate measured ({ceiling:.3g} req/s, "
            f"{where}): the capacity is brought down to it")
    if note not in notes:
        notes.append(note)
    return ceiling


def _next_hold(holds: list[Trial], precision: float) -> tuple[float, bool]:
    """After a failed hold: the next rate to hold, and whether the holds already pin the answer
    to the precision."""
    hi = min(h.rate for h in holds if not h.ok and not h.invalid)
    held = [h.rate for h in holds if h.ok and not h.invalid and h.rate < hi]
    if held:
        lo = max(held)
        return ((lo + hi) / 2, False) if hi - lo > precision * lo else (lo, True)
    failures = sum(1 for h in holds if not h.ok and not h.invalid)
    return hi * max(0.2, 1 - 2 * precision * 2 ** (failures - 1)), False  # 10%, 20%, 40%, 80% below the lowest failure


def search_and_hold(search: Search, probe: Callable[[float], Trial], hold: Callable[[float], Trial], *,
                    hold_s: float, attempts: int = 2, saturation: Saturation = lambda: (None, None)) -> Capacity:
    """Search, bring the answer under the saturation ceiling, hold it; on a failed hold, hold
    lower (see the module doc), at most `attempts` holds."""
    notes: list[str] = []
    search.run(probe)
    holds: list[Trial] = []
    rate = search.passing()
    while rate is not None:
        pinned = False
        if holds:
            rate, pinned = _next_hold(holds, search.precision)
        rate = _clip(rate, saturation, notes)
        if pinned or hold_s <= 0 or len(holds) >= attempts:
            break
        trial = hold(rate)
        holds.append(trial)
        search.add(trial)
        if trial.invalid or (trial.ok and all(h.ok for h in holds)):
            break  # the first hold held (the answer stands), or the client could not deliver it
    return _result(search, holds, rate, hold_s, saturation, notes)


def _result(search: Search, holds: list[Trial], rate: float | None, hold_s: float, saturation: Saturation,
            notes: list[str]) -> Capacity:
    cap = search.result()
    held = [h.rate for h in holds if h.ok and not h.invalid]
    below = search.passing()  # after failed holds: the highest short trial that met the SLO below them
    failed = any(not h.ok and not h.invalid for h in holds)
    cap.capacity_rps = max(held) if held else (_clip(below, saturation, notes) if failed and below is not None else
                                               None if failed else rate)
    cap.hold_s = hold_s if hold_s > 0 else None
    cap.held = True if held else (None if not holds or holds[-1].invalid else False)
    cap.saturation_rps, cap.saturation_how = saturation()
    cap.notes += notes + _hold_notes(holds, hold_s, cap)
    return cap


def _hold_notes(holds: list[Trial], hold_s: float, cap: Capacity) -> list[str]:
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
