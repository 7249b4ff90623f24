"""The vLLM engine's options and environment, declared once for every vLLM stage: the params
model (VLLMEngineParams), the EngineConfig it resolves to on a device, the GPU-count check of
tensor/pipeline parallelism, and the CPU build's environment (KV cache size, core binding)."""

from __future__ import annotations

from typing import Any, Literal

from llmopt_bench.core.contract import StageSkipped
from llmopt_bench.core.records import StrictModel
from llmopt_bench.engines.hf.generate import resolve_dtype
from llmopt_bench.engines.vllm.offline import EngineConfig


class VLLMEngineParams(StrictModel):
    """Every vLLM engine option llmopt passes, declared once: each vLLM stage's params build on it."""

    dtype: Literal["auto", "float16", "bfloat16", "float32"] = "auto"
    quantization: str | None = None
    max_model_len: int | None = 4096
    gpu_memory_utilization: float = 0.9
    enforce_eager: bool = False
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    distributed_executor_backend: Literal["mp", "ray"] | None = None  # "ray": GPUs of several hosts (docs/multi-gpu.md)
    attention_backend: str | None = None
    load_format: Literal["auto", "safetensors", "dummy"] = "auto"
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    cpu_kvcache_space_gib: int = 1  # VLLM_CPU_KVCACHE_SPACE on the CPU build
    # off: repeats and warm-up reuse the same prompts, and a cached prefix would turn TTFT into a
    # cache lookup that transformers never gets; on: measure what prefix caching buys
    enable_prefix_caching: bool = False
    # None: vLLM's own default (not passed); `llmopt tune` searches them (docs/tune.md)
    enable_chunked_prefill: bool | None = None
    kv_cache_dtype: str | None = None  # auto, fp8, fp8_e4m3, fp8_e5m2 (vLLM's --kv-cache-dtype)


VLLM_OWN_DEFAULT = ("enable_chunked_prefill", "kv_cache_dtype")  # passed only when set: else vLLM chooses


def share_key(params: VLLMEngineParams) -> str:
    """Two stages whose engine options are equal can share one engine (engines/engine_pool.py)."""
    import json

    return "vllm:" + json.dumps({f: getattr(params, f) for f in VLLMEngineParams.model_fields}, sort_keys=True, default=str)


def engine_config(params: VLLMEngineParams, device: str, max_len_cap: int | None) -> EngineConfig:
    dtype = resolve_dtype(params.dtype, device)
    max_len = params.max_model_len
    if max_len and max_len_cap:
        max_len = min(max_len, max_len_cap)
    return EngineConfig(dtype=dtype, quantization=params.quantization, max_model_len=max_len,
                          gpu_memory_utilization=params.gpu_memory_utilization, enforce_eager=params.enforce_eager,
                          tensor_parallel_size=params.tensor_parallel_size, attention_backend=params.attention_backend,
                          load_format=params.load_format, max_num_seqs=params.max_num_seqs,
                          max_num_batched_tokens=params.max_num_batched_tokens,
                          extra={"enable_prefix_caching": params.enable_prefix_caching,
                                 **{k: getattr(params, k) for k in VLLM_OWN_DEFAULT if getattr(params, k) is not None},
                                 **({"pipeline_parallel_size": params.pipeline_parallel_size} if params.pipeline_parallel_size > 1 else {}),
                                 **({"distributed_executor_backend": params.distributed_executor_backend}
                                    if params.distributed_executor_backend else {})})


DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}


def weights_estimate(model: Any, cfg: EngineConfig) -> tuple[int | None, str]:
    """The weights' size where vLLM does not log it: a quantized checkpoint's files as stored,
    else parameters x the engine dtype's bytes."""
    import json
    from pathlib import Path

    path = Path(model.path)
    quantized = cfg.quantization or (json.loads((path / "config.json").read_text()).get("quantization_config") or {}).get("quant_method")
    if quantized:
        size = sum(f.stat().st_size for f in path.glob("*.safetensors")) or None
        return size, "quantized checkpoint files on disk (vLLM logged no model memory)"
    if model.num_params:
        return model.num_params * DTYPE_BYTES.get(cfg.dtype, 2), f"parameters x {cfg.dtype} bytes (vLLM logged no model memory)"
    return None, "unknown: vLLM logged no model memory"


def cpu_bind(ranks: int, cpus: list[int]) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for `ranks` CPU workers: the allowed cores split into that many
    contiguous groups, "0,1|2,3". vLLM's own "auto" wants a NUMA node per worker, which a small
    host does not have."""
    cpus = sorted(cpus)
    if len(cpus) < ranks:
        raise StageSkipped(f"{ranks} vLLM CPU workers (tensor x pipeline parallel) need {ranks} cores; {len(cpus)} allowed here",
                           "lower tensor_parallel_size, or set VLLM_CPU_OMP_THREADS_BIND yourself")
    size, extra = divmod(len(cpus), ranks)
    groups, start = [], 0
    for r in range(ranks):
        end = start + size + (r < extra)
        groups.append(",".join(map(str, cpus[start:end])))
        start = end
    return "|".join(groups)


def worker_ranks(params: VLLMEngineParams) -> int:
    """vLLM workers a stage starts: tensor x pipeline parallel."""
    return params.tensor_parallel_size * params.pipeline_parallel_size


def check_parallel(params: VLLMEngineParams, device: str, visible_gpus: int | None = None) -> None:
    """A stage asking for more GPUs than this host shows is skipped with the count (Ray spreads
    over hosts: its own check). NVML counts, so no CUDA context exists before vLLM starts."""
    ranks = worker_ranks(params)
    if ranks < 2 or device != "cuda" or params.distributed_executor_backend == "ray":
        return
    if visible_gpus is None:
        from llmopt_bench.measure import nvml

        visible_gpus = len(nvml.device_indices())
    if visible_gpus < ranks:
        raise StageSkipped(f"tensor_parallel_size={params.tensor_parallel_size} x pipeline_parallel_size="
                           f"{params.pipeline_parallel_size} needs {ranks} GPUs on this host ({visible_gpus} visible)",
                           "run on a machine with more GPUs, or across hosts with distributed_executor_backend = \"ray\" (docs/multi-gpu.md)")


def prepare_engine_env(params: VLLMEngineParams, device: str) -> None:
    """Engine environment before vLLM starts: the GPU count a parallel stage needs, and on CPU
    the KV cache size and the workers' cores."""
    import os

    check_parallel(params, device)
    if device == "cpu":
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(params.cpu_kvcache_space_gib))
        ranks = worker_ranks(params)
        if ranks > 1 and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = cpu_bind(ranks, list(os.sched_getaffinity(0)))
