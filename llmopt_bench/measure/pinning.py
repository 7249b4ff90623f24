"""Less host noise in the measurement, as an option (`llmopt bench --pin-cpu`, which sets
LLMOPT_PIN_CPU=1 for the stage processes): during a fixed-workload stage's timed repeats the
stage's main thread, the one that runs the Python decode loop and launches the kernels, stays
on one core, and that core is kept busy for WARM_S before each repeat so that it starts the
repeat at its running clock with warm caches rather than waking from idle. Other threads (torch's
intra-op pool, an engine's own) keep their affinity: on a CPU device they still compute on
every core. The affinity is given back after the repeats.

Whether it helps is measured, not assumed (docs/regression.md, "Pinning"): it stays an option
until the between-repeat spread of a host-bound stage shows it does. The core chosen is the
last one this process may run on (the first cores take most interrupts on a typical Linux host)."""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from typing import Iterator

ENV = "LLMOPT_PIN_CPU"
WARM_S = 0.2  # the spin before each repeat: long enough for a core's clock to ramp up (tens of ms)


def requested() -> bool:
    return os.environ.get(ENV, "").strip().lower() in ("1", "true", "yes", "on")


def warm(seconds: float = WARM_S) -> None:
    """Keep this thread's core busy for `seconds` (a pure Python spin: no allocation, no sleep)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


@contextmanager
def pinned(enabled: bool) -> Iterator[int | None]:
    """with pinned(requested()) as core: the calling thread on one core (None: not pinned, or the
    platform cannot pin); its previous affinity is restored on exit."""
    getter, setter = getattr(os, "sched_getaffinity", None), getattr(os, "sched_setaffinity", None)
    if not enabled or getter is None or setter is None:
        yield None
        return
    before = getter(0)
    core = max(before)
    setter(0, {core})
    try:
        yield core
    finally:
        setter(0, before)
