"""Did the host move between two runs? Each figure the repeats record about the machine
(measure/conditions.py) against its range in the other run: the CPU share the stage's process
tree got, how often its main threads were preempted (a second), the CPU time a hypervisor gave
other guests (steal, a second), the host's load. The host-speed index is weighed apart, with its
own interval (analysis/host_verdict.py).

A signal has **moved** when one run's busiest repeat lies beyond the other run's typical repeat
(the median of its repeats: its quiet level) by more than the signal's tolerance, in the
direction of a busier host: the new run's host was *busier* (a repeat's CPU share below the
baseline's typical one less a quarter of it, say), or the baseline's was. The busiest repeat on
one side: on a shared host a neighbour comes and goes within a run, and two busy repeats of ten
move the run's value by a third (their TPOT 2-10x the others' on the 2-core CPU host,
scripts/gate-pairs.sh) while its median repeat stays quiet; the typical repeat on the other, so
that one busy repeat of its own does not widen its quiet level until nothing stands out.
The tolerances are wider than what a slower build itself does to
these figures: a build 20% slower per token, its extra work on one thread, moved the 2-core CPU
host's CPU share from 1.96 to 1.87 and its preemptions not at all (scripts/gate-pairs.sh);
two busy neighbours moved them from 1.99 to 1.00 and from ~100 to ~400 a second (issue 33).

What the gate does with a moved host is analysis/host_verdict.py's: a verdict in the direction
the host pushed it (worse on a busier host, better or unchanged on a quieter one) is
"inconclusive (host)", exit 8: never a regression of the build, never a pass."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

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
    Signal("preemptions", "preempted", "a second", busier_is_higher=True, rel=2.0, floor=50.0),
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

    def text(self) -> str:
        def span(r: tuple[float, float]) -> str:
            return f"{r[0]:.3g}" if r[0] == r[1] else f"{r[0]:.3g}-{r[1]:.3g}"

        unit = f" {self.unit}" if self.unit else ""
        where = "the new run's host busier" if self.busier == "new" else "the baseline's host busier"
        return f"{self.label} {span(self.baseline)} -> {span(self.new)}{unit} ({where})"


def values(rows: Sequence[RepeatConditions | dict], key: str, rates: bool) -> list[float]:
    """One signal over a run's repeats; preemptions and steal as rates a second where `rates`."""
    out = []
    for raw in rows:
        c = raw if isinstance(raw, RepeatConditions) else RepeatConditions.model_validate(raw)
        wall = c.wall_s if rates else None
        if key == "preemptions" and c.involuntary_switches is not None:
            out.append(c.involuntary_switches / wall if wall else float(c.involuntary_switches))
        elif key == "steal" and c.steal_s is not None and wall:
            out.append(c.steal_s / wall)
        elif key in ("cpu_share", "load1") and getattr(c, key) is not None:
            out.append(float(getattr(c, key)))
    return out


def _beyond(mine: list[float], other: list[float], sig: Signal) -> bool:
    """My busiest repeat lies past the other run's typical one by more than the tolerance, on the busier side."""
    quiet = statistics.median(other)
    margin = max(sig.rel * quiet, sig.floor)
    return max(mine) > quiet + margin if sig.busier_is_higher else min(mine) < quiet - margin


def moved(base_rows: Sequence | None, new_rows: Sequence | None) -> list[Moved]:
    """The signals that moved between the runs' repeats (none where either run lacks them)."""
    if not base_rows or not new_rows:
        return []
    # rates a second need every repeat's wall time (runs before it was recorded: counts a repeat)
    rates = all((r.wall_s if isinstance(r, RepeatConditions) else r.get("wall_s")) for r in [*base_rows, *new_rows])
    out = []
    for sig in SIGNALS:
        b, n = values(base_rows, sig.key, rates), values(new_rows, sig.key, rates)
        if not b or not n:
            continue
        busier = "new" if _beyond(n, b, sig) else "baseline" if _beyond(b, n, sig) else None
        if busier:
            unit = sig.unit if sig.key != "preemptions" or rates else "a repeat"
            out.append(Moved(sig.key, sig.label, (min(b), max(b)), (min(n), max(n)), busier, unit))
    return out
