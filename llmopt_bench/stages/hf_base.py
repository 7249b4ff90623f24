"""What every transformers stage shares: load with an optional quantization config, warm up,
generate the fixed workload one batch at a time, and measure the clock's own cost."""

from __future__ import annotations

from typing import Any, Literal

from llmopt_bench.engines import hf
from llmopt_bench.stage import LoadInfo, Requirements, Stage, StageContext, StageRun, StrictModel
from llmopt_bench.workload import Request, WorkloadConfig, build_requests


class HFParams(StrictModel):
    dtype: Literal["auto", "float16", "bfloat16", "float32"] = "auto"
    attn_implementation: Literal["eager", "sdpa", "flash_attention_2"] = "eager"
    measure_overhead: bool = True
    quality: bool = True  # perplexity (real weights) and agreement with the FP16 reference


class HFStage(Stage):
    requires = Requirements(imports={"transformers": "test", "torch": "test"})
    Params = HFParams
    is_reference: bool = False  # the stage whose outputs the others are compared with

    def quantization_config(self, params: Any, dtype: str) -> Any:
        """Subclasses return a transformers quantization config (None: unquantized)."""
        return None

    def load(self, model, params, ctx: StageContext) -> LoadInfo:
        self.params, self.model_info, self.device = params, model, ctx.device
        dtype = hf.resolve_dtype(params.dtype, ctx.device)
        ctx.progress(f"loading {model.source} ({dtype}, {params.attn_implementation})")
        self.model, self.tok, info = hf.load_model(model.path, ctx.device, dtype, params.attn_implementation,
                                                   self.quantization_config(params, dtype))
        self.pad_id = self.tok.pad_token_id
        return info

    def _encode(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def _gen(self, workload: WorkloadConfig, tokens: dict | None = None):
        return lambda reqs, rep, b: hf.generate_batch(self.model, self.pad_id, reqs, workload.max_new_tokens,
                                                      self.device, repeat=rep, batch=b,
                                                      tokens_out=tokens if rep == 0 else None)

    def warmup(self, workload: WorkloadConfig, ctx: StageContext) -> None:
        if workload.warmup:
            ctx.progress(f"warm-up: {workload.warmup} requests", None, None)
            reqs = build_requests(workload, self._encode, count=workload.warmup, tag="w")
            hf.run_sequential(self._gen(workload), reqs, workload.batch_size, 1, lambda *a: None)

    def run(self, workload: WorkloadConfig, ctx: StageContext) -> StageRun:
        reqs = build_requests(workload, self._encode)
        tokens: dict[str, list[int]] = {}
        samples = hf.run_sequential(self._gen(workload, tokens), reqs, workload.batch_size, workload.repeats, ctx.progress)
        extra: dict[str, Any] = {"greedy_tokens": tokens}
        if self.params.measure_overhead:
            ctx.progress("measuring the per-token clock's own cost", None, None)
            extra["instrumentation"] = hf.instrumentation_overhead(self.model, self.pad_id, reqs[0],
                                                                   min(workload.max_new_tokens, 64), self.device)
        extra.update(self.after_run(workload, ctx))
        return StageRun(samples=samples, extra=extra)

    def _greedy(self, prompt: list[int], n: int) -> list[int]:
        tokens: dict[str, list[int]] = {}
        hf.generate_batch(self.model, self.pad_id, [Request("q", "q", tuple(prompt))], n, self.device,
                          streamer=False, tokens_out=tokens)
        return tokens["q"]

    def after_run(self, workload: WorkloadConfig, ctx: StageContext) -> dict[str, Any]:
        """Measurements after the timed workload: output quality, untimed."""
        if not self.params.quality:
            return {}
        from llmopt_bench.analysis import quality

        reqs = build_requests(workload.model_copy(update={"input_len": None}), self._encode,
                              count=quality.QUALITY_PROMPTS, tag="q")
        return {"quality": quality.evaluate(self.model, self._encode, reqs, ctx.run_dir, ctx.stage_dir,
                                            self.model_info.real_weights, self.is_reference, self._greedy, ctx.progress)}

    def teardown(self) -> None:
        model = getattr(self, "model", None)
        if model is not None:
            self.model = None
            hf.unload(model)
