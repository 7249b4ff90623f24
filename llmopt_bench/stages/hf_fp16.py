"""The journey's starting point: transformers from_pretrained in FP16, eager attention,
generate() one request at a time. Its outputs are the run's quality reference."""

from __future__ import annotations

from llmopt_bench.core.contract import Requirements
from llmopt_bench.engines.hf.engine import PREFETCH, HFEngineParams, TransformersEngine
from llmopt_bench.scenarios.fixed.run import FixedParams, FixedWorkloadStage

TRANSFORMERS = Requirements(imports={"transformers": "test", "torch": "test"})


class HFParams(HFEngineParams, FixedParams):
    pass


class HFFP16Stage(FixedWorkloadStage):
    name = "hf-fp16"
    description = "transformers FP16, eager attention, model.generate one request at a time"
    changes = "the baseline: plain transformers generate"
    quality_reference = True
    requires = TRANSFORMERS
    prefetch = PREFETCH
    Params = HFParams

    def start_engine(self, model, params, ctx):
        return TransformersEngine.start(model, params, ctx)
