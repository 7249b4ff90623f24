"""What the machine was doing during each timed repeat, so that a repeat slower than the others
can be told apart from a slower build: the host's load, how often the stage's processes lost
their CPU to another, how much CPU they got, the CPU time a hypervisor gave other guests
(steal), and the GPU's SM clock. They explain, they do not correct: the gate still counts the
noise between repeats (docs/regression.md). On the H200 a host-bound stage's repeats moved by
up to 1.7x with every one of these flat (results/h200/20261204-host-noise): what they rule out
is worth knowing too.

The processes are the stage's and every one below it (a vLLM engine's core and workers), read
with psutil; preemptions are each process's main thread's (where a Python engine loop runs).
A figure the machine cannot give is None; the clock comes from NVML.

What those figures could not show on the H200, the host's speed for one thread, the host-speed
index measures directly (measure/hostspeed.py): small PyTorch ops dispatched a second, right
before and right after the repeat, outside its timed window. It is the one figure here that
the gate uses (analysis/gate/host_verdict.py): a host-bound stage's change that the index explains
is "inconclusive (host)", not a regression and not a pass."""

from __future__ import annotations

import os
import statistics
import time

from pydantic import BaseModel, ConfigDict, Field

from llmopt_bench.measure import hostspeed, nvml


def _tree_usage() -> dict[int, tuple[float, int]] | None:
    """CPU seconds and involuntary context switches of this process and every one below it; None
    without psutil (an install made with --no-deps: the other figures stay)."""
    try:
        import psutil
    except ImportError:
        return None

    me = psutil.Process()
    out = {}
    for proc in [me, *me.children(recursive=True)]:
        try:
            with proc.oneshot():
                t = proc.cpu_times()
                out[proc.pid] = (t.user + t.system, proc.num_ctx_switches().involuntary)
        except psutil.Error:  # gone between the listing and the read
            continue
    return out


def _steal() -> float | None:
    """Seconds of CPU the hypervisor has given other guests since boot (Linux), None elsewhere."""
    try:
        import psutil
    except ImportError:
        return None
    return getattr(psutil.cpu_times(), "steal", None)


class RepeatConditions(BaseModel):
    """One timed repeat's conditions (the stage's extra.conditions, in repeat order)."""

    model_config = ConfigDict(extra="forbid")

    load1: float | None = Field(None, description="the host's 1-minute load average at the repeat's end")
    cpus: int | None = Field(None, description="CPUs this process may run on")
    processes: int | None = Field(None, description="the stage's process and those below it, at the repeat's end")
    involuntary_switches: int | None = Field(None, description="times their main threads were preempted during the repeat")
    cpu_share: float | None = Field(None, description="their CPU time / the repeat's wall time (1.0: one core busy)")
    steal_s: float | None = Field(None, description="CPU time the hypervisor gave other guests during the repeat (all CPUs)")
    gpu_sm_mhz: int | None = Field(None, description="GPU 0's SM clock at the repeat's end (a point sample)")
    host_kops: float | None = Field(None, description="the host-speed index: thousands of small PyTorch ops dispatched a "
                                    "second, the median of its rounds right before and right after the repeat")
    host_device: str | None = Field(None, description="where the index's ops ran: cuda or cpu (measure/hostspeed.py)")
    pinned_cpu: int | None = Field(None, description="the core the stage's main thread was pinned to (--pin-cpu), else None")
    wall_s: float | None = Field(None, description="the repeat's wall time, seconds: preemptions and steal as rates a second "
                                 "(a slower repeat is preempted more often in all, not more often a second)")


class ConditionsRecorder:
    """with ConditionsRecorder(device) as recorder: <one repeat>; then recorder.result. With a device, the
    host-speed index is measured before the repeat starts and after it ends (outside the wall
    time the CPU share is taken over); without one (None), it is not measured."""

    def __init__(self, device: str | None = None, pinned_cpu: int | None = None) -> None:
        self.device, self.pinned_cpu = device, pinned_cpu

    def __enter__(self) -> "ConditionsRecorder":
        self.speed0 = hostspeed.measure(self.device) if self.device else None
        self.t0, self.usage0, self.steal0 = time.perf_counter(), _tree_usage(), _steal()
        self.result = RepeatConditions()  # filled in when the repeat ends
        return self

    def __exit__(self, *exc) -> None:
        wall = time.perf_counter() - self.t0
        before, after = self.usage0, _tree_usage()
        devices = nvml.device_indices()
        steal = _steal()
        self.result = RepeatConditions(load1=round(os.getloadavg()[0], 2), cpus=len(os.sched_getaffinity(0)),
                                       gpu_sm_mhz=nvml.sm_clock_mhz(devices[0]) if devices else None, wall_s=round(wall, 4))
        if steal is not None and self.steal0 is not None:
            self.result.steal_s = round(steal - self.steal0, 3)
        if before is not None and after is not None and wall > 0:
            # a process started during the repeat counts from zero; one that ended is not seen
            self.result.processes = len(after)
            self.result.cpu_share = round(sum(c - before.get(pid, (0.0, 0))[0] for pid, (c, _) in after.items()) / wall, 3)
            self.result.involuntary_switches = sum(n - before.get(pid, (0.0, 0))[1] for pid, (_, n) in after.items())
        self.result.pinned_cpu = self.pinned_cpu
        speed1 = hostspeed.measure(self.device) if self.device else None
        measured = [sp for sp in (self.speed0, speed1) if sp]
        rounds = [r for sp in measured for r in sp.rounds]
        if rounds:
            self.result.host_kops = round(statistics.median(rounds), 2)
            self.result.host_device = measured[-1].device  # the one after the repeat, if it was measured


# The report explains the repeats when their headlines differ by more than this (max / min - 1):
# GPU-bound stages' repeats agree within 0.1-0.5% and need no explanation
EXPLAIN_ABOVE = 0.05


def repeats_differ(values: list[float | None]) -> bool:
    known = [v for v in values if v is not None and v > 0]
    return len(known) > 1 and max(known) / min(known) - 1 > EXPLAIN_ABOVE


def conditions_sentence(metric: str, values: list[float | None], conditions: list[RepeatConditions]) -> str:
    """The report's line: each repeat's headline next to what the machine was doing."""
    def col(xs) -> str:
        return " / ".join("-" if x is None else f"{x:g}" for x in xs)

    parts = [f"{metric} {col([None if v is None else round(v * 1e3, 2) for v in values])} ms",
             f"host load {col([c.load1 for c in conditions])}",
             f"preempted {col([c.involuntary_switches for c in conditions])} times",
             f"CPU share {col([c.cpu_share for c in conditions])}"]
    if any(c.steal_s is not None for c in conditions):
        parts.append(f"steal {col([c.steal_s for c in conditions])} s")
    if any(c.gpu_sm_mhz is not None for c in conditions):
        parts.append(f"GPU SM clock {col([c.gpu_sm_mhz for c in conditions])} MHz")
    if any(c.host_kops is not None for c in conditions):
        parts.append(host_speed_text(conditions))
    return "Repeat conditions (per repeat): " + "; ".join(parts) + "."


def host_speed_text(conditions: list[RepeatConditions]) -> str:
    """'host speed 140 / 71.2 / 138 kop/s (cpu)': the index beside each repeat."""
    devices = sorted({c.host_device for c in conditions if c.host_device})
    speeds = " / ".join("-" if c.host_kops is None else f"{c.host_kops:.3g}" for c in conditions)
    pinned = sorted({c.pinned_cpu for c in conditions if c.pinned_cpu is not None})
    return (f"host speed {speeds} kop/s ({', '.join(devices) or '?'})"
            + (f", main thread pinned to CPU {', '.join(map(str, pinned))}" if pinned else ""))


def conditions_summary(raw: list | None) -> str | None:
    """A stage's repeat conditions as ranges over its repeats (compare's line for a regressed
    stage: was the machine busier in one run?); None when the run did not record them."""
    if not raw:
        return None
    rows = [c if isinstance(c, RepeatConditions) else RepeatConditions.model_validate(c) for c in raw]

    def span(field: str, unit: str = "") -> str | None:
        xs = [getattr(c, field) for c in rows if getattr(c, field) is not None]
        if not xs:
            return None
        lo, hi = min(xs), max(xs)
        return (f"{lo:g}" if lo == hi else f"{lo:g}-{hi:g}") + unit

    parts = [(label, span(field, unit)) for label, field, unit in (
        ("host load", "load1", ""), ("preempted", "involuntary_switches", " times a repeat"),
        ("CPU share", "cpu_share", ""), ("steal", "steal_s", " s"), ("GPU SM clock", "gpu_sm_mhz", " MHz"),
        ("host speed", "host_kops", " kop/s"))]
    return ", ".join(f"{label} {value}" for label, value in parts if value is not None) + f" ({len(rows)} repeats)"
