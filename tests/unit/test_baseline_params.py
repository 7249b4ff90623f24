"""A baseline that pairs (issue 33): every committed baseline in results/baselines was measured
with the params the journey runs today, stage by stage, except where results/baselines/drift.toml
declares the difference with its reason and the device command that refreshes the baseline. A
params change without its new baseline (or a declaration) fails here, and so does a declaration
that no longer matches (the baseline was refreshed, or the params came back): the nightly job
(`llmopt compare --drift`) accepts exactly what is declared, nothing more."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from testkit import ROOT, committed_runs, run_cli

from llmopt_bench.analysis.gate.baseline_drift import load_drift
from llmopt_bench.analysis.gate.compare import mismatches
from llmopt_bench.core.results import RunResult
from llmopt_bench.core.workload import WorkloadConfig
from llmopt_bench.run.registry import journey_path, load_stage, parse_journey, resolve_preset, validate_params

BASELINES = [p for p in committed_runs() if p.parent.name == "baselines"]
DRIFT = ROOT / "results" / "baselines" / "drift.toml"


def journey_of(run: RunResult) -> str:
    return "journey" if run.env.gpu else "journey-cpu"


def drift_of(path: Path) -> set[tuple[str, str, str]]:
    """(baseline file, stage, param) for every param of an ok baseline stage that the journey sets otherwise."""
    run = RunResult.model_validate(json.loads(path.read_text()))
    plans = {p.name: p for p in parse_journey(journey_path(journey_of(run)))}
    out = set()
    for stage in run.stages:
        plan = plans.get(stage.name)
        if stage.status != "ok" or plan is None:
            continue
        want, have = validate_params(load_stage(plan.stage), plan.params), stage.params or {}
        out |= {(path.name, stage.name, k) for k in set(want) | set(have) if want.get(k) != have.get(k)}
    return out


def declared() -> set[tuple[str, str, str]]:
    return {(d.baseline, d.stage, p) for d in load_drift(DRIFT) for p in d.params}


def test_there_is_a_baseline_to_pair_with():
    assert BASELINES, "results/baselines holds the nightly job's baselines"


@pytest.mark.parametrize("path", BASELINES, ids=lambda p: p.name)
def test_the_journeys_params_are_the_baselines_or_declared(path):
    found, said = drift_of(path), {d for d in declared() if d[0] == path.name}
    undeclared, stale = sorted(found - said), sorted(said - found)
    assert not undeclared, (f"{path.name} was measured with other params than journeys/{journey_of_path(path)}.toml sets "
                            f"today: {undeclared}. Refresh the baseline on its device, or declare each in "
                            f"{DRIFT.relative_to(ROOT)} with its reason and the command that refreshes it")
    assert not stale, f"{DRIFT.relative_to(ROOT)} declares drift that no longer exists: {stale}; remove those entries"


def journey_of_path(path: Path) -> str:
    return journey_of(RunResult.model_validate(json.loads(path.read_text())))


def test_the_drift_of_today_is_caught_without_its_declaration():
    """What the declaration covers, found by the test itself: the H200 baseline predates the
    journey's vllm scheduler limits and the batching stage's dropped quality param (the issue's
    "params differ (max_num_batched_tokens None vs 4096; max_num_seqs None vs 256)" and "(quality
    True vs None)"), and the vLLM engine params' later fields."""
    found = {(stage, param) for _, stage, param in drift_of(ROOT / "results" / "baselines" / "nvidia-h200-synthetic-llama2-7b.json")}
    assert {("vllm", "max_num_batched_tokens"), ("vllm", "max_num_seqs"), ("continuous-batching", "quality")} <= found
    assert all(stage in ("vllm", "vllm-attn", "continuous-batching") for stage, _ in found)


@pytest.mark.parametrize("path", BASELINES, ids=lambda p: p.name)
def test_the_gates_preset_measures_the_baselines_workload(path):
    """The nightly job runs `--preset standard`: its workload (the stopping rule's fields aside,
    which change how much is measured, not what) is the baseline's, so compare pairs them."""
    base = RunResult.model_validate(json.loads(path.read_text()))
    _, table = resolve_preset("standard", cuda=bool(base.env.gpu))
    nightly = base.model_copy(update={"workload": WorkloadConfig(**{**base.workload.model_dump(), **table})})
    assert table.get("max_repeats", 0) > table.get("repeats", 0)  # the stopping rule is on
    assert mismatches(base, nightly) == []


def test_compare_accepts_exactly_the_declared_drift(tmp_path):
    """The committed baseline against a copy of itself with today's journey params: exit 6 (params
    differ) without the declaration; with --drift the declared stages are reported, not compared,
    and the rest is judged; another param of a declared stage is still a gap."""
    raw = json.loads((ROOT / "results" / "baselines" / "nvidia-h200-synthetic-llama2-7b.json").read_text())
    plans = {p.name: p for p in parse_journey(journey_path("journey"))}
    for s in raw["stages"]:
        if s["name"] in ("vllm", "vllm-attn", "continuous-batching"):
            s["params"] = validate_params(load_stage(plans[s["name"]].stage), plans[s["name"]].params)
    (tmp_path / "now").mkdir()
    (tmp_path / "now" / "run.json").write_text(json.dumps(raw))
    base, env = ROOT / "results" / "baselines" / "nvidia-h200-synthetic-llama2-7b.json", {"LLMOPT_HISTORY_DB": str(tmp_path / "h.sqlite")}
    r = run_cli("compare", str(base), str(tmp_path / "now"), "--format", "md", "--pass-inconclusive", env=env)
    assert r.returncode == 6 and "vllm: not comparable, params differ (max_num_batched_tokens None vs 4096" in r.stdout
    r = run_cli("compare", str(base), str(tmp_path / "now"), "--format", "md", "--pass-inconclusive", "--drift", str(DRIFT), env=env)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr)
    assert "Not compared, accepted by --drift: vllm params differ (max_num_batched_tokens None vs 4096" in r.stdout
    assert "| vllm-fp8 | TPOT p50 |" in r.stdout and "| vllm | TPOT p50 |" not in r.stdout
    next(s for s in raw["stages"] if s["name"] == "vllm")["params"]["max_model_len"] = 2048  # not declared
    (tmp_path / "now" / "run.json").write_text(json.dumps(raw))
    r = run_cli("compare", str(base), str(tmp_path / "now"), "--format", "md", "--pass-inconclusive", "--drift", str(DRIFT), env=env)
    assert r.returncode == 6 and "max_model_len 4096 vs 2048" in r.stdout
