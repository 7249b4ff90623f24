"""The client watching itself over a load point: could it time what the server did?

A client's clock is only as good as the client's own punctuality. Per point it measures:
- the event loop's lag: a task that sleeps LAG_INTERVAL_S and notes how late it woke (beyond
  the loop's 1 ms timer granularity): a process the host kept off the CPU, or a loop blocked by
  a sampler thread's GIL or by its own work, wakes late;
- the read delay: how long after the kernel received a token (client/rx_clock.py) the client
  read it; the token keeps the kernel's time, so a late read costs nothing but is reported;
- the send overhead: from the clock's start to the request's last byte handed to the kernel
  (the client's own share of every TTFT, as in vllm bench serve);
- bursts: a request whose token-carrying chunks came a median BURST_GAP_S or less apart had
  its tokens arrive in one burst: faster than any server streams one request, as fast as the
  client parses chunks already in its buffer. burst_share_read counts them on the process's
  reads; burst_share on the times the samples keep, where the client made them: most of them
  were read with other data segments that had piled up unread (client/rx_clock.py: while the
  client is away the kernel merges queued segments, and the merged one keeps only the last one's
  receive time), or no kernel time tells the client's lateness from a server that sends in
  bursts. edge_lost_share: requests whose first or last token lost its own receive time so,
  by over EDGE_SHARE_MAX of its TTFT or of the answer's span (their TTFT or TPOT is the client's).

could_not_time() judges a point: over BURST_SHARE_MAX of its requests with their first or last
token lost (kernel times) or in bursts (the process's clock), or, on the process's clock, a loop
lagging by over a tenth of its TTFT: its latencies are the client's, not the server's. With
kernel times and bursts in the middle of answers only, its ITL is lost, its TTFT and TPOT hold
(the first and last tokens keep their times, or near enough)."""

from __future__ import annotations

import asyncio
import statistics
from dataclasses import asdict, dataclass, field, replace

from llmopt_bench.core.distribution import percentile
from llmopt_bench.core.freeform import Json

LAG_INTERVAL_S = 0.02  # the lag monitor's tick: 50 wake-ups a second (at 5 ms its 200 cost 13% of a concurrency-1 client's CPU on 2 busy cores)
TIMER_GRANULARITY_S = 0.001  # asyncio's epoll timeout is whole milliseconds, rounded up: lateness within it is not lag
BURST_GAP_S = 50e-6  # 20x below a 1 ms token cadence (the fastest per-request streams), 5-15x above a chunk's parse time
BURST_MIN_CHUNKS = 4  # fewer chunks say nothing about a cadence
BURST_SHARE_MAX = 0.10  # a point with more of its requests in bursts was not timed
LATE_READ_S = 0.001  # where segment counts are unknown: a read this late took piled-up segments (prompt: p99 0.8-1 ms)
LAG_SHARE_MAX = 0.10  # loop lag p99 above this share of TTFT p50: the TTFT is the client's as much as the server's
EDGE_SHARE_MAX = 0.10  # a first or last token whose arrival is known within this share of its TTFT or span keeps it
KERNEL_SHARE_MIN = 0.95  # chunks the kernel clock followed: at least this share, or the point counts as timed by the process


@dataclass
class RequestClock:
    """One request's token-carrying chunks: when timed (their own kernel receive time where they
    have one, else their read), when read, and what the kernel clock said of them."""

    timed: list[float] = field(default_factory=list)
    read: list[float] = field(default_factory=list)
    stamped: list[bool] = field(default_factory=list)  # the chunk kept its own kernel receive time
    piled: list[bool] = field(default_factory=list)  # its read took segments that had piled up unread
    matched: int = 0  # chunks matched to an end the kernel clock noted (none: the stream has no kernel clock)
    since: list[float | None] = field(default_factory=list)  # a chunk without its own time arrived after this
    sent: float | None = None  # the request's clock start
    send_s: float | None = None  # clock start to the request's last byte handed to the kernel
    request_id: str | None = None

    def add(self, read: float, matched: bool, stamp: float | None = None, exact: bool = True,
            segments: int | None = None, since: float | None = None) -> None:
        """A chunk read at `read`; `matched`: the kernel clock noted its end, received at `stamp`
        (its own time if `exact`, else a later segment's: it arrived after `since` and by then;
        None: no time) in a read that took `segments` data segments. Times never go back within
        a request: a chunk read on the client's clock after one timed by the kernel keeps the later."""
        t = read if stamp is None else stamp
        self.timed.append(max(t, self.timed[-1]) if self.timed else t)
        self.read.append(read)
        self.since.append(since)
        self.stamped.append(stamp is not None and exact)
        self.matched += matched
        if segments is not None:
            self.piled.append(matched and segments > 1)
        else:  # segment counts unknown: a late read took what had piled up
            self.piled.append(stamp is not None and read - stamp > LATE_READ_S)

    def trust_last(self) -> None:
        """The last chunk's time is its read's last segment's, which carried only the answer's
        tokenless tail (usage, [DONE]) written right behind it: taken as its own."""
        if self.stamped and not self.stamped[-1] and self.timed[-1] != self.read[-1]:
            self.stamped[-1], self.piled[-1] = True, False

    def shifted(self, d: float) -> RequestClock:
        """This clock's times on a clock `d` seconds ahead (a worker on another host's records)."""
        def move(xs: list[float]) -> list[float]:
            return [x + d for x in xs]
        return replace(self, timed=move(self.timed), read=move(self.read), since=[x + d if x is not None else None for x in self.since],
                       sent=self.sent + d if self.sent is not None else None)

    @property
    def read_delays(self) -> list[float]:
        """Read minus own kernel receive time, for the chunks that have one."""
        return [r - t for t, r, k in zip(self.timed, self.read, self.stamped) if k]


@dataclass(frozen=True)
class ClientHealth:
    """The client's punctuality over one point (docs/serving.md, "The client's own clock");
    a serving row keeps it whole (scenarios/serving/record.LoadRow.client)."""

    requests: int
    chunks: int
    kernel_clock_share: float | None  # token-carrying chunks whose stream the kernel clock followed
    kernel_timed_share: float | None  # token-carrying chunks that kept their own kernel receive time
    read_delay_p50_s: float | None
    read_delay_p99_s: float | None
    read_delay_max_s: float | None
    send_p50_s: float | None
    send_p99_s: float | None
    loop_lag_p50_s: float | None
    loop_lag_p99_s: float | None
    loop_lag_max_s: float | None
    loop_lag_samples: int
    burst_share_read: float | None  # requests whose chunks the process read in one burst
    burst_share: float | None  # requests whose chunks, as timed, came in one burst the client may have caused
    edge_lost_share: float | None  # requests whose first or last token lost its own receive time (TTFT, TPOT)
    # the send delay (sent minus due) of the requests this client sent: its own share of the schedule's lateness
    send_delay_p50_s: float | None = None
    send_delay_p99_s: float | None = None
    send_delay_max_s: float | None = None
    # a client of several processes (client/workers.py, client/cluster.py): who this one is, its
    # clock's offset from the parent's (a Ray actor's, measured; its records moved by it), and,
    # for the whole client, every worker's own health (each judged as one loop: could_not_time)
    worker: str | None = None
    clock_offset_s: float | None = None  # applied to its records
    clock_offset_measured_s: float | None = None  # as read (0 applied on this host's one monotonic clock)
    clock_offset_within_s: float | None = None  # half the round trip of that reading
    start_skew_s: float | None = None  # how late its part started after the agreed instant
    workers: list[ClientHealth] | None = None

    def as_dict(self) -> Json:  # written out as it is: `llmopt check peer`'s rounds file
        return asdict(self)


class LoopLag:
    """A task that wakes every LAG_INTERVAL_S and keeps how late it woke."""

    def __init__(self, interval_s: float = LAG_INTERVAL_S):
        self.interval_s = interval_s
        self.samples: list[float] = []
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            t = loop.time()
            await asyncio.sleep(self.interval_s)
            self.samples.append(max(0.0, loop.time() - t - self.interval_s - TIMER_GRANULARITY_S))


def bursty(times: list[float]) -> bool:
    """Whether chunks at these times came in one burst (their median gap under BURST_GAP_S)."""
    if len(times) < BURST_MIN_CHUNKS:
        return False
    return statistics.median(b - a for a, b in zip(times, times[1:])) <= BURST_GAP_S


def client_burst(clock: RequestClock) -> bool:
    """Whether the request's tokens, as timed, came in one burst that the client may have made:
    most of them read with segments that had piled up unread, or no kernel clock to tell its
    lateness from a server's bursts."""
    if not bursty(clock.timed):
        return False
    if clock.matched < len(clock.timed):
        return True
    return sum(clock.piled) * 2 >= len(clock.piled)


def edge_lost(clock: RequestClock) -> bool:
    """Whether the request's first or last token lost its own receive time, read with others that
    had piled up (it has only a later segment's, or the first shares the next one's: the kernel
    merged them, and a merged run keeps its last segment's time, so the last token's holds), by
    more than EDGE_SHARE_MAX of what it bounds: the first one's TTFT, the last one's span from the
    first (a last token read one token late bounds its TPOT within 1/(tokens - 1))."""
    timed = clock.timed
    if not timed or clock.matched < len(timed):
        return False

    def vague(i: int, span: float) -> bool:
        since = clock.since[i]
        return since is None or timed[i] - max(since, clock.sent or since) > EDGE_SHARE_MAX * span

    first = clock.piled[0] and (not clock.stamped[0] or (len(timed) > 1 and timed[1] - timed[0] <= 1e-6))
    if first and vague(0, timed[0] - (clock.sent if clock.sent is not None else timed[0])):
        return True
    return clock.piled[-1] and not clock.stamped[-1] and len(timed) > 1 and vague(-1, timed[-1] - timed[0])


def _p(values: list[float], q: float) -> float | None:
    return percentile(values, q) if values else None


def health_of(clocks: list[RequestClock], lag: list[float], send_delays: list[float] | None = None, *,
              worker: str | None = None, clock_offset_s: float | None = None,
              clock_offset_measured: tuple[float, float] | None = None, start_skew_s: float | None = None,
              workers: list[ClientHealth] | None = None) -> ClientHealth:
    chunks = sum(len(c.timed) for c in clocks)
    delays = [d for c in clocks for d in c.read_delays]
    sends = [c.send_s for c in clocks if c.send_s is not None]
    judged = [c for c in clocks if len(c.timed) >= BURST_MIN_CHUNKS]
    return ClientHealth(
        requests=len(clocks), chunks=chunks,
        kernel_clock_share=sum(c.matched for c in clocks) / chunks if chunks else None,
        kernel_timed_share=len(delays) / chunks if chunks else None,
        read_delay_p50_s=_p(delays, 50), read_delay_p99_s=_p(delays, 99), read_delay_max_s=max(delays) if delays else None,
        send_p50_s=_p(sends, 50), send_p99_s=_p(sends, 99),
        loop_lag_p50_s=_p(lag, 50), loop_lag_p99_s=_p(lag, 99), loop_lag_max_s=max(lag) if lag else None,
        loop_lag_samples=len(lag),
        burst_share_read=sum(bursty(c.read) for c in judged) / len(judged) if judged else None,
        burst_share=sum(client_burst(c) for c in judged) / len(judged) if judged else None,
        edge_lost_share=sum(edge_lost(c) for c in clocks) / len(clocks) if clocks else None,
        send_delay_p50_s=_p(send_delays or [], 50), send_delay_p99_s=_p(send_delays or [], 99),
        send_delay_max_s=max(send_delays) if send_delays else None,
        worker=worker, clock_offset_s=clock_offset_s,
        clock_offset_measured_s=clock_offset_measured[0] if clock_offset_measured else None,
        clock_offset_within_s=clock_offset_measured[1] if clock_offset_measured else None,
        start_skew_s=start_skew_s, workers=workers)


def could_not_time(health: ClientHealth | None, ttft_p50_s: float | None) -> str | None:
    """Why the point's latencies (or its ITL alone) are the client's rather than the server's;
    None when the client could time them. A client of several processes is judged as a whole
    and each worker as one loop: one worker that could not time its requests is enough."""
    if health is None or not health.chunks:
        return None
    lost, itl = _reasons(health, ttft_p50_s)
    for w in health.workers or []:
        if not w.chunks:
            continue
        w_lost, w_itl = _reasons(w, ttft_p50_s)
        lost += [f"worker {w.worker}: {r}" for r in w_lost]
        itl += [f"worker {w.worker}: {r}" for r in w_itl]
    if lost:
        head = "the client could not time this point: " + "; ".join(lost)
    elif itl:
        head = ("the client could not time this point's ITL (its TTFT and TPOT hold: first and last tokens kept their "
                "kernel receive times): " + "; ".join(itl) + ", read with segments piled up unread")
    else:
        return None
    return head + (". Give the client a CPU of its own: fewer busy processes on the host, or the client in the "
                   "server's session (one scheduling group)" + (", or more client processes (client_workers)"
                                                                if health.workers is None else ""))


def _reasons(health: ClientHealth, ttft_p50_s: float | None) -> tuple[list[str], list[str]]:
    """What one client (or one worker) lost: its latencies, or its ITL alone."""
    kernel = (health.kernel_clock_share or 0.0) >= KERNEL_SHARE_MIN
    bursts = health.burst_share is not None and health.burst_share > BURST_SHARE_MAX
    burst = (f"{health.burst_share or 0:.0%} of its requests' tokens came in one burst (chunks a median "
             f"{BURST_GAP_S * 1e6:.0f} us apart or less; limit {BURST_SHARE_MAX:.0%})")
    lost: list[str] = []
    itl: list[str] = []
    if kernel:
        if (health.edge_lost_share or 0.0) > BURST_SHARE_MAX:
            lost.append(f"{health.edge_lost_share:.0%} of its requests' first or last token was read with others piled "
                        f"up unread and lost its own receive time (limit {BURST_SHARE_MAX:.0%})")
        if bursts:
            itl.append(burst)
    else:
        if bursts:
            lost.append(burst + ", and with no kernel receive times it cannot tell its own lateness from a server that "
                                "sends so")
        lag = health.loop_lag_p99_s
        if lag is not None and ttft_p50_s and lag > LAG_SHARE_MAX * ttft_p50_s:
            lost.append(f"its tokens were timed on its own clock (no kernel receive times) and its event loop ran "
                        f"{lag * 1e3:.3g} ms late (p99), over {LAG_SHARE_MAX:.0%} of the {ttft_p50_s * 1e3:.3g} ms TTFT p50")
    return lost, itl
