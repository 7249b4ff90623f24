"""The search of `llmopt tune` within its budget (tune/command.py runs it): vLLM's defaults first,
then what the study proposes (tune/study.py), each configuration one trial (tune/trial.py): a
trial starts only while the time left holds a server start and its short rung, a rung only
while it holds that rung. Every trial is written to tune.json when it starts and when it ends;
progress lines say the trial, each rung's capacity, the best held so far and the time left.

A resumed search (the record of an interrupted run) keeps the finished trials, gives them back to
the study, and runs the interrupted trial again under its number; the budget counts the time
already spent."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Callable

from llmopt_bench.core.models import portable_text
from llmopt_bench.core.results import utcnow
from llmopt_bench.run.rundir import RunDir, atomic_write
from llmopt_bench.tune.answer import stage_result
from llmopt_bench.tune.record import TUNE_JSON, TrialRecord, TuneRecord
from llmopt_bench.tune.space import Config, label
from llmopt_bench.tune.study import STEPS, key, make_study
from llmopt_bench.tune.trial import Measured, Shared, estimate, run_trial

START_GUESS_S = {"cuda": 180.0, "cpu": 60.0}  # a server start before one was timed here
MAX_DUPLICATES = 40  # proposals of configurations already tried in a row: the sampler has no new one


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
        # the cache's and the home's paths in portable form, as run.json writes them ($LLMOPT_CACHE/..., ~/...)
        atomic_write(self.out / TUNE_JSON, portable_text(self.record.model_dump_json(indent=1)))

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

    def rung_s(self, rung: str) -> float:
        """A rung's expected cost: the longest it took here so far (plus a quarter), else its settings' estimate."""
        seen = [r.seconds for t in self.record.trials for r in t.rungs if r.name == rung and r.seconds]
        return max(seen) * 1.25 if seen else estimate(self.shared, rung)

    def new_trial_s(self) -> float:
        starts = [t.start_s for t in self.record.trials if t.start_s]
        return (max(starts) if starts else START_GUESS_S.get(self.shared.device, 120.0)) + self.rung_s("short") + 30

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
    def tried_config(config_key: str) -> Config:
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

    def start(self, config: Config) -> TrialRecord:
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
        top = f"{rung.failing_rps:.4g}" if rung.failing_rps else "no failing rate yet"
        self.say(f"  trial {rec.number} {rung.name} rung: {value:.4g} req/s [{rung.passing_rps or 0:.4g}, {top}), "
                 f"{rung.probes} points in {rung.seconds:.0f} s")
        if rec.defaults or not pruned:
            return None
        return (f"successive halving: {value:.4g} req/s at the {rung.name} rung is not among the best "
                f"1/{self.tuner.shared.space.search.reduction_factor} there")

    def fits(self, what: str, seconds: float) -> bool:
        return self.tuner.fits(what, seconds)

    def rung_s(self, rung: str) -> float:
        return self.tuner.rung_s(rung)

    def confirm(self, rec: TrialRecord) -> bool:
        return self.tuner.should_confirm(rec)
