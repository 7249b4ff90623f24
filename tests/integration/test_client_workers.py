"""The client past one process on this host (issue 47): each point's schedule dealt to worker
processes (client/workers.py) against the built-in test server (client/test_server.py: no
model, one event every INTERVAL_MS), checked against one process on the same points: the same
requests, the same percentiles (the server's cadence sets them; margins no scheduling jitter of
a busy 2-core host crosses), the merged sends still the asked arrival process (a KS test), each
worker's health; a worker killed mid-point; conversations; requests round-robin over replicas;
and the serving stage with client_workers through the real CLI. vLLM-CPU's server with workers:
tests/integration/test_serving_vllm.py; Ray actors on two local nodes: test_client_ray.py."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from scipy import stats

from llmopt_bench.client.ceiling import server_stats, start_test_server
from llmopt_bench.client.http_load import HTTPLoad
from llmopt_bench.client.openai_http import Endpoint
from llmopt_bench.client.test_server import MODEL
from llmopt_bench.client.workers import WorkerLost
from llmopt_bench.core.workload import Request
from llmopt_bench.load.dispatchers import cycled
from llmopt_bench.load.engine import run_point
from llmopt_bench.load.point import LoadPoint

INTERVAL_MS = 5.0
TOKENS = 20  # a request: first event after 5 ms, the last ~100 ms in
REQUESTS = [Request(id=f"r{i}", prompt_id=f"p{i}", token_ids=tuple(range(100 + i, 164 + i))) for i in range(32)]


@pytest.fixture(scope="module")
def servers():
    procs, urls = [], []
    for _ in range(2):
        proc, url = start_test_server(INTERVAL_MS)
        procs.append(proc)
        urls.append(url)
    yield urls
    for p in procs:
        p.kill()
        p.wait()


def engine(url: str, **kw) -> HTTPLoad:
    return HTTPLoad(Endpoint(url, MODEL), watch_server=False, **kw)


def run(eng: HTTPLoad, point: LoadPoint):
    return run_point(eng, point, cycled(REQUESTS), TOKENS, expected_tokens=TOKENS)


CLOSED = LoadPoint(concurrency=8, num_requests=168, warmup_requests=8)
OPEN = LoadPoint(rate=40.0, duration_s=5.0, warmup_s=0.5, seed=7)


@pytest.fixture(scope="module")
def one_and_two(servers):
    """The same two points by one process and by two workers."""
    out = {}
    for n in (1, 2):
        eng = engine(servers[0], workers=n)
        try:
            out[n] = [(run(eng, p), eng.health(), eng.dealt) for p in (CLOSED, OPEN)]
        finally:
            eng.close()
    return out


def test_workers_send_every_request_once_and_time_it_as_one_process_does(one_and_two):
    for (one, _, d1), (two, health, d2) in zip(one_and_two[1], one_and_two[2]):
        assert (d1, d2) == (1, 2)
        assert two.sent == one.sent and two.completed == two.sent and two.failed == 0
        assert sorted(s.request_id for s in two.samples) == sorted(s.request_id for s in one.samples)
        m1, m2 = one.metrics, two.metrics
        # the server's cadence sets these: 5 ms to the first event, 5 ms between events
        assert m2.tpot_s.p50 == pytest.approx(m1.tpot_s.p50, rel=0.25) and 0.004 < m2.tpot_s.p50 < 0.008
        assert abs(m2.ttft_s.p50 - m1.ttft_s.p50) < 0.01 and abs(m2.e2e_s.p50 - m1.e2e_s.p50) < 0.02
        assert all(len(s.token_times) == TOKENS for s in two.samples)
        # each worker's own health, over its own share of the requests
        assert [w.worker.split(" (")[0] for w in health.workers] == ["local 0", "local 1"]
        assert sum(w.requests for w in health.workers) == health.requests
        assert all(w.send_delay_p99_s is not None and w.start_skew_s is not None for w in health.workers)


def test_merged_sends_are_the_asked_arrival_process(one_and_two):
    res = one_and_two[2][1][0]
    assert res.send_delay_s.p50 < 0.005  # the schedule kept (p50: a busy host's worst moments aside)
    sends = sorted(s.t_submit for s in res.samples)
    gaps = [b - a for a, b in zip(sends, sends[1:])]
    assert stats.kstest(gaps, stats.expon(scale=1 / OPEN.rate).cdf).pvalue > 0.001
    assert abs(len(sends) / (OPEN.duration_s - OPEN.warmup_s) / OPEN.rate - 1) < 0.35  # ~180 Poisson arrivals: within 3 sigma


def test_a_worker_killed_mid_point_is_named_and_the_others_records_are_kept(servers):
    eng = engine(servers[0], workers=2)
    slow = [Request(id=f"k{i}", prompt_id="k", token_ids=(1, 2, 3)) for i in range(4)]
    try:
        run(eng, LoadPoint(concurrency=2, num_requests=4))  # the workers started (and warm)
        victim = eng._pool.pids[1]
        threading.Timer(1.0, os.kill, (victim, signal.SIGKILL)).start()
        with pytest.raises(WorkerLost) as e:
            run_point(eng, LoadPoint(rate=20.0, duration_s=3.0), cycled(slow), 40, expected_tokens=40)
        msg = e.value.message
        assert f"client worker 1 (pid {victim}) ended mid-point, killed by signal 9 (SIGKILL)" in msg
        assert "the other 1 workers'" in msg
        kept = eng.samples
        assert kept and all(s.ok for s in kept) and len(kept) < 60
        # what came back is worker 0's share: arrivals 0, 2, 4, ... of the schedule (prompts k0 and k2 of the 4 cycled)
        assert {s.request_id.split(".")[0] for s in kept} == {"k0", "k2"}
        again = run(eng, CLOSED)  # the next point: fresh workers
        assert again.failed == 0 and eng.dealt == 2 and victim not in eng._pool.pids
    finally:
        eng.close()


def test_the_kernel_clock_stays_under_a_uvloop_policy(servers):
    """uvloop reads sockets in C, past the kernel clock's socket: a process whose policy is uvloop's
    (Ray sets it in its workers) still times every chunk by the kernel (the client runs asyncio's loop)."""
    import asyncio

    import uvloop  # a test dependency (pyproject's [test]): this test runs everywhere the suite does

    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    try:
        eng = engine(servers[0])
        run(eng, LoadPoint(concurrency=2, num_requests=6))
    finally:
        asyncio.set_event_loop_policy(None)
    assert eng.health().kernel_clock_share == 1.0


def test_requests_go_round_robin_over_replicas_and_each_ones_clock_is_read(servers):
    for n in (1, 2):
        for url in servers:
            server_stats(url, reset=True)
        eng = HTTPLoad(Endpoint(servers[0], MODEL), replicas=[Endpoint(servers[1], MODEL)], workers=n)
        try:
            res = run(eng, CLOSED)
        finally:
            eng.close()
        counts = [server_stats(url)["requests"] for url in servers]
        assert sum(counts) == CLOSED.num_requests and abs(counts[0] - counts[1]) <= n, counts
        assert res.failed == 0 and len(eng.last_servers) == 2 and eng.last_server is None  # the test server has no /metrics
        assert "round-robin over 2 endpoints" in eng.describe()


def test_conversations_are_dealt_with_their_turns(servers, tiny_model):
    from transformers import AutoTokenizer

    from llmopt_bench.core.workload import WorkloadConfig
    from llmopt_bench.load.engine import run_plan
    from llmopt_bench.load.plans import PlanLoad
    from llmopt_bench.workloads.build import make_plan
    from llmopt_bench.workloads.plan import TokenSpace
    from llmopt_bench.workloads.text import PromptTexts

    tok = AutoTokenizer.from_pretrained(tiny_model.path)
    plan = make_plan(WorkloadConfig(spec="multi-turn:turns=3,first=32,msg=16,out=8,think=0", kind="multi-turn"),
                     TokenSpace.of(tok, None), 2048, lambda t: tok(t, add_special_tokens=False)["input_ids"])
    load = PlanLoad(plan)
    seen = {}
    for n in (1, 2):
        eng = engine(servers[0], workers=n, texts=PromptTexts(tok, 0))
        try:
            eng.prepare(load.prompts(40))
            res = run_plan(eng, LoadPoint(concurrency=4, num_requests=36, warmup_requests=4), load)
        finally:
            eng.close()
        assert eng.dealt == n and res.failed == 0 and not eng.notes
        seen[n] = sorted((s.request_id, s.turn) for s in res.samples)
        assert {t for _, t in seen[n]} == {0, 1, 2} and eng.tally.texts_made_sending > 0  # later turns made in the workers
    assert len(seen[2]) == len(seen[1])


def test_the_serving_stage_deals_its_points_to_client_workers(servers, tiny_model, tmp_path):
    from testkit import read_run, run_cli, worktree_stages_env

    journey = tmp_path / "journey.toml"
    journey.write_text(f'[[stage]]\nname = "openai-endpoint"\nparams = {{ endpoint = "{servers[0]}", model = "{MODEL}", '
                       f'replicas = ["{servers[1]}"], prompt_format = "tokens", client_workers = 2, concurrency = [4], '
                       'requests_per_point = 24, rates = [20.0], capacity_search = false, throughput_point = false, '
                       'warmup_s = 0.3, min_point_s = 1.5, max_point_s = 4.0 }\n')
    out = tmp_path / "run"
    proc = run_cli("bench", "--stages", str(journey), "--model", "synthetic:tiny", "--input-len", "24", "--max-new-tokens", "12",
                   "--output", str(out), env=worktree_stages_env(tmp_path), timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = read_run(out)["stages"][0]
    x = s["extra"]
    assert s["status"] == "ok" and x["settings"]["client"].startswith("2 worker processes, requests round-robin over 2")
    for row in x["curve"]:
        assert row["failed"] == 0 and len(row["client"]["workers"]) == 2 and len(row["replica_clocks"]) == 2
    assert x["target"]["replicas"] == servers[1]
    started = time.monotonic()
    while time.monotonic() - started < 5 and any(p for p in _workers_alive()):
        time.sleep(0.2)
    assert not _workers_alive()  # the stage ended its workers


def _workers_alive() -> list[int]:
    from llmopt_bench.procs.tree import cmdline

    return [int(p) for p in os.listdir("/proc") if p.isdigit() and "llmopt_bench.client.worker_main" in cmdline(int(p))
            and os.getppid() != int(p)]
