"""A client worker process (client/workers.py starts it): its config, then one point's part after
another, each run by client/http_load.HTTPLoad from the agreed instant, its records sent back raw.

    python -m llmopt_bench.client.worker_main K FD_IN FD_OUT   (the parent's pipes)"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import traceback
from multiprocessing.connection import Connection

from llmopt_bench.client.http_load import HTTPLoad
from llmopt_bench.client.workers import Job, WorkerConfig, WorkerResult


def run_job(config: WorkerConfig, job: Job, start_at: float, name: str) -> WorkerResult:
    """One worker's part of a point, in this process: from start_at (this process's clock) to its end."""
    load = HTTPLoad(config.endpoints[0], replicas=list(config.endpoints[1:]), watch_server=False, texts=config.texts,
                    count_text=config.count_text,
                    given=job.prompts, first_endpoint=job.first_endpoint, start_at=start_at)
    load.drive(job.part)
    view = load.views[0]
    return WorkerResult(name=name, part=job.part, samples=load.samples, tally=load.tally, clocks=view.clocks, lag=view.lag,
                        send_delays=view.send_delays, sent_to=load.sent_to, start_skew_s=view.start_skew_s or 0.0)


def _serve(k: int, recv: Connection, send: Connection) -> None:
    """A worker's life: its config, then one job after another until "stop" or the pipe closes."""
    config: WorkerConfig = pickle.loads(recv.recv_bytes())
    if config.cpus:
        os.sched_setaffinity(0, {config.cpus[k % len(config.cpus)]})
    import aiohttp  # noqa: F401 - the client's transport, imported now: not after the start of the first point

    send.send(("ready", os.getpid()))
    while True:
        try:
            msg = recv.recv()
        except (EOFError, OSError):
            return
        if msg[0] == "stop":
            return
        job: Job = msg[1]
        send.send(("loaded",))
        try:
            go = recv.recv()
        except (EOFError, OSError):
            return
        try:
            result = run_job(config, job, go[1], f"local {k} (pid {os.getpid()})")
            send.send(("done", result))
        except Exception:  # noqa: BLE001 - the parent says which worker failed and why
            send.send(("error", traceback.format_exc()))


def main(argv: list[str]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it ends the workers
    k, fd_in, fd_out = (int(a) for a in argv)
    _serve(k, Connection(fd_in, writable=False), Connection(fd_out, readable=False))


if __name__ == "__main__":
    main(sys.argv[1:])
