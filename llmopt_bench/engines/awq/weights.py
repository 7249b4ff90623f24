"""Where a vLLM stage's AWQ weights come from, for every stage that runs AWQ (awq-int4 offline,
vllm-serve with `awq = {}`): the model itself when it is pre-quantized, the user's checkpoint,
an AWQ-shaped checkpoint of random weights (synthetic models on CUDA), or a calibration made
once and cached (engines/awq/checkpoint.py); and the engine params AWQ needs (docs/awq.md)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from llmopt_bench.core.contract import StageContext, StageSkipped
from llmopt_bench.core.records import StrictModel
from llmopt_bench.engines.awq import checkpoint as awq

PREQUANTIZED = ("awq", "compressed-tensors")


class AWQCheckpointParams(StrictModel):
    checkpoint: str | None = Field(None, description="a pre-quantized AWQ checkpoint of the model (quant_method awq "
                                                     "or compressed-tensors W4A16); default: calibrate one")
    group_size: int | None = Field(None, description="default: 128 where every layer's input size allows it, else 64, else 32")
    calibration_samples: int = Field(32, ge=1)
    calibration_seq_len: int = Field(256, ge=16)
    calibration_timeout_s: float = 3600.0
    dummy_weights: Literal["auto", "on", "off"] = "auto"  # auto: on for synthetic models on CUDA
    cpu_w4a16: bool = True  # vLLM-CPU on AMX otherwise quantizes activations to int8 too (W4A8)


def resolve_checkpoint(model: Any, params: AWQCheckpointParams, ctx: StageContext) -> tuple[Path, dict, str | None]:
    """(directory, what it is, a note) of the AWQ weights to run; StageSkipped when there are none."""
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


def awq_engine(model: Any, engine_params: Any, awq_params: AWQCheckpointParams, ctx: StageContext) -> tuple[Any, Any, dict, str | None]:
    """(model info pointing at the AWQ weights, engine params AWQ needs, what the weights are, a
    note). The INT4 kernels take fp16/bf16 activations only, never fp32; random-weight
    checkpoints load as vLLM's dummy weights."""
    path, meta, note = resolve_checkpoint(model, awq_params, ctx)
    if engine_params.dtype == "auto":
        engine_params = engine_params.model_copy(update={"dtype": "float16" if ctx.device == "cuda" else "bfloat16"})
    if ctx.device == "cpu" and awq_params.cpu_w4a16:
        os.environ["VLLM_CPU_INT4_W4A8"] = "0"
    if meta.get("source") == "dummy":
        engine_params = engine_params.model_copy(update={"load_format": "dummy"})
    real = model.real_weights and meta.get("source") != "dummy"
    return model.model_copy(update={"path": str(path), "real_weights": real}), engine_params, meta, note
