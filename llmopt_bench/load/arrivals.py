"""Arrival schedules: the one generator of open-loop arrival times in llmopt.

Gamma inter-arrival gaps have shape = burstiness and scale = 1 / (rate * burstiness), as
`vllm bench serve` draws them: the mean gap is 1/rate at every burstiness, burstiness 1 is
Poisson (exponential gaps), below 1 the arrivals come in bursts (coefficient of variation
1/sqrt(burstiness)), above 1 they are more even, infinite is evenly spaced. A seed gives the
same times every run (Python's own generator: `random.Random(seed)`)."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator

from llmopt_bench.core.errors import UsageError


def interarrival_gaps(rate: float, burstiness: float = 1.0, seed: int = 0) -> Iterator[float]:
    """Endless gaps in seconds between arrivals at `rate` requests/s (see the module doc)."""
    if rate <= 0 or burstiness <= 0:
        raise UsageError(f"arrivals need a positive rate and burstiness (got rate={rate}, burstiness={burstiness})",
                         "pass a request rate > 0 and a burstiness > 0 (1 = Poisson)")
    rng = random.Random(seed)
    while True:
        if burstiness == 1.0:
            yield rng.expovariate(rate)
        elif math.isinf(burstiness):
            yield 1.0 / rate  # evenly spaced: the limit of ever less bursty gamma gaps
        else:
            yield rng.gammavariate(burstiness, 1.0 / (rate * burstiness))


def arrival_offsets(rate: float, n: int | None = None, burstiness: float = 1.0, seed: int = 0,
                    until_s: float | None = None) -> list[float]:
    """Arrival offsets in seconds, the first at 0: n of them, or all before until_s (the first
    limit reached)."""
    if n is None and until_s is None:
        raise UsageError("an arrival schedule needs a number of requests or a duration")
    out: list[float] = []
    t = 0.0
    for gap in interarrival_gaps(rate, burstiness, seed):
        if (n is not None and len(out) >= n) or (until_s is not None and t >= until_s):
            return out
        out.append(t)
        t += gap
    return out  # unreachable: the gaps never end
