"""How long each stage took last time on this machine, model and workload, kept in the cache
($LLMOPT_CACHE/durations.json), so that a run can say how long it has left (its ETA) before it
has measured anything. A stage never measured here has no estimate, and the ETA says so."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any


def _path() -> Path:
    from llmopt_bench.core.models import cache_dir

    return cache_dir() / "durations.json"


def key(device: str | None, model: str, workload: Any, stage: str, params: dict[str, Any]) -> str:
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
    from llmopt_bench.run.rundir import atomic_write

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
