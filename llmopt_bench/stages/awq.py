"""awq-int4: the careful INT4. AWQ 4-bit weights (activation-aware scales, group size 128 where
the layer shapes allow it, else 64 or 32) served by vLLM's INT4 kernels (Marlin / Machete on
GPU, CPUWNA16 on CPU), one request at a time like the vllm stage, with quality measured the
same way (llmopt_bench/awq.py makes the checkpoint; docs/awq.md)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Literal

from pydantic import Field

from llmopt_bench.analysis.claims import verdict
from llmopt_bench.analysis.selectors import of_stage, perplexity, reference
from llmopt_bench.engines import awq
from llmopt_bench.engines.vllm_engine import VLLMEngine
from llmopt_bench.engines.vllm_params import VLLMEngineParams
from llmopt_bench.scenarios.fixed import FixedParams, FixedWorkloadStage
from llmopt_bench.stage import Claim, Requirements, StageContext, StageSkipped

PREQUANTIZED = ("awq", "compressed-tensors")


NF4_STAGE = "bnb-nf4"  # the global INT4 this stage's quality is weighed against


class AWQParams(VLLMEngineParams, FixedParams):
    checkpoint: str | None = Field(None, description="a pre-quantized AWQ checkpoint of the model (quant_method awq "
                                                     "or compressed-tensors W4A16); default: calibrate one")
    group_size: int | None = Field(None, description="default: 128 where every layer's input size allows it, else 64, else 32")
    calibration_samples: int = Field(32, ge=1)
    calibration_seq_len: int = Field(256, ge=16)
    calibration_timeout_s: float = 3600.0
    dummy_weights: Literal["auto", "on", "off"] = "auto"  # auto: on for synthetic models on CUDA
    cpu_w4a16: bool = True  # vLLM-CPU on AMX otherwise quantizes activations to int8 too (W4A8)


class AWQStage(FixedWorkloadStage):
    name = "awq-int4"
    description = "AWQ 4-bit weights (activation-aware, group-wise) on vLLM's INT4 kernels, one request at a time"
    changes = "weights in 4-bit AWQ (the careful INT4) on vLLM"
    requires = Requirements(imports={"vllm": "vllm"}, engine="vllm")
    Params = AWQParams

    def start_engine(self, model, params: AWQParams, ctx: StageContext):
        path, meta, note = self._checkpoint(model, params, ctx)
        if params.dtype == "auto":  # the INT4 kernels take fp16/bf16 activations only, never fp32
            params = params.model_copy(update={"dtype": "float16" if ctx.device == "cuda" else "bfloat16"})
        if ctx.device == "cpu" and params.cpu_w4a16:
            os.environ["VLLM_CPU_INT4_W4A8"] = "0"
        if meta.get("source") == "dummy":
            params = params.model_copy(update={"load_format": "dummy"})
        real = model.real_weights and meta.get("source") != "dummy"
        engine, info = VLLMEngine.start(model.model_copy(update={"path": str(path), "real_weights": real}), params, ctx,
                                        max_len_cap=model.max_position_embeddings)
        info.implementation["awq"] = meta
        info.implementation["w4a16"] = ctx.device == "cuda" or params.cpu_w4a16
        if meta.get("calibrate_s") and not meta.get("cached"):
            info.phases_s["awq_calibrate_s"] = meta["calibrate_s"]
        if note:
            info.notes.append(note)
        return engine, info

    def _checkpoint(self, model, params: AWQParams, ctx: StageContext) -> tuple[Path, dict, str | None]:
        """Where the AWQ weights come from: the model itself, the user's checkpoint, a dummy
        (synthetic on CUDA), or a calibration made once and cached."""
        src = Path(model.path)
        if awq.quant_method(src) in PREQUANTIZED:
            return src, {"source": "model", "quant_method": awq.quant_method(src)}, None
        if params.checkpoint:
            given = Path(params.checkpoint).expanduser()
            if not (given / "config.json").is_file() or awq.quant_method(given) not in PREQUANTIZED:
                raise StageSkipped(f"checkpoint {given} is not an AWQ checkpoint (config.json with quant_method awq "
                                   "or compressed-tensors)", "pass a directory written by an AWQ quantizer, or drop the param")
            return given, {"source": "user", "quant_method": awq.quant_method(given)}, None
        config = json.loads((src / "config.json").read_text())
        problem = awq.shape_problem(config)
        if problem:
            raise StageSkipped(f"vLLM's INT4 kernels cannot take this model: {problem}", "use a model whose layer sizes are multiples of 32")
        group = params.group_size or awq.pick_group_size(config)
        if group is None or any(s % group for s in awq.input_sizes(config)):
            raise StageSkipped(f"no AWQ group size of 128, 64 or 32 divides every layer's input size {sorted(awq.input_sizes(config))}",
                               "pass a group_size that does, or use another model")
        dummy = params.dummy_weights == "on" or (params.dummy_weights == "auto" and not model.real_weights and ctx.device == "cuda")
        if dummy:
            return (awq.write_dummy(src, group), {"source": "dummy", "quant_method": "awq", "group_size": group},
                    "AWQ-shaped checkpoint of random weights (vLLM load_format=dummy): speed and memory only, no quality")
        ctx.progress(f"AWQ calibration (group size {group}, {params.calibration_samples} x {params.calibration_seq_len} "
                     "tokens); cached after the first run", None, None)
        try:
            path, meta = awq.ensure_calibrated(src, group, params.calibration_samples, params.calibration_seq_len,
                                               params.calibration_timeout_s, ctx.stage_dir / "calibration.log")
        except awq.AWQUnavailable as e:
            raise StageSkipped(e.reason, e.fix) from None
        return path, {**meta, "source": "calibrated", "quant_method": "awq", "checkpoint": str(path)}, None

    @classmethod
    def claims(cls, result, run) -> list[Claim]:
        """The story's INT4 lesson: 4 bits everywhere (NF4) costs quality that AWQ keeps."""
        fp16, nf4, awq_ppl = perplexity(reference(run)), perplexity(of_stage(run, NF4_STAGE)), perplexity(result)
        claim, target = "INT4 ruins quality unless done carefully (AWQ)", "AWQ's perplexity rise below NF4's"
        if not (fp16 and nf4 and awq_ppl):
            return [Claim(key="awq-quality", claim=claim, target=target, measured="-", verdict="not measured",
                          detail=f"needs the quality reference, {NF4_STAGE} and {result.name} ok, with perplexity (real weights)")]
        rise_nf4, rise_awq = nf4 / fp16 - 1, awq_ppl / fp16 - 1
        return [Claim(key="awq-quality", claim=claim, target=target,
                      measured=f"AWQ {rise_awq * 100:+.1f}%, NF4 {rise_nf4 * 100:+.1f}%",
                      value=rise_awq / rise_nf4 if rise_nf4 else None, verdict=verdict(rise_awq < rise_nf4),
                      detail=f"perplexity {fp16:.4g} (reference), {nf4:.4g} ({NF4_STAGE}), {awq_ppl:.4g} ({result.name})")]
