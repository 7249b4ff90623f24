"""vllm-attn: vLLM's attention backends by context length, prefill and decode apart.

The flash-attn stage compares attention implementations inside transformers; this stage is the
same context sweep (scenarios/context_sweep/run.py) inside vLLM (engines/vllm/attention.py):
one engine per backend (FLASH_ATTN, TRITON_ATTN, FLASHINFER), forced and verified from the
backend vLLM reports, shut down and gone before the next; one request at a time, a different
prompt each repeat, prefix caching off. Speedups are against the first backend that ran; a
stage whose every engine failed is an error. docs/flash-attn.md."""

from __future__ import annotations

import importlib.util

from pydantic import Field

from llmopt_bench.core.contract import Requirements, StageContext, StageSkipped
from llmopt_bench.core.records import LoadInfo
from llmopt_bench.engines.vllm.attention import CUDA_BACKENDS, VLLMAttention, plan_backends, within_positions
from llmopt_bench.engines.vllm.engine import PREFETCH
from llmopt_bench.engines.vllm.params import VLLMEngineParams, prepare_engine_env
from llmopt_bench.scenarios.context_sweep.plan import ContextSweepParams, sweep_contexts
from llmopt_bench.scenarios.context_sweep.run import ContextSweepStage, SweepPlan


class VLLMAttnParams(ContextSweepParams, VLLMEngineParams):
    """The engine's options (VLLMEngineParams), the sweep's (ContextSweepParams), and its backends."""

    backends: list[str] = Field(default_factory=lambda: list(CUDA_BACKENDS), min_length=1,
                                description="vLLM attention_backend names; 'auto' = vLLM's own choice")


class VLLMAttnStage(ContextSweepStage):
    name = "vllm-attn"
    description = "vLLM attention backends (FLASH_ATTN, TRITON_ATTN, FLASHINFER) by context length, prefill and decode apart"
    changes = "attention backend only, inside vLLM: same weights, dtype and engine; each backend forced and verified"
    requires = Requirements(imports={"vllm": "vllm"}, engine="vllm")
    prefetch = PREFETCH
    Params = VLLMAttnParams

    def start_sweep(self, model, params: VLLMAttnParams, ctx: StageContext) -> tuple[VLLMAttention, SweepPlan, LoadInfo]:
        prepare_engine_env(params, ctx.device)
        positions = model.max_position_embeddings
        contexts, notes = sweep_contexts(params, positions, ctx.device,
                                         fit=lambda cs: within_positions(cs, positions, params.decode_tokens))
        backends, skipped = plan_backends(params.backends, ctx.device, lambda m: importlib.util.find_spec(m) is not None)
        if not backends:
            raise StageSkipped("no attention backend to start: " + "; ".join(f"{b}: {why}" for b, why in skipped.items()),
                               "install what the backends need in vLLM's interpreter, or ask for others in backends")
        if ctx.device != "cuda":
            notes.append("CPU: vLLM's CPU build has one attention backend; the CUDA backends are skipped")
        engine = VLLMAttention(model, params, params, ctx.device, contexts=contexts, skipped=skipped,
                               log_path=ctx.log_path, progress=lambda msg: ctx.progress(msg, None, None))
        # the skipped backends' rows first (the order vllm-attn has always kept), then each started one's
        plan = SweepPlan(variants=[*skipped, *backends], contexts=contexts, batches=[1], decode_tokens=params.decode_tokens,
                         noun="attention backend", notes=notes)
        import vllm

        return engine, plan, LoadInfo(implementation={"engine": "vllm", "backends": backends, "contexts": contexts,
                                                      "skipped": skipped, "engines_started": "in run(), one per backend"},
                                      versions={"vllm": vllm.__version__}, notes=list(notes))
