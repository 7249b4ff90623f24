"""The parts of the client that issue 47 added, each alone: the server-sent-event splitter
(client/openai_http.SSEEvents, which replaced httpx-sse), the judgement of a client of several
processes (client/health.could_not_time: each worker as one loop), a worker's tally counted in
the point's, and the ceiling's search over rates (client/ceiling.py)."""

from __future__ import annotations

import pytest

from llmopt_bench.client.ceiling import Bounds, RatePoint, search, table
from llmopt_bench.client.health import RequestClock, could_not_time, health_of
from llmopt_bench.client.openai_http import SSEEvents, Tally


def feed_all(chunks: list[bytes]) -> list[str]:
    sse = SSEEvents()
    return [e for c in chunks for e in sse.feed(c)]


def test_events_split_at_blank_lines_whatever_the_reads():
    stream = b'data: {"a": 1}\n\ndata: {"b": 2}\n\n: keep-alive\n\ndata: [DONE]\n\n'
    whole = feed_all([stream])
    assert whole == ['{"a": 1}', '{"b": 2}', "[DONE]"]
    assert feed_all([stream[i:i + 1] for i in range(len(stream))]) == whole  # a byte a read
    assert feed_all([stream[:17], stream[17:40], stream[40:]]) == whole


@pytest.mark.parametrize("eol", [b"\r\n", b"\r"])
def test_events_ended_by_crlf_or_cr_and_fields_the_spec_allows(eol):
    stream = (b"event: x" + eol + b"id: 3" + eol + b"data:first" + eol + b"data: second" + eol + eol + b"retry: 5" + eol + eol)
    chunks = [stream[:9], stream[9:26], stream[26:]]  # a CR at the end of a read: its LF may come next
    assert feed_all(chunks) == ["first\nsecond"]


def health(bursty: bool, n: int = 10, worker: str | None = None):
    clocks = []
    for i in range(n):
        gap = 1e-6 if bursty else 5e-3
        c = RequestClock()
        c.sent, c.request_id = 0.0, f"r{i}"
        for k in range(8):
            c.add(0.01 + k * gap, False)  # no kernel clock: the process's reads
        clocks.append(c)
    return health_of(clocks, [0.0] * 5, [0.0001] * n, worker=worker)


def test_one_worker_that_could_not_time_is_enough_and_is_named():
    good, bad = health(False, worker="local 0"), health(True, n=2, worker="local 1")
    merged = health_of([], [], workers=[good, bad])
    merged = type(merged)(**{**merged.__dict__, "chunks": good.chunks + bad.chunks, "burst_share": 2 / 12,
                             "kernel_clock_share": 0.0})
    why = could_not_time(merged, ttft_p50_s=0.01)
    assert why is not None and "worker local 1:" in why and "worker local 0" not in why
    # the same requests judged as one loop, the burst diluted below the limit by the other worker's
    alone = type(merged)(**{**merged.__dict__, "burst_share": 0.05, "workers": None})
    assert could_not_time(alone, ttft_p50_s=0.01) is None
    assert could_not_time(health_of([], [], workers=[good, health(False, worker="local 1")]), 0.01) is None


def test_a_workers_send_delay_and_clock_are_in_its_health():
    h = health(False, worker="ray 0")
    assert h.send_delay_p99_s == pytest.approx(0.0001) and h.worker == "ray 0"
    c = RequestClock(timed=[1.0, 2.0], read=[1.5, 2.5], since=[None, 1.2], sent=0.5)
    moved = c.shifted(-0.5)
    assert moved.timed == [0.5, 1.5] and moved.read == [1.0, 2.0] and moved.since == [None, 0.7] and moved.sent == 0.0


def test_a_workers_tally_adds_up():
    a, b = Tally(), Tally()
    a.counted_by, a.usage_agreed, a.short = {"token_ids": 3}, 3, [("r1", 2, 4)]
    b.counted_by, b.usage_agreed, b.usage_missing, b.prompt_off_worst = {"token_ids": 2, "chunks": 1}, 2, 1, 0.2
    a.add(b)
    assert a.counted_by == {"token_ids": 5, "chunks": 1} and a.usage_agreed == 5 and a.usage_missing == 1
    assert a.short == [("r1", 2, 4)] and a.prompt_off_worst == 0.2


def fake(limit: float):
    """A client that keeps its send delay p99 at 0.2 ms up to `limit` req/s, then falls behind."""
    def measure(rate: float) -> RatePoint:
        late = 0.0002 if rate <= limit else 0.004
        return RatePoint(rate=rate, requests=int(rate * 3), completed_rps=rate, events_per_s=rate * 100,
                         send_delay_p99_s=late, read_delay_p99_s=0.0001, loop_lag_p99_s=0.0005, failed=0)
    return measure


def test_the_ceiling_is_the_highest_rate_held_found_by_rising_then_halving():
    c = search("1 process", fake(700.0), Bounds(), start_rps=100.0, max_rps=10000.0)
    rates = [p.rate for p in c.points]
    assert rates[:6] == [100.0, 150.0, 225.0, 337.5, 506.25, 759.375]  # x1.5 until 759 misses
    assert len(rates) == 8  # then two halvings between 506 and 759
    assert c.best is not None and 506.25 <= c.best.rate <= 700.0
    assert "send delay p99 4 ms > 1 ms" in (c.stopped_by or "")
    text = table([c], Bounds())
    assert "| 1 process |" in text and "send delay p99 <= 1 ms" in text


def test_a_failed_request_or_a_late_read_misses_and_a_late_server_is_said():
    p = RatePoint(rate=100, requests=300, completed_rps=100, events_per_s=1e4, send_delay_p99_s=0.0001,
                  read_delay_p99_s=0.003, loop_lag_p99_s=0.0, failed=2, server_late_p99_s=0.01).judge(Bounds())
    assert not p.held and "2 requests failed" in p.why and "read delay p99 3 ms > 1 ms" in p.why
    assert "the test server itself ran 10 ms late" in p.why
    none = search("x", lambda r: RatePoint(r, 1, r, r, 0.01, None, None, 0), Bounds(), 100.0, 1000.0)
    assert none.best is None and "none held" in table([none], Bounds())


def test_without_ray_the_ray_path_says_the_pip_command(monkeypatch):
    import sys

    from llmopt_bench.client.cluster import RayWorkers, client_processes
    from llmopt_bench.client.openai_http import Endpoint
    from llmopt_bench.client.workers import WorkerConfig
    from llmopt_bench.core.errors import MissingDependency, UsageError

    config = WorkerConfig((Endpoint("http://127.0.0.1:1", "m"),))
    assert client_processes(3, None, [], config) == {"workers": 3}  # no cluster named: local workers, no Ray needed
    if "ray" in sys.modules or _importable("ray"):
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
        with pytest.raises(UsageError) as e:
            client_processes(2, "env", ["loadgen_a"], config)
        assert "RAY_ADDRESS" in e.value.fix
    monkeypatch.setitem(sys.modules, "ray", None)  # as where it is not installed
    with pytest.raises(MissingDependency) as e:
        RayWorkers("127.0.0.1:6379", [], config)
    assert "pip install 'llmopt-bench[cluster]'" in e.value.fix


def _importable(name: str) -> bool:
    from importlib.util import find_spec

    return find_spec(name) is not None
