"""Enough repeats, not a fixed count: the stopping rule of the fixed workload.

A stage measures `repeats` times, the minimum; where `max_repeats` is higher it goes on, one
repeat at a time, until the headline figure's between-repeat interval is tight or the maximum
is reached. The unit is the repeat, not the request, because that is the noise the regression
gate must see (docs/regression.md: a host-bound stage's repeats differ by 22% where its own
requests scatter by 4%): a rule that stopped when the requests of one repeat agreed would leave
the gate one repeat and no way to tell a slower build from a slower hour.

The interval: the repeats' values (each repeat's median) in log space, their mean's Student-t
interval at 95%, its half-width as a percentage of the value (exp(t x sd / sqrt(n)) - 1)."""

from __future__ import annotations

import math
import statistics
from typing import Literal, Sequence

from pydantic import Field

from llmopt_bench.analysis.metrics import e2e, tpot
from llmopt_bench.analysis.noise import t_quantile
from llmopt_bench.core.records import RequestSample, StrictModel

CONFIDENCE = 0.95


class StoppingRecord(StrictModel):
    """What the rule saw and decided, kept in run.json (the stage's extra.stopping)."""

    metric: str = Field(description="the headline figure the rule watches: tpot_p50, or e2e_p50 without TPOT")
    min_repeats: int
    max_repeats: int
    target_pct: float = Field(description="stop once the 95% interval's half-width is within this % of the value")
    repeats_run: int
    per_repeat: list[float | None] = Field(default_factory=list, description="the metric of each repeat, seconds")
    halfwidth_pct: float | None = Field(None, description="the interval's half-width after the last repeat")
    stopped: Literal["fixed", "tight", "max_repeats"] = Field(
        description="fixed: min = max, no rule; tight: the interval reached the target; max_repeats: it did not")


def halfwidth_pct(values: Sequence[float | None], confidence: float = CONFIDENCE) -> float | None:
    """The half-width of the mean's t interval of log(values), in % of the value; None below two
    positive values (one repeat shows no between-repeat noise)."""
    logs = [math.log(v) for v in values if v is not None and v > 0]
    if len(logs) < 2:
        return None
    half = t_quantile((1 + confidence) / 2, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return (math.exp(half) - 1) * 100


def repeat_value(samples: Sequence[RequestSample], metric: str) -> float | None:
    """One repeat's headline: the median of its ok requests' TPOT (or E2E)."""
    of = tpot if metric == "tpot_p50" else e2e
    values = [v for v in (of(s) for s in samples if s.ok) if v is not None]
    return statistics.median(values) if values else None


def headline_metric(max_new_tokens: int) -> str:
    """TPOT needs two tokens; one-token outputs are judged on E2E."""
    return "tpot_p50" if max_new_tokens >= 2 else "e2e_p50"


class StoppingRule:
    """Feed it each repeat's samples; it says when to stop and keeps the record."""

    def __init__(self, min_repeats: int, max_repeats: int, target_pct: float, metric: str):
        self.record = StoppingRecord(metric=metric, min_repeats=min_repeats, max_repeats=max(min_repeats, max_repeats),
                                     target_pct=target_pct, repeats_run=0,
                                     stopped="fixed" if max_repeats <= min_repeats else "max_repeats")

    @property
    def adaptive(self) -> bool:
        return self.record.max_repeats > self.record.min_repeats

    def add(self, samples: Sequence[RequestSample]) -> bool:
        """Record one repeat; True when measuring should stop."""
        rec = self.record
        rec.per_repeat.append(repeat_value(samples, rec.metric))
        rec.repeats_run += 1
        rec.halfwidth_pct = halfwidth_pct(rec.per_repeat)
        if rec.repeats_run < rec.min_repeats:
            return False
        if self.adaptive and rec.halfwidth_pct is not None and rec.halfwidth_pct <= rec.target_pct:
            rec.stopped = "tight"
            return True
        return rec.repeats_run >= rec.max_repeats

    def label(self) -> str:
        """The progress display's denominator: "3" fixed, "3..10" adaptive."""
        rec = self.record
        return f"{rec.min_repeats}..{rec.max_repeats}" if self.adaptive else str(rec.max_repeats)


def stopping_sentence(rec: StoppingRecord) -> str:
    """The report's line for an adaptive stage."""
    hw = "n/a" if rec.halfwidth_pct is None else f"±{rec.halfwidth_pct:.2g}%"
    why = {"tight": f"stopped: the interval reached ±{rec.target_pct:g}%",
           "max_repeats": f"ran to the maximum: the interval stayed wider than ±{rec.target_pct:g}%",
           "fixed": "a fixed count"}[rec.stopped]
    return (f"Repeats: {rec.repeats_run} of {rec.min_repeats}..{rec.max_repeats} ({why}; {rec.metric} "
            f"95% interval {hw} over the repeats).")
