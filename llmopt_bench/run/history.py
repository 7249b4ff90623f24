"""The run history: a SQLite file that keeps every added run's run.json and a flat table of its
metrics; a metric's trend per stage; and the sustained shifts in it (`llmopt history check`).

The file is $LLMOPT_HISTORY_DB, else history.sqlite in the llmopt cache ($LLMOPT_CACHE, else
~/.cache/llmopt): one place whatever the current directory, outside any checkout.

Runs are comparable when their fingerprint matches: device, model, workload and the stage's
params. Between consecutive comparable runs a judged metric (analysis/metric_registry.py) is
judged with compare's method, the earlier comparable runs giving the baseline's noise; other
metrics with a relative-change rule (|new/old - 1| > threshold). `check` runs E-divisive means
(analysis/gate/changepoint.py) over each stage's series of the current fingerprint."""

from __future__ import annotations

import json
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from llmopt_bench.analysis import hostbound
from llmopt_bench.analysis.figures import quiet, stage_figure
from llmopt_bench.analysis.gate import changepoint, compare
from llmopt_bench.analysis.metric_registry import REGISTRY, lookup
from llmopt_bench.core.errors import UsageError
from llmopt_bench.core.models import cache_dir
from llmopt_bench.core.results import RunResult, StageResult, parse_run, utcnow

NOISE_RUNS = 20  # the earlier comparable runs whose spread is the baseline's noise

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


def default_db() -> Path:
    env = os.environ.get("LLMOPT_HISTORY_DB")
    return Path(env) if env else cache_dir() / "history.sqlite"


def connect(db: Path, create: bool = True) -> sqlite3.Connection:
    """The history, opened (created when `create`); a path that is not one is a usage error."""
    db = Path(db)
    if db.is_dir():
        raise UsageError(f"--db {db}: a directory, not a history file", f"pass a file path, like --db {db / 'history.sqlite'}")
    if not create and not db.is_file():
        raise UsageError(f"no history database at {db}", "add runs first: llmopt history add RUN_DIR (or pass --db FILE)")
    try:
        db.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(db)
        conn.executescript(SCHEMA)
    except (OSError, sqlite3.Error) as e:
        raise not_a_history(db, e) from None
    return conn


def not_a_history(db: Path, e: BaseException) -> UsageError:
    return UsageError(f"--db {db}: not a history llmopt can open or write (SQLite: {e})",
                      "pass the file `llmopt history add` writes (or a new path for a new history), in a directory you can write to")


def stage_values(stage: StageResult) -> dict[str, float]:
    """Every scalar a trend can show: each registered metric's figure (analysis/figures.py, the
    one every output shows) the stage recorded, under its key, in run.json's unit."""
    out = {k: stage_figure(stage, m).recorded for k, m in REGISTRY.items()}
    return {k: v for k, v in out.items() if v is not None}


def add_run(db: Path, run: RunResult, source: str = "") -> bool:
    """Append a run; False when this run (run_id, created_at) is already there."""
    conn = connect(db)
    try:
        return _insert(conn, run, source)
    except sqlite3.Error as e:  # a read-only file, a full disk
        raise not_a_history(Path(db), e) from None
    finally:
        conn.close()


def _insert(conn: sqlite3.Connection, run: RunResult, source: str) -> bool:
    key = (run.run_id, run.created_at)
    cur = conn.execute("INSERT OR IGNORE INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       (*key, utcnow(), compare.device_name(run), run.model.source if run.model else None,
                        run.workload.model_dump_json(), run.env.llmopt_commit, source,
                        run.model_dump_json()))
    if cur.rowcount == 0:
        return False
    for s in run.stages:
        conn.execute("INSERT INTO stages VALUES (?, ?, ?, ?, ?)", (*key, s.name, s.status, s.reason))
        conn.executemany("INSERT INTO metrics VALUES (?, ?, ?, ?, ?)",
                         [(*key, s.name, k, v) for k, v in stage_values(s).items()])
    conn.commit()
    return True


def known_metrics(conn: sqlite3.Connection) -> list[str]:
    return [r[0] for r in conn.execute("SELECT DISTINCT metric FROM metrics ORDER BY metric")]


def metric_name(name: str) -> str:
    """The registry's key for any name it knows (tpot, ttft_s.p90, peak_mem_gb), else the name as
    stored (a metric an older llmopt wrote)."""
    m = lookup(name)
    return m.key if m else name.strip().lower()


def higher_is_better(key: str) -> bool:
    return REGISTRY[key].higher_is_better if key in REGISTRY else key.endswith(("tok_s", "qps"))


def fingerprint_runs(db: Path, like: RunResult, before: RunResult, limit: int = NOISE_RUNS) -> list[RunResult]:
    """The latest `limit` runs of the history with the device, model and workload of `like`,
    created before `before` and other than it (compare then keeps, per stage, those whose stage
    params match). Empty when the database does not exist: compare works from the two runs."""
    if not Path(db).is_file():
        return []
    conn = connect(db, create=False)
    try:
        rows = conn.execute(
            "SELECT run_json FROM runs WHERE device IS ? AND model IS ? AND workload = ? AND created_at < ? "
            "AND NOT (run_id = ? AND created_at = ?) ORDER BY created_at DESC LIMIT ?",
            (compare.device_name(like), like.model.source if like.model else None, like.workload.model_dump_json(),
             before.created_at, before.run_id, before.created_at, limit)).fetchall()
    finally:
        conn.close()
    return [parse_run(json.loads(text), "the history database") for (text,) in reversed(rows)]


@dataclass
class StageValue:
    """One stage of one run in the history and the value of the metric asked for (None where it has none)."""

    stage: str
    run_id: str
    created_at: str
    commit: str | None
    status: str
    value: float | None


@dataclass
class Row(StageValue):
    """One stage of one run in the history, with the metric asked for."""

    run_json: str
    fingerprint: tuple

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.value is not None


def metric_rows(db: Path, metric: str, stage: str | None = None) -> list[Row]:
    """Every stage row with the metric, oldest first per stage; refuses an unknown metric."""
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
    params: dict[tuple, str] = {}
    for name, run_id, created, _, _, _, text, *_ in rows:
        stages = {s["name"]: s for s in json.loads(text)["stages"]}  # plain JSON: the params only
        params[(name, run_id, created)] = json.dumps(stages[name].get("params", {}), sort_keys=True)
    figure = figure_reader(key)
    return [Row(name, run_id, created, commit, status, figure(text, name, value), text,
                (device, model, workload, params[(name, run_id, created)]))
            for name, run_id, created, commit, status, value, text, device, model, workload in rows]


def figure_reader(key: str):
    """(run_json, stage, stored value) -> the stage's figure of `key` read from its stored run
    (analysis/figures.py), so that a history written by an older llmopt, which stored another
    statistic, shows and judges the figure every other output shows; a name the registry does
    not know keeps its stored value. Each run is parsed once."""
    if key not in REGISTRY:
        return lambda text, stage, stored: stored
    parsed: dict[str, RunResult] = {}

    def read(text: str, stage: str, stored: float | None) -> float | None:
        if stored is None:  # no figure stored: the stage did not record it
            return None
        if text not in parsed:
            parsed[text] = parse_run(json.loads(text), "the history database")
        found = parsed[text].stage(stage)
        return stage_figure(found, key).recorded if found is not None else stored
    return read


@dataclass
class TrendPoint(StageValue):
    change: float | None = None  # vs the previous comparable run of this stage
    ci: tuple[float, float] | None = None
    verdict: str = ""  # regressed | improved | unchanged | inconclusive | not comparable | first | -
    method: str = ""  # repeats | history | single value | relative change | ...
    run_name: str = ""  # what the history calls the run (run_names)


def trend(db: Path, metric: str = "tpot_p50", stage: str | None = None, thresholds: dict[str, float] | None = None,
          resamples: int = 2000, seed: int = 0) -> list[TrendPoint]:
    """One point per (stage, run), oldest first, each judged against the stage's previous ok run,
    the comparable runs before that one giving the baseline's noise."""
    key = metric_name(metric)
    threshold = compare.threshold_for(key, thresholds)
    points: list[TrendPoint] = []
    seen: dict[str, list[Row]] = {}  # each stage's ok rows so far
    parsed: dict[str, RunResult] = {}

    def stage_of(row: Row) -> StageResult:
        if row.run_json not in parsed:
            parsed[row.run_json] = parse_run(json.loads(row.run_json), "the history database")
        found = parsed[row.run_json].stage(row.stage)
        assert found is not None, "a row of the history is a stage of the run.json stored beside it"
        return found

    rows, names = metric_rows(db, metric, stage), run_names(db)
    for row in rows:
        p = TrendPoint(row.stage, row.run_id, row.created_at, row.commit, row.status, row.value,
                       run_name=names.get((row.run_id, row.created_at), row.run_id))
        earlier = seen.setdefault(row.stage, [])
        last = earlier[-1] if earlier else None
        if not row.ok:
            p.verdict = "-"
        elif last is None:
            p.verdict = "first"
        elif last.fingerprint != row.fingerprint:
            p.verdict, p.method = "not comparable", "device, model, workload or stage params differ"
        elif key in compare.METRICS:
            past = [v for r in earlier if r.fingerprint == row.fingerprint and (v := r.value) is not None][-NOISE_RUNS:]
            bound = hostbound.host_bound(stage_of(row), parsed[row.run_json]).host_bound  # 10% where host-bound, as compare
            # each side's repeats the host disturbed set aside, as compare sets them aside: the
            # change judged is the change between the two figures the rows show
            d = compare.compare_metric(key, quiet(stage_of(last))[0], quiet(stage_of(row))[0],
                                       compare.threshold_for(key, thresholds, bound), resamples, seed=seed, history=past)
            p.change, p.ci, p.verdict, p.method = d.change, d.ci, d.verdict, d.method
        elif row.value is not None and last.value:  # an ok row has its value; a ratio needs a previous one above 0
            ratio = row.value / last.value
            p.change, p.method = ratio - 1, "relative change"
            p.verdict = compare.change_verdict(ratio, None, threshold, higher_is_better(key))
        else:
            p.verdict, p.method = "-", "no relative change from a previous value of 0"
        if row.ok:
            earlier.append(row)
        points.append(p)
    return points


def run_names(db: Path) -> dict[tuple[str, str], str]:
    """(run_id, created_at) -> what the history calls the run: its run.json's name (`bench --name`,
    else its directory's), else, for a run added before names, its run_id."""
    conn = connect(db, create=False)
    try:
        rows = conn.execute("SELECT run_id, created_at, COALESCE(json_extract(run_json, '$.name'), run_id) FROM runs").fetchall()
    finally:
        conn.close()
    return {(run_id, created): name for run_id, created, name in rows}


# a run named on the command line (--since): by the name the history shows (run.json's `name`) or by its run_id
NAMED = "(run_id = ? OR json_extract(run_json, '$.name') = ?)"


def _created_at(db: Path, since: str) -> str:
    """--since NAME (or NAME@CREATED_AT) -> the run's created_at. NAME is what `history show`
    lists (the run's name) or its run_id; two runs may share one: then the name alone is refused,
    never one of them guessed."""
    name, _, created = since.partition("@")
    conn = connect(db, create=False)
    try:
        found = [r[0] for r in conn.execute(f"SELECT created_at FROM runs WHERE {NAMED} AND (? = '' OR created_at = ?) "
                                            "ORDER BY created_at", (name, name, created, created))]
    finally:
        conn.close()
    if not found:
        raise UsageError(f"--since {since!r}: no such run in the history", "pass a run name that `llmopt history show` lists")
    if len(found) > 1:
        raise UsageError(f"--since {since!r}: {len(found)} runs in the history have this name (created {', '.join(found)})",
                         f"name one by its name and created time, like --since {name}@{found[-1]}")
    return found[0]


def since_arg(db: Path, name: str, created_at: str) -> str:
    """The --since value that names this run: its name, or name@created_at where the name is shared."""
    conn = connect(db, create=False)
    try:
        n = conn.execute(f"SELECT COUNT(*) FROM runs WHERE {NAMED}", (name, name)).fetchone()[0]
    finally:
        conn.close()
    return name if n <= 1 else f"{name}@{created_at}"


@dataclass
class Shift:
    """A sustained change of a stage's metric, from its first run on (`llmopt history check`)."""

    stage: str
    metric: str
    run_id: str  # the first run of the new level
    created_at: str
    commit: str | None
    runs_before: int
    runs_after: int
    before: float  # median of the level before
    after: float  # median of the new level
    change: float  # after / before - 1
    p_value: float
    direction: str  # regression | improvement | below threshold
    in_effect: bool  # the latest level is still worse than the level before the shift, beyond the threshold
    run_name: str = ""  # what the history calls that first run (run_names)

    @property
    def fails(self) -> bool:
        return self.direction == "regression" and self.in_effect


def check(db: Path, metrics: list[str], stage: str | None = None, thresholds: dict[str, float] | None = None,
          since: str | None = None, window: int = 60, significance: float = 0.01, permutations: int = 499,
          min_size: int = 3, seed: int = 0) -> tuple[list[Shift], list[tuple[str, str, int]]]:
    """Change points per stage and metric over the latest `window` ok runs of the stage's current
    fingerprint (from run `since` on, when given: how an accepted shift stops failing the check).
    Returns the shifts and, per series, (stage, metric, runs analysed)."""
    shifts, series = [], []
    start = _created_at(db, since) if since is not None else ""
    names = run_names(db)
    for metric in metrics:
        key = metric_name(metric)
        by_stage: dict[str, list[Row]] = {}
        for row in metric_rows(db, key, stage):
            if row.ok and row.created_at >= start:
                by_stage.setdefault(row.stage, []).append(row)
        for name, rows in by_stage.items():
            rows = [r for r in rows if r.fingerprint == rows[-1].fingerprint]  # the current configuration
            rows = rows[-window:]
            series.append((name, key, len(rows)))
            values = [v for r in rows if (v := r.value) is not None]  # all of them: an ok row has its value
            found = changepoint.level_shifts(values, higher_is_better(key),
                                             compare.threshold_for(key, thresholds), min_size=min_size,
                                             significance=significance, permutations=permutations, seed=seed)
            for s in found:
                first = rows[s.index]
                shifts.append(Shift(name, key, first.run_id, first.created_at, first.commit, s.runs_before, s.runs_after,
                                    s.before, s.after, s.change, s.p_value, s.direction, s.in_effect,
                                    names.get((first.run_id, first.created_at), first.run_id)))
    return shifts, series


def chart(points: list[TrendPoint], metric: str, path: Path) -> Path:
    """A line per stage over the runs, regressions marked red, improvements green (matplotlib, Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    order = sorted({(p.created_at, p.run_id) for p in points})
    names = {(p.created_at, p.run_id): p.run_name or p.run_id for p in points}
    index = {k: i for i, k in enumerate(order)}
    key = metric_name(metric)
    m = REGISTRY.get(key)
    unit = m.unit if m else ""
    fig, ax = plt.subplots(figsize=(max(6, len(order) * 0.6 + 3), 4))
    for name in sorted({p.stage for p in points}):
        pts = [(p, v) for p in points if p.stage == name and (v := p.value) is not None and p.status == "ok"]
        xs, ys = [index[(p.created_at, p.run_id)] for p, _ in pts], [m.shown(v) if m else v for _, v in pts]
        ax.plot(xs, ys, marker="o", label=name)
        for (p, _), x, y in zip(pts, xs, ys):
            if p.verdict in ("regressed", "improved"):
                ax.scatter([x], [y], s=140, facecolors="none", edgecolors="red" if p.verdict == "regressed" else "green", linewidths=2, zorder=3)
    ax.set_xticks(range(len(order)), [names[k] for k in order], rotation=30, ha="right", fontsize=8)
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


def dump(points: list[TrendPoint], metric: str) -> str:
    """`history show --json`: each point with its value in the unit beside it (the registry's)."""
    m = REGISTRY.get(metric_name(metric))
    return json.dumps([{**p.__dict__, "value": m.shown(p.value) if m else p.value, "unit": m.unit if m else None}
                       for p in points], indent=1)
