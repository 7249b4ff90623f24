"""transformers behind a static batcher, as an engine: the side of a load scenario that
cannot add a request to a running batch. Requests are served with the arrivals (or the closed
loop) a continuous engine saw (static_batching.static_serve); each batch is one padded
generate() to completion (engines/hf.generate_batch), with a timestamp per token."""

from __future__ import annotations

import gc
from typing import Any, Callable, Sequence

from llmopt_bench.core.records import RequestSample
from llmopt_bench.core.workload import Request
from llmopt_bench.engines import hf
from llmopt_bench.engines.static_batching import load_model, static_serve


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

    def serve(self, requests: Sequence[Request], max_new_tokens: int, *, batch_size: int, timeout_s: float,
              arrivals: Sequence[float] | None, concurrency: int | None,
              progress: Callable[[int], None] | None = None) -> list[RequestSample]:
        """A batch forms when batch_size requests wait or the oldest has waited timeout_s.
        Raises what generate() raises (a CUDA OOM at a large batch: the caller records it)."""
        def gen(batch: Sequence[Request], b: int) -> list[RequestSample]:
            return hf.generate_batch(self.model, self.pad_id, batch, max_new_tokens, self.device, batch=b)

        return static_serve(gen, requests, batch_size=batch_size, timeout_s=timeout_s, arrivals=arrivals,
                            concurrency=concurrency, on_batch=progress)

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
