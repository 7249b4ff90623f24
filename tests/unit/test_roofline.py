"""The roofline arithmetic, checked against the H200 reference numbers of the story."""

from __future__ import annotations

import pytest

from llmopt_bench.analysis import roofline as rl
from llmopt_bench.results import StageMetrics
from llmopt_bench.distribution import Distribution
from llmopt_bench.models import ModelInfo
from llmopt_bench.results import RunResult, StageResult
from llmopt_bench.stage import LoadInfo, StageFacts
from llmopt_bench.workload import WorkloadConfig

H200_BW = 4.28e12
H200_FLOPS = 7.0e14
PARAMS_7B = 6.74e9
LLAMA7B = dict(source="synthetic:llama2-7b", kind="synthetic", path="/x", real_weights=False, num_layers=32,
               num_heads=32, num_kv_heads=32, head_dim=128, hidden_size=4096, num_params=int(PARAMS_7B),
               checkpoint_dtype="float16")


def d(v: float) -> Distribution:
    return Distribution.of([v * 0.9, v, v * 1.1])


def stage(name: str, tpot: float, ttft: float = 0.02, weights: int | None = int(PARAMS_7B * 2), status="ok",
          dtype="float16", extra=None, prompt=100, output=16, params=None, facts=None, kv_dtype=None) -> StageResult:
    m = StageMetrics(requests=4, output_tokens=4 * output, prompt_tokens=4 * prompt, repeats=1, ttft_s=d(ttft),
                     tpot_s=d(tpot), e2e_s=d(ttft + tpot * (output - 1)))
    return StageResult(name=name, status=status, metrics=m if status == "ok" else None, params=params or {},
                       load=LoadInfo(weights_bytes=weights, implementation={"dtype": dtype}, kv_cache_dtype=kv_dtype),
                       extra=extra or {}, facts=facts or StageFacts())


def run_of(*stages: StageResult, env=None) -> RunResult:
    env = {"ceilings": {"mem_bandwidth_bytes_s": H200_BW, "matmul_flops": H200_FLOPS}} if env is None else env
    return RunResult(run_id="t", created_at="now", command="test", env=env, model=ModelInfo(**LLAMA7B),
                     workload=WorkloadConfig(), stages=list(stages))


def test_kv_cache_bytes_is_two_x_layers_x_heads_x_dim_x_bytes_x_context_x_batch():
    assert rl.kv_cache_bytes(32, 32, 128, 2, 1000, 1) == 2 * 32 * 32 * 128 * 2 * 1000
    assert rl.kv_cache_bytes(32, 8, 128, 1, 1000, 4) == 2 * 32 * 8 * 128 * 1 * 1000 * 4
    assert rl.decode_context(100, 16) == 108


def test_h200_vllm_fp16_batch1_floor_is_3_15_ms_and_68_percent_achieved():
    weights = PARAMS_7B * 2
    floor = rl.memory_floor_s(weights, H200_BW)
    assert floor * 1e3 == pytest.approx(3.15, abs=0.01)
    row = rl.make_row("vllm", "decode", 1, 108, weights, "x", rl.kv_cache_bytes(32, 32, 128, 2, 108),
                      rl.decode_flops(PARAMS_7B, 32, 4096, 108), 4.63e-3, H200_BW, H200_FLOPS)
    assert row.floor_s * 1e3 == pytest.approx(3.16, abs=0.02)
    assert row.achieved == pytest.approx(0.68, abs=0.01)
    assert row.bound == "memory-bound" and row.roof == "memory"
    assert row.intensity == pytest.approx(1.0, abs=0.05)  # FP16 decode: ~1 FLOP per byte


def test_transformers_at_ten_percent_of_the_floor_is_overhead_bound():
    row = rl.make_row("hf-fp16", "decode", 1, 108, PARAMS_7B * 2, "x", 0, rl.decode_flops(PARAMS_7B, 32, 4096, 108),
                      31.5e-3, H200_BW, H200_FLOPS)
    assert row.achieved == pytest.approx(0.10, abs=0.01)
    assert row.bound == "overhead-bound"


def test_large_batch_prefill_is_compute_bound():
    flops = rl.prefill_flops(PARAMS_7B, 32, 4096, 2048, batch=8)
    ideal = flops / H200_FLOPS
    row = rl.make_row("vllm", "prefill", 8, 2048, PARAMS_7B * 2, "x", 0, flops, ideal / 0.7, H200_BW, H200_FLOPS)
    assert row.compute_fraction == pytest.approx(0.7)
    assert row.bound == "compute-bound" and row.roof == "compute"


@pytest.mark.parametrize("achieved,compute,bound", [(0.5, 0.1, "memory-bound"), (0.49, 0.1, "overhead-bound"),
                                                    (0.9, 0.6, "memory-bound"), (0.6, 0.8, "compute-bound"),
                                                    (0.1, None, "overhead-bound")])
def test_classify_thresholds(achieved, compute, bound):
    assert rl.classify(achieved, compute) == bound


def test_weights_fall_back_to_params_times_dtype_size():
    model = ModelInfo(**LLAMA7B)
    assert rl.stage_weight_bytes(stage("a", 0.01, weights=123), model) == (123.0, "measured at load")
    b, src = rl.stage_weight_bytes(stage("b", 0.01, weights=None, dtype="float32"), model)
    assert b == int(PARAMS_7B) * 4 and "float32" in src
    assert rl.stage_weight_bytes(stage("c", 0.01, weights=None, dtype="bfloat16"), model)[0] == int(PARAMS_7B) * 2


def test_run_rows_use_measured_weights_tpot_and_batch():
    fp16 = stage("hf-fp16", 31.5e-3)
    int8 = stage("bnb-int8", 40e-3, weights=int(PARAMS_7B))
    cb = stage("continuous-batching", 10e-3, facts=StageFacts(decode_batch=16), kv_dtype="fp8")
    rows = {(r.stage, r.phase): r for r in rl.roofline(run_of(fp16, int8, cb))}
    assert set(rows) == {(s, p) for s in ("hf-fp16", "bnb-int8", "continuous-batching") for p in ("decode", "prefill")}
    assert rows["bnb-int8", "decode"].weight_bytes == int(PARAMS_7B)
    assert rows["hf-fp16", "decode"].measured_s == pytest.approx(31.5e-3)
    cbd = rows["continuous-batching", "decode"]
    assert cbd.batch == 16 and rows["continuous-batching", "prefill"].batch == 1
    assert cbd.kv_bytes == rl.kv_cache_bytes(32, 32, 128, 1, 108, 16)  # fp8 KV: one byte
    assert rows["hf-fp16", "decode"].kv_bytes == rl.kv_cache_bytes(32, 32, 128, 2, 108, 1)


def test_no_rows_without_ceilings_or_for_failed_stages():
    assert rl.roofline(run_of(stage("hf-fp16", 0.01), env={})) == []
    assert rl.roofline(run_of(stage("vllm", 0.01, status="skipped"))) == []
