"""What the fixed workload sends: the prompt file's requests (fixed, mixed: the default, as
ever), or the first --num-prompts requests of a generated plan (random, shared-prefix, trace:
workloads/), each with its own prompt token ids and its own forced output length, drawn from
the engine's token space so every engine of the run gets the same ids from the same seed.

The fixed scenario sends them in order, batch_size at a time, with no schedule: a trace's send
times are not replayed offline (its rows' lengths and prefixes are; the serving stages replay
its times). A multi-turn plan cannot be sent this way: a turn's prompt carries the engine's
answers to the turns before it, which the serving stages' load machine sends (load/plans.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from llmopt_bench.core.errors import UsageError
from llmopt_bench.core.records import PlanRecord
from llmopt_bench.core.workload import Request, WorkloadConfig, build_requests
from llmopt_bench.workloads.build import make_plan
from llmopt_bench.workloads.plan import Plan

NOT_REPLAYED = ("the trace's send times are not replayed by this stage: its requests are sent one batch after another, "
                "as the fixed workload's (vllm-serve and openai-endpoint replay them on the trace's schedule)")


@dataclass
class FixedRequests:
    measured: list[Request]
    plan: PlanRecord | None = None  # a generated plan's record; None: the prompt file's requests
    notes: list[str] = field(default_factory=list)

    def output_lens(self, default: int) -> list[int]:
        return [r.output_len or default for r in self.measured]


def multi_turn_refusal(stage: str) -> tuple[str, str]:
    """(reason, fix) for a stage that sends independent requests, in a multi-turn run."""
    return (f"{stage} sends independent requests; --workload multi-turn's turns carry the engine's own answers to the turns "
            "before them, which only the serving stages (vllm-serve, openai-endpoint, prefix-caching) send",
            f"run {stage} with --workload random, shared-prefix or trace, or the serving stages for multi-turn (docs/workloads.md)")


def generated_plan(engine: Any, workload: WorkloadConfig, stage: str = "this stage") -> Plan:
    """The run's generated plan on this engine: its token space (engine.token_space()) and its
    max_model_len, which every prompt is cut to fit with its output (the plan's notes count them)."""
    if not hasattr(engine, "token_space"):
        raise UsageError(f"{stage}: its engine ({type(engine).__name__}) has no token_space(), which a generated "
                         f"--workload {workload.kind} draws its token ids from",
                         "give the engine token_space() and max_model_len (engines/hf/engine.py), or run without --workload")
    plan = make_plan(workload, engine.token_space(), getattr(engine, "max_model_len", None), engine.encode)
    if plan.multi_turn:
        reason, fix = multi_turn_refusal(stage)
        raise UsageError(reason, fix)
    return plan


def measured_requests(engine: Any, workload: WorkloadConfig, stage: str = "this stage") -> FixedRequests:
    """Every repeat's requests: the prompt file's num_prompts, or the plan's first num_prompts."""
    if workload.from_prompt_file:
        return FixedRequests(build_requests(workload, engine.encode))
    plan = generated_plan(engine, workload, stage)
    reqs = plan.requests(workload.num_prompts)
    record = plan.record(sent=len(reqs))
    notes = [NOT_REPLAYED] if plan.own_schedule else []
    return FixedRequests(reqs, record, notes + record.notes)


def warmup_requests(engine: Any, workload: WorkloadConfig, stage: str = "this stage", count: int | None = None) -> list[Request]:
    """The untimed requests before the repeats: the first `count` (default `warmup`) of the same
    list ("w" ids)."""
    count = workload.warmup if count is None else count
    if workload.from_prompt_file:
        return build_requests(workload, engine.encode, count=count, tag="w")
    return generated_plan(engine, workload, stage).requests(count, tag="w")
