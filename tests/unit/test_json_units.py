"""Every number compare's, report's and recommend's JSON export carries its unit, in its key or
beside it, and is in that unit (issue 46): compare's `"metric": "ttft_p50", "unit": "ms",
"baseline": 0.0314` was seconds and its `"peak_memory", "unit": "GB"` bytes.

Each numeric field is classified (a unit beside it, a unit in its key, a registry figure's name,
an "x" ratio, or the document's own `units` legend), and every stage figure among them is checked
against the stage's raw record: a latency in ms, read back to seconds, lies among the stage's
request latencies; a size in GB, read back to bytes, is the bytes recorded."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from llmopt_bench.analysis.gate.compare import compare_runs
from llmopt_bench.analysis.metric_registry import REGISTRY, lookup
from llmopt_bench.core.results import RunResult, StageResult, load_run, peak_memory
from llmopt_bench.render.compare_text import comparison_json
from llmopt_bench.render.exports import report_data

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results"
JOURNEY, SERVING, PREFIX = RESULTS / "h200", RESULTS / "h200-20261204" / "run", RESULTS / "h200-20261205" / "prefix-caching"
PAIR = RESULTS / "cpu" / "gate-pairs" / "hf-fp16-round0-a1", RESULTS / "cpu" / "gate-pairs" / "hf-fp16-round0-a2"

# a unit in the key: the suffixes the exports use, longest first
SUFFIXES = (("_bytes_s", "bytes/s"), ("_tok_s", "tok/s"), ("_bytes", "bytes"), ("_kops", "kop/s"), ("_rps", "req/s"),
            ("_ms", "ms"), ("_gb", "GB"), ("_s", "s"), ("seconds", "s"), ("_per_token", "J/token"))
TO_RECORDED = {"ms": 1e-3, "s": 1.0, "GB": 1e9, "bytes": 1.0, "tok/s": 1.0, "req/s": 1.0, "J/token": 1.0, "": 1.0}
# recommend's JSON (analysis/recommend/choose.Candidate, the `recommend` developer's) keeps these
# without a legend: a count, two fractions, a ratio, and the capacity's [met, failed] bracket in req/s
RECOMMEND_DOCUMENTED = {"devices": "count", "known_within": "fraction", "memory_share": "fraction",
                        "miss_ratio": "ratio", "interval": "req/s"}


def leaves(x, path=(), parent=None):
    """(dotted path without list indices, key, value, the dict holding it) of every number."""
    if isinstance(x, dict):
        for k, v in x.items():
            yield from leaves(v, (*path, str(k)), x)
    elif isinstance(x, list):
        for v in x:
            yield from leaves(v, path, parent)
    elif isinstance(x, (int, float)) and not isinstance(x, bool):
        yield ".".join(path), path[-1] if path else "", x, parent


def unit_of(path: str, key: str, parent: dict | None, legend: dict) -> str | None:
    """The unit a field declares, or None where it declares none."""
    if parent is not None and "unit" in parent:
        return str(parent["unit"])
    m = lookup(key)
    if m is not None and key in m.names:
        return m.unit
    if "_x_" in key:
        return "x"
    for suffix, unit in SUFFIXES:
        if key.endswith(suffix):
            return unit
    for name, unit in legend.items():
        if path == name or path.startswith(name + "."):
            return unit
    return None


def undeclared(data: dict, legend: dict, skip: tuple[str, ...] = ()) -> list[str]:
    return sorted({p for p, k, _, parent in leaves(data) if not p.startswith(skip) and unit_of(p, k, parent, legend) is None})


def raw_range(stage: StageResult, key: str) -> tuple[float, float] | None:
    """Where a figure of this stage must lie in run.json's units (seconds, bytes): its requests'
    range for a latency, its repeats' for a rate, the recorded value for one value a run."""
    m, metrics = REGISTRY[key], stage.metrics
    parts = m.figure.split(".")
    if parts[0] == "metrics" and len(parts) == 3 and metrics is not None:
        d = getattr(metrics, parts[1])
        return (d.min, d.max) if d else None
    if key in ("output_tok_s", "qps") and metrics is not None:
        reps = getattr(metrics, f"{key}_repeats") or [getattr(metrics, key)]
        return min(reps), max(reps)
    if key == "peak_memory":
        v = peak_memory(stage)[0]
        return (v, v) if v else None
    v = m.value(stage)
    return (v, v) if v is not None else None


def check_figure(stage: StageResult, key: str, value: float, unit: str, registry_unit: bool = True) -> None:
    """`value`, said to be in `unit` (the registry's, unless `registry_unit` is False: a key that
    names its own, like batch1_tpot_s), is this stage's figure `key` in that unit."""
    assert not registry_unit or unit == REGISTRY[key].unit, (stage.name, key, unit)
    bounds = raw_range(stage, key)
    assert bounds is not None, (stage.name, key, "a figure the stage did not record")
    recorded, (lo, hi) = value * TO_RECORDED[unit], bounds
    slack = 1e-9 * max(abs(lo), abs(hi), 1e-30)
    assert lo - slack <= recorded <= hi + slack, f"{stage.name} {key} = {value} {unit}: {recorded} outside [{lo}, {hi}] as recorded"


@pytest.fixture(scope="module")
def runs() -> dict[Path, RunResult]:
    return {d: load_run(d) for d in (JOURNEY, SERVING, PREFIX, *PAIR)}


@pytest.mark.parametrize("run_dir", [JOURNEY, SERVING, PREFIX, PAIR[0]], ids=lambda p: str(p.relative_to(RESULTS)))
def test_report_json_declares_and_keeps_every_unit(run_dir, runs):
    run = runs[run_dir]
    data = json.loads(json.dumps(report_data(run), default=str))  # as report.json holds it
    legend = data.pop("units")
    assert undeclared(data, legend, skip=("figures",)) == []
    checked = 0
    for row in data["stages"]:
        stage = run.stage(row["stage"])
        for col, value in row.items():
            m = lookup(col)
            if m is not None and m.csv == col and value is not None:
                check_figure(stage, m.key, value, unit_of(col, col, None, legend))
                checked += 1
    for name, figures in data["figures"].items():
        for key, f in figures.items():
            check_figure(run.stage(name), key, f["value"], f["unit"])
            lo_hi = f["interval"]
            assert lo_hi is None or lo_hi[0] <= f["value"] <= lo_hi[1], (name, key, f)
            assert isinstance(f["n_repeats"], int) and all(isinstance(i, int) for i in f["set_aside"])
            checked += 1
    assert checked >= 20


@pytest.mark.parametrize("pair", [(JOURNEY, JOURNEY), PAIR, (SERVING, SERVING)], ids=("h200-self", "cpu-pair", "serving-self"))
def test_compare_json_declares_and_keeps_every_unit(pair, runs):
    base, new = runs[pair[0]], runs[pair[1]]
    data = json.loads(json.dumps(comparison_json(compare_runs(base, new, resamples=200, force=True)), default=str))
    legend = data.pop("units")
    assert undeclared(data, legend) == []
    checked = 0
    for sd in data["stages"]:
        for md in sd["metrics"]:
            assert md["unit"] == REGISTRY[md["metric"]].unit
            for side, run in (("baseline", base), ("new", new)):
                if md[side] is not None:
                    check_figure(run.stage(sd["stage"]), md["metric"], md[side], md["unit"])
                    checked += 1
    assert checked >= 10


@pytest.mark.parametrize("run_dir", [JOURNEY, SERVING], ids=lambda p: str(p.relative_to(RESULTS)))
def test_recommend_json_declares_and_keeps_every_unit(run_dir, runs):
    from llmopt_bench.analysis.recommend.choose import recommend

    run = runs[run_dir]
    data = json.loads(json.dumps(recommend(run).as_dict(), default=str))
    keyed = {p.rsplit(".", 1)[-1]: u for p, u in RECOMMEND_DOCUMENTED.items()}
    missing = sorted({p for p, k, _, parent in leaves(data) if unit_of(p, k, parent, {}) is None and k not in keyed})
    assert missing == []
    checked = 0
    for c in [data.get("winner"), data.get("runner_up"), *(data.get("candidates") or [])]:
        stage = run.stage(c["name"]) if c else None
        if stage is None:
            continue
        raw = {"peak_bytes": peak_memory(stage)[0], "weights_bytes": stage.load.weights_bytes if stage.load else None,
               "j_per_token": stage.energy.joules_per_output_token if stage.energy else None,
               "capacity_rps": stage.facts.slo_capacity_rps}
        for key, value in raw.items():
            if c.get(key) is not None:
                assert c[key] == pytest.approx(value, rel=1e-9), (c["name"], key)
                checked += 1
        tpot = stage.facts.batch1_tpot_s or None
        if c.get("batch1_tpot_s") is not None and tpot is None:  # the stage's own TPOT figure, in seconds
            check_figure(stage, "tpot_p50", c["batch1_tpot_s"], "s", registry_unit=False)
            checked += 1
    assert checked >= 3


def test_the_classifier_finds_a_number_without_a_unit():
    """The check itself: a bare number fails, one with its unit in the key, beside it or in the legend passes."""
    data = {"stages": [{"metric": "ttft_p50", "unit": "ms", "baseline": 31.4}], "latency": 0.03, "wait_s": 1.0,
            "ratio": 1.2, "tpot_x_baseline": 5.7}
    assert undeclared(data, {}) == ["latency", "ratio"]
    assert undeclared(data, {"latency": "s", "ratio": "new / baseline"}) == []
    with pytest.raises(AssertionError, match="outside"):  # seconds said to be ms
        stage = load_run(JOURNEY).stage("hf-fp16")
        check_figure(stage, "ttft_p50", 0.0314, "ms")
    assert math.isfinite(1.0) and re.match(r"_x_", "_x_")
