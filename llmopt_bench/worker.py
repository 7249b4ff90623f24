"""The child process that runs one stage: load, warm up, measure, tear down, and send back
its samples or the reason it could not. Started by the runner as
`python -m llmopt_bench.worker JOB.json` in a new session, so it can be killed whole."""

from __future__ import annotations

import json
import resource
import sys
import time
import traceback
from pathlib import Path

from llmopt_bench.events import EventWriter
from llmopt_bench.models import ModelInfo
from llmopt_bench.registry import import_entry
from llmopt_bench.stage import StageContext, StageSkipped
from llmopt_bench.workload import WorkloadConfig


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError):
        return True
    name = type(exc).__name__
    text = str(exc)
    return name == "OutOfMemoryError" or "CUDA out of memory" in text or "out of memory" in text.lower()[:200]


def _torch_memory(device: str) -> dict:
    out: dict = {"cpu_max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    torch = sys.modules.get("torch")
    if torch is not None and device == "cuda" and torch.cuda.is_initialized():
        out.update(torch_peak_allocated_bytes=torch.cuda.max_memory_allocated(),
                   torch_peak_reserved_bytes=torch.cuda.max_memory_reserved(),
                   torch_allocated_bytes=torch.cuda.memory_allocated())
    return out


def _energy_mj() -> int | None:
    from llmopt_bench.measure import nvml

    values = [nvml.energy_mj(i) for i in nvml.device_indices()]
    return sum(v for v in values if v is not None) if values and all(v is not None for v in values) else None


def _pick_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def main(job_path: str) -> int:
    job = json.loads(Path(job_path).read_text())
    events = EventWriter()
    stage = None
    device = "cpu"
    try:
        cls = import_entry(job["entry"])
        params = cls.Params(**job["params"])
        model = ModelInfo(**job["model"])
        workload = WorkloadConfig(**job["workload"])
        device = _pick_device()
        ctx = StageContext(run_dir=Path(job["run_dir"]), stage_dir=Path(job["stage_dir"]), device=device,
                           log_path=Path(job["log"]) if job.get("log") else None,
                           progress=lambda msg, done=None, total=None: events.send("progress", msg=msg, done=done, total=total))
        stage = cls()
        info = stage.load(model, params, ctx)
        events.send("load", info=info.model_dump(mode="json"), load_s=time.time() - job["spawned_at"],
                    memory=_torch_memory(device))
        if device == "cuda":
            import torch

            torch.cuda.reset_peak_memory_stats()
        stage.warmup(workload, ctx)
        e0, t0 = _energy_mj(), time.perf_counter()
        run = stage.run(workload, ctx)
        e1, t1 = _energy_mj(), time.perf_counter()
        energy = None
        if e0 is not None and e1 is not None:
            tokens = sum(s.output_tokens for s in run.samples if s.ok)
            joules = (e1 - e0) / 1000.0
            energy = {"joules": joules, "seconds": t1 - t0, "avg_watts": joules / (t1 - t0) if t1 > t0 else None,
                      "joules_per_output_token": joules / tokens if tokens else None,
                      "note": "whole-device NVML energy counter over run(), warm-up excluded"}
        events.send("result", run=run.model_dump(mode="json"), memory=_torch_memory(device), energy=energy)
        return 0
    except StageSkipped as e:
        events.send("skipped", reason=e.reason, fix=e.fix)
        return 0
    except BaseException as e:  # noqa: BLE001 - every failure is reported, then the child exits
        tb = traceback.format_exc()
        print(tb, file=sys.stderr, flush=True)
        kind = "oom" if _is_oom(e) else ("interrupted" if isinstance(e, KeyboardInterrupt) else "error")
        events.send(kind, reason=f"{type(e).__name__}: {str(e).strip().splitlines()[0][:500] if str(e).strip() else ''}",
                    traceback=tb, memory=_torch_memory(device))
        return 1
    finally:
        if stage is not None:
            try:
                stage.teardown()
            except Exception:  # noqa: BLE001 - teardown must not hide the stage's own outcome
                traceback.print_exc()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
