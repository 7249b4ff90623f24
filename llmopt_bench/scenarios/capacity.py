"""KV-cache capacity: how many sequences of a given context length fit at once.

Part of the load scenario of `continuous-batching` (one vLLM start serves the sweep and this),
recorded under extra["kv_cache"] and extra["capacity"]:

- vLLM: from the engine's KV-cache block count, floor(num_blocks * block_size / context),
  and the engine's own "Maximum concurrency for N tokens per request" log line. The scheduler
  admits at most max_num_seqs at once, recorded next to it.
- transformers: a batch of `context` tokens (prefill, then a few decode steps) in its own
  process, on CUDA from max_batch down by halves until one fits; the largest power of two that
  fit is the answer (the story's "batch 4 to 16"). Batches that ran out of memory at a shorter
  context are not probed again at a longer one (row["ruled_out"]). On CPU there is no OOM boundary to find in reasonable
  time: batch 1 and 2 are probed, and the row says so."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from llmopt_bench.engines.static_batching import run_isolated
from llmopt_bench.engines.vllm_kv import KVCacheRecord

CPU_NOTE = "no OOM boundary on CPU: batch 1 and 2 probed only (host memory, no OOM in reasonable time)"


def vllm_capacity_rows(kv: KVCacheRecord | None, contexts: list[int], max_num_seqs: int | None) -> list[dict[str, Any]]:
    """vLLM's rows: floor(KV-cache tokens / context); the scheduler admits at most max_num_seqs."""
    tokens = kv.tokens if kv else None
    return [{"engine": "vllm", "context": c, "max_batch": tokens // c if tokens else None, "oom_at": None,
             "peak_bytes": kv.bytes if kv else None, "scheduler_limit": max_num_seqs,
             "method": "num_blocks * block_size / context (KV cache preallocated: peak is its size)"} for c in contexts]


def hf_capacity(model_path: str, device: str, dtype: str, attn: str, contexts: list[int], max_batch: int,
                decode_steps: int, timeout_s: float, workdir: Path,
                progress: Callable[[str], None] = lambda m: None,
                probe: Callable[..., dict[str, Any]] = run_isolated) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """transformers rows of extra["capacity"], and every probe's answer. probe(kind, job,
    timeout_s, workdir) runs one batch in its own process (run_isolated)."""
    rows, probes = [], []
    no_fit: tuple[int, int] | None = None  # (batch, context): the smallest batch out of memory so far
    for context in sorted(contexts):
        # CUDA: halve from max_batch until a batch fits (each probe loads the model in a new
        # process, ~15 s for 7B: a big card fits most sizes, so top-down asks fewest). The
        # answer is the same as growing from 1: the largest power of two that fits, and the
        # next one up, which did not. A batch that ran out at a shorter context runs out at a
        # longer one too (more tokens, same model): it is not probed again. CPU never runs
        # out: both small sizes are shown running.
        sizes = [1, 2] if device != "cuda" else sorted((b for b in (2**i for i in range(16)) if b <= max_batch), reverse=True)
        ruled_out = [b for b in sizes if no_fit and b >= no_fit[0]] if device == "cuda" else []
        sizes = [b for b in sizes if b not in ruled_out]
        fit, oom_at, peak, last, oom_ans, tried = None, None, None, None, None, []
        for b in sizes:
            tried.append(b)
            progress(f"capacity: transformers batch {b} x {context} tokens")
            job = {"model_path": model_path, "device": device, "dtype": dtype, "attn_implementation": attn,
                   "batch": b, "context": context, "decode_steps": decode_steps}
            ans = probe("capacity", job, timeout_s, workdir)
            ans.setdefault("batch", b)
            ans.setdefault("context", context)
            probes.append(ans)
            last = ans
            if ans["status"] == "ok":
                fit, peak = b, ans.get("peak_bytes")
                if device == "cuda":
                    break
            elif ans["status"] == "oom":
                oom_at, oom_ans = b, ans
                if device != "cuda":
                    break
            else:  # an error or a timeout is not a capacity answer: stop, and say so
                break
        if oom_at is None and ruled_out:  # the next size up was ruled out, not probed
            oom_at = min(ruled_out)
        row: dict[str, Any] = {"engine": "transformers", "context": context, "max_batch": fit, "oom_at": oom_at,
                               "peak_bytes": peak, "attn_implementation": attn, "probed": tried}
        if ruled_out:
            row["ruled_out"] = {"batches": ruled_out, "because": f"batch {no_fit[0]} ran out of memory at {no_fit[1]} tokens"}
        if oom_at is not None and (no_fit is None or oom_at < no_fit[0]) and oom_at in tried:
            no_fit = (oom_at, context)
        if last and last["status"] not in ("ok", "oom"):
            row["error"] = last.get("reason")
        if device != "cuda":
            row["note"] = CPU_NOTE
        elif oom_at is None and sizes and fit == max(sizes):
            row["note"] = f"no OOM up to max_batch={max_batch}"
        if oom_ans:
            row["memory_at_oom_bytes"] = oom_ans.get("memory_at_oom_bytes")
        rows.append(row)
    return rows, probes
