"""One engine for several stages: the pool a stage group's worker keeps (issue 19).

Starting vLLM costs a minute or two on an H200 (import, torch.compile, CUDA-graph capture) and
the `vllm` stage's batch-1 workload and continuous batching's vLLM side ask for the same engine
configuration. When the runner finds consecutive stages with the same share key
(Stage.share_key), it runs them in one worker process (run/supervisor.supervise_group): the first
stage starts the engine and puts it here, the next ones take it, and the last one that needs it
closes it for real. A stage that fails ends its group: the stages after it run in fresh
processes, so a crash still costs only what was running.

The pool lives in StageContext.shared["engine_pool"]; without it (a stage alone in its process)
every engine is started and closed by its own stage, as before."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, TypedDict

from llmopt_bench.engines.lifecycle import DeviceMemory

POOL_KEY = "engine_pool"


class EngineBaseline(TypedDict, total=False):
    """Before a pooled engine started (empty for one that is not pooled): what a later stage of
    the group measures the engine's shutdown against (continuous batching's lifecycle record)."""

    before_engine: DeviceMemory
    processes_before_engine: int


@dataclass
class Pooled:
    engine: Any
    info: Any  # the LoadInfo of its start: later stages get a copy, marked shared
    owner: str  # the stage that started it
    baseline: EngineBaseline = field(default_factory=EngineBaseline)  # device memory and processes before it started


class EnginePool:
    def __init__(self) -> None:
        self.engines: dict[str, Pooled] = {}
        self.later: set[str] = set()  # keys the group's later stages ask for: their engines stay open
        self.current: str | None = None  # the stage running now
        self.current_key: str | None = None  # its share key: only an engine of that key is pooled

    def take(self, key: str) -> Pooled | None:
        return self.engines.get(key)

    def put(self, key: str, pooled: Pooled) -> None:
        self.engines[key] = pooled

    def keep(self, key: str) -> bool:
        """Whether an engine under this key must stay open when its current stage closes it."""
        return key in self.later and key in self.engines

    def drop(self, key: str) -> None:
        self.engines.pop(key, None)

    def close_all(self) -> None:
        """The group's end: whatever is still open goes (a group cut short by a failure)."""
        while self.engines:
            _, pooled = self.engines.popitem()
            pooled.engine.close_now()


def pool_for(ctx: Any, key: str) -> EnginePool | None:
    """The pool, where the running stage declared this engine's key (a stage that starts some
    other engine, the AWQ checkpoint's say, never pools it)."""
    pool = getattr(ctx, "shared", {}).get(POOL_KEY)
    return pool if pool is not None and pool.current_key == key else None


def shared_info(pooled: Pooled, stage: str) -> Any:
    """The LoadInfo a stage that took a pooled engine reports: the engine's own, no start phases
    (it started nothing), and a note naming the stage that started it."""
    info = copy.deepcopy(pooled.info)
    info.phases_s = {"engine_shared_s": 0.0}
    info.implementation["engine_shared_with"] = pooled.owner
    info.notes.append(f"engine shared: started by {pooled.owner} in this process, not started again for {stage} "
                      "(same configuration; --no-share-engines starts one per stage)")
    return info
