"""The roofline next to the measurement: how close each stage's decode (and prefill) runs to
what the hardware allows, from run.json alone.

Decode, one engine step (every running sequence gets one token):

    bytes  = weights at their stored (quantized) size + KV cache read at the current context
    KV     = 2 x layers x kv_heads x head_dim x kv dtype bytes x context x batch,
             context = mean prompt tokens + output tokens / 2 (the middle of the generation)
    floor  = bytes / measured memory bandwidth        (the step cannot be faster than this)
    achieved = floor / measured TPOT p50              (1.0 = at the memory roof)
    FLOPs  = batch x (2 x params + 4 x layers x heads x head_dim x context)
    compute time = FLOPs / measured matmul FLOP/s;  compute fraction = compute time / TPOT p50

Prefill (the whole prompt at once, timed by TTFT p50): FLOPs = batch x (2 x params x prompt
+ 2 x layers x heads x head_dim x prompt^2), bytes = weights + the KV cache written.

Bound: which roof explains at least half of the measured time.
    compute-bound   compute fraction >= 0.5 and >= achieved (large batches, prefill)
    memory-bound    achieved >= 0.5: at least half the memory floor's speed (decode done well)
    overhead-bound  both < 0.5: neither the bytes nor the FLOPs explain the time; it goes to
                    kernel launches, Python, synchronisation, scheduling. `roof` says which roof
                    the step sits under (memory when its arithmetic intensity is below the ridge
                    = FLOP/s / bandwidth, far below it for decode: ~1 FLOP/byte for FP16 against
                    ~200 on a datacenter GPU), i.e. the ceiling it is failing to reach.
Pure functions; nothing here imports torch."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

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
    floor_s: float  # memory floor for the step
    compute_s: float | None  # the FLOPs at the measured matmul ceiling
    measured_s: float
    achieved: float  # floor / measured
    compute_fraction: float | None
    bound: str
    roof: str  # "memory" (intensity below the ridge) or "compute": the ceiling that applies

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


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


def memory_floor_s(bytes_per_step: float, bandwidth_bytes_s: float) -> float:
    return bytes_per_step / bandwidth_bytes_s


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
             kv_bytes: float, flops: float, measured_s: float, bandwidth: float, matmul_flops: float | None) -> RooflineRow:
    total = weight_bytes + kv_bytes
    floor = memory_floor_s(total, bandwidth)
    compute_s = flops / matmul_flops if matmul_flops else None
    ridge = matmul_flops / bandwidth if matmul_flops else None
    intensity = flops / total if total else 0.0
    achieved = floor / measured_s
    frac = compute_s / measured_s if compute_s is not None else None
    return RooflineRow(stage=stage, phase=phase, batch=batch, context_tokens=context, weight_bytes=weight_bytes,
                       weight_source=weight_source, kv_bytes=kv_bytes, bytes_per_step=total, flops_per_step=flops,
                       intensity=intensity, ridge=ridge, floor_s=floor, compute_s=compute_s, measured_s=measured_s,
                       achieved=achieved, compute_fraction=frac, bound=classify(achieved, frac),
                       roof=roof_of(intensity, ridge))


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


def ceilings(env: dict[str, Any]) -> tuple[float | None, float | None]:
    c = (env or {}).get("ceilings") or {}
    return c.get("mem_bandwidth_bytes_s"), c.get("matmul_flops")


def stage_rows(stage: Any, run: Any) -> list[RooflineRow]:
    """Decode and prefill rows for one ok stage; [] when the inputs are missing."""
    bandwidth, matmul = ceilings(run.env)
    m, model = stage.metrics, run.model
    if stage.status != "ok" or not m or not m.requests or not bandwidth or model is None:
        return []
    weights, source = stage_weight_bytes(stage, model)
    if weights is None:
        return []
    layers, kv_heads, head_dim = model.num_layers or 0, model.num_kv_heads or model.num_heads or 0, model.head_dim or 0
    attn_dim = (model.num_heads or 0) * head_dim
    params = model.num_params or 0
    batch = stage_batch(stage, run.workload)
    prompt, output = m.prompt_tokens / m.requests, m.output_tokens / m.requests
    kvb = kv_dtype_bytes(stage, model)
    rows = []
    if m.tpot_s:
        ctx = decode_context(prompt, output)
        rows.append(make_row(stage.name, "decode", batch, ctx, weights, source,
                             kv_cache_bytes(layers, kv_heads, head_dim, kvb, ctx, batch),
                             decode_flops(params, layers, attn_dim, ctx, batch), m.tpot_s.p50, bandwidth, matmul))
    if m.ttft_s and m.ttft_s.p50 > 0:
        pb = stage_batch(stage, run.workload, decode=False)
        rows.append(make_row(stage.name, "prefill", pb, prompt, weights, source,
                             kv_cache_bytes(layers, kv_heads, head_dim, kvb, prompt, pb),
                             prefill_flops(params, layers, attn_dim, prompt, pb), m.ttft_s.p50, bandwidth, matmul))
    return rows


def roofline(run: Any) -> list[RooflineRow]:
    return [row for s in run.stages for row in stage_rows(s, run)]
