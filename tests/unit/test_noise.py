"""analysis/gate/noise.py: the t quantile against the published tables, the cluster bootstrap's
variance against its closed form, and where a side's noise comes from."""

from __future__ import annotations

import math

import numpy as np
import pytest

from llmopt_bench.analysis.gate import noise


@pytest.mark.parametrize("p, df, table", [
    (0.975, 1, 12.706), (0.975, 2, 4.303), (0.975, 4, 2.776), (0.975, 10, 2.228), (0.99, 30, 2.457),
    (0.9995, 2, 31.599), (0.6, 3, 0.277), (0.025, 4, -2.776), (0.975, 1e9, 1.960),
])
def test_t_quantile_matches_the_tables(p, df, table):
    assert noise.t_quantile(p, df) == pytest.approx(table, abs=2e-3)


def test_cluster_bootstrap_variance_is_the_unbiased_variance_of_the_mean_of_repeats():
    """Repeats whole, statistic the mean: the corrected bootstrap variance of log(mean) is, to
    first order, s^2 / R of the repeats' log values (the delta method), whatever the requests."""
    groups = [[1.0, 1.1, 0.9, 1.0], [1.3, 1.2, 1.4, 1.3], [0.8, 0.9, 0.7, 0.8], [1.1, 1.0, 1.2, 1.1]]
    side = noise.side_noise(groups, "mean", 20000, np.random.default_rng(0))
    means = np.array([np.mean(g) for g in groups])
    expected = np.var(means / means.mean(), ddof=1) / len(groups)
    assert side.var == pytest.approx(expected, rel=0.1) and side.df == 3 and side.source == "4 repeats"
    assert side.per_repeat == pytest.approx(side.var * 4)


def test_one_repeat_falls_back_to_requests_then_borrows_the_other_runs_spread():
    rng = np.random.default_rng(0)
    one = noise.side_noise([[1.0, 1.01, 0.99, 1.0, 1.02]], "median", 2000, rng)
    assert one.source == "5 requests (1 repeat)" and one.df == 4 and one.per_repeat is None
    three = noise.side_noise([[1.0] * 5, [1.3] * 5, [0.8] * 5], "median", 2000, rng)
    filled = noise.fill_in(one, three, repeats=1)
    assert filled.var == pytest.approx(three.per_repeat) and filled.var > one.var and "other run's 3 repeats" in filled.source
    assert noise.fill_in(three, one, repeats=3) is three  # a side with its own repeats keeps them
    assert noise.side_noise([[2.0]], "mean", 100, rng) is None  # one value: nothing to say


def test_history_spread_is_the_baselines_and_the_new_runs_floor():
    hist = noise.history_noise([10.0, 11.0, 9.5, 10.5])
    logs = [math.log(v) for v in (10.0, 11.0, 9.5, 10.5)]
    assert hist.var == pytest.approx(np.var(logs, ddof=1)) and hist.df == 3
    assert noise.history_noise([10.0, 11.0]) is None  # too few runs to know a spread
    tight = noise.SideNoise(hist.var / 10, 2, "3 repeats")
    wide = noise.SideNoise(hist.var * 10, 2, "3 repeats")
    assert noise.with_history(tight, hist, new_side=False) is hist
    assert noise.with_history(tight, hist, new_side=True) is hist  # a run cannot see its own whole-run shift
    assert noise.with_history(wide, hist, new_side=True) is wide  # a disturbed new run keeps its own
    assert noise.with_history(tight, None, new_side=True) is tight


def test_interval_and_minimum_detectable_effect():
    side, other = noise.SideNoise(0.01, 2, "3 repeats"), noise.SideNoise(0.01, 2, "3 repeats")
    iv = noise.combine(1.1, side, other, 0.95)
    assert iv.df == pytest.approx(4) and iv.t == pytest.approx(2.776, abs=1e-3)  # Welch: two estimates of 2 df
    hist = noise.SideNoise(0.01, 9, "10 runs in the history")
    assert noise.combine(1.1, hist, hist, 0.95).df == 9  # one estimate for both sides: its own 9 df, not 18
    assert iv.se == pytest.approx(math.sqrt(0.02))
    assert (iv.lo, iv.hi) == (pytest.approx(1.1 * math.exp(-iv.t * iv.se)), pytest.approx(1.1 * math.exp(iv.t * iv.se)))
    mde = noise.min_detectable(iv, 0.05, higher_is_better=False)
    # a change of exactly mde puts the interval's low end (1 + threshold) x exp(z_0.8 x SE) above 1 + threshold
    assert 1.05 < (1 + mde) * math.exp(-iv.t * iv.se) == pytest.approx(1.05 * math.exp(0.8416 * iv.se), rel=1e-3)
    drop = noise.min_detectable(iv, 0.05, higher_is_better=True)
    assert (1 - drop) * math.exp(iv.t * iv.se) == pytest.approx(0.95 * math.exp(-0.8416 * iv.se), rel=1e-3)
