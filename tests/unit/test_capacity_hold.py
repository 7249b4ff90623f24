"""The capacity a deployment is sized by (load/hold.py): the search's answer, brought under the
highest completion rate measured, then held; a failed hold sends the search on below it.

First with made-up trials, so that every branch's answer is known; then the whole serving
scenario (scenarios/serving.py: sweep, search, hold) on a server simulated in virtual time
(tests/simserver.py) that completes at most 45 requests a second and whose short trials still
pass above that, as the H200 did in issue 23: the capacity must come out at or under 45, held,
where the SLO alone on short trials (today's rule) puts it well above."""

from __future__ import annotations

import pytest
from simserver import SimServer

from llmopt_bench.core.contract import StageContext
from llmopt_bench.core.workload import Request
from llmopt_bench.load.hold import search_and_hold
from llmopt_bench.load.plans import PlanLoad
from llmopt_bench.load.search import Search, Trial
from llmopt_bench.measure.energy import TimedMeter
from llmopt_bench.scenarios.serving import ServingRun
from llmopt_bench.scenarios.serving_record import ServingExtra, ServingParams
from llmopt_bench.scenarios.serving_report import capacity_line


def server(short_ok_below: float, held_ok_below: float, calls: list[tuple[str, float]]):
    """Trials pass up to one rate, holds (longer) only up to a lower one."""
    def probe(rate: float) -> Trial:
        calls.append(("probe", rate))
        return Trial(rate=rate, ok=rate <= short_ok_below, detail={"reason": None if rate <= short_ok_below else "ttft", "steady": True})

    def hold(rate: float) -> Trial:
        calls.append(("hold", rate))
        ok = rate <= held_ok_below
        return Trial(rate=rate, ok=ok, kind="hold", detail={"reason": None if ok else "not steady: completions", "steady": ok})
    return probe, hold


def test_a_held_answer_is_the_capacity():
    calls: list = []
    probe, hold = server(60.0, 100.0, calls)
    cap = search_and_hold(Search(10.0, precision=0.05), probe, hold, hold_s=60.0)
    assert cap.held is True and cap.hold_s == 60.0 and cap.converged
    assert cap.capacity_rps == cap.passing_rps and 60.0 / 1.05 <= cap.capacity_rps <= 60.0
    assert calls[-1] == ("hold", cap.capacity_rps) and [k for k, _ in calls].count("hold") == 1
    assert [t.kind for t in cap.trials][-1] == "hold" and len(cap.holds) == 1


def test_a_failed_hold_backs_off_then_bisects_between_holds():
    calls: list = []
    probe, hold = server(60.0, 45.0, calls)
    cap = search_and_hold(Search(10.0, precision=0.05), probe, hold, hold_s=60.0, attempts=4)
    holds = [r for k, r in calls if k == "hold"]
    first = max(r for k, r in calls if k == "probe" and r <= 60.0)  # the search's answer
    # backing off 10%, then 20% below the lowest failure, until one holds; then the middle
    assert holds[:3] == [first, pytest.approx(0.9 * first), pytest.approx(0.8 * 0.9 * first)]
    assert holds[3] == pytest.approx((holds[1] + holds[2]) / 2) and len(holds) == 4
    assert cap.held is True and cap.capacity_rps == max(r for r in holds if r <= 45.0) == holds[2]
    assert f"the hold at {holds[0]:g} req/s for 60 s failed (not steady: completions)" in cap.notes
    assert f"the search went on below the failed hold(s): {holds[2]:g} req/s held" in cap.notes
    assert cap.failing_rps == min(r for r in holds if r > 45.0)  # a failed hold bounds the search's interval


def test_holds_go_as_low_as_they_must():
    calls: list = []
    probe, hold = server(60.0, 12.0, calls)
    cap = search_and_hold(Search(10.0, precision=0.05), probe, hold, hold_s=60.0, attempts=8)
    holds = [t for t in cap.trials if t.kind == "hold"]
    assert cap.held is True and cap.capacity_rps == max(t.rate for t in holds if t.ok) <= 12.0
    assert all(t.ok == (t.rate <= 12.0) for t in holds) and len(holds) == 8
    # 60 failed, then 10%, 20%, 40% and 80% below the lowest failure until one held, then bisection
    assert [t.rate for t in holds][4] == pytest.approx(60 * 0.9 * 0.8 * 0.6 * 0.2)


def test_when_every_hold_fails_the_answer_below_them_is_not_held():
    calls: list = []
    probe, hold = server(60.0, 20.0, calls)
    cap = search_and_hold(Search(10.0, precision=0.05), probe, hold, hold_s=60.0, attempts=2)
    holds = [r for k, r in calls if k == "hold"]
    assert len(holds) == 2 and cap.held is False
    # the capacity: a rate measured, the highest short trial that met the SLO below the failed holds
    below = [r for k, r in calls if k == "probe" and r <= 60.0 and r < min(holds)]
    assert cap.capacity_rps == max(below) < min(holds)
    assert (f"2 hold(s) failed: ~{cap.capacity_rps:g} req/s, the highest short trial that met the SLO below them, "
            "is not held") in cap.notes
    assert "~" in capacity_line(cap, "ttft_p99=2s") and "not held" in capacity_line(cap, "ttft_p99=2s")


def test_no_hold_leaves_the_answer_not_held_and_says_so():
    calls: list = []
    probe, hold = server(60.0, 45.0, calls)
    cap = search_and_hold(Search(10.0, precision=0.05), probe, hold, hold_s=0)
    assert not any(k == "hold" for k, _ in calls)
    assert cap.held is None and cap.hold_s is None and cap.capacity_rps > 45.0
    assert any("not held: hold_s = 0" in n for n in cap.notes)
    line = capacity_line(cap, "ttft_p99=2s")
    assert f"**~{cap.capacity_rps:.4g}".rstrip("0") in line.replace(",", "") and "not held** (no hold)" in line
    assert "each judged in steady state; 0 holds" in line
    old = cap.model_copy(update={"trials": [t.model_copy(update={"detail": {}}) for t in cap.trials]})  # a run from before
    assert "not held** (a run from before holds)" in capacity_line(old, "ttft_p99=2s")


def test_the_capacity_never_exceeds_the_highest_completion_rate_measured():
    calls: list = []
    probe, hold = server(60.0, 100.0, calls)
    cap = search_and_hold(Search(10.0, precision=0.05), probe, hold, hold_s=60.0,
                          saturation=lambda: (52.5, "sweep: concurrency 64"))
    assert cap.capacity_rps == 52.5 and cap.held is True and ("hold", 52.5) in calls
    assert cap.passing_rps > 52.5  # the search's own answer, above the ceiling
    assert (cap.saturation_rps, cap.saturation_how) == (52.5, "sweep: concurrency 64")
    assert any("above the highest completion rate measured (52.5 req/s, sweep: concurrency 64)" in n for n in cap.notes)


def test_a_hold_the_client_could_not_deliver_is_not_a_verdict():
    def probe(rate):
        return Trial(rate=rate, ok=rate <= 40)

    def hold(rate):
        return Trial(rate=rate, ok=True, kind="hold", invalid="the client fell behind")
    cap = search_and_hold(Search(10.0), probe, hold, hold_s=60.0)
    assert cap.held is None and any("could not be judged: the client fell behind" in n for n in cap.notes)


# --- the whole scenario on a simulated server --------------------------------------------------

def serving(hold_s: float, **kw):
    sim = SimServer(tokens_per_s=900.0, step_s=0.01, max_seqs=64)  # 45 requests of 20 tokens a second, at most
    p = ServingParams(concurrency=[1, 8, 32], requests_per_point=64, warmup_s=2.0, min_point_s=10.0, max_point_s=60.0,
                      search_precision=0.05, search_max_probes=10, hold_s=hold_s, throughput_point=False, **kw)
    reqs = [Request(f"r{i}", f"p{i}", (1, 2, 3, 4)) for i in range(16)]
    ctx = StageContext(run_dir=None, stage_dir=None, device="cpu", meter=TimedMeter(read_mj=lambda: None))
    return ServingRun(sim, {"kind": "simulated"}, p, PlanLoad.of_requests(reqs, 20), None, ctx, run_seed=1).run(), sim


@pytest.fixture(scope="module")
def held_run():
    return serving(60.0)


def test_the_capacity_holds_on_a_server_whose_short_trials_pass_above_it(held_run):
    (samples, extra, facts), sim = held_run
    cap = extra.capacity
    assert facts.slo_capacity_held is True and cap.held is True and facts.slo_hold_s == 60.0
    assert facts.slo_capacity_rps == cap.capacity_rps <= sim.rate_for(20) == 45.0
    assert cap.capacity_rps >= 0.8 * 45.0
    assert facts.saturation_rps >= cap.capacity_rps
    line = capacity_line(cap, "ttft_p99=2s,tpot_p99=100ms")
    assert line.startswith(f"Capacity under the SLO ttft_p99=2s,tpot_p99=100ms: **{cap.capacity_rps:.3g} req/s**, held 60 s; ")
    assert f"Saturation check: the highest completion rate measured is {facts.saturation_rps:.3g} req/s" in line
    # the hold at the capacity is the headline: a 60 s window of it
    hold = next(r for r in extra.curve if r.phase == "hold" and r.rate_rps == cap.capacity_rps)
    assert extra.main_point == f"hold: {cap.capacity_rps:g} req/s" and hold.steady and hold.window_s == pytest.approx(60.0)
    assert len(samples) == hold.requests and facts.goodput_rps == hold.goodput_rps
    # the trials above the server's rate were judged unsteady, and the rows say why
    over = [r for r in extra.curve if r.phase == "search" and r.rate_rps > 50.0]
    assert over and all(r.steady is False and r.slo_ok is False and r.slo_reason.startswith("not steady: ") for r in over)
    assert ServingExtra.model_validate(extra.model_dump(mode="json", exclude_none=True)) == extra


def test_the_slo_alone_on_short_trials_puts_it_above_what_the_server_completes(monkeypatch):
    """Today's rule (issue 23): no steady-state judgement, no hold. The same server, the same
    search: the answer lies above the 45 req/s the server can complete."""
    from llmopt_bench.load import point
    from llmopt_bench.load.steady import Steady

    monkeypatch.setattr(point, "judge_steady", lambda *a, **k: Steady(ok=None))
    (_, extra, facts), _ = serving(0.0)
    print([(t.rate, t.ok) for t in extra.capacity.trials])
    assert extra.capacity.passing_rps > 45.0 * 1.1  # what today's search answered
    # the saturation check alone brings it down to what the server was seen to complete, not held
    assert facts.slo_capacity_held is None and facts.slo_capacity_rps == pytest.approx(facts.saturation_rps)
