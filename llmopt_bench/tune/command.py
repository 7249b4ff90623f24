"""`llmopt tune` from start to end, in its run directory:

1. The FP16 quality reference, through the runner (the hf-fp16 stage into run.json, as a journey
   run makes it): every configuration's quality is judged against it, as the stages' is.
2. The search (tune/tuner.py) over the space fitted to this device (tune/space.for_device): the
   defaults, a screen of every one-knob change on its ceiling, the promising narrowed, the knobs
   that helped combined, the winner confirmed.
3. The answer (tune/answer.py): the winner against the defaults, run.json's results, tune.md.

`--resume DIR` goes on where an interrupted run stopped: a server a killed run left behind is
stopped first (found by its trial's directory in its environment), then the search goes on with
the run's own settings."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmopt_bench.core.errors import UsageError
from llmopt_bench.core.results import utcnow
from llmopt_bench.core.slo import SLO
from llmopt_bench.core.workload import WorkloadConfig
from llmopt_bench.run.rundir import RunDir
from llmopt_bench.tune.answer import conclude
from llmopt_bench.tune.record import TUNE_JSON, TuneRecord, TuneSettings
from llmopt_bench.tune.space import Space, for_device
from llmopt_bench.tune.trial import Shared, leftover_servers
from llmopt_bench.tune.tuner import Tuner

REFERENCE_STAGE = "hf-fp16"


@dataclass
class TuneOptions:
    out_dir: Path
    space: Space
    model: str  # the model's source
    workload: WorkloadConfig
    slo: SLO
    hold_s: float
    budget_s: float
    seed: int
    min_quality: float
    command: str
    max_trials: int | None = None
    device: str = "cpu"


def reference(opts: TuneOptions, say: Any) -> None:
    """The FP16 quality reference into run.json, through the runner (skipped when there already)."""
    from llmopt_bench.analysis.selectors import reference as ref_of
    from llmopt_bench.core.models import parse_model
    from llmopt_bench.render.progress import make_reporter
    from llmopt_bench.run.registry import StagePlan
    from llmopt_bench.run.runner import RunOptions, run_journey

    rd = RunDir(opts.out_dir)
    if rd.run_json.is_file() and ref_of(rd.load()) is not None:
        return
    say("the FP16 quality reference (hf-fp16), through the runner")
    dtype = opts.space.fixed.get("dtype", "auto")
    plans = [StagePlan(name=REFERENCE_STAGE, params={"dtype": dtype, "measure_overhead": False})]
    run_journey(RunOptions(out_dir=opts.out_dir, model=parse_model(opts.model), workload=opts.workload, plans=plans,
                           command=opts.command, resume=rd.run_json.is_file(), min_quality=opts.min_quality), make_reporter())


def shared_of(opts: TuneOptions, model: Any) -> Shared:
    """What every trial shares: the model (prepared), the load, the quality reference."""
    from llmopt_bench.analysis.selectors import reference as ref_of
    from llmopt_bench.run.runner import REFERENCE_FILE
    from llmopt_bench.scenarios.serving.record import ServingParams

    load = ServingParams(**opts.space.load, slo=opts.slo, hold_s=opts.hold_s, concurrency=[], throughput_point=False)
    ref = ref_of(RunDir(opts.out_dir).load())
    ref_file = RunDir(opts.out_dir).stage_dir(ref.name) / REFERENCE_FILE if ref else None
    return Shared(model=model, device=opts.device, space=opts.space, load=load, workload=opts.workload, run_dir=opts.out_dir,
                  reference_file=ref_file if ref_file and ref_file.is_file() else None, reference_name=ref.name if ref else None,
                  reference_quality=ref.quality if ref else None, min_quality=opts.min_quality, hold_s=opts.hold_s)


def new_record(opts: TuneOptions, real_weights: bool | None = None) -> TuneRecord:
    return TuneRecord(command=opts.command, created_at=utcnow(), device=opts.device, model=opts.model, space=opts.space,
                      settings=TuneSettings(slo=opts.slo, hold_s=opts.hold_s, budget_s=opts.budget_s, seed=opts.seed,
                                            min_quality=opts.min_quality, max_trials=opts.max_trials, workload=opts.workload,
                                            real_weights=real_weights))


def load_record(out: Path) -> TuneRecord:
    path = out / TUNE_JSON
    if not path.is_file():
        raise UsageError(f"--resume {out}: no {TUNE_JSON} there (not a tune run)", "pass a directory written by llmopt tune")
    return TuneRecord.model_validate_json(path.read_text())


def stop_leftovers(out: Path, record: TuneRecord, say: Any) -> None:
    """Servers an interrupted run left running for its unfinished trials (a SIGKILL gives no time to stop them)."""
    import signal

    from llmopt_bench.procs.spawn import signal_all
    from llmopt_bench.procs.tree import PGRP, members

    dirs = [str(out / "trials" / f"{t.number:03d}") for t in record.trials if t.outcome == "running"]
    for group in leftover_servers(dirs) if dirs else []:
        say(f"stopping a server the interrupted run left behind (process group {group})")
        signal_all(group, signal.SIGKILL, PGRP)
        for _ in range(300):  # gone, and its memory with it, before the next server starts
            if not members(group, PGRP):
                break
            time.sleep(0.1)


def tune(opts: TuneOptions, record: TuneRecord | None = None) -> TuneRecord:
    """The whole command (see the module doc); `record` is an interrupted run's, to go on with."""
    from llmopt_bench.checkpoints.prepare import prepare
    from llmopt_bench.core.models import parse_model, portable_text
    from llmopt_bench.run.rundir import atomic_write

    t0 = time.monotonic()
    say = lambda msg: print(f"[tune] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    model = prepare(parse_model(opts.model))
    if record is None:  # tune.json first, so a run cut short even in its reference can be resumed
        opts.space = for_device(opts.space, model, opts.device)  # fitted to this device and model once
        record = new_record(opts, bool(model.real_weights))
        atomic_write(opts.out_dir / TUNE_JSON, portable_text(record.model_dump_json(indent=1)))
    else:
        stop_leftovers(opts.out_dir, record, say)
    reference(opts, say)
    rd = RunDir(opts.out_dir)
    rd.lock()
    try:
        shared = shared_of(opts, model)
        record.wall_s += time.monotonic() - t0  # the reference's time counts in the budget
        record.status = "running"
        tuner = Tuner(opts.out_dir, record, shared, opts.budget_s, opts.max_trials)
        for k, why in record.space.removed.items():
            tuner.say(f"not in the space here: {k}: {why}")
        try:
            tuner.search()
            record.status = "complete"
        except KeyboardInterrupt:
            record.status = "interrupted"
            raise
        finally:
            conclude(opts.out_dir, record)
            tuner.save()
    finally:
        rd.unlock()
    return record
