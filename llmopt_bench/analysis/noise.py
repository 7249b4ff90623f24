"""Run-to-run noise for the regression gate (docs/regression.md, "The method").

A run's statistic (the median TPOT of all its requests, say) varies from run to run by more than
its requests' scatter shows: a repeat runs under other clocks, host load or neighbours than the
next. So the unit of resampling is the repeat, not the request:

- **cluster bootstrap**: each side's repeats are drawn with replacement and the statistic is
  taken over the drawn repeats' requests, kept whole (drawing requests again inside a drawn
  repeat would count their scatter twice: Davison & Hinkley 1997, section 3.8). With one repeat
  there is no between-repeat information and the requests are drawn instead (the interval then
  misses run-level noise, and the method column says so);
- **small-sample correction**: with R repeats the bootstrap variance of a mean is (R-1)/R of the
  unbiased one, and a normal quantile is too narrow for R-1 degrees of freedom; the variance is
  scaled by R/(R-1) and the interval is log(ratio) +- t(df) x SE with Welch-Satterthwaite df;
- **history**: when earlier runs of the same fingerprint are known, the baseline's variance is
  the spread of their per-run statistic (it holds the run-level shifts that one run cannot
  show), and the new run's is at least that.

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


def statistic_of(values, statistic: str):
    """Median or mean along the last axis, NaN (padding of shorter repeats) ignored."""
    import numpy as np

    if not np.isnan(values).any():  # the nan-aware versions are several times slower
        return np.median(values, axis=-1) if statistic == "median" else values.mean(axis=-1)
    return np.nanmedian(values, axis=-1) if statistic == "median" else np.nanmean(values, axis=-1)


def log_draws(groups: list[list[float]], statistic: str, resamples: int, rng, within: bool):
    """log(statistic) over `resamples` draws: repeats drawn with replacement, each drawn repeat's
    values kept whole, or (within=True) drawn again with replacement inside it."""
    import numpy as np

    lens = np.array([len(g) for g in groups])
    width = int(lens.max())
    table = np.full((len(groups), width), np.nan)
    for i, g in enumerate(groups):
        table[i, :len(g)] = g
    reps = rng.integers(0, len(groups), size=(resamples, len(groups)))
    n = lens[reps][..., None]  # (resamples, R, 1): the drawn repeat's length
    pos = np.broadcast_to(np.arange(width), (resamples, len(groups), width))
    idx = np.floor(rng.random(pos.shape) * n).astype(int) if within else pos
    values = np.where(pos < n, table[reps[..., None], np.minimum(idx, width - 1)], np.nan)
    return np.log(statistic_of(values.reshape(resamples, -1), statistic))


def side_noise(groups: list[list[float]], statistic: str, resamples: int, rng, within: bool = False) -> SideNoise | None:
    """One side's variance of log(statistic) from its own repeats (or, with one repeat, requests)."""
    import numpy as np

    if len(groups) >= 2:
        draws = log_draws(groups, statistic, resamples, rng, within)
        units, label = len(groups), f"{len(groups)} repeats"
    elif groups and len(groups[0]) >= 2:
        draws = log_draws(groups, statistic, resamples, rng, within=True)
        units, label = len(groups[0]), f"{len(groups[0])} requests (1 repeat)"
    else:
        return None
    var = float(np.var(draws[np.isfinite(draws)])) * units / (units - 1)
    return SideNoise(var, units - 1, label, var * units if len(groups) >= 2 else None)


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
