"""`llmopt history add RUN_DIR...`, `llmopt history show` (a metric's trend per stage across runs
kept in a SQLite file, the runs where it changed beyond the threshold marked) and `llmopt
history check` (sustained shifts: E-divisive means; exit 5 on a regression still in effect)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer

from llmopt_bench.cli.app import app

history_app = typer.Typer(help="Keep runs in a SQLite history, show a metric's trend per stage, find sustained shifts.",
                          no_args_is_help=True)
app.add_typer(history_app, name="history")

DB_HELP = "History database. [default: $LLMOPT_HISTORY_DB, else history.sqlite in $LLMOPT_CACHE or ~/.cache/llmopt]"
DEFAULT_CHECKED = ["tpot_p50", "ttft_p50", "output_tok_s"]


def _db(db: Optional[Path]) -> Path:
    from llmopt_bench.run.history import default_db

    return db or default_db()


@history_app.command("add")
def add_cmd(
    runs: List[Path] = typer.Argument(..., help="Run directories (or run.json files) written by `llmopt bench`."),
    db: Optional[Path] = typer.Option(None, "--db", envvar="LLMOPT_HISTORY_DB", help=DB_HELP),
) -> None:
    """Append runs to the history; a run already there (same run_id and created_at) is left as it is."""
    from llmopt_bench.cli.paths import output_file
    from llmopt_bench.core.results import load_run
    from llmopt_bench.run.history import add_run

    path = output_file(_db(db), "--db", "~/.cache/llmopt/history.sqlite")
    for r in runs:
        run = load_run(r)
        added = add_run(path, run, source=str(r))
        print(f"{'added' if added else 'already in history'}: {run.label} ({run.created_at}) -> {path}", file=sys.stderr)


@history_app.command("show")
def show_cmd(
    stage: Optional[str] = typer.Option(None, "--stage", "-s", help="Only this stage. [default: every stage]"),
    metric: str = typer.Option("tpot_p50", "--metric", "-m", help="A metric by its name or an alias (docs/regression.md): tpot_p50 (tpot), ttft_p50 (ttft), e2e_p50, output_tok_s (tok_s), load_s (load), peak_memory (memory), or any stored one (tpot_p90, itl_p99, qps, perplexity, ...)."),
    chart: Optional[Path] = typer.Option(None, "--chart", help="Also draw the trend to FILE.png (needs matplotlib: pip install 'llmopt-bench[charts]')."),
    max_regression: Optional[List[str]] = typer.Option(None, "--max-regression", metavar="SPEC", help="Threshold for marking a change, as in `llmopt compare` (5%, tpot=3%). Default: 5%, load 20%."),
    as_json: bool = typer.Option(False, "--json", help="Print the points as JSON."),
    db: Optional[Path] = typer.Option(None, "--db", envvar="LLMOPT_HISTORY_DB", help=DB_HELP),
) -> None:
    """Show a metric per stage across runs, oldest first, each run judged against the stage's previous run."""
    from llmopt_bench.analysis.gate.compare import parse_thresholds
    from llmopt_bench.cli.paths import output_file, writing
    from llmopt_bench.core.errors import MissingDependency, extra_fix
    from llmopt_bench.render.history_text import print_trend
    from llmopt_bench.run.history import chart as draw
    from llmopt_bench.run.history import dump, metric_name, trend

    if chart is not None:  # checked before the work: a bad path is refused first
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise MissingDependency("--chart needs matplotlib", extra_fix("charts")) from None
        chart = output_file(chart, "--chart", "trend.png")
    points = trend(_db(db), metric, stage, parse_thresholds(max_regression))
    if as_json:
        typer.echo(dump(points, metric))
    else:
        print_trend(points, metric_name(metric))
    if chart is not None:
        with writing(chart, "--chart", "trend.png"):
            print(f"chart: {draw(points, metric, chart)}", file=sys.stderr)


def shift_levels(s) -> dict:
    """A shift's levels before and after in the unit beside them (the registry's), for --json."""
    from llmopt_bench.analysis.metric_registry import REGISTRY

    m = REGISTRY.get(s.metric)
    return {"before": m.shown(s.before), "after": m.shown(s.after), "unit": m.unit} if m else {"unit": None}


@history_app.command("check")
def check_cmd(
    metric: Optional[List[str]] = typer.Option(None, "--metric", "-m", metavar="NAME", help="Metrics to check (repeat). [default: tpot_p50, ttft_p50, output_tok_s]"),
    stage: Optional[str] = typer.Option(None, "--stage", "-s", help="Only this stage. [default: every stage]"),
    since: Optional[str] = typer.Option(None, "--since", help="Only runs from this one on (its name as `history show` lists it, or its run_id): after an intended change, the first run of the new level (NAME@CREATED_AT where two runs share the name)."),
    window: int = typer.Option(60, "--window", min=6, help="The latest N ok runs of each stage are analysed."),
    significance: float = typer.Option(0.01, "--significance", min=0.0001, max=0.5, help="Permutation-test level a change point must reach."),
    permutations: int = typer.Option(499, "--permutations", min=99, help="Permutations per test."),
    min_runs: int = typer.Option(3, "--min-runs", min=2, help="A shift must last this many runs on each side (one noisy night is not a shift)."),
    max_regression: Optional[List[str]] = typer.Option(None, "--max-regression", metavar="SPEC", help="A shift smaller than this is not a regression, as in `llmopt compare` (5%, tpot=3%). Default: 5%, load 20%."),
    as_json: bool = typer.Option(False, "--json", help="Print the shifts as JSON."),
    db: Optional[Path] = typer.Option(None, "--db", envvar="LLMOPT_HISTORY_DB", help=DB_HELP),
) -> None:
    """Find sustained shifts in each stage's series (E-divisive means with a permutation test) and
    name each one's first run; exit 5 when a regression shift is still in effect."""
    import json
    from dataclasses import asdict

    from llmopt_bench.analysis.gate.compare import parse_thresholds
    from llmopt_bench.core.errors import ExitCode, LlmoptError
    from llmopt_bench.core.fmt import change
    from llmopt_bench.render.history_text import print_shifts
    from llmopt_bench.run.history import check, since_arg

    shifts, series = check(_db(db), metric or DEFAULT_CHECKED, stage, parse_thresholds(max_regression), since=since,
                           window=window, significance=significance, permutations=permutations, min_size=min_runs)
    if as_json:
        typer.echo(json.dumps({"shifts": [{**asdict(s), **shift_levels(s), "fails": s.fails} for s in shifts],
                               "series": [{"stage": a, "metric": b, "runs": n} for a, b, n in series]}, indent=1))
    else:
        print_shifts(shifts, series, min_runs)
    failing = [s for s in shifts if s.fails]
    if failing:
        what = "; ".join(f"{s.stage} {s.metric} {change(s.change)} from run {s.run_name or s.run_id}" for s in failing)
        raise LlmoptError(f"{len(failing)} sustained regression(s): {what}",
                          "if the change is intended, check from the new level on: llmopt history check --since "
                          f"{since_arg(_db(db), failing[0].run_name or failing[0].run_id, failing[0].created_at)}", code=ExitCode.REGRESSION)
