"""One distribution summary type, reused for every latency (part of the result schema)."""

from __future__ import annotations

import math
from typing import Sequence

from llmopt_bench.core.records import StrictModel


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), q in [0, 100]."""
    if not values:
        raise ValueError("percentile of no values")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


class Distribution(StrictModel):
    n: int
    mean: float
    std: float
    min: float
    p50: float
    p90: float
    p99: float
    max: float

    @classmethod
    def of(cls, values: Sequence[float]) -> "Distribution | None":
        xs = [float(v) for v in values if v is not None and math.isfinite(v)]
        if not xs:
            return None
        mean = sum(xs) / len(xs)
        var = sum((x - mean) ** 2 for x in xs) / (len(xs) - 1) if len(xs) > 1 else 0.0
        return cls(n=len(xs), mean=mean, std=math.sqrt(var), min=min(xs), p50=percentile(xs, 50),
                   p90=percentile(xs, 90), p99=percentile(xs, 99), max=max(xs))
