"""Pre-spawned workers (--prefetch): the next stage's worker is started while the current stage
loads, so that its Python start and imports (torch, transformers, vLLM: 12-26 s a stage on an
H200) are done when its turn comes, instead of after the card is free.

The rules that keep the measurement what it was:
- the early worker imports, then blocks on its go pipe: it touches no CUDA and holds no GPU
  memory before its go (run/preload.py reports whether CUDA was initialized anyway), and it
  imports on the upper half of the host's cores;
- it runs only while the current stage loads and after the current stage's last result: at the
  current stage's load event it is stopped (SIGSTOP), and continued (SIGCONT) once the result is
  in, so no import ever overlaps a warm-up or a measurement;
- its go comes where a fresh worker would have been spawned (the previous stage's worker gone,
  the card free); its jobs are written again at the go, so its load_s counts from the go like a
  fresh worker's from its spawn. The imports done ahead are its `timing.prefetched_s`, reported
  apart, never in load_s or duration_s.
- it dies with the runner (PR_SET_PDEATHSIG, until its go) and is killed whole when the run stops
  (Ctrl-C, --fail-fast, an error); a worker that died before its go is replaced by a fresh one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from llmopt_bench.procs import spawn

if TYPE_CHECKING:
    import queue

    from llmopt_bench.procs.events import Event, Unreadable


MIN_CORES = 8  # --prefetch's default: on with this many cores (the early worker imports on half of them)


def spare_cores() -> bool:
    try:
        return len(os.sched_getaffinity(0)) >= MIN_CORES
    except (AttributeError, OSError):
        return (os.cpu_count() or 1) >= MIN_CORES


@dataclass
class Launched:
    """A stage group's worker, started: its process, its events and, started ahead, the write end
    of its go pipe and the spans it was stopped."""

    proc: subprocess.Popen
    events: queue.Queue[Event | Unreadable | None]  # procs/events.start_reader's: None when the worker closed its pipe
    spawned: float
    go_fd: int | None = None
    paused: list[tuple[float, float]] = field(default_factory=list)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close_go(self) -> None:
        if self.go_fd is not None:
            try:
                os.close(self.go_fd)
            except OSError:
                pass
            self.go_fd = None

    def go(self) -> bool:
        """Start the waiting worker; False when it is gone (its pipe broken)."""
        assert self.go_fd is not None
        try:
            os.write(self.go_fd, b"go\n")
            return True
        except OSError:
            return False
        finally:
            self.close_go()

    def kill(self) -> None:
        self.close_go()
        spawn.kill_session(self.proc.pid)
        self.proc.wait()


def prefetched_seconds(started: float, ended: float | None, go_at: float, paused: list[tuple[float, float]]) -> float:
    """The import time done ahead: from the early worker's start of its imports to their end (or
    to its go, where they were not done by then), less the spans it was stopped."""
    end = min(ended, go_at) if ended is not None else go_at
    if end <= started:
        return 0.0
    stopped = sum(max(0.0, min(b, end) - max(a, started)) for a, b in paused)
    return round(max(0.0, end - started - stopped), 3)


class Ahead:
    """The next stage group's worker, started ahead by `launch` (None: nothing to start ahead)."""

    def __init__(self, launch: Callable[[], Launched] | None):
        self._launch = launch
        self.worker: Launched | None = None
        self._stopped_at: float | None = None

    def start(self) -> None:
        """Start it now (once), as the current group's worker starts."""
        if self._launch is not None and self.worker is None:
            launch, self._launch = self._launch, None
            try:
                self.worker = launch()
            except OSError as e:  # no process to spare: the next group starts afresh, as without --prefetch
                print(f"llmopt: could not start the next stage's worker ahead ({e}); it starts in its turn", file=sys.stderr)

    def pause(self) -> None:
        """Stop it while the current stage warms up and measures."""
        if self.worker is not None and self._stopped_at is None and self.worker.alive():
            spawn.signal_all(self.worker.proc.pid, signal.SIGSTOP)
            self._stopped_at = time.time()

    def resume(self) -> None:
        """Let it go on: the current stage's results are in."""
        if self.worker is not None and self._stopped_at is not None:
            spawn.signal_all(self.worker.proc.pid, signal.SIGCONT)
            self.worker.paused.append((self._stopped_at, time.time()))
            self._stopped_at = None

    def take(self) -> tuple[Launched | None, list[str]]:
        """The worker for its turn, and notes; None where none was started or it died before its
        turn (the caller then starts a fresh one, as without --prefetch, and records the note)."""
        self.resume()
        worker, self.worker = self.worker, None
        if worker is None or worker.alive():
            return worker, []
        code = worker.proc.returncode
        worker.kill()
        return None, [f"its worker, started ahead (--prefetch), exited (code {code}) before its turn: a fresh worker ran it"]

    def discard(self) -> None:
        """The run stops (Ctrl-C, --fail-fast, an error): the early worker goes, whole."""
        self._launch = None
        worker, self.worker = self.worker, None
        if worker is not None:
            worker.kill()  # SIGKILL ends a stopped process too
        self._stopped_at = None



@dataclass
class Turn:
    """A stage group's turn: its worker if one was started ahead, notes on that worker, and the
    next group's Ahead (started as this group's worker starts, stopped while it measures)."""

    worker: Launched | None = None
    notes: list[str] = field(default_factory=list)
    ahead: Ahead | None = None

    def start_ahead(self) -> None:
        if self.ahead is not None:
            self.ahead.start()

    def pause_ahead(self) -> None:
        if self.ahead is not None:
            self.ahead.pause()

    def resume_ahead(self) -> None:
        if self.ahead is not None:
            self.ahead.resume()
