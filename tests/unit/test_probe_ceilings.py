"""The probe's per-dtype matmul ceilings: each timed op computes what it claims (the FP8 and
INT8 operand layouts are the ones the GPU path uses), and the CPU probe records a ceiling per
dtype a CPU stage can compute in, with the reason for each one it leaves out."""

from __future__ import annotations

import pytest

from llmopt_bench.run import envprobe as probe


def test_fp8_op_multiplies_the_fp8_operands():
    import torch

    torch.manual_seed(0)
    a, b = probe.matmul_operands("fp8", 64, "cpu")
    assert a.dtype == b.dtype == torch.float8_e4m3fn and b.stride() == (1, 64)  # b column-major, as _scaled_mm needs
    out = probe.matmul_fn("fp8", "cpu")(a, b)
    assert out.dtype == torch.bfloat16 and torch.allclose(out.float(), a.float() @ b.float(), rtol=2e-2, atol=0.5)


def test_int8_op_is_an_exact_integer_matmul():
    import torch

    a, b = probe.matmul_operands("int8", 64, "cpu")
    out = probe.matmul_fn("int8", "cpu")(a, b)
    assert out.dtype == torch.int32 and torch.equal(out.long(), a.long() @ b.long())


def torch_allclose(out, a, b) -> bool:
    import torch

    return torch.allclose(out.float(), a.float() @ b.float(), rtol=2e-2, atol=0.5)


@pytest.mark.parametrize("kind", ["float32", "bfloat16"])
def test_float_ops_use_their_dtype(kind):
    a, b = probe.matmul_operands(kind, 32, "cpu")
    out = probe.matmul_fn(kind, "cpu")(a, b)
    assert str(out.dtype) == f"torch.{kind}" and torch_allclose(out, a, b)


def test_an_op_that_cannot_run_is_left_out_with_its_reason():
    flops, skipped = probe.matmul_ceilings(["float32", "no_such_dtype"], 64, "cpu", 1)
    assert set(flops) == {"float32"} and flops["float32"] > 0
    assert skipped["no_such_dtype"].startswith("AttributeError")


@pytest.mark.slow
def test_cpu_ceilings_per_dtype():
    from llmopt_bench.engines.hf.generate import best_cpu_dtype

    c = probe.ceilings("cpu")
    by = c.matmul_flops_by_dtype
    assert {"float32", best_cpu_dtype()} <= set(by) and all(v > 0 for v in by.values())
    # the headline stays what older readers expect: the faster float dtype
    assert (c.matmul_flops, c.matmul_dtype) == max((v, k) for k, v in by.items() if k != "int8")
    assert "fp8" in c.matmul_not_measured and "fp8" not in by
    assert ("int8" in by) != ("int8" in c.matmul_not_measured)  # measured, or said why not
    assert c.mem_bandwidth_bytes_s > 0
