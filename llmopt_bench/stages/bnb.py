"""bitsandbytes quantization inside transformers: LLM.int8 (the story's first lever) and
4-bit NF4 (the story's "global INT4", which costs quality)."""

from __future__ import annotations

import logging
from typing import Any

from llmopt_bench.stage import LoadInfo, Requirements, StageContext
from llmopt_bench.stages.hf_base import HFParams, HFStage

BNB = Requirements(imports={"transformers": "test", "torch": "test", "bitsandbytes": "bnb"})


def _layer_types(model: Any) -> dict[str, int]:
    """How many Linear layers of each class the model holds: proof the quantized ones are in."""
    counts: dict[str, int] = {}
    for module in model.modules():
        name = type(module).__name__
        if "Linear" in name:
            counts[f"{type(module).__module__}.{name}"] = counts.get(f"{type(module).__module__}.{name}", 0) + 1
    return counts


class _Once(logging.Filter):
    """Lets each distinct message through once: bitsandbytes logs its input cast on every matmul
    (a 9 MB stage log for one CPU run)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        first = msg not in self.seen
        self.seen.add(msg)
        return first


class _BnbStage(HFStage):
    requires = BNB

    def load(self, model, params, ctx: StageContext) -> LoadInfo:
        logging.getLogger("bitsandbytes.autograd._functions").addFilter(_Once())
        info = super().load(model, params, ctx)
        import bitsandbytes

        info.versions["bitsandbytes"] = bitsandbytes.__version__
        info.implementation["linear_layers"] = _layer_types(self.model)
        return info


class BnbInt8Stage(_BnbStage):
    name = "bnb-int8"
    description = "transformers + bitsandbytes LLM.int8 weights"
    changes = "weights in INT8 (LLM.int8, outliers kept in FP16)"

    def quantization_config(self, params: HFParams, dtype: str) -> Any:
        from transformers import BitsAndBytesConfig

        return BitsAndBytesConfig(load_in_8bit=True)


class NF4Params(HFParams):
    double_quant: bool = True


class BnbNF4Stage(_BnbStage):
    name = "bnb-nf4"
    description = "transformers + bitsandbytes 4-bit NF4 weights, FP16 compute"
    changes = "weights in 4-bit NF4 everywhere (global INT4)"
    Params = NF4Params

    def quantization_config(self, params: NF4Params, dtype: str) -> Any:
        import torch
        from transformers import BitsAndBytesConfig

        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=getattr(torch, dtype),
                                  bnb_4bit_use_double_quant=params.double_quant)
