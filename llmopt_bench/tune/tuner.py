"""`llmopt tune` from start to end, in its run directory:

1. The FP16 quality reference, through the runner (the hf-fp16 stage into run.json, as a journey
   run makes it): every configuration's quality is judged against it, as the stages' is.
2. The search (tune/study.py), vLLM's defaults first: each trial one server start and its rungs
   (tune/trial.py), within the budget: a trial starts only while the time left holds a server
   start and its short rung, a rung only while it holds that rung. Every trial is written to
   tune.json when it starts and when it ends; progress lines say the trial, the best so far and
   the time left.
3. The answer: the highest held capacity among the configurations that pass the quality gate,
   against the defaults' held capacity (the ratio, with the interval both allow); run.json gets
   both as results (tune-defaults, tune-winner) for `llmopt recommend` and `compare`, and the
   run directory tune.md with its chart (tune/report.py).

`--resume DIR` goes on where an interrupted run stopped: the finished trials are kept (and given
back to the study), a trial that was running is run again, a server a killed run left behind is
stopped first, and the budget counts the time already spent."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from llmopt_bench.core.errors import UsageError
from llmopt_bench.core.results import MemoryRecord, StageResult, utcnow
from llmopt_bench.core.workload import WorkloadConfig
from llmopt_bench.run.rundir import RunDir, atomic_write
from llmopt_bench.tune.record import TUNE_JSON, Ratio, TrialRecord, TuneRecord
from llmopt_bench.tune.space import Space, for_device, label
from llmopt_bench.tune.study import STEPS, key, make_study
from llmopt_bench.tune.trial import Measured, Shared, estimate, leftover_servers, run_trial

REFERENCE_STAGE = "hf-fp16"
START_GUESS_S = {"cuda": 180.0, "cpu": 60.0}  # a server start before one was timed here
MAX_DUPLICATES = 40  # proposals of configurations already tried in a row: the sampler has no new one


@dataclass
class TuneOptions:
    out_dir: Path
    space: Space
    model: str  # the model's source
    workload: WorkloadConfig
    slo: str
    hold_s: float
    budget_s: float
    seed: int
    min_quality: float
    command: str
    max_trials: int | None = None
    device: str = "cpu"


def fmt_s(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 else f"{seconds // 60}:{seconds % 60:02d}"


class Tuner:
    """The search over the space within the budget. runner(shared, record, steer) measures one
    configuration (tune/trial.run_trial); clock() is the budget's clock (seconds)."""

    def __init__(self, out: Path, record: TuneRecord, shared: Shared, budget_s: float, max_trials: int | None,
                 runner: Callable[[Shared, TrialRecord, Any], Measured | None] = run_trial,
                 clock: Callable[[], float] = time.monotonic):
        self.out, self.record, self.shared = out, record, shared
        self.budget_s, self.max_trials, self.runner, self.clock = budget_s, max_trials, runner, clock
        self.before_s, self.t0 = record.wall_s, clock()
        self.tried = {key(t.config): t for t in record.finished()}
        self.rerun = {key(t.config): t.number for t in record.trials if t.outcome == "running"}
        record.trials = record.finished()
        self.duplicates = 0
        self.stop_why: str | None = None

    # --- the clock and the record ---------------------------------------------------------------

    def elapsed(self) -> float:
        return self.before_s + self.clock() - self.t0

    def left(self) -> float:
        return self.budget_s - self.elapsed()

    def say(self, msg: str) -> None:
        print(f"[{fmt_s(self.elapsed())} | {fmt_s(self.left())} left] {msg}", file=sys.stderr, flush=True)

    def save(self) -> None:
        self.record.wall_s = round(self.elapsed(), 3)
        atomic_write(self.out / TUNE_JSON, self.record.model_dump_json(indent=1))

    def fits(self, what: str, seconds: float) -> bool:
        if seconds <= self.left():
            return True
        self.say(f"budget: {what} needs about {fmt_s(seconds)}, {fmt_s(self.left())} left")
        return False

    # --- what the trials share ------------------------------------------------------------------

    def known_rps(self) -> float | None:
        """The search's start: the defaults' last capacity when known, else the best so far."""
        d = self.record.trial(self.record.defaults)
        if d and d.last and d.last.capacity_rps:
            return d.last.capacity_rps
        return max((r.capacity_rps for t in self.record.trials for r in t.rungs if r.capacity_rps), default=None)

    def best(self, besides: TrialRecord | None = None) -> TrialRecord | None:
        """The highest held capacity among the trials that pass the quality gate."""
        held = [t for t in self.record.trials if t.outcome == "held" and t.held_rung and t.quality_ok and t is not besides]
        return max(held, key=lambda t: (t.held_rung.capacity_rps or 0, t.defaults), default=None)  # type: ignore[union-attr]

    def best_text(self) -> str:
        b = self.best()
        if b is None or b.held_rung is None:
            return "best so far: none held yet"
        return f"best so far: trial {b.number} ({b.label}) {b.held_rung.capacity_rps:.4g} req/s held"

    def should_confirm(self, rec: TrialRecord) -> bool:
        """Confirm a held capacity while its server is up when it is the best so far (the
        winner is then always confirmed, on the server its capacity was held on)."""
        if not self.shared.space.search.confirm or rec.held_rung is None or not rec.quality_ok:
            return False
        b = self.best(besides=rec)
        better = b is None or (rec.held_rung.capacity_rps or 0) > (b.held_rung.capacity_rps or 0)  # type: ignore[union-attr]
        return better and self.fits(f"trial {rec.number}'s confirmation", self.shared.hold_s * 2 + 60)

    def new_trial_s(self) -> float:
        starts = [t.start_s for t in self.record.trials if t.start_s]
        return (max(starts) if starts else START_GUESS_S.get(self.shared.device, 120.0)) + estimate(self.shared, "short") + 30

    def stop_reason(self) -> str | None:
        done = len(self.record.trials)
        if self.max_trials is not None and done >= self.max_trials:
            return f"{done} trials: --max-trials reached"
        if len(self.tried) >= self.shared.space.size():
            return f"every configuration of the space tried ({self.shared.space.size()})"
        if self.duplicates >= MAX_DUPLICATES:
            return "the sampler proposes only configurations already tried"
        if self.new_trial_s() > self.left():
            return f"the budget: {fmt_s(self.left())} left, a trial needs about {fmt_s(self.new_trial_s())}"
        return None

    # --- the search -----------------------------------------------------------------------------

    def search(self) -> None:

        study = make_study(self.shared.space, self.shared.workload.seed, self.record.finished())
        for config_key in self.rerun:
            study.enqueue_trial(self.tried_config(config_key))
        defaults = self.shared.space.defaults()
        if key(defaults) not in self.tried and key(defaults) not in self.rerun:
            study.enqueue_trial(defaults)

        def after(st: Any, _trial: Any) -> None:
            self.stop_why = self.stop_reason()
            if self.stop_why:
                st.stop()

        self.stop_why = self.stop_reason()
        if self.stop_why is None:
            study.optimize(self.objective, callbacks=[after], catch=())
        self.say(f"search ends: {self.stop_why or 'the sampler tried every configuration'}; {self.best_text()}")
        self.record.notes.append(f"the search ended: {self.stop_why or 'every configuration tried'}")

    @staticmethod
    def tried_config(config_key: str) -> dict[str, Any]:
        import json

        return json.loads(config_key)

    def objective(self, trial: Any) -> float:
        import optuna

        config = {k: trial.suggest_categorical(k, v) for k, v in self.shared.space.knobs.items()}
        seen = self.tried.get(key(config))
        if seen is not None:  # already measured: the study hears its value again, no server starts
            self.duplicates += 1
            if seen.outcome in ("pruned", "stopped"):
                raise optuna.TrialPruned()
            return seen.value or 0.0
        self.duplicates = 0
        rec = self.start(config)
        measured = self.runner(self.shared, rec, TrialSteer(self, trial, rec))
        self.end(rec, measured)
        if rec.outcome in ("pruned", "stopped"):
            raise optuna.TrialPruned()
        return rec.value or 0.0

    def start(self, config: dict[str, Any]) -> TrialRecord:
        number = self.rerun.pop(key(config), None)
        if number is None:
            number = max((t.number for t in self.record.trials), default=0) + 1
        defaults = config == self.shared.space.defaults()
        rec = TrialRecord(number=number, config=config, label=label(config), defaults=defaults, started_at=utcnow())
        self.record.trials.append(rec)
        if defaults:
            self.record.defaults = number
        self.say(f"trial {number}: {rec.label}; {self.best_text()}")
        self.save()
        return rec

    def end(self, rec: TrialRecord, measured: Measured | None) -> None:
        if rec.outcome in ("cannot start", "quality", "skipped", "error"):
            rec.value = 0.0
        elif rec.outcome == "held" and rec.held_rung:
            rec.value = rec.held_rung.capacity_rps
        if measured is not None:
            RunDir(self.out).write_json(self.out / "trials" / f"{rec.number:03d}" / "result.json",
                                        stage_result(rec, measured, f"tune-trial-{rec.number}").model_dump(mode="json"))
        self.tried[key(rec.config)] = rec
        last = rec.last
        got = f"{last.capacity_rps:.4g} req/s at the {last.name} rung" if last and last.capacity_rps else "no capacity"
        self.say(f"trial {rec.number} {rec.outcome}: {got}" + (f" ({rec.reason})" if rec.reason else "") + f"; {self.best_text()}")
        self.save()


class TrialSteer:
    """The tuner as one trial sees it (tune/trial.Steer), with its Optuna trial."""

    def __init__(self, tuner: Tuner, trial: Any, rec: TrialRecord):
        self.tuner, self.trial, self.rec = tuner, trial, rec

    def say(self, msg: str) -> None:
        self.tuner.say(msg)

    def save(self, rec: TrialRecord) -> None:
        self.tuner.save()

    def start_rps(self) -> float | None:
        return self.tuner.known_rps()

    def go_on(self, rec: TrialRecord, rung: Any) -> str | None:
        value = rung.capacity_rps or 0.0
        self.trial.report(value, STEPS[rung.name])
        pruned = self.trial.should_prune()  # the defaults too: their value is every later trial's competitor
        self.say(f"  trial {rec.number} {rung.name} rung: {value:.4g} req/s [{rung.passing_rps or 0:.4g}, "
                 f"{rung.failing_rps or float('inf'):.4g}), {rung.probes} points in {rung.seconds:.0f} s")
        if rec.defaults or not pruned:
            return None
        return (f"successive halving: {value:.4g} req/s at the {rung.name} rung is not among the best "
                f"1/{self.tuner.shared.space.search.reduction_factor} there")

    def fits(self, what: str, seconds: float) -> bool:
        return self.tuner.fits(what, seconds)

    def confirm(self, rec: TrialRecord) -> bool:
        return self.tuner.should_confirm(rec)


def stage_result(rec: TrialRecord, m: Measured, name: str) -> StageResult:
    """A held trial as run.json keeps a vllm-serve result: its hold's samples, its facts (the
    capacity, held, with its interval; the `vllm serve` line), its quality."""
    from llmopt_bench.analysis.metrics import compact, compute

    facts = m.facts.model_copy(update={"serve_command": rec.command, "devices": 1})
    memory = MemoryRecord(process_peak_bytes=rec.memory.gpu_used_bytes, nvml=rec.memory.gpu_used_bytes is not None,
                          note="the server's card memory after its start (NVML), read by llmopt tune") \
        if rec.memory.gpu_used_bytes else MemoryRecord()
    return StageResult(name=name, stage="vllm-serve", description=f"vLLM's server, configuration of llmopt tune trial {rec.number}",
                       changes=rec.label, own_workload=True, status="ok", params={"tune_trial": rec.number, **rec.config},
                       load=m.load, metrics=compute(m.samples), samples=compact(m.samples), memory=memory, quality=rec.quality,
                       facts=facts, extra=m.extra.model_dump(mode="json", exclude_none=True), log=rec.log)


# --- the run directory ----------------------------------------------------------------------------


def reference(opts: TuneOptions, resume: bool) -> None:
    """The FP16 quality reference into run.json, through the runner (skipped when there already)."""
    from llmopt_bench.analysis.selectors import reference as ref_of
    from llmopt_bench.core.models import parse_model
    from llmopt_bench.render.progress import make_reporter
    from llmopt_bench.run.registry import StagePlan
    from llmopt_bench.run.runner import RunOptions, run_journey

    rd = RunDir(opts.out_dir)
    if rd.run_json.is_file() and ref_of(rd.load()) is not None:
        return
    dtype = opts.space.fixed.get("dtype", "auto")
    plans = [StagePlan(name=REFERENCE_STAGE, params={"dtype": dtype, "measure_overhead": False})]
    run_journey(RunOptions(out_dir=opts.out_dir, model=parse_model(opts.model), workload=opts.workload, plans=plans,
                           command=opts.command, resume=rd.run_json.is_file(), min_quality=opts.min_quality), make_reporter())


def shared_of(opts: TuneOptions) -> Shared:
    """What every trial shares: the model (prepared), the load, the quality reference."""
    from llmopt_bench.analysis.selectors import reference as ref_of
    from llmopt_bench.checkpoints.prepare import prepare
    from llmopt_bench.core.models import parse_model
    from llmopt_bench.run.runner import REFERENCE_FILE
    from llmopt_bench.scenarios.serving_record import ServingParams

    load = ServingParams(**opts.space.load, slo=opts.slo, hold_s=opts.hold_s, concurrency=[], throughput_point=False)

    run = RunDir(opts.out_dir).load()
    ref = ref_of(run)
    model = prepare(parse_model(opts.model))
    ref_file = RunDir(opts.out_dir).stage_dir(ref.name) / REFERENCE_FILE if ref else None
    return Shared(model=model, device=opts.device, space=opts.space, load=load, workload=opts.workload, run_dir=opts.out_dir,
                  reference_file=ref_file if ref_file and ref_file.is_file() else None, reference_name=ref.name if ref else None,
                  reference_quality=ref.quality if ref else None, min_quality=opts.min_quality, hold_s=opts.hold_s)


def new_record(opts: TuneOptions) -> TuneRecord:
    return TuneRecord(command=opts.command, created_at=utcnow(), device=opts.device, model=opts.model, space=opts.space,
                      settings={"slo": opts.slo, "hold_s": opts.hold_s, "budget_s": opts.budget_s, "seed": opts.seed,
                                "min_quality": opts.min_quality, "max_trials": opts.max_trials,
                                "workload": opts.workload.model_dump(mode="json")})


def load_record(out: Path) -> TuneRecord:
    path = out / TUNE_JSON
    if not path.is_file():
        raise UsageError(f"--resume {out}: no {TUNE_JSON} there (not a tune run)", "pass a directory written by llmopt tune")
    return TuneRecord.model_validate_json(path.read_text())


def stop_leftovers(out: Path, record: TuneRecord, say: Any) -> None:
    """Servers an interrupted run left running for its unfinished trials (a SIGKILL gives no time to stop them)."""
    from llmopt_bench.procs.spawn import kill_session

    dirs = [str(out / "trials" / f"{t.number:03d}") for t in record.trials if t.outcome == "running"]
    for sid in leftover_servers(dirs) if dirs else []:
        say(f"stopping a server the interrupted run left behind (session {sid})")
        kill_session(sid)


def tune(opts: TuneOptions, record: TuneRecord | None = None) -> TuneRecord:
    """The whole command (see the module doc); `record` is an interrupted run's, to go on with."""
    resume = record is not None
    t0 = time.monotonic()
    say = lambda msg: print(f"[tune] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    if record is not None:
        stop_leftovers(opts.out_dir, record, say)
    say("the FP16 quality reference (hf-fp16), through the runner")
    reference(opts, resume)
    rd = RunDir(opts.out_dir)
    rd.lock()
    try:
        shared = shared_of(opts)
        if record is None:  # the space fitted to this device and model once, when the run begins
            shared.space = opts.space = for_device(opts.space, shared.model, opts.device)
            record = new_record(opts)
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


def conclude(out: Path, record: TuneRecord) -> None:
    """The winner, the ratio to the defaults, run.json's two results, tune.md and its chart."""
    from llmopt_bench.tune.report import write_report

    held = [t for t in record.trials if t.outcome == "held" and t.held_rung and t.quality_ok]
    winner = max(held, key=lambda t: (t.held_rung.capacity_rps or 0, t.defaults), default=None)  # type: ignore[union-attr]
    record.winner = winner.number if winner else None
    defaults = record.trial(record.defaults)
    record.ratio = ratio(winner, defaults) if winner and defaults else None
    put_results(out, record)
    try:
        write_report(out, record)
    except Exception as e:  # noqa: BLE001 - tune.json holds every trial: the report can be written again
        print(f"warning: tune.md not written ({type(e).__name__}: {e})", file=sys.stderr)


def ratio(winner: TrialRecord, defaults: TrialRecord) -> Ratio | None:
    w, d = winner.held_rung or winner.last, defaults.held_rung or defaults.last
    if not (w and d and w.capacity_rps and d.capacity_rps):
        return None
    return Ratio(value=w.capacity_rps / d.capacity_rps, lo=w.capacity_rps / d.failing_rps if d.failing_rps else None,
                 hi=w.failing_rps / d.capacity_rps if w.failing_rps else None)


def put_results(out: Path, record: TuneRecord) -> None:
    """run.json's tune-defaults and tune-winner: the held results llmopt recommend and compare read."""
    from llmopt_bench.analysis.quality_gate import apply_gate

    rd = RunDir(out)
    if not rd.run_json.is_file():
        return
    run = rd.load()
    run.stages = [s for s in run.stages if not s.name.startswith("tune-")]
    roles = [("tune-defaults", record.defaults)] + ([("tune-winner", record.winner)] if record.winner != record.defaults else [])
    for name, number in roles:
        path = out / "trials" / f"{number or 0:03d}" / "result.json"
        if number is not None and path.is_file():
            run.stages.append(StageResult.model_validate_json(path.read_text()).model_copy(update={"name": name}))
    apply_gate(run, run.min_quality)
    run.status = "interrupted" if record.status == "interrupted" else run.status
    rd.save(run)

