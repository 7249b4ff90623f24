"""The capacity search as a stage runs it, on any engine: its params, the size of each trial
(long enough to see a queue form), a trial from a measured point, what a trial will cost, and
the ceiling (the highest completion rate measured). The search itself is load/capacity/find.py (the
search load/capacity/search.py, its budget load/capacity/budget.py, the hold load/capacity/hold.py); a scenario gives it a
function that measures one open-loop point (serving: scenarios/serving/run.py).

Trial length against the number of trials. A trial can only be judged if its window is at least
WINDOW_E2E (5) times its median time in system (load/steady.py): shorter, a queue that grows
does not show against the backlog's jitter. So the window is sized for SIZE_MARGIN x WINDOW_E2E
x the longest time in system of a steady point so far, and never made longer: a longer window
judges a rate near saturation more surely (a queue growing at 2% of the rate needs a long
window to stand out), but costs its length in every trial, where from the ceiling down the
answer needs few trials (two or three where the SLO does not bind: the interval under the
ceiling starts 5% wide) and the hold (60 s) is the long look at the one rate that matters."""

from __future__ import annotations

from typing import Literal, TypedDict

from pydantic import Field

from llmopt_bench.analysis.slo import Verdict
from llmopt_bench.core.records import StrictModel
from llmopt_bench.core.slo import SLO, default_slo
from llmopt_bench.load.capacity.search import Trial
from llmopt_bench.load.point import LoadPoint, PointResult
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
    slo: SLO = Field(default_factory=default_slo)  # MLPerf Inference's Server limits for Llama-3.1-8B (core/slo.py); text accepted
    max_failure_rate: float = Field(0.01, ge=0, lt=1)  # a point with more failures misses the SLO
    capacity_search: bool = True
    ceiling_requests: int = Field(256, ge=0)  # the ceiling: this many of the workload's requests at once (0: the sweep's top)
    search_start_rps: float | None = Field(None, gt=0)  # default: just under the ceiling (the search goes down from there)
    search_precision: float = Field(0.05, gt=0, lt=1)  # stop when first failing / last passing <= 1 + this
    search_budget_s: float = Field(240.0, gt=0)  # seconds of load for the trials and holds; the trial count follows
    search_max_probes: int | None = Field(None, ge=1)  # a trial cap besides the budget (default none: the budget decides)
    search_min_rps: float | None = Field(None, gt=0)
    search_max_rps: float | None = Field(None, gt=0)
    hold_s: float = Field(60.0, ge=0)  # hold the answer this long (0: no hold, the capacity is "not held")
    hold_attempts: int | None = Field(None, ge=1)  # a cap on holds (default none: after a failed one the holds go on
    #                                               below it while the budget allows)


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


class TrialDetail(TypedDict):
    """What a serving trial keeps beside its verdict (the report's trial table reads it)."""

    reason: str | None  # why it missed (None: it held)
    goodput_rps: float | None
    failure_rate: float | None
    backlog_at_end: int | None  # requests queued or in flight when the window closed
    achieved_rate: float | None
    completion_rps: float | None
    send_delay_p99_s: float | None  # the client's own punctuality
    steady: bool | None
    time_in_system_p50_s: float | None


def trial_of(res: PointResult | None, v: Verdict | None, slo: SLO, rate: float, *, kind: Literal["probe", "hold"] = "probe",
             invalid: str | None = None, error: str | None = None) -> Trial:
    """A measured point as the search sees it: the verdict (steady state included), the latency
    the knee is found on (the SLO's first target), and what the report shows of it."""
    first = slo.targets[0].name
    latency = next((t.value_s for t in v.targets if t.target == first), None) if v else None
    st = res.steady if res else None
    detail: TrialDetail = {"reason": v.reason if v else error, "goodput_rps": v.goodput_rps if v else None,
              "failure_rate": res.failure_rate if res else None,
              "backlog_at_end": res.queued_at_end + res.in_flight_at_end if res else None,
              "achieved_rate": res.achieved_rate if res else None, "completion_rps": res.completion_rps if res else None,
              "send_delay_p99_s": res.send_delay_s.p99 if res and res.send_delay_s else None,
              "steady": st.ok if st else None, "time_in_system_p50_s": st.time_in_system_p50_s if st else None}
    return Trial(rate=rate, ok=bool(v and v.ok), latency_s=latency, invalid=invalid, kind=kind,
                 duration_s=res.window_s if res else None, cost_s=load_seconds(res) if res else None, detail=detail)


def load_seconds(res: PointResult) -> float:
    """The load a point put on the server: its warm-up and window (its planned length), and its
    drain (until the last measured answer)."""
    pt = res.point
    return (pt.duration_s if pt.duration_s is not None else res.window_s) + res.drain_s


def planned_cost(rate: float, hold_s: float | None, p: SearchParams, run_seed: int, in_system_s: float | None) -> float:
    """What a trial (hold_s None) or a hold at `rate` will cost in seconds of load: its planned
    length, and a drain of two times in system (a trial above the capacity drains a backlog)."""
    point = open_point(rate, p, run_seed, in_system_s, hold_s)
    return (point.duration_s or 0.0) + 2 * (in_system_s or 0.0)


class Ceiling:
    """The ceiling: the highest completion rate measured so far, and where. An open-loop point
    counts for at most the rate it offered: a point that kept up completes what arrived, and the
    arrivals' own noise over a short window (a tenth either way at 40 req/s over 5 s) is not
    the server's capacity; one that fell behind completes what the server could."""

    def __init__(self) -> None:
        self.rps: float | None = None
        self.where: str | None = None

    def see(self, rps: float | None, where: str, offered: float | None = None) -> None:
        if rps and offered:
            rps = min(rps, offered)
        if rps and (self.rps is None or rps > self.rps):
            self.rps, self.where = rps, where

    def __call__(self) -> tuple[float | None, str | None]:
        return self.rps, self.where
