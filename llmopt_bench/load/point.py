"""A load point: what it is (LoadPoint: the loop, its size, its warm-up) and what it measured
(PointResult), computed from its requests' timelines by point_result(), the one place every load
figure of llmopt is defined (docs/serving.md, "The figures of a load point"):

- measured: the requests that arrived after the warm-up (warmup_s) and past the first
  warmup_requests; every one is awaited, answers after the window's end (the drain) included;
- the window: a duration-bound point's is [start + warmup_s, start + duration_s], its achieved
  rate the arrivals in it over its length; a count-bound point's runs from its first measured
  arrival to its last, n arrivals spanning n - 1 gaps;
- complete: answered with every requested token (where the length is known to be forced); an
  answer that came back short is a failed request ("short: ...");
- output tok/s and QPS: complete requests' tokens and count over the busy window (first submit
  to last token), as analysis/metrics.py defines them for every stage;
- at the window's end: in flight (sent, not answered), queued (arrived, not yet sent: the
  client's own queue), the drain (until the last measured answer);
- send delay: when sent minus when due (open loop);
- steady: the steady-state judgement (load/steady.py) of an open-loop window."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import Field

from llmopt_bench.analysis.metrics import StageMetrics, compute
from llmopt_bench.core.distribution import Distribution
from llmopt_bench.core.errors import UsageError
from llmopt_bench.core.records import RequestSample, StrictModel
from llmopt_bench.load.arrivals import arrival_offsets
from llmopt_bench.load.dispatchers import ClosedLoop, OpenLoop, RequestSource, Timeline
from llmopt_bench.load.steady import Steady, judge_steady


class LoadPoint(StrictModel):
    """One load point: a closed loop (concurrency) or an open loop (rate), bound by a duration
    or a number of requests."""

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
                **kw: Any) -> LoadPoint:
        """An open-loop point at `rate`, long enough that about min_requests arrive after the
        warm-up: a capacity search tries low rates too, where a fixed duration holds few."""
        return cls(rate=rate, duration_s=max(duration_s, warmup_s + min_requests / rate), warmup_s=warmup_s, **kw)

    @property
    def label(self) -> str:
        if self.concurrency is not None:
            return f"concurrency {self.concurrency}"
        shape = "" if self.burstiness == 1.0 else f", burstiness {self.burstiness:g}"
        return f"{self.rate:g} req/s{shape}"

    @property
    def by_duration(self) -> bool:
        return self.duration_s is not None

    def offsets(self) -> list[float]:
        """An open loop's arrival schedule, drawn from its seed."""
        assert self.rate is not None
        return arrival_offsets(self.rate, self.num_requests, self.burstiness, self.seed, self.duration_s)

    def dispatcher(self, source: RequestSource, output_len: int, repeat: int = 0,
                   on_answer: Callable[[int], None] | None = None) -> OpenLoop | ClosedLoop:
        """The loop this point runs, on requests from `source`."""
        self.check()
        if self.rate is not None:
            return OpenLoop(self.offsets(), source, output_len, max_concurrency=self.max_concurrency, repeat=repeat,
                            on_answer=on_answer)
        assert self.concurrency is not None
        return ClosedLoop(self.concurrency, source, output_len, num_requests=self.num_requests, duration_s=self.duration_s,
                          repeat=repeat, on_answer=on_answer)


class PointResult(StrictModel):
    """A load point's measured requests (warm-up left out) and what the load itself did."""

    point: LoadPoint
    samples: list[RequestSample]  # the measured requests, answered after the window's end included
    metrics: StageMetrics | None = None  # over the complete ones (failed_requests: the others)
    warmup_excluded: int
    sent: int  # measured requests
    all_output_tokens: int = 0  # every token the point's requests produced, warm-up included (energy per token)
    completed: int
    failed: int  # measured - completed
    failure_rate: float
    errors: dict[str, int] = Field(default_factory=dict)  # error kind -> count
    window_s: float
    achieved_rate: float | None = None  # measured arrivals per second of the window
    busy_s: float | None = None  # first submit to last token of the complete requests (per repeat: the first's)
    output_tok_s: float | None = None
    qps: float | None = None
    in_flight_at_end: int  # sent, not yet answered, when the window closed
    queued_at_end: int  # arrived, not yet sent (the client's own queue), when it closed
    drain_s: float  # from the window's end until the last measured answer
    send_delay_s: Distribution | None = None  # open loop: sent - due
    steady: Steady | None = None  # open loop: the steady-state judgement

    @property
    def completion_rps(self) -> float | None:
        """Answers a second: over an open loop's later half (steady's figure), else the QPS."""
        return self.steady.completion_rps if self.steady and self.steady.completion_rps is not None else self.qps


def _short(s: RequestSample, expected: int | None) -> RequestSample:
    """An answer with fewer tokens than the forced length is a failed request, said so."""
    if s.ok and expected is not None and s.output_tokens < expected:
        return s.model_copy(update={"ok": False, "error": f"short: {s.output_tokens} of {expected} tokens"})
    return s


def _window(point: LoadPoint, measured: Sequence[Timeline], t0: float) -> tuple[float, float, int]:
    """The window's [start, end] and the number of arrival gaps its achieved rate counts."""
    if point.duration_s is not None:
        return t0 + point.warmup_s, t0 + point.duration_s, len(measured)
    return measured[0].arrival, measured[-1].arrival, len(measured) - 1


def point_result(point: LoadPoint, timelines: Sequence[Timeline], t0: float, expected_tokens: int | None = None) -> PointResult:
    """The point's figures from every request's timeline (the module doc defines each)."""
    start = t0 + point.warmup_s
    measured = [t for t in timelines if t.arrival >= start and t.index >= point.warmup_requests]
    if not measured:
        raise UsageError(f"{point.label}: all {len(timelines)} requests arrived during the warm-up",
                         "lengthen the load point (LoadPoint.at_rate sizes it by requests), or shorten the warm-up")
    forced = expected_tokens is not None  # each request judged against its own length (a plan's vary)
    samples = [_short(t.sample, (t.output_len or expected_tokens) if forced else None) for t in measured if t.sample is not None]
    ok = [s for s in samples if s.ok]
    w_start, w_end, gaps = _window(point, measured, t0)
    window = w_end - w_start
    m = compute(samples)  # rates and latencies over the complete ones; the failed counted
    first = [s for s in ok if s.repeat == ok[0].repeat] if ok else []
    busy = max(s.t_done for s in first) - min(s.t_submit for s in first) if first else None
    open_loop = point.rate is not None
    achieved = gaps / window if window > 0 and gaps > 0 else None
    return PointResult(
        point=point, samples=samples, metrics=m, warmup_excluded=len(timelines) - len(measured), sent=len(measured),
        completed=len(ok), failed=len(measured) - len(ok), failure_rate=(len(measured) - len(ok)) / len(measured),
        errors=dict(Counter((s.error or "").split(":", 1)[0] for s in samples if not s.ok)),
        window_s=window, achieved_rate=achieved, busy_s=busy,
        all_output_tokens=sum(t.sample.output_tokens for t in timelines if t.sample is not None and t.sample.ok),
        output_tok_s=m.output_tok_s if m else None, qps=m.qps if m else None,
        in_flight_at_end=sum(1 for t in timelines if t.sent < w_end < t.answered),
        queued_at_end=sum(1 for t in timelines if t.arrival < w_end < t.sent),
        drain_s=max(0.0, max(t.answered for t in measured) - w_end),
        send_delay_s=Distribution.of([t.sent - t.arrival for t in measured]) if open_loop else None,
        steady=judge_steady(timelines, measured, w_start, w_end, achieved) if open_loop else None)


def combine(results: Sequence[PointResult]) -> PointResult:
    """One point run several times (repeats): every measured request together (rates and
    latencies over them, QPS and tok/s the mean over repeats), the end-of-window figures at
    their worst, the first steady-state verdict that failed (else the first)."""
    if len(results) == 1:
        return results[0]
    samples = [s for r in results for s in r.samples]
    m = compute(samples)
    errors: Counter[str] = Counter()
    for r in results:
        errors.update(r.errors)
    sent, completed = sum(r.sent for r in results), sum(r.completed for r in results)
    steady = next((r.steady for r in results if r.steady and r.steady.ok is False), results[0].steady)
    return results[0].model_copy(update=dict(
        samples=samples, metrics=m, sent=sent, completed=completed, failed=sent - completed,
        failure_rate=(sent - completed) / sent if sent else 0.0, errors=dict(errors),
        warmup_excluded=sum(r.warmup_excluded for r in results), all_output_tokens=sum(r.all_output_tokens for r in results),
        output_tok_s=m.output_tok_s if m else None, qps=m.qps if m else None,
        in_flight_at_end=max(r.in_flight_at_end for r in results), queued_at_end=max(r.queued_at_end for r in results),
        drain_s=max(r.drain_s for r in results), steady=steady))
