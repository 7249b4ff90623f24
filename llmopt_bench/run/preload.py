"""The worker side of --prefetch (run/prefetch.py): a worker started ahead imports what its
stages will import (Stage.prefetch_imports), tells the runner, and waits for its go.

Before its go it must not disturb the stage that holds the card: no CUDA (imports only, torch's
CUDA initialization refused while they run, and whether CUDA got initialized anyway is reported),
its imports on the upper half of the host's cores,
and it dies with the runner (PR_SET_PDEATHSIG: a stopped process cannot notice its go pipe
closing). At its go the cores and the parent-death signal are put back as a fresh worker has
them."""

from __future__ import annotations

import importlib
import os
import signal
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from llmopt_bench.procs.events import Event, Prefetched

GO_ENV = "LLMOPT_GO_FD"  # the read end of the go pipe: set only in a worker started ahead
RUNNER_ENV = "LLMOPT_RUNNER_PID"
PR_SET_PDEATHSIG = 1


def _set_parent_death_signal(sig: int) -> None:
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig)
    except (OSError, AttributeError):  # not Linux: the go pipe's end still stops a running worker
        pass


class CudaRefused(RuntimeError):
    """An import ahead tried to initialize CUDA: refused until the worker's turn."""


@contextmanager
def no_cuda_init() -> Iterator[Callable[[], None]]:
    """Refuse torch's CUDA initialization inside the block (once torch is imported): an import
    that would create a CUDA context (bitsandbytes asks every GPU's capability at import) fails,
    is noted, and is imported again by the stage in its turn. torch.cuda.is_available() (a device
    count, no context) stays allowed."""
    patched = None

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise CudaRefused("llmopt: no CUDA before this worker's turn (an import ahead tried to initialize it)")

    def guard() -> None:
        nonlocal patched
        torch = sys.modules.get("torch")
        if patched is None and torch is not None and hasattr(torch, "cuda") and not torch.cuda.is_initialized():
            patched = (torch.cuda, torch.cuda._lazy_init)
            torch.cuda._lazy_init = refuse

    try:
        yield guard
    finally:
        if patched is not None:
            patched[0]._lazy_init = patched[1]


def import_all(names: list[str]) -> Prefetched:
    """Import each "module" or "module:attribute" (a lazy package's attribute imports its
    module), CUDA refused once torch is in; a failure is noted, never raised: the stage's own load
    imports it again in its turn and reports what fails then."""
    started, failed = time.time(), []
    with no_cuda_init() as guard:
        for name in names:
            guard()
            module, _, attr = name.partition(":")
            try:
                found = importlib.import_module(module)
                if attr:
                    getattr(found, attr)
            except Exception as e:  # noqa: BLE001 - reported by the stage itself, later
                failed.append(f"{name}: {type(e).__name__}")
    torch = sys.modules.get("torch")
    cuda = bool(torch is not None and hasattr(torch, "cuda") and torch.cuda.is_initialized())
    return Prefetched(started=started, ended=time.time(), imports=names, failed=failed, cuda_initialized=cuda)


def other_cores() -> set[int] | None:
    """The upper half of the cores this process may use; None with fewer than 2 or no affinity API."""
    try:
        cores = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None
    return set(cores[len(cores) // 2:]) if len(cores) >= 2 else None


@contextmanager
def on_other_cores() -> Iterator[None]:
    """Run the block on the upper half of the cores, then give every thread of the process the
    cores it had (threads the imports started inherited the narrow set)."""
    cores = other_cores()
    if cores is None:
        yield
        return
    full = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        for task in Path("/proc/self/task").iterdir():
            try:
                os.sched_setaffinity(int(task.name), full)
            except (OSError, ValueError):
                pass


def wait_for_go(fd: int) -> bool:
    """Block until the runner says go; False when the pipe closes without it (the run stopped)."""
    with os.fdopen(fd, "rb") as f:
        return f.readline().strip() == b"go"


def await_turn(names: list[str], send: Callable[[Event], None]) -> bool:
    """In a worker started ahead: import, report (a Prefetched event), wait for the go. True: run
    the stages now; False: the run stopped before this worker's turn."""
    _set_parent_death_signal(signal.SIGKILL)
    runner = os.environ.get(RUNNER_ENV)
    if runner and os.getppid() != int(runner):  # the runner died before the signal was set
        return False
    with on_other_cores():
        send(import_all(names))
    go = wait_for_go(int(os.environ[GO_ENV]))
    _set_parent_death_signal(0)  # from its go on, a worker outlives the runner as a fresh one does
    return go
