"""The end-of-run summary table on the terminal (stdout: it is the run's data).

It reads at any width: headers are two short lines with their unit and never cut; when the
terminal is too narrow for every column, the least telling columns are left out (and named:
run.json, report.md and --json have them all), and below ~40 columns each stage becomes a
block of lines. Why a stage did not run, and its fix, goes under the table, wrapped."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from llmopt_bench.analysis.figures import stage_figure
from llmopt_bench.core.fmt import change
from llmopt_bench.core.results import RunResult, StageResult


@dataclass(frozen=True)
class Column:
    header: tuple[str, str]  # two lines: the quantity, then its statistic and unit
    cell: Callable[[StageResult], str]
    drop_rank: int  # when the terminal is narrow, the highest rank goes first; 0 never goes


def figure(key: str, digits: int) -> Callable[[StageResult], str]:
    """A registered metric's cell: its figure (analysis/figures.py) in the unit the header names."""
    return lambda s: f"{v:.{digits}f}" if (v := stage_figure(s, key).value) else "-"


COLUMNS = (
    Column(("stage", ""), lambda s: s.name, 0),
    Column(("status", ""), lambda s: s.status, 0),
    Column(("load", "s"), figure("load_s", 1), 5),
    Column(("TTFT", "p50 ms"), figure("ttft_p50", 2), 2),
    Column(("TPOT", "p50 ms"), figure("tpot_p50", 2), 1),
    Column(("E2E", "p50 s"), figure("e2e_p50", 3), 6),
    Column(("output", "tok/s"), figure("output_tok_s", 1), 3),
    Column(("peak mem", "GB"), figure("peak_memory", 2), 4),
)


def note(s: StageResult) -> str:
    """Why a stage did not run, or what to keep in mind about its row."""
    parts = [s.reason] if s.reason else []
    q = s.quality
    if q and q.quality_regression and q.quality_ratio:
        parts.append(f"quality regression: perplexity {change(q.quality_ratio - 1)} vs {q.reference or 'the reference'}")
    if s.own_workload and s.status == "ok":
        parts.append("own workload (sweep): see the report")
    if s.fix and s.status != "ok":
        parts.append(f"fix: {s.fix}")
    return "; ".join(parts)


def _table(run: RunResult, columns: list[Column]):
    from rich import box
    from rich.table import Table

    # one space of padding plus the box's blank divider: two spaces between columns
    table = Table(box=box.SIMPLE_HEAD, padding=(0, 0, 0, 1), pad_edge=False, show_edge=False)
    for c in columns:
        table.add_column("\n".join(c.header), no_wrap=True, justify="left" if c.drop_rank == 0 else "right")
    for s in run.stages:
        table.add_row(*(c.cell(s) for c in columns))
    return table


def fitting_columns(run: RunResult, console) -> list[Column] | None:
    """The most columns whose table fits the console's width, dropping by rank; None when not
    even stage, status and TPOT fit (the caller stacks)."""
    from rich.measure import Measurement

    columns = list(COLUMNS)
    unbounded = console.options.update_width(100_000)  # else the measurement is clamped to the width
    while True:
        if Measurement.get(console, unbounded, _table(run, columns)).maximum <= console.width:
            return columns
        droppable = [c for c in columns if c.drop_rank > 1]
        if not droppable:
            return None
        columns.remove(max(droppable, key=lambda c: c.drop_rank))


def _stacked(run: RunResult) -> list[str]:
    lines = []
    for s in run.stages:
        lines.append(f"{s.name}: {s.status}")
        lines += [f"  {' '.join(c.header).strip()}: {c.cell(s)}" for c in COLUMNS[2:] if c.cell(s) != "-"]
    return lines


def print_summary(run: RunResult, console=None) -> None:
    from rich.console import Console
    from rich.markup import escape

    console = console or Console()
    device = run.env.machine or "?"
    console.print(escape(f"llmopt run {run.run_id}: {run.model.source if run.model else '?'} on {device}"))
    columns = fitting_columns(run, console)
    if columns is None:
        for line in _stacked(run):
            console.print(escape(line))
    else:
        console.print(_table(run, columns))
        left_out = [" ".join(c.header) for c in COLUMNS if c not in columns]
        if left_out:
            console.print(escape(f"(left out at this width: {', '.join(left_out)}; every column is in run.json, "
                                 "report.md and --json)"))
    notes = [(s.name, n) for s in run.stages if (n := note(s))]
    notes += [("workload", n) for n in run.workload.notes]
    for name, text in notes:
        console.print(escape(f"{name}: {text}"))
