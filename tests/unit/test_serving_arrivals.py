"""Arrival schedules (load/arrivals.py): the same seed sends the same times, and the gaps have the rate and the
burstiness asked for. The statistical checks use 20,000 gaps per seed over several seeds; each
tolerance is at least five standard errors of the statistic it bounds, so a correct generator
passes with overwhelming probability whatever the seed, and a wrong rate or shape (a gap
scale off by the burstiness, the shape and scale swapped) misses by far more."""

from __future__ import annotations

import itertools
import math
import statistics

import pytest

from llmopt_bench.core.errors import UsageError
from llmopt_bench.load.arrivals import arrival_offsets as arrival_times
from llmopt_bench.load.arrivals import interarrival_gaps
from llmopt_bench.load.point import LoadPoint

N = 20_000


def gaps(rate: float, burstiness: float, seed: int) -> list[float]:
    times = arrival_times(rate, N + 1, burstiness, seed)
    return [b - a for a, b in itertools.pairwise(times)]


def test_same_seed_same_times_other_seed_other_times():
    for burstiness in (1.0, 0.5, 3.0):
        a = arrival_times(5.0, 200, burstiness, seed=7)
        assert a == arrival_times(5.0, 200, burstiness, seed=7)
        assert a != arrival_times(5.0, 200, burstiness, seed=8)
        assert a[0] == 0.0 and all(y > x for x, y in itertools.pairwise(a))


def test_duration_bound_schedule_is_the_prefix_of_the_count_bound_one():
    long = arrival_times(3.0, 500, 1.0, seed=2)
    within = arrival_times(3.0, None, 1.0, seed=2, until_s=20.0)
    assert within == [t for t in long if t < 20.0]


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_poisson_gaps_have_mean_one_over_rate_and_cv_one(seed):
    rate = 8.0
    g = gaps(rate, 1.0, seed)
    mean = statistics.fmean(g)
    cv = statistics.stdev(g) / mean
    # sd of the mean: 1/sqrt(N) = 0.7%; sd of the CV of exponential gaps: sqrt(2/N) ~ 1%
    assert abs(mean * rate - 1) < 0.04
    assert abs(cv - 1) < 0.06


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("burstiness", [0.25, 4.0])
def test_gamma_gaps_keep_the_rate_and_have_cv_one_over_sqrt_burstiness(seed, burstiness):
    rate = 8.0
    g = gaps(rate, burstiness, seed)
    mean = statistics.fmean(g)
    cv = statistics.stdev(g) / mean
    # mean: sd = CV/sqrt(N) <= 1.4%; CV at shape 0.25 (CV 2): sd ~ 1.8% of 2 (excess kurtosis 24)
    assert abs(mean * rate - 1) < 0.08
    assert abs(cv * math.sqrt(burstiness) - 1) < 0.1


def test_poisson_counts_in_a_window_match_the_rate():
    counts = [len(arrival_times(10.0, None, 1.0, seed=s, until_s=1000.0)) for s in range(3)]
    for c in counts:  # Poisson count: mean 10,000, sd 100
        assert abs(c - 10_000) < 600


def test_infinite_burstiness_is_evenly_spaced():
    t = arrival_times(4.0, 5, math.inf)
    assert t == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0])


@pytest.mark.parametrize("rate,burstiness", [(0, 1.0), (-1, 1.0), (1.0, 0), (1.0, -2)])
def test_bad_rate_or_burstiness_is_a_usage_error(rate, burstiness):
    with pytest.raises(UsageError) as e:
        next(interarrival_gaps(rate, burstiness))
    assert e.value.fix


@pytest.mark.parametrize("kwargs,words", [
    ({"num_requests": 4}, "either a concurrency"),
    ({"concurrency": 2, "rate": 1.0, "num_requests": 4}, "either a concurrency"),
    ({"concurrency": 2}, "duration or a number"),
    ({"rate": 1.0, "duration_s": 5, "warmup_s": 5}, "warm-up"),
    ({"concurrency": 1, "num_requests": 3, "warmup_requests": 3}, "warm-up"),
])
def test_a_load_point_that_cannot_run_says_why(kwargs, words):
    with pytest.raises(UsageError) as e:
        LoadPoint(**kwargs).check()
    assert words in e.value.message and e.value.fix
