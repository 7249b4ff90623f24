"""analysis/gate/changepoint.py: E-divisive means over nightly series built from the committed H200
run's real repeats (each night: three repeats drawn from the stage's own, tests/gatekit.py),
with a sustained whole-run shift from one night on, or one noisy night."""

from __future__ import annotations

import numpy as np
import pytest
from gatekit import H200, load, restage

from llmopt_bench.analysis.gate.changepoint import best_split, e_divisive, level_shifts


def nightly(stage: str, nights: int, factor_of, seed: int = 0) -> list[float]:
    """TPOT p50 of `nights` runs, each three repeats drawn from the H200 stage's own and slowed
    as a whole by factor_of(night)."""
    st = next(s for s in load(H200)["stages"] if s["name"] == stage)
    rng = np.random.default_rng(seed)
    return [restage(st, [int(k) for k in rng.integers(0, 3, size=3)], factor_of(i))["metrics"]["tpot_s"]["p50"]
            for i in range(nights)]


@pytest.mark.parametrize("stage", ["bnb-int8", "bnb-nf4", "vllm"])
def test_a_sustained_shift_is_found_at_its_first_night(stage):
    values = nightly(stage, 24, lambda i: 1.2 if i >= 14 else 1.0)
    shifts = level_shifts(values, higher_is_better=False, threshold=0.05)
    assert [s.index for s in shifts] == [14]
    s = shifts[0]
    assert s.direction == "regression" and s.in_effect and s.p_value <= 0.01
    assert s.change == pytest.approx(0.2, abs=0.06) and (s.runs_before, s.runs_after) == (14, 10)


@pytest.mark.parametrize("stage", ["bnb-int8", "bnb-nf4", "vllm"])
@pytest.mark.parametrize("night", [3, 12, 23])
def test_one_noisy_night_is_not_a_shift(stage, night):
    values = nightly(stage, 24, lambda i: 1.5 if i == night else 1.0)
    assert level_shifts(values, higher_is_better=False, threshold=0.05) == []


def test_a_shift_that_was_fixed_is_no_longer_in_effect_and_an_improvement_is_not_a_regression():
    values = nightly("bnb-nf4", 30, lambda i: 1.25 if 10 <= i < 20 else 1.0)
    shifts = level_shifts(values, higher_is_better=False, threshold=0.05)
    assert [(s.index, s.direction, s.in_effect) for s in shifts] == [(10, "regression", False), (20, "improvement", False)]
    faster = level_shifts(nightly("bnb-nf4", 20, lambda i: 0.8 if i >= 10 else 1.0), False, 0.05)
    assert [(s.index, s.direction) for s in faster] == [(10, "improvement")]
    # throughput: higher is better, so a drop is the regression
    drop = level_shifts([1 / v for v in nightly("bnb-nf4", 20, lambda i: 1.2 if i >= 10 else 1.0)], True, 0.05)
    assert [(s.index, s.direction, s.in_effect) for s in drop] == [(10, "regression", True)]


def test_a_significant_shift_below_the_threshold_is_not_a_regression():
    shifts = level_shifts(nightly("vllm", 20, lambda i: 1.03 if i >= 10 else 1.0), False, 0.05)
    assert [(s.index, s.direction, s.in_effect) for s in shifts] == [(10, "below threshold", False)]


def test_a_shift_needs_min_size_runs_on_each_side():
    values = nightly("vllm", 20, lambda i: 1.3 if i >= 18 else 1.0)
    assert e_divisive(np.log(values), min_size=3) == []  # two nights: not yet sustained
    assert [c.index for c in e_divisive(np.log(values), min_size=2)] == [18]
    with pytest.raises(ValueError):
        e_divisive(values, min_size=1)


def test_energy_statistic_matches_its_definition():
    """best_split's prefix-sum Q equals the formula of Matteson & James, computed directly."""
    x = np.log(nightly("bnb-int8", 12, lambda i: 1.2 if i >= 7 else 1.0))

    def q(tau, kappa):
        a, b = x[:tau], x[tau:kappa]
        n, m = len(a), len(b)
        between = np.abs(a[:, None] - b[None, :]).sum() * 2 / (n * m)
        wa = np.abs(a[:, None] - a[None, :]).sum() / 2 / (n * (n - 1) / 2)
        wb = np.abs(b[:, None] - b[None, :]).sum() / 2 / (m * (m - 1) / 2)
        return n * m / (n + m) * (between - wa - wb)

    direct = max((q(t, k), t) for t in range(3, 10) for k in range(t + 3, 13))
    tau, value = best_split(x, min_size=3)
    assert (tau, value) == (direct[1], pytest.approx(direct[0]))


def test_the_permutation_p_value_counts_the_observed_order_itself():
    """p = (1 + hits) / (1 + permutations): a clean shift that no shuffle matches is 1/100 at 99
    permutations, never 0 (issue 28: the +1 dropped survived every test)."""
    assert [(c.index, c.p_value) for c in e_divisive([1.0] * 8 + [2.0] * 8, min_size=3, significance=0.05,
                                                     permutations=99, seed=0)] == [(8, 0.01)]
