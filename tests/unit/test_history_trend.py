"""`llmopt history show` on a metric compare does not judge (qps, a latency's p90...) gives the
relative change from the stage's previous ok run: a previous value of 0 has none, and once
divided by it (ZeroDivisionError, a traceback)."""

from __future__ import annotations

import json
from pathlib import Path

from llmopt_bench.core.results import parse_run
from llmopt_bench.run.history import add_run, trend

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "results" / "cpu" / "gate-calibration" / "run01" / "run.json"


def test_a_relative_change_from_a_previous_zero_is_reported_as_none_not_divided(tmp_path):
    db = tmp_path / "h.sqlite"
    raw = json.loads(RUN.read_text())
    for i, qps in enumerate((0.0, 0.5)):
        run = {**raw, "run_id": f"r{i}", "created_at": f"2026-12-0{i + 1}T10:00:00+00:00"}
        run["stages"] = [{**s, "metrics": {**s["metrics"], "qps": qps, "qps_repeats": [qps] * len(s["metrics"]["qps_repeats"])}}
                         for s in raw["stages"]]
        add_run(db, parse_run(run, "the test's run"))
    points = trend(db, "qps", "hf-fp16")
    assert [(p.value, p.verdict) for p in points] == [(0.0, "first"), (0.5, "-")]
    assert points[1].change is None and points[1].method == "no relative change from a previous value of 0"
