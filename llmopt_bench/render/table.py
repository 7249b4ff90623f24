"""The end-of-run summary table on the terminal (stdout: it is the run's data)."""

from __future__ import annotations

from llmopt_bench.analysis.selectors import GB, peak_memory
from llmopt_bench.results import RunResult, StageResult


def ms(d, attr: str = "p50") -> str:
    return f"{getattr(d, attr) * 1000:.2f}" if d else "-"


def note(s: StageResult) -> str:
    """Why a stage did not run, or what to keep in mind about its row."""
    parts = [s.reason] if s.reason else []
    q = s.quality
    if q and q.quality_regression and q.quality_ratio:
        parts.append(f"quality regression: perplexity {(q.quality_ratio - 1) * 100:+.1f}% vs {q.reference or 'the reference'}")
    if s.own_workload and s.status == "ok":
        parts.append("own workload (sweep): see the report")
    return "; ".join(parts)


def print_summary(run: RunResult) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"llmopt run {run.run_id}: {run.model.source if run.model else '?'} on {run.env.get('gpu') or run.env.get('cpu')}")
    for col in ("stage", "status", "load s", "TTFT p50 ms", "TPOT p50 ms", "E2E p50 s", "out tok/s", "peak mem GB"):
        table.add_column(col, no_wrap=True)
    table.add_column("note", overflow="fold", max_width=60)
    for s in run.stages:
        m = s.metrics
        peak = peak_memory(s)[0]
        table.add_row(s.name, s.status, f"{s.load_s:.1f}" if s.load_s else "-", ms(m.ttft_s) if m else "-",
                      ms(m.tpot_s) if m else "-", f"{m.e2e_s.p50:.3f}" if m and m.e2e_s else "-",
                      f"{m.output_tok_s:.1f}" if m and m.output_tok_s else "-", f"{peak / GB:.2f}" if peak else "-",
                      note(s)[:160])
    Console().print(table)
