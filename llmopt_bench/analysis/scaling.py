"""Tensor-parallel scaling within one run: the same stage measured at several
tensor_parallel_size values (a journey runs it twice, one of them under a label), each compared
with its smallest-TP run. Batch-1 latency and saturated throughput are what TP trades."""

from __future__ import annotations

from dataclasses import dataclass

from llmopt_bench.analysis.figures import stage_figure
from llmopt_bench.core.results import RunResult, StageResult


@dataclass
class ScalingRow:
    stage: str  # the registered stage both results ran
    name: str  # this result
    base: str  # the result it is compared with (the smallest TP)
    tp: int
    base_tp: int
    batch1_tpot_s: float | None
    base_batch1_tpot_s: float | None
    saturated_tok_s: float | None
    base_saturated_tok_s: float | None
    saturated_how: str
    base_saturated_how: str
    peak_bytes_per_gpu: dict[str, int]

    @property
    def latency_speedup(self) -> float | None:
        """Batch-1 TPOT, base over this: > 1 means TP made a request's tokens come faster."""
        if self.batch1_tpot_s and self.base_batch1_tpot_s:
            return self.base_batch1_tpot_s / self.batch1_tpot_s
        return None

    @property
    def efficiency(self) -> float | None:
        """Throughput scaling per GPU added: 1.0 is linear."""
        t = self.throughput_scaling
        return t / (self.tp / self.base_tp) if t else None

    @property
    def throughput_scaling(self) -> float | None:
        if self.saturated_tok_s and self.base_saturated_tok_s and self.saturated_how == self.base_saturated_how:
            return self.saturated_tok_s / self.base_saturated_tok_s
        return None


def tp_of(s: StageResult) -> int:
    return int((s.params or {}).get("tensor_parallel_size") or 1)


def batch1_tpot(s: StageResult, batch_size: int) -> float | None:
    """TPOT at one request in flight: what the stage measured apart (a load curve's concurrency-1
    point), else its metrics when the run's fixed workload is batch 1."""
    if s.facts.batch1_tpot_s:
        return s.facts.batch1_tpot_s
    if s.own_workload or s.facts.saturated_how or batch_size != 1 or not s.metrics or not s.metrics.tpot_s:
        return None
    return stage_figure(s, "tpot_p50").recorded  # the figure the tables show (analysis/figures.py)


NOT_SATURATED = "the fixed workload (not saturated)"


def saturated(s: StageResult) -> tuple[float | None, str]:
    """The most output tokens a second the stage saw: what it says (facts: a throughput point, a
    load curve's top), else its own output tok/s (the fixed workload, not saturated, said so)."""
    if s.facts.saturated_tok_s:
        return s.facts.saturated_tok_s, s.facts.saturated_how or ""
    if s.metrics and (tok_s := stage_figure(s, "output_tok_s").value):
        return tok_s, NOT_SATURATED
    return None, ""


def scaling_rows(run: RunResult) -> list[ScalingRow]:
    groups: dict[str, list[StageResult]] = {}
    for s in run.stages:
        if s.status == "ok":
            groups.setdefault(s.stage or s.name, []).append(s)
    batch = run.workload.batch_size if run.workload else 1
    rows = []
    for stage, results in groups.items():
        if len({tp_of(s) for s in results}) < 2:
            continue
        base = min(results, key=tp_of)
        b_sat, b_how = saturated(base)
        for s in sorted(results, key=tp_of):
            if s is base:
                continue
            sat, how = saturated(s)
            rows.append(ScalingRow(stage, s.name, base.name, tp_of(s), tp_of(base), batch1_tpot(s, batch), batch1_tpot(base, batch),
                                   sat, b_sat, how, b_how, per_gpu(s)))
    return rows


def per_gpu(s: StageResult) -> dict[str, int]:
    """The stage's processes' peak bytes on each GPU it used (NVML), by device index."""
    return {k: v for k, v in s.memory.process_peak_bytes_by_device.items() if v}
