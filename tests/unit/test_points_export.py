"""Every load point exported (issue 45): the serving scenario keeps every point's requests, each
naming its point, beside the headline's samples (requests.jsonl is written from them); and
points.csv / points.json hold one row a point, with what was offered, what completed, each
percentile, goodput, the SLO's and the steady state's verdicts and the server's clock, so a
curve is drawn again from the exports alone."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from simserver import SimServer

from llmopt_bench.core.contract import StageContext
from llmopt_bench.core.results import parse_run
from llmopt_bench.core.workload import Request
from llmopt_bench.load.plans import PlanLoad
from llmopt_bench.measure.energy import TimedMeter
from llmopt_bench.render.points_export import COLUMNS, point_rows, write_points
from llmopt_bench.run.rundir import RunDir
from llmopt_bench.scenarios.serving.record import ServingParams
from llmopt_bench.scenarios.serving.run import ServingRun

ROOT = Path(__file__).resolve().parents[2]
H200 = ROOT / "results/h200-20261204/run"


@pytest.fixture(scope="module")
def serving():
    sim = SimServer(tokens_per_s=900.0, step_s=0.01, max_seqs=64)
    p = ServingParams(concurrency=[1, 8], rates=[5.0], requests_per_point=24, warmup_s=1.0, min_point_s=4.0, max_point_s=20.0,
                      search_start_rps=8.0, search_max_probes=3, hold_s=5.0, throughput_point=True, throughput_requests=16)
    reqs = [Request(f"r{i}", f"p{i}", (1, 2, 3, 4)) for i in range(16)]
    ctx = StageContext(run_dir=None, stage_dir=None, device="cpu", meter=TimedMeter(read_mj=lambda: None))
    run = ServingRun(sim, {"kind": "simulated"}, p, PlanLoad.of_requests(reqs, 20), PlanLoad.of_requests(reqs, 20), ctx, run_seed=1)
    samples, extra, _ = run.run()
    return run, samples, extra


def test_every_points_requests_are_kept_each_with_its_point(serving, tmp_path):
    run, samples, extra = serving
    points = [r.phase + ": " + (f"concurrency {r.concurrency}" if r.concurrency is not None else f"{r.rate_rps:g} req/s")
              for r in extra.curve]
    assert len(points) >= 5 and len(set(points)) == len(points)  # sweep, point, ceiling, search, hold, throughput
    by_point = {k: [s for s in run.requests if s.point == k] for k in points}
    for row, key in zip(extra.curve, points):
        assert by_point[key], key
        assert sum(s.ok for s in by_point[key]) == row.completed, key  # the point's measured requests, every one
    assert len(run.requests) == sum(len(v) for v in by_point.values())  # each request in one point
    # the headline's samples are one of them, the stage's figures still the headline's alone
    assert samples and {s.point for s in samples} == {extra.main_point}
    assert len(run.requests) > len(samples)
    rd = RunDir(tmp_path)
    rd.put_requests("vllm-serve", run.requests)  # what the supervisor writes of a StageRun with requests
    lines = rd.request_lines()
    assert {r["point"] for r in lines} == set(points) and len(lines) == len(run.requests)


def test_the_h200_curves_exported_row_for_row(tmp_path):
    raw = json.loads((H200 / "run.json").read_text())
    serve = next(s for s in raw["stages"] if s["name"] == "vllm-serve")
    serve["extra"]["curve"][3]["server_clock"] = {  # as client/server_clock writes one (no committed run has it yet)
        "source": "vllm /metrics", "requests": 53, "ttft": {"count": 53, "mean_s": 0.05, "p50_s": 0.045, "p99_s": 0.12},
        "e2e": {"count": 53, "mean_s": 0.8, "p50_s": 0.76, "p99_s": 0.9}, "running": {"mean": 20.0, "max": 31.0},
        "client": {"requests": 53, "ttft_mean_s": 0.052, "e2e_mean_s": 0.81, "itl_mean_s": None},
        "client_minus_server": {"ttft_s": 0.002, "e2e_s": 0.01, "itl_s": None}, "verdict": "agree"}
    run = parse_run(raw, "test")
    written = write_points(run, tmp_path)
    assert [p.name for p in written] == ["points.csv", "points.json"]
    want = [(s["name"], r) for s in raw["stages"] if s["status"] == "ok" for r in (s.get("extra") or {}).get("curve") or []]
    with open(tmp_path / "points.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(want) == len(point_rows(run)) and tuple(rows[0]) == COLUMNS
    for got, (stage, r) in zip(rows, want):
        assert got["stage"] == stage
        assert got["offered_rate_rps"] == ("" if r.get("rate_rps") is None else str(r["rate_rps"]))
        assert got["ttft_p99_s"] == ("" if r.get("ttft_p99_s") is None else str(r["ttft_p99_s"]))
        assert got["goodput_rps"] == ("" if r.get("goodput_rps") is None else str(r["goodput_rps"]))
    search = next(g for g, (st, r) in zip(rows, want) if st == "vllm-serve" and r.get("phase") == "search" and r.get("slo_ok") is False)
    assert search["slo_ok"] == "False" and search["slo_reason"].startswith("ttft_p99")
    clocked = rows[[st for st, _ in want].index("vllm-serve") + 3]
    assert clocked["server_ttft_mean_s"] == "0.05" and clocked["client_minus_server_ttft_s"] == "0.002"
    assert clocked["server_running_mean"] == "20.0" and clocked["server_clock_verdict"] == "agree"
    data = json.loads((tmp_path / "points.json").read_text())
    assert len(data["points"]) == len(want) and data["points"][[st for st, _ in want].index("vllm-serve") + 3]["server_clock"]["verdict"] == "agree"
    # the headline point named as its requests name it in requests.jsonl
    assert serve["extra"]["main_point"] in {p["point"] for p in data["points"] if p["stage"] == "vllm-serve"}


def test_a_run_without_load_points_exports_none(tmp_path):
    run = parse_run(json.loads((ROOT / "results/h200/20261203-transformers/run.json").read_text()), "test")
    assert write_points(run, tmp_path) == [] and not list(tmp_path.iterdir())
