"""An engine's processes and the device memory they hold: what is running below this process,
and waiting until an engine that was shut down is really gone (on the H200 a second vLLM
engine failed to start while the first one's processes still held 90% of the card)."""

from __future__ import annotations

import os
import time

from pydantic import ConfigDict, with_config
from typing_extensions import TypedDict  # pydantic validates a typing.TypedDict only from Python 3.12

from llmopt_bench.procs.gpu import GIB, used_by_device, wait_gpu_free
from llmopt_bench.procs.tree import cmdline, descendants


def release_cached_memory() -> None:
    """Collect what Python still holds, then give the CUDA caching allocator's free blocks back
    to the driver (without CUDA: the collection only), so the card reads as free again."""
    import gc

    gc.collect()
    try:
        import torch
    except ImportError:
        return
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def rss(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            pass
    return total


@with_config(ConfigDict(extra="allow"))  # records keep a key a later probe adds (batching's run.json holds these)
class DeviceMemory(TypedDict, total=False):
    """Device memory at one moment: each part only where it could be read."""

    nvml_used_bytes: int  # NVML: every GPU's used memory, summed
    nvml_used_by_device: dict[str, int]  # NVML: by device index
    free_bytes: int  # torch.cuda.mem_get_info, once CUDA is up in this process
    total_bytes: int
    used_bytes: int


@with_config(ConfigDict(extra="allow"))
class Freed(TypedDict):
    """wait_freed's record: the engine's processes and the device memory after its shutdown."""

    after_shutdown: DeviceMemory
    processes_after_shutdown: int
    t_freed: float  # perf_counter when the wait ended
    left_after_shutdown: list[str]  # the command lines of the processes still alive
    freed: bool
    wait_s: float


def device_memory(use_torch: bool) -> DeviceMemory:
    """Device memory now: NVML (never initializes CUDA here, so vLLM may still fork) and,
    once CUDA is up in this process, torch.cuda.mem_get_info."""
    out: DeviceMemory = {}
    by_device = used_by_device()
    if by_device:
        out["nvml_used_bytes"] = sum(by_device.values())
        out["nvml_used_by_device"] = {str(i): b for i, b in by_device.items()}
    if use_torch:
        import torch

        if torch.cuda.is_available():
            free, total = torch.cuda.mem_get_info()
            out.update({"free_bytes": int(free), "total_bytes": int(total), "used_bytes": int(total - free)})
    return out


def wait_freed(before: DeviceMemory, use_torch: bool, limit_s: float = 60.0) -> Freed:
    """Wait until the engine's processes are gone and the device is back near `before`
    (device_memory() taken before the engine started); this process keeps its CUDA context
    (~0.5 GiB), so within 1 GiB of the baseline is free."""
    baseline = {int(i): b for i, b in before.get("nvml_used_by_device", {}).items()}
    seen = wait_gpu_free(baseline, alive=descendants, tolerance=GIB, limit_s=limit_s, poll_s=0.5)
    return {"after_shutdown": device_memory(use_torch=use_torch), "processes_after_shutdown": len(seen.processes_left),
            "t_freed": time.perf_counter(), "left_after_shutdown": [cmdline(pid)[:120] for pid in seen.processes_left],
            "freed": seen.free, "wait_s": seen.waited_s}
