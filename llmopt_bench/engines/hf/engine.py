"""transformers as an engine: one params model for every transformers stage, load (with an
optional quantization config: bitsandbytes), generate() batch by batch with the per-token
clock, quality against the run's reference, and unload. engines/hf/generate.py holds the functions."""

from __future__ import annotations

from typing import Any, Callable, Literal, Sequence

from llmopt_bench.core.contract import StageContext
from llmopt_bench.core.records import LoadInfo, QualityRecord, RequestSample, StrictModel
from llmopt_bench.core.workload import Request, WorkloadConfig, build_requests
from llmopt_bench.engines.hf import generate as hf
from llmopt_bench.engines.lifecycle import release_cached_memory
from llmopt_bench.workloads.plan import TokenSpace

# what a transformers stage's worker imports ahead of its turn (Stage.prefetch, run/prefetch.py)
PREFETCH = ("torch", "transformers:AutoModelForCausalLM", "transformers:AutoTokenizer")


class HFEngineParams(StrictModel):
    dtype: Literal["auto", "float16", "bfloat16", "float32"] = "auto"
    attn_implementation: Literal["eager", "sdpa", "flash_attention_2"] = "eager"
    measure_overhead: bool = True  # the per-token clock's own cost, measured after the timed run


class TransformersEngine:
    # the warm-up: one generation this long (scenarios/fixed.warmup_plan). Eager transformers needs
    # one pass to load its kernels and size its allocator; two full requests cost ~20 s at INT8
    WARMUP_TOKENS = 16

    def __init__(self, model: Any, tok: Any, device: str, model_info: Any, params: HFEngineParams):
        self.model, self.tok, self.device, self.model_info, self.params = model, tok, device, model_info, params
        self.pad_id = tok.pad_token_id

    @classmethod
    def start(cls, model_info: Any, params: HFEngineParams, ctx: StageContext,
              quantization_config: Any = None) -> tuple["TransformersEngine", LoadInfo]:
        dtype = hf.resolve_dtype(params.dtype, ctx.device)
        ctx.progress(f"loading {model_info.source} ({dtype}, {params.attn_implementation})", None, None)
        model, tok, info = hf.load_model(model_info.path, ctx.device, dtype, params.attn_implementation, quantization_config)
        return cls(model, tok, ctx.device, model_info, params), info

    def encode(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def token_space(self) -> TokenSpace:
        """The ids a generated workload draws from (workloads/plan.py): the vocabulary without special tokens."""
        return TokenSpace.of(self.tok, self.model_info.vocab_size)

    @property
    def max_model_len(self) -> int | None:
        return self.model_info.max_position_embeddings

    def serve(self, requests: Sequence[Request], max_new_tokens: int, *, batch_size: int, repeat: int,
              tokens_out: dict[str, list[int]] | None, progress: Callable[[int], None]) -> list[RequestSample]:
        """The requests in batches of batch_size, one generate() each; each request's output
        length is its own (Request.output_len) or max_new_tokens."""
        samples: list[RequestSample] = []
        for b, start in enumerate(range(0, len(requests), batch_size)):
            chunk = requests[start:start + batch_size]
            samples += hf.generate_batch(self.model, self.pad_id, chunk, max_new_tokens, self.device, repeat=repeat,
                                         batch=b, tokens_out=tokens_out)
            progress(len(samples))
        return samples

    def gpu_busy_generate(self, chunk: Sequence[Request]) -> Callable[[int], None]:
        """n -> generate n new tokens for `chunk` as the timed repeats do (measure/gpu_busy.py profiles it)."""
        def generate(n: int) -> None:
            hf.generate_batch(self.model, self.pad_id, chunk, n, self.device)

        return generate

    def greedy(self, prompt: list[int], n: int) -> list[int]:
        tokens: dict[str, list[int]] = {}
        hf.generate_batch(self.model, self.pad_id, [Request("q", "q", tuple(prompt))], n, self.device,
                          streamer=False, tokens_out=tokens)
        return tokens["q"]

    def quality(self, workload: WorkloadConfig, ctx: StageContext) -> QualityRecord:
        from llmopt_bench.analysis import quality

        reqs = build_requests(workload.model_copy(update={"input_len": None}), self.encode,
                              count=quality.QUALITY_PROMPTS, tag="q")
        record = quality.evaluate(self.model, self.encode, reqs, ctx.reference_file, ctx.reference_name,
                                  self.model_info.real_weights, ctx.provides_reference,
                                  self.greedy, ctx.progress)
        return QualityRecord(**record)

    def records(self, requests: Sequence[Request], workload: WorkloadConfig, ctx: StageContext) -> hf.EngineRecords:
        """The clock's own cost, when asked for (untimed: after the repeats)."""
        if not self.params.measure_overhead:
            return {}
        ctx.progress("measuring the per-token clock's own cost", None, None)
        first = requests[0]
        return {"instrumentation": hf.instrumentation_overhead(self.model, self.pad_id, first,
                                                               min(first.output_len or workload.max_new_tokens, hf.OVERHEAD_TOKENS),
                                                               self.device)}

    def close(self) -> None:
        if self.model is not None:
            self.model = None  # the last reference: the weights go now, then the allocator's cache
            release_cached_memory()
