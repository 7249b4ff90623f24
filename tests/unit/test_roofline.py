"""The roofline arithmetic, checked against the H200 reference numbers of the story."""

from __future__ import annotations

import pytest

from llmopt_bench.analysis import roofline as rl
from llmopt_bench.analysis.narrative import roofline_text as rt
from llmopt_bench.core.distribution import Distribution
from llmopt_bench.core.host import Ceilings
from llmopt_bench.core.models import ModelInfo
from llmopt_bench.core.records import LoadInfo, StageFacts
from llmopt_bench.core.results import RunResult, StageMetrics, StageResult
from llmopt_bench.core.workload import WorkloadConfig

H200_BW = 4.28e12
H200_FLOPS = 7.0e14
PARAMS_7B = 6.74e9
LLAMA7B = dict(source="synthetic:llama2-7b", kind="synthetic", path="/x", real_weights=False, num_layers=32,
               num_heads=32, num_kv_heads=32, head_dim=128, hidden_size=4096, num_params=int(PARAMS_7B),
               checkpoint_dtype="float16")


def d(v: float) -> Distribution:
    return Distribution.of([v * 0.9, v, v * 1.1])


def stage(name: str, tpot: float, ttft: float = 0.02, weights: int | None = int(PARAMS_7B * 2), status="ok",
          dtype="float16", extra=None, prompt=100, output=16, params=None, impl=None, facts=None, kv_dtype=None) -> StageResult:
    m = StageMetrics(requests=4, output_tokens=4 * output, prompt_tokens=4 * prompt, repeats=1, ttft_s=d(ttft),
                     tpot_s=d(tpot), e2e_s=d(ttft + tpot * (output - 1)))
    return StageResult(name=name, status=status, metrics=m if status == "ok" else None, params=params or {},
                       load=LoadInfo(weights_bytes=weights, implementation={"dtype": dtype, **(impl or {})}, kv_cache_dtype=kv_dtype),
                       extra=extra or {}, facts=facts or StageFacts())


def run_of(*stages: StageResult, env=None, model=None) -> RunResult:
    env = {"ceilings": {"mem_bandwidth_bytes_s": H200_BW, "matmul_flops": H200_FLOPS}} if env is None else env
    return RunResult(run_id="t", created_at="now", command="test", env=env, model=ModelInfo(**(model or LLAMA7B)),
                     workload=WorkloadConfig(), stages=list(stages))


def test_kv_cache_bytes_is_two_x_layers_x_heads_x_dim_x_bytes_x_context_x_batch():
    assert rl.kv_cache_bytes(32, 32, 128, 2, 1000, 1) == 2 * 32 * 32 * 128 * 2 * 1000
    assert rl.kv_cache_bytes(32, 8, 128, 1, 1000, 4) == 2 * 32 * 8 * 128 * 1 * 1000 * 4
    assert rl.decode_context(100, 16) == 108


def test_h200_vllm_fp16_batch1_floor_is_3_15_ms_and_68_percent_achieved():
    weights = PARAMS_7B * 2
    floor = rl.memory_time_s(weights, H200_BW)
    assert floor * 1e3 == pytest.approx(3.15, abs=0.01)
    row = rl.make_row("vllm", "decode", 1, 108, weights, "x", rl.kv_cache_bytes(32, 32, 128, 2, 108),
                      rl.decode_flops(PARAMS_7B, 32, 4096, 108), 4.63e-3, H200_BW, H200_FLOPS)
    assert row.memory_s * 1e3 == pytest.approx(3.16, abs=0.02) and row.floor_s == row.memory_s  # old name kept
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


@pytest.mark.parametrize("dtype,size", [("int8", 1), ("uint8", 1), ("int4", 0.5), ("nf4", 0.5), ("fp4", 0.5), ("awq", 0.5),
                                        ("fp8", 1), ("torch.float16", 2), ("float32", 4)])
def test_quantized_weights_fall_back_to_their_own_size(dtype, size):
    """INT8 is one byte a weight and INT4/NF4/AWQ half of one: an INT8 stage counted at FP16's two
    bytes would read its memory floor twice too high, and its achieved fraction twice too good."""
    model = ModelInfo(**LLAMA7B)
    b, src = rl.stage_weight_bytes(stage("q", 0.01, weights=None, dtype=dtype), model)
    assert b == int(PARAMS_7B) * size and dtype in src
    assert rl.kv_cache_bytes(2, 2, 4, rl.dtype_bytes(dtype), 10) == 2 * 2 * 2 * 4 * size * 10


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


def test_a_serving_capacity_headline_is_timed_by_its_batch_1_point():
    """The headline of a serving stage is a search point with many requests in flight: the rows at
    batch 1 take the concurrency-1 figures the stage measured apart, not the headline's."""
    serve = stage("vllm-serve", 22.6e-3, ttft=72.5e-3, facts=StageFacts(batch1_tpot_s=4.77e-3, batch1_ttft_s=23.2e-3))
    swept = stage("continuous-batching", 10e-3, facts=StageFacts(decode_batch=16, batch1_tpot_s=5e-3, batch1_ttft_s=0.03))
    rows = {(r.stage, r.phase): r for r in rl.roofline(run_of(serve, swept))}
    assert rows["vllm-serve", "decode"].measured_s == pytest.approx(4.77e-3) and rows["vllm-serve", "decode"].batch == 1
    assert rows["vllm-serve", "prefill"].measured_s == pytest.approx(23.2e-3)
    # a headline at a known concurrency keeps its own figures at that batch
    assert rows["continuous-batching", "decode"].measured_s == pytest.approx(10e-3)
    assert rows["continuous-batching", "prefill"].measured_s == pytest.approx(0.02)


def test_no_prefill_row_where_the_prefix_cache_served_the_prompts():
    cached = stage("prefix-caching", 5e-3, ttft=23.2e-3, facts=StageFacts(serve_command="vllm serve m --enable-prefix-caching"))
    off = stage("vllm-serve", 5e-3, ttft=60e-3, facts=StageFacts(serve_command="vllm serve m --no-enable-prefix-caching"))
    rows = {(r.stage, r.phase) for r in rl.roofline(run_of(cached, off))}
    assert rows == {("prefix-caching", "decode"), ("vllm-serve", "decode"), ("vllm-serve", "prefill")}


def test_no_rows_without_ceilings_or_for_failed_stages():
    assert rl.roofline(run_of(stage("hf-fp16", 0.01), env={})) == []
    assert rl.roofline(run_of(stage("vllm", 0.01, status="skipped"))) == []


def test_no_decode_row_from_a_tpot_of_zero():
    """A client that read every token of an answer at once times them together (TPOT 0: issue 23,
    a point its self-check marks): no decode step to place on the roofline, and no crash."""
    rows = rl.roofline(run_of(stage("openai-endpoint", 0.0)))
    assert [r.phase for r in rows] == ["prefill"]


# --- GQA: KV bytes follow the KV heads, attention FLOPs the query heads ---------------------

LLAMA3_8B = {**LLAMA7B, "source": "synthetic:llama3-8b", "num_kv_heads": 8, "num_params": int(8.03e9)}


def test_gqa_kv_bytes_count_the_kv_heads_and_flops_the_query_heads():
    """Llama-3-8B shape: 32 query heads share 8 KV heads. The KV cache is a quarter of what 32
    heads would hold; attention still runs for all 32 query heads."""
    rows = {r.phase: r for r in rl.roofline(run_of(stage("vllm", 5e-3), model=LLAMA3_8B))}
    dec, pre = rows["decode"], rows["prefill"]
    assert dec.kv_bytes == 2 * 32 * 8 * 128 * 2 * 108 * 1  # layers x KV heads x head_dim x fp16 x context
    assert dec.kv_bytes * 4 == rl.kv_cache_bytes(32, 32, 128, 2, 108)  # not the query heads'
    assert pre.kv_bytes == 2 * 32 * 8 * 128 * 2 * 100
    assert dec.flops_per_step == 2 * 8.03e9 + 4 * 32 * (32 * 128) * 108  # query heads x head_dim
    assert pre.flops_per_step == 2 * 8.03e9 * 100 + 2 * 32 * (32 * 128) * 100**2
    assert dec.bytes_per_step == int(PARAMS_7B * 2) + dec.kv_bytes


# --- the compute ceiling of the stage's compute dtype ---------------------------------------

PER_DTYPE = {"mem_bandwidth_bytes_s": H200_BW, "matmul_flops": H200_FLOPS, "matmul_dtype": "float16",
             "matmul_flops_by_dtype": {"float16": H200_FLOPS, "bfloat16": 7.1e14, "float32": 5e13,
                                       "fp8": 2 * H200_FLOPS, "int8": 1.5 * H200_FLOPS}}


def rows_by_stage(*stages, ceilings=None):
    run = run_of(*stages, env={"ceilings": ceilings or PER_DTYPE})
    return {(r.stage, r.phase): r for r in rl.roofline(run)}


def test_fp8_stage_is_measured_against_the_fp8_ceiling():
    """vllm-fp8's prefill against the FP8 matmul: half the compute fraction the FP16 ceiling gave."""
    rows = rows_by_stage(stage("vllm", 5e-3), stage("vllm-fp8", 4e-3, impl={"quantization": "fp8"}))
    fp16, fp8 = rows["vllm", "prefill"], rows["vllm-fp8", "prefill"]
    assert (fp8.compute_dtype, fp8.ceiling_dtype, fp8.ceiling_note) == ("fp8", "fp8", "")
    assert fp8.compute_s == pytest.approx(fp8.flops_per_step / (2 * H200_FLOPS))
    assert fp8.compute_fraction == pytest.approx(fp16.compute_fraction / 2)  # same FLOPs, same TTFT
    assert fp8.ridge == pytest.approx(2 * H200_FLOPS / H200_BW)
    assert fp16.ceiling_dtype == "float16" and fp16.compute_s == pytest.approx(fp16.flops_per_step / H200_FLOPS)
    assert "the fp8 compute ceiling" in rt.roofline_sentence(fp8) and "stands in" not in rt.roofline_sentence(fp8)


@pytest.mark.parametrize("dtype,impl,want", [
    ("float16", {"linear_layers": {"bitsandbytes.nn.modules.Linear8bitLt": 224, "torch.nn.modules.linear.Linear": 1}}, "int8"),
    ("bfloat16", {"linear_layers": {"bitsandbytes.nn.modules.Linear4bit": 224}}, "bfloat16"),  # NF4: W4A16
    ("float16", {"quantization": None, "awq": {"quant_method": "awq"}, "w4a16": True}, "float16"),
    ("float32", {}, "float32"),
    ("bfloat16", {"quantization": "fp8"}, "fp8"),
])
def test_compute_dtype_follows_what_the_stage_loaded(dtype, impl, want):
    row = rows_by_stage(stage("s", 0.01, dtype=dtype, impl=impl))["s", "prefill"]
    assert row.compute_dtype == row.ceiling_dtype == want and not row.ceiling_note
    assert row.compute_s == pytest.approx(row.flops_per_step / PER_DTYPE["matmul_flops_by_dtype"][want])


def test_an_unmeasured_fp8_ceiling_falls_back_to_the_stage_dtype_and_says_why():
    ampere = {**PER_DTYPE, "matmul_flops_by_dtype": {"float16": 3e14, "bfloat16": 3e14},
              "matmul_not_measured": {"fp8": "compute capability 8.0 has no FP8 tensor cores"}}
    row = rows_by_stage(stage("vllm-fp8", 4e-3, impl={"quantization": "fp8"}), ceilings=ampere)["vllm-fp8", "prefill"]
    assert (row.compute_dtype, row.ceiling_dtype) == ("fp8", "float16")
    assert row.compute_s == pytest.approx(row.flops_per_step / 3e14)
    assert "compute capability 8.0" in row.ceiling_note
    assert "The float16 ceiling stands in for the fp8 one: no fp8 ceiling measured (compute capability 8.0" in \
        rt.roofline_sentence(row)


def test_runs_from_before_per_dtype_ceilings_use_the_fp16_ceiling_and_say_so():
    old = {"mem_bandwidth_bytes_s": H200_BW, "matmul_flops": H200_FLOPS, "matmul_dtype": "float16"}
    rows = rows_by_stage(stage("vllm", 5e-3), stage("vllm-fp8", 4e-3, impl={"quantization": "fp8"}), ceilings=old)
    fp16, fp8 = rows["vllm", "prefill"], rows["vllm-fp8", "prefill"]
    assert fp16.ceiling_dtype == "float16" and fp16.ceiling_note == ""
    assert fp8.ceiling_dtype == "float16" and fp8.compute_s == pytest.approx(fp8.flops_per_step / H200_FLOPS)
    assert "recorded before per-dtype ceilings" in fp8.ceiling_note and "stands in for the fp8 one" in rt.roofline_sentence(fp8)
    # and no matmul_dtype at all (the oldest runs): fp16 is assumed, as the probe measured then
    oldest = rows_by_stage(stage("vllm", 5e-3), ceilings={"mem_bandwidth_bytes_s": H200_BW, "matmul_flops": H200_FLOPS})
    assert oldest["vllm", "prefill"].ceiling_dtype == "float16"


# --- the words: a measured ceiling, not a floor ----------------------------------------------

def test_sentences_call_the_copy_bandwidth_a_measured_ceiling():
    rows = rows_by_stage(stage("vllm", 4.63e-3), stage("hf-fp16", 31.5e-3))
    said = " ".join(rt.roofline_sentence(r) for r in rows.values()) + " ".join(rt.prefill_sentences(list(rows.values())))
    assert "floor" not in said
    assert "Decode in vllm is memory-bound at 68.3% of the measured memory ceiling" in said
    assert "Decode in hf-fp16 is overhead-bound: it runs at 10.0% of the measured memory ceiling" in said
    line = rt.ceilings_line(Ceilings(**PER_DTYPE, method="m"))
    assert line.startswith("measured ceilings (not datasheet figures): copy bandwidth 4280 GB/s")
    assert "float16 700 TFLOP/s" in line and "fp8 1400 TFLOP/s" in line and "float32 50.0 TFLOP/s" in line
    assert "int8 1050 TOP/s" in line


def test_a_step_faster_than_the_copy_loop_reads_above_100_percent_not_clamped():
    row = rl.make_row("x", "decode", 1, 108, PARAMS_7B * 2, "x", 0, 1.0, 2.5e-3, H200_BW, H200_FLOPS)
    assert row.achieved > 1.0 and row.bound == "memory-bound"
    assert len(rt.table_cells(row)) == len(rt.TABLE_HEADERS)
