"""The child process that runs one stage: load, warm up, measure, tear down, and send back
its samples or the reason it could not. Started by the runner as
`python -m llmopt_bench.worker RUN_DIR/stages/NAME/job.json` in a new session, so it can be
killed whole. Paths in the job are relative to the run directory."""

from __future__ import annotations

import json
import resource
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from llmopt_bench.errors import describe, is_oom
from llmopt_bench.events import EventWriter
from llmopt_bench.measure.energy import TimedMeter
from llmopt_bench.models import ModelInfo, local_path
from llmopt_bench.registry import import_entry
from llmopt_bench.stage import StageContext, StageSkipped
from llmopt_bench.workload import WorkloadConfig


def _torch_memory(device: str) -> dict:
    out: dict = {"cpu_max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    torch = sys.modules.get("torch")
    if torch is not None and device == "cuda" and torch.cuda.is_initialized():
        out.update(torch_peak_allocated_bytes=torch.cuda.max_memory_allocated(),
                   torch_peak_reserved_bytes=torch.cuda.max_memory_reserved(),
                   torch_allocated_bytes=torch.cuda.memory_allocated())
    return out


def _pick_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def context(job: dict[str, Any], job_path: Path, device: str, events: EventWriter) -> StageContext:
    from llmopt_bench.rundir import RunDir

    rd = RunDir(job_path.resolve().parent.parent.parent)
    return StageContext(
        run_dir=rd.root, stage_dir=rd.root / job["stage_dir"], device=device, log_path=rd.root / job["log"],
        progress=lambda msg, done=None, total=None: events.send("progress", msg=msg, done=done, total=total),
        reference_file=rd.root / job["reference_file"] if job.get("reference_file") else None,
        reference_name=job.get("reference_name"), provides_reference=bool(job.get("provides_reference")),
        keep_partial=lambda data: rd.write_json(rd.partial(job["stage"]), data),
        meter=TimedMeter() if job.get("owns_device", True) else TimedMeter(read_mj=lambda: None))


def main(job_path: str) -> int:
    job = json.loads(Path(job_path).read_text())
    events = EventWriter()
    stage = None
    device = "cpu"
    try:
        cls = import_entry(job["entry"])
        params = cls.Params(**job["params"])
        model = ModelInfo(**{**job["model"], "path": local_path(job["model"]["path"])})
        workload = WorkloadConfig(**job["workload"])
        device = _pick_device()
        ctx = context(job, Path(job_path), device, events)
        stage = cls()
        info = stage.load(model, params, ctx)
        events.send("load", info=info.model_dump(mode="json"), load_s=time.time() - job["spawned_at"],
                    memory=_torch_memory(device))
        if device == "cuda":
            import torch

            torch.cuda.reset_peak_memory_stats()
        stage.warmup(workload, ctx)
        run = stage.run(workload, ctx)
        events.send("result", run=run.model_dump(mode="json"), memory=_torch_memory(device), energy=ctx.meter.record("main"))
        return 0
    except StageSkipped as e:
        events.send("skipped", reason=e.reason, fix=e.fix)
        return 0
    except BaseException as e:  # noqa: BLE001 - every failure is reported, then the child exits
        tb = traceback.format_exc()
        print(tb, file=sys.stderr, flush=True)
        kind = "oom" if is_oom(e) else ("interrupted" if isinstance(e, KeyboardInterrupt) else "error")
        events.send(kind, reason=describe(e), traceback=tb, memory=_torch_memory(device))
        return 1
    finally:
        if stage is not None:
            try:
                stage.teardown()
            except Exception:  # noqa: BLE001 - teardown must not hide the stage's own outcome
                traceback.print_exc()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
