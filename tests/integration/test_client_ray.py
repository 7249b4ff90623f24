"""The client's workers as Ray actors (client/cluster.py) on a Ray cluster of two nodes on this
machine, each started with its own custom resource (`ray start --head`, then a second node joined
with `ray start --address`), the way a user names load-generating hosts: one actor placed on
each node by its resource, a load point run on both against the built-in test server, records
back from both, each actor's clock offset measured (0 applied: one host, one monotonic clock).
Skipped where Ray is not installed (pip install 'llmopt-bench[cluster]')."""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import pytest

from llmopt_bench.client.ceiling import start_test_server
from llmopt_bench.client.http_load import HTTPLoad
from llmopt_bench.client.openai_http import Endpoint
from llmopt_bench.client.test_server import MODEL
from llmopt_bench.core.workload import Request
from llmopt_bench.engines.vllm.server import free_port
from llmopt_bench.load.dispatchers import cycled
from llmopt_bench.load.engine import run_point
from llmopt_bench.load.point import LoadPoint
from llmopt_bench.procs.spawn import child_env, kill_session, start

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'llmopt-bench[cluster]'")
pytestmark = pytest.mark.slow

NODES = {"loadgen_a": "head", "loadgen_b": "second"}


def _ray_start(args: list[str], log: Path):
    """`ray start ... --block` in a session of its own: killing the session ends the node whole."""
    cmd = [str(Path(sys.executable).parent / "ray"), "start", "--block", "--num-cpus", "1", "--disable-usage-stats", *args]
    return start(cmd, env=child_env(), own_session=True, log=open(log, "w"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    logs = tmp_path_factory.mktemp("ray")
    temp = tempfile.mkdtemp(prefix="llr", dir="/tmp")  # Ray's socket paths must stay short
    port = free_port()
    address = f"127.0.0.1:{port}"
    head = _ray_start(["--head", "--port", str(port), "--resources", '{"loadgen_a": 1}', "--temp-dir", temp,
                       "--include-dashboard", "false"], logs / "head.log")
    nodes = [head]
    try:
        deadline = time.monotonic() + 240
        while "Ray runtime started" not in (logs / "head.log").read_text():
            assert head.poll() is None and time.monotonic() < deadline, (logs / "head.log").read_text()[-2000:]
            time.sleep(0.5)
        nodes.append(_ray_start(["--address", address, "--resources", '{"loadgen_b": 1}'], logs / "second.log"))
        ray.init(address=address, logging_level="ERROR", log_to_driver=False)
        while sum(1 for n in ray.nodes() if n["Alive"]) < 2:
            assert time.monotonic() < deadline, (logs / "second.log").read_text()[-2000:]
            time.sleep(0.5)
        yield address
    finally:
        ray.shutdown()
        for p in nodes:
            kill_session(p.pid)
            p.wait()


@pytest.fixture(scope="module")
def server():
    proc, url = start_test_server(5.0)
    yield url
    proc.kill()
    proc.wait()


def test_a_point_runs_on_actors_placed_on_both_nodes(cluster, server):
    from llmopt_bench.client.cluster import Placement, RayWorkers
    from llmopt_bench.client.workers import WorkerConfig

    ep = Endpoint(server, MODEL)
    pool = RayWorkers(cluster, [Placement.parse("loadgen_a"), Placement.parse("loadgen_b")], WorkerConfig((ep,)))
    resources = {n["NodeID"]: n["Resources"] for n in ray.nodes() if n["Alive"]}
    # each actor on the node that has its resource: the head and the second node
    assert ["loadgen_a" in resources[w["node_id"]] for w in pool.where] == [True, False]
    assert ["loadgen_b" in resources[w["node_id"]] for w in pool.where] == [False, True]
    eng = HTTPLoad(ep, watch_server=False, cluster=pool)
    requests = [Request(id=f"r{i}", prompt_id=f"p{i}", token_ids=(1, 2, 3, i)) for i in range(16)]
    try:
        for point in (LoadPoint(concurrency=4, num_requests=44, warmup_requests=4), LoadPoint(rate=20.0, duration_s=3.0)):
            res = run_point(eng, point, cycled(requests), 10, expected_tokens=10)
            assert eng.dealt == 2 and res.failed == 0 and res.sent == len(res.samples)
            health = eng.health({s.request_id for s in res.samples})
            assert [w.worker.split(" on ")[0] for w in health.workers] == ["ray 0 [loadgen_a]", "ray 1 [loadgen_b]"]
            assert all(w.requests > 0 for w in health.workers)
            # every chunk timed by the kernel's receive clock in the actors too (Ray installs uvloop where it can)
            assert all(w.kernel_clock_share == 1.0 for w in health.workers), [w.kernel_clock_share for w in health.workers]
            for w in health.workers:  # one host: the offset measured is within its round trip of 0, and 0 is applied
                assert w.clock_offset_s == 0.0 and abs(w.clock_offset_measured_s) <= w.clock_offset_within_s + 0.002
            assert 0.004 < res.metrics.tpot_s.p50 < 0.008  # the server's 5 ms cadence, timed on the actors
        assert "2 Ray actors (loadgen_a, loadgen_b)" in eng.describe()
    finally:
        eng.close()


def test_an_actor_killed_mid_point_is_named_and_a_fresh_one_takes_its_place(cluster, server):
    import threading

    from llmopt_bench.client.cluster import Placement, RayWorkers
    from llmopt_bench.client.workers import WorkerConfig, WorkerLost

    ep = Endpoint(server, MODEL)
    pool = RayWorkers(cluster, [Placement.parse("loadgen_a"), Placement.parse("loadgen_b")], WorkerConfig((ep,)))
    eng = HTTPLoad(ep, watch_server=False, cluster=pool)
    requests = [Request(id=f"k{i}", prompt_id="k", token_ids=(1, 2, 3)) for i in range(4)]
    try:
        victim = pool.actors[1]
        threading.Timer(1.5, ray.kill, (victim,)).start()
        with pytest.raises(WorkerLost) as e:
            run_point(eng, LoadPoint(rate=10.0, duration_s=4.0), cycled(requests), 30, expected_tokens=30)
        assert "client Ray actor 1 [loadgen_b]" in e.value.message and "ended mid-point" in e.value.message
        assert eng.samples and {s.request_id.split(".")[0] for s in eng.samples} == {"k0", "k2"}  # actor 0's share, kept
        again = run_point(eng, LoadPoint(concurrency=2, num_requests=8), cycled(requests), 10, expected_tokens=10)
        assert again.failed == 0 and eng.dealt == 2 and pool.actors[1] is not victim
    finally:
        eng.close()
