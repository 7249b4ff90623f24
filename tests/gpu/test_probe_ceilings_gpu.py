"""The probe's per-dtype matmul ceilings on a CUDA GPU: fp16/bf16/fp32 and INT8 everywhere, FP8
on Ada and Hopper (compute capability 8.9+). The ops compute what they claim in the layouts
they are timed in, and FP8's ceiling sits above FP16's (the H200's dense FP8 peak is twice its
FP16 peak on the datasheet; not yet run on one: written without GPU access). Marked gpu."""

from __future__ import annotations

import pytest

from llmopt_bench.run import envprobe as probe

pytestmark = pytest.mark.gpu


def test_fp8_and_int8_ops_are_correct_on_the_gpu():
    import torch

    if torch.cuda.get_device_capability() >= probe.FP8_MIN_CAPABILITY:
        a, b = probe.matmul_operands("fp8", 256, "cuda")
        out = probe.matmul_fn("fp8", "cuda")(a, b)
        assert torch.allclose(out.float(), a.float() @ b.float(), rtol=2e-2, atol=1.0)
    a, b = probe.matmul_operands("int8", 256, "cuda")
    out = probe.matmul_fn("int8", "cuda")(a, b)
    assert out.dtype == torch.int32 and torch.equal(out.cpu().long(), a.cpu().long() @ b.cpu().long())


def test_cuda_ceilings_per_dtype():
    import torch

    c = probe.ceilings("cuda")
    by = c.matmul_flops_by_dtype
    assert {"float16", "bfloat16", "float32", "int8"} <= set(by), c.matmul_not_measured
    assert c.matmul_flops == by["float16"] and c.matmul_dtype == "float16"  # the headline older code reads
    if torch.cuda.get_device_capability() >= probe.FP8_MIN_CAPABILITY:
        assert by["fp8"] > 1.2 * by["float16"], by  # a 2x peak: far outside timing noise
    else:
        assert "fp8" not in by and "compute capability" in c.matmul_not_measured["fp8"]
