"""Change points in a series of runs: E-divisive means (Matteson & James 2014, "A nonparametric
approach for multiple change point analysis of multivariate data", JASA 109:505), the method of
MongoDB's and DataStax's performance CI, with a permutation test for each change point.

For a split of a segment into X = x[s:tau] and Y = x[tau:kappa] the energy statistic is

    Q = n m / (n + m) * ( 2/(n m) sum|X_i - Y_j|^a - sum_{i<k}|X_i - X_k|^a / C(n,2)
                                                   - sum_{j<k}|Y_j - Y_k|^a / C(m,2) )

(a in (0, 2), here 1): large when X and Y come from different distributions. The best (tau,
kappa) of a segment is a candidate change point at tau; it is kept when a permutation test says
so: the segment's values shuffled `permutations` times, p = (1 + #{shuffled max Q >= observed}) /
(1 + permutations). Segments are split again until no candidate is significant. A shift must
last `min_size` runs on each side to be found, which is what keeps one noisy night (an
isolated outlier) from becoming a change point.

Pure numpy over a 1-D series; callers pass log values so that a shift is relative."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ChangePoint:
    index: int  # the first value of the new level
    p_value: float
    q: float


def _prefix(x, alpha: float):
    """S[i, j] = sum of |x_a - x_b|^alpha over a < i, b < j (a 2-D prefix sum of the distances)."""
    import numpy as np

    d = np.abs(x[:, None] - x[None, :]) ** alpha
    s = np.zeros((len(x) + 1, len(x) + 1))
    s[1:, 1:] = d.cumsum(0).cumsum(1)
    return s


def best_split(x, min_size: int, alpha: float = 1.0) -> tuple[int, float]:
    """The (tau, max Q) of one segment, tau relative to its start; (-1, -inf) when too short."""
    import numpy as np

    t = len(x)
    if t < 2 * min_size:
        return -1, -np.inf
    s = _prefix(np.asarray(x, dtype=float), alpha)
    tau = np.arange(min_size, t - min_size + 1)[:, None]
    kappa = np.arange(t + 1)[None, :]
    tau_b, kappa_b = np.broadcast_arrays(tau, kappa)
    valid = kappa_b >= tau_b + min_size
    kap = np.where(valid, kappa_b, t)  # any in-range index where invalid: masked below
    n, m = tau_b.astype(float), (kap - tau_b).astype(float)
    within_x = s[tau_b, tau_b] / 2  # each pair counted twice in the symmetric sum
    within_y = (s[kap, kap] - s[tau_b, kap] - s[kap, tau_b] + s[tau_b, tau_b]) / 2
    between = s[tau_b, kap] - s[tau_b, tau_b]
    with np.errstate(divide="ignore", invalid="ignore"):
        e = 2 * between / (n * m) - within_x / (n * (n - 1) / 2) - within_y / (m * (m - 1) / 2)
        q = np.where(valid, n * m / (n + m) * e, -np.inf)
    i, j = np.unravel_index(int(np.argmax(q)), q.shape)
    return int(tau[i, 0]), float(q[i, j])


def _significance(x, q: float, min_size: int, alpha: float, permutations: int, rng) -> float:
    hits = sum(best_split(rng.permutation(x), min_size, alpha)[1] >= q for _ in range(permutations))
    return (1 + hits) / (1 + permutations)


def e_divisive(values: Sequence[float], min_size: int = 3, significance: float = 0.01, permutations: int = 499,
               alpha: float = 1.0, seed: int = 0) -> list[ChangePoint]:
    """Every significant change point of the series, by position."""
    import numpy as np

    if min_size < 2:
        raise ValueError("min_size must be at least 2 (a segment's within-distance needs a pair)")
    x = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    bounds, found = [0, len(x)], []
    while True:
        candidates = []
        for start, end in itertools.pairwise(bounds):
            tau, q = best_split(x[start:end], min_size, alpha)
            if tau > 0:
                candidates.append((q, start, end, start + tau))
        if not candidates:
            break
        q, start, end, at = max(candidates)
        p = _significance(x[start:end], q, min_size, alpha, permutations, rng)
        if p > significance:
            break
        found.append(ChangePoint(at, p, q))
        bounds = sorted(bounds + [at])
    return sorted(found, key=lambda c: c.index)


@dataclass(frozen=True)
class LevelShift:
    index: int  # the first run of the new level
    p_value: float
    runs_before: int
    runs_after: int
    before: float  # median of the segment before
    after: float  # median of the segment after
    change: float  # after / before - 1
    direction: str  # regression | improvement | below threshold
    in_effect: bool  # the latest segment is still worse than `before` beyond the threshold


def level_shifts(values: Sequence[float], higher_is_better: bool, threshold: float, min_size: int = 3,
                 significance: float = 0.01, permutations: int = 499, seed: int = 0) -> list[LevelShift]:
    """The change points of a metric's series (E-divisive on log values, so a shift is
    relative), each with the medians of the segments around it; a shift counts as a regression
    only when it moves beyond `threshold` in the bad direction, as compare's verdict does."""
    import numpy as np

    x = np.asarray(values, dtype=float)
    if len(x) < 2 * min_size or not np.all(x > 0):
        return []
    points = e_divisive(np.log(x), min_size, significance, permutations, seed=seed)
    bounds = [0] + [c.index for c in points] + [len(x)]
    medians = [float(np.median(x[a:b])) for a, b in itertools.pairwise(bounds)]
    sign = -1 if higher_is_better else 1

    def worse(after: float, before: float) -> bool:
        return sign * (after / before - 1) > threshold

    out = []
    for k, c in enumerate(points):
        before, after = medians[k], medians[k + 1]
        change = after / before - 1
        direction = ("regression" if worse(after, before) else "improvement" if sign * change < -threshold
                     else "below threshold")
        out.append(LevelShift(c.index, c.p_value, bounds[k + 1] - bounds[k], bounds[k + 2] - bounds[k + 1], before,
                              after, change, direction, worse(medians[-1], before)))
    return out
