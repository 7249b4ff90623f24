"""What a load point of a shaped workload adds to its row: the per-turn table of a multi-turn
point (TTFT by turn: a later turn's longer prompt is mostly history a prefix cache can serve),
and the requests' own cached prompt tokens beside the engine's cache counters."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from llmopt_bench.analysis.metrics import ttft
from llmopt_bench.core.records import CacheRecord, RequestSample, TurnRow


def _p50(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _p99(values: Sequence[float]) -> float | None:
    s = sorted(values)
    return s[min(len(s) - 1, int(0.99 * len(s)))] if s else None


def turn_rows(samples: Sequence[RequestSample]) -> list[TurnRow] | None:
    """One row per turn over the complete requests (None: a single-turn point)."""
    by_turn: dict[int, list[RequestSample]] = {}
    for s in samples:
        if s.turn is not None and s.ok:
            by_turn.setdefault(s.turn, []).append(s)
    if not by_turn:
        return None
    rows = []
    for k, group in sorted(by_turn.items()):
        cached = [float(s.cached_tokens) for s in group if s.cached_tokens is not None]
        ttfts = [ttft(s) for s in group]
        rows.append(TurnRow(turn=k, n=len(group), prompt_tokens_p50=_p50([float(s.prompt_tokens) for s in group]),
                            cached_tokens_p50=_p50(cached), ttft_p50_s=_p50(ttfts), ttft_p99_s=_p99(ttfts)))
    return rows


def with_requests(cache: CacheRecord | None, samples: Sequence[RequestSample]) -> CacheRecord | None:
    """The engine's record with the requests' own sums (cached and prompt tokens); where the
    engine has no counters, the requests' sums alone (source "per request")."""
    cached = [s.cached_tokens for s in samples if s.cached_tokens is not None]
    if cache is not None and cache.source == "none" and not cache.kv_samples:
        cache = None  # the engine said nothing: no counters, no gauge
    if cache is None and not cached:
        return None
    base = cache or CacheRecord(source="per request")
    prompt = sum(s.prompt_tokens for s in samples)
    update: dict[str, int | float | None] = {"cached_tokens": sum(cached) if cached else None, "prompt_tokens": prompt}
    if base.hit_rate is None and cached and prompt:
        update["hit_rate"] = round(sum(cached) / prompt, 4)
    return base.model_copy(update=update)
