"""The context-length sweep, written once for every engine: which contexts to measure, rows
of prefill (TTFT) and decode (TPOT) per implementation and context, speedups against a
baseline implementation with the spread the repeats allow, and the story's FlashAttention
claims. flash-attn runs it on transformers' attention implementations, vllm-attn on vLLM's
attention backends (docs/flash-attn.md). The params both share and the typed record both keep
in their extra are here; the loop that measures is context_sweep_run.py."""

from __future__ import annotations

from typing import Callable

from pydantic import ConfigDict, Field
from typing_extensions import NotRequired, TypedDict

from llmopt_bench.core.contract import StageSkipped
from llmopt_bench.core.distribution import Distribution
from llmopt_bench.core.records import StrictModel
from llmopt_bench.measure.energy import EnergyFigures

CLAIMS = [("2x at 2K", 2048, 2.0), ("4x at 8K", 8192, 4.0)]
CPU_CAP_NOTE = ("context {c} capped to {cap} on CPU (cpu_max_context={cap}): eager attention at long context "
                "takes minutes on a few cores; raise cpu_max_context to measure {c}")


class ContextSweepParams(StrictModel):
    """The sweep's own params; each stage adds its engine's (and which variants to open)."""

    contexts: list[int] = Field(default_factory=lambda: [512, 2048, 8192], min_length=1)
    decode_tokens: int = Field(32, ge=1)
    repeats: int = Field(3, ge=1)
    warmup: int = Field(1, ge=0, description="untimed generations before each (impl, context, batch) cell")
    cpu_max_context: int | None = Field(1024, ge=1, description="on CPU, contexts above this are measured at this length "
                                                                "instead, with a note; None: no cap")


class SweepRow(StrictModel):
    impl: str
    effective_impl: str | None = None
    context: int
    batch: int = 1
    ttft_s: Distribution | None = None
    tpot_s: Distribution | None = None
    peak_bytes: int | None = None
    status: str
    reason: str | None = None
    energy: EnergyFigures | None = None  # the cell's timed window (TimedMeter.record): joules per output token, where counted


class SweepSpeedup(StrictModel):
    impl: str
    context: int
    batch: int = 1
    prefill_speedup: float | None = None
    prefill_spread: list[float | None] | None = None
    decode_speedup: float | None = None
    decode_spread: list[float | None] | None = None


class SweepClaim(StrictModel):
    claim: str
    context: int
    target: float
    impl: str | None = None
    batch: int = 1
    prefill: str
    measured_prefill: float | None = None
    decode: str
    measured_decode: float | None = None


class OpenRecord(StrictModel):
    """A diagnostic record kept whole (kernels the profiler saw, an engine's start-up)."""

    model_config = ConfigDict(extra="allow")


class ContextSweepExtra(StrictModel):
    sweep: list[SweepRow] = Field(default_factory=list)
    speedups: list[SweepSpeedup] = Field(default_factory=list)
    claims: list[SweepClaim] = Field(default_factory=list)
    baseline: str | None = None
    agreement: OpenRecord | None = None  # flash-attn: logits and tokens of each implementation vs the baseline
    kernels: list[OpenRecord] = Field(default_factory=list)  # flash-attn: what the profiler saw per implementation
    engines: list[OpenRecord] = Field(default_factory=list)  # vllm-attn: one engine per backend


class SweepCell(TypedDict):
    """A SweepRow as the loop builds it (scenarios/context_sweep/run.row)."""

    impl: str
    effective_impl: str | None
    context: int
    batch: int
    ttft_s: dict[str, float] | None  # Distribution.model_dump()
    tpot_s: dict[str, float] | None
    peak_bytes: int | None
    status: str
    reason: str | None
    energy: NotRequired[EnergyFigures]  # where the device counts energy


class Speedup(TypedDict):
    """A SweepSpeedup as speedups() builds it."""

    impl: str
    context: int
    batch: int
    prefill_speedup: float | None
    prefill_spread: list[float | None] | None
    decode_speedup: float | None
    decode_spread: list[float | None] | None


class Claim(TypedDict):
    """A SweepClaim as sweep_claims() judges it."""

    claim: str
    context: int
    target: float
    impl: str | None
    batch: int
    prefill: str
    measured_prefill: float | None
    decode: str
    measured_decode: float | None


def plan_contexts(contexts: list[int], max_positions: int | None, device: str, cpu_cap: int | None) -> tuple[list[int], list[str]]:
    """The contexts to measure (sorted, unique) and a note for each one changed: above the
    model's positions: dropped; on CPU above cpu_cap: measured at cpu_cap instead."""
    keep, notes = set(), []
    for c in sorted(set(contexts)):
        if c < 1:
            notes.append(f"context {c} dropped: not a positive length")
        elif max_positions and c > max_positions:
            notes.append(f"context {c} dropped: above the model's max_position_embeddings ({max_positions})")
        elif device != "cuda" and cpu_cap is not None and c > cpu_cap:
            notes.append(CPU_CAP_NOTE.format(c=c, cap=cpu_cap))
            keep.add(cpu_cap)
        else:
            keep.add(c)
    return sorted(keep), notes


Fit = Callable[[list[int]], tuple[list[int], list[str]]]


def sweep_contexts(params: ContextSweepParams, max_positions: int | None, device: str,
                   fit: Fit | None = None) -> tuple[list[int], list[str]]:
    """plan_contexts, then the engine's own fit (vLLM: prompt and new tokens within the
    model's positions); with no context left the stage is skipped."""
    contexts, notes = plan_contexts(params.contexts, max_positions, device, params.cpu_max_context)
    if fit is not None:
        contexts, more = fit(contexts)
        notes += more
    if not contexts:
        raise StageSkipped("no context length left to measure: " + "; ".join(notes),
                           "pass contexts within the model's max_position_embeddings (and cpu_max_context on CPU)")
    return contexts, notes


def _row(rows: list[SweepCell], impl: str, context: int, batch: int) -> SweepCell | None:
    return next((r for r in rows if r["impl"] == impl and r["context"] == context and r["batch"] == batch), None)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b and b > 0 else None


def _speedup(base: dict[str, float] | None, impl: dict[str, float] | None) -> tuple[float | None, list[float | None] | None]:
    """Baseline p50 over impl p50, and its spread (baseline min / impl max, baseline max / impl min)."""
    if not base or not impl:
        return None, None
    return _ratio(base["p50"], impl["p50"]), [_ratio(base["min"], impl["max"]), _ratio(base["max"], impl["min"])]


def speedups(rows: list[SweepCell], baseline: str) -> list[Speedup]:
    """Baseline p50 over impl p50 for every ok row that has an ok baseline row; the spread is
    (baseline min / impl max, baseline max / impl min): the range the repeats allow."""
    out: list[Speedup] = []
    for r in rows:
        if r["impl"] == baseline or r["status"] != "ok":
            continue
        base = _row(rows, baseline, r["context"], r["batch"])
        if base is None or base["status"] != "ok":
            continue
        prefill, prefill_spread = _speedup(base["ttft_s"], r["ttft_s"])
        decode, decode_spread = _speedup(base["tpot_s"], r["tpot_s"])
        out.append({"impl": r["impl"], "context": r["context"], "batch": r["batch"], "prefill_speedup": prefill,
                    "prefill_spread": prefill_spread, "decode_speedup": decode, "decode_spread": decode_spread})
    return out


def _verdict(value: float | None, target: float) -> str:
    return "not measured" if value is None else ("held" if value >= target else "not held")


def sweep_claims(speeds: list[Speedup], impls: list[str], rows: list[SweepCell]) -> list[Claim]:
    """The story's claims against the FlashAttention implementation that ran (flash_attention_2,
    else sdpa-flash), batch 1 (else the smallest batch): held when the p50 ratio reaches the target."""
    ran = [i for i in ("flash_attention_2", "sdpa-flash") if any(s["impl"] == i for s in speeds)]
    impl = ran[0] if ran else next((i for i in ("flash_attention_2", "sdpa-flash") if i in impls), None)
    batches = sorted({r["batch"] for r in rows}) or [1]
    batch = 1 if 1 in batches else batches[0]
    out: list[Claim] = []
    for text, context, target in CLAIMS:
        s = next((s for s in speeds if s["impl"] == impl and s["context"] == context and s["batch"] == batch), None)
        prefill, decode = (s["prefill_speedup"], s["decode_speedup"]) if s else (None, None)
        out.append({"claim": text, "context": context, "target": target, "impl": impl, "batch": batch,
                    "prefill": _verdict(prefill, target), "measured_prefill": prefill,
                    "decode": _verdict(decode, target), "measured_decode": decode})
    return out
