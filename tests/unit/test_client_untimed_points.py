"""A load point the client could not time (client/health.py) in the serving scenario
(scenarios/serving/run.py): marked in its row, shown as "not judged" in the report's curve, never
judged by the capacity search (a ceiling, as a client that falls behind), no batch-1 fact taken
from it, and no SLO point that `llmopt recommend` would judge as the server's.

The server is simulated in virtual time (tests/simserver.py); its client's self-check is the
real one (summarize, could_not_time) over clocks built from each answer's token times: on time
(each token read 0.1 ms after it arrived, alone), or, at the points where the client is said to
be late, every token read at once after the answer's end with the segments piled up unread (the
kernel's merge: one receive time, the last one's), as on the busy 2-core host of issue 23."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from simserver import SimServer

from llmopt_bench.client.health import RequestClock, health_of
from llmopt_bench.core.contract import StageContext
from llmopt_bench.core.workload import Request
from llmopt_bench.load.capacity.search import Capacity
from llmopt_bench.load.dispatchers import ClosedLoop, OpenLoop
from llmopt_bench.load.plans import PlanLoad
from llmopt_bench.measure.energy import TimedMeter
from llmopt_bench.scenarios.serving.record import ServingExtra, ServingParams
from llmopt_bench.scenarios.serving.report import client_block, curve_block, serving_blocks
from llmopt_bench.scenarios.serving.rows import main_key
from llmopt_bench.scenarios.serving.run import ServingRun

LATE_ABOVE_RPS = 24.0  # the client cannot keep up above this arrival rate (and at concurrency 1, below)


def clock_of(sample, late: bool) -> RequestClock:
    c = RequestClock(sent=sample.t_submit, request_id=sample.request_id)
    for t in sample.token_times:
        if late:  # read 20 ms after the answer ended, with every segment piled up: only the last one's time
            c.add(sample.t_done + 0.02, True, sample.t_done, False, len(sample.token_times), sample.t_submit)
        else:
            c.add(t + 1e-4, True, t, True, 1, t - 1e-3)
    return c


class LateClientServer(SimServer):
    """A simulated server whose client watches itself: late at concurrency 1 and above LATE_ABOVE_RPS."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.late: list[bool] = []  # per point driven, in order
        self._clocks: list[RequestClock] = []

    def drive(self, dispatcher) -> None:
        if isinstance(dispatcher, OpenLoop):
            o = dispatcher.offsets
            late = (len(o) - 1) / (o[-1] - o[0]) > LATE_ABOVE_RPS
        else:
            assert isinstance(dispatcher, ClosedLoop)
            late = dispatcher.users == 1
        super().drive(dispatcher)
        self.late.append(late)
        self._clocks = [clock_of(t.sample, late) for t in dispatcher.timelines if t.sample and t.sample.ok]

    def health(self, request_ids):
        return health_of([c for c in self._clocks if c.request_id in request_ids], [])


@pytest.fixture(scope="module")
def run():
    sim = LateClientServer(tokens_per_s=900.0, step_s=0.01, max_seqs=64)  # at most 45 req/s of 20 tokens
    p = ServingParams(concurrency=[1, 8], requests_per_point=64, warmup_s=2.0, min_point_s=10.0, max_point_s=60.0,
                      search_start_rps=8.0, search_max_probes=8, hold_s=20.0, throughput_point=False)
    reqs = [Request(f"r{i}", f"p{i}", (1, 2, 3, 4)) for i in range(16)]
    ctx = StageContext(run_dir=None, stage_dir=None, device="cpu", meter=TimedMeter(read_mj=lambda: None))
    return ServingRun(sim, {"kind": "simulated"}, p, PlanLoad.of_requests(reqs, 20), None, ctx, run_seed=1).run(), sim


def test_every_point_keeps_the_clients_health_and_the_late_ones_are_marked(run):
    (_, extra, _), sim = run
    curve = extra.curve
    assert len(curve) == len(sim.late) and any(sim.late) and not all(sim.late)
    assert [r.client_untimed is not None for r in curve] == sim.late
    assert all(r.client.requests == r.completed for r in curve)  # the measured requests, warm-up left out
    for r in curve:
        if r.client_untimed:
            assert r.client_untimed.startswith("the client could not time this point: 100% of its requests' first or last")
            assert r.client.edge_lost_share == 1.0
        else:
            assert r.client.edge_lost_share == 0.0 and r.client.kernel_timed_share == 1.0
    cells = {row[0] + str(row[1] or row[2]): row[12] for row in curve_block(curve).rows}
    assert cells["sweep1"].startswith("not judged: the client could not time this point")


def test_the_search_judges_no_point_the_client_could_not_time(run):
    (_, extra, facts), _ = run
    cap = extra.capacity
    rows = [r for r in extra.curve if r.phase in ("search", "hold")]
    assert [bool(t.invalid) for t in cap.trials] == [r.client_untimed is not None for r in rows]
    untimed = [t.rate for t in cap.trials if t.invalid]
    assert untimed and all(t.invalid.startswith("the client could not time") for t in cap.trials if t.invalid)
    # the server keeps up to 45 req/s: only the client stops the search, whose answer stays below it
    assert cap.passing_rps is not None and cap.passing_rps < min(untimed) < 45.0
    assert any(n.startswith(f"at {min(untimed):g} req/s the client could not time") for n in cap.notes)
    hold = cap.holds[-1]
    if hold.invalid:  # a hold the client could not time is no verdict: the capacity is not held
        assert cap.held is None and any(n.startswith(f"the hold at {hold.rate:g} req/s could not be judged: the client")
                                        for n in cap.notes)
    # recommend sees only the server's latencies
    judged = [r for r in extra.curve if r.mode == "open" and not r.client_untimed]
    assert [(p.rate_rps, p.hold) for p in facts.slo_points] == [(r.rate_rps, r.phase == "hold") for r in judged]


def test_no_batch1_fact_from_a_point_the_client_could_not_time(run):
    (_, extra, facts), _ = run
    one = next(r for r in extra.curve if r.phase == "sweep" and r.concurrency == 1)
    assert one.client_untimed and one.ttft_p50_s is not None
    assert facts.batch1_ttft_s is None and facts.batch1_tpot_s is None
    text = client_block(extra).text
    assert text.startswith("Client: one process (client_workers 1; its punctuality below says whether that kept up); "), text
    assert "Tokens timed by the kernel's receive clock: 0.0% at the worst point" in text
    assert "Points it could not time (not the server's latency, not judged): sweep at concurrency 1, search at" in text


def test_the_headline_is_a_point_the_client_timed(run):
    """The stage's samples (its row in the metrics table) are never a point the client could
    not time while another is left."""
    (samples, extra, _), _ = run
    untimed = {r.rate_rps for r in extra.curve if r.mode == "open" and r.client_untimed}
    assert extra.main_point and extra.main_untimed is False
    main = next(r for r in extra.curve if extra.main_point == f"{r.phase}: " + (
        f"concurrency {r.concurrency}" if r.mode == "closed" else f"{r.rate_rps:g} req/s"))
    assert not main.client_untimed and len(samples) == main.requests
    if extra.capacity.holds[-1].invalid:  # the hold at the capacity was not timed: the trial there is the headline
        assert extra.main_point == f"search: {extra.capacity.capacity_rps:g} req/s" and extra.capacity.capacity_rps in untimed


def test_the_headline_passes_over_untimed_points_and_says_when_all_were():
    p = ServingParams(concurrency=[1, 4, 16])
    sweep = ("sweep: concurrency 1", "sweep: concurrency 4", "sweep: concurrency 16")
    keys = {k: [] for k in (*sweep, "hold: 5 req/s", "throughput: concurrency 4")}
    cap = Capacity(capacity_rps=5.0, precision=0.05, converged=True, trials=[])
    assert main_key(keys, cap, p) == "hold: 5 req/s"
    assert main_key(keys, cap, p, {"hold: 5 req/s", "sweep: concurrency 16"}) == "sweep: concurrency 4"
    # every sweep point untimed: the default, marked (not the throughput point, whose requests may all fail by design)
    assert main_key(keys, None, p, set(sweep)) == "sweep: concurrency 16"
    x = ServingExtra(main_point="sweep: concurrency 16", main_untimed=True)
    load = serving_blocks(SimpleNamespace(extra_as=lambda cls: x, facts=None))[1].text
    assert load.endswith("Headline (the stage's row in the table): sweep: concurrency 16 (the client could not time it, "
                         "nor any other point: its latencies are the client's, not the server's).")
