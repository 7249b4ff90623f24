"""The two files: report.html for one run (beside its report.md), runs.html for several."""

from __future__ import annotations

from pathlib import Path

from llmopt_bench.core.results import RunResult
from llmopt_bench.render.html.page import write_page
from llmopt_bench.render.html.run_page import run_page
from llmopt_bench.render.html.runs import runs_page

RUN_HTML, RUNS_HTML = "report.html", "runs.html"


def write_run_html(run: RunResult, out_dir: Path, run_dir: Path | None = None) -> Path:
    """report.html in out_dir; run_dir holds requests.jsonl and tune.json (default: out_dir)."""
    return write_page(Path(out_dir) / RUN_HTML, f"llmopt report: {run.run_id}", run_page(run, run_dir or Path(out_dir)))


def write_runs_html(runs: list[RunResult], out_dir: Path, db: Path | None = None, names: list[str] | None = None) -> Path:
    """runs.html in out_dir: the runs side by side against the first, and their history; names:
    how the page calls each (default: their run ids)."""
    page = runs_page(runs, db, names)
    return write_page(Path(out_dir) / RUNS_HTML, f"llmopt: {len(runs)} runs against {page['header']['baseline']}", page)
