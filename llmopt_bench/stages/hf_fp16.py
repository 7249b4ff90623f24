"""The journey's starting point: transformers from_pretrained in FP16, eager attention,
generate() one request at a time."""

from __future__ import annotations

from llmopt_bench.stages.hf_base import HFStage


class HFFP16Stage(HFStage):
    name = "hf-fp16"
    description = "transformers FP16, eager attention, model.generate one request at a time"
    changes = "the baseline: plain transformers generate"
    is_reference = True
