"""awq-int4: the careful INT4. AWQ 4-bit weights (activation-aware scales, group size 128 where
the layer shapes allow it, else 64 or 32) served by vLLM's INT4 kernels (Marlin / Machete on
GPU, CPUWNA16 on CPU), one request at a time like the vllm stage, with quality measured the
same way (llmopt_bench/awq.py makes the checkpoint; docs/awq.md)."""

from __future__ import annotations

from llmopt_bench.analysis.narrative.claims import claim_verdict
from llmopt_bench.analysis.selectors import of_stage, perplexity, reference
from llmopt_bench.core.contract import Requirements, StageContext
from llmopt_bench.core.records import Claim
from llmopt_bench.engines.awq.weights import AWQCheckpointParams, awq_engine
from llmopt_bench.engines.vllm.engine import PREFETCH, VLLMEngine
from llmopt_bench.engines.vllm.params import VLLMEngineParams
from llmopt_bench.scenarios.fixed.run import FixedParams, FixedWorkloadStage

NF4_STAGE = "bnb-nf4"  # the global INT4 this stage's quality is weighed against


class AWQParams(VLLMEngineParams, AWQCheckpointParams, FixedParams):
    pass


class AWQStage(FixedWorkloadStage):
    name = "awq-int4"
    description = "AWQ 4-bit weights (activation-aware, group-wise) on vLLM's INT4 kernels, one request at a time"
    changes = "weights in 4-bit AWQ (the careful INT4) on vLLM"
    requires = Requirements(imports={"vllm": "vllm"}, engine="vllm")
    prefetch = PREFETCH
    Params = AWQParams

    def start_engine(self, model, params: AWQParams, ctx: StageContext):
        awq_model, params, meta, note = awq_engine(model, params, params, ctx)
        engine, info = VLLMEngine.start(awq_model, params, ctx, max_len_cap=model.max_position_embeddings)
        info.implementation["awq"] = meta
        info.implementation["w4a16"] = ctx.device == "cuda" or params.cpu_w4a16
        if meta.get("calibrate_s") and not meta.get("cached"):
            info.phases_s["awq_calibrate_s"] = meta["calibrate_s"]
        if note:
            info.notes.append(note)
        return engine, info

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
                      value=rise_awq / rise_nf4 if rise_nf4 else None, verdict=claim_verdict(rise_awq < rise_nf4),
                      detail=f"perplexity {fp16:.4g} (reference), {nf4:.4g} ({NF4_STAGE}), {awq_ppl:.4g} ({result.name})")]
