"""`llmopt bench --preset quick|standard|full`: each preset resolves to the journey and workload it
promises, with CUDA and without (the GPU faked only where llmopt reads the hardware: NVML's device
list), a workload option given on the command line beats the preset's, a preset with another way
of naming the stages is refused before anything starts, and run.json records the preset."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from testkit import ROOT, read_run

from llmopt_bench.cli.bench import preset_run
from llmopt_bench.core.workload import WorkloadConfig, cpu_defaults
from llmopt_bench.measure import nvml
from llmopt_bench.run.registry import JOURNEY_DIR, PRESETS, parse_journey, resolve_stages

H200 = {"index": 0, "name": "NVIDIA H200", "compute_capability": "9.0", "memory_total_bytes": 150_000_000_000}
QUICK_STAGES = ["hf-fp16", "awq-int4", "vllm", "vllm-fp8"]
CPU_DEFAULTS = cpu_defaults()
GPU_DEFAULTS = {f: WorkloadConfig.model_fields[f].default for f in CPU_DEFAULTS}


@pytest.fixture
def gpu(monkeypatch):
    """An H200 as NVML would list it: the input of registry.cuda_devices, nothing above it."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(nvml, "device_indices", lambda: [0])
    monkeypatch.setattr(nvml, "device_info", lambda i: dict(H200) if i == 0 else None)


@pytest.fixture
def cpu(monkeypatch):
    """No GPU visible, whatever this machine has: CUDA_VISIBLE_DEVICES="" hides every one."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


def sizes(cfg) -> dict:
    return {f: getattr(cfg, f) for f in CPU_DEFAULTS}


def journey(name: str) -> list:
    return parse_journey(JOURNEY_DIR / f"{name}.toml")


def as_run(plans) -> list[tuple]:
    return [(p.name, p.stage, p.params, p.timeout_s) for p in plans]


# --- what each preset is ------------------------------------------------------------------

def test_quick_on_a_gpu_is_the_headline_at_a_lighter_workload(gpu):
    plans, cfg = preset_run("quick", {})
    assert [p.name for p in plans] == QUICK_STAGES
    standard = {p.name: p for p in resolve_stages("all")[0]}
    assert all(p.params == standard[p.name].params for p in plans)  # the journey's own params
    assert sizes(cfg) == {"num_prompts": 4, "max_new_tokens": 64, "warmup": 1, "repeats": 2}
    assert cfg.kind == "fixed" and cfg.notes == []


def test_quick_on_cpu_keeps_the_cpu_defaults(cpu):
    plans, cfg = preset_run("quick", {})
    assert [p.name for p in plans] == QUICK_STAGES
    assert sizes(cfg) == CPU_DEFAULTS and cfg.repeats >= 2  # the least the regression gate judges
    assert cfg.notes and "lighter defaults on CPU" in cfg.notes[0]


def test_standard_is_stages_all_on_a_gpu_with_the_stopping_rule(gpu):
    """The nightly gate's preset (issue 33): the default workload, 2 to 10 repeats until settled."""
    plans, cfg = preset_run("standard", {})
    assert as_run(plans) == as_run(resolve_stages("all")[0])
    assert sizes(cfg) == {**GPU_DEFAULTS, "repeats": 2} and cfg.notes == []
    assert (cfg.max_repeats, cfg.stop_within, cfg.repeat_budget_s) == (10, 2.5, 90)


def test_standard_on_cpu_is_make_bench_journey(cpu):
    plans, cfg = preset_run("standard", {})
    assert as_run(plans) == as_run(resolve_stages(str(JOURNEY_DIR / "journey-cpu.toml"))[0])
    assert sizes(cfg) == CPU_DEFAULTS and (cfg.max_repeats, cfg.stop_within, cfg.repeat_budget_s) == (10, 5.0, 60)


@pytest.mark.parametrize("device, base", [("gpu", "journey"), ("cpu", "journey-cpu")])
def test_full_is_the_journey_and_the_served_configs_at_ten_repeats(request, device, base):
    request.getfixturevalue(device)
    plans, cfg = preset_run("full", {})
    journey_plans = as_run(resolve_stages(str(JOURNEY_DIR / f"{base}.toml"))[0])
    assert as_run(plans)[:len(journey_plans)] == journey_plans
    extra = {p.name: p for p in plans[len(journey_plans):]}
    serving = [p.name for p in journey("serving")]
    assert list(extra) == [n for n in serving if n not in dict.fromkeys(p[0] for p in journey_plans)]
    served = {p.name: p for p in plans}["vllm-serve"].params
    assert extra["vllm-serve-fp8"].params == {**served, "quantization": "fp8"}  # the same load, FP8 weights
    assert extra["vllm-serve-awq"].params["awq"] is not None
    assert {**extra["vllm-serve-awq"].params, "awq": None} == served  # the same load, AWQ weights
    assert cfg.repeats == 10
    others = GPU_DEFAULTS if device == "gpu" else CPU_DEFAULTS
    assert {k: v for k, v in sizes(cfg).items() if k != "repeats"} == {k: v for k, v in others.items() if k != "repeats"}


def test_full_on_cpu_notes_only_the_defaults_it_chose(cpu):
    _, cfg = preset_run("full", {})
    assert "--repeats" not in cfg.notes[0] and "--num-prompts 4" in cfg.notes[0]  # 10 repeats came from the preset


def test_every_preset_journey_is_shipped_and_listed():
    for name, preset in PRESETS.items():
        for journey_name in (preset.journey, preset.cpu_journey):
            assert (JOURNEY_DIR / f"{journey_name}.toml").is_file(), (name, journey_name)
        assert preset.description and "\n" not in preset.description


# --- the command line wins ------------------------------------------------------------------

def test_a_workload_option_given_beats_the_preset(gpu):
    _, cfg = preset_run("quick", dict(repeats=5, max_new_tokens=16, seed=7))
    assert (cfg.repeats, cfg.max_new_tokens, cfg.seed) == (5, 16, 7)
    assert (cfg.num_prompts, cfg.warmup) == (4, 1)  # the preset's, where nothing was given


def test_repeats_given_beats_full_on_cpu(cpu):
    _, cfg = preset_run("full", dict(repeats=3))
    assert cfg.repeats == 3


# --- refused before anything starts ---------------------------------------------------------

def bench(tmp_path, *args: str) -> tuple[subprocess.CompletedProcess, object]:
    out = tmp_path / "run"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    r = subprocess.run([sys.executable, "-m", "llmopt_bench", "bench", "--model", "synthetic:tiny", *args, "--output", str(out)],
                       capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    return r, out


@pytest.mark.parametrize("args, says", [
    (["--preset", "huge"], "--preset 'huge': unknown, allowed quick, standard, full"),
    (["--preset", "quick", "--stages", "all"], "--preset quick and --stages both choose the stages to run"),
    (["--preset", "full", "--endpoint", "http://localhost:8000"], "--preset full and --endpoint both choose"),
])
def test_bad_combinations_exit_2_with_one_line(tmp_path, args, says):
    r, out = bench(tmp_path, *args)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith("  fix: "), r.stderr
    assert says in lines[0] and "Traceback" not in r.stderr
    assert not out.exists()  # nothing written


def test_preset_with_resume_is_refused(tmp_path):
    r, out = bench(tmp_path, "--preset", "quick", "--resume", str(tmp_path / "run"))
    assert r.returncode == 2 and "--preset quick and --resume both choose" in r.stderr, r.stderr


# --- what run.json says -----------------------------------------------------------------------

@pytest.mark.slow
def test_quick_runs_for_real_on_cpu(tmp_path):
    """The quick preset end to end on synthetic:tiny, without the vLLM virtualenv so that it stays
    near a minute (its vLLM stages are then skipped with their reason: run for real in
    tests/integration): every stage ok or skipped with its reason, run.json naming the preset, and
    a workload option given on the command line recorded over the preset's."""
    env = {k: v for k, v in os.environ.items() if k != "LLMOPT_VLLM_PYTHON"}
    out = tmp_path / "quick"
    r = subprocess.run([sys.executable, "-m", "llmopt_bench", "bench", "--preset", "quick", "--model", "synthetic:tiny",
                        "--max-new-tokens", "16", "--no-report", "--output", str(out)],
                       capture_output=True, text=True, cwd=ROOT, env={**env, "CUDA_VISIBLE_DEVICES": ""}, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    run = read_run(out)
    assert run["preset"] == "quick" and run["status"] == "complete"
    assert [s["name"] for s in run["stages"]] == QUICK_STAGES
    assert [d["name"] for d in run["journey"]] == QUICK_STAGES
    for s in run["stages"]:
        assert s["status"] == "ok" or (s["status"] == "skipped" and s["reason"]), (s["name"], s["status"], s.get("reason"))
    assert {s["name"]: s["status"] for s in run["stages"]}["hf-fp16"] == "ok"
    assert {k: run["workload"][k] for k in CPU_DEFAULTS} == {**CPU_DEFAULTS, "max_new_tokens": 16}


def test_a_full_run_compares_with_a_standard_one_on_cpu(cpu):
    """More repeats is the same measurement (compare.SAME_MEASUREMENT): the CPU note, which names
    only the defaults it chose, must not make a full run incomparable with a standard one."""
    from llmopt_bench.analysis.gate.compare import mismatches
    from llmopt_bench.core.results import RunResult

    def run(preset: str) -> RunResult:
        return RunResult(run_id=preset, created_at="2026-12-04T00:00:00Z", command=f"llmopt bench --preset {preset}",
                         workload=preset_run(preset, {})[1], env={"cpu": "same"})

    assert mismatches(run("standard"), run("full")) == []
    assert mismatches(run("standard"), run("quick")) == []  # on CPU quick keeps the standard workload


def test_run_json_records_the_preset_and_keeps_it_on_resume(tmp_path):
    """The runner writes RunOptions.preset into run.json (a real probe of synthetic:tiny); a resumed
    run, which --preset may not name, keeps the one it was started with."""
    from llmopt_bench.core.models import parse_model
    from llmopt_bench.core.results import parse_run
    from llmopt_bench.run.rundir import RunDir
    from llmopt_bench.run.runner import RunOptions, start_run

    class Quiet:
        def phase(self, msg):
            pass

    rd = RunDir(tmp_path / "run")
    rd.create()
    base = dict(out_dir=rd.root, model=parse_model("synthetic:tiny"), workload=WorkloadConfig(), plans=[])
    run, _, _ = start_run(rd, RunOptions(**base, command="llmopt bench --preset quick", preset="quick"), Quiet())
    assert run.preset == "quick" and parse_run(json.loads(rd.run_json.read_text()), "run.json").preset == "quick"
    resumed, previous, _ = start_run(rd, RunOptions(**base, command="llmopt bench --resume run", resume=True), Quiet())
    assert previous is not None and resumed.preset == "quick"
    before = {k: v for k, v in run.model_dump(mode="json").items() if k != "preset"}  # a run from before presets
    assert parse_run(before, "old run.json").preset is None
