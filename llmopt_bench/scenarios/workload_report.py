"""A generated workload's plan in one sentence of the report (PlanRecord: spec, seed, lengths,
the share a prefix cache could serve, digest): the serving stages' and the fixed stages' alike."""

from __future__ import annotations

from llmopt_bench.core.fmt import num, pct
from llmopt_bench.core.records import PlanRecord


def _tokens(v: float | None) -> str:
    return num(int(v)) if v is not None and float(v).is_integer() else num(v)


def plan_sentence(plan: PlanRecord) -> str:
    return (f"Workload `{plan.spec}`, seed {plan.seed}: {plan.requests} requests in the first {plan.conversations} "
            f"conversations, prompts {_tokens(plan.input_tokens.get('min'))}-{_tokens(plan.input_tokens.get('max'))} tokens, "
            f"outputs {_tokens(plan.output_tokens.get('min'))}-{_tokens(plan.output_tokens.get('max'))} tokens forced"
            + (f", at most {pct(plan.shareable_fraction)} of prompt tokens a prefix cache of 16-token blocks can serve"
               if plan.shareable_fraction is not None else "") + f"; digest {plan.digest}.")
