"""Which results a table or a comparison takes, and the figures read off them: plain functions
of a RunResult that know no stage by name (the quality reference is a flag on its result). Every
figure is analysis/figures.py's, so a table, a speedup and a sentence show one number for one thing."""

from __future__ import annotations

from llmopt_bench.analysis.figures import csv_cells, stage_figure
from llmopt_bench.analysis.speedup_interval import speedup_interval
from llmopt_bench.core.records import StrictModel
from llmopt_bench.core.results import RunResult, StageResult, peak_memory

GB = 1e9


def ok_stages(run: RunResult) -> list[StageResult]:
    return [s for s in run.stages if s.status == "ok" and s.metrics]


def comparable_stages(run: RunResult) -> list[StageResult]:
    """Ok stages measured on the run's fixed workload: the ones whose rows compare with each other."""
    return [s for s in ok_stages(run) if not s.own_workload]


def baseline(run: RunResult) -> StageResult | None:
    """The first comparable stage in journey order: what every speedup is against."""
    ok = comparable_stages(run)
    return ok[0] if ok else None


def reference(run: RunResult) -> StageResult | None:
    """The ok result that provides the run's quality reference (Stage.quality_reference)."""
    return next((s for s in run.stages if s.quality_reference and s.status == "ok"), None)


def of_stage(run: RunResult, stage: str) -> StageResult | None:
    """The unlabelled ok result of a registered stage (a labelled twin never stands in for it)."""
    s = run.stage(stage)
    return s if s and s.status == "ok" and s.stage_name == stage else None


def p50_of(stage: StageResult | None, attr: str) -> float | None:
    """A latency's p50 figure (attr: "ttft_s", "tpot_s", "e2e_s") in seconds, None where the
    stage is not ok or did not measure it: analysis/figures.py's statistic over repeats."""
    if stage is None or stage.status != "ok" or not stage.metrics:
        return None
    return stage_figure(stage, f"{attr[:-2]}_p50").recorded


def ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num and den else None


def perplexity(stage: StageResult | None) -> float | None:
    """A meaningful perplexity (real weights), else None."""
    q = stage.quality if stage and stage.status == "ok" else None
    return q.perplexity if q and q.perplexity_meaningful else None


class StageRow(StrictModel):
    """One result's row of the stage table (report.md, stages.csv, report.json)."""

    stage: str
    status: str
    load_s: float | None
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    tpot_p50_ms: float | None
    tpot_p99_ms: float | None
    e2e_p50_s: float | None
    output_tok_s: float | None
    qps: float | None
    requests: int | None
    peak_mem_gb: float | None
    peak_mem_source: str | None
    weights_gb: float | None
    token_match_rate: float | None
    kl_mean: float | None
    perplexity: float | None
    quality_regression: bool | None
    reason: str | None


STAGE_COLUMNS = tuple(StageRow.model_fields)  # stages.csv's columns, in the row's (documented) order
DESCRIPTIVE_COLUMNS = ("stage", "status", "peak_mem_source", "quality_regression", "reason")  # words, not figures


def stage_row(stage: StageResult) -> StageRow:
    """The stage's row: its words, and the registered figures under their CSV names (analysis/metric_registry.py)."""
    q, figures = stage.quality, csv_cells(stage)
    descriptive = {"stage": stage.name, "status": stage.status, "peak_mem_source": peak_memory(stage)[1],
                   "quality_regression": q.quality_regression if q else None, "reason": stage.reason}
    return StageRow.model_validate({c: descriptive[c] if c in descriptive else figures[c] for c in STAGE_COLUMNS})


def stage_table_rows(run: RunResult) -> list[StageRow]:
    return [stage_row(s) for s in run.stages]


SPEEDUP_FIGURES = {"tpot": "tpot_p50", "ttft": "ttft_p50", "e2e": "e2e_p50", "output_tok_s": "output_tok_s"}


def speedup(stage: StageResult, ref: StageResult) -> dict[str, float | None]:
    """How many times better `stage` is than `ref`, figure by figure (analysis/figures.py):
    latencies ref/stage, throughput stage/ref."""
    if stage.metrics is None or ref.metrics is None:  # a stage without metrics is no comparable stage
        return dict.fromkeys(SPEEDUP_FIGURES)
    out: dict[str, float | None] = {}
    for what, key in SPEEDUP_FIGURES.items():
        a, b = stage_figure(stage, key).value, stage_figure(ref, key).value
        out[what] = ratio(a, b) if what == "output_tok_s" else ratio(b, a)
    return out


class SpeedupRow(StrictModel):
    """One comparable result against the baseline and the one before it: how many times better
    (latencies baseline / stage, throughput stage / baseline); against the baseline also the 95%
    interval over the repeats, [low, high]."""

    stage: str
    baseline: str
    previous: str | None
    tpot_x_baseline: float | None
    ttft_x_baseline: float | None
    e2e_x_baseline: float | None
    output_tok_s_x_baseline: float | None
    tpot_x_baseline_interval: list[float | None] | None
    output_tok_s_x_baseline_interval: list[float | None] | None
    tpot_x_previous: float | None
    ttft_x_previous: float | None
    e2e_x_previous: float | None
    output_tok_s_x_previous: float | None
    changes: str | None


def speedup_rows(run: RunResult) -> list[SpeedupRow]:
    """Each comparable stage against the baseline and the previous one; against the baseline
    also the 95% interval over the repeats (analysis/speedup_interval.py), [low, high]."""
    ok = comparable_stages(run)
    rows = []
    for i, s in enumerate(ok):
        base, prev = ok[0], ok[i - 1] if i else None
        vs_base = speedup(s, base)
        vs_prev = speedup(s, prev) if prev else {}
        tpot_iv, tok_s_iv = (speedup_interval(s, base, what) if s is not base else None for what in ("tpot", "output_tok_s"))
        rows.append(SpeedupRow(
            stage=s.name, baseline=base.name, previous=prev.name if prev else None,
            tpot_x_baseline=vs_base["tpot"], ttft_x_baseline=vs_base["ttft"], e2e_x_baseline=vs_base["e2e"],
            output_tok_s_x_baseline=vs_base["output_tok_s"],
            tpot_x_baseline_interval=[tpot_iv.lo, tpot_iv.hi] if tpot_iv else None,
            output_tok_s_x_baseline_interval=[tok_s_iv.lo, tok_s_iv.hi] if tok_s_iv else None,
            tpot_x_previous=vs_prev.get("tpot"), ttft_x_previous=vs_prev.get("ttft"), e2e_x_previous=vs_prev.get("e2e"),
            output_tok_s_x_previous=vs_prev.get("output_tok_s"), changes=s.changes))
    return rows
