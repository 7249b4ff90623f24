"""The end-of-run summary table on the terminal (stdout: it is the run's data)."""

from __future__ import annotations

from llmopt_bench.results import RunResult

GB = 1e9


def ms(d, attr: str = "p50") -> str:
    return f"{getattr(d, attr) * 1000:.2f}" if d else "-"


def peak_memory_bytes(stage) -> float | None:
    mem = stage.memory or {}
    for key in ("process_peak_bytes", "torch_peak_reserved_bytes", "cpu_max_rss_bytes"):
        if mem.get(key):
            return float(mem[key])
    return None


def print_summary(run: RunResult) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"llmopt run {run.run_id}: {run.model.source if run.model else '?'} on {run.env.get('gpu') or run.env.get('cpu')}")
    for col in ("stage", "status", "load s", "TTFT p50 ms", "TPOT p50 ms", "E2E p50 s", "out tok/s", "peak mem GB", "note"):
        table.add_column(col)
    for s in run.stages:
        m = s.metrics
        peak = peak_memory_bytes(s)
        table.add_row(s.name, s.status, f"{s.load_s:.1f}" if s.load_s else "-", ms(m.ttft_s) if m else "-",
                      ms(m.tpot_s) if m else "-", f"{m.e2e_s.p50:.3f}" if m and m.e2e_s else "-",
                      f"{m.output_tok_s:.1f}" if m and m.output_tok_s else "-", f"{peak / GB:.2f}" if peak else "-",
                      (s.reason or "")[:80])
    Console().print(table)
