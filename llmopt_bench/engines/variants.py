"""One variant of an engine (an attention implementation of transformers, an attention backend
of vLLM) as a sweep opens and measures it: what opening it gave, why it could not open, and
what one measured cell gave. The context sweep (scenarios/context_sweep/run.py) drives any
adapter that speaks these types; the adapters live beside their engines (hf_attention.py,
vllm/attention.py), so the types sit here, below the scenario that uses them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal, NamedTuple, Protocol

from llmopt_bench.core.records import RequestSample

# The sweep hands a cell this: it runs the given function (the timed repeats, nothing else)
# inside the cell's timed window, counts the tokens of the samples it returns, and returns them.
Timed = Callable[[Callable[[], list[RequestSample]]], list[RequestSample]]


class CellParams(Protocol):
    """How every cell is measured (the sweep's params, scenarios/context_sweep.ContextSweepParams):
    `warmup` untimed generations, then `repeats` timed ones of a prompt of the cell's context
    plus `decode_tokens` tokens after the first."""

    decode_tokens: int
    repeats: int
    warmup: int


@dataclass(frozen=True)
class Opened:
    """A variant that is ready: the implementation that really runs, as verified (the profiler,
    what the engine reports). A mismatch with the one asked for does not stop the sweep: every
    cell is measured, and every row that would be ok is failed with `mismatch`."""

    effective: str | None
    mismatch: str | None = None


class VariantUnavailable(Exception):
    """A variant that cannot be opened here, in the adapter's words: its rows are `skipped`
    (not possible on this machine: no CUDA, a package missing) or `failed` (it was tried)."""

    def __init__(self, status: Literal["skipped", "failed"], reason: str):
        super().__init__(reason)
        self.status = status
        self.reason = reason


class Measured(NamedTuple):
    """One cell: every timed request's sample (warm-up excluded), and the device's peak memory
    over the cell where the engine can read it in this process."""

    samples: list[RequestSample]
    peak_bytes: int | None = None
