"""The one place tune meets the capacity search: a server's capacity under the SLO, rung by rung,
through the serving scenario (scenarios/serving/run.ServingRun: each trial an open-loop point judged
in steady state) and the search and hold of load/capacity/find.py: from just under the server's ceiling
(the workload's ceiling_requests at once: what it completes a second) down to a precision, then
held. When the search changes, this module changes, and nothing else in tune does.

A rung continues the search of the rung before: the search's state is its trials, so the short
rung's points count in the precise one, and the hold starts from the precise rung's answer; and
its budget, the seconds of load the stage's search gets (search_budget_s), spent across the
rungs, each with its trial cap besides."""

from __future__ import annotations

import time
from collections.abc import Mapping

from llmopt_bench.core.contract import StageContext
from llmopt_bench.core.records import RequestSample, StageFacts
from llmopt_bench.load.capacity.budget import LoadBudget
from llmopt_bench.load.capacity.find import hold, narrow
from llmopt_bench.load.capacity.search import Capacity, Search
from llmopt_bench.load.engine import LoadEngine
from llmopt_bench.load.plans import PlanLoad
from llmopt_bench.scenarios.serving.record import LoadRow, ServingExtra, ServingParams
from llmopt_bench.scenarios.serving.run import ServingRun, closed_point
from llmopt_bench.tune.record import Rung, RungName


class ServerCapacity:
    """One running server under the trial's load: its start rate, its capacity to a precision,
    then held; and what run.json keeps of it. Its rungs spend one budget, the stage's: seconds
    of load (the load's search_budget_s, load/capacity/budget.py) for every trial and hold, with
    each rung's trial cap besides, so a configuration's search costs what the vllm-serve stage's
    would."""

    def __init__(self, run: ServingRun):
        self.run = run
        self.search: Search | None = None
        self.capacity: Capacity | None = None
        self.start_rps: float | None = None  # where the search starts when no ceiling was measured
        self.budget = LoadBudget(run.p.search_budget_s, run.estimate)

    @classmethod
    def serving(cls, engine: LoadEngine, target: Mapping[str, str | None], params: ServingParams, load: PlanLoad, ctx: StageContext,
                seed: int) -> ServerCapacity:
        """The serving scenario's points on `engine` (an HTTP client of the trial's server)."""
        return cls(ServingRun(engine, target, params, load, None, ctx, seed))

    def start(self, known_rps: float | None, concurrency: int) -> None:
        """Where the search starts: just under the server's ceiling (ceiling_requests of the
        workload at once); where the load asks for no ceiling point, at a capacity already known
        (another configuration's), else at half what a closed loop at `concurrency` completes a second."""
        self.run.ceiling_point()
        if self.run.ceiling()[0] is not None:
            return
        if known_rps:
            self.start_rps = known_rps
            return
        row, _, _ = self.run.measure("sweep", closed_point(concurrency, max(self.run.p.requests_per_point, concurrency)))
        self.start_rps = (row.qps or 2.0) / 2

    def narrow(self, name: RungName, precision: float, point_s: float, probes: int) -> Rung:
        """The capacity to `precision`, with points of at least point_s, in at most `probes` more points."""
        t0 = time.monotonic()
        self.run.p = p = self.run.p.model_copy(update={"min_point_s": point_s, "search_precision": precision})
        before = list(self.search.trials) if self.search else []
        ceiling, how = self.run.ceiling()
        self.search = Search(ceiling, precision, start_rate=None if ceiling else self.start_rps, min_rate=p.search_min_rps,
                             max_rate=p.search_max_rps, ceiling_how=how, saturation=self.run.ceiling)
        self.search.trials = list(before)  # a copy: `before` stays what the rung started from
        self.budget.max_trials = sum(1 for t in self.budget.done if t.kind == "probe") + probes  # this rung's cap
        self.budget.stopped = None
        narrow(self.search, self.run.trial, self.budget, p.hold_s)
        self.capacity = self.search.result()
        return self._rung(name, self.capacity, precision, len(self.search.trials) - len(before), time.monotonic() - t0)

    def hold(self, hold_s: float, attempts: int) -> Rung:
        """The answer run again for hold_s and judged by the same rules; lower after a failed hold."""
        assert self.search is not None
        t0, before = time.monotonic(), len(self.search.trials)
        self.run.p = self.run.p.model_copy(update={"hold_s": hold_s, "hold_attempts": attempts})
        self.capacity = hold(self.search, self.run.trial, self.budget, hold_s, attempts)
        rung = self._rung("held", self.capacity, self.search.precision, len(self.search.trials) - before, time.monotonic() - t0)
        rung.held, rung.hold_s = self.capacity.held, hold_s
        return rung

    def ceiling_rung(self, seconds: float) -> Rung:
        """The screen (rung 0): what the server completed a second, all at once (the start's point)."""
        top, how = self.run.ceiling()
        return Rung(name="ceiling", ceiling_rps=top, probes=1 if top is not None else 0, seconds=round(seconds, 3),
                    notes=[f"the ceiling: {how}"] if how else ["no ceiling measured"])

    def _rung(self, name: RungName, cap: Capacity, precision: float, probes: int, seconds: float) -> Rung:
        row = self.at(cap.capacity_rps)
        return Rung(name=name, capacity_rps=cap.capacity_rps, passing_rps=cap.passing_rps, failing_rps=cap.failing_rps,
                    upper_rps=cap.upper_rps, ceiling_rps=self.run.ceiling()[0],
                    precision=precision, converged=cap.converged, probes=probes, seconds=round(seconds, 3),
                    ttft_p99_s=row.ttft_p99_s if row else None, tpot_p99_s=row.tpot_p99_s if row else None, notes=list(cap.notes))

    def at(self, rate: float | None) -> LoadRow | None:
        """The last point measured at `rate`, a hold before a search trial."""
        rows = [r for r in self.run.rows if rate is not None and r.rate_rps == rate and r.phase in ("hold", "search")]
        return next((r for r in reversed(rows) if r.phase == "hold"), rows[-1] if rows else None)

    def result(self) -> tuple[list[RequestSample], ServingExtra, StageFacts]:
        """The samples, extra and facts a vllm-serve result would keep (scenarios/serving/run.ServingRun.result)."""
        return self.run.result(self.capacity)
