"""The load machine (load/) through the asyncio loop every HTTP client runs
(client/http_load.drive_async) against a small asyncio service: one worker that serves requests
first come, first served, a fixed time each, streaming a token at a time. It is the driver's
bookkeeping that is tested here (who counts, who is excluded, what was left in flight), with
margins that no scheduling jitter can cross; the driver against vLLM's real server is in
tests/integration/test_serving_vllm.py, the arithmetic alone in test_load_point.py."""

from __future__ import annotations

import asyncio

import pytest

from llmopt_bench.client.http_load import drive_async
from llmopt_bench.core.dispatch import Send
from llmopt_bench.core.records import RequestSample
from llmopt_bench.core.workload import Request
from llmopt_bench.load.arrivals import arrival_offsets
from llmopt_bench.load.dispatchers import cycled
from llmopt_bench.load.engine import run_point
from llmopt_bench.load.point import LoadPoint
from llmopt_bench.measure.timing import now

REQUESTS = [Request(id=f"r{i}", prompt_id=f"p{i}", token_ids=(1, 2, 3)) for i in range(3)]


class FifoService:
    """One worker; each request holds it for `tokens` steps of `step_s`."""

    def __init__(self, step_s: float, tokens: int = 4, fail_every: int = 0):
        self.step_s, self.tokens, self.fail_every = step_s, tokens, fail_every
        self.lock = asyncio.Lock()
        self.live = 0
        self.most_live = 0
        self.calls = 0

    async def send(self, r: Send) -> RequestSample:
        self.calls += 1
        call = self.calls
        self.live += 1
        self.most_live = max(self.most_live, self.live)
        t_submit = now()
        times = []
        try:
            async with self.lock:
                for _ in range(self.tokens):
                    await asyncio.sleep(self.step_s)
                    times.append(now())
        finally:
            self.live -= 1
        failed = self.fail_every and call % self.fail_every == 0
        return RequestSample(request_id=r.id, prompt_id=r.prompt_id, prompt_tokens=len(r.token_ids),
                             output_tokens=0 if failed else len(times), t_submit=t_submit, t_first=times[0],
                             t_done=times[-1], token_times=[] if failed else times, ok=not failed,
                             error="timeout: made up by the test service" if failed else None)


class AsyncEngine:
    """The service as an engine of the load machine, through the HTTP client's own loop."""

    def __init__(self, service: FifoService):
        self.service = service

    def drive(self, dispatcher) -> None:
        asyncio.run(drive_async(dispatcher, self.service.send))


def run(point: LoadPoint, service: FifoService):
    return run_point(AsyncEngine(service), point, cycled(REQUESTS), service.tokens)


def test_closed_loop_keeps_concurrency_and_excludes_the_warmup_requests():
    svc = FifoService(step_s=0.001)
    res = run(LoadPoint(concurrency=3, num_requests=12, warmup_requests=3), svc)
    assert svc.calls == 12 and svc.most_live == 3
    assert res.sent == 9 and res.warmup_excluded == 3 and len(res.samples) == 9
    # prompts are cycled; ids stay unique (a suffix per cycle)
    ids = [s.request_id for s in res.samples]
    assert len(set(ids)) == 9 and "r0.1" in ids and "r2.3" in ids
    assert res.failed == 0 and res.failure_rate == 0 and res.metrics.requests == 9
    # the window closes at the last request's start; at most the other users are still busy
    assert res.in_flight_at_end <= 2 and res.queued_at_end == 0
    assert res.send_delay_s is None


def test_open_loop_sends_the_seeded_schedule_and_counts_what_was_left_in_flight():
    # 40 arrivals/s for 1 s into a service that finishes at most 10 a second: a backlog grows
    svc = FifoService(step_s=0.025, tokens=4)
    point = LoadPoint(rate=40.0, duration_s=1.0, warmup_s=0.25, seed=3)
    res = run(point, svc)
    schedule = arrival_offsets(40.0, None, 1.0, 3, until_s=1.0)
    assert svc.calls == len(schedule)
    assert res.sent == sum(1 for t in schedule if t >= 0.25)
    assert res.warmup_excluded == len(schedule) - res.sent
    # at most ~10 of the arrivals were served inside the 1 s window: the rest waited
    assert res.in_flight_at_end >= len(schedule) - 12
    # the window is [warm-up, duration]: its arrivals over its 0.75 s, exactly
    assert res.drain_s > 0.5 and res.achieved_rate == pytest.approx(res.sent / 0.75, rel=1e-9)
    assert res.send_delay_s is not None and res.send_delay_s.n == res.sent


def test_open_loop_max_concurrency_queues_on_the_client():
    svc = FifoService(step_s=0.02, tokens=2)
    res = run(LoadPoint(rate=50.0, num_requests=20, max_concurrency=2, seed=1), svc)
    assert svc.most_live <= 2
    assert res.sent == 20
    # waits for a slot are what the client added: the 20th arrival waited for ~18 requests
    assert res.send_delay_s.max > 0.3
    assert res.queued_at_end + res.in_flight_at_end >= 1


def test_failures_are_counted_by_kind_and_the_point_goes_on():
    svc = FifoService(step_s=0.001, fail_every=4)
    res = run(LoadPoint(concurrency=2, num_requests=16), svc)
    assert svc.calls == 16 and res.sent == 16
    assert res.failed == 4 and res.failure_rate == 0.25 and res.errors == {"timeout": 4}
    assert res.metrics.requests == 12 and res.metrics.failed_requests == 4


def test_a_point_at_a_low_rate_is_stretched_to_hold_its_requests():
    p = LoadPoint.at_rate(0.5, duration_s=6.0, warmup_s=1.0, min_requests=10, seed=2)
    assert p.duration_s == 21.0 and p.warmup_s == 1.0 and p.seed == 2
    assert LoadPoint.at_rate(50.0, duration_s=6.0, warmup_s=1.0, min_requests=10).duration_s == 6.0


def test_a_point_whose_requests_all_fell_in_the_warmup_says_so():
    from llmopt_bench.core.errors import UsageError

    svc = FifoService(step_s=0.001, tokens=1)
    with pytest.raises(UsageError) as e:  # seed 0 at 0.1 req/s: the second arrival comes at 18.6 s
        run(LoadPoint(rate=0.1, duration_s=0.3, warmup_s=0.2), svc)
    assert "during the warm-up" in e.value.message and "at_rate" in e.value.fix
