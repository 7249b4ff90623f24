"""vLLM's offline engine as an engine of llmopt: start it from VLLMEngineParams, encode, serve
requests with a timestamp per token (engines/vllm/offline.serve), quality through prompt log-probs,
its KV cache as a record, and shut it down with its processes."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Callable, Sequence

from llmopt_bench.core.contract import StageContext
from llmopt_bench.core.dispatch import Dispatcher
from llmopt_bench.core.records import CacheRecord, LoadInfo, QualityRecord, RequestSample
from llmopt_bench.core.workload import Request, WorkloadConfig
from llmopt_bench.engines.engine_pool import EngineBaseline, EnginePool, Pooled, pool_for, shared_info
from llmopt_bench.engines.hf.generate import EngineRecords
from llmopt_bench.engines.vllm import offline as V
from llmopt_bench.engines.vllm.kv import KVCacheRecord, kv_cache_record
from llmopt_bench.engines.vllm.params import VLLMEngineParams, engine_config, prepare_engine_env, share_key, weights_estimate
from llmopt_bench.workloads.plan import TokenSpace

# what a vLLM stage's worker imports ahead of its turn (Stage.prefetch, run/prefetch.py): the
# offline engine's class, the bulk of build_engine's import_s; no engine, no CUDA
PREFETCH = ("torch", "vllm:LLM")

DUMMY_NOTE = "load_format=dummy: random weights generated in place; speed only, no quality"


class VLLMEngine:
    def __init__(self, llm: Any, cfg: V.EngineConfig, model_info: Any, params: VLLMEngineParams,
                 log_path: Path | None = None):
        self.llm, self.cfg, self.model_info, self.params = llm, cfg, model_info, params
        self.tok = llm.get_tokenizer()
        self.log_path = log_path  # the log its processes write to: the starting stage's
        self.key = share_key(params)
        self.pool: EnginePool | None = None  # set when a stage group shares this engine
        self.baseline: EngineBaseline = {}  # device memory and processes before it started (pooled engines)
        # the prefix cache across load points (client/prefix_cache.py): emptied before each, its
        # counters and the KV gauge read around and during each (needs the engine's log stats)
        self.reset_cache_each_point = False
        self.watch_cache = False
        self.last_cache: CacheRecord | None = None

    @classmethod
    def launch(cls, model_info: Any, params: VLLMEngineParams, ctx: StageContext,
               max_len_cap: int | None = None, log_stats: bool = False) -> tuple["VLLMEngine", LoadInfo]:
        """The engine started, and what vLLM itself said of its start (start() adds llmopt's
        records); in a stage group, the engine an earlier stage of this process started."""
        key = share_key(params)
        pool = pool_for(ctx, key)
        pooled = pool.take(key) if pool else None
        if pool and pooled:
            ctx.progress(f"vLLM engine shared with {pooled.owner}: not started again", None, None)
            return pooled.engine, shared_info(pooled, pool.current or "this stage")
        baseline = _baseline() if pool else EngineBaseline()
        engine, info = cls._build(model_info, params, ctx, max_len_cap, log_stats)
        if pool:
            engine.pool, engine.baseline = pool, baseline
            pool.put(engine.key, Pooled(engine, copy.deepcopy(info), pool.current or "?", baseline))
        return engine, info

    @classmethod
    def _build(cls, model_info: Any, params: VLLMEngineParams, ctx: StageContext,
               max_len_cap: int | None, log_stats: bool = False) -> tuple["VLLMEngine", LoadInfo]:
        prepare_engine_env(params, ctx.device)
        cfg = engine_config(params, ctx.device, max_len_cap or model_info.max_position_embeddings)
        if log_stats:  # the counters llm.get_metrics() reads (vLLM's default offline: off)
            cfg.extra["disable_log_stats"] = False
        limits = "".join(f", {k}={getattr(params, k)}" for k in ("max_num_seqs", "max_num_batched_tokens")
                         if getattr(params, k) is not None)
        ctx.progress(f"starting vLLM ({cfg.dtype}{', ' + cfg.quantization if cfg.quantization else ''}{limits}): "
                     "compile and graph capture take a while", None, None)
        llm, info = V.build_engine(model_info.path, cfg, ctx.log_path)
        return cls(llm, cfg, model_info, params, ctx.log_path), info

    @classmethod
    def start(cls, model_info: Any, params: VLLMEngineParams, ctx: StageContext,
              max_len_cap: int | None = None, log_stats: bool = False) -> tuple["VLLMEngine", LoadInfo]:
        engine, info = cls.launch(model_info, params, ctx, max_len_cap, log_stats)
        if params.load_format == "dummy":
            info.notes.append(DUMMY_NOTE)
        elif info.weights_bytes is None:  # vLLM-CPU does not log the model's memory
            info.weights_bytes, info.implementation["weights_bytes_source"] = weights_estimate(model_info, engine.cfg)
        kv = engine.kv_cache()
        if kv:
            info.kv_cache_bytes, info.kv_cache_dtype = kv.bytes, kv.kv_dtype
        return engine, info

    def encode(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def token_space(self) -> TokenSpace:
        """The ids a generated workload draws from: the same as transformers' on this checkpoint
        (its tokenizer, the model's vocab_size), so both engines get the same requests."""
        return TokenSpace.of(self.tok, self.model_info.vocab_size)

    def serve(self, requests: Sequence[Request], max_new_tokens: int, *, batch_size: int, repeat: int,
              tokens_out: dict[str, list[int]] | None, progress: Callable[[int], None]) -> list[RequestSample]:
        """At most batch_size requests in flight (1: one request at a time), each forced to its own
        output length (Request.output_len) or max_new_tokens."""
        return V.serve(self.llm, requests, max_new_tokens, concurrency=batch_size, repeat=repeat, tokens_out=tokens_out,
                       on_done=progress)

    @property
    def max_model_len(self) -> int:
        return self.llm.llm_engine.vllm_config.model_config.max_model_len

    def drive(self, dispatcher: Dispatcher) -> None:
        """The load machine's engine (load/engine.LoadEngine): requests join the running batch
        as the dispatcher releases them; with watch_cache, the point's cache figures in last_cache."""
        from llmopt_bench.client.prefix_cache import CacheWatch, Watched, offline_reader

        if self.reset_cache_each_point and not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM refused to reset its prefix cache: requests still running")
        if not self.watch_cache:
            V.drive(self.llm, dispatcher)
            return
        watch = CacheWatch(offline_reader(self.llm), "llm.get_metrics()", reset=self.reset_cache_each_point)
        V.drive(self.llm, Watched(dispatcher, watch))
        self.last_cache = watch.stop()

    def kv_cache(self, max_num_seqs: int | None = None, log_path: Path | None = None) -> KVCacheRecord | None:
        """The KV cache; with the engine's log, also the concurrency vLLM said it holds (the log of
        the stage that started it: in a stage group, not the asking stage's)."""
        return kv_cache_record(self.llm, self.model_info, self.cfg.dtype, self.log_path or log_path, max_num_seqs)

    def quality(self, workload: WorkloadConfig, ctx: StageContext) -> QualityRecord:
        from llmopt_bench.engines.vllm import quality as vllm_quality

        dummy = self.params.load_format == "dummy"
        real = self.model_info.real_weights and not dummy
        return QualityRecord(**vllm_quality.evaluate(self.llm, self.encode, ctx.reference_file, ctx.reference_name,
                                                     real, ctx.progress, dummy=dummy))

    def records(self, requests: Sequence[Request], workload: WorkloadConfig, ctx: StageContext) -> EngineRecords:
        kv = kv_cache_record(self.llm, self.model_info, self.cfg.dtype, self.log_path or ctx.log_path)
        return {"kv_cache": kv} if kv else {}

    def close(self) -> None:
        """Shut down, unless a later stage of this process takes the engine (a stage group)."""
        if self.pool is not None and self.pool.keep(self.key):
            return
        self.close_now()

    def close_now(self) -> None:
        if self.pool is not None:
            self.pool.drop(self.key)
        llm, self.llm = self.llm, None
        V.shutdown(llm)


def _baseline() -> EngineBaseline:
    """Before a pooled engine starts: the device memory and processes a later stage of the group
    measures its shutdown against (continuous batching waits for the memory to come back)."""
    from llmopt_bench.engines.lifecycle import device_memory
    from llmopt_bench.procs.tree import descendants

    return {"before_engine": device_memory(use_torch=False), "processes_before_engine": len(descendants())}
