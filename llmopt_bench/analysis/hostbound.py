"""Which stages are bound by the host CPU, and the host-speed index their repeats recorded: from
run.json alone (issue 25).

A stage is **host-bound** when, in order:

1. measured: its GPU is busy less than half of each decode token (facts.gpu_busy_share, below
   measure/gpu_busy.HOST_BOUND_BELOW): the GPU waits on the host for the rest;
2. a CPU run (no GPU in the stage's load, env.device "cpu"): the host is the device, so the
   host's speed is its speed, whatever bounds it there;
3. otherwise (an engine profiled in processes of its own, vLLM; runs recorded before the
   measurement): the roofline's decode verdict, host-bound when "overhead-bound" (neither the
   bytes at the measured bandwidth nor the FLOPs explain half its time: analysis/roofline.py);
4. else not known, and not treated as host-bound.

The index (measure/hostspeed.py, per repeat in extra.conditions) is a speed: kop/s, higher is
faster; a host-bound stage's latencies move as its inverse."""

from __future__ import annotations

from dataclasses import dataclass

from llmopt_bench.core.fmt import pct
from llmopt_bench.core.results import RunResult, StageResult
from llmopt_bench.measure.gpu_busy import HOST_BOUND_BELOW


@dataclass(frozen=True)
class Bound:
    host_bound: bool | None  # None: not known
    why: str


def is_cpu_run(stage: StageResult, run: RunResult) -> bool:
    impl = (stage.load.implementation if stage.load else {}) or {}
    return str(impl.get("device") or run.env.device or "").startswith("cpu")


def host_bound(stage: StageResult, run: RunResult) -> Bound:
    share = stage.facts.gpu_busy_share
    if share is not None:
        bound = share < HOST_BOUND_BELOW
        return Bound(bound, f"GPU busy {pct(share)} of each token")
    if is_cpu_run(stage, run):
        return Bound(True, "a CPU run: the host is the device")
    from llmopt_bench.analysis.roofline import roofline_rows

    decode = next((r for r in roofline_rows(stage, run) if r.phase == "decode"), None)
    if decode is None:
        return Bound(None, "not known (no GPU-busy measurement, no roofline)")
    bound = decode.bound == "overhead-bound"
    return Bound(bound, f"roofline: decode {decode.bound} at {pct(decode.achieved)} of the memory ceiling "
                        "(no GPU-busy measurement)")


def index_per_repeat(stage: StageResult) -> list[float | None]:
    """The host-speed index of each repeat, in repeat order ([] where the run did not record it)."""
    rows = (stage.extra or {}).get("conditions") or []
    return [r.get("host_kops") if isinstance(r, dict) else getattr(r, "host_kops", None) for r in rows]


def index_mean(stage: StageResult) -> float | None:
    known = [v for v in index_per_repeat(stage) if v]
    return sum(known) / len(known) if known else None


def busy_sentence(stage: StageResult, run: RunResult) -> str | None:
    """The report's bottleneck line: "hf-fp16: GPU busy 16% of each token: host-bound"."""
    share = stage.facts.gpu_busy_share
    if share is not None:
        return f"{stage.name}: GPU busy {pct(share)} of each token: " + ("host-bound" if share < HOST_BOUND_BELOW else "not host-bound")
    if is_cpu_run(stage, run) and not stage.own_workload:
        return f"{stage.name}: GPU busy not measured (a CPU run: the host is the device)"
    return None
