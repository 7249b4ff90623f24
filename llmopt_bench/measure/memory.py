"""GPU memory seen from outside the stage: an NVML sampler thread in the parent process that
follows every process of a stage's session (vLLM starts engine processes of its own), and the
check that the card is free again before the next stage starts."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from llmopt_bench.measure import nvml

GIB = 1024**3


@dataclass
class MemoryPeaks:
    nvml: bool
    device_baseline_bytes: dict[int, int] = field(default_factory=dict)
    device_peak_bytes: dict[int, int] = field(default_factory=dict)
    process_peak_bytes: int | None = None  # sum over the stage's processes, all devices
    # per device: with tensor parallelism each GPU holds its own shard and KV cache
    process_peak_by_device: dict[int, int] = field(default_factory=dict)

    def update(self, used: dict[int, int | None], process_bytes: dict[int, dict[int, int]], pids: set[int]) -> None:
        """Fold one sample in: used bytes per device, and per device the bytes of each process
        (only the stage's own pids count)."""
        total = 0
        for i, u in used.items():
            if u is not None and u > self.device_peak_bytes.get(i, 0):
                self.device_peak_bytes[i] = u
            mine = sum(b for pid, b in process_bytes.get(i, {}).items() if pid in pids)
            if mine > self.process_peak_by_device.get(i, 0):
                self.process_peak_by_device[i] = mine
            total += mine
        if total and total > (self.process_peak_bytes or 0):
            self.process_peak_bytes = total

    def as_dict(self) -> dict:
        if not self.nvml:
            return {"nvml": False, "note": "NVML not available: no GPU memory sampled from outside"}
        delta = {
            str(i): self.device_peak_bytes.get(i, 0) - self.device_baseline_bytes.get(i, 0)
            for i in self.device_peak_bytes
        }
        return {
            "nvml": True,
            "device_baseline_bytes": {str(k): v for k, v in self.device_baseline_bytes.items()},
            "device_peak_bytes": {str(k): v for k, v in self.device_peak_bytes.items()},
            "device_peak_delta_bytes": delta,
            "process_peak_bytes": self.process_peak_bytes,
            "process_peak_bytes_by_device": {str(k): v for k, v in self.process_peak_by_device.items()},
        }


class MemorySampler:
    """Samples device memory and the stage's processes' memory every `interval` seconds; `pids()`
    lists the stage's processes (its session's members: procs.tree.session_pids)."""

    def __init__(self, pids: Callable[[], set[int]], interval: float = 0.1, enabled: bool = True):
        self.pids = pids
        self.interval = interval
        self.devices = nvml.device_indices() if enabled else []
        self.error: str | None = None
        self.peaks = MemoryPeaks(nvml=bool(self.devices))
        for i in self.devices:
            used = nvml.used_bytes(i) or 0
            self.peaks.device_baseline_bytes[i] = used
            self.peaks.device_peak_bytes[i] = used
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="llmopt-nvml")

    def __enter__(self) -> "MemorySampler":
        if self.devices:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)

    def _loop(self) -> None:
        try:
            while not self._stop.wait(self.interval):
                pids = self.pids()
                self.peaks.update({i: nvml.used_bytes(i) for i in self.devices},
                                  {i: nvml.process_bytes(i) for i in self.devices}, pids)
        except Exception as e:  # noqa: BLE001 - said, not swallowed: the peaks stop where the sampler died
            import sys

            self.error = f"the NVML sampler stopped: {type(e).__name__}: {e}"
            print(f"warning: {self.error}; the stage's peak memory is what it saw until then", file=sys.stderr)
