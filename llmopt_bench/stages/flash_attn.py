"""flash-attn: attention implementations compared by context length, prefill and decode apart,
with the kernel that really ran checked by the profiler.

The story claims FlashAttention gave 2x at 2K context and 4x at 8K. This stage is the context
sweep (scenarios/context_sweep/run.py) on transformers' attention implementations
(engines/hf/attention.py: eager, SDPA with one backend forced, flash_attention_2), each loaded
once and verified by the profiler; every (context, batch) cell is a prompt of exactly `context`
tokens plus `decode_tokens`, `repeats` times after `warmup` untimed generations.

extra (ContextSweepExtra, docs/flash-attn.md): sweep rows (with energy per output token where
the GPU counts it), speedups against eager, the "2x at 2K" / "4x at 8K" claims, agreement of
each implementation's logits and tokens with eager's at the shortest context, kernels.
samples: batch 1 at the largest measured context, from sdpa-flash if it ran, else eager."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from llmopt_bench.core.contract import Requirements, StageContext
from llmopt_bench.core.records import LoadInfo
from llmopt_bench.engines.hf import generate as hf
from llmopt_bench.engines.hf.attention import DEFAULT_IMPLS, HFAttention, Impl, flash_attn_version
from llmopt_bench.engines.hf.engine import PREFETCH
from llmopt_bench.scenarios.context_sweep.plan import ContextSweepExtra, ContextSweepParams, sweep_claims, sweep_contexts
from llmopt_bench.scenarios.context_sweep.report import flash_claim
from llmopt_bench.scenarios.context_sweep.run import ContextSweepStage, SweepPlan


class FlashAttnParams(ContextSweepParams):
    implementations: list[Impl] = Field(default_factory=lambda: list(DEFAULT_IMPLS), min_length=1)
    batch_sizes: list[int] = Field(default_factory=lambda: [1], min_length=1)
    dtype: Literal["auto", "float16", "bfloat16", "float32"] = "auto"
    verify_kernels: bool = True


class FlashAttnStage(ContextSweepStage):
    name = "flash-attn"
    description = "attention implementations (eager, SDPA math/flash, flash_attention_2) by context length, prefill and decode apart"
    changes = "attention kernel only: same weights, dtype and generate(); each kernel forced and verified by the profiler"
    requires = Requirements(imports={"transformers": "test", "torch": "test"})
    prefetch = PREFETCH
    Params = FlashAttnParams

    @classmethod
    def claims(cls, result, run):
        return [flash_claim(result.extra_as(ContextSweepExtra))]

    def start_sweep(self, model, params: FlashAttnParams, ctx: StageContext) -> tuple[HFAttention, SweepPlan, LoadInfo]:
        import torch
        import transformers

        dtype = hf.resolve_dtype(params.dtype, ctx.device)
        contexts, notes = sweep_contexts(params, model.max_position_embeddings, ctx.device)
        impls: list[str] = list(dict.fromkeys(params.implementations))  # the sweep names variants by any str
        baseline = "eager" if "eager" in impls else impls[0]
        if baseline != "eager":
            notes.append(f"eager not requested: speedups and agreement are against {baseline}")
        if ctx.device != "cuda":
            notes.append("peak_bytes is None on CPU: torch has no allocator peak for host memory")
        engine = HFAttention(model, ctx.device, dtype, params, shortest=contexts[0], baseline=baseline,
                             agree_batch=1 if 1 in params.batch_sizes else min(params.batch_sizes),
                             verify=params.verify_kernels, progress=lambda msg: ctx.progress(msg, None, None))
        plan = SweepPlan(variants=impls, contexts=contexts, batches=params.batch_sizes, decode_tokens=params.decode_tokens,
                         noun="attention implementation", baseline=baseline, samples_from=("sdpa-flash",),
                         claims=sweep_claims, notes=notes)
        return engine, plan, LoadInfo(
            phases_s={"tokenizer_s": engine.tokenizer_s},
            implementation={"engine": "transformers", "dtype": dtype, "device": ctx.device, "implementations": impls,
                            "contexts": contexts, "batch_sizes": params.batch_sizes, "baseline": baseline,
                            "models_loaded": "in run(), once per implementation"},
            versions={"transformers": transformers.__version__, "torch": torch.__version__,
                      "flash_attn": flash_attn_version() or "not installed"},
            notes=list(notes))
