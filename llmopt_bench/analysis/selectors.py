"""Which results a table or a comparison takes, and the figures read off them: plain functions
of a RunResult that know no stage by name (the quality reference is a flag on its result)."""

from __future__ import annotations

from typing import Any

from llmopt_bench.analysis.metric_registry import csv_cells
from llmopt_bench.analysis.speedup_interval import speedup_interval
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


def p(dist: Any, attr: str, scale: float = 1.0) -> float | None:
    return getattr(dist, attr) * scale if dist is not None else None


def p50_of(stage: StageResult | None, attr: str) -> float | None:
    d = getattr(stage.metrics, attr, None) if stage and stage.status == "ok" and stage.metrics else None
    return d.p50 if d else None


def ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num and den else None


def perplexity(stage: StageResult | None) -> float | None:
    """A meaningful perplexity (real weights), else None."""
    q = stage.quality if stage and stage.status == "ok" else None
    return q.perplexity if q and q.perplexity_meaningful else None


# stages.csv's columns, in their documented order: the stage's name, status and notes, and the
# registered figures under their CSV names (analysis/metric_registry.py)
STAGE_COLUMNS = ("stage", "status", "load_s", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms",
                 "e2e_p50_s", "output_tok_s", "qps", "requests", "peak_mem_gb", "peak_mem_source", "weights_gb",
                 "token_match_rate", "kl_mean", "perplexity", "quality_regression", "reason")
DESCRIPTIVE_COLUMNS = ("stage", "status", "peak_mem_source", "quality_regression", "reason")  # words, not figures


def stage_row(stage: StageResult) -> dict[str, Any]:
    q, figures = stage.quality, csv_cells(stage)
    descriptive = {"stage": stage.name, "status": stage.status, "peak_mem_source": peak_memory(stage)[1],
                   "quality_regression": q.quality_regression if q else None, "reason": stage.reason}
    return {c: descriptive[c] if c in descriptive else figures[c] for c in STAGE_COLUMNS}


def stage_table_rows(run: RunResult) -> list[dict[str, Any]]:
    return [stage_row(s) for s in run.stages]


def speedup(stage: StageResult, ref: StageResult) -> dict[str, float | None]:
    """How many times better `stage` is than `ref`: latencies ref/stage, throughput stage/ref."""
    a, b = stage.metrics, ref.metrics
    if a is None or b is None:  # a stage without metrics is no comparable stage
        return dict.fromkeys(("tpot", "ttft", "e2e", "output_tok_s"))
    return {"tpot": ratio(p(b.tpot_s, "p50"), p(a.tpot_s, "p50")),
            "ttft": ratio(p(b.ttft_s, "p50"), p(a.ttft_s, "p50")),
            "e2e": ratio(p(b.e2e_s, "p50"), p(a.e2e_s, "p50")),
            "output_tok_s": ratio(a.output_tok_s, b.output_tok_s)}


def speedup_rows(run: RunResult) -> list[dict[str, Any]]:
    """Each comparable stage against the baseline and the previous one; against the baseline
    also the 95% interval over the repeats (analysis/speedup_interval.py), [low, high]."""
    ok = comparable_stages(run)
    rows = []
    for i, s in enumerate(ok):
        base, prev = ok[0], ok[i - 1] if i else None
        vs_base = speedup(s, base)
        vs_prev = speedup(s, prev) if prev else {}
        intervals = {what: speedup_interval(s, base, what) if s is not base else None for what in ("tpot", "output_tok_s")}
        rows.append({"stage": s.name, "baseline": base.name, "previous": prev.name if prev else None,
                     **{f"{k}_x_baseline": v for k, v in vs_base.items()},
                     **{f"{k}_x_baseline_interval": [iv.lo, iv.hi] if iv else None for k, iv in intervals.items()},
                     **{f"{k}_x_previous": vs_prev.get(k) for k in vs_base},
                     "changes": s.changes})
    return rows
