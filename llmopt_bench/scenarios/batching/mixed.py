"""The mixed-length set of the load scenario: mixed_batch requests, a quarter long documents,
served once through the continuous engine (no padding) and, as probes of transformers (each its
own answer: an OOM ends that probe only; engines/hf/model_worker.py), as static batches: padded to the longest prompt (static-mixed), every
prompt cut to cap_context (cap-context), and power-of-two length buckets (bucketed).
docs/batching.md, "The mixed-length pitfall"."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, TypedDict

from llmopt_bench.core.freeform import Json
from llmopt_bench.core.records import RequestSample
from llmopt_bench.core.workload import Request, WorkloadConfig, fit_length, load_prompts
from llmopt_bench.engines.hf.static_batching import run_isolated
from llmopt_bench.load.point import LoadPoint
from llmopt_bench.scenarios.batching.curve import CurveParams, CurvePoint, EngineRequests
from llmopt_bench.scenarios.batching.record import CurveRow, MixedRow, MixedSetup

CONFIGS = ("static-mixed", "cap-context", "bucketed")  # one probe each
ORDER = [*CONFIGS, "continuous"]
CONTINUOUS_NOTE = "vLLM: paged KV cache preallocated at start-up, no padding; peak is the engine's footprint (see lifecycle)"
CPU_NOTE = "mixed lengths on CPU: the configurations ran (peak RSS recorded); the OOM of static-mixed needs the GPU"


def mixed_on(p: CurveParams, workload: WorkloadConfig, device: str) -> bool:
    return p.mixed == "on" or (p.mixed == "auto" and (workload.kind == "mixed" or device == "cuda"))


def long_len(p: CurveParams, device: str) -> int | None:
    """The long documents' forced length: on CUDA 3584 by default, so the OOM does not depend on the prompt file."""
    return (3584 if device == "cuda" else None) if p.long_len == "auto" else p.long_len


def mixed_point(p: CurveParams, workload: WorkloadConfig, source: EngineRequests, new: int,
                device: str) -> tuple[CurvePoint, int]:
    """The set as a closed-loop point at concurrency mixed_batch, and how many are long. Long
    documents are forced to long_len first, then the set is fitted to the engine."""
    wl = workload.model_copy(update={"kind": "mixed", "input_len": None, "num_prompts": p.mixed_batch})
    reqs = source.build(wl, tag="m")
    kinds = {q.id: q.kind for q in load_prompts(workload.prompts)}
    long_ids = {r.id for r in reqs if kinds.get(r.prompt_id) == "long"}
    if not long_ids:  # no kind labels: the longest quarter
        ranked = sorted(reqs, key=lambda r: -len(r.token_ids))
        long_ids = {r.id for r in ranked[:max(1, len(reqs) // 4)]}
    n = long_len(p, device)
    if n:
        reqs = [Request(r.id, r.prompt_id, tuple(fit_length(list(r.token_ids), n))) if r.id in long_ids else r
                for r in reqs]
    point = CurvePoint(load=LoadPoint(concurrency=p.mixed_batch, num_requests=len(reqs)), requests=source.fit(reqs, new),
                       new=new, static_batch=p.mixed_batch, name="mixed")
    return point, len(long_ids)


class ContinuousFigures(TypedDict):
    """The continuous configuration's MixedRow extras (it allows them): the figures a static
    probe reports too, beside its declared fields."""

    long_requests: int
    max_prompt_len: int
    prompt_tokens: int
    padded_prompt_tokens: None  # no padding
    output_tokens: int
    seconds: float
    ttft_p50_s: float | None
    e2e_p50_s: float | None
    note: str


def continuous_row(point: CurvePoint, n_long: int, samples: list[RequestSample], seconds: float, row: CurveRow) -> MixedRow:
    """The set through the continuous engine; its peak is the engine's footprint, known once
    the engine's memory is measured (the stage sets peak_bytes then)."""
    reqs = point.requests
    figures: ContinuousFigures = {
        "long_requests": n_long, "max_prompt_len": max(len(r.token_ids) for r in reqs),
        "prompt_tokens": sum(len(r.token_ids) for r in reqs), "padded_prompt_tokens": None,
        "output_tokens": sum(s.output_tokens for s in samples), "seconds": round(seconds, 4),
        "ttft_p50_s": row.ttft_p50_s, "e2e_p50_s": row.e2e_p50_s, "note": CONTINUOUS_NOTE}
    # validated from a dict: the figures are MixedRow's extras, which its typed __init__ does not name
    return MixedRow.model_validate({"config": "continuous", "status": "ok", "requests": len(reqs),
                                    "all_tokens_produced": row.failed == 0, "output_tok_s": row.output_tok_s,
                                    "memory_at_oom_bytes": None, "peak_bytes": None, **figures})


def bucket_budget(p: CurveParams) -> int:
    return p.bucket_token_budget or p.mixed_batch * p.cap_context


def static_probes(p: CurveParams, point: CurvePoint, model_path: str, device: str, dtype: str, workdir: Path,
                  progress: Callable[[str], None] = lambda m: None,
                  probe: Callable[..., Json] = run_isolated) -> list[MixedRow]:
    """The three static configurations, one probe each: probe(kind, job, timeout_s, workdir) is
    the stage's ModelWorker (one model load for all), or run_isolated (a process each)."""
    base = {"model_path": model_path, "device": device, "dtype": dtype, "attn_implementation": p.mixed_attn_implementation,
            "requests": [list(r.token_ids) for r in point.requests], "max_new_tokens": point.new,
            "batch_size": p.mixed_batch, "cap_context": p.cap_context, "bucket_token_budget": bucket_budget(p)}
    rows = []
    for config in CONFIGS:
        progress(f"mixed lengths: {config} (probe)")
        ans = probe("mixed", {**base, "config": config}, p.probe_timeout_s, workdir)
        ans.setdefault("config", config)
        ans.setdefault("memory_at_oom_bytes", None)
        rows.append(MixedRow(**ans))
    return rows


def in_order(rows: list[MixedRow]) -> list[MixedRow]:
    return sorted(rows, key=lambda r: ORDER.index(r.config) if r.config in ORDER else len(ORDER))


def setup(p: CurveParams, point: CurvePoint, n_long: int) -> MixedSetup:
    return {"requests": len(point.requests), "long_requests": n_long, "batch": p.mixed_batch, "cap_context": p.cap_context,
            "bucket_token_budget": bucket_budget(p), "attn_implementation": p.mixed_attn_implementation,
            "long_len": max(len(r.token_ids) for r in point.requests)}
