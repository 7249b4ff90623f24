"""Each stage figure's one statistic over repeats, defined once: the number every output shows.

A figure measured per repeat (TTFT, TPOT, E2E at p50, p90, p99 or mean; output tok/s; QPS) is
**the geometric mean of its repeats' own figures**: each repeat's statistic over its own requests
(the median of its requests' TPOT, the p99 of their TTFT) or over its own window (tok/s), the
repeats the host disturbed set aside (analysis/gate/host_signals.kept_repeats). That is the value
the regression gate judges (analysis/gate/noise.py: the repeat is the unit, its log figure the
sample), so "the figure moved by X%" in a report or a history and compare's verdict on it agree.
Its interval is the one the gate gives one side: the geometric mean times exp(+-t x SE), SE the
standard deviation of the repeats' log figures over sqrt(R), t on R - 1 degrees of freedom (95%).
With one repeat there is no interval over repeats (None): its requests' scatter is not the noise
between runs.

A figure recorded once a run (load time, peak memory, weights, energy per output token, the
capacity under an SLO, quality, the request count) is that value; only the capacity has an
interval: the bracket its search knew it within, [last rate that met the SLO, first that failed].

Every output reads figures here: the terminal table, report.md (its tables, speedups, claims,
conclusions, roofline), stages.csv and report.json, compare's text and JSON (the gate's values
are these), the history (rows, changes, chart) and recommend (`stage_figure`). numpy is imported
inside the gate's functions this calls."""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmopt_bench.analysis.gate import host_signals, noise
from llmopt_bench.analysis.metric_registry import REGISTRY, Metric
from llmopt_bench.core.distribution import percentile
from llmopt_bench.core.results import StageResult

CONFIDENCE = 0.95
# the definition in the report's words (its Metric definitions; docs/report.md, docs/regression.md refer to it)
FIGURE_DEFINITION = ("the geometric mean of its repeats' own figures (each repeat's p50 or p99 over its own requests, "
                     "its tok/s over its own window), the repeats the host disturbed set aside: the value `llmopt compare` "
                     "judges, so a change in it is the change compare weighs; load, memory, weights and energy are one "
                     "value a run")
# a latency statistic's name in the registry -> how a repeat's requests give it
_REPEAT_STATISTIC = {"p50": "median", "p90": "p90", "p99": "p99", "mean": "mean"}
# the per-request columns run.json keeps (core/results.Samples): ITL's gaps are not among them
_SAMPLE_COLUMNS = ("ttft_s", "tpot_s", "e2e_s")
# figures whose run.json field holds each repeat's windowed value
_PER_REPEAT_FIELDS = {"output_tok_s": "output_tok_s_repeats", "qps": "qps_repeats"}


@dataclass(frozen=True)
class Figure:
    """One stage figure as every output shows it: the value in `unit` (the registry's), its 95%
    interval in that unit (None: none over repeats), the repeats it was computed over (0: a
    value recorded once a run), the repeats the host disturbed and were left out, and how it
    was computed, in words."""

    metric: str
    value: float | None
    unit: str
    interval: tuple[float, float] | None
    n_repeats: int
    how: str
    recorded: float | None  # the value in run.json's unit (seconds, bytes): what the history database stores
    set_aside: tuple[int, ...] = ()  # 0-based indices of the repeats left out
    per_repeat_requests: int | None = None  # the fewest requests a repeat's statistic rests on (a tail's caveat)


def _metric(metric: Metric | str) -> Metric:
    return metric if isinstance(metric, Metric) else REGISTRY[metric]


def _latency(m: Metric) -> tuple[str, str] | None:
    """(samples column, statistic) of a latency figure that run.json's samples give, else None."""
    parts = m.figure.split(".")
    if len(parts) == 3 and parts[0] == "metrics" and parts[1] in _SAMPLE_COLUMNS and parts[2] in _REPEAT_STATISTIC:
        return parts[1], parts[2]
    return None


def repeat_groups(stage: StageResult, metric: Metric | str) -> tuple[list[list[float]], str]:
    """What a figure is computed from, repeat by repeat, as the gate draws from it (its
    noise_groups): a p50's requests grouped by repeat, statistic "median"; a p90, p99 or mean
    latency's repeats as one value each (the repeat's statistic over its requests); tok/s and
    QPS each repeat's windowed value; statistic "mean" of a one-value group is that value.
    Empty for a figure recorded once a run. The stage's repeats as given: stage_figure sets
    the disturbed ones aside first."""
    m = _metric(metric)
    if (field := _PER_REPEAT_FIELDS.get(m.key)) is not None:
        values = getattr(stage.metrics, field, None) or [] if stage.metrics else []
        return [[v] for v in values if v and math.isfinite(v)], "mean"
    latency = _latency(m)
    if latency is None or stage.samples is None:
        return [], "mean"
    column, stat = latency
    groups = noise.repeat_groups(getattr(stage.samples, column), stage.samples.repeat)
    if stat == "p50":
        return groups, "median"
    return [[_statistic(g, stat)] for g in groups if g], "mean"


def _statistic(values: list[float], stat: str) -> float:
    if stat == "mean":
        return sum(values) / len(values)
    return percentile(values, float(stat[1:]))


def quiet(stage: StageResult) -> tuple[StageResult, tuple[int, ...]]:
    """The stage with the repeats the host disturbed set aside, as compare sets them aside
    (analysis/gate/host_signals.kept_repeats), and their indices."""
    kept, aside = host_signals.kept_repeats(stage)
    return kept, tuple(aside)


def stage_figure(result: StageResult, metric: Metric | str) -> Figure:
    """The stage's figure of a registered metric (a Metric or its key), as every output shows it."""
    kept, aside = quiet(result)
    return figure_over(kept, metric, aside)


def figure_over(stage: StageResult, metric: Metric | str, set_aside: tuple[int, ...] = ()) -> Figure:
    """The figure over the stage's repeats as given (compare hands in the repeats it kept)."""
    m = _metric(metric)
    groups, statistic = repeat_groups(stage, m)
    values = noise.repeat_values(groups, statistic)
    if not values:
        return _once(stage, m)
    centre = math.exp(sum(math.log(v) for v in values) / len(values))
    interval = None
    if len(values) >= 2:
        side = noise.side_noise(groups, statistic, 0, None)  # two repeats or more: no draws, no generator
        if side is not None:
            reach = math.exp(noise.t_quantile(0.5 + CONFIDENCE / 2, side.df) * math.sqrt(side.var))
            interval = (m.shown(centre / reach), m.shown(centre * reach))
    latency = _latency(m)
    requests = (min(len(g) for g in noise.repeat_groups(getattr(stage.samples, latency[0]), stage.samples.repeat))
                if latency and stage.samples else None)
    return Figure(m.key, m.shown(centre), m.unit, interval, len(values), how_text(m, len(values), set_aside), centre,
                  set_aside, requests)


def _once(stage: StageResult, m: Metric) -> Figure:
    """A figure recorded once a run, or one whose per-repeat values run.json lacks (an older run)."""
    recorded = m.value(stage)
    value = m.shown(recorded)
    if m.key == "capacity_rps":
        lo, hi = ((stage.facts.slo_capacity_interval or []) + [None, None])[:2]
        interval = (m.shown(lo), m.shown(hi)) if lo is not None and hi is not None else None
        return Figure(m.key, value, m.unit, interval, 0, "the highest arrival rate that met the SLO; its interval: the "
                      "measured rates on either side, the last that met it and the first that failed", recorded)
    if value is not None and (_latency(m) or m.key in _PER_REPEAT_FIELDS):
        return Figure(m.key, value, m.unit, None, 0, "the run's recorded value over all its requests (run.json keeps no "
                      "per-repeat values of it)", recorded)
    return Figure(m.key, value, m.unit, None, 0, "one value a run", recorded)


def how_text(m: Metric, repeats: int, set_aside: tuple[int, ...]) -> str:
    """How a per-repeat figure was computed, in words (report.json's `how`)."""
    latency = _latency(m)
    each = (f"its requests' {latency[1]}" if latency else "its windowed value")
    aside = (f", {len(set_aside)} repeat(s) the host disturbed set aside ({', '.join(str(i + 1) for i in set_aside)})"
             if set_aside else "")
    if repeats == 1:
        return f"the one repeat's figure ({each}){aside}"
    return f"the geometric mean of {repeats} repeats' figures (each {each}){aside}"


def figure_value(result: StageResult | None, metric: Metric | str) -> float | None:
    """The figure's value in its shown unit, None for no result (a shorthand for renderers)."""
    return stage_figure(result, metric).value if result is not None else None


def csv_cells(stage: StageResult) -> dict[str, float | None]:
    """A stage's registered figures under their CSV columns (stages.csv, report.json's stage rows)."""
    return {m.csv: stage_figure(stage, m).value for m in REGISTRY.values() if m.csv}
