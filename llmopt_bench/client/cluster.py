"""The client's workers as Ray actors on the nodes the user names: one load point's schedule
dealt to them as to local workers (client/workers.py), each actor a client process on its node
(client/worker_main.run_job), its records returned raw through Ray's object store.

    pip install 'llmopt-bench[cluster]'      # Ray, on every node, with llmopt itself
    client_cluster = "ray://head:10001"      # or "auto", or a GCS address; None: RAY_ADDRESS
    client_nodes = ["loadgen_a", "loadgen_b", "node:<node id>"]   # one actor each

Placement: an entry names a custom resource a node was started with (`ray start --resources
'{"loadgen_a": 1}'`: the actor asks for a hundredth of it, so one node takes up to a hundred) or,
as "node:ID", a node id (`ray list nodes`); without entries, `client_workers` actors go where Ray
puts them. Actors ask for no CPU: the nodes named are the user's choice, not Ray's.

Clocks: each actor's records are on its own host's clock. Before every point the parent reads
each actor's clock PINGS times and keeps the reading with the shortest round trip: offset = the
actor's reading minus the midpoint of the parent's two (within half that round trip). An actor on
this host reads the same monotonic clock (one boot id): its offset is 0, exactly, and the
measured one is kept beside it; one on another host has its records moved by its offset. Both go
in the worker's health (ClientHealth.clock_offset_s: the one applied)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmopt_bench.client.workers import GO_LEAD_S, Job, WorkerConfig, WorkerResult
from llmopt_bench.core.errors import MissingDependency, UsageError
from llmopt_bench.core.freeform import Json, Kwargs
from llmopt_bench.measure.timing import now

RAY_FIX = "pip install 'llmopt-bench[cluster]'  (Ray, on this host and every node of the cluster)"
PINGS = 7
START_TIMEOUT_S = 180.0  # actors placed and their imports done
RAY_LEAD_S = 0.25  # a Ray call's way to an actor: 0.1-0.7 s on 2 cores at load 20 (a late start is each request's send delay)


def boot_id() -> str:
    """This host's boot: processes with the same one read the same monotonic clock."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


@dataclass
class Placement:
    """Where one actor goes: a custom resource's name, or a node id."""

    resource: str | None = None
    node_id: str | None = None

    @classmethod
    def parse(cls, text: str) -> Placement:
        text = text.strip()
        if not text:
            raise UsageError("an empty entry in client_nodes", "name a node's custom resource (loadgen_a) or a node id (node:ID)")
        if text.startswith("node:"):
            return cls(node_id=text.removeprefix("node:"))
        return cls(resource=text)

    def options(self) -> Kwargs:
        if self.node_id is not None:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            return {"scheduling_strategy": NodeAffinitySchedulingStrategy(self.node_id, soft=False)}
        if self.resource is not None:
            return {"resources": {self.resource: 0.01}}
        return {}

    def __str__(self) -> str:
        return f"node:{self.node_id}" if self.node_id else (self.resource or "anywhere")


class ClientActor:
    """A client worker as a Ray actor (ray.remote(ClientActor) in RayWorkers)."""

    def __init__(self, config: WorkerConfig, name: str):
        import socket

        import aiohttp  # noqa: F401 - the client and its transport, imported now: not after the start of the first point

        import llmopt_bench.client.worker_main  # noqa: F401

        self.config = config
        self.job: Job | None = None
        import ray

        self.where = {"host": socket.gethostname(), "pid": os.getpid(), "boot_id": boot_id(),
                      "node_id": ray.get_runtime_context().get_node_id()}
        self.name = f"{name} on {self.where['host']} (pid {os.getpid()})"

    def describe(self) -> Json:
        return self.where

    def clock(self) -> float:
        return now()

    def load(self, job: Job) -> bool:
        self.job = job
        return True

    def go(self, start_at: float) -> WorkerResult:
        from llmopt_bench.client.worker_main import run_job

        assert self.job is not None
        job, self.job = self.job, None
        return run_job(self.config, job, start_at, self.name)  # its send delays include a late start


def client_processes(workers: int, cluster: str | None, nodes: Sequence[str], config: WorkerConfig) -> Kwargs:
    """HTTPLoad's keyword arguments for the client's processes a serving stage's params ask for:
    `workers` local processes, or (a cluster or nodes named) Ray actors, one on each node named
    (else `workers` of them where Ray puts them). cluster "env": the address in RAY_ADDRESS."""
    if cluster is None and not nodes:
        return {"workers": workers}
    places = [Placement.parse(n) for n in nodes] or [Placement()] * workers
    return {"cluster": RayWorkers(None if cluster in (None, "env") else cluster, places, config)}


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise MissingDependency("the client's Ray workers need Ray, which is not installed", RAY_FIX) from None
    return ray


class RayWorkers:
    """The actors, started once on the cluster at `address` (None: RAY_ADDRESS; "auto": this
    node's cluster) and reused point after point; a pool as client/workers.LocalWorkers is."""

    def __init__(self, address: str | None, placements: Sequence[Placement], config: WorkerConfig):
        ray = _ray()
        address = address or os.environ.get("RAY_ADDRESS")
        if not address:
            raise UsageError("no Ray cluster named for the client's workers",
                             "pass client_cluster (ray://HEAD:10001, HEAD:6379 or auto), or export RAY_ADDRESS")
        self.address, self.placements = address, list(placements)
        root = str(Path(__file__).resolve().parents[2])
        self.joined = not ray.is_initialized()
        if self.joined:
            try:  # the actors import llmopt_bench: installed on every node, or (one host) this checkout
                ray.init(address=address, runtime_env={"env_vars": {"PYTHONPATH": root}}, logging_level="ERROR",
                         log_to_driver=False)
            except (ConnectionError, RuntimeError, ValueError) as e:
                raise UsageError(f"cannot reach the Ray cluster at {address}: {str(e).splitlines()[0][:200]}",
                                 "start it (ray start --head) or name its address (client_cluster, RAY_ADDRESS)") from None
        self._remote, self._config = ray.remote(num_cpus=0, max_restarts=0)(ClientActor), config
        self.lost: set[int] = set()  # actors that ended mid-point: started again before the next
        self.actors = [self._start(k) for k in range(len(self.placements))]
        try:
            ready, waiting = ray.wait([a.describe.remote() for a in self.actors], num_returns=len(self.actors),
                                      timeout=START_TIMEOUT_S)
            if waiting:
                raise UsageError(f"{len(waiting)} of the client's {len(self.actors)} Ray actors were not placed within "
                                 f"{START_TIMEOUT_S:g} s (placements: {', '.join(map(str, self.placements))})",
                                 "check that each named resource or node exists in the cluster (ray status)")
            self.where = ray.get([a.describe.remote() for a in self.actors])
        except ray.exceptions.RayError as e:
            self.close()
            raise UsageError(f"the client's Ray actors did not start: {str(e).splitlines()[0][:300]}",
                             "check that every node has llmopt-bench installed (the same version)") from None
        self.offsets: list[float] = [0.0] * len(self.actors)
        self.measured: list[tuple[float, float]] = [(0.0, 0.0)] * len(self.actors)  # (offset, its uncertainty)

    @property
    def size(self) -> int:
        return len(self.actors)

    def measure_offsets(self) -> None:
        """Each actor's clock minus ours (the reading of least round trip); 0 on this host's boot."""
        ray = _ray()
        mine = boot_id()
        for k, actor in enumerate(self.actors):
            best = None
            for _ in range(PINGS):
                t1 = now()
                theirs = ray.get(actor.clock.remote())
                t2 = now()
                if best is None or t2 - t1 < best[1]:
                    best = (theirs - (t1 + t2) / 2, (t2 - t1) / 2)
            assert best is not None
            self.measured[k] = best
            self.offsets[k] = 0.0 if mine and self.where[k].get("boot_id") == mine else best[0]

    def _start(self, k: int) -> Any:
        p = self.placements[k]
        return self._remote.options(**p.options()).remote(self._config, f"ray {k} [{p}]")

    def run(self, jobs: Sequence[Job]) -> tuple[list[WorkerResult | None], list[str]]:
        ray = _ray()
        for k in sorted(self.lost):  # an actor lost in the point before: a fresh one in its place
            self.actors[k] = self._start(k)
            self.where[k] = ray.get(self.actors[k].describe.remote(), timeout=START_TIMEOUT_S)
        self.lost.clear()
        lost: dict[int, str] = {}
        loads = {k: self.actors[k].load.remote(job) for k, job in enumerate(jobs)}
        for k, ref in loads.items():
            try:
                ray.get(ref, timeout=START_TIMEOUT_S)
            except ray.exceptions.RayError as e:
                lost[k] = self._lost(k, e, jobs[k])
        self.measure_offsets()
        start = now() + GO_LEAD_S + RAY_LEAD_S  # Ray's call takes longer than a pipe's: more lead
        refs = {self.actors[k].go.remote(start + self.offsets[k]): k for k in range(len(jobs)) if k not in lost}
        results: list[WorkerResult | None] = [None] * len(jobs)
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            k = refs[done[0]]
            try:
                r = ray.get(done[0])
                r.offset_s, r.offset_measured = self.offsets[k], self.measured[k]
                results[k] = r
            except ray.exceptions.RayError as e:
                lost[k] = self._lost(k, e, jobs[k])
        return results, [lost[k] for k in sorted(lost)]

    def _lost(self, k: int, e: Exception, job: Job) -> str:
        self.lost.add(k)
        where = self.where[k] if k < len(getattr(self, "where", [])) else {}
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        return (f"client Ray actor {k} [{self.placements[k]}] (host {where.get('host', '?')}, pid {where.get('pid', '?')}) "
                f"ended mid-point ({type(e).__name__}: {first}): the records of its {len(job.prompts)} requests are lost")

    def close(self) -> None:
        """Kill the actors, and leave the cluster where this pool joined it (its driver's threads stop)."""
        ray = _ray()
        for a in getattr(self, "actors", []):
            try:
                ray.kill(a)
            except Exception:  # noqa: BLE001 - an actor already gone
                pass
        self.actors = []
        if getattr(self, "joined", False):
            ray.shutdown()
            self.joined = False
