"""Schema 1 -> 2: a run.json written before the typed schema reads with its numbers unchanged.
The fixture is the H200 journey's run.json as committed in schema 1 (tests/data)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from testkit import committed_runs

from llmopt_bench.core.migrate import SCHEMA_1_ENERGY
from llmopt_bench.core.results import SCHEMA_VERSION, load_run

DATA = Path(__file__).resolve().parents[1] / "data" / "h200-journey-schema1.json"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def v1() -> dict:
    raw = json.loads(DATA.read_text())
    assert raw["schema_version"] == 1
    return raw


@pytest.fixture(scope="module")
def v2():
    return load_run(DATA)


def test_every_number_is_the_schema_1_number(v1, v2):
    assert v2.schema_version == SCHEMA_VERSION
    for old, new in zip(v1["stages"], v2.stages):
        assert new.name == old["name"] and new.status == old["status"]
        assert new.metrics.model_dump() == old["metrics"]
        assert new.samples.model_dump() == old["samples"]
        assert new.load.weights_bytes == old["load"]["weights_bytes"]
        assert {k: v for k, v in new.memory.model_dump().items() if v not in (None, {})} == old["memory"]
        assert new.energy.joules == old["energy"]["joules"] and new.energy.scope == SCHEMA_1_ENERGY


def test_quality_leaves_extra_and_the_reference_becomes_a_flag(v1, v2):
    for old, new in zip(v1["stages"], v2.stages):
        assert "quality" not in new.extra
        q = old["extra"].get("quality")
        assert (new.quality is None) == (q is None)
        if q and old["load"]["implementation"].get("load_format") != "dummy":
            assert new.quality.model_dump(exclude_none=True) == {k: v for k, v in q.items() if v is not None}
    assert [s.name for s in v2.stages if s.quality_reference] == ["hf-fp16"]


def test_kv_cache_and_facts_come_from_the_old_extra(v1, v2):
    vllm_old = next(s for s in v1["stages"] if s["name"] == "vllm")
    assert v2.stage("vllm").load.kv_cache_bytes == vllm_old["extra"]["kv_cache"]["bytes"]
    cb_old = next(s for s in v1["stages"] if s["name"] == "continuous-batching")["extra"]
    facts = v2.stage("continuous-batching").facts
    assert facts.decode_batch == cb_old["sweep"]["main_concurrency"]
    assert facts.saturated_tok_s == cb_old["throughput_point"]["continuous"]["output_tok_s"]
    assert facts.batch1_tpot_s == next(r["tpot_p50_s"] for r in cb_old["curve"]
                                       if r["mode"] == "continuous" and r["concurrency"] == 1)


def test_every_stage_extra_validates_against_its_stage_model(v2):
    from llmopt_bench.run.registry import presentation_class

    for s in v2.stages:
        presentation_class(s.stage_name).Extra.model_validate(s.extra)


@pytest.mark.parametrize("path", [str(p.relative_to(ROOT)) for p in committed_runs()])
def test_committed_runs_are_stored_in_the_current_schema_and_validate(path):
    from llmopt_bench.run.registry import presentation_class

    raw = json.loads((ROOT / path).read_text())
    assert raw["schema_version"] == SCHEMA_VERSION, f"{path}: rewrite it with scripts/maintainers/migrate-runs.py"
    run = load_run(ROOT / path)
    for s in run.stages:
        if s.status == "ok":
            presentation_class(s.stage_name).Extra.model_validate(s.extra)


def test_a_renamed_load_phase_reads_under_its_current_name():
    """The served engine recorded vLLM's weight read as `weights_load_s` (results/h200-20261204);
    it reads as `weights_read_s`, the name the offline engine and the server share now."""
    stored = json.loads((ROOT / "results" / "h200-20261204" / "run" / "run.json").read_text())
    old = next(s for s in stored["stages"] if s["name"] == "vllm-serve")["load"]["phases_s"]
    assert old["weights_load_s"] == 2.17
    phases = load_run(ROOT / "results" / "h200-20261204" / "run").stage("vllm-serve").load.phases_s
    assert phases["weights_read_s"] == 2.17 and "weights_load_s" not in phases
    assert {k: v for k, v in phases.items() if k != "weights_read_s"} == {k: v for k, v in old.items() if k != "weights_load_s"}
