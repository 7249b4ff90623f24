"""The capacity search (load/capacity/find.py, load/capacity/search.py, load/capacity/budget.py) against an M/M/1 queue,
whose answer is known in closed form: a server that completes mu requests/s on average, fed
Poisson arrivals at lambda < mu, keeps each request for an exponential time of rate
mu - lambda, so the p99 time in system is ln(100) / (mu - lambda). With the SLO p99 <= L, the
capacity is mu - ln(100) / L; nothing above mu is ever sustained, so mu is the ceiling a
measured all-at-once point would give. Each trial costs TRIAL_S seconds of load."""

from __future__ import annotations

import math

import pytest

from llmopt_bench.core.errors import UsageError
from llmopt_bench.load.capacity.find import find_capacity
from llmopt_bench.load.capacity.search import Search, Trial, bisections, knee
from llmopt_bench.scenarios.serving.record import ServingExtra

TRIAL_S = 12.0  # a trial's warm-up, window and drain (the H200's 450/100 trials took ~12 s: issue 34)


def mm1(mu: float, limit_s: float, calls: list[float]):
    def measure(rate: float, hold_s: float | None = None) -> Trial:
        calls.append(rate)
        p99 = math.log(100) / (mu - rate) if rate < mu else math.inf
        return Trial(rate=rate, ok=p99 <= limit_s, latency_s=p99 if math.isfinite(p99) else 1e6, cost_s=TRIAL_S,
                     duration_s=TRIAL_S - 2)  # a 10-s window, 2 s of warm-up and drain
    return measure


def true_capacity(mu: float, limit_s: float) -> float:
    return mu - math.log(100) / limit_s


# --- from the ceiling down ---------------------------------------------------------------------

@pytest.mark.parametrize("mu,limit_s", [(45.0, 1000.0), (45.0, 2.0), (45.0, 0.25), (250.0, 0.5), (3.0, 10.0)])
def test_the_search_starts_under_the_ceiling_and_reaches_the_precision_within_its_budget(mu, limit_s):
    """Both regimes: an SLO that does not bind before saturation (limit 1000 s: the answer is
    the ceiling's), and ones that bind (2 s, 0.25 s: well under it)."""
    calls: list[float] = []
    cap = find_capacity(mm1(mu, limit_s, calls), ceiling=mu, budget_s=180.0, precision=0.05)
    want = true_capacity(mu, limit_s)
    assert calls[0] == pytest.approx(mu / 1.05) and max(calls) <= mu  # never a trial above what the server completes
    assert cap.converged and cap.known_within <= 0.05 + 1e-9
    assert cap.capacity_rps == cap.passing_rps <= want < cap.upper_rps <= 1.05 * cap.capacity_rps * (1 + 1e-9)
    assert cap.spent_s == len(calls) * TRIAL_S <= 180.0 and cap.budget_s == 180.0 and cap.more_s is None
    assert cap.ceiling_rps == mu and [t.rate for t in cap.trials] == calls
    if want >= mu / 1.05:  # the SLO does not bind before saturation: one trial, the ceiling the upper end
        assert len(calls) == 1 and cap.upper_rps == mu and cap.failing_rps is None
        assert cap.capacity_rps >= 0.95 * mu
    else:
        assert cap.upper_rps == cap.failing_rps < mu  # a trial that failed bounds it: the SLO's edge


def test_an_answer_near_the_ceiling_costs_few_trials_and_one_far_under_it_about_twice_the_log_steps():
    near, far = [], []
    find_capacity(mm1(45.0, 4.0, near), ceiling=45.0, budget_s=None)  # capacity 43.8: 2.7% under the ceiling
    cap = find_capacity(mm1(45.0, 0.11, far), ceiling=45.0, budget_s=None)  # capacity 3.1: a fourteenth of it
    assert len(near) == 1
    steps = math.ceil(math.log2(math.log(45.0 / cap.capacity_rps) / math.log(1.05)))
    assert len(far) <= 2 * steps + 1 and cap.converged
    # down from the ceiling by (1 + p), (1 + p)^2, (1 + p)^4 ... until one passes
    down = [45.0 / 1.05]
    while down[-1] > cap.capacity_rps * 1.05 and len(down) < len(far):
        down.append(down[-1] / 1.05 ** (2 ** (len(down) - 1)))
    assert far[:3] == pytest.approx(down[:3])


def test_a_finer_precision_narrows_the_interval_with_more_trials():
    coarse_calls, fine_calls = [], []
    coarse = find_capacity(mm1(10.0, 2.0, coarse_calls), 10.0, None, precision=0.2)
    fine = find_capacity(mm1(10.0, 2.0, fine_calls), 10.0, None, precision=0.01)
    assert fine.known_within <= 0.01 + 1e-9 < coarse.known_within <= 0.2 + 1e-9
    assert len(fine_calls) > len(coarse_calls)


# --- the budget ----------------------------------------------------------------------------------

def test_the_budget_never_stops_the_narrowing_while_its_time_allows_it():
    """Issue 34: a 4-trial cap stopped the H200's search with 770 of 1018 s left. An SLO that
    binds far under the ceiling needs more trials than that; the budget lets them run."""
    calls: list[float] = []
    cap = find_capacity(mm1(45.0, 0.2, calls), ceiling=45.0, budget_s=len_needed(45.0, 0.2) * TRIAL_S)
    assert len(calls) > 4 and cap.converged and cap.spent_s <= cap.budget_s
    assert not any("stopped" in n for n in cap.notes)


def len_needed(mu: float, limit_s: float) -> int:
    calls: list[float] = []
    find_capacity(mm1(mu, limit_s, calls), ceiling=mu, budget_s=None)
    return len(calls)


def test_when_the_budget_stops_it_the_precision_reached_and_the_cost_of_the_rest_are_said():
    need = len_needed(45.0, 0.2)
    calls: list[float] = []
    cap = find_capacity(mm1(45.0, 0.2, calls), ceiling=45.0, budget_s=(need - 2) * TRIAL_S + 1)
    assert len(calls) == need - 2 and not cap.converged and cap.spent_s == (need - 2) * TRIAL_S
    search = Search(45.0)  # the interval it stopped at, and the bisections left in it
    lo, hi = cap.capacity_rps, cap.upper_rps
    assert cap.known_within == pytest.approx(hi / lo - 1) and cap.known_within > 0.05
    left = bisections(lo, hi, 0.05)
    assert left == 2 and cap.more_s == left * TRIAL_S
    assert (f"stopped by its budget ({cap.spent_s:.0f} s of load spent of {cap.budget_s:g} s): the capacity is known within "
            f"{cap.known_within * 100:.1f}% ([{lo:.4g}, {hi:.4g}] req/s); reaching 5% needs about 2 more trials, ~24 s of load "
            f"(a budget of ~{cap.budget_s + 24:.0f} s)") in cap.notes
    assert search.precision == 0.05


def test_the_hold_s_time_is_kept_back_from_the_trials():
    calls: list[float] = []
    holds: list[float] = []

    def measure(rate: float, hold_s: float | None = None) -> Trial:
        if hold_s:
            holds.append(rate)
            return Trial(rate=rate, ok=True, kind="hold", cost_s=hold_s + 2, duration_s=hold_s)
        return mm1(45.0, 0.77, calls)(rate)  # capacity 39.0: the third trial passes, the fourth would narrow it
    cap = find_capacity(measure, ceiling=45.0, budget_s=102.0, hold_s=60.0)
    # 62 s kept for the hold (its 60 s and the 2 s of warm-up and drain a trial had): the trials
    # get 40 s, three of 12 s and not the fourth
    assert len(calls) == 3 and holds == [cap.capacity_rps] and cap.held is True
    assert cap.spent_s == 3 * TRIAL_S + 62 <= 102.0 and any(n.startswith("stopped by its budget") for n in cap.notes)


def test_a_trial_cap_still_stops_it_when_one_is_asked_for():
    calls: list[float] = []
    cap = find_capacity(mm1(45.0, 0.2, calls), ceiling=45.0, budget_s=None, max_trials=5)
    assert len(calls) == 5 and not cap.converged
    assert any(n.startswith("stopped by its trial cap (5 trials): the capacity is known within") for n in cap.notes)
    few = find_capacity(mm1(45.0, 0.2, []), ceiling=45.0, budget_s=None, max_trials=2)  # both failed
    assert few.capacity_rps is None and any(n.startswith("stopped by its trial cap (2 trials): no rate met the SLO yet; "
                                                         "reaching 5% needs at least") for n in few.notes)


def test_the_first_trial_runs_whatever_the_budget_and_the_overrun_is_said():
    calls: list[float] = []
    cap = find_capacity(mm1(45.0, 2.0, calls), ceiling=45.0, budget_s=5.0)
    assert len(calls) == 1 and any("the budget (5 s of load) was overrun: 12 s spent" in n for n in cap.notes)


# --- from a start rate (no ceiling), and the bounds -------------------------------------------

@pytest.mark.parametrize("mu,limit_s,start", [(10.0, 2.0, 1.0), (10.0, 2.0, 40.0), (250.0, 0.5, 3.0), (3.0, 10.0, 0.1)])
def test_from_a_start_rate_it_doubles_or_halves_then_bisects(mu, limit_s, start):
    calls: list[float] = []
    cap = find_capacity(mm1(mu, limit_s, calls), None, None, start_rate=start, precision=0.05)
    want = true_capacity(mu, limit_s)
    assert cap.converged and cap.passing_rps <= want < cap.failing_rps <= 1.05 * cap.passing_rps * (1 + 1e-9)
    bracket = math.ceil(abs(math.log2(want / start))) + 1
    assert len(calls) <= bracket + math.ceil(math.log2(math.log(2) / math.log(1.05))) + 1
    assert calls[:2] == [start, start * 2 if calls[0] <= want else start / 2]
    assert max(p.rate for p in cap.trials if p.ok) < min(p.rate for p in cap.trials if not p.ok)


def test_a_slo_held_up_to_max_rate_gives_a_lower_bound():
    calls: list[float] = []
    cap = find_capacity(mm1(1000.0, 2.0, calls), None, None, start_rate=1.0, max_rate=20.0)
    assert calls == [1.0, 2.0, 4.0, 8.0, 16.0, 20.0]
    assert cap.capacity_rps == 20.0 and cap.failing_rps is None and not cap.converged and cap.known_within is None
    assert "at least" in cap.notes[0]


def test_a_slo_that_fails_everywhere_has_no_capacity():
    calls: list[float] = []
    cap = find_capacity(mm1(1.0, 2.0, calls), ceiling=1.0, budget_s=None, min_rate=0.05)  # ln(100)/1 > 2 s even unloaded
    assert calls[0] == pytest.approx(1 / 1.05) and calls[-1] == 0.05 and calls == sorted(calls, reverse=True)
    assert cap.capacity_rps is None and cap.failing_rps == 0.05
    assert "every rate tried" in cap.notes[0]


@pytest.mark.parametrize("mu,start,kw", [(1000.0, 1.0, {"max_rate": 20.0}), (1.0, None, {"min_rate": 0.5})])
def test_a_one_sided_search_survives_the_stages_record(mu, start, kw):
    """vllm-serve and openai-endpoint keep their extra with exclude_none: a search that never
    failed (or never passed) has a None end, and the record must still read back."""
    cap = find_capacity(mm1(mu, 2.0, []), mu if start is None else None, None, start_rate=start, **kw)
    stored = ServingExtra(capacity=cap).model_dump(mode="json", exclude_none=True)
    assert ServingExtra.model_validate(stored).capacity == cap


# --- a client that falls behind ------------------------------------------------------------------

def late_client(measure, limit_rps: float):
    """The same server, driven by a client that cannot send faster than limit_rps: a pass above
    it is not judged (scenarios/serving/run.py), a miss stays a miss."""
    def probe(rate: float, hold_s: float | None = None) -> Trial:
        p = measure(rate)
        return p.model_copy(update={"invalid": "the client fell behind"}) if rate > limit_rps and p.ok else p
    return probe


def test_a_client_that_falls_behind_caps_the_search_below_it():
    calls: list[float] = []
    cap = find_capacity(late_client(mm1(100.0, 2.0, calls), 30.0), ceiling=100.0, budget_s=None, precision=0.05)
    # the server holds to ~97.7 req/s; the client can test up to 30: the answer is a lower bound
    assert cap.capacity_rps is not None and 30.0 / 1.05 <= cap.capacity_rps <= 30.0
    assert cap.failing_rps is None and not cap.converged and cap.known_within is None
    assert all(p.ok for p in cap.trials if not p.invalid)
    late = [p.rate for p in cap.trials if p.invalid]
    assert late and min(late) > cap.capacity_rps
    assert any("measure the client, not the server" in n for n in cap.notes)


def test_a_server_failure_below_the_clients_limit_still_converges():
    cap = find_capacity(late_client(mm1(10.0, 2.0, []), 50.0), ceiling=10.0, budget_s=None, precision=0.05)
    assert cap.converged and not any(p.invalid for p in cap.trials)
    assert cap.passing_rps <= true_capacity(10.0, 2.0) < cap.failing_rps


def test_a_client_late_from_the_first_trial_finds_no_capacity_above_it():
    cap = find_capacity(late_client(mm1(100.0, 2.0, []), 0.5), ceiling=4.0, budget_s=None, min_rate=0.25, precision=0.05)
    assert cap.capacity_rps is not None and cap.capacity_rps <= 0.5 and not cap.converged
    assert all(t.rate <= 4.0 for t in cap.trials)


@pytest.mark.parametrize("kwargs", [{"ceiling": None}, {"ceiling": 0.0}, {"ceiling": 1.0, "precision": 0},
                                    {"ceiling": 1.0, "precision": 1.5}, {"ceiling": 1.0, "min_rate": 5, "max_rate": 2},
                                    {"ceiling": 1.0, "max_trials": 0}, {"ceiling": 1.0, "budget_s": 0.0}])
def test_bad_search_settings_are_usage_errors(kwargs):
    with pytest.raises(UsageError):
        find_capacity(mm1(10.0, 2.0, []), **{"budget_s": None, **kwargs})


def test_knee_of_a_flat_then_steep_curve_is_where_it_turns():
    assert knee([(1, 1.0), (2, 1.0), (3, 1.1), (4, 1.2), (5, 10.0), (6, 20.0)]) == 4
    assert knee([(x, 1.0) for x in range(1, 6)]) is None  # flat: no knee
    assert knee([(1, 1.0), (2, 5.0)]) is None  # two points: no curve
    assert knee([(x, float(x)) for x in range(1, 6)]) is None  # straight: no bend


def test_knee_of_the_mm1_curve_lies_before_saturation():
    mu = 10.0
    pts = [(r, math.log(100) / (mu - r)) for r in (1, 2, 3, 4, 5, 6, 7, 8, 9, 9.5)]
    k = knee(pts)
    assert k is not None and 6 <= k <= 9  # where the queue starts to build, short of mu


def test_a_budget_spent_on_trials_the_client_could_not_time_says_so():
    def untimed(rate: float, hold_s: float | None = None) -> Trial:
        return Trial(rate=rate, ok=True, invalid="the client could not time this point", cost_s=TRIAL_S)
    cap = find_capacity(untimed, ceiling=45.0, budget_s=40.0)
    assert len(cap.trials) == 3 and cap.capacity_rps is None and cap.more_s is None
    assert [t.rate for t in cap.trials] == pytest.approx([45 / 1.05, 45 / 1.05 ** 2, 45 / 1.05 ** 4])  # stepping under each
    assert "stopped by its budget (36 s of load spent of 40 s): no trial measured the server, so what reaching 5% would cost " \
           "cannot be told" in cap.notes and "no trial measured the server: no capacity" in cap.notes
