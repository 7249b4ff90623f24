"""The capacity a deployment is sized by (load/capacity/find.py, load/capacity/hold.py): the search's answer,
never above the highest completion rate measured, then held; a failed hold sends the holds on
below it, a precision's step at a time.

First with made-up trials, so that every branch's answer is known; then the whole serving
scenario (scenarios/serving/run.py: sweep, search, hold) on a server simulated in virtual time
(tests/simserver.py) that completes at most 45 requests a second and whose short trials still
pass above that, as the H200 did in issue 23: the capacity must come out at or under 45, held,
where the SLO alone on short trials (issue 23's rule) puts it well above."""

from __future__ import annotations

import pytest
from simserver import SimServer

from llmopt_bench.core.contract import StageContext
from llmopt_bench.core.fmt import num
from llmopt_bench.core.workload import Request
from llmopt_bench.load.capacity.find import find_capacity
from llmopt_bench.load.capacity.search import Trial
from llmopt_bench.load.plans import PlanLoad
from llmopt_bench.measure.energy import TimedMeter
from llmopt_bench.scenarios.serving.record import ServingExtra, ServingParams
from llmopt_bench.scenarios.serving.report import capacity_line
from llmopt_bench.scenarios.serving.run import ServingRun


def server(short_ok_below: float, held_ok_below: float, calls: list[tuple[str, float]]):
    """Trials pass up to one rate, holds (longer) only up to a lower one."""
    def measure(rate: float, hold_s: float | None = None) -> Trial:
        if hold_s:
            calls.append(("hold", rate))
            ok = rate <= held_ok_below
            return Trial(rate=rate, ok=ok, kind="hold", cost_s=hold_s + 2,
                         detail={"reason": None if ok else "not steady: completions", "steady": ok})
        calls.append(("probe", rate))
        ok = rate <= short_ok_below
        return Trial(rate=rate, ok=ok, cost_s=12.0, duration_s=10.0, detail={"reason": None if ok else "ttft", "steady": True})
    return measure


def find(measure, ceiling: float = 80.0, hold_s: float = 60.0, budget_s: float | None = None, **kw):
    return find_capacity(measure, ceiling, budget_s, precision=0.05, hold_s=hold_s, **kw)


def test_a_held_answer_is_the_capacity():
    calls: list = []
    cap = find(server(60.0, 100.0, calls))
    assert cap.held is True and cap.hold_s == 60.0 and cap.converged
    assert cap.capacity_rps == cap.passing_rps and 60.0 / 1.05 <= cap.capacity_rps <= 60.0
    assert calls[-1] == ("hold", cap.capacity_rps) and [k for k, _ in calls].count("hold") == 1
    assert [t.kind for t in cap.trials][-1] == "hold" and len(cap.holds) == 1


def test_a_failed_hold_steps_down_by_the_precision_until_one_holds():
    calls: list = []
    cap = find(server(60.0, 45.0, calls))
    holds = [r for k, r in calls if k == "hold"]
    first = max(r for k, r in calls if k == "probe" and r <= 60.0)  # the search's answer
    # each hold 5% under the one that failed, until one holds: that one is then pinned to 5%
    want = [first]
    while want[-1] > 45.0:
        want.append(want[-1] / 1.05)
    assert holds == pytest.approx(want) and len(holds) > 2
    assert cap.held is True and cap.capacity_rps == holds[-1] <= 45.0 and cap.converged
    assert cap.upper_rps == holds[-2] and cap.known_within == pytest.approx(0.05)
    assert f"the hold at {holds[0]:g} req/s for 60 s failed (not steady: completions)" in cap.notes
    assert f"the search went on below the failed hold(s): {holds[-1]:g} req/s held" in cap.notes
    assert cap.failing_rps == holds[-2]  # a failed hold bounds the search's interval


def test_holds_go_as_low_as_they_must_while_the_budget_allows():
    calls: list = []
    cap = find(server(60.0, 50.0, calls), budget_s=400.0)
    holds = [t for t in cap.trials if t.kind == "hold"]
    assert len(holds) == 5 and cap.held is True and cap.capacity_rps == max(t.rate for t in holds if t.ok) <= 50.0
    assert all(t.ok == (t.rate <= 50.0) for t in holds) and cap.spent_s <= 400.0 and cap.converged


def test_when_the_budget_ends_the_holds_the_answer_below_them_is_not_held_and_the_cost_is_said():
    calls: list = []
    cap = find(server(60.0, 20.0, calls), budget_s=260.0)
    holds = [r for k, r in calls if k == "hold"]
    assert len(holds) == 3 and cap.held is False and cap.spent_s <= 260.0
    # the capacity: a rate measured, the highest short trial that met the SLO below the failed holds
    below = [r for k, r in calls if k == "probe" and r <= 60.0 and r < min(holds)]
    assert cap.capacity_rps == (max(below) if below else None)
    assert any(n.startswith("stopped by its budget") and "reaching 5% needs at least 1 more hold, ~62 s of load" in n
               for n in cap.notes)
    assert cap.more_s == 62.0


def test_every_hold_failing_under_a_hold_cap_leaves_the_short_trials_answer_not_held():
    calls: list = []
    cap = find(server(60.0, 20.0, calls), hold_attempts=2)
    holds = [r for k, r in calls if k == "hold"]
    assert len(holds) == 2 and cap.held is False
    below = [r for k, r in calls if k == "probe" and r < min(holds)]
    assert below and cap.capacity_rps == max(below) < min(holds)
    assert (f"2 hold(s) failed: ~{cap.capacity_rps:g} req/s, the highest short trial that met the SLO below them, "
            "is not held") in cap.notes
    assert "~" in capacity_line(cap, "ttft_p99=2s") and "not held" in capacity_line(cap, "ttft_p99=2s")


def test_no_hold_leaves_the_answer_not_held_and_says_so():
    calls: list = []
    cap = find(server(60.0, 45.0, calls), hold_s=0)
    assert not any(k == "hold" for k, _ in calls)
    assert cap.held is None and cap.hold_s is None and cap.capacity_rps > 45.0
    assert any("not held: hold_s = 0" in n for n in cap.notes)
    line = capacity_line(cap, "ttft_p99=2s")
    assert f"**~{cap.capacity_rps:.4g}".rstrip("0") in line.replace(",", "") and "not held** (no hold)" in line
    assert "each judged in steady state, then 0 holds" in line
    # a run from before the steady-state rules and issue 34
    old = cap.model_copy(update={"trials": [t.model_copy(update={"detail": {}}) for t in cap.trials], "spent_s": None})
    assert "not held** (a run from before holds)" in capacity_line(old, "ttft_p99=2s")


def test_the_capacity_never_exceeds_the_highest_completion_rate_measured():
    """Short trials pass up to 60 req/s; the stage never saw more than 52.5 completed a second:
    a pass above that is not counted as sustained, and the ceiling bounds the interval."""
    calls: list = []
    cap = find(server(60.0, 100.0, calls), ceiling=None, start_rate=58.0, saturation=lambda: (52.5, "sweep: concurrency 64"))
    assert calls[:2] == [("probe", 58.0), ("probe", 26.25)]  # 58 met the SLO, yet counts as a failure: halve under 52.5
    assert cap.capacity_rps <= 52.5 and cap.held is True and cap.converged and cap.upper_rps <= 52.5
    assert all(r <= 52.5 for k, r in calls[1:])
    assert (cap.saturation_rps, cap.saturation_how) == (52.5, "sweep: concurrency 64")
    assert ("58 req/s met the SLO in a probe above the highest completion rate measured (52.5 req/s, sweep: concurrency 64): "
            "a rate the server was never seen to complete is not counted as sustained") in cap.notes
    assert "[" + f"{cap.capacity_rps:.1f}, 52.5: the ceiling] req/s" in capacity_line(cap, "ttft_p99=2s")


def test_a_hold_the_client_could_not_deliver_is_not_a_verdict():
    def measure(rate, hold_s=None):
        if hold_s:
            return Trial(rate=rate, ok=True, kind="hold", invalid="the client fell behind")
        return Trial(rate=rate, ok=rate <= 40)
    cap = find(measure, ceiling=50.0)
    assert cap.held is None and any("could not be judged: the client fell behind" in n for n in cap.notes)


# --- the whole scenario on a simulated server --------------------------------------------------

def serving(hold_s: float, **kw):
    sim = SimServer(tokens_per_s=900.0, step_s=0.01, max_seqs=64)  # 45 requests of 20 tokens a second, at most
    p = ServingParams(concurrency=[1, 8, 32], requests_per_point=64, warmup_s=2.0, min_point_s=10.0, max_point_s=60.0,
                      search_precision=0.05, hold_s=hold_s, throughput_point=False, **kw)
    reqs = [Request(f"r{i}", f"p{i}", (1, 2, 3, 4)) for i in range(16)]
    ctx = StageContext(run_dir=None, stage_dir=None, device="cpu", meter=TimedMeter(read_mj=lambda: None))
    return ServingRun(sim, {"kind": "simulated"}, p, PlanLoad.of_requests(reqs, 20), None, ctx, run_seed=1).run(), sim


@pytest.fixture(scope="module")
def held_run():
    """From a start rate of twice what the server completes, so that trials go above it."""
    return serving(60.0, search_start_rps=90.0)


def test_the_capacity_holds_on_a_server_whose_short_trials_pass_above_it(held_run):
    (samples, extra, facts), sim = held_run
    cap = extra.capacity
    assert facts.slo_capacity_held is True and cap.held is True and facts.slo_hold_s == 60.0
    assert facts.slo_capacity_rps == cap.capacity_rps <= sim.rate_for(20) == 45.0
    assert cap.capacity_rps >= 0.8 * 45.0
    assert facts.saturation_rps >= cap.capacity_rps
    line = capacity_line(cap, "ttft_p99=2s,tpot_p99=100ms")
    assert line.startswith(f"Capacity under the SLO ttft_p99=2s,tpot_p99=100ms: **{cap.capacity_rps:.3g} req/s**, held 60 s, "
                           f"known within {cap.known_within * 100:.1f}% ")
    assert f"Saturation check: the highest completion rate measured is {num(facts.saturation_rps)} req/s" in line
    # the hold at the capacity is the headline: a 60 s window of it
    hold = next(r for r in extra.curve if r.phase == "hold" and r.rate_rps == cap.capacity_rps)
    assert extra.main_point == f"hold: {cap.capacity_rps:g} req/s" and hold.steady and hold.window_s == pytest.approx(60.0)
    assert len(samples) == hold.requests and facts.goodput_rps == hold.goodput_rps
    # the trials above the server's rate were judged unsteady, and the rows say why
    over = [r for r in extra.curve if r.phase == "search" and r.rate_rps > 50.0]
    assert over and all(r.steady is False and r.slo_ok is False and r.slo_reason.startswith("not steady: ") for r in over)
    assert ServingExtra.model_validate(extra.model_dump(mode="json", exclude_none=True)) == extra


def test_the_slo_alone_on_short_trials_passes_above_what_the_server_completes(monkeypatch):
    """Issue 23's rule: no steady-state judgement, no hold. On the same server a short trial at
    1.15x what it can complete meets the SLO (what that search answered); the search from the
    ceiling down never tries a rate above the highest completion rate measured, so its answer
    stays under it even without the steady-state rules."""
    from llmopt_bench.load import point
    from llmopt_bench.load.steady import Steady

    monkeypatch.setattr(point, "judge_steady", lambda *a, **k: Steady(ok=None))
    sim = SimServer(tokens_per_s=900.0, step_s=0.01, max_seqs=64)
    p = ServingParams(concurrency=[1, 8, 32], requests_per_point=64, warmup_s=2.0, min_point_s=10.0, max_point_s=60.0,
                      hold_s=0.0, throughput_point=False)
    reqs = [Request(f"r{i}", f"p{i}", (1, 2, 3, 4)) for i in range(16)]
    ctx = StageContext(run_dir=None, stage_dir=None, device="cpu", meter=TimedMeter(read_mj=lambda: None))
    run = ServingRun(sim, {"kind": "simulated"}, p, PlanLoad.of_requests(reqs, 20), None, ctx, run_seed=1)
    _, extra, facts = run.run()
    assert facts.slo_capacity_held is None and facts.slo_capacity_rps <= facts.saturation_rps <= 45.0 * 1.001
    assert all(t.rate <= facts.saturation_rps for t in extra.capacity.trials)
    assert run.trial(1.15 * 45.0).ok  # the SLO alone, on a short trial, above what the server completes
