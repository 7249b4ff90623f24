"""Run-to-run noise for the regression gate (docs/regression.md, "The method").

A run's figure varies from run to run by more than its requests' scatter shows: a repeat runs
under other clocks, host load or neighbours than the next, and every request in it moves
together. So the unit is the repeat, not the request:

- **the statistic**: each repeat's own figure (the median of its requests' TPOT, say, or its
  windowed tok/s), and the run's value is their geometric mean: the mean of the repeats' log
  values. Measured against the cluster bootstrap of the pooled requests' median that it
  replaced (docs/regression.md, "Which statistic"): where a host-bound stage's repeats fall in
  two groups (a fast and a slow host state), the pooled median jumps between them from one
  draw to the next and its interval came out about twice as wide, for the same repeats;
- **the interval**: log(ratio) +- t(df) x SE, each side's variance the sample variance of its
  repeats' log values over R, the degrees of freedom by Welch-Satterthwaite (R - 1 a side: with
  3 repeats a side t = 2.78, with 2 repeats 4.30). With one repeat there is no between-repeat
  information and the requests are drawn instead (the interval then misses run-level noise,
  and the method column says so);
- **history**: when earlier runs of the same fingerprint are known, the baseline's variance is
  the spread of their per-run value (it holds the run-level shifts that one run cannot show),
  and the new run's is at least that.

numpy is imported inside the functions (`llmopt --help` stays instant)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist

MIN_HISTORY_RUNS = 3  # two degrees of freedom: fewer runs say nothing about their spread
POWER = 0.8  # the minimum detectable effect is the change caught this often


@dataclass(frozen=True)
class SideNoise:
    """The variance of log(statistic) of one side, and what it was estimated from."""

    var: float
    df: float
    source: str  # "3 repeats" | "24 requests (1 repeat)" | "7 runs in the history"
    per_repeat: float | None = None  # the variance of one repeat's log statistic, when repeats gave it


@dataclass(frozen=True)
class Interval:
    ratio: float
    lo: float
    hi: float
    se: float  # standard error of log(ratio)
    df: float
    t: float  # the quantile the interval used


@lru_cache(maxsize=4096)
def t_quantile(p: float, df: float) -> float:
    """Student's t quantile, numpy only. With x = sqrt(df) tan(theta) the density becomes
    proportional to cos(theta)^(df-1) on [0, pi/2), smooth for df >= 1: integrate it on a grid."""
    import numpy as np

    if not 0 < p < 1:
        raise ValueError(f"quantile of p={p}")
    if p < 0.5:
        return -t_quantile(1 - p, df)
    if df > 1e6:
        return NormalDist().inv_cdf(p)
    df = max(float(df), 1.0)
    theta = np.linspace(0.0, math.pi / 2, 20_001)
    w = np.cos(theta) ** (df - 1)
    cdf = np.concatenate(([0.0], np.cumsum((w[1:] + w[:-1]) / 2)))
    angle = float(np.interp(2 * p - 1, cdf / cdf[-1], theta))
    return math.sqrt(df) * math.tan(angle)


def repeat_groups(values: Sequence[float | None], repeats: Sequence[int]) -> list[list[float]]:
    """Values grouped by repeat (in repeat order), non-finite ones dropped, empty groups dropped."""
    groups: dict[int, list[float]] = {}
    for v, r in zip(values, repeats):
        if v is not None and math.isfinite(v):
            groups.setdefault(int(r), []).append(float(v))
    return [groups[r] for r in sorted(groups)]


def request_draws(values: list[float], statistic: str, resamples: int, rng):
    """log(statistic) of one repeat's values drawn again with replacement, `resamples` times."""
    import numpy as np

    x = np.asarray(values, dtype=float)
    drawn = x[rng.integers(0, len(x), size=(resamples, len(x)))]
    return np.log(np.median(drawn, axis=1) if statistic == "median" else drawn.mean(axis=1))


def repeat_values(groups: list[list[float]], statistic: str) -> list[float]:
    """Each repeat's own figure: the median (or mean) of its values, the positive finite ones."""
    import numpy as np

    out = []
    for g in groups:
        v = float(np.median(g) if statistic == "median" else np.mean(g)) if g else math.nan
        if v > 0 and math.isfinite(v):
            out.append(v)
    return out


def centre(groups: list[list[float]], statistic: str) -> float | None:
    """The run's value: the geometric mean of its repeats' figures (one repeat: that repeat's)."""
    values = repeat_values(groups, statistic)
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def side_noise(groups: list[list[float]], statistic: str, resamples: int, rng) -> SideNoise | None:
    """One side's variance of log(its value): from its repeats' log figures (the variance of
    their mean), or, with one repeat, from its requests (a bootstrap of their statistic)."""
    import numpy as np

    values = repeat_values(groups, statistic)
    if len(values) >= 2:
        per_repeat = float(np.var(np.log(values), ddof=1))
        return SideNoise(per_repeat / len(values), len(values) - 1, f"{len(values)} repeats", per_repeat)
    if len(groups) == 1 and len(groups[0]) >= 2:
        draws = request_draws(groups[0], statistic, resamples, rng)
        units = len(groups[0])
        var = float(np.var(draws[np.isfinite(draws)])) * units / (units - 1)
        return SideNoise(var, units - 1, f"{units} requests (1 repeat)")
    return None


def fill_in(own: SideNoise | None, other: SideNoise | None, repeats: int) -> SideNoise | None:
    """A side with one repeat cannot show between-repeat noise: it gets the other run's
    per-repeat variance (the same measurement, so the same spread under no change) for its
    repeat, or its own request-level variance when that is larger."""
    if repeats >= 2 or other is None or other.per_repeat is None:
        return own
    borrowed = other.per_repeat / max(repeats, 1)
    if own is not None and own.var >= borrowed:
        return own
    return SideNoise(borrowed, other.df, f"1 repeat, with the spread of the other run's {other.df + 1:g} repeats")


def history_noise(values: Sequence[float]) -> SideNoise | None:
    """The spread of a per-run statistic across earlier runs of the same fingerprint."""
    logs = [math.log(v) for v in values if v is not None and v > 0 and math.isfinite(v)]
    if len(logs) < MIN_HISTORY_RUNS:
        return None
    mean = sum(logs) / len(logs)
    var = sum((x - mean) ** 2 for x in logs) / (len(logs) - 1)
    return SideNoise(var, len(logs) - 1, f"{len(logs)} runs in the history")


def combine(point: float, base: SideNoise, new: SideNoise, confidence: float) -> Interval:
    """log(point) +- t(df) x SE, SE from both sides, df by Welch-Satterthwaite (or the one
    estimate's own when both sides share it)."""
    var = base.var + new.var
    parts = [(s.var, s.df) for s in (base, new) if s.var > 0]
    df = var ** 2 / sum(v ** 2 / d for v, d in parts) if parts else math.inf
    if base is new:  # one estimate (the history's spread) for both sides: its own degrees of freedom
        df = base.df
    t = t_quantile(0.5 + confidence / 2, round(df, 2) if math.isfinite(df) else df)
    se = math.sqrt(var)
    return Interval(point, point * math.exp(-t * se), point * math.exp(t * se), se, df, t)


def with_history(own: SideNoise | None, history: SideNoise | None, new_side: bool) -> SideNoise | None:
    """The baseline's noise is the history's when there is one; the new run's is at least it
    (its own repeats cannot show a shift of the whole run, the history's spread does)."""
    if history is None:
        return own
    if not new_side or own is None or own.var <= history.var:
        return history
    return own


def min_detectable(interval: Interval, threshold: float, higher_is_better: bool) -> float:
    """The smallest change in the bad direction that this pair flags with probability POWER:
    the interval's near end must clear the threshold, so the true change must exceed
    (1 + threshold) x exp((t + z_power) x SE) (for throughput, a drop below (1 - threshold) x
    exp(-(t + z_power) x SE)). Returned as a fraction: 0.12 = a 12% change."""
    reach = math.exp((interval.t + NormalDist().inv_cdf(POWER)) * interval.se)
    return 1 - (1 - threshold) / reach if higher_is_better else (1 + threshold) * reach - 1


MAX_SETTLE = 1000  # repeats a side beyond which "more repeats" is no answer


def settling_repeats(ratio: float, base: SideNoise, new: SideNoise, threshold: float, confidence: float) -> int | None:
    """How many repeats a side would settle an inconclusive verdict, were the change what this
    pair measured and each repeat as noisy as these: the fewest R whose interval lies wholly
    within +-threshold (no change) or wholly beyond it. A side whose noise is the history's keeps
    it (more repeats of one run do not narrow the spread between runs). None: no number up to
    MAX_SETTLE does (a change right at the threshold, or a history wider than the margin)."""
    d, up, down = math.log(ratio), math.log(1 + threshold), math.log(1 - threshold) if threshold < 1 else -math.inf
    margin = min(up - d, d - down) if down < d < up else (d - up if d >= up else down - d)
    if margin <= 0:
        return None

    def at(side: SideNoise, r: int) -> tuple[float, float]:
        return (side.per_repeat / r, r - 1) if side.per_repeat is not None else (side.var, side.df)

    def settles(r: int) -> bool:
        (vb, db), (vn, dn) = at(base, r), at(new, r)
        var = vb + vn
        if var <= 0:
            return True
        df = var ** 2 / sum(v ** 2 / k for v, k in ((vb, db), (vn, dn)) if v > 0)
        return t_quantile(0.5 + confidence / 2, round(df, 2)) * math.sqrt(var) <= margin

    if not settles(MAX_SETTLE):
        return None
    lo, hi = 2, MAX_SETTLE  # the interval narrows with r: the first r that settles, by bisection
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if settles(mid) else (mid + 1, hi)
    return lo
