"""Clocks for the hot path: synchronise the device before reading the clock, or the time
measured is the time to enqueue kernels, not to run them."""

from __future__ import annotations

import time
from typing import Callable

now = time.perf_counter


def make_sync(device: str) -> Callable[[], None]:
    """A function that waits for every queued kernel on `device` (a no-op on CPU)."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.synchronize
    return lambda: None
