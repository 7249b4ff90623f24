"""The context sweep's pure helpers on made-up rows and names: speedups and their spread, the
story's claims, the context plan, the kernel the profiler names, vLLM's position limit and
backend plan."""

from __future__ import annotations

import pytest

from llmopt_bench.engines.hf.attention import effective_from_ops, torch_says
from llmopt_bench.engines.vllm.attention import plan_backends, within_positions
from llmopt_bench.scenarios.context_sweep.plan import plan_contexts, speedups, sweep_claims


def _d(p50, lo=None, hi=None):
    return {"n": 3, "mean": p50, "std": 0.0, "min": lo or p50, "p50": p50, "p90": p50, "p99": p50, "max": hi or p50}


def _r(impl, context, ttft, tpot, status="ok"):
    ok = status == "ok"
    return {"impl": impl, "effective_impl": impl if ok else None, "context": context, "batch": 1,
            "ttft_s": ttft if ok else None, "tpot_s": tpot if ok else None, "peak_bytes": None, "status": status,
            "reason": None if ok else "x"}


def test_speedups_and_claims_from_rows():
    rows_ = [_r("eager", 2048, _d(0.114, 0.110, 0.120), _d(0.0228)), _r("eager", 8192, _d(0.837), _d(0.0291)),
             _r("sdpa-flash", 2048, _d(0.063, 0.060, 0.066), _d(0.0552)), _r("sdpa-flash", 8192, _d(0.265), _d(0.075)),
             _r("flash_attention_2", 2048, None, None, "skipped"), _r("flash_attention_2", 8192, None, None, "skipped")]
    sp = speedups(rows_, "eager")
    assert [(s["impl"], s["context"]) for s in sp] == [("sdpa-flash", 2048), ("sdpa-flash", 8192)]
    assert sp[0]["prefill_speedup"] == pytest.approx(0.114 / 0.063)
    assert sp[0]["prefill_spread"] == pytest.approx([0.110 / 0.066, 0.120 / 0.060])
    assert sp[0]["decode_speedup"] == pytest.approx(0.0228 / 0.0552)
    c = {e["claim"]: e for e in sweep_claims(sp, ["eager", "sdpa-flash", "flash_attention_2"], rows_)}
    assert c["2x at 2K"]["impl"] == "sdpa-flash"  # flash_attention_2 skipped: the one that ran
    assert c["2x at 2K"]["prefill"] == "not held" and c["2x at 2K"]["decode"] == "not held"  # 1.81x, 0.41x
    assert c["4x at 8K"]["measured_prefill"] == pytest.approx(0.837 / 0.265)
    assert c["4x at 8K"]["prefill"] == "not held"  # 3.16x < 4
    sp2 = speedups([_r("eager", 8192, _d(1.0), _d(1.0)), _r("flash_attention_2", 8192, _d(0.2), _d(0.9))], "eager")
    c2 = {e["claim"]: e for e in sweep_claims(sp2, ["eager", "flash_attention_2"], [])}
    assert c2["4x at 8K"]["prefill"] == "held" and c2["4x at 8K"]["decode"] == "not held"
    assert c2["2x at 2K"]["prefill"] == "not measured"


def test_effective_from_profiler_names():
    assert effective_from_ops(["aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention_for_cpu"]) == "sdpa-flash"
    assert effective_from_ops(["aten::_scaled_dot_product_flash_attention", "void pytorch_flash::flash_fwd_kernel<>"]) == "sdpa-flash"
    assert effective_from_ops(["aten::_scaled_dot_product_efficient_attention", "fmha_cutlassF_f16"]) == "sdpa-efficient"
    assert effective_from_ops(["aten::_scaled_dot_product_attention_math", "aten::_softmax"]) == "sdpa-math"
    assert effective_from_ops(["flash_attn::_flash_attn_forward", "void flash_fwd_kernel<>"]) == "flash_attention_2"
    assert effective_from_ops(["aten::matmul", "aten::_softmax"]) == "eager"
    assert effective_from_ops(["aten::matmul"]) == "unknown"
    assert effective_from_ops(["aten::_scaled_dot_product_attention_math", "aten::_scaled_dot_product_flash_attention"]).startswith("mixed:")


def test_plan_contexts():
    keep, notes = plan_contexts([8192, 512, 512, 2048, 16384], 8192, "cpu", 1024)
    assert keep == [512, 1024] and len(notes) == 3 and "context 2048 capped to 1024" in notes[0]
    keep, notes = plan_contexts([8192, 512, 2048, 16384], 8192, "cuda", 1024)
    assert keep == [512, 2048, 8192] and "max_position_embeddings (8192)" in notes[0]
    assert plan_contexts([128, 4096], None, "cpu", None) == ([128, 4096], [])


def test_within_positions_shortens_only_the_context_at_the_limit():
    got, notes = within_positions([512, 2048, 8192], 8192, 32)
    assert got == [512, 2048, 8159]
    assert notes == ["context 8192 measured with 8159 prompt tokens: prompt and 33 new tokens must fit the model's 8192 positions"]
    assert within_positions([8192, 8187], 8192, 4) == ([8187], [
        "context 8192 measured with 8187 prompt tokens: prompt and 5 new tokens must fit the model's 8192 positions"])
    assert within_positions([512], None, 32) == ([512], [])


def test_plan_backends_on_cpu_and_cuda():
    run, skipped = plan_backends(["FLASH_ATTN", "FLASHINFER", "FLASH_ATTN"], "cpu", lambda m: True)
    assert run == ["auto"] and list(skipped) == ["FLASH_ATTN", "FLASHINFER"]
    assert "CUDA backend" in skipped["FLASH_ATTN"]
    run, skipped = plan_backends(["FLASH_ATTN", "TRITON_ATTN", "FLASHINFER"], "cuda", lambda m: m != "flashinfer")
    assert run == ["FLASH_ATTN", "TRITON_ATTN"] and skipped == {"FLASHINFER": "flashinfer not installed in vLLM's interpreter"}


def test_torch_says_keeps_the_kernel_reasons_once():
    class W:
        def __init__(self, message):
            self.message = message

    seen = [W("Memory efficient kernel not used because: (Triggered internally at sdp_utils.cpp)"),
            W("Memory efficient kernel not used because: (Triggered internally at sdp_utils.cpp)"),
            W("Expected query, key and value to all be of dtype ... only supports"), W("unrelated deprecation")]
    said = torch_says(seen)
    assert said.startswith("(torch: Memory efficient kernel not used because:") and said.count("Memory efficient") == 1
    assert "only supports" in said and "deprecation" not in said
    assert torch_says([]) == ""
