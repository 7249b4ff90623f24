"""The search of `llmopt tune` within its budget (tune/command.py runs it; docs/tune.md, "How the
search spends its budget"). Each step is one server start (tune/trial.py), chosen from the record
alone (tune/study.py):

1. **the defaults**: every rung (ceiling, short, precise, held): the reference, both ends of its
   capacity known to the precision.
2. **screen**: every configuration one knob away from the defaults, on its ceiling alone (rung 0:
   a server start and one all-at-once point). What vLLM is known to refuse, or refused in an
   earlier trial, is not started (tune/constraints.py), with the reason.
3. **narrow**: of the screened, the best 1/eta by ceiling whose ceiling leaves room above the best
   held capacity, best first, started again for their capacity under the SLO; a rung that shows
   it cannot beat the best held stops it; one that can is held.
4. **combine**: the knobs that each raised the ceiling beyond the noise, together (most promising
   first), screened, then narrowed the same way; then a second round from the winner's one-knob
   neighbours ([search] rounds).
5. **confirm**: the winner by vLLM's own client (tune/confirm.py) on its server when it becomes the
   best held, else on a start of its own at the end: the time for that start and run is kept back
   from the start (every trial starts only where the time left holds it and that reserve).

Every trial is written to tune.json when it starts and when it ends. A resumed run (the record of
an interrupted run) replays the plan over the finished trials without starting them again and runs
the interrupted trial again under its number; the budget counts the time already spent."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Callable

from llmopt_bench.core.models import portable_text
from llmopt_bench.core.results import utcnow
from llmopt_bench.run.rundir import RunDir, atomic_write
from llmopt_bench.tune.answer import eligible, quality_allows, stage_result, winner_of
from llmopt_bench.tune.constraints import Refusal, items_of, known_refusal, learned, learned_refusal
from llmopt_bench.tune.record import TUNE_JSON, Phase, Rung, TrialRecord, TuneRecord
from llmopt_bench.tune.space import DEFAULT, Config, label, pairs, settings
from llmopt_bench.tune.study import beats, can_win, changed, combinations, halving, helpers, key, neighbours
from llmopt_bench.tune.trial import Measured, Shared, estimate, run_trial

START_GUESS_S = {"cuda": 180.0, "cpu": 60.0}  # a server start before one was timed here
OTHER_GUESS_S = 20.0  # a start's quality check, warm-up and stop, before one was timed
CONFIRM_EXTRA_S = 30.0  # vllm bench serve's own start and drain, beside its hold_s of arrivals
SCREENED = ("screened", "pruned", "held", "hold failed", "hold not judged", "stopped")  # outcomes with a ceiling


def fmt_s(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 else f"{seconds // 60}:{seconds % 60:02d}"


class Stop(Exception):
    """The search ends here (the budget, --max-trials): the winner's confirmation still runs."""


class Tuner:
    """The search over the space within the budget. runner(shared, record, steer) measures one
    configuration (tune/trial.run_trial); clock() is the budget's clock (seconds)."""

    def __init__(self, out: Path, record: TuneRecord, shared: Shared, budget_s: float, max_trials: int | None,
                 runner: Callable[[Shared, TrialRecord, Any], Measured | None] = run_trial,
                 clock: Callable[[], float] = time.monotonic):
        self.out, self.record, self.shared = out, record, shared
        self.budget_s, self.max_trials, self.runner, self.clock = budget_s, max_trials, runner, clock
        self.before_s, self.t0 = record.wall_s, clock()
        self.rerun = {(key(t.config), t.phase): t.number for t in record.trials if t.outcome == "running"}
        record.trials = record.finished()
        self.stop_why: str | None = None
        self.search_s = self.shared.space.search

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

    # --- what things cost -----------------------------------------------------------------------

    def start_s(self) -> float:
        starts = [t.start_s for t in self.record.trials if t.start_s]
        return max(starts) if starts else START_GUESS_S.get(self.shared.device, 120.0)

    def other_s(self) -> float:
        """A start's time besides the server's start and its rungs (quality, warm-up, stop): the longest seen."""
        seen = [t.seconds - (t.start_s or 0) - sum(r.seconds for r in t.rungs) - (self.confirm_s() if t.confirmation else 0)
                for t in self.record.trials if t.seconds and t.start_s and t.phase != "confirm"]
        return max(max(seen), 0.0) if seen else OTHER_GUESS_S

    def rung_s(self, rung: str) -> float:
        """A rung's expected cost: the longest it took here so far (plus a quarter), else its settings' estimate."""
        seen = [r.seconds for t in self.record.trials for r in t.rungs if r.name == rung and r.seconds]
        return max(seen) * 1.25 if seen else estimate(self.shared, rung)

    def confirm_s(self) -> float:
        return self.shared.hold_s + CONFIRM_EXTRA_S

    def reserve_s(self) -> float:
        """Kept back from the start: the winner's confirmation on a server of its own."""
        return self.start_s() + self.other_s() + self.confirm_s() if self.search_s.confirm else 0.0

    def trial_s(self, rungs: tuple[str, ...]) -> float:
        return self.start_s() + self.other_s() + sum(self.rung_s(r) for r in rungs)

    def fits(self, what: str, seconds: float, reserve: bool = True) -> bool:
        """Whether `what` (seconds) fits in the time left, the confirmation's reserve kept back."""
        kept = self.reserve_s() if reserve else 0.0
        if seconds + kept <= self.left():
            return True
        self.say(f"budget: {what} needs about {fmt_s(seconds)}" + (f" and {fmt_s(kept)} is kept back for the winner's "
                                                                     "confirmation" if kept else "") + f"; {fmt_s(self.left())} left")
        return False

    def afford(self, what: str, seconds: float) -> None:
        """Go on only where the next start fits (the budget) and may start (--max-trials)."""
        started = sum(1 for t in self.record.trials if t.outcome != "not started")
        if self.max_trials is not None and started >= self.max_trials:
            raise Stop(f"{started} server starts: --max-trials reached")
        if not self.fits(what, seconds):
            raise Stop(f"the budget: {what} needs about {fmt_s(seconds)} besides the {fmt_s(self.reserve_s())} kept back "
                       f"for the winner's confirmation; {fmt_s(self.left())} left")

    # --- what the trials say --------------------------------------------------------------------

    @property
    def real_weights(self) -> bool:
        return bool(self.record.settings.real_weights)

    def best(self, besides: TrialRecord | None = None) -> TrialRecord | None:
        """The highest held capacity among the trials that may win (tune/answer.eligible)."""
        return winner_of([t for t in self.record.trials if t is not besides], self.real_weights)

    def best_held_rps(self) -> float | None:
        b = self.best()
        return b.held_rung.capacity_rps if b and b.held_rung else None

    def best_text(self) -> str:
        b = self.best()
        if b is None or b.held_rung is None:
            return "best so far: none held yet"
        return f"best so far: trial {b.number} ({b.label}) {b.held_rung.capacity_rps:.4g} req/s held"

    def known_rps(self) -> float | None:
        """Where a search without a ceiling point starts: the defaults' capacity when known, else the best so far."""
        d = self.record.trial(self.record.defaults)
        if d and d.last and d.last.capacity_rps:
            return d.last.capacity_rps
        return max((r.capacity_rps for t in self.record.trials for r in t.rungs if r.capacity_rps), default=None)

    def find(self, config: Config, phases: tuple[Phase | None, ...]) -> TrialRecord | None:
        """The latest finished trial of this configuration in one of these phases."""
        found = [t for t in self.record.trials if key(t.config) == key(config) and t.phase in phases]
        return found[-1] if found else None

    def screened(self, config: Config) -> TrialRecord | None:
        """What is known of a configuration's ceiling: a trial that measured it, or one that could not start."""
        found = [t for t in self.record.trials if key(t.config) == key(config) and t.phase != "confirm"
                 and (t.ceiling_rps is not None or t.outcome in ("cannot start", "not started", "quality", "skipped", "error"))]
        return found[0] if found else None

    def refusals(self) -> list[Refusal]:
        failed = [(t.number, items_of(t.config, DEFAULT), t.cause) for t in self.record.trials
                  if t.outcome == "cannot start" and t.cause]
        return learned(failed)

    def refusal(self, config: Config) -> str | None:
        """Why this configuration is not started: vLLM is known to refuse it, or refused its knobs here."""
        cap = getattr(self.shared.model, "max_position_embeddings", None)
        return known_refusal(settings(self.shared.space, config), cap) or \
            learned_refusal(items_of(config, DEFAULT), self.refusals())

    # --- the search -----------------------------------------------------------------------------

    def search(self) -> None:
        try:
            self.plan()
            self.stop_why = self.stop_why or "every planned configuration tried"
        except Stop as e:
            self.stop_why = str(e)
        self.say(f"search ends: {self.stop_why}; {self.best_text()}")
        self.record.notes.append(f"the search ended: {self.stop_why}")
        self.confirm_winner()

    def plan(self) -> None:
        space = self.shared.space
        base = space.defaults()
        d = self.find(base, ("defaults",)) or self.run(base, "defaults", f"the reference: {space.reference_name()}, every rung")
        if d.defaults and self.record.defaults is None:
            self.record.defaults = d.number
        base_rec: TrialRecord | None = d
        for round_ in range(1, space.search.rounds + 1):
            if base_rec is None or base_rec.ceiling_rps is None:
                self.record.notes.append(f"round {round_}: its base has no ceiling to compare with; the search ends")
                return
            where = "the defaults" if base == space.defaults() else f"trial {base_rec.number} ({base_rec.label})"
            singles = [self.screen(c, "screen", f"round {round_}: one knob from {where}: "
                                                  f"{', '.join(f'{k}={v}' for k, v in changed(c, base).items())}")
                       for c in neighbours(space, base)]
            self.narrow([t for t in singles if t is not None])
            helping = helpers(base, base_rec.ceiling_rps, [(t.config, t.ceiling_rps) for t in singles if t and t.ceiling_rps],
                              space.search.screen_noise)
            if helping:
                self.record.notes.append(f"round {round_}: the knobs that raised the ceiling of {where} beyond the "
                                         f"screen's noise ({space.search.screen_noise:.0%}): " +
                                         ", ".join(f"{k}={v} ({g:.2f}x)" for k, vs in helping.items() for v, g in vs))
            combined = [self.screen(c, "combine", f"round {round_}: the knobs that each helped, together: "
                                                   f"{', '.join(f'{k}={v}' for k, v in changed(c, base).items())}")
                        for c in combinations(base, helping, space.search.combinations)]
            self.narrow([t for t in combined if t is not None])
            best = self.best()
            if best is None or key(best.config) == key(base):
                return
            base, base_rec = best.config, best

    def screen(self, config: Config, phase: Phase, why: str) -> TrialRecord | None:
        """The configuration's ceiling (rung 0), from a trial already run, or a start of its own."""
        seen = self.screened(config)
        if seen is not None:
            return seen
        refused = self.refusal(config)
        if refused:
            rec = self.new_record(config, phase, why)
            rec.outcome, rec.reason, rec.value = "not started", refused, 0.0
            self.say(f"trial {rec.number} not started ({rec.label}): {refused}")
            self.save()
            return rec
        self.afford(f"screening {label(config, self.shared.space.defaults())}", self.trial_s(("ceiling",)))
        return self.run(config, phase, why)

    def narrow(self, screened: list[TrialRecord]) -> None:
        """Successive halving over what a phase screened: the best 1/eta by ceiling, each only while
        its ceiling leaves room above the best held capacity, best first."""
        s = self.shared.space.search
        ranked = sorted((t for t in screened if t.outcome == "screened" and quality_allows(t, self.real_weights)),
                        key=lambda t: -(t.ceiling_rps or 0))
        keep = halving(len(ranked), s.reduction_factor)
        for i, t in enumerate(ranked):
            done = self.find(t.config, ("narrow",))
            if done is not None:
                continue
            best = self.best_held_rps()
            if i >= keep:
                t.decision = (f"not narrowed: its ceiling ({t.ceiling_rps:.4g} req/s) is not among the best 1/{s.reduction_factor} "
                              f"of the {len(ranked)} screened with it")
            elif not can_win(t.ceiling_rps, best, s.screen_noise):
                t.decision = (f"not narrowed: its ceiling ({t.ceiling_rps:.4g} req/s, +{s.screen_noise:.0%} for noise) is not above "
                              f"the best held capacity ({best:.4g} req/s), and a capacity never exceeds its ceiling")
            else:
                self.afford(f"narrowing {t.label}", self.trial_s(("ceiling", "short", "precise", "held")))
                n = self.run(t.config, "narrow", f"its ceiling ({t.ceiling_rps:.4g} req/s, trial {t.number}) is the best "
                                                 f"left of its phase and above the best held capacity ({best or 0:.4g} req/s)")
                t.decision = f"narrowed in trial {n.number}"
            self.save()

    def confirm_winner(self) -> None:
        """The winner confirmed by vLLM's client where its own server did not: a start for it alone,
        in the time kept back for it; else the record says why not."""
        w = self.best()
        if w is None or w.confirmation is not None or not self.search_s.confirm:
            return
        done = [t for t in self.record.trials if t.phase == "confirm" and t.confirms == w.number and t.confirmation]
        if done:
            w.confirmation = done[-1].confirmation.model_copy(update={"on_trial": done[-1].number})  # type: ignore[union-attr]
            return
        if not self.fits(f"the winner's confirmation (trial {w.number})", self.start_s() + self.other_s() + self.confirm_s(),
                         reserve=False):
            self.record.notes.append(f"the winner (trial {w.number}) is not confirmed by vLLM's client: the budget left "
                                     f"{fmt_s(self.left())}, its start and run need about "
                                     f"{fmt_s(self.start_s() + self.other_s() + self.confirm_s())}")
            return
        c = self.run(w.config, "confirm", f"the winner (trial {w.number}) confirmed by vLLM's client on a start of its own",
                     confirms=w.number)
        if c.confirmation is not None:
            w.confirmation = c.confirmation.model_copy(update={"on_trial": c.number})
        else:
            self.record.notes.append(f"the winner's confirmation (trial {c.number}) did not run: {c.outcome}"
                                     + (f" ({c.reason})" if c.reason else ""))
        self.save()

    # --- one start ------------------------------------------------------------------------------

    def new_record(self, config: Config, phase: Phase, why: str, confirms: int | None = None) -> TrialRecord:
        number = self.rerun.pop((key(config), phase), None)
        if number is None:
            number = max((t.number for t in self.record.trials), default=0) + 1
        defaults = phase == "defaults"
        rec = TrialRecord(number=number, config=config, label=label(config, self.shared.space.defaults()), defaults=defaults, phase=phase, why=why,
                          confirms=confirms, started_at=utcnow(),
                          paired={k: f"{v}: {reason}" for k, (v, reason) in pairs(self.shared.space, config).items()})
        self.record.trials.append(rec)
        self.record.trials.sort(key=lambda t: t.number)
        return rec

    def run(self, config: Config, phase: Phase, why: str, confirms: int | None = None) -> TrialRecord:
        rec = self.new_record(config, phase, why, confirms)
        if rec.defaults:
            self.record.defaults = rec.number
        extra = "".join(f"; with {k}={v}" for k, v in rec.paired.items())
        self.say(f"trial {rec.number} ({phase}): {rec.label}{extra}; {self.best_text()}")
        self.save()
        measured = self.runner(self.shared, rec, TrialSteer(self, rec))
        self.end(rec, measured)
        return rec

    def end(self, rec: TrialRecord, measured: Measured | None) -> None:
        if rec.outcome == "cannot start":
            self.explain(rec)
        if rec.outcome in ("cannot start", "quality", "skipped", "error"):
            rec.value = 0.0
        elif rec.outcome == "held" and rec.held_rung:
            rec.value = rec.held_rung.capacity_rps
        if measured is not None:
            RunDir(self.out).write_json(self.out / "trials" / f"{rec.number:03d}" / "result.json",
                                        stage_result(rec, measured, f"tune-trial-{rec.number}").model_dump(mode="json"))
        last = rec.last
        got = f"{last.capacity_rps:.4g} req/s at the {last.name} rung" if last and last.capacity_rps else \
            f"ceiling {last.ceiling_rps:.4g} req/s" if last and last.ceiling_rps else "no capacity"
        self.say(f"trial {rec.number} {rec.outcome}: {got}" + (f" ({rec.reason})" if rec.reason else "") + f"; {self.best_text()}")
        self.save()

    def explain(self, rec: TrialRecord) -> None:
        """A start that failed: its root cause from the whole server log (the error's own text
        keeps only the log's last lines, where vLLM's API server says "see root cause above")."""
        log = self.out / rec.log if rec.log else None
        text = log.read_text(errors="replace") if log is not None and log.is_file() else ""
        if not text:
            return
        from llmopt_bench.engines.vllm.startlog import start_failure

        kind, said = start_failure(text, timed_out=(rec.reason or "").startswith("did not start in time"))
        rec.cause, rec.reason = said, f"{kind}: {said}"

    # --- the tuner as a trial sees it -------------------------------------------------------------

    def go_on(self, rec: TrialRecord, rung: Rung) -> str | None:
        """Why this trial stops after this rung (None: it goes on)."""
        s = self.shared.space.search
        best = self.best_held_rps()
        if rung.name == "ceiling":
            self.say(f"  trial {rec.number} ceiling: {rung.ceiling_rps or 0:.4g} req/s all at once in {rung.seconds:.0f} s")
            if rec.phase == "combine" and self.leads(rec, rung.ceiling_rps) and can_win(rung.ceiling_rps, best, s.screen_noise):
                rec.decision = "narrowed on its own start: its ceiling is the highest seen, beyond the noise"
                return None  # the most promising yet: its capacity now, on the server that is up
            if rec.phase in ("screen", "combine"):
                return "rung 0 only, as planned"
            if rec.defaults or can_win(rung.ceiling_rps, best, s.screen_noise):
                return None
            return (f"its ceiling on this start ({rung.ceiling_rps or 0:.4g} req/s) is not above the best held capacity "
                    f"({best:.4g} req/s)")
        top = rung.top
        self.say(f"  trial {rec.number} {rung.name} rung: {rung.capacity_rps or 0:.4g} req/s [{rung.passing_rps or 0:.4g}, "
                 f"{f'{top:.4g}' if top else 'not bounded'}), {rung.probes} points in {rung.seconds:.0f} s")
        if rec.defaults or best is None or top is None or beats(top, best, s.precision):
            return None
        return (f"its capacity is below {top:.4g} req/s ({rung.name} rung): it cannot beat the best held ({best:.4g} req/s) "
                f"by more than the precision ({s.precision:.0%})")

    def leads(self, rec: TrialRecord, ceiling_rps: float | None) -> bool:
        """Whether this ceiling beats every other one measured so far, beyond the screen's noise."""
        others = [t.ceiling_rps for t in self.record.trials if t is not rec and t.ceiling_rps]
        return beats(ceiling_rps, max(others, default=None), self.shared.space.search.screen_noise)

    def should_confirm(self, rec: TrialRecord) -> bool:
        """Confirm a held capacity while its server is up when it is the best so far (the defaults
        wait: they win only where nothing beats them, and then the reserve confirms them)."""
        if not self.search_s.confirm or rec.held_rung is None or rec.defaults or not eligible(rec, self.real_weights):
            return False
        b = self.best(besides=rec)
        better = b is None or (rec.held_rung.capacity_rps or 0) > (b.held_rung.capacity_rps or 0)  # type: ignore[union-attr]
        return better and self.fits(f"trial {rec.number}'s confirmation", self.confirm_s(), reserve=False)

    def confirm_rate(self, rec: TrialRecord) -> float | None:
        if rec.phase != "confirm":
            return None
        w = self.record.trial(rec.confirms)
        return w.held_rung.capacity_rps if w and w.held_rung else None


class TrialSteer:
    """The tuner as one trial sees it (tune/trial.Steer)."""

    def __init__(self, tuner: Tuner, rec: TrialRecord):
        self.tuner, self.rec = tuner, rec

    def say(self, msg: str) -> None:
        self.tuner.say(msg)

    def save(self, rec: TrialRecord) -> None:
        self.tuner.save()

    def start_rps(self) -> float | None:
        return self.tuner.known_rps()

    def go_on(self, rec: TrialRecord, rung: Rung) -> str | None:
        return self.tuner.go_on(rec, rung)

    def fits(self, what: str, seconds: float) -> bool:
        return self.tuner.fits(what, seconds)

    def rung_s(self, rung: str) -> float:
        return self.tuner.rung_s(rung)

    def confirm(self, rec: TrialRecord) -> bool:
        return self.tuner.should_confirm(rec)

    def confirm_rate(self, rec: TrialRecord) -> float | None:
        return self.tuner.confirm_rate(rec)
