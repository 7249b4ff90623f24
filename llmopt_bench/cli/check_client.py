"""`llmopt check client`: the client's own ceiling, measured against the built-in test server
(client/test_server.py, no model): the requests and streamed events a second that one client
process, N worker processes and Ray actors sustain before their send delay or read delay passes
its bound (client/ceiling.py), and beside them, where vLLM is installed, `vllm bench serve` and
llmopt's one process saturating the same server at one concurrency (requests a second on the
same cores). docs/serving.md, "The client's own ceiling", shows the table and how it was run."""

from __future__ import annotations

import os
import re
import sys
from dataclasses import replace
from pathlib import Path
from typing import Optional

import typer

from llmopt_bench.cli.check import check_app, cpus
from llmopt_bench.cli.paths import output_file
from llmopt_bench.core.errors import UsageError

PROMPT_TOKENS = 200  # as the measurement: 200 in, 100 out


def _measure(endpoints, tokens: int, point_s: float, warmup_s: float, workers: int = 1, cluster=None, cpus=None):
    """A function that measures one rate on one client configuration (client/ceiling.RatePoint),
    its requests round-robin over the test servers at `endpoints`."""
    from llmopt_bench.client.ceiling import RatePoint, server_stats
    from llmopt_bench.client.http_load import HTTPLoad
    from llmopt_bench.core.workload import Request
    from llmopt_bench.load.dispatchers import cycled
    from llmopt_bench.load.engine import run_point
    from llmopt_bench.load.point import LoadPoint

    requests = [Request(f"c{i}", f"c{i}", tuple(range(1000 + i, 1000 + i + PROMPT_TOKENS))) for i in range(64)]
    engine = HTTPLoad(endpoints[0], replicas=endpoints[1:], watch_server=False, workers=workers, cluster=cluster, worker_cpus=cpus)

    def measure(rate: float) -> RatePoint:
        for e in endpoints:
            server_stats(e.base_url, reset=True)
        point = LoadPoint.at_rate(rate, duration_s=point_s, warmup_s=warmup_s)
        res = run_point(engine, point, cycled(requests), tokens, expected_tokens=tokens)
        health = engine.health({s.request_id for s in res.samples})
        late = [(server_stats(e.base_url) or {}).get("late_p99_s") for e in endpoints]
        ok = [s for s in res.samples if s.ok]
        # the events a second the rate asked of the client: every request's tokens at the schedule's rate
        events = rate * sum(s.output_tokens for s in ok) / len(ok) if ok else None
        return RatePoint(rate=rate, requests=res.sent, completed_rps=res.completion_rps, events_per_s=events,
                         send_delay_p99_s=res.send_delay_s.p99 if res.send_delay_s else None,
                         read_delay_p99_s=health.read_delay_p99_s if health else None,
                         loop_lag_p99_s=max((w.loop_lag_p99_s or 0.0) for w in (health.workers or [health])) if health else None,
                         failed=res.failed, server_late_p99_s=max((x for x in late if x is not None), default=None),
                         workers=engine.dealt)
    return measure, engine


@check_app.command("client")
def client_ceiling(
    endpoint: Optional[str] = typer.Option(None, "--endpoint", help="A running test server (python -m llmopt_bench.client.test_server); default: start one here."),
    interval_ms: float = typer.Option(10.0, "--interval-ms", min=0.0, help="The test server's gap between a stream's events (ms)."),
    tokens: int = typer.Option(100, "--tokens", min=1, help="Events (tokens) each request streams."),
    server_cpus: Optional[str] = typer.Option(None, "--server-cpus", help="Cores of the test servers started here, one server on each, e.g. 1 or 0-3 (the client sends round-robin over them)."),
    client_cpus: Optional[str] = typer.Option(None, "--client-cpus", help="Cores of the client: this process, and worker k on the k-th, e.g. 0 or 2-15 or 2,3,5."),
    workers: int = typer.Option(0, "--workers", min=0, help="Worker processes of the N-workers row (0: one per client core; 1: no such row)."),
    client_cluster: Optional[str] = typer.Option(None, "--client-cluster", help="A Ray cluster for the actors' row (ray://HEAD:10001, HEAD:6379, auto); default: RAY_ADDRESS, else no such row."),
    client_nodes: Optional[str] = typer.Option(None, "--client-nodes", help="Where the Ray actors go, comma-separated: a node's custom resource or node:ID, one actor each."),
    point_s: float = typer.Option(4.0, "--point-s", min=1.0, help="Seconds of arrivals at each rate."),
    warmup_s: float = typer.Option(1.0, "--warmup-s", min=0.0, help="Arrivals left out at each point's start (s)."),
    start_rps: float = typer.Option(100.0, "--start-rps", min=1.0, help="The first rate tried (req/s); it rises by 1.5x while it holds."),
    max_rps: float = typer.Option(20000.0, "--max-rps", min=1.0, help="The highest rate tried (req/s)."),
    send_delay_ms: float = typer.Option(1.0, "--send-delay-ms", min=0.0, help="Bound on the send delay p99 (ms)."),
    read_delay_ms: float = typer.Option(1.0, "--read-delay-ms", min=0.0, help="Bound on the read delay p99 (ms)."),
    vllm: bool = typer.Option(True, "--vllm/--no-vllm", help="Beside it, vllm bench serve and llmopt's one process saturating the server (LLMOPT_VLLM_PYTHON)."),
    concurrency: int = typer.Option(64, "--concurrency", min=1, help="The saturated comparison's concurrency."),
    rounds: int = typer.Option(3, "--rounds", min=1, help="The saturated comparison's rounds, the two clients alternating."),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer", help="vllm bench serve's tokenizer for its random prompts (default: the synthetic tiny model's)."),
    kernel_clock: bool = typer.Option(True, "--kernel-clock/--no-kernel-clock", help="Time each event by the kernel's receive clock (default), or when read: the cheaper record."),
    json_out: Optional[str] = typer.Option(None, "--json", help="Also write every point measured to this JSON file."),
) -> None:
    """The client's own ceiling: requests and streamed events a second before it, not the server, sets the latency."""
    from llmopt_bench.client.ceiling import Bounds, search, start_test_server, table, write_json
    from llmopt_bench.client.openai_http import Endpoint
    from llmopt_bench.client.test_server import MODEL

    s_cpus, c_cpus = _check(endpoint, server_cpus, client_cpus, point_s, warmup_s, start_rps, max_rps)
    if json_out:
        output_file(Path(json_out), "--json", "ceiling.json")
    bounds = Bounds(send_delay_ms / 1e3, read_delay_ms / 1e3)
    procs, urls = [], [endpoint] if endpoint else []
    ceilings = []
    try:
        for cpu in (s_cpus or (None,)) if endpoint is None else ():
            proc, url = start_test_server(interval_ms, cpus=(cpu,) if cpu is not None else None)
            procs.append(proc)
            urls.append(url)
            _say(f"test server at {url} ({interval_ms:g} ms between events{f', core {cpu}' if cpu is not None else ''})")
        if c_cpus:
            os.sched_setaffinity(0, set(c_cpus))  # this process, and what it starts, on the client's cores
        n = workers or len(c_cpus or os.sched_getaffinity(0))
        eps = [Endpoint(u, MODEL, force_length=True, request_timeout_s=120.0, kernel_clock=kernel_clock) for u in urls]
        ep = eps[0]
        for name, kw in _configs(eps, n, c_cpus, client_cluster, client_nodes):
            measure, engine = _measure(eps, tokens, point_s, warmup_s, **kw)
            try:
                ceilings.append(search(name, measure, bounds, start_rps, max_rps, _say))
            finally:
                engine.close()
                if kw.get("cluster") is not None:
                    kw["cluster"].close()
        extra: dict = {"servers": {"urls": urls, "interval_ms": interval_ms, "tokens": tokens, "cpus": server_cpus},
                       "client_cpus": client_cpus, "load_average": os.getloadavg()}
        print(table(ceilings, bounds))
        if vllm:
            extra["saturated"] = _saturated(ep, bool(procs), s_cpus[:1] if s_cpus else None, tokens, concurrency, tokenizer,
                                            c_cpus, rounds)
        if json_out:
            write_json(json_out, ceilings, bounds, extra)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)  # progress to stderr, the tables to stdout


def _check(endpoint, server_cpus, client_cpus, point_s, warmup_s, start_rps, max_rps):
    """The options that depend on each other, checked before anything starts; the cores named."""
    if warmup_s >= point_s:
        raise UsageError(f"--warmup-s {warmup_s:g} leaves nothing of --point-s {point_s:g}", "make --warmup-s shorter than --point-s")
    if start_rps > max_rps:
        raise UsageError(f"--start-rps {start_rps:g} is above --max-rps {max_rps:g}", "lower --start-rps or raise --max-rps")
    s_cpus, c_cpus = cpus(server_cpus, "--server-cpus"), cpus(client_cpus, "--client-cpus")
    if endpoint and s_cpus:
        raise UsageError("--server-cpus is for the test server started here, not one at --endpoint", "drop one of them")
    if endpoint and not re.match(r"^https?://", endpoint):
        raise UsageError(f"--endpoint {endpoint}: not an http(s) URL", "write --endpoint http://HOST:PORT")
    if endpoint:
        from llmopt_bench.client.ceiling import server_stats

        if server_stats(endpoint) is None:
            raise UsageError(f"--endpoint {endpoint}: no llmopt test server answers there (GET /stats)",
                             "start one: python -m llmopt_bench.client.test_server --port 8100, or leave --endpoint out")
    return s_cpus, c_cpus


def _configs(eps, n: int, c_cpus, client_cluster: str | None, client_nodes: str | None) -> list[tuple[str, dict]]:
    """The client configurations measured: one process, n workers (n > 1), the Ray actors (a cluster named)."""
    configs: list[tuple[str, dict]] = [("1 process", {})]
    if n > 1:
        configs.append((f"{n} worker processes", {"workers": n, "cpus": c_cpus}))
    address = client_cluster or os.environ.get("RAY_ADDRESS")
    if address:
        from llmopt_bench.client.cluster import Placement, RayWorkers
        from llmopt_bench.client.workers import WorkerConfig

        places = [Placement.parse(x) for x in (client_nodes or "").split(",") if x.strip()] or [Placement()] * max(n, 1)
        _say(f"starting {len(places)} Ray actors on {address}")
        configs.append((f"{len(places)} Ray actors ({', '.join(map(str, places))})",
                        {"cluster": RayWorkers(address, places, WorkerConfig(tuple(eps)))}))
    return configs


def _saturated(ep, own_server: bool, s_cpus, tokens: int, concurrency: int, tokenizer: str | None, cpus, rounds: int) -> dict:
    """llmopt's one process and `vllm bench serve` at one concurrency against the same server, on the
    same cores: requests and tokens a second each (the issue's comparison, per core). Against a
    test server of its own that streams as fast as it writes (where this command started the other)."""
    from llmopt_bench.client.ceiling import saturated_table, start_test_server

    if not own_server:
        out = _saturate(ep, tokens, concurrency, tokenizer, cpus, "the server at --endpoint, at its own pace", rounds)
    else:
        proc, url = start_test_server(0.0, cpus=s_cpus)  # it sets its own cores (--cpus), whatever ours are
        try:
            out = _saturate(replace(ep, base_url=url), tokens, concurrency, tokenizer, cpus,
                            "a test server that streams as fast as it writes", rounds)
        finally:
            proc.kill()
            proc.wait()
    print()
    print(saturated_table(out))
    return out


def _saturate(ep, tokens: int, concurrency: int, tokenizer: str | None, cpus, server: str, rounds: int) -> dict:
    """The two clients in alternating rounds (a shared host's load moves between them): each
    round's requests a second, and their medians."""
    import resource
    from statistics import median

    from llmopt_bench.client.http_load import HTTPLoad
    from llmopt_bench.core.workload import Request
    from llmopt_bench.load.dispatchers import cycled
    from llmopt_bench.load.engine import run_point
    from llmopt_bench.load.point import LoadPoint

    n = max(1500, concurrency * 8)
    requests = [Request(f"s{i}", f"s{i}", tuple(range(1000 + i, 1000 + i + PROMPT_TOKENS))) for i in range(64)]
    engine = HTTPLoad(ep, watch_server=False)
    ours, theirs = [], []
    for k in range(rounds):
        before = resource.getrusage(resource.RUSAGE_SELF)
        res = run_point(engine, LoadPoint(concurrency=concurrency, num_requests=n, warmup_requests=concurrency),
                        cycled(requests), tokens, expected_tokens=tokens)
        after = resource.getrusage(resource.RUSAGE_SELF)
        cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
        ours.append({"req_s": res.qps, "tok_s": res.output_tok_s, "failed": res.failed,
                     "req_per_cpu_s": res.completed / cpu if cpu > 0 else None})
        _say(f"round {k + 1}: llmopt, 1 process, concurrency {concurrency}: {res.qps or 0:.0f} req/s")
        theirs.append(_vllm_bench(ep, tokens, concurrency, n, tokenizer))
        if theirs[-1].get("error"):
            break

    def summary(runs: list[dict]) -> dict:
        ok = [r for r in runs if r.get("req_s")]
        if not ok:
            return runs[-1] if runs else {"error": "not run"}
        per_cpu = [r["req_per_cpu_s"] for r in ok if r.get("req_per_cpu_s")]
        return {"req_s": median(r["req_s"] for r in ok), "tok_s": median(r["tok_s"] for r in ok),
                "req_per_cpu_s": median(per_cpu) if per_cpu else None,
                "failed": sum(r.get("failed", 0) for r in ok), "rounds": [round(r["req_s"], 1) for r in ok],
                "rounds_per_cpu_s": [round(x) for x in per_cpu]}
    return {"concurrency": concurrency, "requests": n, "cores": list(cpus) if cpus else None, "server": server,
            "llmopt": {**summary(ours), "record": "kernel receive times" if ep.kernel_clock else "times on read (--no-kernel-clock)"},
            "vllm": summary(theirs)}


def _vllm_bench(ep, tokens: int, concurrency: int, n: int, tokenizer: str | None) -> dict:
    """`vllm bench serve` on the same server (its random dataset; the one runner,
    scenarios/peer/bench_serve.BenchServe), with the CPU seconds of its load alone."""
    import tempfile

    from llmopt_bench.engines.vllm.server import vllm_python
    from llmopt_bench.procs.interpreters import look
    from llmopt_bench.scenarios.peer.bench_serve import BenchServe, random_args

    python = vllm_python()
    if "vllm" not in look(python, ("vllm",)).modules:
        return {"error": f"no vLLM in {python}: set LLMOPT_VLLM_PYTHON to vLLM's interpreter, or pass --no-vllm"}
    if tokenizer is None:
        from llmopt_bench.checkpoints.prepare import prepare
        from llmopt_bench.core.models import parse_model

        tokenizer = str(prepare(parse_model("synthetic:tiny")).path)
    _say(f"vllm bench serve, concurrency {concurrency}, {n} requests")
    with tempfile.TemporaryDirectory() as d:
        with BenchServe(Path(d) / "bench.log") as bench:
            done = bench.run(random_args(ep.base_url, ep.model, PROMPT_TOKENS, tokens, n, tokenizer=tokenizer,
                                         concurrency=concurrency), Path(d) / "run", timeout_s=1800)
    if done.error or not done.result:
        return {"error": done.error or "vllm bench serve saved no result"}
    r = done.result
    completed = int(r.get("completed") or 0)
    return {"req_s": r.get("request_throughput"), "tok_s": r.get("output_throughput"), "failed": n - completed,
            "req_per_cpu_s": completed / done.cpu_s if done.cpu_s else None}
