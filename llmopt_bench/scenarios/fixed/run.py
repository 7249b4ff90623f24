"""The fixed workload: the run's prompt set, the output length forced, `repeats` times, one
batch of `batch_size` requests at a time, on any engine that offers `FixedEngine`. In a run of a
generated kind (random, shared-prefix, trace) the requests are the plan's first --num-prompts,
each with its own prompt and forced output length (scenarios/fixed/requests.py). Every
stage of the journey that compares with the others (hf-fp16, bnb, awq, vllm, vllm-fp8) is this
scenario on one engine; the stage says which engine (FixedWorkloadStage.start_engine).

Each repeat is a timed window (energy and time over the measured work only), with the machine's
conditions and the host-speed index beside it (measure/conditions.py); the GPU-busy share
(measure/gpu_busy.py) and the quality pass run after, untimed, and if the quality pass fails the
samples are kept and the failure is recorded."""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Protocol, Sequence

from pydantic import BaseModel, Field, field_validator

from llmopt_bench.analysis.first_repeat import first_repeat_warning
from llmopt_bench.analysis.metrics import compute
from llmopt_bench.analysis.overhead import overhead_sentence
from llmopt_bench.analysis.stopping import StoppingRecord, StoppingRule, headline_metric, stopping_sentence
from llmopt_bench.core.contract import Stage, StageContext
from llmopt_bench.core.errors import describe
from llmopt_bench.core.records import Block, LoadInfo, QualityRecord, RequestSample, StageFacts, StageRun, StrictModel
from llmopt_bench.core.workload import Request, WorkloadConfig
from llmopt_bench.engines.hf.generate import EngineRecords
from llmopt_bench.engines.vllm.kv import KVCacheRecord, kv_line
from llmopt_bench.measure import gpu_busy, pinning
from llmopt_bench.measure.conditions import (
    ConditionsRecorder,
    RepeatConditions,
    conditions_sentence,
    host_speed_text,
    repeats_differ,
)
from llmopt_bench.measure.gpu_busy import GpuBusy
from llmopt_bench.scenarios.fixed.requests import measured_requests, warmup_requests
from llmopt_bench.scenarios.workload_report import plan_sentence


class FixedParams(StrictModel):
    quality: bool = True  # perplexity (real weights) and agreement with the quality reference, after the timed run
    # the warm-up's output length: None, the engine's own (a transformers engine: one generation of
    # 16 tokens; vLLM: the workload's warm-up requests at full length); a number: one generation of it
    warmup_tokens: int | None = Field(None, ge=1)

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
    """The per-token clock's own cost (transformers engines; engines/hf/generate.py)."""

    model_config = {"extra": "allow"}  # the measure's fields (engines/hf.instrumentation_overhead)
    overhead_pct: float | None = None


class FixedExtra(StrictModel):
    greedy_tokens: dict[str, list[int]] = Field(default_factory=dict)  # repeat 0's output ids, per request
    instrumentation: Instrumentation | None = None
    kv_cache: KVCacheRecord | None = None  # vLLM engines: the preallocated KV cache
    stopping: StoppingRecord | None = None  # how many repeats ran, and why (analysis/stopping.py)
    conditions: list[RepeatConditions] = Field(default_factory=list)  # what the machine did during each repeat
    gpu_busy: GpuBusy | None = None  # the share of a token the GPU is busy, or why it was not measured
    warmup: str | None = None  # what the warm-up was ("1 request x 16 tokens")


class FixedEngine(Protocol):
    """What the fixed workload needs of an engine. A generated --workload also needs
    token_space() and max_model_len (engines/hf/engine.py; scenarios/fixed/requests.py), and
    serve() to force each request's own output length (Request.output_len) where it has one."""

    def encode(self, text: str) -> list[int]: ...

    def serve(self, requests: Sequence[Request], max_new_tokens: int, *, batch_size: int, repeat: int,
              tokens_out: dict[str, list[int]] | None, progress: Callable[[int], None]) -> list[RequestSample]: ...

    def quality(self, workload: WorkloadConfig, ctx: StageContext) -> QualityRecord: ...

    def records(self, requests: Sequence[Request], workload: WorkloadConfig, ctx: StageContext) -> EngineRecords: ...

    def close(self) -> None: ...


def warmup_plan(workload: WorkloadConfig, tokens: int | None) -> tuple[int, int]:
    """(requests, output tokens each) of the warm-up: the workload's warm-up requests at full length,
    or, given a short length (FixedParams.warmup_tokens, an engine's WARMUP_TOKENS), one generation:
    one batch of them. (0, 0): no warm-up (--warmup 0)."""
    if not workload.warmup:
        return 0, 0
    if tokens is None:
        return workload.warmup, workload.max_new_tokens
    return min(workload.warmup, workload.batch_size), min(tokens, workload.max_new_tokens)


def warmup(engine: FixedEngine, workload: WorkloadConfig, ctx: StageContext, tokens: int | None = None,
           stage: str = "this stage") -> str | None:
    """Untimed requests before the repeats (warmup_plan; a generated workload's first requests,
    each at its own length); what they were, for the record."""
    count, length = warmup_plan(workload, tokens)
    if not count:
        return None
    said = f"{count} request{'s' if count > 1 else ''} x {length} tokens"
    ctx.progress(f"warm-up: {said}", None, None)
    reqs = warmup_requests(engine, workload, stage, count)
    engine.serve(reqs, length, batch_size=workload.batch_size, repeat=0, tokens_out=None, progress=lambda n: None)
    return said


def stopping_rule(workload: WorkloadConfig, output_lens: list[int] | None = None) -> StoppingRule:
    """Settled on the gate's decode figures: TPOT (E2E where some request's forced output is one
    token), E2E and output tok/s, within --repeat-budget seconds of repeats."""
    return StoppingRule(workload.repeats, workload.max_repeats or workload.repeats, workload.stop_within,
                        headline_metric(min(output_lens or [workload.max_new_tokens])), workload.repeat_budget_s)


def measure(engine: FixedEngine, workload: WorkloadConfig, ctx: StageContext, rule: StoppingRule,
            conditions: list[RepeatConditions] | None = None,
            requests: list[Request] | None = None) -> tuple[list[Request], list[RequestSample], dict]:
    """The timed repeats, as many as the stopping rule asks: requests (default: the prompt
    file's), samples, and repeat 0's output token ids; each repeat's conditions appended to
    `conditions` when given."""
    reqs = requests if requests is not None else measured_requests(engine, workload).measured
    samples: list[RequestSample] = []
    tokens: dict[str, list[int]] = {}
    with pinning.pinned(pinning.requested()) as core:
        for rep in range(rule.record.max_repeats):
            def done(n: int, rep: int = rep) -> None:
                ctx.progress(f"repeat {rep + 1}/{rule.label()}", n, len(reqs))

            if core is not None:
                pinning.warm()
            with ConditionsRecorder(ctx.device, core) as recorder, ctx.meter.window("main") as window:
                got = engine.serve(reqs, workload.max_new_tokens, batch_size=workload.batch_size, repeat=rep,
                                   tokens_out=tokens if rep == 0 else None, progress=done)
                window.tokens = sum(s.output_tokens for s in got if s.ok)
            if conditions is not None:
                conditions.append(recorder.result)
            samples += got
            if rule.add(got, recorder.result):
                break
    return reqs, samples, {r.id: tokens.get(r.id, []) for r in reqs}


def tpot_p50(samples: Sequence[RequestSample]) -> float | None:

    m = compute(samples)
    return m.tpot_s.p50 if m and m.tpot_s else None


def measure_gpu_busy(engine: FixedEngine, reqs: Sequence[Request], workload: WorkloadConfig,
                     samples: Sequence[RequestSample], ctx: StageContext) -> GpuBusy:
    """The share of a token's wall time the GPU is busy (untimed, after the repeats), where the
    engine runs its kernels in this process (`gpu_busy_generate`); else the reason it is absent."""
    if not ctx.device.startswith("cuda"):
        return GpuBusy(why_not="no GPU: the host does all the work (a CPU run)")
    generate = getattr(engine, "gpu_busy_generate", None)
    if generate is None:
        return GpuBusy(why_not="the engine runs its kernels in processes of its own: not profiled here")
    ctx.progress("measuring how busy the GPU is during decode (torch.profiler)", None, None)
    try:
        return gpu_busy.measure(generate(reqs[:workload.batch_size]), tpot_p50(samples), ctx.device)
    except Exception as e:  # noqa: BLE001 - a profiler that cannot run costs this figure, not the stage
        return GpuBusy(why_not=f"the profiler failed: {describe(e, 200)}")


def quality_or_failure(engine: FixedEngine, workload: WorkloadConfig, ctx: StageContext) -> QualityRecord:
    """The quality pass; its failure (a full disk writing the reference, say) is recorded, not raised."""
    try:
        return engine.quality(workload, ctx)
    except Exception as e:  # noqa: BLE001 - the timed samples are worth keeping whatever broke here
        print(f"quality pass failed: {describe(e, 300)}", flush=True)
        return QualityRecord(reference=ctx.reference_name, error=describe(e, 300))


def gpu_busy_sentence(name: str, busy: GpuBusy) -> str:
    if busy.share is None or busy.kernel_s_per_step is None or busy.token_s is None:
        return f"GPU busy: not measured ({busy.why_not or 'no record'})."
    bound = "host-bound" if busy.share < gpu_busy.HOST_BOUND_BELOW else "not host-bound"
    return (f"{name}: GPU busy {busy.share * 100:.0f}% of each token: {bound} (kernels {busy.kernel_s_per_step * 1e3:.2f} ms "
            f"a decode step over {busy.steps} profiled steps, against TPOT p50 {busy.token_s * 1e3:.2f} ms; {busy.method}).")


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
        short = self.params.warmup_tokens or getattr(self.engine, "WARMUP_TOKENS", None)
        self.warmed = warmup(self.engine, workload, ctx, short, self.name)

    def run(self, workload: WorkloadConfig, ctx: StageContext) -> StageRun:
        sent = measured_requests(self.engine, workload, self.name)
        rule = stopping_rule(workload, sent.output_lens(workload.max_new_tokens))
        conditions: list[RepeatConditions] = []
        reqs, samples, tokens = measure(self.engine, workload, ctx, rule, conditions, sent.measured)
        busy = measure_gpu_busy(self.engine, reqs, workload, samples, ctx)
        records = self.engine.records(reqs, workload, ctx)
        # an engine's own records (a compiled engine's compile) join the extra as they are: the
        # stage's Extra validates them in the parent, and a plugin's run() that builds its Extra
        # from this one's fields still finds only the scenario's
        own = {k: v for k, v in records.items() if k not in FixedExtra.model_fields}
        inst = records.get("instrumentation")
        extra = FixedExtra(greedy_tokens=tokens, stopping=rule.record, conditions=conditions, gpu_busy=busy,
                           warmup=getattr(self, "warmed", None), kv_cache=records.get("kv_cache"),
                           instrumentation=None if inst is None else Instrumentation.model_validate(inst))
        quality = quality_or_failure(self.engine, workload, ctx) if self.params.quality else None
        notes = sent.notes + ([quality_workload_note(workload)] if quality is not None and sent.plan is not None else [])
        return StageRun(samples=samples, extra={**extra.model_dump(mode="json", exclude_none=True), **own}, quality=quality,
                        facts=StageFacts(gpu_busy_share=busy.share, workload=sent.plan), notes=notes)

    def teardown(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            del self.engine
            engine.close()

    @classmethod
    def report_blocks(cls, result, run) -> list[Block]:

        extra = result.extra_as(cls.Extra)
        plan = result.facts.workload if result.facts else None
        out = [Block(text=plan_sentence(plan) + " Sent as the fixed workload: in order, --batch-size at a time, "
                          "each request forced to its own output length.")] if plan else []
        if extra.kv_cache:
            out.append(Block(text=kv_line(extra.kv_cache)))
        if extra.stopping and extra.stopping.max_repeats > extra.stopping.min_repeats:
            out.append(Block(text=stopping_sentence(extra.stopping)))
        if extra.stopping and extra.conditions and repeats_differ(extra.stopping.per_repeat):  # older runs lack them
            out.append(Block(text=conditions_sentence(extra.stopping.metric, extra.stopping.per_repeat, extra.conditions)))
        elif any(c.host_kops is not None for c in extra.conditions):
            out.append(Block(text=f"Host-speed index (per repeat, measure/hostspeed.py): {host_speed_text(extra.conditions)}."))
        if extra.gpu_busy:
            out.append(Block(text=gpu_busy_sentence(result.name, extra.gpu_busy)))
        if extra.instrumentation:
            out.append(Block(text=overhead_sentence(extra.instrumentation.model_dump())))
        slow_first = first_repeat_warning(result.samples, extra.warmup or "not recorded")
        if slow_first:
            out.append(Block(text=slow_first))
        return out
