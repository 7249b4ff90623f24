"""How long each stage took last time on this machine, model and workload, kept in the cache
($LLMOPT_CACHE/durations.json), so that a run can say how long it has left (its ETA) before it
has measured anything. A stage never measured here has no estimate, and the ETA says so."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from llmopt_bench.core.freeform import Json
from llmopt_bench.core.models import cache_dir
from llmopt_bench.run.rundir import atomic_write


def _path() -> Path:

    return cache_dir() / "durations.json"


def key(device: str | None, model: str, workload: Any, stage: str, params: Json) -> str:  # params: any stage's own
    what = json.dumps([device, model, workload.model_dump(mode="json"), stage, params], sort_keys=True, default=str)
    return hashlib.sha256(what.encode()).hexdigest()[:16]


def load() -> dict[str, float]:
    try:
        data = json.loads(_path().read_text())
        return {k: float(v) for k, v in data.items()} if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def record(k: str, seconds: float) -> None:
    """Remember a stage's wall time (a failure to write the cache costs the next ETA only)."""

    data = load()
    data[k] = round(seconds, 1)
    try:
        _path().parent.mkdir(parents=True, exist_ok=True)
        atomic_write(_path(), json.dumps(data, indent=1, sort_keys=True))
    except Exception:  # noqa: BLE001 - an estimate is not worth failing a run over
        pass


def eta(keys: list[str]) -> tuple[float, int]:
    """(seconds the stages with a recorded duration take, how many of them have one)."""
    known = load()
    found = [known[k] for k in keys if k in known]
    return sum(found), len(found)


def phase_label(msg: str) -> str:
    """A progress message as the name of a phase of a stage's time: counts ("1/2") and details in
    parentheses dropped, so that the repeats of one phase add up under one name."""
    import re

    text = re.sub(r"\([^)]*\)|\b\d+/\d+\b", "", msg)
    return re.sub(r"\s+", " ", text).strip(" :") or msg


class Timeline:
    """Where a stage's wall time went, phase by phase: a phase runs from one progress message to
    the next (the runner sees them as they come, stage_child.follow), its seconds summed by
    phase_label. From the spawn to the first message: "start-up" (imports, the worker's own)."""

    def __init__(self, started: float, first: str = "start-up (process, imports)"):
        import time

        self._clock = time.time
        self._label, self._since = first, started
        self.phases: dict[str, float] = {}

    def mark(self, label: str) -> None:
        """`label` starts now (the phase under way goes on when it has that name already)."""
        if label == self._label:
            return
        now = self._clock()
        self.phases[self._label] = self.phases.get(self._label, 0.0) + now - self._since
        self._label, self._since = label, now

    def close(self) -> dict[str, float]:
        self.mark("\0")
        return {k: round(v, 2) for k, v in self.phases.items() if k != "\0" and v >= 0.005}


def top_phases(phases: dict[str, float], total: float | None, n: int = 4) -> str:
    """"repeat 30 s (36%), quality 12 s, ...": the phases that took the most, largest first."""
    biggest = sorted(phases.items(), key=lambda kv: -kv[1])[:n]
    return ", ".join(f"{k} {v:.3g} s" + (f" ({v / total:.0%})" if total else "") for k, v in biggest)
