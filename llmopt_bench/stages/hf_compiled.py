"""The baseline's compiled twin: the same model, dtype, attention and generate() as hf-fp16, with a
static KV cache and torch.compile of the decode step (engines/hf/compiled.py). Beside hf-fp16 it
says how much of the story's first step is the host (Python, dispatch, launches) rather than the
GPU; it is also the cheap fix a transformers user tries before changing engines. Optional: its
journey is journeys/host-bound.toml (hf-fp16, then this), not the default one (docs/architecture.md,
"The compiled twin", says why)."""

from __future__ import annotations

from llmopt_bench.core.contract import Requirements
from llmopt_bench.core.fmt import num, pct
from llmopt_bench.core.records import Block
from llmopt_bench.core.workload import build_requests
from llmopt_bench.engines.hf.compiled import CompiledEngineParams, CompiledTransformersEngine, CompileRecord
from llmopt_bench.engines.hf.engine import PREFETCH
from llmopt_bench.scenarios.fixed.run import FixedExtra, FixedParams, FixedWorkloadStage


class HFCompiledParams(CompiledEngineParams, FixedParams):
    pass


class CompiledExtra(FixedExtra):
    compile: CompileRecord | None = None


class HFCompiledStage(FixedWorkloadStage):
    name = "hf-compiled"
    description = "transformers FP16, static KV cache + torch.compile of the decode step (CUDA graphs on a GPU), one request at a time"
    changes = "the baseline compiled: the host's share of each token taken out, same model and generate()"
    requires = Requirements(imports={"transformers": "test", "torch": "test"})
    prefetch = PREFETCH  # as hf-fp16's: the same imports, started ahead with --prefetch
    Params = HFCompiledParams
    Extra = CompiledExtra
    engine: CompiledTransformersEngine

    def start_engine(self, model, params, ctx):
        return CompiledTransformersEngine.start(model, params, ctx)

    def warmup(self, workload, ctx) -> None:
        super().warmup(workload, ctx)
        self.engine.compile_for(build_requests(workload, self.engine.encode), workload, ctx)

    @classmethod
    def report_blocks(cls, result, run) -> list[Block]:
        out = super().report_blocks(result, run)
        record = result.extra_as(CompiledExtra).compile
        if record is None:
            return out
        cache = f"sized once at {record.max_cache_len} tokens" if record.max_cache_len else "sized per call"
        out.append(Block(text=f"Compiled with torch.compile mode {record.mode}, static KV cache {cache}; compiling every "
                              f"shape of the timed requests took {num(record.compile_s)} s (untimed, before the repeats)."))
        agree = record.decode_agreement
        if agree and agree.match_rate is not None and agree.disagreements is not None:
            out.append(Block(text=f"Compiled decode against the reference, teacher-forced: {pct(agree.match_rate)} of "
                                  f"{agree.tokens} tokens equal; of the others, {agree.near_ties} near "
                                  f"{'tie' if agree.near_ties == 1 else 'ties'} (the reference rates the compiled choice "
                                  f"within {num(agree.tie_nats)} nats of its own: rounding's flip) and "
                                  f"{agree.disagreements} {'disagreement' if agree.disagreements == 1 else 'disagreements'}"
                                  f" (a clear reference choice changed); the reference token's log-prob moved by "
                                  f"{num(agree.logprob_delta_max)} nats at most."))
        elif agree and agree.match_rate is not None:  # a run before teacher forcing: free-running tokens
            out.append(Block(text=f"Compiled decode against the reference: {pct(agree.match_rate)} of {agree.tokens} greedy tokens "
                                  f"equal, first divergence at token {num(agree.first_divergence_mean)} on average ({agree.method})."))
        elif agree and agree.note:
            out.append(Block(text=f"Compiled decode against the reference: {agree.note}"))
        return out
