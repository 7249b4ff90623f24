"""vLLM's offline engine on the fixed workload, one request at a time, so that its latency
compares directly with the transformers baseline (PagedAttention, CUDA graphs, fused kernels).
vllm-fp8 is the same engine with dynamic FP8 weights (Hopper and Ada)."""

from __future__ import annotations

from llmopt_bench.analysis.narrative.claims import claim_verdict, with_interval
from llmopt_bench.analysis.selectors import p50_of, ratio, reference
from llmopt_bench.core.contract import Requirements
from llmopt_bench.core.fmt import num, times
from llmopt_bench.core.records import Claim
from llmopt_bench.engines.vllm.engine import PREFETCH, VLLMEngine
from llmopt_bench.engines.vllm.params import VLLMEngineParams, share_key
from llmopt_bench.scenarios.fixed.run import FixedParams, FixedWorkloadStage

VLLM = Requirements(imports={"vllm": "vllm"}, engine="vllm")
VLLM_AT_LEAST = 2.0  # vLLM TPOT at least this many times lower than transformers FP16


class VLLMParams(VLLMEngineParams, FixedParams):
    pass


class VLLMStage(FixedWorkloadStage):
    name = "vllm"
    description = "vLLM offline engine (PagedAttention, CUDA graphs), one request at a time"
    changes = "the engine: vLLM instead of transformers generate"
    requires = VLLM
    prefetch = PREFETCH
    Params = VLLMParams

    def start_engine(self, model, params, ctx):
        return VLLMEngine.start(model, self.engine_params(params), ctx)

    @classmethod
    def engine_params(cls, params: VLLMParams) -> VLLMParams:
        return params

    @classmethod
    def share_key(cls, params) -> str | None:
        return share_key(cls.engine_params(params))

    @classmethod
    def claims(cls, result, run) -> list[Claim]:
        """The story's engine change: vLLM's TPOT against the transformers reference's."""
        ref = reference(run)
        hf, vl = p50_of(ref, "tpot_s"), p50_of(result, "tpot_s")
        value = ratio(hf, vl)
        detail = (f"TPOT p50 {num(hf * 1e3)} ms ({ref.name}) vs {num(vl * 1e3)} ms ({result.name})"
                  if value and hf and vl and ref else "needs the quality reference (transformers FP16) and vllm, ok")
        interval, note = with_interval(run, result, ref, "tpot", VLLM_AT_LEAST, held_fraction=1.0) if value else ("", "")
        return [Claim(key="vllm-latency", claim="vLLM cuts per-token latency",
                      target=f">= {VLLM_AT_LEAST:.0f}x lower TPOT p50 than transformers (H200 reference: 4.63 ms vs ~31 ms)",
                      measured=times(value) + interval, value=value,
                      verdict=claim_verdict(None if value is None else value >= VLLM_AT_LEAST), detail=detail + (f"; {note}" if note else ""))]


class VLLMFP8Stage(VLLMStage):
    name = "vllm-fp8"
    description = "vLLM with dynamic FP8 weights (W8A8 on Hopper/Ada), one request at a time"
    changes = "weights and matmuls in FP8 (beyond the story)"
    requires = Requirements(imports={"vllm": "vllm"}, engine="vllm", cuda=True, min_compute_capability=(8, 9))

    @classmethod
    def engine_params(cls, params: VLLMParams) -> VLLMParams:
        return params.model_copy(update={"quantization": params.quantization or "fp8"})

    @classmethod
    def claims(cls, result, run) -> list[Claim]:
        return []  # the story's vLLM claim is the FP16 engine's
