"""llmopt tune's search on a constructed capacity: every configuration's capacity under the SLO is
a known number (a load point at rate r meets the SLO exactly when r <= it), so the answer is
known and the search can be judged against it. Everything above the server is the real code:
the Tuner (budget, stop rules, resume, winner, ratio), the Optuna study (sampler, successive
halving), the rungs (tune/trial.climb), the capacity adapter and the search from the server's ceiling
down with its hold (tune/server_capacity.ServerCapacity over load/capacity/find.py). The time is a
constructed clock: a server start costs START_S, a load point its length, so the budget is exact."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from llmopt_bench.core.records import QualityRecord
from llmopt_bench.core.workload import WorkloadConfig
from llmopt_bench.load.capacity.search import Trial
from llmopt_bench.scenarios.serving.record import ServingParams
from llmopt_bench.tune.answer import conclude
from llmopt_bench.tune.command import TuneOptions, new_record
from llmopt_bench.tune.record import TUNE_JSON, Confirmation, TuneRecord
from llmopt_bench.tune.server_capacity import ServerCapacity
from llmopt_bench.tune.space import DEFAULT, SearchSettings, Space
from llmopt_bench.tune.study import key
from llmopt_bench.tune.trial import Shared, climb, passes
from llmopt_bench.tune.tuner import Tuner

START_S = 30.0
HOLD_S = 60.0
SEQS = [DEFAULT, 64, 128, 256, 512]
TOKENS = [DEFAULT, 2048, 8192]


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def capacity_of(config: dict) -> float:
    """req/s: vLLM's defaults 10; the best is max_num_seqs 256 with 8192 tokens a step (14)."""
    seqs = {DEFAULT: 1.0, 64: 0.8, 128: 1.1, 256: 1.25, 512: 1.2}[config.get("max_num_seqs", DEFAULT)]
    tokens = {DEFAULT: 1.0, 2048: 0.9, 8192: 1.12}[config.get("max_num_batched_tokens", DEFAULT)]
    return 10.0 * seqs * tokens


class FakeRun:
    """The serving scenario's run as the capacity adapter drives it, on a server of known capacity."""

    def __init__(self, true_rps: float, params: ServingParams, clock: Clock):
        self.true, self.p, self.clock = true_rps, params, clock
        self.rows: list = []
        self.seen: tuple[float | None, str | None] = (None, None)
        self.ceiling = lambda: self.seen
        self.points: list[float] = []

    def ceiling_point(self) -> None:  # all at once, the server completes 1.2x its capacity under the SLO
        if self.p.ceiling_requests:
            self.clock.t += 10
            self.seen = (1.2 * self.true, f"{self.p.ceiling_requests} at once")

    def measure(self, phase, point):  # no ceiling point: the start rate's closed loop completes 2x the capacity
        self.clock.t += 10
        return SimpleNamespace(qps=2 * self.true), None, None

    def estimate(self, rate: float, hold_s: float | None) -> float:  # the seconds of load a point takes here
        return (hold_s or self.p.min_point_s) + self.p.warmup_s

    def trial(self, rate: float, hold_s: float | None = None) -> Trial:
        self.points.append(rate)
        hold = bool(hold_s)
        cost = self.estimate(rate, self.p.hold_s if hold else None)
        self.clock.t += cost
        return Trial(rate=rate, ok=rate <= self.true, latency_s=rate / self.true, kind="hold" if hold else "probe", cost_s=cost)


def quality(ppl: float) -> QualityRecord:
    return QualityRecord(reference="hf-fp16", perplexity=ppl, perplexity_meaningful=True, token_match_rate=0.9)


def make(tmp: Path, budget_s: float = 24 * 3600, knobs: dict | None = None, refuse=(), worse=(), max_trials=None, ceiling_requests=256,
         record: TuneRecord | None = None, clock: Clock | None = None):
    """A Tuner over a constructed space; the runner starts no server: it charges the clock for a
    start, refuses `refuse`, gives `worse` a perplexity 5% above the reference's, and climbs."""
    knobs = knobs or {"max_num_seqs": SEQS, "max_num_batched_tokens": TOKENS}
    space = Space(path="constructed.toml", knobs=knobs, search=SearchSettings(short_point_s=5, point_s=10, confirm=True))
    load = ServingParams(slo="ttft_p99=2s,tpot_p99=100ms", hold_s=HOLD_S, requests_per_point=8, warmup_s=1,
                         ceiling_requests=ceiling_requests)
    shared = Shared(model=None, device="cuda", space=space, load=load, workload=WorkloadConfig(), run_dir=tmp,
                    reference_file=None, reference_name="hf-fp16", reference_quality=quality(10.0), min_quality=0.99,
                    hold_s=HOLD_S)
    clock = clock or Clock()
    calls: list[dict] = []

    def runner(shared, rec, steer):
        calls.append(dict(rec.config))
        clock.t += START_S
        if key(rec.config) in {key(c) for c in refuse}:
            rec.outcome, rec.reason = "cannot start", "invalid combination: constructed"
            return None
        rec.start_s = START_S
        if not passes(shared, rec, quality(10.5 if key(rec.config) in {key(c) for c in worse} else 10.02)):
            return None
        run = FakeRun(capacity_of(rec.config), shared.load, clock)
        climb(shared, rec, ServerCapacity(run), steer,
              lambda rate: Confirmation(rate_rps=rate, seconds=HOLD_S, num_prompts=int(rate * HOLD_S), command="vllm bench serve",
                                        verdict="held" if rate <= run.true else "missed"))
        return None

    opts = TuneOptions(out_dir=tmp, space=space, model="synthetic:constructed", workload=WorkloadConfig(), slo=load.slo,
                       hold_s=HOLD_S, budget_s=budget_s, seed=0, min_quality=0.99, command="llmopt tune", max_trials=max_trials)
    rec = record or new_record(opts)
    return Tuner(tmp, rec, shared, budget_s, max_trials, runner=runner, clock=clock), calls, clock


def every(tuner):
    return {key(t.config): t for t in tuner.record.trials}


def test_the_search_finds_the_constructed_best_and_holds_it_against_the_defaults(tmp_path):
    tuner, calls, _ = make(tmp_path)
    tuner.search()
    conclude(tmp_path, tuner.record)
    rec = tuner.record
    first = rec.trials[0]
    assert first.defaults and first.config == {"max_num_seqs": DEFAULT, "max_num_batched_tokens": DEFAULT}
    assert first.outcome == "held" and [r.name for r in first.rungs] == ["short", "precise", "held"]
    assert len(calls) == len({key(c) for c in calls}) == 15, "every configuration once, no server started twice for one"
    w = rec.trial(rec.winner)
    assert w.config == {"max_num_seqs": 256, "max_num_batched_tokens": 8192}
    assert w.held_rung.capacity_rps <= capacity_of(w.config) < w.held_rung.failing_rps
    assert w.held_rung.failing_rps / w.held_rung.capacity_rps <= 1.05 + 1e-9  # narrowed to the precision before the hold
    assert w.confirmation is not None and w.confirmation.verdict == "held"
    d = first.held_rung
    assert rec.ratio.lo <= capacity_of(w.config) / capacity_of(first.config) <= rec.ratio.hi
    assert rec.ratio.value == pytest.approx(w.held_rung.capacity_rps / d.capacity_rps)
    # successive halving: configurations well below the best never reach the precise rung
    pruned = [t for t in rec.trials if t.outcome == "pruned"]
    assert pruned and all(len(t.rungs) < 3 for t in pruned)
    assert all(capacity_of(t.config) < capacity_of(w.config) for t in pruned)
    assert any(t.config["max_num_seqs"] == 64 and t.outcome == "pruned" for t in rec.trials)


@pytest.mark.parametrize("ceiling_requests", [256, 0])
def test_each_configuration_s_search_starts_under_its_own_ceiling_or_at_a_measured_start(tmp_path, ceiling_requests):
    """With a ceiling point (the default), every configuration's first trial is just under the rate
    its server completed all at once (1.2x its capacity here), not at another configuration's
    answer; without one (ceiling_requests 0), the first at half what a closed loop completed
    and the others at a capacity an earlier configuration reached."""
    tuner, _, _ = make(tmp_path, knobs={"max_num_seqs": SEQS[:3]}, ceiling_requests=ceiling_requests)
    runs: list = []
    real = FakeRun.trial

    def spy(self, rate, hold_s=None):
        if not self.points:
            runs.append((self.true, rate))
        return real(self, rate, hold_s)

    FakeRun.trial = spy
    try:
        tuner.search()
    finally:
        FakeRun.trial = real
    assert len(runs) == 3
    short = SearchSettings().short_precision
    if ceiling_requests:
        assert all(first == pytest.approx(1.2 * true / (1 + short)) for true, first in runs), runs
    else:
        reached = {r.capacity_rps for t in tuner.record.trials for r in t.rungs}
        assert runs[0][1] == pytest.approx(runs[0][0]) and all(first in reached for _, first in runs[1:]), runs
    for t in tuner.record.trials:
        assert t.held_rung is None or t.held_rung.capacity_rps <= capacity_of(t.config)


def test_a_config_that_fails_the_quality_gate_is_not_the_answer_whatever_its_speed(tmp_path):
    best = {"max_num_seqs": 256, "max_num_batched_tokens": 8192}
    tuner, _, _ = make(tmp_path, worse=[best])
    tuner.search()
    conclude(tmp_path, tuner.record)
    rec = tuner.record
    failed = every(tuner)[key(best)]
    assert failed.outcome == "quality" and failed.value == 0.0 and "quality gate" in failed.reason
    assert rec.trial(rec.winner).config == {"max_num_seqs": 512, "max_num_batched_tokens": 8192}  # the next best


def test_a_configuration_the_server_refuses_is_an_outcome_and_the_search_goes_on(tmp_path):
    refused = {"max_num_seqs": 512, "max_num_batched_tokens": 2048}
    tuner, calls, _ = make(tmp_path, refuse=[refused])
    tuner.search()
    t = every(tuner)[key(refused)]
    assert t.outcome == "cannot start" and t.value == 0.0 and t.reason.startswith("invalid combination")
    assert len(calls) == 15


def test_the_budget_bounds_the_search_and_no_rung_starts_that_it_cannot_hold(tmp_path):
    budget = 900.0
    tuner, calls, clock = make(tmp_path, budget_s=budget)
    tuner.search()
    assert 1 < len(calls) < 15
    assert clock.t <= budget, "the search ran past its budget"
    assert "budget" in (tuner.stop_why or "")
    assert tuner.record.trials[0].outcome == "held"  # the defaults' first, whole
    saved = TuneRecord.model_validate_json((tmp_path / TUNE_JSON).read_text())
    assert [t.number for t in saved.trials] == [t.number for t in tuner.record.trials]


def test_a_resumed_search_keeps_the_finished_trials_and_runs_the_interrupted_one_again(tmp_path):
    tuner, calls, clock = make(tmp_path, max_trials=4)
    tuner.search()
    assert len(calls) == 4
    saved = TuneRecord.model_validate_json((tmp_path / TUNE_JSON).read_text())
    interrupted = saved.trials[-1]
    interrupted.outcome, interrupted.rungs = "running", interrupted.rungs[:1]  # killed in its precise rung
    done = {key(t.config) for t in saved.trials[:-1]}
    again, calls2, _ = make(tmp_path, record=saved, clock=clock)
    again.search()
    assert key(calls2[0]) == key(interrupted.config), "the interrupted trial runs first"
    assert every(again)[key(interrupted.config)].number == interrupted.number
    assert not done & {key(c) for c in calls2}, "a finished trial ran again"
    assert len(again.record.trials) == 15 and len({t.number for t in again.record.trials}) == 15
    conclude(tmp_path, again.record)
    assert again.record.trial(again.record.winner).config == {"max_num_seqs": 256, "max_num_batched_tokens": 8192}


def test_tpe_proposes_a_large_space_within_the_budget_without_starting_a_server_twice(tmp_path):
    knobs = {"max_num_seqs": SEQS, "max_num_batched_tokens": TOKENS, "enable_chunked_prefill": [DEFAULT, False],
             "kv_cache_dtype": [DEFAULT, "fp8"], "gpu_memory_utilization": [DEFAULT, 0.95]}  # 120 > brute force's 24
    tuner, calls, clock = make(tmp_path, knobs=knobs, budget_s=2 * 3600)
    tuner.search()
    assert len(calls) == len({key(c) for c in calls}) >= 10
    assert clock.t <= 2 * 3600
    conclude(tmp_path, tuner.record)
    assert capacity_of(tuner.record.trial(tuner.record.winner).config) >= capacity_of({})


def test_tune_json_round_trips(tmp_path):
    tuner, _, _ = make(tmp_path, max_trials=3)
    tuner.search()
    tuner.save()
    data = json.loads((tmp_path / TUNE_JSON).read_text())
    assert TuneRecord.model_validate(data).model_dump() == tuner.record.model_dump()


def test_a_configuration_s_search_spends_the_stage_s_seconds_of_load_not_a_trial_count():
    """tune's rungs spend the vllm-serve stage's budget (search_budget_s, seconds of load across
    the rungs and the hold), each rung's trial cap besides: a precision the budget cannot buy
    stops the narrowing with the budget's note, however many trials the rung would allow."""
    load = ServingParams(slo="ttft_p99=2s", hold_s=10.0, requests_per_point=8, warmup_s=1, min_point_s=5, search_budget_s=40)
    run = FakeRun(10.0, load, Clock())
    cap = ServerCapacity(run)
    cap.start(None, 16)
    rung = cap.narrow("precise", 0.001, 5, 50)
    assert rung.probes == len(run.points) == 4 and not rung.converged  # 40 s of load at 6 s a trial, 11 s kept for the hold
    held = cap.hold(10.0, 3)
    assert any("stopped by its budget" in n for n in held.notes), held.notes
