"""Load that looks like users, against any async `send(request) -> RequestSample`.

Two shapes, as serving benchmarks have them:
- closed loop at a concurrency: N users, each sends its next request when its last answer ends;
- open loop at a request rate: arrivals on a schedule drawn from a seed (the same seed sends the
  same times), Poisson or gamma with a burstiness knob, whatever the server's state.

Gamma inter-arrival gaps have shape = burstiness and scale = 1 / (rate * burstiness), as
`vllm bench serve` draws them: the mean gap is 1/rate at every burstiness, burstiness 1 is
Poisson (exponential gaps), below 1 the arrivals come in bursts (coefficient of variation
1/sqrt(burstiness)), above 1 they are more even.

A load point runs for a duration and/or a number of requests. Requests that arrive in the first
warmup_s seconds or are among the first warmup_requests are sent but left out of every figure.
Every request sent is awaited (leaving slow ones out would flatter the tail); what was still
queued on the client or in flight at the end of the measurement window is counted, as a sign
the server did not keep up."""

from __future__ import annotations

import asyncio
import itertools
import math
import random
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

from pydantic import Field

from llmopt_bench.analysis.metrics import StageMetrics, compute
from llmopt_bench.core.distribution import Distribution
from llmopt_bench.core.errors import UsageError
from llmopt_bench.core.records import RequestSample, StrictModel
from llmopt_bench.measure.timing import now

R = TypeVar("R")
Send = Callable[[R], Awaitable[RequestSample]]


def interarrival_gaps(rate: float, burstiness: float = 1.0, seed: int = 0) -> Iterator[float]:
    """Endless gaps in seconds between arrivals at `rate` requests/s (see the module doc)."""
    if rate <= 0 or burstiness <= 0:
        raise UsageError(f"arrivals need a positive rate and burstiness (got rate={rate}, burstiness={burstiness})",
                         "pass a request rate > 0 and a burstiness > 0 (1 = Poisson)")
    rng = random.Random(seed)
    while True:
        if burstiness == 1.0:
            yield rng.expovariate(rate)
        elif math.isinf(burstiness):
            yield 1.0 / rate  # evenly spaced: the limit of ever less bursty gamma gaps
        else:
            yield rng.gammavariate(burstiness, 1.0 / (rate * burstiness))


def arrival_times(rate: float, n: int | None = None, burstiness: float = 1.0, seed: int = 0,
                  until_s: float | None = None) -> list[float]:
    """Arrival offsets in seconds, the first at 0: n of them, or all before until_s."""
    if n is None and until_s is None:
        raise UsageError("an arrival schedule needs a number of requests or a duration")
    out, t = [], 0.0
    for gap in interarrival_gaps(rate, burstiness, seed):
        if (n is not None and len(out) >= n) or (until_s is not None and t >= until_s):
            return out
        out.append(t)
        t += gap
    return out  # unreachable: the gaps never end


class LoadPoint(StrictModel):
    """One load point: a closed loop (concurrency) or an open loop (rate)."""

    concurrency: int | None = Field(None, ge=1)
    rate: float | None = Field(None, gt=0)  # requests/s
    burstiness: float = Field(1.0, gt=0)
    max_concurrency: int | None = Field(None, ge=1)  # open loop: more arrivals wait on the client
    duration_s: float | None = Field(None, gt=0)
    num_requests: int | None = Field(None, ge=1)
    warmup_s: float = Field(0.0, ge=0)
    warmup_requests: int = Field(0, ge=0)
    seed: int = 0

    def check(self) -> LoadPoint:
        if (self.concurrency is None) == (self.rate is None):
            raise UsageError("a load point has either a concurrency (closed loop) or a request rate (open loop)",
                             "set exactly one of concurrency and rate")
        if self.duration_s is None and self.num_requests is None:
            raise UsageError("a load point needs a duration or a number of requests", "set duration_s or num_requests")
        if self.duration_s is not None and self.warmup_s >= self.duration_s:
            raise UsageError(f"the warm-up ({self.warmup_s:g} s) leaves nothing of the {self.duration_s:g} s load point",
                             "make warmup_s shorter than duration_s")
        if self.num_requests is not None and self.warmup_requests >= self.num_requests:
            raise UsageError(f"the warm-up ({self.warmup_requests} requests) leaves none of {self.num_requests}",
                             "make warmup_requests smaller than num_requests")
        return self

    @classmethod
    def at_rate(cls, rate: float, duration_s: float, warmup_s: float = 0.0, min_requests: int = 0,
                **kw: object) -> LoadPoint:
        """An open-loop point at `rate`, long enough that about min_requests arrive after the
        warm-up: a capacity search probes low rates too, where a fixed duration holds few."""
        return cls(rate=rate, duration_s=max(duration_s, warmup_s + min_requests / rate), warmup_s=warmup_s, **kw)

    @property
    def label(self) -> str:
        if self.concurrency is not None:
            return f"concurrency {self.concurrency}"
        shape = "" if self.burstiness == 1.0 else f", burstiness {self.burstiness:g}"
        return f"{self.rate:g} req/s{shape}"


class PointResult(StrictModel):
    """A load point's measured requests (warm-up left out) and what the load itself did."""

    point: LoadPoint
    samples: list[RequestSample]
    metrics: StageMetrics | None = None
    warmup_excluded: int
    sent: int  # measured requests sent
    failed: int
    failure_rate: float
    errors: dict[str, int] = Field(default_factory=dict)  # error kind -> count
    window_s: float  # from the first measured arrival to the window's end (the duration, or the last arrival)
    achieved_rate: float | None = None  # measured arrivals per second of the window
    output_tok_s: float | None = None  # measured tokens / (last answer - window start)
    in_flight_at_end: int  # sent, not yet answered, when the window closed
    queued_at_end: int  # arrived, not yet sent (open loop over max_concurrency), when it closed
    drain_s: float  # from the window's end until the last answer
    # open loop: when each request was sent - when it arrived: the client's own lateness, plus the
    # wait for a free slot under max_concurrency
    send_delay_s: Distribution | None = None


@dataclass
class _Record:
    index: int
    arrival: float  # when the request arrived (closed loop: when its user was free)
    t_sent: float = math.nan
    t_answered: float = math.nan
    sample: RequestSample | None = None


async def _send_one(send: Send, requests: Sequence[R], rec: _Record, slots: asyncio.Semaphore | None) -> None:
    request = requests[rec.index % len(requests)]
    if slots is not None:
        await slots.acquire()
    try:
        rec.t_sent = now()
        sample = await send(request)
        rec.t_answered = now()
    finally:
        if slots is not None:
            slots.release()
    cycle = rec.index // len(requests)
    # the prompts repeat when the point needs more requests than there are: ids stay unique
    rec.sample = sample if cycle == 0 else sample.model_copy(update={"request_id": f"{sample.request_id}.{cycle}"})


async def _open_loop(point: LoadPoint, requests: Sequence[R], send: Send, t0: float) -> list[_Record]:
    slots = asyncio.Semaphore(point.max_concurrency) if point.max_concurrency else None
    records, tasks = [], []
    offsets = arrival_times(point.rate, point.num_requests, point.burstiness, point.seed, point.duration_s)
    for i, offset in enumerate(offsets):
        delay = t0 + offset - now()
        if delay > 0:
            await asyncio.sleep(delay)
        rec = _Record(i, t0 + offset)
        records.append(rec)
        tasks.append(asyncio.create_task(_send_one(send, requests, rec, slots)))
    await asyncio.gather(*tasks)
    return records


async def _closed_loop(point: LoadPoint, requests: Sequence[R], send: Send, t0: float) -> list[_Record]:
    records: list[_Record] = []
    counter = itertools.count()

    async def user() -> None:
        while True:
            t = now()
            i = next(counter)
            if (point.num_requests is not None and i >= point.num_requests) or \
                    (point.duration_s is not None and t - t0 >= point.duration_s):
                return
            rec = _Record(i, t)
            records.append(rec)
            await _send_one(send, requests, rec, None)

    await asyncio.gather(*(user() for _ in range(point.concurrency or 1)))
    return sorted(records, key=lambda r: r.index)


async def run_point(point: LoadPoint, requests: Sequence[R], send: Send) -> PointResult:
    """Run one load point; requests are used in order and cycled when the point needs more."""
    point.check()
    if not requests:
        raise UsageError("a load point needs at least one request")
    t0 = now()
    loop = _open_loop if point.rate is not None else _closed_loop
    records = await loop(point, requests, send, t0)
    return summarize(point, records, t0)


def summarize(point: LoadPoint, records: list[_Record], t0: float) -> PointResult:
    start = t0 + point.warmup_s
    measured = [r for r in records if r.arrival >= start and r.index >= point.warmup_requests]
    samples = [r.sample for r in measured if r.sample is not None]
    if not measured:
        raise UsageError(f"{point.label}: all {len(records)} requests arrived during the warm-up",
                         "lengthen the load point (LoadPoint.at_rate sizes it by requests), or shorten the warm-up")
    w_start = min(r.arrival for r in measured)
    w_end = t0 + point.duration_s if point.duration_s is not None else max(r.arrival for r in measured)
    ok = [s for s in samples if s.ok]
    failed = len(samples) - len(ok)
    last = max(r.t_answered for r in measured)
    window = w_end - w_start
    # a duration holds n arrivals; n arrivals that end the window span n - 1 gaps
    gaps = len(measured) if point.duration_s is not None else len(measured) - 1
    tokens = sum(s.output_tokens for s in ok)
    return PointResult(
        point=point, samples=samples, metrics=compute(samples), warmup_excluded=len(records) - len(measured),
        sent=len(measured), failed=failed, failure_rate=failed / len(samples) if samples else 0.0,
        errors=dict(Counter((s.error or "").split(":", 1)[0] for s in samples if not s.ok)),
        window_s=window, achieved_rate=gaps / window if window > 0 and gaps else None,
        output_tok_s=tokens / (last - w_start) if last > w_start and tokens else None,
        in_flight_at_end=sum(1 for r in records if r.t_sent <= w_end < r.t_answered),
        queued_at_end=sum(1 for r in records if r.arrival < w_end < r.t_sent),
        drain_s=max(0.0, last - w_end),
        send_delay_s=Distribution.of([r.t_sent - r.arrival for r in measured]) if point.rate is not None else None)
