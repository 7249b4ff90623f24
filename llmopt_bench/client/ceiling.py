"""The client's own ceiling: how many requests and streamed events a second one client process,
N processes and the Ray actors sustain against the test server (client/test_server.py: no model,
a fixed cadence) before the client, not the server, is what the latencies measure.

A configuration holds a rate when, over the point's measured requests: the send delay p99 (sent
minus due: the schedule kept) is within its bound, the read delay p99 (kernel receive to the
client's read: client/health.py) within its bound, and every request completed with all its
tokens. (Whether answers keep up with arrivals is the server's question: a client that falls
behind shows it in its send delay first.) The rate rises by STEP until one
of them fails, then the step between the last held rate and the failed one is halved REFINE
times; the ceiling is the highest rate held. The test server judges itself too: a point where it
wrote its events over SERVER_LATE_S late (p99) was the server's, not the client's, and the
table says so.

`llmopt check client` (cli/check_client.py) runs it; docs/serving.md, "The client's own
ceiling", has the table of this host and the command for a GPU host. This module knows nothing
of the load machine: the command hands it a function that measures one rate."""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from llmopt_bench.core.errors import UsageError
from llmopt_bench.core.freeform import Json

STEP = 1.5  # the rate's rise while it holds
REFINE = 2  # halvings of the step between the last rate held and the first missed
SERVER_LATE_S = 0.002  # the test server's own lateness (p99) past which a point is the server's


@dataclass
class Bounds:
    send_delay_p99_s: float = 0.001
    read_delay_p99_s: float = 0.001


@dataclass
class RatePoint:
    """One rate measured on one configuration (times in seconds)."""

    rate: float  # asked: held, every request sent within the bound and complete, it is what the client delivered
    requests: int
    completed_rps: float | None  # answers a second over the window's later half (a short point's drain lowers it)
    events_per_s: float | None  # the rate times each request's events
    send_delay_p99_s: float | None
    read_delay_p99_s: float | None
    loop_lag_p99_s: float | None
    failed: int
    server_late_p99_s: float | None = None
    workers: int = 1
    held: bool = False
    why: str | None = None  # the bound it missed

    def judge(self, bounds: Bounds) -> RatePoint:
        misses = []
        if self.failed:
            misses.append(f"{self.failed} requests failed")
        if self.send_delay_p99_s is None or self.send_delay_p99_s > bounds.send_delay_p99_s:
            misses.append(f"send delay p99 {_ms(self.send_delay_p99_s)} > {_ms(bounds.send_delay_p99_s)}")
        if self.read_delay_p99_s is not None and self.read_delay_p99_s > bounds.read_delay_p99_s:
            misses.append(f"read delay p99 {_ms(self.read_delay_p99_s)} > {_ms(bounds.read_delay_p99_s)}")
        self.held = not misses
        self.why = "; ".join(misses) or None
        if self.server_late_p99_s is not None and self.server_late_p99_s > SERVER_LATE_S:
            self.why = (self.why + "; " if self.why else "") + \
                f"the test server itself ran {_ms(self.server_late_p99_s)} late (p99): give it a core of its own"
        return self


@dataclass
class Ceiling:
    """One configuration's search: every rate tried, in order, and the highest held."""

    config: str
    points: list[RatePoint] = field(default_factory=list)

    @property
    def best(self) -> RatePoint | None:
        held = [p for p in self.points if p.held]
        return max(held, key=lambda p: p.rate) if held else None

    @property
    def stopped_by(self) -> str | None:
        best = self.best
        above = [p for p in self.points if not p.held and (best is None or p.rate > best.rate)]
        return min(above, key=lambda p: p.rate).why if above else None


def search(config: str, measure: Callable[[float], RatePoint], bounds: Bounds, start_rps: float, max_rps: float,
           progress: Callable[[str], None] = lambda _: None) -> Ceiling:
    """Rates from start_rps up by STEP while they hold (at most max_rps), then REFINE halvings."""
    out = Ceiling(config)

    def run(rate: float) -> bool:
        p = measure(rate).judge(bounds)
        out.points.append(p)
        progress(f"{config}: {rate:.0f} req/s {'held' if p.held else 'missed: ' + (p.why or '')}")
        return p.held

    rate, held, missed = start_rps, None, None
    while rate <= max_rps:
        if run(rate):
            held, rate = rate, rate * STEP
        else:
            missed = rate
            break
    if held is None or missed is None:
        return out
    for _ in range(REFINE):
        mid = (held + missed) / 2
        if run(mid):
            held = mid
        else:
            missed = mid
    return out


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.3g} ms"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def table(ceilings: Sequence[Ceiling], bounds: Bounds) -> str:
    """The ceiling table (markdown): the highest rate each configuration held, and why it stopped."""
    lines = [f"| client | req/s held | events/s | send delay p99 | read delay p99 | loop lag p99 | stopped by "
             f"(send delay p99 <= {_ms(bounds.send_delay_p99_s)}, read delay p99 <= {_ms(bounds.read_delay_p99_s)}) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for c in ceilings:
        b = c.best
        if b is None:
            first = c.points[0] if c.points else None
            lines.append(f"| {c.config} | none held | - | - | - | - | {first.why if first else 'not measured'} |")
            continue
        lines.append(f"| {c.config} | {_num(b.rate)} | {_num(b.events_per_s)} | {_ms(b.send_delay_p99_s)} | "
                     f"{_ms(b.read_delay_p99_s)} | {_ms(b.loop_lag_p99_s)} | {c.stopped_by or 'the highest rate asked (max_rps)'} |")
    return "\n".join(lines)


def write_json(path: str, ceilings: Sequence[Ceiling], bounds: Bounds, extra: Json) -> None:
    with open(path, "w") as f:
        json.dump({"bounds": asdict(bounds), **extra,
                   "ceilings": [{"config": c.config, "best": asdict(c.best) if c.best else None,
                                 "points": [asdict(p) for p in c.points]} for c in ceilings]}, f, indent=1)


def server_stats(url: str, reset: bool = False) -> Json | None:
    """The test server's /stats (None: not a test server, or not reachable)."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/stats" + ("?reset=1" if reset else ""), timeout=5) as r:
            return json.loads(r.read())
    except (OSError, ValueError):
        return None


def start_test_server(interval_ms: float, first_ms: float | None = None, cpus: Sequence[int] | None = None,
                      timeout_s: float = 60.0) -> tuple[Any, str]:
    """The test server in a child process of this session, started through procs/spawn.py like
    every child (on `cpus` where given), its output in a log file: (process, its URL)."""
    import tempfile

    from llmopt_bench.procs import spawn

    argv = [sys.executable, "-m", "llmopt_bench.client.test_server", "--port", "0", "--interval-ms", f"{interval_ms:g}"]
    if first_ms is not None:
        argv += ["--first-ms", f"{first_ms:g}"]
    if cpus:
        argv += ["--cpus", ",".join(map(str, cpus))]
    log = tempfile.NamedTemporaryFile(prefix="llmopt-test-server-", suffix=".log", delete=False)
    proc = spawn.start(argv, log=log, env=spawn.child_env(), own_session=False, own_group=True)
    deadline, said = time.monotonic() + timeout_s, ""
    while time.monotonic() < deadline and proc.poll() is None:
        said = Path(log.name).read_text(errors="replace")
        if "listening on " in said:
            return proc, said.split("listening on ", 1)[1].split()[0]
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    raise UsageError(f"the test server did not start: {said.strip()[-200:] or 'no output'} (its log: {log.name})",
                     "run python -m llmopt_bench.client.test_server --port 0 and see its error")


def saturated_table(s: Json) -> str:
    """llmopt's one process beside `vllm bench serve`, saturating the test server at one concurrency."""
    def row(name: str, r: Json) -> str:
        if r.get("error"):
            return f"| {name} | - | - | - | {r['error']} |"
        each = f"; rounds {', '.join(f'{x:,.0f}' for x in r['rounds'])} req/s" if r.get("rounds") else ""
        each += f", {', '.join(f'{x:,.0f}' for x in r['rounds_per_cpu_s'])} per CPU-s" if r.get("rounds_per_cpu_s") else ""
        return (f"| {name} | {_num(r.get('req_s'))} | {_num(r.get('req_per_cpu_s'))} | {_num(r.get('tok_s'))} | "
                f"{r.get('failed', 0)} failed{each} |")
    ratio = None
    if (s.get("llmopt") or {}).get("req_per_cpu_s") and (s.get("vllm") or {}).get("req_per_cpu_s"):
        ratio = s["vllm"]["req_per_cpu_s"] / s["llmopt"]["req_per_cpu_s"]
    cores = f" on cores {','.join(map(str, s['cores']))}" if s.get("cores") else ""
    return "\n".join([f"Saturated, concurrency {s['concurrency']}, {s['requests']} requests{cores}, {s.get('server', '')}"
                      + (f": vllm bench serve / llmopt = {ratio:.2f}x requests per CPU-second (medians)" if ratio else ""),
                      "| client | req/s | req per CPU-second | events/s | |", "| --- | ---: | ---: | ---: | --- |",
                      row(f"llmopt, 1 process ({(s.get('llmopt') or {}).get('record', '')})", s.get("llmopt") or {}),
                      row("vllm bench serve", s.get("vllm") or {})])
