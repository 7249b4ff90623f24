"""distribution.py: percentile and Distribution.of against expectations computed here
independently (the `statistics` module and sorted-list arithmetic)."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from llmopt_bench.core.distribution import Distribution, percentile


def numpy_linear(values: list[float], q: float) -> float:
    """numpy.percentile(method='linear'), written from its definition: rank h = (n-1) q/100."""
    xs = sorted(values)
    h = (len(xs) - 1) * q / 100.0
    i = int(h)
    if i + 1 >= len(xs):
        return xs[-1]
    return xs[i] + (h - i) * (xs[i + 1] - xs[i])


def cut_points(values: list[float]) -> list[float]:
    """statistics.quantiles(method='inclusive') equals numpy's linear percentiles at 1..99."""
    return statistics.quantiles(values, n=100, method="inclusive")


@pytest.mark.parametrize("values", [
    [3.0, 1.0, 2.0],
    [10.0, 20.0],
    [5.0, 1.0, 4.0, 2.0, 3.0, 9.0, 7.0],
    [random.Random(7).expovariate(3.0) for _ in range(101)],
    [random.Random(11).gauss(0.05, 0.01) for _ in range(37)],
])
@pytest.mark.parametrize("q", [1, 10, 25, 50, 90, 99])
def test_percentile_matches_linear_interpolation(values, q):
    expected = cut_points(values)[q - 1]
    assert percentile(values, q) == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert percentile(values, q) == pytest.approx(numpy_linear(values, q), rel=1e-12, abs=1e-15)


def test_percentile_known_values():
    # numpy.percentile([1, 2, 3, 4], [0, 25, 50, 90, 100]) == [1, 1.75, 2.5, 3.7, 4]
    xs = [4.0, 1.0, 3.0, 2.0]
    assert percentile(xs, 0) == 1.0
    assert percentile(xs, 25) == pytest.approx(1.75)
    assert percentile(xs, 50) == pytest.approx(2.5)
    assert percentile(xs, 90) == pytest.approx(3.7)
    assert percentile(xs, 100) == 4.0


def test_percentile_does_not_reorder_its_input():
    xs = [3.0, 1.0, 2.0]
    percentile(xs, 50)
    assert xs == [3.0, 1.0, 2.0]


def test_percentile_of_nothing_raises():
    with pytest.raises(ValueError):
        percentile([], 50)


def test_distribution_matches_statistics_module():
    rng = random.Random(3)
    values = [rng.lognormvariate(-3, 0.5) for _ in range(257)]
    d = Distribution.of(values)
    cuts = cut_points(values)
    assert d.n == 257
    assert d.mean == pytest.approx(statistics.fmean(values), rel=1e-12)
    assert d.std == pytest.approx(statistics.stdev(values), rel=1e-9)  # sample std (n - 1)
    assert d.min == min(values) and d.max == max(values)
    assert d.p50 == pytest.approx(statistics.median(values), rel=1e-12)
    assert d.p90 == pytest.approx(cuts[89], rel=1e-12)
    assert d.p99 == pytest.approx(cuts[98], rel=1e-12)
    assert d.min <= d.p50 <= d.p90 <= d.p99 <= d.max


def test_distribution_even_count_median_is_the_midpoint():
    d = Distribution.of([1, 2, 3, 10])
    assert d.p50 == pytest.approx(2.5)
    assert d.mean == pytest.approx(4.0)
    assert d.std == pytest.approx(statistics.stdev([1, 2, 3, 10]))


def test_distribution_of_one_value():
    d = Distribution.of([0.125])
    assert d.n == 1
    assert d.std == 0.0
    assert d.mean == d.min == d.max == d.p50 == d.p90 == d.p99 == 0.125


def test_distribution_filters_nan_inf_and_none():
    d = Distribution.of([1.0, float("nan"), 3.0, None, float("inf"), -float("inf"), 2.0])
    assert d.n == 3
    assert d.mean == pytest.approx(2.0)
    assert d.min == 1.0 and d.max == 3.0
    assert d.std == pytest.approx(statistics.stdev([1.0, 2.0, 3.0]))
    assert all(math.isfinite(v) for v in d.model_dump().values())


@pytest.mark.parametrize("values", [[], [float("nan")], [None, float("nan"), float("inf")]])
def test_distribution_of_nothing_is_none(values):
    assert Distribution.of(values) is None


def test_distribution_accepts_ints_and_generators():
    d = Distribution.of(x for x in [1, 2, 3])
    # a generator is consumed once: every field must come from the same values
    assert d is not None and d.n == 3 and d.mean == pytest.approx(2.0) and d.p50 == 2.0


def test_distribution_round_trips_as_json():
    d = Distribution.of([0.1, 0.2, 0.4])
    assert Distribution.model_validate_json(d.model_dump_json()) == d
