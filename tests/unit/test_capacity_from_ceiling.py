"""The serving scenario's capacity from the ceiling down (issue 34), on a server simulated in
virtual time (tests/simserver.py) that completes at most 45 requests of 20 tokens a second: the
ceiling is measured first (the workload's requests all at once), the first trial lies just
under it, and the answer comes to 5% within the budget, in both regimes: an SLO that does not
bind before saturation (the answer within 5% of what the server completes) and one that binds
(TPOT p99 40 ms: the answer at the SLO's edge, a failed trial or hold 5% above it). Where the
budget is too small, the precision reached and the cost of the rest are said."""

from __future__ import annotations

import pytest
from simserver import SimServer

from llmopt_bench.core.contract import StageContext
from llmopt_bench.core.workload import Request
from llmopt_bench.load.plans import PlanLoad
from llmopt_bench.measure.energy import TimedMeter
from llmopt_bench.scenarios.serving.record import ServingParams
from llmopt_bench.scenarios.serving.report import capacity_line
from llmopt_bench.scenarios.serving.run import ServingRun

LOOSE, BINDING = "ttft_p99=2s,tpot_p99=100ms", "ttft_p99=2s,tpot_p99=40ms"
SERVER_RPS = 45.0  # tokens_per_s / output_len: what the simulated server completes a second at most


def serving(slo: str, **kw):
    sim = SimServer(tokens_per_s=900.0, step_s=0.01, max_seqs=64)
    assert sim.rate_for(20) == SERVER_RPS
    # the sweep stops at 8 users (40 req/s): the ceiling point, 256 at once, is what finds 45
    p = ServingParams(concurrency=[1, 8], requests_per_point=64, warmup_s=2.0, min_point_s=10.0, max_point_s=60.0,
                      slo=slo, throughput_point=False, **kw)
    reqs = [Request(f"r{i}", f"p{i}", (1, 2, 3, 4)) for i in range(16)]
    ctx = StageContext(run_dir=None, stage_dir=None, device="cpu", meter=TimedMeter(read_mj=lambda: None))
    return ServingRun(sim, {"kind": "simulated"}, p, PlanLoad.of_requests(reqs, 20), None, ctx, run_seed=1).run()


@pytest.fixture(scope="module")
def loose():
    return serving(LOOSE)


@pytest.fixture(scope="module")
def binding():
    return serving(BINDING)


def ceiling_row(extra):
    rows = [r for r in extra.curve if r.phase == "ceiling"]
    assert len(rows) == 1 and rows[0].concurrency == rows[0].requests == 256
    return rows[0]


@pytest.mark.parametrize("regime", ["loose", "binding"])
def test_the_first_trial_is_just_under_the_ceiling_measured_first(regime, request):
    _, extra, _ = request.getfixturevalue(regime)
    cap, row = extra.capacity, ceiling_row(extra)
    before = extra.curve[:extra.curve.index(row) + 1]  # the sweep and the ceiling: every point before the search
    assert [r.phase for r in before] == ["sweep", "sweep", "ceiling"] and row.qps == pytest.approx(SERVER_RPS, rel=0.01)
    assert cap.ceiling_rps == max(r.qps for r in before) == row.qps and cap.ceiling_how == "ceiling: concurrency 256"
    assert cap.trials[0].rate == pytest.approx(cap.ceiling_rps / 1.05)
    assert all(t.rate <= cap.ceiling_rps for t in cap.trials)


@pytest.mark.parametrize("regime", ["loose", "binding"])
def test_it_reaches_5_percent_held_within_its_budget(regime, request):
    _, extra, facts = request.getfixturevalue(regime)
    cap = extra.capacity
    assert cap.converged and cap.known_within <= 0.05 + 1e-9 and cap.held is True
    assert cap.budget_s == 240.0 and cap.spent_s <= cap.budget_s and cap.more_s is None
    assert cap.spent_s == pytest.approx(sum(t.cost_s for t in cap.trials), abs=1e-3)
    assert facts.slo_capacity_known_within == cap.known_within and facts.slo_capacity_held is True
    assert f"known within {cap.known_within * 100:.1f}%" in capacity_line(cap, extra.settings["slo"])


def test_where_the_slo_does_not_bind_the_capacity_is_within_5_percent_of_what_the_server_completes(loose):
    _, extra, _ = loose
    cap = extra.capacity
    assert 0.95 * SERVER_RPS <= cap.capacity_rps <= SERVER_RPS
    assert cap.upper_rps == cap.ceiling_rps and cap.failing_rps is None  # bounded by the ceiling, no trial spent above
    assert [t.kind for t in cap.trials] == ["probe", "hold"]


def test_where_the_slo_binds_the_capacity_sits_at_its_edge(binding):
    _, extra, _ = binding
    cap = extra.capacity
    assert cap.capacity_rps < cap.ceiling_rps / 1.05  # under the first trial
    # the upper end is a rate that was tried and missed the TPOT target, 5% above the capacity
    assert cap.upper_rps == cap.failing_rps <= 1.05 * cap.capacity_rps * (1 + 1e-9)
    missed = next(t for t in cap.trials if t.rate == cap.failing_rps and not t.ok)
    assert "tpot_p99" in missed.detail["reason"]
    held = next(r for r in extra.curve if r.phase == "hold" and r.rate_rps == cap.capacity_rps)
    assert held.slo_ok and held.steady and held.tpot_p99_s <= 0.040


def test_a_budget_too_small_says_the_precision_reached_and_what_5_percent_would_cost():
    """Three trials of ~10 s fit in 35 s: TPOT p99 25 ms fails at 42.9 and 40.8 req/s and holds
    at 37.0; the fourth trial, which would bring [37.0, 40.8] to 5%, does not fit."""
    _, extra, _ = serving("ttft_p99=2s,tpot_p99=25ms", search_budget_s=35.0, hold_s=0.0)
    cap = extra.capacity
    assert [t.ok for t in cap.trials] == [False, False, True] and cap.spent_s <= 35.0
    assert not cap.converged and cap.known_within == pytest.approx(cap.trials[1].rate / cap.trials[2].rate - 1)
    stop = next(n for n in cap.notes if n.startswith("stopped by its budget ("))
    assert (f"the capacity is known within {cap.known_within * 100:.1f}% ([{cap.trials[2].rate:.4g}, {cap.trials[1].rate:.4g}] "
            f"req/s); reaching 5% needs about 1 more trial, ~{cap.more_s:.0f} s of load") in stop and 5 < cap.more_s < 20
    line = capacity_line(cap, extra.settings["slo"])
    assert stop.rstrip(".") in line and f"**~{cap.capacity_rps:.1f} req/s, not held** (no hold), known within" in line


def test_an_open_loop_point_counts_toward_the_ceiling_for_at_most_the_rate_it_offered():
    """A trial at 42.9 req/s whose later half happened to answer 47.9 a second (the arrivals'
    own noise) would raise the ceiling above what the server completes, and the search would
    chase it up; a point that fell behind answers what the server could, and counts whole."""
    from llmopt_bench.load.capacity.params import Ceiling

    c = Ceiling()
    c.see(45.0, "ceiling: concurrency 256")
    c.see(47.9, "search: 42.9 req/s", offered=42.9)
    assert c() == (45.0, "ceiling: concurrency 256")
    c.see(46.2, "search: 60 req/s", offered=60.0)
    assert c() == (46.2, "search: 60 req/s")
