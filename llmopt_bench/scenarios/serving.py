"""The serving scenario: an OpenAI-compatible server under load that looks like users, written
once for every server (vllm-serve starts one, openai-endpoint is given one).

In order: a closed-loop concurrency sweep; the open-loop points asked for; the capacity under
the SLO (scenarios/slo_search.py: bracket, then bisect, each probe an open-loop point); the
throughput point (N requests at once). Every point is a timed window (energy per point); the
headline (the stage's samples, its row in the metrics table, the "main" energy) is the search's
probe at the capacity, else the sweep point at main_concurrency (default: the largest).

Closed-loop points leave out their ramp (each user's first request, sent all at once);
open-loop points leave out the arrivals of their first warmup_s seconds. Each point's arrival
schedule is drawn from the run's seed and the rate, so two runs send the same times."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from llmopt_bench.analysis.slo import SLO, Verdict, client_late, judge, parse_slo
from llmopt_bench.core.contract import StageContext
from llmopt_bench.core.errors import LlmoptError, UsageError
from llmopt_bench.core.records import RequestSample, SLOPoint, StageFacts
from llmopt_bench.core.workload import Request
from llmopt_bench.engines.openai_http import Endpoint, OpenAIClient, Tally
from llmopt_bench.scenarios.load import LoadPoint, PointResult, run_point
from llmopt_bench.scenarios.serving_record import ClientTally, LoadRow, ServingExtra, ServingParams
from llmopt_bench.scenarios.serving_rows import busy_window, facts_of, load_row, slo_point
from llmopt_bench.scenarios.slo_search import Probe, find_capacity

KEEP = 50  # usage mismatches and short answers kept by example


class ServerGone(LlmoptError):
    """Every request of a point failed to connect: the server is not there any more."""


@dataclass
class Target:
    """The server under load and how to talk to it."""

    endpoint: Endpoint
    prompt_of: Callable[[Request], str | list[int]]  # what is sent: token ids or text
    count_text: Callable[[str], int] | None = None  # token count of streamed text, where the stream has no ids
    description: dict[str, Any] = field(default_factory=dict)  # kind, URL, model, command: the record's target


def seed_for(run_seed: int, rate: float) -> int:
    """A point's arrival seed: the run's seed and the rate, so a rate sends the same schedule every run."""
    return run_seed * 1_000_003 + int(round(rate * 1000))


def open_point(rate: float, p: ServingParams, run_seed: int) -> LoadPoint:
    """An open-loop point long enough for requests_per_point arrivals after the warm-up, within
    [min_point_s, max_point_s]."""
    duration = min(p.max_point_s, max(p.min_point_s, p.warmup_s + p.requests_per_point / rate))
    burst = p.burstiness if p.arrival == "gamma" else 1.0
    return LoadPoint(rate=rate, burstiness=burst, duration_s=duration, warmup_s=min(p.warmup_s, duration / 2),
                     seed=seed_for(run_seed, rate))


def closed_point(concurrency: int, requests: int) -> LoadPoint:
    return LoadPoint(concurrency=concurrency, num_requests=requests + concurrency, warmup_requests=concurrency)


class ServingRun:
    """Runs the scenario's points against one target; run() returns the samples, extra and facts."""

    def __init__(self, target: Target, params: ServingParams, requests: Sequence[Request], max_tokens: int,
                 throughput_requests: Sequence[Request], ctx: StageContext, run_seed: int = 0):
        if params.arrival == "poisson" and params.burstiness != 1.0:
            raise UsageError(f"arrival poisson has burstiness 1 (got {params.burstiness:g})",
                             'set arrival = "gamma" for another burstiness, or drop burstiness')
        self.t, self.p, self.ctx, self.seed = target, params, ctx, run_seed
        self.requests, self.max_tokens, self.tp_requests = list(requests), max_tokens, list(throughput_requests)
        self.slo: SLO = parse_slo(params.slo)
        self.rows: list[LoadRow] = []
        self.samples: dict[str, list[RequestSample]] = {}
        self.slo_points: list[SLOPoint] = []
        self.tally = ClientTally()
        self.examples: list[str] = []

    # --- one point ------------------------------------------------------------------------

    def _drive(self, point: LoadPoint, requests: Sequence[Request], max_tokens: int) -> tuple[PointResult, Tally]:
        async def go() -> tuple[PointResult, Tally]:
            async with OpenAIClient(self.t.endpoint, count_text=self.t.count_text) as client:
                def send(r: Request):
                    prompt = self.t.prompt_of(r)
                    return client.complete(r.id, r.prompt_id, prompt, max_tokens,
                                           prompt_tokens=len(prompt) if isinstance(prompt, list) else None)
                return await run_point(point, requests, send), client.tally
        return asyncio.run(go())

    def measure(self, phase: str, point: LoadPoint, requests: Sequence[Request] | None = None,
                max_tokens: int | None = None) -> tuple[LoadRow, Verdict | None]:
        """One load point in its own timed window: its row (kept), and the SLO's verdict."""
        requests, max_tokens = requests or self.requests, max_tokens or self.max_tokens
        key = f"{phase}: {point.label}"
        size = f"{point.num_requests} requests" if point.num_requests else f"{point.duration_s:g} s"
        self.ctx.progress(f"{key} ({size})", None, None)
        try:
            with self.ctx.meter.window(key) as window:
                res, tally = self._drive(point, requests, max_tokens)
                window.tokens = sum(s.output_tokens for s in res.samples if s.ok)
        except UsageError as e:  # a point that cannot run (every arrival in the warm-up): a row that says so
            row = LoadRow(phase=phase, mode="open" if point.rate else "closed", concurrency=point.concurrency,
                          rate_rps=point.rate, requests=0, completed=0, error=e.message)
            self.rows.append(row)
            return row, None
        window = res.window_s if point.rate is not None else busy_window(res)
        verdict = judge(self.slo, res.samples, window, self.p.max_failure_rate)
        row = load_row(phase, res, verdict, self.ctx.meter.per_key().get(key),
                       len(requests[0].token_ids) if requests else None, max_tokens)
        self.rows.append(row)
        self.samples[key] = res.samples
        self._count(res, tally)
        if point.rate is not None and phase != "throughput":
            self.slo_points.append(slo_point(res, verdict))
        self.ctx.keep_partial({"curve": [r.model_dump(mode="json") for r in self.rows]})
        if res.samples and res.failed == len(res.samples) and set(res.errors) == {"connection"}:
            raise ServerGone(f"every request of {key} failed to connect: {self.examples[-1] if self.examples else ''}",
                             "see the server's log")
        return row, verdict

    def _count(self, res: PointResult, tally: Tally) -> None:
        t = self.tally
        for how, n in tally.counted_by.items():
            t.counted_by[how] = t.counted_by.get(how, 0) + n
        t.usage_agreed += tally.usage_agreed
        t.usage_missing += tally.usage_missing
        t.usage_mismatch_count += len(tally.usage_mismatch)
        t.usage_mismatch += [list(m) for m in tally.usage_mismatch][:KEEP - len(t.usage_mismatch)]
        t.short_count += len(tally.short)
        t.short += [list(s) for s in tally.short][:KEEP - len(t.short)]
        for s in res.samples:
            if not s.ok and s.error and len(self.examples) < 10 and s.error not in self.examples:
                self.examples.append(s.error)

    # --- the phases -----------------------------------------------------------------------

    def sweep(self) -> None:
        for c in sorted(set(self.p.concurrency)):
            self.measure("sweep", closed_point(c, max(self.p.requests_per_point, c)))
        for rate in self.p.rates:
            self.measure("point", open_point(rate, self.p, self.seed))

    def search(self):
        """The capacity under the SLO, from a start rate the sweep suggests."""
        def probe(rate: float) -> Probe:
            row, verdict = self.measure("search", open_point(rate, self.p, self.seed))
            ok = bool(verdict and verdict.ok)
            first = self.slo.targets[0].name
            latency = next((v.value_s for v in verdict.targets if v.target == first), None) if verdict else None
            # a miss under less load than asked is still a miss; only a pass needs the load it asked for
            late = client_late(row.queued_at_end, row.requests) if ok else None
            return Probe(rate=rate, ok=ok, latency_s=latency, invalid=late,
                         detail={"reason": verdict.reason if verdict else row.error, "goodput_rps": row.goodput_rps,
                                 "failure_rate": row.failure_rate,
                                 "backlog_at_end": (row.queued_at_end or 0) + (row.in_flight_at_end or 0),
                                 "achieved_rate": row.achieved_rate, "send_delay_p99_s": row.send_delay_p99_s})

        best_qps = max((r.qps or 0 for r in self.rows if r.phase == "sweep"), default=0)
        start = self.p.search_start_rps or (best_qps / 2 if best_qps else 1.0)
        return find_capacity(probe, start_rate=start, precision=self.p.search_precision, min_rate=self.p.search_min_rps,
                             max_rate=self.p.search_max_rps, max_probes=self.p.search_max_probes)

    def throughput(self) -> None:
        n = len(self.tp_requests)
        self.measure("throughput", LoadPoint(concurrency=n, num_requests=n), self.tp_requests, self.p.throughput_output_len)

    def main_key(self, capacity_rps: float | None) -> str | None:
        """The headline point: the probe at the capacity, else the sweep point at main_concurrency."""
        if capacity_rps is not None:
            key = f"search: {open_point(capacity_rps, self.p, self.seed).label}"
            if key in self.samples:
                return key
        sweep = sorted(set(self.p.concurrency))
        c = self.p.main_concurrency if self.p.main_concurrency in sweep else (sweep[-1] if sweep else None)
        key = f"sweep: concurrency {c}"
        return key if key in self.samples else next(iter(self.samples), None)

    def run(self) -> tuple[list[RequestSample], ServingExtra, StageFacts]:
        self.sweep()
        capacity = self.search() if self.p.capacity_search else None
        if self.p.throughput_point:
            self.throughput()
        main = self.main_key(capacity.capacity_rps if capacity else None)
        if main is not None and self.ctx.meter is not None:
            self.ctx.meter.copy(main)
        errors: dict[str, int] = {}
        for r in self.rows:
            for kind, n in r.errors.items():
                errors[kind] = errors.get(kind, 0) + n
        extra = ServingExtra(target=self.t.description, settings=self.settings(), curve=self.rows, capacity=capacity,
                             main_point=main, errors=errors, error_examples=self.examples, tally=self.tally)
        facts = facts_of(self.rows, capacity, self.slo_points, str(self.slo), self.p.max_failure_rate, main)
        return self.samples.get(main, []) if main else [], extra, facts

    def settings(self) -> dict[str, Any]:
        lengths = [len(r.token_ids) for r in self.requests]
        return {"slo": str(self.slo), "max_failure_rate": self.p.max_failure_rate, "arrival": self.p.arrival,
                "burstiness": self.p.burstiness if self.p.arrival == "gamma" else 1.0, "seed": self.seed,
                "requests_per_point": self.p.requests_per_point, "warmup_s": self.p.warmup_s,
                "output_len": self.max_tokens, "prompt_format": self.p.prompt_format,
                "prompts": len({r.prompt_id for r in self.requests}),
                "input_tokens": [min(lengths), max(lengths)] if lengths else None,
                "closed_loop_warmup": "each user's first request (the ramp)",
                "open_loop_warmup": f"arrivals in the first {self.p.warmup_s:g} s"}
