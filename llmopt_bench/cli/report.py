"""`llmopt report RUN_DIR`: report.md + charts/, stages.csv or report.json from a run's run.json."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from llmopt_bench.cli.app import app
from llmopt_bench.core.errors import UsageError

FORMATS = ("md", "csv", "json")


def parse_formats(value: list[str]) -> list[str]:
    formats = [f.strip().lower() for v in value for f in v.split(",") if f.strip()]
    bad = [f for f in formats if f not in FORMATS]
    if bad or not formats:
        raise UsageError(f"--format {', '.join(bad) or '(empty)'}: unknown", f"use one of {', '.join(FORMATS)} (repeat or comma-separate for several)")
    return list(dict.fromkeys(formats))


@app.command("report")
def report_cmd(
    run_dir: Path = typer.Argument(..., help="A run directory written by `llmopt bench` (or its run.json)."),
    fmt: list[str] = typer.Option(["md"], "--format", "-f", metavar="FORMATS", help="md (report.md + charts/), csv (stages.csv), json (report.json); repeat or comma-separate."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Directory to write into. [default: RUN_DIR]"),
) -> None:
    """Write the report of a finished (or partial) run from its run.json alone; prints the paths written."""
    from llmopt_bench.cli.paths import output_dir, writing
    from llmopt_bench.core.results import load_run
    from llmopt_bench.render.report import write_outputs

    formats = parse_formats(fmt)
    if not run_dir.exists():
        raise UsageError(f"no run directory at {run_dir}", "pass a directory written by `llmopt bench` (results/runs/<timestamp>)")
    run = load_run(run_dir)
    option = "--output" if output else "RUN_DIR"  # no --output: the report goes beside run.json
    out = output_dir(output or (run_dir if run_dir.is_dir() else run_dir.parent), option, "results/reports/mine")
    with writing(out, option, "results/reports/mine", kind="directory"):
        written = write_outputs(run, out, formats)
    for path in written:
        typer.echo(str(path))
