"""Waiting until the card is free: an engine's processes gone and each GPU's used memory back near
what it was before the engine started. One wait for every caller (the supervisor between stages,
an engine shut down inside a stage, a server stopped): on the H200 a second vLLM engine failed to
start while the first one's processes still held 90% of the card."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from llmopt_bench.measure import nvml

GIB = 1024**3


def used_by_device() -> dict[int, int]:
    """Each visible GPU's used memory now, in bytes (NVML: never initializes CUDA here); {} without NVML."""
    return {i: nvml.used_bytes(i) or 0 for i in nvml.device_indices()}


@dataclass
class GpuWait:
    """What the wait saw: whether the card was free, how long it took, and what was left."""

    free: bool
    memory_free: bool
    waited_s: float
    processes_left: list[int] = field(default_factory=list)
    used_bytes: dict[int, int] = field(default_factory=dict)


def wait_gpu_free(baseline: dict[int, int], alive: Callable[[], Collection[int]] = tuple, tolerance: int = GIB // 2,
                  limit_s: float = 120.0, poll_s: float = 0.25) -> GpuWait:
    """Block until `alive()` lists no process and every GPU of `baseline` uses at most its baseline
    plus `tolerance`, or `limit_s` has passed. Without NVML only the processes are waited for."""
    start = time.monotonic()
    while True:
        left = sorted(alive())
        used = {i: nvml.used_bytes(i) or 0 for i in baseline}
        memory_free = all(u <= baseline[i] + tolerance for i, u in used.items())
        waited = time.monotonic() - start
        if (not left and memory_free) or waited > limit_s:
            return GpuWait(free=not left and memory_free, memory_free=memory_free, waited_s=round(waited, 3),
                           processes_left=left, used_bytes=used)
        time.sleep(poll_s)
