"""The client as several processes on this host: one load point's schedule dealt to N workers,
each an asyncio loop of its own (client/http_load.HTTPLoad on its part), every request's raw
record sent back to the parent, which computes every figure from the merged records as if one
client had sent them (load/point.point_result over all the point's requests).

Why: one Python loop tops out at some hundreds of streamed requests a second (docs/serving.md,
"The client's own ceiling"); past it every latency it reports is its own queue.

How a point runs (LocalWorkers.run):
1. the parent deals the schedule (core/dispatch.Splittable.split: arrival i to worker i mod N,
   a closed loop's users likewise) and sends each worker its part with the prompts it will send
   (texts made in the parent: workers hold no tokenizer);
2. each worker unpickles its part and says so; the parent then names one instant GO_LEAD_S ahead
   and every worker starts its part then (a sleep, then a spin over the last SPIN_S: the start's
   skew is measured and kept, a few microseconds where the host has the cores);
3. each sends back its part (the timelines), its samples, its client's tally, its requests'
   clocks and its loop's lag (client/health.py judges each worker as it judges one loop), its
   send delays; the parent joins the parts (Splittable.join).

Workers are separate interpreters (`python -m llmopt_bench.client.worker_main`, procs/spawn.py), not
multiprocessing's spawn: that one re-runs the parent's main script in every child, which a
user's own script that drives llmopt does not guard against. They talk over two pipes with
multiprocessing's Connection (pickled messages), ignore Ctrl-C (the parent ends them), and end
when the parent's pipe closes. A worker that dies mid-point (killed, out of memory) is named in
WorkerLost, with the others' records kept; the pool is then closed and the next point starts a
fresh one."""

from __future__ import annotations

import os
import pickle
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from llmopt_bench.client.health import RequestClock
from llmopt_bench.client.openai_http import Endpoint, Tally
from llmopt_bench.core.errors import LlmoptError
from llmopt_bench.core.records import RequestSample
from llmopt_bench.measure.timing import now

ONE_PROCESS = "one process"  # the client without workers, as a run states it (settings.client)
GO_LEAD_S = 0.05  # from "every worker has its part" to the start: the go message's way and a wake-up
SPIN_S = 0.002  # the start's last stretch is a spin: a sleep wakes up to a millisecond late
START_TIMEOUT_S = 120.0  # a worker's interpreter up and its imports done (a busy 2-core host: seconds)


class WorkerLost(LlmoptError):
    """A client worker ended mid-point: what it sent is lost, the other workers' records are kept."""


@dataclass(frozen=True)
class WorkerConfig:
    """What every worker of a pool shares: the endpoints (requests round-robin over them), the
    cores, where given (worker k on cpus[k mod len]), and the prompts' texts (workloads/text.
    PromptTexts, its tokenizer with it: a conversation's later turns are made where they are sent)."""

    endpoints: tuple[Endpoint, ...]
    cpus: tuple[int, ...] | None = None
    texts: Any = None
    count_text: Any = None  # the tokenizer's count of a chunk's text (openai_http.TokenCounter), where the stream has no ids


@dataclass
class Job:
    """One worker's part of a point: the part (a Dispatcher), its planned requests' prompts by
    request id (text, or token ids: made in the parent), and which endpoint its round-robin starts at."""

    part: Any
    prompts: dict[str, str | list[int]]
    first_endpoint: int = 0


@dataclass
class WorkerResult:
    """What one worker kept of its part, on its own clock (offset_s: its clock minus the parent's)."""

    name: str
    part: Any
    samples: list[RequestSample]
    tally: Tally
    clocks: list[RequestClock]
    lag: list[float]
    send_delays: dict[str, float]
    sent_to: dict[str, int]
    start_skew_s: float  # its part's first due() after the agreed start
    offset_s: float = 0.0  # applied to its records
    offset_measured: tuple[float, float] | None = None  # a Ray actor's: (offset, within), client/cluster.py


def wait_until(t: float) -> None:
    """Sleep to SPIN_S before t, then spin: a sleep alone wakes up to a millisecond late."""
    ahead = t - now() - SPIN_S
    if ahead > 0:
        time.sleep(ahead)
    while now() < t:
        pass


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "its pipe closed while it still ran"
    if code < 0:
        try:
            return f"killed by signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


class LocalWorkers:
    """n worker processes on this host, started once and reused point after point."""

    def __init__(self, n: int, config: WorkerConfig, log_dir: str | None = None):
        from llmopt_bench.procs.spawn import child_env, start

        self.config = config
        self.procs: list[Any] = []
        self.sends: list[Connection] = []
        self.recvs: list[Connection] = []
        self.pids: list[int] = []
        payload = pickle.dumps(config)
        for k in range(n):
            to_child_r, to_child_w = os.pipe()
            from_child_r, from_child_w = os.pipe()
            argv = [sys.executable, "-m", "llmopt_bench.client.worker_main", str(k), str(to_child_r), str(from_child_w)]
            proc = start(argv, env=child_env(), own_session=False, pass_fds=(to_child_r, from_child_w))
            os.close(to_child_r)
            os.close(from_child_w)
            self.procs.append(proc)
            self.pids.append(proc.pid)
            self.sends.append(Connection(to_child_w, readable=False))
            self.recvs.append(Connection(from_child_r, writable=False))
        for send in self.sends:
            send.send_bytes(payload)
        for k in range(n):
            msg = self._expect(k, START_TIMEOUT_S)
            if msg is None or msg[0] != "ready":
                self.close()
                raise WorkerLost(f"client worker {k} did not start: {msg[1] if msg else _describe_exit(self.procs[k].poll())}",
                                 "run with one client process (client_workers = 1) and see its error")

    @property
    def size(self) -> int:
        return len(self.procs)

    def _expect(self, k: int, timeout_s: float) -> tuple | None:
        """Worker k's next message; None where it ended (or said nothing within the timeout)."""
        if not self.recvs[k].poll(timeout_s):
            return None
        try:
            return self.recvs[k].recv()
        except (EOFError, OSError):
            return None

    def run(self, jobs: Sequence[Job]) -> tuple[list[WorkerResult | None], list[str]]:
        """Each job on its worker (job k on worker k), started together; every result (None for
        a worker lost) and a sentence per worker lost."""
        used = range(len(jobs))
        for k in used:
            self.sends[k].send(("job", jobs[k]))
        lost: dict[int, str] = {}
        for k in used:
            msg = self._expect(k, START_TIMEOUT_S)
            if msg is None or msg[0] != "loaded":
                lost[k] = self._lost(k, msg, jobs[k])
        start = now() + GO_LEAD_S
        for k in used:
            if k not in lost:
                self.sends[k].send(("go", start))
        results: list[WorkerResult | None] = [None] * len(jobs)
        pending = {k for k in used if k not in lost}
        while pending:
            ready = wait([self.recvs[k] for k in pending])
            for k in [k for k in pending if self.recvs[k] in ready]:
                pending.discard(k)
                msg = self._expect(k, 0.0)
                if msg is not None and msg[0] == "done":
                    results[k] = msg[1]
                else:
                    lost[k] = self._lost(k, msg, jobs[k])
        return results, [lost[k] for k in sorted(lost)]

    def _lost(self, k: int, msg: tuple | None, job: Job) -> str:
        proc = self.procs[k]
        if msg is not None and msg[0] == "error":
            why = f"failed: {msg[1].strip().splitlines()[-1]}"
        else:
            try:
                proc.wait(timeout=5.0)
            except Exception:  # noqa: BLE001 - still running: it closed its pipe, say that
                pass
            why = _describe_exit(proc.poll())
        return f"client worker {k} (pid {proc.pid}) ended mid-point, {why}: the records of its {len(job.prompts)} requests are lost"

    def close(self) -> None:
        for send in self.sends:
            try:
                send.send(("stop",))
                send.close()
            except OSError:
                pass
        for proc in self.procs:
            try:
                proc.wait(timeout=10.0)
            except Exception:  # noqa: BLE001 - one that does not stop is killed
                proc.kill()
                proc.wait()
        for recv in self.recvs:
            recv.close()
        self.procs, self.sends, self.recvs = [], [], []
