"""vLLM's KV cache as a record: blocks, tokens, bytes (from the model's shape and the cache
dtype), and how many sequences of a context length it holds at once. Read from a running
engine and its log (vLLM's engine core runs in its own process: its decisions reach us only
through the log, read by engines/vllm/startlog.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llmopt_bench.core.records import StrictModel
from llmopt_bench.engines.vllm.startlog import read_start

DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}


class KVCacheRecord(StrictModel):
    num_blocks: int | None = None
    block_size: int | None = None
    tokens: int | None = None
    kv_dtype: str | None = None
    bytes_per_token: int | None = None
    bytes: int | None = None
    available_bytes_logged: int | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_concurrency: float | None = None
    max_concurrency_at_tokens: int | None = None
    max_concurrency_source: str | None = None


def kv_bytes_per_token(model: Any, dtype: str) -> int | None:
    """K and V of every layer for one token: 2 * layers * kv_heads * head_dim * dtype bytes."""
    if not (model.num_layers and model.num_kv_heads and model.head_dim):
        return None
    return 2 * model.num_layers * model.num_kv_heads * model.head_dim * DTYPE_BYTES.get(dtype, 2)


def kv_cache_record(llm: Any, model: Any, dtype: str, log_path: Path | None,
                    max_num_seqs: int | None = None) -> KVCacheRecord | None:
    """The running engine's KV cache; None where it reports no GPU/CPU blocks."""
    cfg = llm.llm_engine.vllm_config
    cache = cfg.cache_config
    if not cache.num_gpu_blocks:
        return None
    kv_dtype = cache.cache_dtype if getattr(cache, "cache_dtype", "auto") not in (None, "auto") else dtype
    per_token = kv_bytes_per_token(model, kv_dtype)
    tokens = cache.num_gpu_blocks * cache.block_size
    start = read_start(log_path.read_text(errors="replace") if log_path and log_path.is_file() else "")
    return KVCacheRecord(
        num_blocks=cache.num_gpu_blocks, block_size=cache.block_size, tokens=tokens, kv_dtype=kv_dtype,
        bytes_per_token=per_token, bytes=tokens * per_token if per_token else None,
        available_bytes_logged=start.available_kv_bytes, max_model_len=cfg.model_config.max_model_len,
        max_num_seqs=max_num_seqs, max_concurrency=start.max_concurrency, max_concurrency_at_tokens=start.max_concurrency_at_tokens,
        max_concurrency_source="engine log line 'Maximum concurrency for N tokens per request'" if start.max_concurrency else None)


def kv_line(kv: KVCacheRecord) -> str:
    from llmopt_bench.core.fmt import GB, num

    return (f"KV cache: {num(kv.num_blocks)} blocks of {num(kv.block_size)} tokens ({num(kv.tokens)} tokens, "
            f"{kv.kv_dtype or '?'}), {num((kv.bytes or 0) / GB or None)} GB, max concurrency {num(kv.max_concurrency)}"
            + (f" at {kv.max_concurrency_at_tokens} tokens a request" if kv.max_concurrency_at_tokens else ""))
