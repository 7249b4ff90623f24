"""What continuous-batching's scenario records (its extra), typed: the load curve, the
all-at-once throughput point, KV-cache capacity, and the mixed-length pitfall. docs/batching.md
defines every field."""

from __future__ import annotations

from pydantic import ConfigDict, Field

from llmopt_bench.core.freeform import Fields
from llmopt_bench.core.records import StrictModel
from llmopt_bench.engines.vllm.kv import KVCacheRecord
from llmopt_bench.load.record import PointRow


class CurveRow(PointRow):
    """One load point: a mode (continuous or static) at a concurrency or an arrival rate (the
    figures: load/record.PointRow, the same as a serving stage's)."""

    mode: str | None = None
    static_batch: int | None = None
    oom: bool = False
    continuous_speedup: float | None = None


class ThroughputPoint(StrictModel):
    continuous: CurveRow | None = None
    static: CurveRow | None = None
    reference_h200_out_tok_s: float | None = None


class CapacityRow(StrictModel):
    """How many sequences of a context fit at once, in one engine."""

    model_config = ConfigDict(extra="allow")  # a probe's own diagnostics (bytes tried, free at OOM)
    engine: str
    context: int
    max_batch: int | None = None
    oom_at: int | None = None
    peak_bytes: int | None = None
    scheduler_limit: int | None = None
    method: str | None = None
    note: str | None = None
    probed: list[int] | None = None
    ruled_out: Fields | None = None
    memory_at_oom_bytes: int | None = None
    attn_implementation: str | None = None
    error: str | None = None


class MixedRow(StrictModel):
    """One configuration of the mixed-length set (static-mixed, cap-context, bucketed, continuous)."""

    model_config = ConfigDict(extra="allow")  # the probe's memory diagnostics
    config: str
    status: str
    requests: int | None = None
    output_tok_s: float | None = None
    peak_bytes: int | None = None
    memory_at_oom_bytes: int | None = None
    padding_fraction: float | None = None
    all_tokens_produced: bool | None = None
    reason: str | None = None


class BatchingExtra(StrictModel):
    sweep: Fields = Field(default_factory=dict)  # the sweep's settings (mode, main point, SLO, lengths)
    engine: Fields = Field(default_factory=dict)  # the engine's scheduler limits
    h200_reference: Fields = Field(default_factory=dict)
    curve: list[CurveRow] = Field(default_factory=list)
    throughput_point: ThroughputPoint | None = None
    kv_cache: KVCacheRecord | None = None
    capacity: list[CapacityRow] = Field(default_factory=list)
    capacity_probes: list[Fields] = Field(default_factory=list)
    mixed: list[MixedRow] = Field(default_factory=list)
    mixed_setup: Fields | None = None
    lifecycle: Fields = Field(default_factory=dict)  # device memory and processes around the engine
    # the transformers probes (mixed-length, capacity) through the probe worker: model loads,
    # worker processes, probes, and their wall time (loads included)
    probe_loads: int | None = None
    probe_workers: int | None = None
    probe_count: int | None = None
    probe_wall_s: float | None = None
