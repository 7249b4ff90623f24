"""`llmopt report RUN [RUN ...]`: report.md + charts/, report.html, stages.csv and points.csv, or
report.json and points.json from a run's run.json; several runs: runs.html, the runs side by side."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from llmopt_bench.cli.app import app
from llmopt_bench.core.errors import UsageError

FORMATS = ("md", "html", "csv", "json")


def parse_formats(value: list[str]) -> list[str]:
    formats = [f.strip().lower() for v in value for f in v.split(",") if f.strip()]
    bad = [f for f in formats if f not in FORMATS]
    if bad or not formats:
        raise UsageError(f"--format {', '.join(bad) or '(empty)'}: unknown", f"use one of {', '.join(FORMATS)} (repeat or comma-separate for several)")
    return list(dict.fromkeys(formats))


def check_run_dirs(run_dirs: list[Path]) -> None:
    for run_dir in run_dirs:
        if not run_dir.exists():
            raise UsageError(f"no run directory at {run_dir}", "pass a directory written by `llmopt bench` (results/runs/<timestamp>)")


@app.command("report")
def report_cmd(
    run_dirs: List[Path] = typer.Argument(..., metavar="RUN_DIR...", help="A run directory written by `llmopt bench` (or its run.json); several: one page of them all, the first the baseline."),
    fmt: Optional[List[str]] = typer.Option(None, "--format", "-f", metavar="FORMATS", help="md (report.md + charts/), html (report.html: one file, offline), csv (stages.csv, points.csv), json (report.json, points.json); repeat or comma-separate. [default: md,html; several runs: html]"),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Directory to write into. [default: RUN_DIR; several runs: the current directory]"),
    db: Optional[Path] = typer.Option(None, "--db", envvar="LLMOPT_HISTORY_DB", help="Several runs: the history whose runs of the baseline's device, model and workload join the page's history, and give the gate the baseline's noise as `llmopt compare` takes it. [default: $LLMOPT_HISTORY_DB, else history.sqlite in $LLMOPT_CACHE or ~/.cache/llmopt]"),
) -> None:
    """Write the report of a finished (or partial) run from its run.json alone, or one page of several runs; prints the paths written."""
    from llmopt_bench.cli.paths import output_dir, writing
    from llmopt_bench.core.results import load_run
    from llmopt_bench.render.report import DEFAULT_FORMATS, write_outputs

    several = len(run_dirs) > 1
    formats = parse_formats(fmt or (["html"] if several else list(DEFAULT_FORMATS)))
    if several and formats != ["html"]:
        raise UsageError(f"--format {','.join(formats)} with {len(run_dirs)} runs: several runs make one page, html",
                         "pass --format html with several runs, or one run for md, csv and json")
    check_run_dirs(run_dirs)
    runs = [load_run(d) for d in run_dirs]
    option = "--output" if output else "RUN_DIR"  # no --output: the report goes beside run.json
    here = run_dirs[0] if run_dirs[0].is_dir() else run_dirs[0].parent
    out = output_dir(output or (Path(".") if several else here), option, "results/reports/mine")
    with writing(out, option, "results/reports/mine", kind="directory"):
        if several:
            from llmopt_bench.render.html.write import write_runs_html
            from llmopt_bench.run.history import default_db

            names = [(d if d.is_dir() else d.parent).name for d in run_dirs]  # a run's id is often just "run"
            written = [write_runs_html(runs, out, db or default_db(), names)]
        else:
            written = write_outputs(runs[0], out, formats, run_dir=here)
    for path in written:
        typer.echo(str(path))
