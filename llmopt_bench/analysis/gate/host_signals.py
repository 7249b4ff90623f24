"""Did the host move between two runs? Each figure the repeats record about the machine
(measure/conditions.py) against its range in the other run: the CPU share the stage's process
tree got, how often its main threads were preempted (a second), the CPU time a hypervisor gave
other guests (steal, a second), the host's load. The host-speed index is weighed apart, with its
own interval (analysis/gate/host_verdict.py).

A signal has **moved** when one run's busiest repeat lies beyond the other run's typical repeat
(the median of its repeats: its quiet level) by more than the signal's tolerance, in the
direction of a busier host: the new run's host was *busier* (a repeat's CPU share below the
baseline's typical one less a quarter of it, say), or the baseline's was. The busiest repeat on
one side: on a shared host a neighbour comes and goes within a run, and two busy repeats of ten
move the run's value by a third (their TPOT 2-10x the others' on the 2-core CPU host,
scripts/gate/gate-pairs.sh) while its median repeat stays quiet; the typical repeat on the other, so
that one busy repeat of its own does not widen its quiet level until nothing stands out.
The tolerances are wider than what a slower build itself does to
these figures: a build 20% slower per token, its extra work on one thread, moved the 2-core CPU
host's CPU share from 1.96 to 1.87 and its preemptions not at all (scripts/gate/gate-pairs.sh);
two busy neighbours moved them from 1.99 to 1.00 and from ~100 to ~400 a second (issue 33).

What the gate does with a moved host is analysis/gate/host_verdict.py's: a verdict in the direction
the host pushed it (worse on a busier host, better or unchanged on a quieter one) is
"inconclusive (host)", exit 8: never a regression of the build, never a pass.

**Within a run** (`disturbed`): a repeat whose own CPU share, preemptions or steal lie beyond
its run's typical repeat by the same tolerances was disturbed by the host (a neighbour came and
went): compare sets it aside, on either side, and judges the repeats the host left alone
(`set_aside`), when at least two are left; the stopping rule does not count it toward settling
and measures another. A run disturbed throughout keeps its repeats, and the signals between the
runs say so."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from llmopt_bench.core.results import StageResult
from llmopt_bench.measure.conditions import RepeatConditions


@dataclass(frozen=True)
class Signal:
    key: str
    label: str
    unit: str
    busier_is_higher: bool
    rel: float  # the other run's typical repeat widened by this fraction of itself ...
    floor: float  # ... and by at least this much (absolute, in the signal's unit)


SIGNALS = (
    Signal("cpu_share", "CPU share", "", busier_is_higher=False, rel=0.25, floor=0.1),
    Signal("preemptions", "preempted", "a second", busier_is_higher=True, rel=2.0, floor=150.0),
    Signal("steal", "steal", "CPUs", busier_is_higher=True, rel=1.0, floor=0.1),
    Signal("load1", "host load", "", busier_is_higher=True, rel=0.5, floor=1.0),
)


@dataclass(frozen=True)
class Moved:
    signal: str
    label: str
    baseline: tuple[float, float]  # the range over each run's repeats
    new: tuple[float, float]
    busier: str  # "new" | "baseline": which run's host was the busier
    unit: str = ""
    # the host's load is said, not weighed: a minute's average of the whole machine, it rose from
    # 2.3 to 4.9 on the 2-core host while the stage kept its CPU share (1.8-1.94) and its TPOT
    weighs: bool = True

    def text(self) -> str:
        def span(r: tuple[float, float]) -> str:
            return f"{r[0]:.3g}" if r[0] == r[1] else f"{r[0]:.3g}-{r[1]:.3g}"

        unit = f" {self.unit}" if self.unit else ""
        where = "the new run's host busier" if self.busier == "new" else "the baseline's host busier"
        return f"{self.label} {span(self.baseline)} -> {span(self.new)}{unit} ({where})"


def per_repeat(rows: Sequence[RepeatConditions | dict], key: str, rates: bool) -> list[float | None]:
    """One signal of each repeat (None where not recorded); preemptions and steal as rates a second where `rates`."""
    out: list[float | None] = []
    for raw in rows:
        c = raw if isinstance(raw, RepeatConditions) else RepeatConditions.model_validate(raw)
        wall = c.wall_s if rates else None
        value: float | None = None
        if key == "preemptions" and c.involuntary_switches is not None:
            value = c.involuntary_switches / wall if wall else float(c.involuntary_switches)
        elif key == "steal" and c.steal_s is not None and wall:
            value = c.steal_s / wall
        elif key in ("cpu_share", "load1") and getattr(c, key) is not None:
            value = float(getattr(c, key))
        out.append(value)
    return out


def per_repeat_wall(rows: Sequence[RepeatConditions | dict]) -> list[float | None]:
    return [r.wall_s if isinstance(r, RepeatConditions) else r.get("wall_s") for r in rows]


def values(rows: Sequence[RepeatConditions | dict], key: str, rates: bool) -> list[float]:
    return [v for v in per_repeat(rows, key, rates) if v is not None]


def with_rates(rows: Sequence[RepeatConditions | dict]) -> bool:
    """Rates a second need every repeat's wall time (runs before it was recorded: counts a repeat)."""
    return all(per_repeat_wall(rows))


def _past(value: float, quiet: float, sig: Signal) -> bool:
    margin = max(sig.rel * quiet, sig.floor)
    return value > quiet + margin if sig.busier_is_higher else value < quiet - margin


def _beyond(mine: list[float], other: list[float], sig: Signal) -> bool:
    """My busiest repeat lies past the other run's typical one by more than the tolerance, on the busier side."""
    return _past(max(mine) if sig.busier_is_higher else min(mine), statistics.median(other), sig)


def moved(base_rows: Sequence | None, new_rows: Sequence | None) -> list[Moved]:
    """The signals that moved between the runs' repeats (none where either run lacks them)."""
    if not base_rows or not new_rows:
        return []
    rates = with_rates([*base_rows, *new_rows])
    out = []
    for sig in SIGNALS:
        b, n = values(base_rows, sig.key, rates), values(new_rows, sig.key, rates)
        if not b or not n:
            continue
        busier = "new" if _beyond(n, b, sig) else "baseline" if _beyond(b, n, sig) else None
        if busier:
            unit = sig.unit if sig.key != "preemptions" or rates else "a repeat"
            out.append(Moved(sig.key, sig.label, (min(b), max(b)), (min(n), max(n)), busier, unit, sig.key != "load1"))
    return out


# within one run: the repeat's own figures (the host's 1-minute load is the machine's, and lags a repeat)
WITHIN_RUN = ("cpu_share", "preemptions", "steal")
MIN_TYPICAL = 3  # a run's typical repeat needs a majority of quiet ones to be its quiet level
MIN_WALL_S = 0.25  # a shorter repeat's share and rates are a few scheduler ticks: not evidence either way


def disturbed(rows: Sequence[RepeatConditions | dict] | None) -> list[bool]:
    """Each repeat: did the host disturb it, against its own run's typical repeat? (Preemptions
    only as rates: a count grows with a repeat's length, which a slower repeat has.)"""
    rows = list(rows or [])
    flags = [False] * len(rows)
    if len(rows) < MIN_TYPICAL:
        return flags
    rates = with_rates(rows)
    short = [bool(w is not None and w < MIN_WALL_S) for w in per_repeat_wall(rows)]
    signals = {sig: [None if brief else x for x, brief in zip(per_repeat(rows, sig.key, rates), short)]
               for sig in SIGNALS if sig.key in WITHIN_RUN and (rates or sig.key == "cpu_share")}
    while True:  # the typical repeat of those not flagged yet, until no other stands out from it
        new = list(flags)
        for sig, xs in signals.items():
            known = [x for x, f in zip(xs, flags) if x is not None and not f]
            if len(known) >= MIN_TYPICAL:
                quiet = statistics.median(known)
                new = [f or (x is not None and _past(x, quiet, sig)) for f, x in zip(new, xs)]
        if new == flags:
            return flags
        flags = new


def kept_repeats(stage: StageResult) -> tuple[StageResult, list[int]]:
    """The stage with its disturbed repeats set aside, and their indices; as it was where none
    was, where fewer than two would be left, or where the conditions do not line up with them."""
    rows = (stage.extra or {}).get("conditions") or []
    flags, s, m = disturbed(rows), stage.samples, stage.metrics
    if s is None or not any(flags) or flags.count(False) < 2 or sorted(set(s.repeat)) != list(range(len(rows))):
        return stage, []
    keep = [i for i, f in enumerate(flags) if not f]
    rows_kept = [j for j, r in enumerate(s.repeat) if r in keep]
    samples = s.model_copy(update={c: [getattr(s, c)[j] for j in rows_kept] for c in type(s).model_fields})
    metrics = m.model_copy(update={k: [getattr(m, k)[i] for i in keep] for k in ("output_tok_s_repeats", "qps_repeats",
                                                                                 "tpot_p50_repeats_s")
                                   if len(getattr(m, k) or []) == len(rows)}) if m else m
    extra = {**stage.extra, "conditions": [rows[i] for i in keep]}
    return stage.model_copy(update={"samples": samples, "metrics": metrics, "extra": extra}), [i for i, f in enumerate(flags) if f]
