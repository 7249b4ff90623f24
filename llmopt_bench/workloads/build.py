"""The plan of a workload on one engine: its spec parsed, its token space (the engine's
tokenizer) and max_model_len; the prompt file's kinds encoded with that tokenizer."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypedDict

from llmopt_bench.core.workload import WorkloadConfig, build_requests
from llmopt_bench.workloads.plan import Plan, TokenSpace
from llmopt_bench.workloads.spec import MultiTurnKind, RandomKind, SharedPrefixKind, TraceKind, parse_spec
from llmopt_bench.workloads.synth import MultiTurnPlan, RandomPlan, RequestsPlan, SharedPrefixPlan
from llmopt_bench.workloads.traces import TracePlan


class _Common(TypedDict):
    """What every plan is made with."""

    spec: str
    seed: int
    max_len: int | None


def make_plan(cfg: WorkloadConfig, space: TokenSpace, max_len: int | None, encode: Callable[[str], list[int]],
              count: int | None = None, spec: str | None = None) -> Plan:
    """The plan of `spec` (default: the run's workload): a generated kind's from the seed, or the
    prompt file's `count` requests (default: num_prompts) at --max-new-tokens."""
    params = parse_spec(spec or cfg.spec)
    common = _Common(spec=params.canonical(), seed=cfg.seed, max_len=max_len)
    if isinstance(params, RandomKind):
        return RandomPlan(**common, space=space, params=params)
    if isinstance(params, SharedPrefixKind):
        return SharedPrefixPlan(**common, space=space, params=params)
    if isinstance(params, MultiTurnKind):
        return MultiTurnPlan(**common, space=space, params=params)
    if isinstance(params, TraceKind):
        return TracePlan(**common, space=space, params=params)
    prompt_file = cfg.model_copy(update={"spec": params.KIND, "kind": params.KIND})
    return RequestsPlan(**common, items=build_requests(prompt_file, encode, count=count), output_len=cfg.max_new_tokens)
