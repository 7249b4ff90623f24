"""Every load point of a run as data: points.csv (a row a point, for a spreadsheet) and
points.json (the same rows, each with its server clock as recorded), so that a stage's load
curve can be drawn again from the exports alone; the requests of each point are in
requests.jsonl under the same `point`. Read from each stage's extra as run.json keeps it
(the curve of a serving or continuous-batching stage, a prefix-caching stage's two arms)."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from llmopt_bench.core.freeform import Json
from llmopt_bench.core.results import RunResult
from llmopt_bench.render.html.data import load_curves, number, point_key

POINTS_CSV, POINTS_JSON = "points.csv", "points.json"
FIGURES = ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "itl_p50_s", "itl_p99_s", "e2e_p50_s", "e2e_p99_s")
COLUMNS = ("stage", "arm", "point", "phase", "mode", "concurrency", "offered_rate_rps", "achieved_rate_rps", "completed_rps",
           "output_tok_s", "requests", "completed", "failed", "failure_rate", *FIGURES, "goodput_rps", "slo_ok", "slo_reason",
           "steady", "steady_reason", "in_flight_at_end", "queued_at_end", "joules_per_output_token", "server_requests",
           "server_ttft_mean_s", "server_ttft_p50_s", "server_ttft_p99_s", "server_itl_mean_s", "server_e2e_mean_s",
           "server_e2e_p99_s", "server_queue_mean_s", "server_running_mean", "server_waiting_mean", "server_kv_usage_max",
           "server_preemptions", "client_minus_server_ttft_s", "client_minus_server_e2e_s", "server_clock_verdict")


def _part(d: Any, *keys: str) -> Any:
    for k in keys:
        d = d.get(k) if isinstance(d, dict) else None
    return d


def server_cells(sc: Any) -> Json:
    """A point's server clock (client/server_clock.ServerClock as written) in the export's columns."""
    return {"server_requests": _part(sc, "requests"), "server_ttft_mean_s": _part(sc, "ttft", "mean_s"),
            "server_ttft_p50_s": _part(sc, "ttft", "p50_s"), "server_ttft_p99_s": _part(sc, "ttft", "p99_s"),
            "server_itl_mean_s": _part(sc, "itl", "mean_s"), "server_e2e_mean_s": _part(sc, "e2e", "mean_s"),
            "server_e2e_p99_s": _part(sc, "e2e", "p99_s"), "server_queue_mean_s": _part(sc, "queue", "mean_s"),
            "server_running_mean": _part(sc, "running", "mean"), "server_waiting_mean": _part(sc, "waiting", "mean"),
            "server_kv_usage_max": _part(sc, "kv_usage", "max"), "server_preemptions": _part(sc, "preemptions"),
            "client_minus_server_ttft_s": _part(sc, "client_minus_server", "ttft_s"),
            "client_minus_server_e2e_s": _part(sc, "client_minus_server", "e2e_s"), "server_clock_verdict": _part(sc, "verdict")}


def point_row(stage: str, arm: str, r: Json) -> Json:
    """One load point: what was offered (a concurrency, or an arrival rate), what completed, each
    percentile, goodput, the SLO's and the steady state's verdicts, and the server's clock."""
    opened = r.get("rate_rps") is not None
    return {"stage": stage, "arm": arm, "point": f"{arm}: {point_key(r)}" if arm else point_key(r), "phase": r.get("phase"), "mode": r.get("mode"),
            "concurrency": r.get("concurrency"), "offered_rate_rps": r.get("rate_rps"),
            "achieved_rate_rps": r.get("achieved_rate") if opened else r.get("qps"),
            "completed_rps": (number(r.get("completion_rps")) or r.get("qps")) if opened else r.get("qps"),
            "output_tok_s": r.get("output_tok_s"), "requests": r.get("requests"), "completed": r.get("completed"),
            "failed": r.get("failed"), "failure_rate": r.get("failure_rate"), **{k: r.get(k) for k in FIGURES},
            "goodput_rps": r.get("goodput_rps"), "slo_ok": r.get("slo_ok"), "slo_reason": r.get("slo_reason") or r.get("error"),
            "steady": r.get("steady"), "steady_reason": r.get("steady_reason"), "in_flight_at_end": r.get("in_flight_at_end"),
            "queued_at_end": r.get("queued_at_end"), "joules_per_output_token": _part(r, "energy", "joules_per_output_token"),
            **server_cells(r.get("server_clock"))}


def point_rows(run: RunResult) -> list[tuple[Json, Any]]:
    """Every ok stage's load points in journey order, each with its server clock as written."""
    return [(point_row(s.name, arm, r), r.get("server_clock")) for s in run.stages if s.status == "ok"
            for arm, rows in load_curves(s) for r in rows]


def write_points(run: RunResult, out_dir: Path, kinds: tuple[str, ...] = ("csv", "json")) -> list[Path]:
    """points.csv and/or points.json; nothing where the run measured no load point."""
    rows = point_rows(run)
    if not rows:
        return []
    written = []
    if "csv" in kinds:
        path = Path(out_dir) / POINTS_CSV
        with open(path, "w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=COLUMNS)
            w.writeheader()
            for row, _ in rows:
                w.writerow({k: "" if v is None else v for k, v in row.items()})
        written.append(path)
    if "json" in kinds:
        path = Path(out_dir) / POINTS_JSON
        data = {"run_id": run.run_id, "columns": list(COLUMNS), "points": [{**row, "server_clock": sc} for row, sc in rows]}
        path.write_text(json.dumps(data, indent=1, default=str), encoding="utf-8")
        written.append(path)
    return written
