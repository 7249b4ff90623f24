"""vLLM's offline engine on the fixed workload, one request at a time, so that its latency
compares directly with hf-fp16 (PagedAttention, CUDA graphs, fused kernels). vllm-fp8 is the
same engine with dynamic FP8 weights (Hopper and Ada)."""

from __future__ import annotations

from typing import Any, Literal

from llmopt_bench.engines import vllm as V
from llmopt_bench.engines.hf import resolve_dtype
from llmopt_bench.stage import LoadInfo, Requirements, Stage, StageContext, StageRun, StageSkipped, StrictModel
from llmopt_bench.workload import WorkloadConfig, build_requests


class VLLMParams(StrictModel):
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
    quality: bool = True  # perplexity (real weights) and agreement with the FP16 reference, after the timed run
    # off: repeats and warm-up reuse the same prompts, and a cached prefix would turn TTFT into a
    # cache lookup that transformers never gets; on: measure what prefix caching buys
    enable_prefix_caching: bool = False


def engine_config(params: Any, device: str, max_len_cap: int | None) -> V.EngineConfig:
    dtype = resolve_dtype(params.dtype, device)
    max_len = params.max_model_len
    if max_len and max_len_cap:
        max_len = min(max_len, max_len_cap)
    return V.EngineConfig(dtype=dtype, quantization=params.quantization, max_model_len=max_len,
                          gpu_memory_utilization=params.gpu_memory_utilization, enforce_eager=params.enforce_eager,
                          tensor_parallel_size=params.tensor_parallel_size, attention_backend=params.attention_backend,
                          load_format=params.load_format, max_num_seqs=params.max_num_seqs,
                          max_num_batched_tokens=params.max_num_batched_tokens,
                          extra={"enable_prefix_caching": params.enable_prefix_caching,
                                 **({"pipeline_parallel_size": params.pipeline_parallel_size} if params.pipeline_parallel_size > 1 else {}),
                                 **({"distributed_executor_backend": params.distributed_executor_backend}
                                    if params.distributed_executor_backend else {})})


DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}


def weights_estimate(model: Any, cfg: V.EngineConfig) -> tuple[int | None, str]:
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


def worker_ranks(params: Any) -> int:
    """vLLM workers a stage starts: tensor x pipeline parallel (vllm-attn has no pipeline)."""
    return params.tensor_parallel_size * getattr(params, "pipeline_parallel_size", 1)


def check_parallel(params: Any, device: str, visible_gpus: int | None = None) -> None:
    """A stage asking for more GPUs than this host shows is skipped with the count (Ray spreads
    over hosts: its own check). NVML counts, so no CUDA context exists before vLLM starts."""
    ranks = worker_ranks(params)
    if ranks < 2 or device != "cuda" or getattr(params, "distributed_executor_backend", None) == "ray":
        return
    if visible_gpus is None:
        from llmopt_bench.measure import nvml

        visible_gpus = len(nvml.device_indices())
    if visible_gpus < ranks:
        raise StageSkipped(f"tensor_parallel_size={params.tensor_parallel_size} x pipeline_parallel_size="
                           f"{getattr(params, 'pipeline_parallel_size', 1)} needs {ranks} GPUs on this host ({visible_gpus} visible)",
                           "run on a machine with more GPUs, or across hosts with distributed_executor_backend = \"ray\" (docs/multi-gpu.md)")


def prepare_engine_env(params: Any, device: str) -> None:
    """Engine environment before vLLM starts: the GPU count a parallel stage needs, and on CPU
    the KV cache size and the workers' cores."""
    import os

    check_parallel(params, device)
    if device == "cpu":
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(params.cpu_kvcache_space_gib))
        ranks = worker_ranks(params)
        if ranks > 1 and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = cpu_bind(ranks, list(os.sched_getaffinity(0)))


class VLLMStage(Stage):
    name = "vllm"
    description = "vLLM offline engine (PagedAttention, CUDA graphs), one request at a time"
    changes = "the engine: vLLM instead of transformers generate"
    requires = Requirements(imports={"vllm": "vllm"}, engine="vllm")
    Params = VLLMParams

    def load(self, model, params, ctx: StageContext) -> LoadInfo:
        self.llm = None
        self.params, self.model_info = params, model
        prepare_engine_env(params, ctx.device)
        cfg = engine_config(params, ctx.device, model.max_position_embeddings)
        ctx.progress(f"starting vLLM ({cfg.dtype}{', ' + cfg.quantization if cfg.quantization else ''}): compile and graph capture take a while", None, None)
        self.llm, info = V.build_engine(model.path, cfg, ctx.log_path)
        self.cfg, self.load_kv = cfg, info.implementation.get("kv_cache") or {}
        if params.load_format == "dummy":
            info.notes.append("load_format=dummy: random weights generated in place; speed only, no quality")
        elif info.weights_bytes is None:  # vLLM-CPU does not log the model's memory
            info.weights_bytes, info.implementation["weights_bytes_source"] = weights_estimate(model, cfg)
        self.tok = self.llm.get_tokenizer()
        return info

    def _encode(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def warmup(self, workload: WorkloadConfig, ctx: StageContext) -> None:
        if workload.warmup:
            reqs = build_requests(workload, self._encode, count=workload.warmup, tag="w")
            V.serve(self.llm, reqs, workload.max_new_tokens, concurrency=workload.batch_size)

    def run(self, workload: WorkloadConfig, ctx: StageContext) -> StageRun:
        reqs = build_requests(workload, self._encode)
        samples, tokens = [], {}
        for rep in range(workload.repeats):
            samples += V.serve(self.llm, reqs, workload.max_new_tokens, concurrency=workload.batch_size, repeat=rep,
                               tokens_out=tokens if rep == 0 else None,
                               on_done=lambda n, rep=rep: ctx.progress(f"repeat {rep + 1}/{workload.repeats}", n, len(reqs)))
        extra: dict[str, Any] = {"kv_cache": self._kv_cache(), "greedy_tokens": {r.id: tokens.get(r.id, []) for r in reqs}}
        if self.params.quality:
            from llmopt_bench.analysis import quality_vllm

            dummy = self.params.load_format == "dummy"
            real = self.model_info.real_weights and not dummy
            extra["quality"] = quality_vllm.evaluate(self.llm, self._encode, ctx.run_dir, real, ctx.progress, dummy=dummy)
        return StageRun(samples=samples, extra=extra)

    def _kv_cache(self) -> dict[str, Any] | None:
        """The engine's KV cache: blocks, tokens, bytes (from the model's shape and the cache dtype)."""
        from llmopt_bench.stages.kv_capacity import kv_bytes_per_token

        cache = self.llm.llm_engine.vllm_config.cache_config
        if not cache.num_gpu_blocks:
            return None
        tokens = cache.num_gpu_blocks * cache.block_size
        dtype = cache.cache_dtype if getattr(cache, "cache_dtype", "auto") not in (None, "auto") else self.cfg.dtype
        per_token = kv_bytes_per_token(self.model_info, dtype)
        return {"num_blocks": cache.num_gpu_blocks, "block_size": cache.block_size, "tokens": tokens, "kv_dtype": dtype,
                "bytes_per_token": per_token, "bytes": tokens * per_token if per_token else None,
                "max_concurrency": self.load_kv.get("max_concurrency"),
                "max_concurrency_at_tokens": self.load_kv.get("max_concurrency_at_tokens")}

    def teardown(self) -> None:
        llm, self.llm = getattr(self, "llm", None), None
        V.shutdown(llm)


class VLLMFP8Stage(VLLMStage):
    name = "vllm-fp8"
    description = "vLLM with dynamic FP8 weights (W8A8 on Hopper/Ada), one request at a time"
    changes = "weights and matmuls in FP8 (beyond the story)"
    requires = Requirements(imports={"vllm": "vllm"}, engine="vllm", cuda=True, min_compute_capability=(8, 9))

    def load(self, model, params, ctx: StageContext) -> LoadInfo:
        params = params.model_copy(update={"quantization": params.quantization or "fp8"})
        return super().load(model, params, ctx)
