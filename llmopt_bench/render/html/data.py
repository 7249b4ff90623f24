"""What the HTML report reads of a run: each stage figure through ONE function (stage_figure,
the figures every other output shows), a stage's load curve and its requests by load point
(requests.jsonl), and tune's record (tune.json), all read as run.json and the run directory
keep them, never through a stage's own types (the report knows no stage)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmopt_bench.analysis import figures
from llmopt_bench.core.freeform import Json
from llmopt_bench.core.results import StageResult
from llmopt_bench.run.rundir import RunDir

TUNE_JSON = "tune.json"  # what `llmopt tune` keeps beside run.json (tune/record.py)


@dataclass(frozen=True)
class Figure:
    """A stage's figure as every output shows it (analysis/figures.py), in the shown unit, with
    that statistic's 95% interval over the repeats (lo, hi: None where there is none) and how
    many repeats it rests on."""

    value: float | None
    unit: str
    lo: float | None
    hi: float | None
    repeats: int

    def error_y(self) -> dict:
        """The interval as a plotly bar's whiskers (none without one)."""
        v = self.value or 0.0
        return {"type": "data", "symmetric": False, "array": [self.hi - v if self.hi is not None else 0],
                "arrayminus": [v - self.lo if self.lo is not None else 0]}


def whiskers(figures: list[Figure]) -> dict:
    """Several figures' whiskers, one trace's."""
    parts = [f.error_y() for f in figures]
    return {"type": "data", "symmetric": False, "array": [p["array"][0] for p in parts],
            "arrayminus": [p["arrayminus"][0] for p in parts]}


def stage_figure(result: StageResult, metric: str) -> Figure:
    """The one place the HTML report reads a stage figure (metric: a key of the metric registry):
    analysis/figures.stage_figure, the value and interval report.md, stages.csv, compare and
    history show."""
    f = figures.stage_figure(result, metric)
    lo, hi = f.interval if f.interval else (None, None)
    return Figure(f.value, f.unit, lo, hi, f.n_repeats)


def load_curves(result: StageResult) -> list[tuple[str, list[Json]]]:
    """A stage's load points as its extra keeps them: (arm, rows), the stage's own curve under
    "", a prefix-caching stage's arms under their names (load/record.PointRow's fields)."""
    x = result.extra or {}
    out = []
    arms = (x.get("prefix_caching") or {}).get("arms") or []
    for arm in arms:
        out.append((f"prefix caching {'on' if arm.get('enable_prefix_caching') else 'off'}", arm.get("curve") or []))
    if x.get("curve") and not arms:
        out.append(("", x["curve"]))
    return [(name, [r for r in rows if isinstance(r, dict)]) for name, rows in out if rows]


def point_key(row: Json) -> str:
    """The name a load point's requests carry in requests.jsonl (`point`) and its energy window:
    the phase and the point's label (load/point.LoadPoint.label), as the serving scenario writes it."""
    if row.get("concurrency") is not None:
        label = f"concurrency {row['concurrency']}"
    elif row.get("rate_rps") is not None:
        b = row.get("burstiness")
        label = f"{row['rate_rps']:g} req/s" + ("" if b in (None, 1.0) else f", burstiness {b:g}")
    else:
        label = "?"
    return f"{row.get('phase') or row.get('mode') or 'point'}: {label}"


def request_lines(run_dir: Path | None) -> list[Json]:
    """requests.jsonl beside run.json (run/rundir.py reads it: a torn line skipped, said)."""
    return RunDir(Path(run_dir)).request_lines() if run_dir else []


def requests_by_point(result: StageResult, lines: list[Json]) -> dict[str, list[Json]]:
    """The stage's requests by the load point they were sent in. A run from before every point
    was kept holds the headline point's alone, without a `point`: they are its main_point's."""
    main = (result.extra or {}).get("main_point")
    out: dict[str, list[Json]] = {}
    for r in lines:
        if r.get("stage") != result.name:
            continue
        point = r.get("point") or main
        if point:
            out.setdefault(point, []).append(r)
    return out


def tune_record(run_dir: Path | None) -> Json | None:
    """tune.json beside run.json (an `llmopt tune` run), as written; None where there is none."""
    path = Path(run_dir) / TUNE_JSON if run_dir else None
    if path is None or not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        print(f"warning: {path}: not readable ({e}); the report has no tune section", file=sys.stderr)
        return None
    return data if isinstance(data, dict) else None


def number(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
