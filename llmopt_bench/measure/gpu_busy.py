"""How much of a token's wall time the GPU is busy: the measured answer to "is this stage bound by
the host?" (issue 25). The roofline says how far a decode step is from the memory ceiling; this
says why: a GPU busy 16% of each token is waiting on the host for the other 84%.

Method (an engine that runs its kernels in this process: transformers): the kernels' time per
decode step is read with torch.profiler (CUDA activity: CUPTI's record of every kernel and copy,
with its start and end on the device), over two untimed generations of one batch that differ
only in their number of new tokens, so that the prefill and the set-up cancel out:

    kernel time per step = (busy(short + STEPS) - busy(short)) / STEPS
    busy(n) = the union of the device intervals of every kernel, copy and memset while
              generating n tokens (overlapping kernels on two streams count once)
    GPU busy share = kernel time per step / the stage's TPOT p50 from its timed repeats

The denominator is the unprofiled figure: the profiler's own cost on the host (CUPTI's callbacks
on every launch) lengthens the profiled steps, and dividing by them would understate the share.
The profiled steps' wall time is kept beside it. Where the engine's kernels run in another
process (vLLM) or there is no GPU, nothing is measured and the record says why; the analyses
then fall back on the roofline (analysis/hostbound.py)."""

from __future__ import annotations

import time
from typing import Callable

from pydantic import BaseModel, ConfigDict

SHORT, STEPS = 4, 16  # new tokens of the short generation, and the decode steps between the two
HOST_BOUND_BELOW = 0.5  # a GPU idle for over half of each token is waiting on the host


class GpuBusy(BaseModel):
    """A stage's GPU-busy record (its extra.gpu_busy; the share also in facts.gpu_busy_share)."""

    model_config = ConfigDict(extra="forbid")

    share: float | None = None  # kernel time per decode step / TPOT p50 (None: not measured)
    kernel_s_per_step: float | None = None  # device time of the kernels of one decode step
    token_s: float | None = None  # the TPOT p50 of the timed repeats it is divided by
    profiled_step_s: float | None = None  # the wall time of a profiled decode step (profiler included)
    steps: int | None = None  # decode steps between the two profiled generations
    method: str = "torch.profiler kernel time over decode steps / TPOT p50"
    why_not: str | None = None  # why it was not measured


def union_seconds(intervals: list[tuple[float, float]]) -> float:
    """Total length of the union of [start, end) intervals (in their own unit, returned as is)."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def device_busy_s(generate: Callable[[], None]) -> tuple[float, float]:
    """(the union of the device intervals of every kernel, copy and memset, wall seconds) while
    `generate()` runs, synchronized at both ends."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        generate()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    spans = [(e.time_range.start, e.time_range.end) for e in prof.events()
             if e.device_type == DeviceType.CUDA and e.time_range.end > e.time_range.start]
    return union_seconds(spans) / 1e6, wall  # the profiler's times are microseconds


def measure(generate: Callable[[int], None], token_s: float | None, device: str) -> GpuBusy:
    """The record for an engine whose `generate(n)` produces n new tokens for one batch here."""
    if not device.startswith("cuda"):
        return GpuBusy(why_not="no GPU: the host does all the work (a CPU run)")
    if not token_s or token_s <= 0:
        return GpuBusy(why_not="no TPOT p50 from the timed repeats to divide by")
    generate(SHORT + STEPS)  # untimed: the profiler's own start-up, the shapes of both calls
    short_busy, short_wall = device_busy_s(lambda: generate(SHORT))
    long_busy, long_wall = device_busy_s(lambda: generate(SHORT + STEPS))
    per_step = max(long_busy - short_busy, 0.0) / STEPS
    return GpuBusy(share=round(per_step / token_s, 4), kernel_s_per_step=per_step, token_s=token_s,
                   profiled_step_s=max(long_wall - short_wall, 0.0) / STEPS, steps=STEPS)
