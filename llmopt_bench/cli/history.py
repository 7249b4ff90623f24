"""`llmopt history add RUN_DIR...` and `llmopt history show`: a metric's trend per stage across
runs kept in a SQLite file, with the runs where it changed beyond the threshold marked."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer

from llmopt_bench.cli.app import app

history_app = typer.Typer(help="Keep runs in a SQLite history and show a metric's trend per stage.",
                          no_args_is_help=True)
app.add_typer(history_app, name="history")

DB_HELP = "History database. [default: results/history.sqlite, or $LLMOPT_HISTORY_DB]"


def _db(db: Optional[Path]) -> Path:
    from llmopt_bench.history import DEFAULT_DB

    return db or DEFAULT_DB


@history_app.command("add")
def add_cmd(
    runs: List[Path] = typer.Argument(..., help="Run directories (or run.json files) written by `llmopt bench`."),
    db: Optional[Path] = typer.Option(None, "--db", envvar="LLMOPT_HISTORY_DB", help=DB_HELP),
) -> None:
    """Append runs to the history; a run already there (same run_id and created_at) is left as it is."""
    from llmopt_bench.history import add_run
    from llmopt_bench.results import load_run

    path = _db(db)
    for r in runs:
        run = load_run(r)
        added = add_run(path, run, source=str(r))
        print(f"{'added' if added else 'already in history'}: {run.run_id} ({run.created_at}) -> {path}", file=sys.stderr)


@history_app.command("show")
def show_cmd(
    stage: Optional[str] = typer.Option(None, "--stage", "-s", help="Only this stage. [default: every stage]"),
    metric: str = typer.Option("tpot_p50", "--metric", "-m", help="ttft_p50, tpot_p50, e2e_p50, output_tok_s, load_s, peak_memory, or any stored one (tpot_p90, itl_p99, qps, ...)."),
    chart: Optional[Path] = typer.Option(None, "--chart", help="Also draw the trend to FILE.png (needs matplotlib: pip install 'llmopt-bench[charts]')."),
    max_regression: Optional[List[str]] = typer.Option(None, "--max-regression", help="Threshold for marking a change, as in `llmopt compare` (5%, tpot=3%). Default: 5%, load 20%."),
    as_json: bool = typer.Option(False, "--json", help="Print the points as JSON."),
    db: Optional[Path] = typer.Option(None, "--db", envvar="LLMOPT_HISTORY_DB", help=DB_HELP),
) -> None:
    """Show a metric per stage across runs, oldest first, each run judged against the stage's previous run."""
    from llmopt_bench.analysis.compare import parse_thresholds
    from llmopt_bench.errors import MissingDependency, extra_fix
    from llmopt_bench.history import chart as draw
    from llmopt_bench.history import dump, metric_name, trend

    points = trend(_db(db), metric, stage, parse_thresholds(max_regression))
    if as_json:
        typer.echo(dump(points))
    else:
        _table(points, metric_name(metric))
    if chart is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise MissingDependency("--chart needs matplotlib", extra_fix("charts")) from None
        print(f"chart: {draw(points, metric, chart)}", file=sys.stderr)


def _table(points, key: str) -> None:
    from rich.console import Console
    from rich.table import Table

    from llmopt_bench.analysis.compare import METRICS
    from llmopt_bench.cli.compare import fmt_value, pct

    m = METRICS.get(key)
    unit = m.unit if m else ("ms" if key.split("_")[0] in ("ttft", "tpot", "itl", "e2e") else "")
    style = {"regressed": "bold red", "improved": "green", "inconclusive": "yellow", "not comparable": "magenta"}
    table = Table(title=f"llmopt history: {m.label if m else key}")
    for col in ("stage", "run", "created", "commit", "status", "value", "change", "interval", "verdict", "method"):
        table.add_column(col, overflow="fold")
    for p in points:
        ci = f"{pct(p.ci[0] - 1)} … {pct(p.ci[1] - 1)}" if p.ci else "-"
        verdict = f"[{style[p.verdict]}]{p.verdict}[/]" if p.verdict in style else p.verdict
        value = fmt_value(p.value, unit) if unit else ("-" if p.value is None else f"{p.value:.4g}")
        table.add_row(p.stage, p.run_id, p.created_at, (p.commit or "-")[:12], p.status, value, pct(p.change), ci,
                      verdict, p.method)
    Console(width=max(160, Console().width)).print(table)
