"""KV-cache capacity: how many sequences of a given context length fit at once.

Part of the load scenario of `continuous-batching` (one vLLM start serves the sweep and this),
recorded under extra["kv_cache"] and extra["capacity"]:

- vLLM: from the engine's KV-cache block count, floor(num_blocks * block_size / context),
  and the engine's own "Maximum concurrency for N tokens per request" log line. The scheduler
  admits at most max_num_seqs at once, recorded next to it.
- transformers: a batch of `context` tokens (prefill, then a few decode steps) as a probe (the
  stage's probe worker: one model load for every probe; an OOM ends the probe only), on CUDA
  from max_batch down by halves until one fits; the largest power of two that fit is the
  answer (the story's "batch 4 to 16"). Batches that ran out of memory at a shorter context
  are not probed again at a longer one (row["ruled_out"]). On CPU there is no OOM boundary to
  find in reasonable time: batch 1 and 2 are probed, and the row says so."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from typing_extensions import NotRequired, TypedDict

from llmopt_bench.core.freeform import Json
from llmopt_bench.engines.hf.static_batching import run_isolated
from llmopt_bench.engines.vllm.kv import KVCacheRecord
from llmopt_bench.scenarios.batching.record import RuledOut

CPU_NOTE = "no OOM boundary on CPU: batch 1 and 2 probed only (host memory, no OOM in reasonable time)"


class VLLMCapacity(TypedDict):
    """vLLM's capacity at a context, from its KV cache (a CapacityRow)."""

    engine: str
    context: int
    max_batch: int | None
    oom_at: None  # the KV cache is preallocated: no OOM to find
    peak_bytes: int | None
    scheduler_limit: int | None
    method: str


class ProbedCapacity(TypedDict):
    """transformers' capacity at a context, as its probes found it (a CapacityRow)."""

    engine: str
    context: int
    max_batch: int | None
    oom_at: int | None
    peak_bytes: int | None
    attn_implementation: str
    probed: list[int]
    ruled_out: NotRequired[RuledOut]
    error: NotRequired[str | None]
    note: NotRequired[str]
    memory_at_oom_bytes: NotRequired[int | None]


def vllm_capacity_rows(kv: KVCacheRecord | None, contexts: list[int], max_num_seqs: int | None) -> list[VLLMCapacity]:
    """vLLM's rows: floor(KV-cache tokens / context); the scheduler admits at most max_num_seqs."""
    tokens = kv.tokens if kv else None
    return [{"engine": "vllm", "context": c, "max_batch": tokens // c if tokens else None, "oom_at": None,
             "peak_bytes": kv.bytes if kv else None, "scheduler_limit": max_num_seqs,
             "method": "num_blocks * block_size / context (KV cache preallocated: peak is its size)"} for c in contexts]


@dataclass
class SizeSearch:
    """What probing one context's batch sizes found."""

    fit: int | None = None  # the batch that fit (CUDA: the largest; CPU: the last)
    oom_at: int | None = None  # the batch that ran out of memory
    peak: int | None = None  # the fitting batch's peak memory (bytes)
    last: Json | None = None  # the last probe's answer
    oom_ans: Json | None = None  # the answer of the batch that ran out
    tried: list[int] = field(default_factory=list)


def search_sizes(sizes: list[int], cuda: bool, ask: Callable[[int], Json]) -> SizeSearch:
    """Probe batch sizes in order until the answer is known: on CUDA (top down) the first that
    fits; on CPU (bottom up) until one runs out. An error or a timeout is no capacity answer:
    the search stops there, and the row says so."""
    got = SizeSearch()
    for b in sizes:
        got.tried.append(b)
        ans = got.last = ask(b)
        if ans["status"] == "ok":
            got.fit, got.peak = b, ans.get("peak_bytes")
            if cuda:
                break
        elif ans["status"] == "oom":
            got.oom_at, got.oom_ans = b, ans
            if not cuda:
                break
        else:
            break
    return got


def capacity_row(context: int, attn: str, got: SizeSearch, ruled_out: list[int], no_fit: tuple[int, int] | None,
                 cuda: bool, sizes: list[int], max_batch: int) -> ProbedCapacity:
    oom_at = got.oom_at if got.oom_at is not None or not ruled_out else min(ruled_out)  # ruled out: not probed
    row: ProbedCapacity = {"engine": "transformers", "context": context, "max_batch": got.fit, "oom_at": oom_at,
                   "peak_bytes": got.peak, "attn_implementation": attn, "probed": got.tried}
    if ruled_out and no_fit:
        row["ruled_out"] = {"batches": ruled_out, "because": f"batch {no_fit[0]} ran out of memory at {no_fit[1]} tokens"}
    if got.last and got.last["status"] not in ("ok", "oom"):
        row["error"] = got.last.get("reason")
    if not cuda:
        row["note"] = CPU_NOTE
    elif oom_at is None and sizes and got.fit == max(sizes):
        row["note"] = f"no OOM up to max_batch={max_batch}"
    if got.oom_ans:
        row["memory_at_oom_bytes"] = got.oom_ans.get("memory_at_oom_bytes")
    return row


def hf_capacity(model_path: str, device: str, dtype: str, attn: str, contexts: list[int], max_batch: int,
                decode_steps: int, timeout_s: float, workdir: Path,
                progress: Callable[[str], None] = lambda m: None,
                probe: Callable[..., Json] = run_isolated) -> tuple[list[ProbedCapacity], list[Json]]:
    """transformers rows of extra["capacity"], and every probe's answer. probe(kind, job,
    timeout_s, workdir) runs one batch: the stage's ModelWorker, or run_isolated (a process each).

    CUDA: halve from max_batch until a batch fits (a big card fits most sizes, so top-down asks
    fewest; each probe is a prefill of batch x context, and after an OOM a fresh worker may have
    to load the model again, ~24 s for 7B). The answer is the same
    as growing from 1: the largest power of two that fits, and the next one up, which did not.
    A batch that ran out at a shorter context runs out at a longer one too (more tokens, same
    model): it is not probed again. CPU never runs out: both small sizes are shown running."""
    rows, probes = [], []
    no_fit: tuple[int, int] | None = None  # (batch, context): the smallest batch out of memory so far
    cuda = device == "cuda"
    for context in sorted(contexts):
        sizes = sorted((b for b in (2**i for i in range(16)) if b <= max_batch), reverse=True) if cuda else [1, 2]
        ruled_out = [b for b in sizes if no_fit and b >= no_fit[0]] if cuda else []
        sizes = [b for b in sizes if b not in ruled_out]

        def ask(b: int, context: int = context) -> Json:
            progress(f"capacity: transformers batch {b} x {context} tokens")
            job = {"model_path": model_path, "device": device, "dtype": dtype, "attn_implementation": attn,
                   "batch": b, "context": context, "decode_steps": decode_steps}
            ans = probe("capacity", job, timeout_s, workdir)
            ans.setdefault("batch", b)
            ans.setdefault("context", context)
            probes.append(ans)
            return ans

        got = search_sizes(sizes, cuda, ask)
        row = capacity_row(context, attn, got, ruled_out, no_fit, cuda, sizes, max_batch)
        if row["oom_at"] is not None and (no_fit is None or row["oom_at"] < no_fit[0]) and row["oom_at"] in got.tried:
            no_fit = (row["oom_at"], context)
        rows.append(row)
    return rows, probes
