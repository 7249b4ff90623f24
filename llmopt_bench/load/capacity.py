"""The capacity search as a stage runs it, on any engine: its params, the size of each trial
(long enough to see a queue form), a trial from a measured point, and the saturation ceiling.
The search itself is load/search.py, the hold load/hold.py; a scenario gives them a function
that measures one open-loop point (serving: scenarios/serving.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from llmopt_bench.analysis.slo import DEFAULT_SLO, SLO, Verdict
from llmopt_bench.core.records import StrictModel
from llmopt_bench.load.point import LoadPoint, PointResult
from llmopt_bench.load.search import Trial
from llmopt_bench.load.steady import WINDOW_E2E

SIZE_MARGIN = 1.2  # a trial's window is sized for this many times WINDOW_E2E x the time in system seen so far


class SearchParams(StrictModel):
    """Open-loop points and the capacity under the SLO (defaults: docs/serving.md)."""

    arrival: Literal["poisson", "gamma"] = "poisson"
    burstiness: float = Field(1.0, gt=0)  # gamma's shape: < 1 bursty, 1 Poisson, > 1 even
    requests_per_point: int = Field(64, ge=2)  # measured requests per load point (warm-up left out)
    warmup_s: float = Field(2.0, ge=0)  # open loop: arrivals in the first warmup_s seconds are not measured
    min_point_s: float = Field(10.0, gt=0)  # open loop: a point lasts at least this long...
    max_point_s: float = Field(120.0, gt=0)  # ...and at most this long (fewer requests at very low rates)
    slo: str = DEFAULT_SLO  # MLPerf Inference's Server limits for Llama-3.1-8B (analysis/slo.py)
    max_failure_rate: float = Field(0.01, ge=0, lt=1)  # a point with more failures misses the SLO
    capacity_search: bool = True
    search_start_rps: float | None = Field(None, gt=0)  # default: half the closed-loop sweep's best QPS
    search_precision: float = Field(0.05, gt=0, lt=1)  # stop when (first failing - last passing) <= this x last passing
    search_max_probes: int = Field(10, ge=2)
    search_min_rps: float | None = Field(None, gt=0)
    search_max_rps: float | None = Field(None, gt=0)
    hold_s: float = Field(60.0, ge=0)  # hold the answer this long (0: no hold, the capacity is "not held")
    hold_attempts: int = Field(2, ge=1)  # holds at most; after a failed one the search goes on below it


def seed_for(run_seed: int, rate: float) -> int:
    """A point's arrival seed: the run's seed and the rate, so a rate sends the same schedule every run."""
    return run_seed * 1_000_003 + int(round(rate * 1000))


def open_point(rate: float, p: SearchParams, run_seed: int, in_system_s: float | None = None,
               hold_s: float | None = None) -> LoadPoint:
    """An open-loop point at `rate`: a warm-up of warmup_s, at least one time in system (so the
    window starts with the server loaded); then a window long enough for requests_per_point
    arrivals and for WINDOW_E2E times in system (as seen so far), the whole within [min_point_s,
    max_point_s]; a hold's window is hold_s, whatever its length."""
    seen = in_system_s or 0.0
    warm = max(p.warmup_s, seen)
    if hold_s:
        duration = warm + hold_s
    else:
        need = warm + max(p.requests_per_point / rate, SIZE_MARGIN * WINDOW_E2E * seen)
        duration = min(p.max_point_s, max(p.min_point_s, need))
    burst = p.burstiness if p.arrival == "gamma" else 1.0
    return LoadPoint(rate=rate, burstiness=burst, duration_s=duration, warmup_s=min(warm, duration / 2),
                     seed=seed_for(run_seed, rate))


def trial_of(res: PointResult | None, v: Verdict | None, slo: SLO, rate: float, *, kind: Literal["probe", "hold"] = "probe",
             invalid: str | None = None, error: str | None = None) -> Trial:
    """A measured point as the search sees it: the verdict (steady state included), the latency
    the knee is found on (the SLO's first target), and what the report shows of it."""
    first = slo.targets[0].name
    latency = next((t.value_s for t in v.targets if t.target == first), None) if v else None
    st = res.steady if res else None
    detail = {"reason": v.reason if v else error, "goodput_rps": v.goodput_rps if v else None,
              "failure_rate": res.failure_rate if res else None,
              "backlog_at_end": res.queued_at_end + res.in_flight_at_end if res else None,
              "achieved_rate": res.achieved_rate if res else None, "completion_rps": res.completion_rps if res else None,
              "send_delay_p99_s": res.send_delay_s.p99 if res and res.send_delay_s else None,
              "steady": st.ok if st else None, "time_in_system_p50_s": st.time_in_system_p50_s if st else None}
    return Trial(rate=rate, ok=bool(v and v.ok), latency_s=latency, invalid=invalid, kind=kind,
                 duration_s=res.window_s if res else None, detail=detail)


class Ceiling:
    """The saturation check's ceiling: the highest completion rate measured so far, and where."""

    def __init__(self) -> None:
        self.rps: float | None = None
        self.where: str | None = None

    def see(self, rps: float | None, where: str) -> None:
        if rps and (self.rps is None or rps > self.rps):
            self.rps, self.where = rps, where

    def __call__(self) -> tuple[float | None, str | None]:
        return self.rps, self.where
