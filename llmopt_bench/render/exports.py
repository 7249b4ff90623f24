"""The report's content as data, from run.json alone: the stage table as CSV for spreadsheets,
and everything report.md states (stages, speedups, roofline, claims, conclusions) as JSON."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from llmopt_bench.analysis.narrative.conclusions import conclusions
from llmopt_bench.analysis.roofline import roofline
from llmopt_bench.analysis.selectors import STAGE_COLUMNS, speedup_rows, stage_table_rows
from llmopt_bench.core.freeform import Json
from llmopt_bench.core.results import RunResult
from llmopt_bench.render.hooks import collect_claims


def write_csv(run: RunResult, out_dir: Path) -> Path:
    path = Path(out_dir) / "stages.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=STAGE_COLUMNS)
        w.writeheader()
        for row in stage_table_rows(run):
            w.writerow({k: "" if v is None else v for k, v in row.model_dump().items()})
    return path


def report_data(run: RunResult) -> Json:
    """Everything report.md states, as data."""

    claims = collect_claims(run)
    return {"run_id": run.run_id, "status": run.status, "created_at": run.created_at, "command": run.command,
            "model": run.model.model_dump() if run.model else None, "workload": run.workload.model_dump(),
            "env": run.env.model_dump(mode="json"), "stages": [r.model_dump() for r in stage_table_rows(run)],
            "speedups": [r.model_dump() for r in speedup_rows(run)],
            "roofline": [r.as_dict() for r in roofline(run)], "claims": [c.model_dump() for c in claims],
            "conclusions": conclusions(run, claims)}


def write_json(run: RunResult, out_dir: Path) -> Path:
    path = Path(out_dir) / "report.json"
    path.write_text(json.dumps(report_data(run), indent=1, default=str), encoding="utf-8")
    return path
