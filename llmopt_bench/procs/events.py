"""The wire between a stage's child process and the runner: JSON lines on a dedicated pipe
(the child's stdout and stderr go to its log, where engines are free to be noisy)."""

from __future__ import annotations

import json
import os
import queue
import threading
from typing import Any

FD_ENV = "LLMOPT_EVENT_FD"


class EventWriter:
    def __init__(self, fd: int | None = None):
        fd = fd if fd is not None else int(os.environ[FD_ENV])
        self._f = os.fdopen(fd, "w", buffering=1, encoding="utf-8")
        self._lock = threading.Lock()

    def send(self, kind: str, **data: Any) -> None:
        with self._lock:
            self._f.write(json.dumps({"type": kind, **data}, default=str) + "\n")
            self._f.flush()


def start_reader(fd: int) -> "queue.Queue[dict | None]":
    """Read events on a thread; None on the queue means the child closed the pipe."""
    q: queue.Queue[dict | None] = queue.Queue()

    def pump() -> None:
        with os.fdopen(fd, "r", encoding="utf-8") as f:
            for line in f:
                try:
                    q.put(json.loads(line))
                except json.JSONDecodeError:
                    q.put({"type": "log", "line": line.rstrip()})
        q.put(None)

    threading.Thread(target=pump, daemon=True, name="llmopt-events").start()
    return q
