"""Continuous batching: requests arrive over time and join vLLM's running batch; the same
arrivals replayed against transformers with static batching show what it buys. The stage is
the load scenario (scenarios/batching/run.py: the sweep, the throughput point, the mixed-
length set, KV capacity, the static replay, the transformers probes) on the vLLM engine, its
load points run by the load machine (load/) as the serving stages' are.
docs/batching.md defines the figures and extra's keys."""

from __future__ import annotations

from llmopt_bench.core.contract import Requirements
from llmopt_bench.engines.hf import engine as T
from llmopt_bench.engines.vllm.engine import PREFETCH, VLLMEngine
from llmopt_bench.engines.vllm.params import VLLMEngineParams, share_key
from llmopt_bench.scenarios.batching.curve import CurveParams
from llmopt_bench.scenarios.batching.record import BatchingExtra
from llmopt_bench.scenarios.batching.run import BatchingStage


class BatchingParams(VLLMEngineParams, CurveParams):
    max_num_seqs: int | None = 256  # the engine's running-batch limit (the story used 32)
    max_num_batched_tokens: int | None = 4096  # tokens per engine step (prefill chunks + decodes)


class ContinuousBatchingStage(BatchingStage):
    name = "continuous-batching"
    description = "vLLM continuous batching under arrivals (closed loop or Poisson) vs the same arrivals statically batched in transformers"
    changes = "scheduling: requests join and leave the running batch every step instead of waiting for a static batch"
    requires = Requirements(imports={"vllm": "vllm", "transformers": "test", "torch": "test"}, engine="vllm")
    prefetch = (*PREFETCH, *T.PREFETCH[1:])  # the vLLM side, then the transformers replay
    Params = BatchingParams
    Extra = BatchingExtra

    def start_engine(self, model, params, ctx):
        engine, info = VLLMEngine.launch(model, params, ctx)
        info.implementation.update(max_num_seqs=params.max_num_seqs, max_num_batched_tokens=params.max_num_batched_tokens,
                                   static_attn_implementation=params.static_attn_implementation)
        return engine, info

    @classmethod
    def share_key(cls, params) -> str | None:
        return share_key(params)

    @classmethod
    def claims(cls, result, run):
        from llmopt_bench.scenarios.batching.report import batching_claim

        return [batching_claim(result.extra_as(BatchingExtra), run)]

    @classmethod
    def report_blocks(cls, result, run):
        from llmopt_bench.scenarios.batching.report import batching_blocks

        return batching_blocks(result.extra_as(BatchingExtra))

    @classmethod
    def charts(cls, result, run, out_dir):
        from llmopt_bench.scenarios.batching.report import curve_chart

        path = curve_chart(result.name, result.extra_as(BatchingExtra).curve, out_dir / f"{result.name}-curve.png")
        return [path] if path else []
