"""The serving scenario: an engine under load that looks like users, written once for every
engine the load machine drives (load/): vllm-serve and openai-endpoint hand it an HTTP client
(client/http_load.HTTPLoad), and nothing here knows which.

In order: a closed-loop concurrency sweep; the open-loop points asked for; the ceiling (the
workload's requests all at once: what the server can complete a second); the capacity under the
SLO (load/capacity/find.py: from just under the ceiling down to the precision within a budget of seconds
of load, each trial an open-loop point judged in steady state; then held); the throughput point
(N requests at once). Every point is a timed window (energy per point); the headline (the
stage's samples, its row in the metrics table, the "main" energy) is the hold at the capacity,
else the search's trial there, else the sweep point at main_concurrency (default: the largest).

Closed-loop points leave out their ramp (each user's first request, sent all at once);
open-loop points leave out the arrivals of their warm-up. Each point's arrival schedule is
drawn from the run's seed and the rate, so two runs send the same times.

What each point sends is the run's workload plan (load/plans.PlanLoad: the prompt file's
prompts, or a generated kind's requests and conversations, never a prompt twice; a trace scaled
to the point's rate, and replayed once on its own schedule: the "replay" phase). Where the
engine keeps its prefix cache's figures, each row has them (cache), and a multi-turn point its
per-turn table (turns). An HTTP engine's rows also carry the prompts' lengths as the server
counted them (prompt_count) and the server's own clock beside the client's (server_clock),
and the engine is given each point's prompts before it starts (prepare: a text prompt is
made before the point, not while it sends)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from llmopt_bench.analysis.slo import Verdict, client_late
from llmopt_bench.client.health import could_not_time
from llmopt_bench.client.workers import ONE_PROCESS, WorkerLost
from llmopt_bench.core.contract import StageContext
from llmopt_bench.core.errors import LlmoptError, UsageError
from llmopt_bench.core.records import RequestSample, SLOPoint, StageFacts
from llmopt_bench.core.slo import SLO
from llmopt_bench.core.workload import WorkloadConfig
from llmopt_bench.load.capacity.find import find_capacity
from llmopt_bench.load.capacity.params import Ceiling, open_point, planned_cost, trial_of
from llmopt_bench.load.capacity.search import Capacity, Trial
from llmopt_bench.load.engine import LoadEngine, run_plan
from llmopt_bench.load.plans import PlanLoad
from llmopt_bench.load.point import LoadPoint, PointResult
from llmopt_bench.load.record import figures, slo_point, slo_verdict
from llmopt_bench.load.turns import with_requests
from llmopt_bench.scenarios.serving.record import ClientTally, LoadRow, Phase, ServingExtra, ServingParams, ServingSettings
from llmopt_bench.scenarios.serving.rows import count_tally, facts_of, main_key, prompt_count, sent_by
from llmopt_bench.workloads.build import make_plan
from llmopt_bench.workloads.plan import Plan, TokenSpace

KEEP = 10  # error examples kept


class ServerGone(LlmoptError):
    """Every request of a point failed to connect: the server is not there any more."""


def serving_plans(workload: WorkloadConfig, tokenizer: Any, vocab_size: int | None, encode: Callable[[str], list[int]],
                  max_len: int | None, p: ServingParams) -> tuple[Plan, Plan]:
    """The run's workload on this engine (enough of the prompt file's prompts for a point: at
    least requests_per_point, at most 256, cycled beyond), and the throughput point's prompts."""
    space = TokenSpace.of(tokenizer, vocab_size)
    plan = make_plan(workload, space, max_len, encode, count=max(workload.num_prompts, min(p.requests_per_point, 256)))
    tp = workload.model_copy(update={"spec": "fixed", "kind": "fixed", "input_len": p.throughput_input_len,
                                     "max_new_tokens": p.throughput_output_len})
    return plan, make_plan(tp, space, max_len, encode, count=p.throughput_requests)


def closed_point(concurrency: int, requests: int) -> LoadPoint:
    """`requests` measured after the ramp (each user's first request)."""
    return LoadPoint(concurrency=concurrency, num_requests=requests + concurrency, warmup_requests=concurrency)


class ServingRun:
    """Runs the scenario's points on one engine; run() returns the samples, extra and facts.
    expected_tokens: whether an answer short of the forced output length is a failed request
    (the length is forced and the tokens counted exactly: token ids in the stream); else any
    answer counts, and the client's tally keeps the short ones."""

    def __init__(self, engine: LoadEngine, target: Mapping[str, str | None], params: ServingParams, load: PlanLoad,
                 throughput: PlanLoad | None, ctx: StageContext, run_seed: int = 0, expected_tokens: bool = True):
        if params.arrival == "poisson" and params.burstiness != 1.0:
            raise UsageError(f"arrival poisson has burstiness 1 (got {params.burstiness:g})",
                             'set arrival = "gamma" for another burstiness, or drop burstiness')
        self.engine, self.target, self.p, self.ctx, self.seed = engine, dict(target), params, ctx, run_seed
        self.load, self.tp_load = load, throughput
        self.forced = expected_tokens
        self.slo: SLO = params.slo
        self.rows: list[LoadRow] = []
        self.samples: dict[str, list[RequestSample]] = {}
        self.requests: list[RequestSample] = []  # every point's, each with its point: requests.jsonl keeps them (StageRun.requests)
        self.slo_points: list[SLOPoint] = []
        self.tally = ClientTally()
        self.examples: list[str] = []
        self.ceiling = Ceiling()
        self.in_system: float | None = None  # the longest median time in system of a steady point so far
        self.untimed: set[str] = set()  # the points the client could not time (their keys)

    # --- one point ------------------------------------------------------------------------

    def measure(self, phase: Phase, point: LoadPoint, load: PlanLoad | None = None) -> tuple[LoadRow, Verdict | None, PointResult | None]:
        """One load point in its own timed window: its row (kept), the SLO's verdict, the result."""
        load = load or self.load
        key = f"{phase}: {point.label}"
        size = f"{point.num_requests} requests" if point.num_requests else f"{point.duration_s:g} s"
        prepare = getattr(self.engine, "prepare", None)  # outside the point's window: its texts made first
        if prepare is not None:
            prepare(load.prompts(sent_by(point, self.p.requests_per_point)))
        self.ctx.progress(f"{key} ({size})", None, None)
        try:
            with self.ctx.meter.window(key) as window:
                res = run_plan(self.engine, point, load, forced=self.forced)
                window.tokens = res.all_output_tokens
        except (UsageError, WorkerLost) as e:  # a point that cannot run (every arrival in the warm-up), a client worker lost: a row that says so
            row = LoadRow(phase=phase, mode="open" if point.rate else "closed", concurrency=point.concurrency,
                          rate_rps=point.rate, requests=0, completed=0, error=e.message)
            self.rows.append(row)
            return row, None, None
        v = slo_verdict(self.slo, res, self.p.max_failure_rate)
        row = self._row(phase, res, v, key, load)
        self._client_check(row, res)
        self._keep(phase, key, res, v, row)
        return row, v, res

    def _row(self, phase: Phase, res: PointResult, v: Verdict, key: str, load: PlanLoad) -> LoadRow:
        pt = res.point
        input_len, output_len = load.lengths()
        return LoadRow(**figures(res, self.slo), phase=phase, mode="open" if pt.rate is not None else "closed",
                       concurrency=pt.concurrency, rate_rps=pt.rate, burstiness=pt.burstiness if pt.rate is not None else None,
                       input_len=input_len, output_len=output_len, slo_ok=v.ok, slo_reason=v.reason,
                       energy=self.ctx.meter.per_key().get(key),
                       cache=with_requests(getattr(self.engine, "last_cache", None), res.samples),
                       prompt_count=prompt_count(getattr(self.engine, "tally", None)),
                       server_clock=getattr(self.engine, "last_server", None),
                       replica_clocks=getattr(self.engine, "last_servers", None) or None)

    def _client_check(self, row: LoadRow, res: PointResult) -> None:
        """The client's own punctuality over the point's measured requests, and whether it could
        time them at all (client/health.py): a point it could not time is not the server's
        latency (the search does not judge it; no batch-1 fact nor SLO point is taken from it)."""
        health_of = getattr(self.engine, "health", None)  # an HTTP engine's client watches itself
        health = health_of({s.request_id for s in res.samples}) if health_of else None
        if health is not None:
            row.client, row.client_untimed = health, could_not_time(health, row.ttft_p50_s)

    def _keep(self, phase: Phase, key: str, res: PointResult, v: Verdict, row: LoadRow) -> None:
        self.rows.append(row)
        self.samples[key] = res.samples
        for sample in res.samples:
            sample.point = key
        self.requests += res.samples
        if row.client_untimed:
            self.untimed.add(key)
        count_tally(self.tally, getattr(self.engine, "tally", None))
        self.examples += [s.error for s in res.samples if not s.ok and s.error and s.error not in self.examples][:KEEP - len(self.examples)]
        if phase != "throughput":
            self.ceiling.see(res.completion_rps, key, res.point.rate)
            if phase != "ceiling" and (res.steady is None or res.steady.ok):  # all at once: its time in system is the batch's
                self.in_system = max(self.in_system or 0.0, row.e2e_p50_s or 0.0)
        if res.point.rate is not None and phase != "throughput" and not row.client_untimed:  # recommend judges the server's
            self.slo_points.append(slo_point(res, v, hold=phase == "hold"))
        self.ctx.keep_partial({"curve": [r.model_dump(mode="json") for r in self.rows]})
        if res.samples and res.failed == len(res.samples) and set(res.errors) == {"connection"}:
            raise ServerGone(f"every request of {key} failed to connect: {self.examples[-1] if self.examples else ''}",
                             "see the server's log")

    # --- the phases -----------------------------------------------------------------------

    def sweep(self) -> None:
        for c in sorted(set(self.p.concurrency)):
            self.measure("sweep", closed_point(c, max(self.p.requests_per_point, c)))
        for rate in self.p.rates:
            self.measure("point", open_point(rate, self.p, self.seed, self.in_system))
        if self.load.plan.own_schedule:  # a trace: once on its own schedule (its speedup), beside the scaled points
            self.measure("replay", self.load.replay_point(self.p.warmup_s))

    def ceiling_point(self) -> None:
        """What the server can complete: ceiling_requests of the workload's requests at once, their
        completions a second over their busy window. The search starts just under the highest
        completion rate measured (this, the sweep's top)."""
        if self.p.ceiling_requests:
            n = self.p.ceiling_requests
            self.measure("ceiling", LoadPoint(concurrency=n, num_requests=n))

    def trial(self, rate: float, hold_s: float | None = None) -> Trial:
        """One open-loop point of the search (hold_s None) or a hold of hold_s, as the search sees it."""
        phase: Phase = "hold" if hold_s else "search"
        row, v, res = self.measure(phase, open_point(rate, self.p, self.seed, self.in_system, hold_s))
        # a miss under less load than asked is still a miss; only a pass needs the load it asked for;
        # a point the client could not time is neither
        late = row.client_untimed or (client_late(row.queued_at_end, row.requests) if v is not None and v.ok else None)
        return trial_of(res, v, self.slo, rate, kind="hold" if hold_s else "probe", invalid=late, error=row.error)

    def search(self) -> Capacity:
        """The capacity under the SLO (load/capacity/find.py): from just under the ceiling down, within the
        budget, then held; from search_start_rps instead where it is set, or where nothing was
        measured to start under."""
        p = self.p
        ceiling, how = self.ceiling()
        start = p.search_start_rps or (None if ceiling else 1.0)
        return find_capacity(self.trial, ceiling, p.search_budget_s, precision=p.search_precision, hold_s=p.hold_s,
                             hold_attempts=p.hold_attempts, ceiling_how=how, saturation=self.ceiling, estimate=self.estimate,
                             start_rate=start, min_rate=p.search_min_rps, max_rate=p.search_max_rps,
                             max_trials=p.search_max_probes)

    def estimate(self, rate: float, hold_s: float | None) -> float:
        """The seconds of load a trial (or a hold of hold_s) at `rate` will take, as planned."""
        return planned_cost(rate, hold_s, self.p, self.seed, self.in_system)

    def throughput(self) -> None:
        assert self.tp_load is not None
        n = self.p.throughput_requests
        self.measure("throughput", LoadPoint(concurrency=n, num_requests=n), self.tp_load)

    def run(self) -> tuple[list[RequestSample], ServingExtra, StageFacts]:
        self.sweep()
        if self.p.capacity_search:
            self.ceiling_point()
        capacity = self.search() if self.p.capacity_search else None
        if self.p.throughput_point and self.tp_load is not None:
            self.throughput()
        samples, extra, facts = self.result(capacity)
        if extra.main_point is not None and self.ctx.meter is not None:  # the headline's energy is the main point's
            self.ctx.meter.copy(extra.main_point)
        return samples, extra, facts

    def result(self, capacity: Capacity | None) -> tuple[list[RequestSample], ServingExtra, StageFacts]:
        """What the points measured, as a result keeps it: the headline point's samples (main_key),
        the extra and the facts; tune's ServerCapacity keeps its server's so too."""
        main = main_key(self.samples, capacity, self.p, self.untimed)
        errors: dict[str, int] = {}
        for r in self.rows:
            for kind, n in r.errors.items():
                errors[kind] = errors.get(kind, 0) + n
        extra = ServingExtra(target=self.target, settings=self.settings(), curve=self.rows, capacity=capacity,
                             main_point=main, main_untimed=main in self.untimed if main else None, errors=errors,
                             error_examples=self.examples, tally=self.tally)
        facts = facts_of(self.rows, capacity, self.slo_points, self.slo, self.p.max_failure_rate, main)
        return self.samples.get(main, []) if main else [], extra, facts

    def settings(self) -> ServingSettings:
        lengths = self.load.prompt_lengths()
        return {"slo": str(self.slo), "max_failure_rate": self.p.max_failure_rate, "arrival": self.p.arrival,
                "burstiness": self.p.burstiness if self.p.arrival == "gamma" else 1.0, "seed": self.seed,
                "requests_per_point": self.p.requests_per_point, "warmup_s": self.p.warmup_s, "hold_s": self.p.hold_s,
                "output_len": self.load.lengths()[1], "prompt_format": self.p.prompt_format,
                "sampling": self.p.sampling().model_dump(),
                "server_metrics": getattr(self.engine, "watch_server", None),  # read the server's /metrics around each point
                "client": describe() if (describe := getattr(self.engine, "describe", None)) else ONE_PROCESS,
                "workload": self.load.plan.spec, "prompts": self.load.distinct_prompts(),
                "input_tokens": [min(lengths), max(lengths)] if lengths else None,
                "closed_loop_warmup": "each user's first request (the ramp)",
                "open_loop_warmup": f"arrivals in the first {self.p.warmup_s:g} s (at least one time in system)"}
