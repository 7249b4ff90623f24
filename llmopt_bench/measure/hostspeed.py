"""The host-speed index: how fast this host dispatches small PyTorch ops right now, in thousands
of ops a second (kop/s). Eager transformers decode is bound by that work, not by the GPU (one
token of a 7B model is ~1000 small ops, each a Python call, a trip through PyTorch's dispatcher
and a kernel launch): on two H200 hosts of one kind its TPOT was 21 and 43 ms while vLLM's
CUDA-graph decode stayed within 2% (issue 25). The index is taken beside every timed repeat
(measure/conditions.py), so a run on a slower host says so.

The measurement is fixed work, not fixed time: ROUNDS rounds of CALLS forward passes through
LAYERS small modules (a linear, an RMS-norm, a SiLU, a residual add: OPS_PER_LAYER ops, each
dispatched by Python through an nn.Module, as in a transformers decoder layer), on the stage's
own device. The tensors are tiny (4 x 64), so the device's arithmetic is negligible and the
figure is the host's: on CUDA every op is a kernel launch, and each round ends with a
synchronize (a launch queue that ran ahead would flatter the host); on a CPU the same loop
runs the ops in place. The index is the median over the rounds (one slow round, an interrupt,
does not move it); one untimed round first warms the allocator and the dispatcher's caches.
About 0.1-0.4 s on this project's 2-core CPU host; well under a second anywhere.

A stage process that has not started CUDA (vLLM's front end: its engine runs in processes of
its own) is measured on the CPU rather than given a CUDA context it would not otherwise hold
(half a GB of device memory in its peak); `device` says which was measured."""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    import torch

ROUNDS = 9
CALLS = 20
LAYERS = 10
OPS_PER_LAYER = 8  # linear, pow, mean, add, rsqrt, mul, silu, add: see _layer_class
WIDTH = 64


class HostSpeed(BaseModel):
    """One measurement of the index."""

    model_config = ConfigDict(extra="forbid")

    kops: float = Field(description="thousands of small PyTorch ops dispatched a second (median over the rounds)")
    device: str = Field(description="where the ops ran: cuda (launched and synchronized) or cpu")
    rounds: list[float] = Field(default_factory=list, description="each round's kop/s")


def _layer_class() -> type[torch.nn.Module]:
    import torch  # imported by measure() already: here for the class's base and its ops

    functional = torch.nn.functional

    class Layer(torch.nn.Module):
        """A decoder layer's host work in miniature: linear, RMS norm, SiLU, residual add."""

        def __init__(self, weight) -> None:
            super().__init__()
            self.weight = weight

        def forward(self, x):
            h = functional.linear(x, self.weight)
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
            return x + functional.silu(h)

    return Layer


def measurement_device(device: str) -> str:
    """cuda only where this process already holds a CUDA context (see the module's doc)."""
    if not device.startswith("cuda"):
        return "cpu"
    import torch

    return "cuda" if torch.cuda.is_available() and torch.cuda.is_initialized() else "cpu"


def measure(device: str = "cpu", rounds: int = ROUNDS, calls: int = CALLS) -> HostSpeed | None:
    """The index on `device` ("cuda" or "cpu"); None where torch cannot be imported."""
    try:
        import torch
    except ImportError:
        return None
    where = measurement_device(device)
    sync = torch.cuda.synchronize if where == "cuda" else (lambda: None)
    gen = torch.Generator().manual_seed(0)
    weight = (torch.randn(WIDTH, WIDTH, generator=gen) * 0.05).to(where)
    x0 = torch.randn(4, WIDTH, generator=gen).to(where)
    layers = torch.nn.ModuleList([_layer_class()(weight) for _ in range(LAYERS)])

    def one_round(n: int) -> float:
        sync()
        t0 = time.perf_counter()
        with torch.inference_mode():
            for _ in range(n):
                x = x0
                for layer in layers:
                    x = layer(x)
        sync()
        return n * LAYERS * OPS_PER_LAYER / (time.perf_counter() - t0) / 1e3

    one_round(max(1, calls // 5))  # untimed: allocator, dispatcher caches, the first launches
    per_round = [one_round(calls) for _ in range(rounds)]
    return HostSpeed(kops=round(statistics.median(per_round), 2), device=where, rounds=[round(r, 2) for r in per_round])
