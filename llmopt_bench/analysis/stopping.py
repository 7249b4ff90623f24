"""Enough repeats, not a fixed count: the stopping rule of the fixed workload.

A stage measures `repeats` times, the minimum; where `max_repeats` is higher it goes on, one
repeat at a time, until every figure the regression gate is settled against (its gated decode
figures: TPOT p50, E2E p50 and output tok/s, analysis/gate/judge.GATED) has a between-repeat interval
within `target_pct`, or the maximum is reached, or the repeats have taken `max_seconds` (the
time a nightly job has: no repeat starts that would end past it). The unit is the repeat, not
the request, because that is the noise the regression gate must see (docs/regression.md: a
host-bound stage's repeats differ by 22% where its own requests scatter by 4%): a rule that
stopped when the requests of one repeat agreed would leave the gate one repeat and no way to
tell a slower build from a slower hour.

The interval is the gate's own (analysis/gate/noise.py): each repeat's figure in log space, their
mean's Student-t interval at 95%, its half-width as a percentage of the value (exp(t x sd /
sqrt(n)) - 1). A stage whose repeats agree to 0.1% (every vLLM stage on the H200) stops at 2
or 3; a noisy one runs on. A repeat the host disturbed (its CPU share, preemptions or steal
beyond its run's typical repeat: analysis/gate/host_signals.disturbed, judged again after every
repeat) is not counted, as compare sets it aside: the rule measures another in its place."""

from __future__ import annotations

import math
import statistics
from typing import Literal, Sequence

from pydantic import Field

from llmopt_bench.analysis.gate.host_signals import disturbed
from llmopt_bench.analysis.gate.noise import t_quantile
from llmopt_bench.analysis.metrics import e2e, tpot
from llmopt_bench.core.records import RequestSample, StrictModel
from llmopt_bench.measure.conditions import RepeatConditions

CONFIDENCE = 0.95


class StoppingRecord(StrictModel):
    """What the rule saw and decided, kept in run.json (the stage's extra.stopping)."""

    metric: str = Field(description="the headline figure: tpot_p50, or e2e_p50 without TPOT")
    min_repeats: int
    max_repeats: int
    target_pct: float = Field(description="stop once every watched figure's 95% interval half-width is within this % of it")
    repeats_run: int
    per_repeat: list[float | None] = Field(default_factory=list, description="the headline of each repeat, seconds")
    halfwidth_pct: float | None = Field(None, description="the headline's interval half-width after the last repeat")
    stopped: Literal["fixed", "tight", "max_repeats", "budget"] = Field(
        description="fixed: min = max, no rule; tight: every watched interval reached the target; max_repeats: "
                    "they did not; budget: the next repeat would have ended past max_seconds")
    watched: dict[str, list[float | None]] = Field(default_factory=dict, description=(
        "each watched figure of each repeat (tpot_p50, e2e_p50 in seconds; output_tok_s)"))
    halfwidths_pct: dict[str, float | None] = Field(default_factory=dict, description="each watched figure's half-width")
    max_seconds: float | None = Field(None, description="the repeats' time budget (--repeat-budget), seconds")
    set_aside: list[int] = Field(default_factory=list, description="repeats the host disturbed, not counted (0-based)")
    seconds: float = Field(0.0, description="the repeats' time so far: each one's first submit to last token")


def halfwidth_pct(values: Sequence[float | None], confidence: float = CONFIDENCE) -> float | None:
    """The half-width of the mean's t interval of log(values), in % of the value; None below two
    positive values (one repeat shows no between-repeat noise)."""
    logs = [math.log(v) for v in values if v is not None and v > 0]
    if len(logs) < 2:
        return None
    half = t_quantile((1 + confidence) / 2, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return (math.exp(half) - 1) * 100


def window_s(samples: Sequence[RequestSample]) -> float:
    ok = [s for s in samples if s.ok]
    return max(s.t_done for s in ok) - min(s.t_submit for s in ok) if ok else 0.0


def repeat_value(samples: Sequence[RequestSample], metric: str) -> float | None:
    """One repeat's figure: the median of its ok requests' TPOT (or E2E), or its output tokens
    over its window (output_tok_s), as analysis/metrics.compute takes them."""
    if metric == "output_tok_s":
        window = window_s(samples)
        return sum(s.output_tokens for s in samples if s.ok) / window if window > 0 else None
    of = tpot if metric == "tpot_p50" else e2e
    values = [v for v in (of(s) for s in samples if s.ok) if v is not None]
    return statistics.median(values) if values else None


def headline_metric(max_new_tokens: int) -> str:
    """TPOT needs two tokens; one-token outputs are judged on E2E."""
    return "tpot_p50" if max_new_tokens >= 2 else "e2e_p50"


def watched_metrics(headline: str) -> list[str]:
    """The gated decode figures (judge.GATED less peak memory, which does not vary by repeat)."""
    return list(dict.fromkeys([headline, "e2e_p50", "output_tok_s"]))


class StoppingRule:
    """Feed it each repeat's samples; it says when to stop and keeps the record."""

    def __init__(self, min_repeats: int, max_repeats: int, target_pct: float, metric: str,
                 max_seconds: float | None = None):
        self.record = StoppingRecord(metric=metric, min_repeats=min_repeats, max_repeats=max(min_repeats, max_repeats),
                                     target_pct=target_pct, repeats_run=0, max_seconds=max_seconds,
                                     stopped="fixed" if max_repeats <= min_repeats else "max_repeats",
                                     watched={m: [] for m in watched_metrics(metric)})
        self.conditions: list[RepeatConditions | dict] = []

    @property
    def adaptive(self) -> bool:
        return self.record.max_repeats > self.record.min_repeats

    def add(self, samples: Sequence[RequestSample], conditions: RepeatConditions | None = None) -> bool:
        """Record one repeat (and what the machine did during it); True when measuring should stop."""
        return self.add_figures({m: repeat_value(samples, m) for m in self.record.watched}, window_s(samples), conditions)

    def add_figures(self, figures: dict[str, float | None], seconds: float, conditions: RepeatConditions | dict | None = None) -> bool:
        """Record one repeat's watched figures and its time (what add() reads from its samples;
        scripts/gate/calibrate-gate.py replays recorded runs through it); True when measuring should stop."""
        rec = self.record
        if conditions is not None:
            self.conditions.append(conditions)
        flags = disturbed(self.conditions) if len(self.conditions) == rec.repeats_run + 1 else []
        rec.set_aside = [i for i, f in enumerate(flags) if f]
        for m, values in rec.watched.items():
            values.append(figures.get(m))
            rec.halfwidths_pct[m] = halfwidth_pct([v for i, v in enumerate(values) if i not in rec.set_aside])
        rec.per_repeat = list(rec.watched[rec.metric])
        rec.halfwidth_pct = rec.halfwidths_pct[rec.metric]
        rec.repeats_run += 1
        rec.seconds = round(rec.seconds + seconds, 3)
        if rec.repeats_run - len(rec.set_aside) < rec.min_repeats and rec.repeats_run < rec.max_repeats:
            return False
        widths = list(rec.halfwidths_pct.values())
        if self.adaptive and all(w is not None and w <= rec.target_pct for w in widths):
            rec.stopped = "tight"
            return True
        if rec.repeats_run >= rec.max_repeats:
            return True
        # the next repeat, as long as the mean one so far, would end past the budget
        if rec.max_seconds is not None and rec.seconds * (rec.repeats_run + 1) / rec.repeats_run > rec.max_seconds:
            rec.stopped = "budget"
            return True
        return False

    def label(self) -> str:
        """The progress display's denominator: "3" fixed, "3..10" adaptive."""
        rec = self.record
        return f"{rec.min_repeats}..{rec.max_repeats}" if self.adaptive else str(rec.max_repeats)


def stopping_sentence(rec: StoppingRecord) -> str:
    """The report's line for an adaptive stage."""
    widths = rec.halfwidths_pct or {rec.metric: rec.halfwidth_pct}
    hw = ", ".join(f"{m} {'n/a' if w is None else f'±{w:.2g}%'}" for m, w in widths.items())
    wider = f"an interval stayed wider than ±{rec.target_pct:g}%"
    why = {"tight": f"stopped: every interval reached ±{rec.target_pct:g}%",
           "max_repeats": f"ran to the maximum: {wider}",
           "budget": f"stopped at the time budget ({rec.max_seconds or 0:g} s of repeats): {wider}",
           "fixed": "a fixed count"}[rec.stopped]
    aside = (f" Repeat(s) {', '.join(str(i + 1) for i in rec.set_aside)} not counted: the host disturbed them (their CPU "
             "share, preemptions or steal beyond the run's typical repeat)." if rec.set_aside else "")
    return (f"Repeats: {rec.repeats_run} of {rec.min_repeats}..{rec.max_repeats} ({why}; 95% intervals over the repeats: "
            f"{hw}).{aside}")
