"""Which processes are alive and how they relate: one walk of /proc for every question llmopt asks
of them (a session's members, a process group's, the processes below this one), so that the
memory sampler, the spawner, the engines and the server all count the same processes."""

from __future__ import annotations

import os

# Helpers multiprocessing starts once per process and keeps until it exits: not the engine.
HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver", "multiprocessing.semaphore_tracker")

# /proc/PID/stat fields after the parenthesised command name
STATE, PPID, PGRP, SESSION = 0, 1, 2, 3


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def live_processes() -> dict[int, list[str]]:
    """Every live process's /proc/PID/stat fields after the command name (state, ppid, pgrp,
    session, ...): zombies and dead ones left out."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                rest = f.read().rsplit(")", 1)[-1].split()
        except OSError:
            continue
        if len(rest) > SESSION and rest[STATE] not in ("Z", "X"):
            out[int(entry)] = rest
    return out


def members(sid: int, field: int = SESSION) -> list[int]:
    """Live processes of session `sid` (a child llmopt starts gets a session of its own), including
    those whose parent died: they are no longer anyone's descendants, but stay in the session.
    field=PGRP: of process group `sid` instead (a server kept in its caller's session)."""
    return [pid for pid, rest in live_processes().items() if int(rest[field]) == sid]


def session_pids(sid: int) -> set[int]:
    """The live members of session `sid`, as a set."""
    return set(members(sid))


def descendants(root: int | None = None) -> list[int]:
    """Live processes below `root` (default: this one; vLLM's engine core and its workers),
    without multiprocessing's own resource tracker."""
    parent = {pid: int(rest[PPID]) for pid, rest in live_processes().items()}
    out, frontier = [], [os.getpid() if root is None else root]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        frontier += kids
    return [pid for pid in out if not any(h in cmdline(pid) for h in HELPERS)]
