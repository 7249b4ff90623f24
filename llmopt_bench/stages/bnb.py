"""bitsandbytes quantization inside transformers: LLM.int8 (the story's first lever) and
4-bit NF4 (the story's "global INT4", which costs quality)."""

from __future__ import annotations

import logging
from typing import Any

from llmopt_bench.analysis.narrative.claims import claim_verdict
from llmopt_bench.analysis.selectors import GB, reference
from llmopt_bench.core.contract import Requirements, StageContext
from llmopt_bench.core.fmt import num
from llmopt_bench.core.records import Claim
from llmopt_bench.engines.hf.engine import PREFETCH, HFEngineParams, TransformersEngine
from llmopt_bench.engines.hf.generate import resolve_dtype
from llmopt_bench.scenarios.fixed.run import FixedParams, FixedWorkloadStage

BNB = Requirements(imports={"transformers": "test", "torch": "test", "bitsandbytes": "bnb"})
INT8_HALVES_AT = 0.55  # INT8 weights / FP16 weights at most this


def layer_types(model: Any) -> dict[str, int]:
    """How many Linear layers of each class the model holds: proof the quantized ones are in."""
    counts: dict[str, int] = {}
    for module in model.modules():
        name = type(module).__name__
        if "Linear" in name:
            key = f"{type(module).__module__}.{name}"
            counts[key] = counts.get(key, 0) + 1
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


class BnbParams(HFEngineParams, FixedParams):
    pass


class NF4Params(BnbParams):
    double_quant: bool = True


class _BnbStage(FixedWorkloadStage):
    requires = BNB
    prefetch = PREFETCH  # not bitsandbytes: its import asks every GPU's capability, which initializes CUDA
    Params = BnbParams

    def quantization_config(self, params: Any, dtype: str) -> Any:
        raise NotImplementedError

    def start_engine(self, model, params, ctx: StageContext):
        logging.getLogger("bitsandbytes.autograd._functions").addFilter(_Once())
        engine, info = TransformersEngine.start(model, params, ctx, self.quantization_config(params, resolve_dtype(params.dtype, ctx.device)))
        import bitsandbytes

        info.versions["bitsandbytes"] = bitsandbytes.__version__
        info.implementation["linear_layers"] = layer_types(engine.model)
        return engine, info


class BnbInt8Stage(_BnbStage):
    name = "bnb-int8"
    description = "transformers + bitsandbytes LLM.int8 weights"
    changes = "weights in INT8 (LLM.int8, outliers kept in FP16)"

    def quantization_config(self, params: BnbParams, dtype: str) -> Any:
        from transformers import BitsAndBytesConfig

        return BitsAndBytesConfig(load_in_8bit=True)

    @classmethod
    def claims(cls, result, run) -> list[Claim]:
        """The story's "INT8 halves the memory": this stage's weights against the reference's."""
        ref = reference(run)
        ref_bytes = ref.load.weights_bytes if ref and ref.load else None
        own_bytes = result.load.weights_bytes if result and result.load else None
        value: float | None = None
        if ref is None or not (ref_bytes and own_bytes):
            detail = "needs the quality reference (FP16) and this stage, ok, with their weights' size"
        else:
            value = own_bytes / ref_bytes
            dtype = (ref.load.implementation or {}).get("dtype") if ref.load else None
            detail = f"weights {num(own_bytes / GB)} GB vs {num(ref_bytes / GB)} GB ({ref.name}, {dtype or '?'})"
            if dtype == "float32":
                detail += "; the reference holds FP32 here, so INT8 is compared with FP32"
        return [Claim(key="int8-memory", claim="INT8 halves the memory", target=f"INT8 / FP16 weights <= {INT8_HALVES_AT}",
                      measured=f"{value:.2f}" if value else "-", value=value,
                      verdict=claim_verdict(None if value is None else value <= INT8_HALVES_AT), detail=detail)]


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
