"""The capacity search (load/search.py) against an M/M/1 queue, whose answer is known
in closed form: a server that completes mu requests/s on average, fed Poisson arrivals at
lambda < mu, keeps each request for an exponential time of rate mu - lambda, so the p99 time in
system is ln(100) / (mu - lambda). With the SLO p99 <= L, the capacity is mu - ln(100) / L."""

from __future__ import annotations

import math

import pytest

from llmopt_bench.core.errors import UsageError
from llmopt_bench.load.search import Trial, find_capacity, knee
from llmopt_bench.scenarios.serving_record import ServingExtra


def mm1(mu: float, limit_s: float, calls: list[float]):
    def measure(rate: float) -> Trial:
        calls.append(rate)
        p99 = math.log(100) / (mu - rate) if rate < mu else math.inf
        return Trial(rate=rate, ok=p99 <= limit_s, latency_s=p99 if math.isfinite(p99) else 1e6)
    return measure


def true_capacity(mu: float, limit_s: float) -> float:
    return mu - math.log(100) / limit_s


@pytest.mark.parametrize("mu,limit_s,start", [(10.0, 2.0, 1.0), (10.0, 2.0, 40.0), (250.0, 0.5, 3.0), (3.0, 10.0, 0.1)])
def test_the_search_brackets_the_known_capacity_to_the_precision_asked(mu, limit_s, start):
    calls: list[float] = []
    cap = find_capacity(mm1(mu, limit_s, calls), start_rate=start, precision=0.05)
    want = true_capacity(mu, limit_s)
    assert cap.converged
    assert cap.passing_rps <= want < cap.failing_rps
    assert cap.failing_rps - cap.passing_rps <= 0.05 * cap.passing_rps
    assert cap.capacity_rps == cap.passing_rps
    # bracketing doubles (or halves) from the start, then bisection halves the interval
    bracket = math.ceil(abs(math.log2(want / start))) + 1
    assert len(calls) <= bracket + math.ceil(math.log2(1 / 0.05)) + 1
    # every passing probe lies below every failing one, and each answer is the model's own
    assert max(p.rate for p in cap.trials if p.ok) < min(p.rate for p in cap.trials if not p.ok)
    assert [p.rate for p in cap.trials] == calls


def test_a_finer_precision_narrows_the_interval_with_more_probes():
    coarse_calls, fine_calls = [], []
    coarse = find_capacity(mm1(10.0, 2.0, coarse_calls), 1.0, precision=0.2)
    fine = find_capacity(mm1(10.0, 2.0, fine_calls), 1.0, precision=0.01)
    assert fine.failing_rps - fine.passing_rps <= 0.01 * fine.passing_rps
    assert fine.failing_rps - fine.passing_rps < coarse.failing_rps - coarse.passing_rps
    assert len(fine_calls) > len(coarse_calls)


def test_a_slo_held_up_to_max_rate_gives_a_lower_bound():
    calls: list[float] = []
    cap = find_capacity(mm1(1000.0, 2.0, calls), 1.0, max_rate=20.0)
    assert calls == [1.0, 2.0, 4.0, 8.0, 16.0, 20.0]
    assert cap.capacity_rps == 20.0 and cap.failing_rps is None and not cap.converged
    assert "at least" in cap.notes[0]


def test_a_slo_that_fails_everywhere_has_no_capacity():
    calls: list[float] = []
    cap = find_capacity(mm1(1.0, 2.0, calls), 4.0, min_rate=0.5)  # ln(100)/1 > 2 s even unloaded
    assert calls == [4.0, 2.0, 1.0, 0.5]
    assert cap.capacity_rps is None and cap.failing_rps == 0.5
    assert "every rate tried" in cap.notes[0]


@pytest.mark.parametrize("mu,start,kw", [(1000.0, 1.0, {"max_rate": 20.0}), (1.0, 4.0, {"min_rate": 0.5})])
def test_a_one_sided_search_survives_the_stages_record(mu, start, kw):
    """vllm-serve and openai-endpoint keep their extra with exclude_none; a search that never
    failed (or never passed) has a None end, and the record must still read back (CI once saw
    every probe pass on vLLM-CPU and the stage ended in error)."""
    cap = find_capacity(mm1(mu, 2.0, []), start, **kw)
    stored = ServingExtra(capacity=cap).model_dump(mode="json", exclude_none=True)
    assert ServingExtra.model_validate(stored).capacity == cap


def late_client(measure, limit_rps: float):
    """The same server, driven by a client that cannot send faster than limit_rps: a pass above
    it is not judged (scenarios/serving.py), a miss stays a miss."""
    def probe(rate: float) -> Trial:
        p = measure(rate)
        return p.model_copy(update={"invalid": "the client fell behind"}) if rate > limit_rps and p.ok else p
    return probe


def test_a_client_that_falls_behind_caps_the_search_below_it():
    calls: list[float] = []
    cap = find_capacity(late_client(mm1(100.0, 2.0, calls), 30.0), 1.0, precision=0.05)
    # the server holds to ~97.7 req/s; the client can test up to 30: the answer is a lower bound
    assert cap.capacity_rps is not None and 30.0 / 1.05 <= cap.capacity_rps <= 30.0
    assert cap.failing_rps is None and not cap.converged
    assert all(p.ok for p in cap.trials if not p.invalid)
    late = [p.rate for p in cap.trials if p.invalid]
    assert late and min(late) > cap.capacity_rps
    assert any("measure the client, not the server" in n for n in cap.notes)
    assert any("at least" in n for n in cap.notes)


def test_a_server_failure_below_the_clients_limit_still_converges():
    cap = find_capacity(late_client(mm1(10.0, 2.0, []), 50.0), 1.0, precision=0.05)
    assert cap.converged and not any(p.invalid for p in cap.trials)
    assert cap.passing_rps <= true_capacity(10.0, 2.0) < cap.failing_rps


def test_a_client_late_from_the_first_probe_finds_no_capacity_above_it():
    cap = find_capacity(late_client(mm1(100.0, 2.0, []), 0.5), 4.0, min_rate=0.25, precision=0.05)
    assert cap.capacity_rps is not None and cap.capacity_rps <= 0.5 and not cap.converged
    assert [p.rate for p in cap.trials][:4] == [4.0, 2.0, 1.0, 0.5]


def test_the_probe_budget_is_kept():
    calls: list[float] = []
    cap = find_capacity(mm1(10.0, 2.0, calls), 0.001, max_probes=5)
    assert len(calls) == 5 and not cap.converged and "after 5 probes" in cap.notes[0]


@pytest.mark.parametrize("kwargs", [{"start_rate": 0}, {"start_rate": 1, "precision": 0},
                                    {"start_rate": 1, "precision": 1.5}, {"start_rate": 1, "min_rate": 5, "max_rate": 2},
                                    {"start_rate": 1, "max_probes": 1}])
def test_bad_search_settings_are_usage_errors(kwargs):
    with pytest.raises(UsageError):
        find_capacity(mm1(10.0, 2.0, []), **kwargs)


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
