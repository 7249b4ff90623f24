"""vLLM's model-class inspection, done once per cache while the environment probe prepares the
checkpoint, instead of inside the first engine's start.

At every engine start vLLM inspects the model's class (which interfaces it supports) in a fresh
subprocess that imports the model code, unless $VLLM_CACHE_ROOT/modelinfos holds the answer
(vLLM 0.26 and 0.32: model_executor/models/registry.py, _LazyRegisteredModel.inspect_model_cls).
On a fresh H200 that subprocess cost the run's first engine 21-26 s (docs/gpu-runs.md). The
cache is keyed by the model class, not the checkpoint, so the probe can fill it from the
architecture's name alone: no engine, no config, no GPU.

    python -m llmopt_bench.engines.vllm.modelinfo ARCH [ARCH...]   (in vLLM's interpreter)

Idempotent (an architecture whose file is in the cache is not inspected again: `cached`) and
harmless: where vLLM is absent, or its registry moved, nothing is done and the first engine
inspects as before."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TypedDict, Unpack


def cache_root() -> Path:
    """Where vLLM keeps its caches for llmopt's engines (engines/vllm/offline.engine_defaults)."""
    import os

    from llmopt_bench.engines.vllm.offline import engine_defaults

    return Path(os.environ.get("VLLM_CACHE_ROOT") or engine_defaults()["VLLM_CACHE_ROOT"])


def cached(architectures: list[str], root: Path) -> bool:
    """Every architecture has a model-info file: vLLM names it <module>-<class>.json."""
    folder = root / "modelinfos"
    return all(any(folder.glob(f"*-{arch}.json")) for arch in architectures)


class InspectionRun(TypedDict, total=False):
    seconds: float  # the inspection's own time
    result: dict[str, str] | None  # inspect()'s answer, as the inspection printed it


class Inspection(InspectionRun):
    """What the prefill did (the environment record's vllm_model_inspection)."""

    status: str
    architectures: list[str]


@dataclass
class Prefill:
    """The inspection started in the background by the probe, or why none was."""

    architectures: list[str]
    proc: subprocess.Popen | None = None
    out: IO[str] | None = None
    started: float = field(default_factory=time.perf_counter)
    status: str = "started"

    def record(self, status: str, **run: Unpack[InspectionRun]) -> Inspection:
        return {"status": status, "architectures": self.architectures, **run}


def start(architectures: list[str]) -> Prefill:
    """Start vLLM's inspection of these model classes in vLLM's interpreter, in the background (the
    caller's session: it ends with the probe), unless there is nothing to do or nothing to do it with."""
    import os
    import tempfile

    from llmopt_bench.engines.vllm.offline import engine_defaults
    from llmopt_bench.procs import spawn
    from llmopt_bench.procs.interpreters import engine_python, has_modules

    job = Prefill(architectures)
    python = engine_python("vllm")
    if not architectures:
        job.status = "skipped: no vLLM stage, or the model's class is not known before its checkpoint is fetched"
    elif "vllm" not in has_modules(python, ("vllm",)):
        job.status = "skipped: no vLLM in this environment"
    elif cached(architectures, cache_root()):
        job.status = "cached"
    else:
        job.out = tempfile.TemporaryFile("w+")
        env = {k: v for k, v in engine_defaults().items() if k not in os.environ}  # the engines' cache, as they set it
        job.proc = spawn.start([python, "-m", __name__, *architectures], log=job.out, env=spawn.child_env(env),
                               own_session=False)
    return job


def finish(job: Prefill, limit_s: float = 180.0) -> Inspection:
    """Wait for the inspection (never past limit_s: it only saves time) and say what it did."""
    import json

    if job.proc is None:
        return job.record(job.status)
    assert job.out is not None
    try:
        code = job.proc.wait(timeout=max(0.0, limit_s - (time.perf_counter() - job.started)))
    except subprocess.TimeoutExpired:
        job.proc.kill()
        job.proc.wait()
        return job.record(f"stopped after {limit_s:g} s: the first engine inspects the model itself")
    seconds = round(time.perf_counter() - job.started, 3)
    job.out.seek(0)
    lines = [line for line in job.out.read().splitlines() if line.startswith("{")]
    job.out.close()
    said = json.loads(lines[-1]) if lines else {}
    if code != 0 or not said:
        return job.record(f"failed (exit {code}): the first engine inspects the model itself", seconds=seconds)
    if "skipped" in said:
        return job.record(f"skipped: {said['skipped']}", seconds=seconds)
    ok = cached(job.architectures, cache_root())
    return job.record("filled" if ok else "not filled", seconds=seconds, result=said.get("architectures"))


def inspect(architectures: list[str]) -> dict[str, str]:
    """In vLLM's interpreter: each architecture's class inspected through vLLM's own registry, which
    writes the cache; what became of each."""
    from vllm.model_executor.models.registry import ModelRegistry

    out = {}
    for arch in architectures:
        registered = ModelRegistry.models.get(arch)
        if registered is None:
            out[arch] = "not a vLLM architecture"
            continue
        registered.inspect_model_cls()
        out[arch] = "inspected"
    return out


def main(argv: list[str]) -> int:
    import json
    import time

    t0 = time.perf_counter()
    try:
        result = inspect(argv)
    except (ImportError, AttributeError) as e:  # no vLLM, or its registry moved: the engine inspects as before
        print(json.dumps({"skipped": f"{type(e).__name__}: {e}"}))
        return 0
    print(json.dumps({"architectures": result, "seconds": round(time.perf_counter() - t0, 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
