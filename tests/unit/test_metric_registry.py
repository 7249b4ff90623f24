"""One name per figure (analysis/metric_registry.py): every metric name that compare, the
history, the report and the CSV export print is registered, no figure has two entries and no
name means two figures, and the names users already type (tpot, ttft_p50_ms, ttft_s.p50,
peak_mem) still mean what they did. Built from committed runs: no engine, well under a second
a test."""

from __future__ import annotations

import csv
import json
import re
import statistics
from pathlib import Path

import pytest

from llmopt_bench.analysis.gate import compare as C
from llmopt_bench.analysis.metric_registry import REGISTRY, lookup
from llmopt_bench.analysis.selectors import DESCRIPTIVE_COLUMNS
from llmopt_bench.core.results import load_run
from llmopt_bench.render import exports
from llmopt_bench.render.compare_text import to_markdown
from llmopt_bench.render.report import stage_table
from llmopt_bench.run.history import add_run, stage_values, trend

ROOT = Path(__file__).resolve().parents[2]
CPU = ROOT / "results" / "cpu" / "gate-pairs"
H200 = ROOT / "results" / "h200" / "run.json"  # the committed journey: every stage kind, quality figures too

KEYS = set(REGISTRY)
LABELS = {m.label for m in REGISTRY.values()}
HEADERS = {m.header for m in REGISTRY.values()}
CSV_COLUMNS = {m.csv for m in REGISTRY.values() if m.csv}


@pytest.fixture(scope="module")
def pair():
    return load_run(CPU / "hf-fp16-round3-a1"), load_run(CPU / "hf-fp16-round3-a2")


@pytest.fixture(scope="module")
def journey():
    return load_run(H200)


def normal(name: str) -> str:
    return name.strip().lower().replace("-", "_")


def test_no_name_means_two_figures_and_no_figure_has_two_entries():
    owner: dict[str, str] = {}
    for m in REGISTRY.values():
        for name in {normal(n) for n in (*m.names, m.header, m.label)}:
            assert owner.setdefault(name, m.key) == m.key, f"{name!r} names both {owner[name]} and {m.key}"
    figures = [m.figure for m in REGISTRY.values()]
    assert len(figures) == len(set(figures)), "two entries read one figure"


def test_the_names_users_type_still_resolve():
    assert C.parse_thresholds(["5%", "tpot=3%", "ttft_p50_ms=10%,load=30%", "peak-mem=2%", "tok/s=4%"]) == {
        "*": 0.05, "tpot_p50": 0.03, "ttft_p50": 0.10, "load_s": 0.30, "peak_memory": 0.02, "output_tok_s": 0.04}
    assert C.parse_gate(["tpot,e2e", "throughput,memory"]) == ["tpot_p50", "e2e_p50", "output_tok_s", "peak_memory"]
    assert C.parse_watch(["flash-attn:tpot,vllm-attn", "hf-fp16:ttft_s.p50"]) == {
        ("flash-attn", "tpot_p50"), ("vllm-attn", "*"), ("hf-fp16", "ttft_p50")}
    assert lookup("TTFT_p99_ms").key == "ttft_p99" and lookup("e2e_s.p90").key == "e2e_p90"  # type: ignore[union-attr]
    with pytest.raises(C.UsageError):
        C.parse_thresholds(["itl=5%"])  # a registered figure compare does not judge is refused, as before


def test_compare_prints_registered_names_only(pair):
    cmp = C.compare_runs(*pair, resamples=200)
    data = cmp.to_dict()
    printed_keys = [m["metric"] for s in data["stages"] for m in s["metrics"]] + data["gate"] + list(data["thresholds"])
    assert printed_keys and set(printed_keys) <= KEYS
    rows = [line.split(" | ") for line in to_markdown(cmp).splitlines() if line.startswith("| hf-fp16 ")]
    assert rows and {cells[1] for cells in rows} <= LABELS
    gated = re.search(r"gated \(inconclusive fails\): ([a-z0-9_, ]+)", to_markdown(cmp))
    assert gated and set(gated.group(1).split(", ")) <= KEYS


def test_history_stores_and_prints_registered_names_only(pair, tmp_path, capsys):
    from llmopt_bench.render.history_text import print_trend

    db = tmp_path / "h.sqlite"
    for run in pair:
        add_run(db, run)
    stored = {k for s in pair[0].stages for k in stage_values(s)}
    assert {"ttft_p50", "itl_p99", "qps", "peak_memory"} <= stored <= KEYS
    for name in ("tpot", "e2e_s.p90", "qps"):
        key = lookup(name).key  # type: ignore[union-attr]
        print_trend(trend(db, name, resamples=200), key)
        title = capsys.readouterr().out.splitlines()[0].removeprefix("llmopt history: ").strip()
        assert title == REGISTRY[key].label


def test_the_csv_the_report_json_and_the_report_table_name_registered_figures(journey, tmp_path):
    with open(exports.write_csv(journey, tmp_path), newline="") as f:
        columns = next(csv.reader(f))
    figures = [c for c in columns if c not in DESCRIPTIVE_COLUMNS]
    assert figures and set(figures) <= CSV_COLUMNS
    rows = json.loads(exports.write_json(journey, tmp_path).read_text())["stages"]
    assert {k for r in rows for k in r if k not in DESCRIPTIVE_COLUMNS} <= CSV_COLUMNS
    head = next(line for line in stage_table(journey) if line.startswith("| stage "))
    cells = [c.strip() for c in head.strip("|").split("|")]
    assert set(cells) - {"stage", "status", "quality"} <= HEADERS


def test_a_csv_cell_is_the_registered_figure_in_its_shown_unit(journey, tmp_path):
    row = next(r for r in json.loads(exports.write_json(journey, tmp_path).read_text())["stages"] if r["status"] == "ok")
    stage = journey.stage(row["stage"])
    m = stage.metrics

    def geomean_of_repeat_medians(column: str) -> float:  # the figure's definition (analysis/figures.py), computed apart
        by_repeat: dict[int, list[float]] = {}
        for v, r in zip(getattr(stage.samples, column), stage.samples.repeat):
            by_repeat.setdefault(r, []).append(v)
        return statistics.geometric_mean(statistics.median(g) for g in by_repeat.values())

    assert len(set(stage.samples.repeat)) == 3  # a figure over several repeats, not one pooled median
    assert row["ttft_p50_ms"] == pytest.approx(geomean_of_repeat_medians("ttft_s") * 1e3, rel=1e-12)
    assert row["e2e_p50_s"] == pytest.approx(geomean_of_repeat_medians("e2e_s"), rel=1e-12)
    assert row["requests"] == m.requests and isinstance(row["requests"], int)
    assert row["peak_mem_gb"] == REGISTRY["peak_memory"].value(stage) / 1e9
