"""Energy over the timed work only: the NVML energy counter (whole device, millijoules) read
at the edges of each measured window. Warm-up, quality passes, clock checks and engine
start-up fall outside the windows, so joules per output token means what it says.

Scenarios wrap what they time in `with meter.window(key) as w: ...; w.tokens = n`; the
headline record is the "main" key's windows (the samples the stage returns), and every key
(a sweep point, a concurrency) gets its own joules per token."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Callable, Iterator

from llmopt_bench.measure import nvml

# a window's totals as a record keeps them (core/results.EnergyRecord's fields; Total.as_dict):
# joules, seconds, output_tokens, windows, avg_watts, joules_per_output_token (None: not counted)
EnergyFigures = dict[str, float | int | None]


def device_energy_mj() -> int | None:
    """The sum of every visible GPU's counter; None where any GPU has none (or no NVML)."""
    values = [nvml.energy_mj(i) for i in nvml.device_indices()]
    return sum(v for v in values if v is not None) if values and all(v is not None for v in values) else None


@dataclass
class Window:
    tokens: int = 0


@dataclass
class Total:
    joules: float = 0.0
    seconds: float = 0.0
    tokens: int = 0
    windows: int = 0

    def as_dict(self) -> EnergyFigures:
        return {"joules": self.joules, "seconds": self.seconds, "output_tokens": self.tokens, "windows": self.windows,
                "avg_watts": self.joules / self.seconds if self.seconds > 0 else None,
                "joules_per_output_token": self.joules / self.tokens if self.tokens else None}


class TimedMeter:
    """Accumulates energy and time over windows, per key. Without an energy counter it still
    counts time and tokens, and reports no joules."""

    def __init__(self, read_mj: Callable[[], int | None] = device_energy_mj, clock: Callable[[], float] | None = None):
        import time

        self._read = read_mj
        self._clock = clock or time.perf_counter
        self.totals: dict[str, Total] = {}
        self.has_counter = read_mj() is not None
        self.window_seconds = 0.0  # every window's time once, whatever its key (copy() adds none)

    @contextmanager
    def window(self, key: str = "main") -> Iterator[Window]:
        w = Window()
        e0, t0 = self._read(), self._clock()
        yield w
        e1, t1 = self._read(), self._clock()
        total = self.totals.setdefault(key, Total())
        if e0 is not None and e1 is not None:
            total.joules += (e1 - e0) / 1000.0
        total.seconds += t1 - t0
        total.tokens += w.tokens
        total.windows += 1
        self.window_seconds += t1 - t0

    def record(self, key: str = "main") -> EnergyFigures | None:
        """The key's totals as results.EnergyRecord fields; None without a counter or a window."""
        total = self.totals.get(key)
        if not self.has_counter or total is None or total.windows == 0:
            return None
        return total.as_dict()

    def copy(self, key: str, to: str = "main") -> None:
        """Report what `key` measured under `to` as well: a sweep's headline is the point
        whose samples the stage returns, known only once every point is measured."""
        if key in self.totals:
            self.totals[to] = replace(self.totals[key])

    def per_key(self) -> dict[str, EnergyFigures]:
        return {k: t.as_dict() for k, t in self.totals.items()} if self.has_counter else {}
