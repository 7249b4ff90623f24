"""The fixed workload: the run's prompt set, the output length forced, `repeats` times, one
batch of `batch_size` requests at a time, on any engine that offers `FixedEngine`. In a run of a
generated kind (random, shared-prefix, trace) the requests are the plan's first --num-prompts,
each with its own prompt and forced output length (scenarios/fixed_requests.py). Every
stage of the journey that compares with the others (hf-fp16, bnb, awq, vllm, vllm-fp8) is this
scenario on one engine; the stage says which engine (FixedWorkloadStage.start_engine).

Each repeat is a timed window (energy and time over the measured work only); the quality pass
runs after, untimed, and if it fails the samples are kept and the failure is recorded."""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Protocol, Sequence

from pydantic import BaseModel, Field, field_validator

from llmopt_bench.analysis.stopping import StoppingRecord, StoppingRule, headline_metric, stopping_sentence
from llmopt_bench.core.contract import Stage, StageContext
from llmopt_bench.core.errors import describe
from llmopt_bench.core.records import Block, LoadInfo, QualityRecord, RequestSample, StageFacts, StageRun, StrictModel
from llmopt_bench.core.workload import Request, WorkloadConfig
from llmopt_bench.engines.vllm_kv import KVCacheRecord, kv_line
from llmopt_bench.measure.conditions import ConditionsProbe, RepeatConditions, conditions_sentence, repeats_differ
from llmopt_bench.scenarios.fixed_requests import measured_requests, warmup_requests
from llmopt_bench.scenarios.workload_report import plan_sentence


class FixedParams(StrictModel):
    quality: bool = True  # perplexity (real weights) and agreement with the quality reference, after the timed run

    @field_validator("enable_prefix_caching", check_fields=False)
    @classmethod
    def _no_prefix_cache(cls, on: bool) -> bool:
        """A vLLM engine's prefix cache would serve every repeat after the first (and a shared
        prefix's later requests) from the first's KV: the fixed stages measure the work itself."""
        if on:
            raise ValueError("must stay false in a fixed-workload stage (its repeats would be served from the cache); "
                             "the prefix-caching stage measures what the cache buys")
        return on


class Instrumentation(StrictModel):
    """The per-token clock's own cost (transformers engines; engines/hf.py)."""

    model_config = {"extra": "allow"}  # the measure's fields (engines/hf.instrumentation_overhead)
    overhead_pct: float | None = None


class FixedExtra(StrictModel):
    greedy_tokens: dict[str, list[int]] = Field(default_factory=dict)  # repeat 0's output ids, per request
    instrumentation: Instrumentation | None = None
    kv_cache: KVCacheRecord | None = None  # vLLM engines: the preallocated KV cache
    stopping: StoppingRecord | None = None  # how many repeats ran, and why (analysis/stopping.py)
    conditions: list[RepeatConditions] = Field(default_factory=list)  # what the machine did during each repeat


class FixedEngine(Protocol):
    """What the fixed workload needs of an engine. A generated --workload also needs
    token_space() and max_model_len (engines/transformers.py; scenarios/fixed_requests.py), and
    serve() to force each request's own output length (Request.output_len) where it has one."""

    def encode(self, text: str) -> list[int]: ...

    def serve(self, requests: Sequence[Request], max_new_tokens: int, *, batch_size: int, repeat: int,
              tokens_out: dict[str, list[int]] | None, progress: Callable[[int], None]) -> list[RequestSample]: ...

    def quality(self, workload: WorkloadConfig, ctx: StageContext) -> QualityRecord: ...

    def records(self, requests: Sequence[Request], workload: WorkloadConfig, ctx: StageContext) -> dict[str, Any]: ...

    def close(self) -> None: ...


def warmup(engine: FixedEngine, workload: WorkloadConfig, ctx: StageContext, stage: str = "this stage") -> None:
    if workload.warmup:
        ctx.progress(f"warm-up: {workload.warmup} requests", None, None)
        reqs = warmup_requests(engine, workload, stage)
        engine.serve(reqs, workload.max_new_tokens, batch_size=workload.batch_size, repeat=0, tokens_out=None,
                     progress=lambda n: None)


def stopping_rule(workload: WorkloadConfig, output_lens: list[int] | None = None) -> StoppingRule:
    """Judged on TPOT unless some request's forced output is one token (then on E2E)."""
    return StoppingRule(workload.repeats, workload.max_repeats or workload.repeats, workload.stop_within,
                        headline_metric(min(output_lens or [workload.max_new_tokens])))


def measure(engine: FixedEngine, workload: WorkloadConfig, ctx: StageContext, rule: StoppingRule,
            conditions: list[RepeatConditions] | None = None,
            requests: list[Request] | None = None) -> tuple[list[Request], list[RequestSample], dict]:
    """The timed repeats, as many as the stopping rule asks: requests (default: the prompt
    file's), samples, and repeat 0's output token ids; each repeat's conditions appended to
    `conditions` when given."""
    reqs = requests if requests is not None else measured_requests(engine, workload).measured
    samples: list[RequestSample] = []
    tokens: dict[str, list[int]] = {}
    for rep in range(rule.record.max_repeats):
        def done(n: int, rep: int = rep) -> None:
            ctx.progress(f"repeat {rep + 1}/{rule.label()}", n, len(reqs))

        with ConditionsProbe() as probe, ctx.meter.window("main") as window:
            got = engine.serve(reqs, workload.max_new_tokens, batch_size=workload.batch_size, repeat=rep,
                               tokens_out=tokens if rep == 0 else None, progress=done)
            window.tokens = sum(s.output_tokens for s in got if s.ok)
        if conditions is not None:
            conditions.append(probe.result)
        samples += got
        if rule.add(got):
            break
    return reqs, samples, {r.id: tokens.get(r.id, []) for r in reqs}


def quality_or_failure(engine: FixedEngine, workload: WorkloadConfig, ctx: StageContext) -> QualityRecord:
    """The quality pass; its failure (a full disk writing the reference, say) is recorded, not raised."""
    try:
        return engine.quality(workload, ctx)
    except Exception as e:  # noqa: BLE001 - the timed samples are worth keeping whatever broke here
        print(f"quality pass failed: {describe(e, 300)}", flush=True)
        return QualityRecord(reference=ctx.reference_name, error=describe(e, 300))


def quality_workload_note(workload: WorkloadConfig) -> str:
    """Why a generated run's quality is still the prompt file's: agreement means something on text."""
    return (f"agreement and perplexity are measured on the prompt file's text prompts ({workload.prompts}), as in every run: "
            f"--workload {workload.kind}'s random token ids are the timed load, not text whose continuation can be judged")


class FixedWorkloadStage(Stage):
    """A stage that runs the fixed workload on the engine start_engine() gives: the prompt
    file's requests, or a generated plan's single-turn ones (single_turn_workload)."""

    Extra: ClassVar[type[BaseModel]] = FixedExtra
    single_turn_workload = True

    def start_engine(self, model: Any, params: Any, ctx: StageContext) -> tuple[FixedEngine, LoadInfo]:
        raise NotImplementedError

    engine: FixedEngine

    def load(self, model, params, ctx: StageContext) -> LoadInfo:
        self.params, self.model_info = params, model
        self.engine, info = self.start_engine(model, params, ctx)
        return info

    def warmup(self, workload: WorkloadConfig, ctx: StageContext) -> None:
        warmup(self.engine, workload, ctx, self.name)

    def run(self, workload: WorkloadConfig, ctx: StageContext) -> StageRun:
        sent = measured_requests(self.engine, workload, self.name)
        rule = stopping_rule(workload, sent.output_lens(workload.max_new_tokens))
        conditions: list[RepeatConditions] = []
        reqs, samples, tokens = measure(self.engine, workload, ctx, rule, conditions, sent.measured)
        extra = FixedExtra(greedy_tokens=tokens, stopping=rule.record, conditions=conditions,
                           **self.engine.records(reqs, workload, ctx))
        quality = quality_or_failure(self.engine, workload, ctx) if self.params.quality else None
        notes = sent.notes + ([quality_workload_note(workload)] if quality is not None and sent.plan is not None else [])
        return StageRun(samples=samples, extra=extra.model_dump(mode="json", exclude_none=True), quality=quality,
                        facts=StageFacts(workload=sent.plan), notes=notes)

    def teardown(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            del self.engine
            engine.close()

    @classmethod
    def report_blocks(cls, result, run) -> list[Block]:
        from llmopt_bench.analysis.overhead import overhead_sentence

        extra = result.extra_as(FixedExtra)
        plan = result.facts.workload if result.facts else None
        out = [Block(text=plan_sentence(plan) + " Sent as the fixed workload: in order, --batch-size at a time, "
                          "each request forced to its own output length.")] if plan else []
        if extra.kv_cache:
            out.append(Block(text=kv_line(extra.kv_cache)))
        if extra.stopping and extra.stopping.max_repeats > extra.stopping.min_repeats:
            out.append(Block(text=stopping_sentence(extra.stopping)))
        if extra.stopping and extra.conditions and repeats_differ(extra.stopping.per_repeat):  # older runs lack them
            out.append(Block(text=conditions_sentence(extra.stopping.metric, extra.stopping.per_repeat, extra.conditions)))
        if extra.instrumentation:
            out.append(Block(text=overhead_sentence(extra.instrumentation.model_dump())))
        return out
