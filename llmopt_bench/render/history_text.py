"""`llmopt history`'s text: a metric's trend per stage (`history show`) and the sustained shifts
(`history check`), at the terminal's width (render/terminal.py), each figure in the unit the
metric registry gives it, as compare prints it."""

from __future__ import annotations

from llmopt_bench.analysis.metric_registry import REGISTRY
from llmopt_bench.core.fmt import change
from llmopt_bench.render.compare_text import figure_text
from llmopt_bench.render.terminal import echo, print_table
from llmopt_bench.run.history import Shift, TrendPoint


def print_trend(points: list[TrendPoint], key: str) -> None:
    """The trend at the terminal's width (render/terminal.py): method, commit, interval, created and
    status are left out, in that order, where the rest would not fit."""
    m = REGISTRY.get(key)
    style = {"regressed": "bold red", "improved": "green", "inconclusive": "yellow", "not comparable": "magenta"}
    rows = []
    for p in points:
        ci = f"{change(p.ci[0] - 1)} … {change(p.ci[1] - 1)}" if p.ci else "-"
        value = figure_text(key, p.value)
        rows.append((p.stage, p.run_name or p.run_id, p.created_at[:16].replace("T", " "), (p.commit or "-")[:7], p.status, value,
                     change(p.change), ci, p.verdict, p.method or "-"))
    print_table(("stage", "run", "created (UTC)", "commit", "status", "value", "change", "interval", "verdict", "method"),
                rows, title=f"llmopt history: {m.label if m else key}",
                style_of=lambda i, text: style.get(text, "") if i == 8 else "", drop=(9, 3, 7, 2, 4),
                dropped_note="--json has every field")


def print_shifts(shifts: list[Shift], series: list[tuple[str, str, int]], min_runs: int) -> None:
    """A line per series that could hold a shift, its shifts under it; the series too short for
    one (fewer than 2 x --min-runs runs) in one line, not one each."""
    lines, short = [], []
    for name, key, n in series:
        if n < 2 * min_runs:
            short.append(f"{name} {key} ({n})")
            continue
        found = [s for s in shifts if (s.stage, s.metric) == (name, key)]
        lines.append(f"{name} {key}: {n} runs, {len(found) or 'no'} change point(s)")
        for s in found:
            state = ("REGRESSION, still in effect" if s.fails else s.direction + ("" if s.in_effect or s.direction != "regression"
                                                                                  else ", no longer in effect"))
            lines.append(f"  from run {s.run_name or s.run_id} ({s.created_at}, commit {(s.commit or '?')[:12]}): {change(s.change)} "
                         f"({s.runs_before} runs before, {s.runs_after} after; p={s.p_value:.3f}): {state}")
    if short:
        lines.append(f"Too few runs for a shift in {len(short)} series (a shift needs {min_runs} runs on each side, "
                     f"--min-runs): {', '.join(short)}.")
    echo(lines)
