"""vLLM's attention backends as variants of the context sweep (the vllm-attn stage).

Every backend is a FlashAttention-style kernel over the paged KV cache: FLASH_ATTN
(FlashAttention 2/3), TRITON_ATTN, FLASHINFER. Each is its own engine (attention_backend
forced), verified from the backend vLLM reports, and shut down, its processes and memory gone
(engines/lifecycle.wait_freed), before the next starts. A cell is one request at a time with a
prompt of exactly `context` tokens, a different prompt each repeat, prefix caching off: each
TTFT is a real prefill."""

from __future__ import annotations

from typing import Any, Callable, TypedDict

from llmopt_bench.core.errors import describe
from llmopt_bench.core.records import RequestSample
from llmopt_bench.core.workload import Request, WorkloadConfig, build_requests, fit_length
from llmopt_bench.engines.lifecycle import Freed, device_memory, wait_freed
from llmopt_bench.engines.variants import CellParams, Measured, Opened, Timed, VariantUnavailable
from llmopt_bench.engines.vllm import offline as V
from llmopt_bench.engines.vllm.offline import StartKVCache
from llmopt_bench.engines.vllm.params import VLLMEngineParams, engine_config

CUDA_BACKENDS = ("FLASH_ATTN", "TRITON_ATTN", "FLASHINFER")
NEEDS = {"FLASHINFER": "flashinfer"}  # backend -> the package it needs in vLLM's interpreter


def plan_backends(requested: list[str], device: str, has_module: Callable[[str], bool]) -> tuple[list[str], dict[str, str]]:
    """(backends to start, backend -> why it is skipped). On CPU the CUDA backends are skipped
    and vLLM's own CPU backend ('auto') is measured instead, so the stage still measures something."""
    run, skipped = [], {}
    for b in dict.fromkeys(requested):
        if b != "auto" and device != "cuda":
            skipped[b] = f"{b} is a CUDA backend; vLLM's CPU build has its own (measured as 'auto')"
        elif b in NEEDS and not has_module(NEEDS[b]):
            skipped[b] = f"{NEEDS[b]} not installed in vLLM's interpreter"
        else:
            run.append(b)
    if device != "cuda" and "auto" not in run:
        run.insert(0, "auto")
    return run, skipped


def within_positions(contexts: list[int], max_positions: int | None, decode_tokens: int) -> tuple[list[int], list[str]]:
    """vLLM holds a request's prompt and its new tokens within the model's positions (a longer
    max_model_len is refused, and forced with VLLM_ALLOW_LONG_MAX_MODEL_LEN it reads past the
    rotary table: a device assert on the H200). A context at the limit is measured with that
    many fewer prompt tokens, with a note."""
    if not max_positions:
        return contexts, []
    room = max_positions - (decode_tokens + 1)
    notes = [f"context {c} measured with {room} prompt tokens: prompt and {decode_tokens + 1} new tokens "
             f"must fit the model's {max_positions} positions" for c in contexts if c > room]
    return sorted({min(c, room) for c in contexts}), notes


class EngineRecord(TypedDict, total=False):
    """One engine start of the sweep: the backend asked for and the one vLLM used, its start-up
    phases and KV cache, and its shutdown (or the error that ended its start)."""

    backend: str
    effective: str | None
    load_s: dict[str, float]  # LoadInfo.phases_s
    kv_cache: StartKVCache | None  # LoadInfo.implementation["kv_cache"]
    error: str
    lifecycle: Freed


class VLLMRecords(TypedDict):
    """What the vllm-attn stage's extra keeps of the adapter (ContextSweepExtra)."""

    engines: list[EngineRecord]


class VLLMAttention:
    """vLLM as the sweep's engine: one engine per backend, started, verified, measured, gone."""

    def __init__(self, model_info: Any, params: VLLMEngineParams, cells: CellParams, device: str, *,
                 contexts: list[int], skipped: dict[str, str], log_path: Any = None,
                 progress: Callable[[str], None] = lambda msg: None):
        from transformers import AutoTokenizer

        self.model_info, self.params, self.cells, self.device = model_info, params, cells, device
        self.skipped, self.log_path, self.progress = skipped, log_path, progress
        self.max_len = max(contexts) + cells.decode_tokens + 8
        if model_info.max_position_embeddings:
            self.max_len = min(self.max_len, model_info.max_position_embeddings)
        self.tok = AutoTokenizer.from_pretrained(model_info.path)
        self.llm: Any = None
        self.engine: EngineRecord | None = None  # the open engine's record, until it is closed
        self.engines: list[EngineRecord] = []  # every start: phases, KV cache, lifecycle (or its error)

    def open(self, backend: str, workload: WorkloadConfig) -> Opened:
        if backend in self.skipped:
            raise VariantUnavailable("skipped", self.skipped[backend])
        self.progress(f"starting vLLM with attention backend {backend}")
        # every TTFT a real prefill: prefix caching off whatever the params say
        cfg = engine_config(self.params.model_copy(update={"max_model_len": self.max_len, "enable_prefix_caching": False,
                                                           "attention_backend": None if backend == "auto" else backend}),
                            self.device, None)
        self.before = device_memory(use_torch=False)
        self.engine = {"backend": backend}
        try:
            self.llm, info = V.build_engine(self.model_info.path, cfg, self.log_path)
            effective = info.implementation.get("attention_backend")
            self.engine.update({"effective": effective, "load_s": info.phases_s, "kv_cache": info.implementation.get("kv_cache")})
            if backend != "auto" and effective != backend:
                raise RuntimeError(f"asked for {backend}, vLLM used {effective}")
        except Exception as e:
            self.engine = {"backend": backend, "error": describe(e, 300)}
            raise
        return Opened(effective)

    def requests(self, workload: WorkloadConfig, context: int, n: int, tag: str) -> list[Request]:
        base = build_requests(workload.model_copy(update={"num_prompts": n, "input_len": None}),
                              lambda t: self.tok(t, add_special_tokens=False)["input_ids"], count=n, tag=tag)
        return [Request(id=r.id, prompt_id=r.prompt_id, token_ids=tuple(fit_length(list(r.token_ids), context)))
                for r in base]

    def measure(self, backend: str, context: int, batch: int, workload: WorkloadConfig, timed: Timed) -> Measured:
        """One request in flight (batch is always 1 here), a different prompt for every request."""
        warmup, new_tokens = self.cells.warmup, self.cells.decode_tokens + 1
        reqs = self.requests(workload, context, warmup + self.cells.repeats, f"{backend}-{context}-")
        if warmup:
            V.serve(self.llm, reqs[:warmup], new_tokens, concurrency=1)

        def repeats() -> list[RequestSample]:
            samples: list[RequestSample] = []
            for rep, r in enumerate(reqs[warmup:]):
                samples += V.serve(self.llm, [r], new_tokens, concurrency=1, repeat=rep)
            return samples

        return Measured(timed(repeats))

    def close(self) -> None:
        """Shut the engine down and wait until its processes and memory are gone."""
        if self.engine is None:
            return
        llm, self.llm = self.llm, None
        try:
            V.shutdown(llm)
        finally:
            del llm
            self.engine["lifecycle"] = wait_freed(self.before, use_torch=False)
            self.engines.append(self.engine)
            self.engine = None

    def records(self) -> VLLMRecords:
        return {"engines": self.engines}
