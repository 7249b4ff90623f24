"""The run history: a SQLite file (results/history.sqlite by default) that keeps every added
run's run.json and a flat table of its metrics, and a metric's trend per stage with the runs
where it changed beyond the threshold marked.

Between consecutive runs that are comparable (same device, model, workload) a gating metric
(analysis/compare.py METRICS) is judged with compare's bootstrap on the stored samples; other
metrics, and pairs without samples, with a relative-change rule (|new/old - 1| > threshold)."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from llmopt_bench.analysis import compare
from llmopt_bench.errors import UsageError
from llmopt_bench.results import RunResult, StageResult, utcnow

DEFAULT_DB = Path("results") / "history.sqlite"
DISTRIBUTIONS = ("ttft_s", "tpot_s", "itl_s", "e2e_s")
STATS = ("p50", "p90", "p99", "mean")

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
  run_id TEXT NOT NULL, created_at TEXT NOT NULL, added_at TEXT NOT NULL, device TEXT, model TEXT,
  workload TEXT, llmopt_commit TEXT, source TEXT, run_json TEXT NOT NULL, PRIMARY KEY (run_id, created_at));
CREATE TABLE IF NOT EXISTS stages (
  run_id TEXT NOT NULL, created_at TEXT NOT NULL, stage TEXT NOT NULL, status TEXT NOT NULL, reason TEXT,
  PRIMARY KEY (run_id, created_at, stage));
CREATE TABLE IF NOT EXISTS metrics (
  run_id TEXT NOT NULL, created_at TEXT NOT NULL, stage TEXT NOT NULL, metric TEXT NOT NULL, value REAL,
  PRIMARY KEY (run_id, created_at, stage, metric));
"""


def connect(db: Path, create: bool = True) -> sqlite3.Connection:
    db = Path(db)
    if not create and not db.is_file():
        raise UsageError(f"no history database at {db}", "add runs first: llmopt history add RUN_DIR (or pass --db FILE)")
    db.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(db)
    conn.executescript(SCHEMA)
    return conn


def stage_values(stage: StageResult) -> dict[str, float]:
    """Every scalar a trend can show: compare's metrics plus each latency's p50/p90/p99/mean and QPS."""
    out = {k: compare.metric_value(stage, k) for k in compare.METRICS}
    m = stage.metrics
    if m:
        for name in DISTRIBUTIONS:
            d = getattr(m, name)
            for stat in STATS:
                out[f"{name[:-2]}_{stat}"] = getattr(d, stat) if d else None
        out["qps"] = m.qps
    return {k: v for k, v in out.items() if v is not None}


def add_run(db: Path, run: RunResult, source: str = "") -> bool:
    """Append a run; False when this run (run_id, created_at) is already there."""
    conn = connect(db)
    try:
        key = (run.run_id, run.created_at)
        cur = conn.execute("INSERT OR IGNORE INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                           (*key, utcnow(), compare.device_name(run), run.model.source if run.model else None,
                            run.workload.model_dump_json(), run.env.get("llmopt_commit"), source,
                            run.model_dump_json()))
        if cur.rowcount == 0:
            return False
        for s in run.stages:
            conn.execute("INSERT INTO stages VALUES (?, ?, ?, ?, ?)", (*key, s.name, s.status, s.reason))
            conn.executemany("INSERT INTO metrics VALUES (?, ?, ?, ?, ?)",
                             [(*key, s.name, k, v) for k, v in stage_values(s).items()])
        conn.commit()
        return True
    finally:
        conn.close()


def known_metrics(conn: sqlite3.Connection) -> list[str]:
    return [r[0] for r in conn.execute("SELECT DISTINCT metric FROM metrics ORDER BY metric")]


def metric_name(name: str) -> str:
    try:
        return compare.metric_key(name)
    except UsageError:
        return name.strip().lower()


@dataclass
class TrendPoint:
    stage: str
    run_id: str
    created_at: str
    commit: str | None
    status: str
    value: float | None
    change: float | None = None  # vs the previous run of this stage
    ci: tuple[float, float] | None = None
    verdict: str = ""  # regressed | improved | unchanged | inconclusive | not comparable | first | -
    method: str = ""  # bootstrap-... | single value | relative change


def _relative(prev: float, value: float, threshold: float, higher_is_better: bool) -> tuple[float, str]:
    ratio = value / prev
    return ratio, compare.verdict(ratio, None, threshold, higher_is_better)


def trend(db: Path, metric: str = "tpot_p50", stage: str | None = None, thresholds: dict[str, float] | None = None,
          resamples: int = 2000, seed: int = 0) -> list[TrendPoint]:
    """One point per (stage, run), oldest first, each judged against the stage's previous run."""
    key = metric_name(metric)
    conn = connect(db, create=False)
    try:
        if key not in known_metrics(conn):
            raise UsageError(f"metric {metric!r} is not in the history",
                             f"use one of {', '.join(known_metrics(conn)) or '(none: add runs first)'}")
        rows = conn.execute(
            "SELECT s.stage, s.run_id, s.created_at, r.llmopt_commit, s.status, m.value, r.run_json, r.device, r.model, r.workload "
            "FROM stages s JOIN runs r USING (run_id, created_at) "
            "LEFT JOIN metrics m ON m.run_id = s.run_id AND m.created_at = s.created_at AND m.stage = s.stage AND m.metric = ? "
            "WHERE (? IS NULL OR s.stage = ?) ORDER BY s.stage, s.created_at, r.added_at", (key, stage, stage)).fetchall()
    finally:
        conn.close()
    if not rows:
        raise UsageError(f"no runs of stage {stage!r} in the history" if stage else "the history holds no runs",
                         "add runs with: llmopt history add RUN_DIR")
    higher = compare.METRICS[key].higher_is_better if key in compare.METRICS else key.endswith(("tok_s", "qps"))
    threshold = compare.threshold_for(key, thresholds)
    points, prev, parsed = [], {}, {}

    def run_of(text: str) -> RunResult:
        if text not in parsed:
            parsed[text] = RunResult.model_validate_json(text)
        return parsed[text]

    for name, run_id, created, commit, status, value, run_json, device, model, workload in rows:
        p = TrendPoint(name, run_id, created, commit, status, value)
        last = prev.get(name)
        if status != "ok" or value is None:
            p.verdict = "-"
        elif last is None:
            p.verdict = "first"
        elif last[1:4] != (device, model, workload):
            p.verdict, p.method = "not comparable", "device, model or workload differ"
        elif key in compare.METRICS:
            d = compare.compare_metric(key, run_of(last[0]).stage(name), run_of(run_json).stage(name), threshold,
                                       resamples, seed=seed)
            p.change, p.ci, p.verdict, p.method = d.change, d.ci, d.verdict, d.method
        else:
            ratio, p.verdict = _relative(last[4], value, threshold, higher)
            p.change, p.method = ratio - 1, "relative change"
        if status == "ok" and value is not None:
            prev[name] = (run_json, device, model, workload, value)
        points.append(p)
    return points


def chart(points: list[TrendPoint], metric: str, path: Path) -> Path:
    """A line per stage over the runs, regressions marked red, improvements green (matplotlib, Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    order = sorted({(p.created_at, p.run_id) for p in points})
    index = {k: i for i, k in enumerate(order)}
    key = metric_name(metric)
    m = compare.METRICS.get(key)
    scale, unit = {"ms": (1000, "ms"), "GB": (1e-9, "GB")}.get(m.unit if m else "", (1, m.unit if m else ""))
    if not m and key.split("_")[0] in ("ttft", "tpot", "itl", "e2e"):
        scale, unit = 1000, "ms"
    fig, ax = plt.subplots(figsize=(max(6, len(order) * 0.6 + 3), 4))
    for name in sorted({p.stage for p in points}):
        pts = [p for p in points if p.stage == name and p.value is not None and p.status == "ok"]
        xs, ys = [index[(p.created_at, p.run_id)] for p in pts], [p.value * scale for p in pts]
        ax.plot(xs, ys, marker="o", label=name)
        for p, x, y in zip(pts, xs, ys):
            if p.verdict in ("regressed", "improved"):
                ax.scatter([x], [y], s=140, facecolors="none", edgecolors="red" if p.verdict == "regressed" else "green", linewidths=2, zorder=3)
    ax.set_xticks(range(len(order)), [rid for _, rid in order], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(f"{m.label if m else key} ({unit})" if unit else (m.label if m else key))
    ax.set_title(f"llmopt history: {m.label if m else key}\ncircled: red regressed, green improved vs the previous run",
                 fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def dump(points: list[TrendPoint]) -> str:
    return json.dumps([p.__dict__ for p in points], indent=1)
