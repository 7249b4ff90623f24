"""transformers behind a static batcher, as an engine: the side of a load scenario that
cannot add a request to a running batch. Requests are served under the same dispatcher (the
arrivals, or the closed loop) a continuous engine saw (static_batching.static_drive); each batch
is one padded generate() to completion (engines/hf.generate_batch), with a timestamp per token."""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from llmopt_bench.core.dispatch import Dispatcher, Send
from llmopt_bench.core.records import RequestSample
from llmopt_bench.core.workload import Request
from llmopt_bench.engines.hf import generate as hf
from llmopt_bench.engines.hf.static_batching import load_model, static_drive


@dataclass
class StaticBatcher:
    """The load machine's engine (load/engine.LoadEngine) for the static side: a batch forms
    when batch_size requests wait or the oldest waited timeout_s (static_batching.static_drive)."""

    engine: StaticEngine
    batch_size: int
    timeout_s: float
    progress: Callable[[int], None] | None = None

    def drive(self, dispatcher: Dispatcher) -> None:
        static_drive(self.engine.generate, dispatcher, batch_size=self.batch_size, timeout_s=self.timeout_s,
                     on_batch=self.progress)


class StaticEngine:
    def __init__(self, model: Any, tok: Any, device: str):
        self.model, self.tok, self.device = model, tok, device
        self.pad_id = tok.pad_token_id

    @classmethod
    def load(cls, model_path: str, device: str, dtype: str, attn: str) -> "StaticEngine":
        model, tok = load_model(model_path, device, dtype, attn)
        return cls(model, tok, device)

    def warm(self) -> None:
        """Two tiny batches, untimed: the first generate() pays for kernels and caches."""
        warm = [Request("w0", "w", (1, 2, 3, 4)), Request("w1", "w", (5, 6))]
        hf.generate_batch(self.model, self.pad_id, warm, 4, self.device, streamer=True)

    def batcher(self, batch_size: int, timeout_s: float, progress: Callable[[int], None] | None = None) -> StaticBatcher:
        """This model behind a static batcher of batch_size: an engine the load machine drives."""
        return StaticBatcher(self, batch_size, timeout_s, progress)

    def generate(self, batch: Sequence[Send], b: int) -> list[RequestSample]:
        """One padded batch to completion, to the longest output length it holds. Raises what
        generate() raises (a CUDA OOM at a large batch: the caller records it)."""
        reqs = [Request(s.id, s.prompt_id, s.token_ids) for s in batch]
        samples = hf.generate_batch(self.model, self.pad_id, reqs, max(s.output_len for s in batch), self.device, batch=b)
        return [x.model_copy(update={"repeat": s.repeat}) for s, x in zip(batch, samples)]

    def release_cache(self) -> None:
        """After an OOM: the failed step's tensors went with the exception; hand their blocks back."""
        if self.device == "cuda":
            import torch

            torch.cuda.empty_cache()

    def close(self) -> None:
        """Drop the model and hand its memory back to the device: probes that follow run in other
        processes and must not find it held in this one's allocator cache."""
        if self.model is None:
            return
        self.model = None
        gc.collect()
        self.release_cache()
