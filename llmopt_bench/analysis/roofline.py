"""The roofline next to the measurement: how close each stage's decode (and prefill) runs to
what the hardware was measured to do, from run.json alone.

Both ceilings are measured by the probe, not taken from a datasheet: the memory ceiling is a
device-to-device copy's bandwidth, the compute ceiling a large dense matmul's FLOP/s in the
dtype the stage's matmuls run in (env["ceilings"]["matmul_flops_by_dtype"]: fp16, bf16, fp32,
FP8 on Hopper/Ada, INT8). A measured ceiling is not a law: a kernel can beat a copy loop, so
`achieved` above 1.0 is possible and says the copy understates the hardware.

Decode, one engine step (every running sequence gets one token):

    bytes  = weights at their stored (quantized) size + KV cache read at the current context
    KV     = 2 x layers x kv_heads x head_dim x kv dtype bytes x context x batch,
             context = mean prompt tokens + output tokens / 2 (the middle of the generation)
    memory time = bytes / measured copy bandwidth    (the step at the measured memory ceiling)
    achieved = memory time / measured TPOT p50       (1.0 = at the measured memory ceiling)
    FLOPs  = batch x (2 x params + 4 x layers x heads x head_dim x context)
    compute time = FLOPs / the measured matmul FLOP/s of the stage's compute dtype;
    compute fraction = compute time / TPOT p50

KV bytes count the KV heads (fewer than the query heads under GQA); attention FLOPs count the
query heads (every query head attends over the context, sharing the KV heads' cache).

Compute dtype (compute_dtype): quantization "fp8" -> fp8 (W8A8); bitsandbytes LLM.int8 layers ->
int8 (its int8 x int8 matmuls; the outlier columns in 16 bits are not counted); AWQ W4A16 and
bitsandbytes NF4 dequantize to the stage's dtype and multiply there; otherwise the stage's dtype.
A ceiling the probe did not measure (FP8 before Ada, runs recorded before per-dtype ceilings)
falls back to the stage's dtype, else the headline fp16 figure, and the row says so.

Prefill (the whole prompt at once, timed by TTFT p50): FLOPs = batch x (2 x params x prompt
+ 2 x layers x heads x head_dim x prompt^2), bytes = weights + the KV cache written.

Bound: which roof explains at least half of the measured time.
    compute-bound   compute fraction >= 0.5 and >= achieved (large batches, prefill)
    memory-bound    achieved >= 0.5: at least half the speed of the measured memory ceiling
    overhead-bound  both < 0.5: neither the bytes nor the FLOPs explain the time; it goes to
                    kernel launches, Python, synchronisation, scheduling. `roof` says which roof
                    the step sits under (memory when its arithmetic intensity is below the ridge
                    = FLOP/s / bandwidth, far below it for decode: ~1 FLOP/byte for FP16 against
                    ~200 on a datacenter GPU), i.e. the ceiling it is failing to reach.
Pure functions; nothing here imports torch."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, TypedDict

from llmopt_bench.core.freeform import Json
from llmopt_bench.core.host import Ceilings

MEMORY_BOUND_AT = 0.5
COMPUTE_BOUND_AT = 0.5
DTYPE_BYTES = {"float64": 8, "float32": 4, "float": 4, "fp32": 4, "float16": 2, "fp16": 2, "half": 2,
               "bfloat16": 2, "bf16": 2, "auto": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "float8_e4m3fn": 1,
               "int8": 1, "uint8": 1, "int4": 0.5, "nf4": 0.5, "fp4": 0.5, "awq": 0.5}


@dataclass(frozen=True)
class RooflineRow:
    stage: str
    phase: str  # "decode" (one step, TPOT) or "prefill" (the prompt, TTFT)
    batch: int
    context_tokens: float
    weight_bytes: float
    weight_source: str
    kv_bytes: float
    bytes_per_step: float
    flops_per_step: float
    intensity: float  # FLOPs per byte
    ridge: float | None  # FLOPs per byte where the compute roof meets the memory roof
    memory_s: float  # the step's bytes at the measured copy bandwidth (the measured memory ceiling)
    compute_s: float | None  # the FLOPs at the measured matmul ceiling of ceiling_dtype
    measured_s: float
    achieved: float  # memory_s / measured: the fraction of the measured memory ceiling reached
    compute_fraction: float | None
    bound: str
    roof: str  # "memory" (intensity below the ridge) or "compute": the ceiling that applies
    compute_dtype: str | None = None  # what the stage's matmuls run in
    compute_dtype_why: str = ""  # how that was read from the stage's load.implementation
    ceiling_dtype: str | None = None  # whose measured matmul ceiling compute_s uses
    ceiling_note: str = ""  # why ceiling_dtype stands in for compute_dtype ("" when they match)
    # decode: the share of a token the GPU was busy (facts.gpu_busy_share, measure/gpu_busy.py);
    # None with why: not measured (a CPU run, an engine in processes of its own, prefill)
    gpu_busy: float | None = None
    gpu_busy_note: str = ""

    @property
    def floor_s(self) -> float:
        """The old name of memory_s (a measured ceiling, not a floor nothing can beat)."""
        return self.memory_s

    def as_dict(self) -> Json:
        return asdict(self)


class ComputeDtypes(TypedDict):
    """What a stage's matmuls run in and whose measured ceiling stands for it: make_row's keywords."""

    compute_dtype: str | None
    compute_dtype_why: str
    ceiling_dtype: str | None
    ceiling_note: str


def dtype_bytes(name: str | None, default: float = 2) -> float:
    if not name:
        return default
    key = str(name).lower().replace("torch.", "")
    return DTYPE_BYTES.get(key, default)


def kv_cache_bytes(layers: int, kv_heads: int, head_dim: int, dtype_size: float, context: float, batch: int = 1) -> float:
    return 2 * layers * kv_heads * head_dim * dtype_size * context * batch


def decode_context(prompt_tokens_mean: float, output_tokens_mean: float) -> float:
    """The context a decode step sees on average: the prompt plus half the output."""
    return prompt_tokens_mean + output_tokens_mean / 2


def memory_time_s(bytes_per_step: float, bandwidth_bytes_s: float) -> float:
    """The step's bytes at the measured copy bandwidth."""
    return bytes_per_step / bandwidth_bytes_s


memory_floor_s = memory_time_s  # the old name


def decode_flops(num_params: float, layers: int, attn_dim: int, context: float, batch: int = 1) -> float:
    """Matmuls (2 FLOPs per weight) plus attention over the context (QK^T and AV)."""
    return batch * (2 * num_params + 4 * layers * attn_dim * context)


def prefill_flops(num_params: float, layers: int, attn_dim: int, prompt: float, batch: int = 1) -> float:
    """Matmuls for every prompt token plus causal attention (half of the P x P scores)."""
    return batch * (2 * num_params * prompt + 2 * layers * attn_dim * prompt * prompt)


def classify(achieved: float, compute_fraction: float | None) -> str:
    if compute_fraction is not None and compute_fraction >= COMPUTE_BOUND_AT and compute_fraction >= achieved:
        return "compute-bound"
    if achieved >= MEMORY_BOUND_AT:
        return "memory-bound"
    return "overhead-bound"


def roof_of(intensity: float, ridge: float | None) -> str:
    return "memory" if ridge is None or intensity < ridge else "compute"


def make_row(stage: str, phase: str, batch: int, context: float, weight_bytes: float, weight_source: str,
             kv_bytes: float, flops: float, measured_s: float, bandwidth: float, matmul_flops: float | None,
             compute_dtype: str | None = None, compute_dtype_why: str = "", ceiling_dtype: str | None = None,
             ceiling_note: str = "") -> RooflineRow:
    total = weight_bytes + kv_bytes
    memory = memory_time_s(total, bandwidth)
    compute_s = flops / matmul_flops if matmul_flops else None
    ridge = matmul_flops / bandwidth if matmul_flops else None
    intensity = flops / total if total else 0.0
    achieved = memory / measured_s
    frac = compute_s / measured_s if compute_s is not None else None
    return RooflineRow(stage=stage, phase=phase, batch=batch, context_tokens=context, weight_bytes=weight_bytes,
                       weight_source=weight_source, kv_bytes=kv_bytes, bytes_per_step=total, flops_per_step=flops,
                       intensity=intensity, ridge=ridge, memory_s=memory, compute_s=compute_s, measured_s=measured_s,
                       achieved=achieved, compute_fraction=frac, bound=classify(achieved, frac),
                       roof=roof_of(intensity, ridge), compute_dtype=compute_dtype, compute_dtype_why=compute_dtype_why,
                       ceiling_dtype=ceiling_dtype, ceiling_note=ceiling_note)


# --- the compute dtype and its ceiling -------------------------------------------------------

CANONICAL_DTYPES = {"float16": "float16", "fp16": "float16", "half": "float16", "bfloat16": "bfloat16",
                    "bf16": "bfloat16", "float32": "float32", "fp32": "float32", "float": "float32"}


def canonical_dtype(name: str | None) -> str | None:
    return CANONICAL_DTYPES.get(str(name).lower().replace("torch.", "")) if name else None


def compute_dtype(stage: Any, model: Any) -> tuple[str | None, str]:
    """The dtype the stage's matmuls run in, from what load() recorded, and why."""
    impl = (stage.load.implementation if stage.load else {}) or {}
    quant = str(impl.get("quantization") or "").lower()
    layers = " ".join(impl.get("linear_layers") or {})
    base = canonical_dtype(stage_dtype(stage, model))
    if quant == "fp8" or quant.startswith("fp8"):
        return "fp8", "quantization fp8: FP8 weights and activations (W8A8)"
    if "Linear8bitLt" in layers:
        return "int8", "bitsandbytes LLM.int8: int8 x int8 matmuls (outlier columns in 16 bits, not counted)"
    if impl.get("w4a16") or impl.get("awq") or quant.startswith(("awq", "gptq")):
        return base, f"W4A16: 4-bit weights dequantized, matmuls in {base}"
    if "Linear4bit" in layers:
        return base, f"bitsandbytes NF4: 4-bit weights dequantized, matmuls in {base}"
    return base, "the stage's dtype"


def matmul_ceiling(c: Ceilings, want: str | None) -> tuple[float | None, str | None, str]:
    """(FLOP/s, the dtype it was measured in, why that dtype stands in when it is not `want`)."""
    headline, head_dtype = c.matmul_flops, c.matmul_dtype or "float16"
    by_dtype = c.matmul_flops_by_dtype
    if by_dtype is None:  # runs recorded before per-dtype ceilings
        if want in (None, head_dtype):
            return headline, head_dtype, ""
        return headline, head_dtype, f"this run measured only the {head_dtype} matmul (recorded before per-dtype ceilings)"
    if want in by_dtype:
        return by_dtype[want], want, ""
    skipped = c.matmul_not_measured or {}
    why = f"no {want} ceiling measured" + (f" ({skipped[want]})" if want in skipped else "") \
        if want else "the stage's compute dtype is unknown"
    for alt in dict.fromkeys((canonical_dtype(want) if want else None, head_dtype)):
        if alt in by_dtype:
            return by_dtype[alt], alt, why
    return headline, head_dtype, why


# --- reading a RunResult ---------------------------------------------------------------------

def stage_dtype(stage: Any, model: Any) -> str | None:
    impl = (stage.load.implementation if stage.load else {}) or {}
    return impl.get("dtype") or (model.checkpoint_dtype if model else None)


def stage_weight_bytes(stage: Any, model: Any) -> tuple[float | None, str]:
    """Weights at their stored size: what load() measured, else params x dtype size."""
    if stage.load and stage.load.weights_bytes:
        return float(stage.load.weights_bytes), "measured at load"
    if model is not None and model.num_params:
        dt = stage_dtype(stage, model)
        return model.num_params * dtype_bytes(dt), f"params x {dt or 'fp16'} size"
    return None, "unknown"


def stage_batch(stage: Any, workload: Any, decode: bool = True) -> int:
    """Sequences decoded together: what the stage says of its samples (facts.decode_batch: a load
    curve's main concurrency), else the batch size (prefill: the batch size; a continuous batch
    prefills requests as they arrive)."""
    if decode and stage.facts.decode_batch:
        return int(stage.facts.decode_batch)
    return int((stage.params or {}).get("batch_size") or getattr(workload, "batch_size", 1) or 1)


def kv_dtype_bytes(stage: Any, model: Any) -> float:
    impl = (stage.load.implementation if stage.load else {}) or {}
    kv = (stage.load.kv_cache_dtype if stage.load else None) or impl.get("kv_cache_dtype")
    return dtype_bytes(kv if kv not in (None, "auto") else stage_dtype(stage, model))


def roofline_rows(stage: Any, run: Any) -> list[RooflineRow]:
    """Decode and prefill rows for one ok stage; [] when the inputs are missing."""
    c = run.env.ceilings or Ceilings()
    bandwidth = c.mem_bandwidth_bytes_s
    m, model = stage.metrics, run.model
    if stage.status != "ok" or not m or not m.requests or not bandwidth or model is None:
        return []
    weights, source = stage_weight_bytes(stage, model)
    if weights is None:
        return []
    want, why = compute_dtype(stage, model)
    matmul, used, note = matmul_ceiling(c, want)
    dtypes: ComputeDtypes = {"compute_dtype": want, "compute_dtype_why": why, "ceiling_dtype": used, "ceiling_note": note}
    # KV bytes: the KV heads (GQA shares each among several query heads); FLOPs: the query heads
    layers, kv_heads, head_dim = model.num_layers or 0, model.num_kv_heads or model.num_heads or 0, model.head_dim or 0
    attn_dim = (model.num_heads or 0) * head_dim
    params = model.num_params or 0
    batch = stage_batch(stage, run.workload)
    prompt, output = m.prompt_tokens / m.requests, m.output_tokens / m.requests
    kvb = kv_dtype_bytes(stage, model)
    tpot, ttft = step_times(stage)
    rows = []
    if tpot and tpot > 0:  # a TPOT of 0 (every token read at once) is no decode step
        ctx = decode_context(prompt, output)
        row = make_row(stage.name, "decode", batch, ctx, weights, source, kv_cache_bytes(layers, kv_heads, head_dim, kvb, ctx, batch),
                       decode_flops(params, layers, attn_dim, ctx, batch), tpot, bandwidth, matmul, **dtypes)
        rows.append(replace(row, gpu_busy=stage.facts.gpu_busy_share, gpu_busy_note=busy_note(stage, run)))
    if ttft and ttft > 0 and not prefix_cached(stage):
        pb = stage_batch(stage, run.workload, decode=False)
        rows.append(make_row(stage.name, "prefill", pb, prompt, weights, source,
                             kv_cache_bytes(layers, kv_heads, head_dim, kvb, prompt, pb),
                             prefill_flops(params, layers, attn_dim, prompt, pb), ttft, bandwidth, matmul, **dtypes))
    return rows


def prefix_cached(stage: Any) -> bool:
    """The requests were served with vLLM's prefix cache on: their TTFT is not the whole prompt's
    prefill (2176 tokens' FLOPs in 23.2 ms read as 173% of the compute ceiling), so no prefill row."""
    cmd = stage.facts.serve_command or ((stage.load.implementation if stage.load else {}) or {}).get("command") or ""
    return "--enable-prefix-caching" in str(cmd) or bool((stage.params or {}).get("enable_prefix_caching"))


def step_times(stage: Any) -> tuple[float | None, float | None]:
    """(TPOT p50, TTFT p50) the rows are timed by. A stage whose headline is an open-loop point (a
    serving capacity: many requests in flight, how many unknown; no facts.decode_batch) but which
    measured one request in flight apart (facts.batch1_*) is timed by that: its headline TPOT at
    batch 1 would call a step shared by dozens of requests one request's step (22.6 ms
    "overhead-bound" where batch 1 took 4.8 ms, H200 prefix-caching run of 2026-12-05). The rows'
    batch is still stage_batch's, the workload's batch size, which the serving stages leave at 1."""
    from llmopt_bench.analysis.figures import stage_figure

    f = stage.facts
    if f.decode_batch is None and f.batch1_tpot_s:
        return f.batch1_tpot_s, f.batch1_ttft_s
    return stage_figure(stage, "tpot_p50").recorded, stage_figure(stage, "ttft_p50").recorded  # the tables' figures


def busy_note(stage: Any, run: Any) -> str:
    """Why a decode row has no GPU-busy share ("" where it has one)."""
    if stage.facts.gpu_busy_share is not None:
        return ""
    impl = (stage.load.implementation if stage.load else {}) or {}
    device = str(impl.get("device") or run.env.device or "")
    return "n/a (CPU run)" if device.startswith("cpu") else "not measured"


def roofline(run: Any) -> list[RooflineRow]:
    return [row for s in run.stages for row in roofline_rows(s, run)]
