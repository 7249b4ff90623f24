"""vLLM's prefix cache and KV-cache use over a load point, read from the engine's own counters
(names identical in vLLM 0.26 and 0.32; docs/workloads.md):

    vllm:prefix_cache_queries   prompt tokens looked up in the prefix cache (a counter)
    vllm:prefix_cache_hits      of them, found there (full blocks only, never a prompt's last token)
    vllm:num_preemptions        requests preempted (their KV blocks taken back)
    vllm:kv_cache_usage_perc    fraction of KV blocks held by running requests, 0..1 (a gauge: cached
                                blocks of finished requests are free, so it shows the working set)

Offline, `llm.get_metrics()` reads them (only when the engine was built with
disable_log_stats=False); a server publishes them on /metrics with `_total` on the counters,
read with the server's clock (client/server_clock.ServerWatch; server_counters). A point's
figures are the counters' differences between its start and its end, and the gauge sampled
during it (CacheWatch offline); each engine's label is summed (data parallel has several)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from llmopt_bench.core.dispatch import Dispatcher, Send
from llmopt_bench.core.records import CacheRecord, RequestSample

COUNTERS = {"queries": "vllm:prefix_cache_queries", "hits": "vllm:prefix_cache_hits", "preemptions": "vllm:num_preemptions"}
KV_GAUGE = "vllm:kv_cache_usage_perc"
Reader = Callable[[], dict[str, float] | None]  # counters and the gauge now; None: the engine does not say


def offline_reader(llm: Any) -> Reader:
    """The offline engine's counters, through llm.get_metrics()."""
    def read() -> dict[str, float] | None:
        try:
            metrics = llm.get_metrics()
        except Exception:  # noqa: BLE001 - "Stat logging disabled": an engine built without stats cannot say
            return None
        out: dict[str, float] = {}
        for m in metrics:
            for key, name in COUNTERS.items():
                if m.name == name:
                    out[key] = out.get(key, 0.0) + float(m.value)
            if m.name == KV_GAUGE:
                out["kv"] = max(out.get("kv", 0.0), float(m.value))
        return out or None
    return read


def server_counters(snap: Any) -> dict[str, float] | None:
    """A server's /metrics as read by client/server_clock.parse (prometheus_client's parser:
    counters summed over engines, `_created` left out) -> the counters under offline_reader's names."""
    if snap is None:
        return None
    c = snap.counters
    return {key: c[figure] for figure, key in (("prefix_queries", "queries"), ("prefix_hits", "hits"), ("preemptions", "preemptions"))
            if figure in c} or None


class CacheWatch:
    """One point's cache figures offline: the counters at its start and end, the gauge every
    interval_s in between (tick() from the engine's loop: Watched)."""

    def __init__(self, read: Reader, source: str, interval_s: float = 0.25, reset: bool = False):
        self.read, self.source, self.interval_s, self.reset = read, source, interval_s, reset
        self.before = read()
        self.kv: list[float] = []
        self._last = -1e18

    def tick(self, t: float) -> None:
        if t - self._last >= self.interval_s:
            self._last = t
            got = self.read()
            if got and "kv" in got:
                self.kv.append(got["kv"])

    def stop(self) -> CacheRecord:
        after = self.read()
        if after and "kv" in after:
            self.kv.append(after["kv"])
        return cache_record(self.source, self.before, after, self.kv, self.reset)


def cache_record(source: str, before: dict[str, float] | None, after: dict[str, float] | None, kv: Sequence[float],
                 reset: bool = False) -> CacheRecord:
    """The point's record: the counters' differences, the gauge's peak and mean (the requests' own
    cached tokens are the load machine's to add: load/turns.with_requests)."""
    delta = {k: int(after[k] - (before or {}).get(k, 0.0)) for k in COUNTERS if after and k in after}
    queries, hits = delta.get("queries"), delta.get("hits")
    return CacheRecord(source=source if delta else "none", queries=queries, hits=hits,
                       hit_rate=round(hits / queries, 4) if queries and hits is not None else None,
                       kv_usage_peak=max(kv) if kv else None, kv_usage_mean=round(sum(kv) / len(kv), 5) if kv else None,
                       kv_samples=len(kv), preemptions=delta.get("preemptions"), reset=reset)


class Watched:
    """A dispatcher whose due() also ticks a CacheWatch: the offline step loop samples the gauge
    as it goes, at most every interval_s, without knowing it does."""

    def __init__(self, inner: Dispatcher, watch: CacheWatch):
        self.inner, self.watch = inner, watch

    def due(self, t: float) -> list[Send]:
        self.watch.tick(t)
        return self.inner.due(t)

    def wake_at(self) -> float | None:
        return self.inner.wake_at()

    def done(self, send: Send, sample: RequestSample, t: float | None = None, answer_ids: Sequence[int] | None = None) -> None:
        self.inner.done(send, sample, t, answer_ids)

    def finished(self) -> bool:
        return self.inner.finished()
