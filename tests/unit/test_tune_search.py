"""llmopt tune's search on a constructed capacity: every configuration's capacity under the SLO is
a known number (a load point at rate r meets the SLO exactly when r <= it) and so is its ceiling
(what it completes all at once), so the answer is known and the search can be judged against it.
Everything above the server is the real code: the Tuner (the phases: defaults, screen, narrow,
combine, confirm; the budget and its reserve; resume; the winner and the ratio), the plan
(tune/study.py), the constraints (tune/constraints.py), the rungs (tune/trial.climb), the capacity
adapter and the search from the server's ceiling down with its hold (tune/server_capacity.py over
load/capacity/find.py). The time is a constructed clock: a server start costs START_S, the quality
check QUALITY_S, a load point its length, so the budget is exact."""

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
from llmopt_bench.tune.report import markdown
from llmopt_bench.tune.server_capacity import ServerCapacity
from llmopt_bench.tune.space import DEFAULT, SearchSettings, Space, engine_params
from llmopt_bench.tune.study import key
from llmopt_bench.tune.trial import Shared, climb, passes
from llmopt_bench.tune.tuner import Tuner

START_S = 30.0
QUALITY_S = 5.0
HOLD_S = 60.0
SEQS = [DEFAULT, 64, 128, 256, 512]
TOKENS = [DEFAULT, 2048, 8192]
BEST = {"max_num_seqs": 256, "max_num_batched_tokens": 8192}
FA3 = ("(EngineCore_DP0 pid=7) ERROR 12-06 10:00:01 [core.py:700] ValueError: For FP16/BF16 input, output must have the "
       "same dtype as inputs. For FP8 input, output must have dtype BF16\n"
       "(APIServer pid=1) ERROR 12-06 10:00:02 [api_server.py:1] RuntimeError: Engine core initialization failed. See root "
       "cause above. Failed core proc(s): {}\n")


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def capacity_of(config: dict) -> float:
    """req/s: vLLM's defaults 10; the best is max_num_seqs 256 with 8192 tokens a step (14); the
    other knobs change nothing."""
    seqs = {DEFAULT: 1.0, 64: 0.8, 128: 1.1, 256: 1.25, 512: 1.2}[config.get("max_num_seqs", DEFAULT)]
    tokens = {DEFAULT: 1.0, 2048: 0.9, 8192: 1.12}[config.get("max_num_batched_tokens", DEFAULT)]
    return 10.0 * seqs * tokens


class FakeRun:
    """The serving scenario's run as the capacity adapter drives it, on a server of known capacity
    whose all-at-once point completes `ceiling_factor` times it."""

    def __init__(self, true_rps: float, params: ServingParams, clock: Clock, ceiling_factor: float = 1.2):
        self.true, self.p, self.clock, self.factor = true_rps, params, clock, ceiling_factor
        self.rows: list = []
        self.seen: tuple[float | None, str | None] = (None, None)
        self.ceiling = lambda: self.seen
        self.points: list[float] = []
        self.ceiling_points = 0

    def ceiling_point(self) -> None:
        if self.p.ceiling_requests:
            self.clock.t += 10
            self.ceiling_points += 1
            self.seen = (self.factor * self.true, f"{self.p.ceiling_requests} at once")

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


def quality(ppl: float | None, error: str | None = None) -> QualityRecord:
    return QualityRecord(reference="hf-fp16", perplexity=ppl, perplexity_meaningful=ppl is not None, token_match_rate=0.9,
                         error=error)


def make(tmp: Path, budget_s: float = 24 * 3600, knobs: dict | None = None, refuse=None, worse=(), max_trials=None,
         ceiling_requests=256, record: TuneRecord | None = None, clock: Clock | None = None, capacity=capacity_of,
         ceiling_factor: float = 1.2, fixed: dict | None = None, device: str = "cuda", real_weights: bool = False,
         unjudged=(), search: dict | None = None):
    """A Tuner over a constructed space; the runner starts no server: it charges the clock for a
    start, refuses what refuse(config, params) names (writing its root cause into the server log),
    gives `worse` a perplexity 5% above the reference's and `unjudged` no quality figure, and climbs."""
    knobs = knobs or {"max_num_seqs": SEQS, "max_num_batched_tokens": TOKENS}
    space = Space(path="constructed.toml", knobs=knobs, fixed=fixed or {}, device=device,
                  search=SearchSettings(short_point_s=5, point_s=10, confirm=True, **(search or {})))
    load = ServingParams(slo="ttft_p99=2s,tpot_p99=100ms", hold_s=HOLD_S, requests_per_point=8, warmup_s=1,
                         ceiling_requests=ceiling_requests)
    shared = Shared(model=None, device=device, space=space, load=load, workload=WorkloadConfig(), run_dir=tmp,
                    reference_file=None, reference_name="hf-fp16", reference_quality=quality(10.0), min_quality=0.99,
                    hold_s=HOLD_S)
    clock = clock or Clock()
    calls: list[dict] = []
    runs: dict[int, FakeRun] = {}

    def runner(shared, rec, steer):
        calls.append(dict(rec.config))
        clock.t += START_S
        params, _ = engine_params(shared.space, rec.config)
        said = refuse(rec.config, params) if refuse else None
        if said:
            rec.log = f"trials/{rec.number:03d}/server.log"
            (tmp / rec.log).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rec.log).write_text("INFO non-default args: {}\n" + said)
            rec.outcome, rec.reason = "cannot start", "failed: RuntimeError: Engine core initialization failed. See root cause above."
            return None
        rec.start_s = START_S
        clock.t += QUALITY_S
        k = key(rec.config)
        q = quality(None, "constructed: no figure") if k in {key(c) for c in unjudged} else \
            quality(10.5 if k in {key(c) for c in worse} else 10.02)
        if not passes(shared, rec, q):
            return None
        run = FakeRun(capacity(rec.config), shared.load, clock, ceiling_factor)
        runs[rec.number] = run
        climb(shared, rec, ServerCapacity(run), steer,
              lambda rate: Confirmation(rate_rps=rate, seconds=HOLD_S, num_prompts=int(rate * HOLD_S), command="vllm bench serve",
                                        verdict="held" if rate <= run.true else "missed"))
        clock.t += HOLD_S if rec.confirmation else 0
        return None

    opts = TuneOptions(out_dir=tmp, space=space, model="synthetic:constructed", workload=WorkloadConfig(), slo=load.slo,
                       hold_s=HOLD_S, budget_s=budget_s, seed=0, min_quality=0.99, command="llmopt tune", max_trials=max_trials,
                       device=device)
    rec = record or new_record(opts, real_weights)
    tuner = Tuner(tmp, rec, shared, budget_s, max_trials, runner=runner, clock=clock)
    tuner.runs = runs  # type: ignore[attr-defined]
    return tuner, calls, clock


def every(tuner) -> dict[str, list]:
    out: dict[str, list] = {}
    for t in tuner.record.trials:
        out.setdefault(key(t.config), []).append(t)
    return out


def winner(tuner):
    conclude(tuner.out, tuner.record)
    return tuner.record.trial(tuner.record.winner)


def test_the_search_finds_the_constructed_best_holds_and_confirms_it_against_the_defaults(tmp_path):
    tuner, calls, _ = make(tmp_path)
    tuner.search()
    rec, w = tuner.record, winner(tuner)
    first = rec.trials[0]
    assert first.defaults and first.phase == "defaults" and first.config == {"max_num_seqs": DEFAULT, "max_num_batched_tokens": DEFAULT}
    assert first.outcome == "held" and [r.name for r in first.rungs] == ["ceiling", "short", "precise", "held"]
    assert w.config == BEST and w.outcome == "held"
    assert w.held_rung.capacity_rps <= capacity_of(w.config) < w.held_rung.top
    assert w.held_rung.reached <= 0.05 + 1e-9  # narrowed to the precision before the hold
    assert w.confirmation is not None and w.confirmation.verdict == "held"
    d = first.held_rung
    assert rec.ratio.lo <= capacity_of(w.config) / capacity_of(first.config) <= rec.ratio.hi
    assert rec.ratio.value == pytest.approx(w.held_rung.capacity_rps / d.capacity_rps)
    # every single-knob change screened once; no configuration started twice in one phase
    singles = [t for t in rec.trials if t.phase == "screen" and t.number < w.number]
    assert {key(t.config) for t in singles} >= {key({**first.config, k: v}) for k, vs in tuner.shared.space.knobs.items()
                                                 for v in vs if v != DEFAULT}
    assert len({(key(t.config), t.phase) for t in rec.trials}) == len(rec.trials)
    # only what could beat the best held was searched under the SLO: configurations well below never were
    searched = {key(t.config) for t in rec.trials if any(r.name == "short" for r in t.rungs)}
    assert key({"max_num_seqs": 64, "max_num_batched_tokens": DEFAULT}) not in searched
    assert key({"max_num_seqs": DEFAULT, "max_num_batched_tokens": 2048}) not in searched
    md = markdown(rec, None)
    assert "## Where the budget went" in md and "not narrowed" in md and "narrowed in trial" in md


def test_rung_0_costs_one_ceiling_point(tmp_path):
    """A screened configuration costs a server start, its quality and one all-at-once point: no point of the SLO search."""
    tuner, _, clock = make(tmp_path, knobs={"max_num_seqs": SEQS}, max_trials=3)
    before = {}
    real = tuner.runner

    def timed(shared, rec, steer):
        before[rec.number] = clock.t
        out = real(shared, rec, steer)
        before[rec.number] = clock.t - before[rec.number]
        return out
    tuner.runner = timed
    tuner.search()
    screened = [t for t in tuner.record.trials if t.phase == "screen"]
    assert len(screened) == 2 and all(t.outcome == "screened" for t in screened)
    for t in screened:
        run = tuner.runs[t.number]
        assert run.ceiling_points == 1 and run.points == [], (t.number, run.points)
        assert [r.name for r in t.rungs] == ["ceiling"] and t.ceiling_rps == pytest.approx(1.2 * capacity_of(t.config))
        assert before[t.number] == START_S + QUALITY_S + 10


def test_the_defaults_capacity_always_has_an_upper_bound_so_the_ratio_has_both_ends(tmp_path):
    """Where the SLO does not bind before saturation (every rate the server completes meets it), no
    rate ever fails: the upper end is the ceiling (a rate above what the server completes cannot be
    sustained), so both capacities and the ratio are bounded at both ends."""
    tuner, _, _ = make(tmp_path, ceiling_factor=1.0)
    tuner.search()
    rec, w = tuner.record, winner(tuner)
    d = rec.trial(rec.defaults).held_rung
    assert d.failing_rps is None  # nothing failed...
    assert d.top is not None and d.top <= 1.0 * capacity_of({}) * (1 + 1e-9) and d.reached <= 0.05 + 1e-9  # ...yet bounded
    assert rec.ratio.lo is not None and rec.ratio.hi is not None
    assert rec.ratio.lo <= capacity_of(w.config) / capacity_of({}) <= rec.ratio.hi
    assert "not bounded" not in markdown(rec, None).split("## Where the budget went")[0]


@pytest.mark.parametrize("budget_min", [9, 11, 13, 16, 20, 30])
def test_the_winner_is_always_confirmed_its_time_kept_back_from_the_start(tmp_path, budget_min):
    tuner, _, clock = make(tmp_path, budget_s=budget_min * 60.0)
    tuner.search()
    w = winner(tuner)
    assert clock.t <= budget_min * 60.0, "the search ran past its budget"
    assert w is not None and w.confirmation is not None and w.confirmation.verdict == "held", (budget_min, w and w.label)
    assert "**Not confirmed" not in markdown(tuner.record, None)


def test_a_winner_that_cannot_be_confirmed_says_so(tmp_path):
    budget = 3600.0
    tuner, calls, clock = make(tmp_path, budget_s=budget, knobs={"max_num_seqs": [DEFAULT, 64]})
    real = tuner.runner

    def overrun(shared, rec, steer):
        out = real(shared, rec, steer)
        clock.t = budget - 10  # the defaults' trial ran far past every estimate
        return out
    tuner.runner = overrun
    tuner.search()
    w = winner(tuner)
    assert w.defaults and w.confirmation is None and len(calls) == 1
    assert "**Not confirmed by vLLM's client**: the winner (trial 1) is not confirmed by vLLM's client: the budget left" in \
        markdown(tuner.record, None)


def test_the_defaults_when_they_win_are_confirmed_on_a_start_of_their_own(tmp_path):
    tuner, calls, _ = make(tmp_path, knobs={"max_num_seqs": [DEFAULT, 64]})
    tuner.search()
    w = winner(tuner)
    assert w.defaults and w.confirmation is not None and w.confirmation.on_trial is not None
    c = tuner.record.trial(w.confirmation.on_trial)
    assert c.phase == "confirm" and c.confirms == w.number and c.outcome == "confirmed" and not c.rungs
    assert key(calls[-1]) == key(w.config)


def test_a_config_that_fails_the_quality_gate_is_not_the_answer_whatever_its_speed(tmp_path):
    tuner, _, _ = make(tmp_path, worse=[BEST])
    tuner.search()
    failed = every(tuner)[key(BEST)][0]
    assert failed.outcome == "quality" and failed.value == 0.0 and "quality gate" in failed.reason
    assert winner(tuner).config == {"max_num_seqs": 512, "max_num_batched_tokens": 8192}  # the next best combination


@pytest.mark.parametrize("real_weights", [True, False])
def test_fp8_on_real_weights_must_pass_the_quality_gate_to_win_on_random_weights_not_judged(tmp_path, real_weights):
    """An FP8 KV cache that is the fastest but whose quality could not be judged: on real weights it
    cannot win (the gate must pass it first); on random weights speed alone decides ("not judged")."""
    fp8 = {"max_num_seqs": DEFAULT, "kv_cache_dtype": "fp8"}
    tuner, _, _ = make(tmp_path, knobs={"max_num_seqs": [DEFAULT, 128], "kv_cache_dtype": [DEFAULT, "fp8"]},
                       capacity=lambda c: capacity_of(c) * (1.5 if c.get("kv_cache_dtype") == "fp8" else 1.0),
                       real_weights=real_weights, unjudged=[fp8, {**fp8, "max_num_seqs": 128}])
    tuner.search()
    w = winner(tuner)
    if real_weights:
        assert w.config.get("kv_cache_dtype") != "fp8" and w.config == {"max_num_seqs": 128, "kv_cache_dtype": DEFAULT}
        assert not any(t.config.get("kv_cache_dtype") == "fp8" and any(r.name == "held" for r in t.rungs)
                       for t in tuner.record.trials), "a configuration that cannot win was held"
    else:
        assert w.config == {"max_num_seqs": 128, "kv_cache_dtype": "fp8"}


def test_a_known_incompatibility_is_not_started_and_fp8_kv_on_cuda_comes_with_a_bf16_model(tmp_path):
    """vLLM refuses chunked prefill off with fewer tokens a step than max_model_len, and, on CUDA,
    an FP8 KV cache with a float16 model (FlashAttention-3). The first is never started, with the
    reason; the second is paired with dtype bfloat16, and said."""
    knobs = {"enable_chunked_prefill": [DEFAULT, False], "max_num_batched_tokens": [DEFAULT, 2048],
             "kv_cache_dtype": [DEFAULT, "fp8"]}
    gain = {"enable_chunked_prefill": 1.2, "max_num_batched_tokens": 1.3, "kv_cache_dtype": 1.4}

    def refuse(config, params):
        if config.get("enable_chunked_prefill") is False and (params.max_num_batched_tokens or 8192) < (params.max_model_len or 4096):
            return "ValueError: max_num_batched_tokens (2048) is smaller than max_model_len (4096)."
        if params.kv_cache_dtype == "fp8" and params.dtype != "bfloat16":
            return FA3
        return None
    tuner, calls, _ = make(tmp_path, knobs=knobs, refuse=refuse, fixed={"max_model_len": 4096, "dtype": "float16"},
                           capacity=lambda c: 10.0 * __import__("math").prod(gain[k] for k, v in c.items() if v != DEFAULT))
    tuner.search()
    assert not any(refuse(c, engine_params(tuner.shared.space, c)[0]) for c in calls), "a server vLLM refuses was started"
    off = [t for t in tuner.record.trials if t.config["enable_chunked_prefill"] is False and t.config["max_num_batched_tokens"] == 2048]
    assert off and all(t.outcome == "not started" and "below max_model_len (4096)" in t.reason for t in off)
    fp8 = every(tuner)[key({"enable_chunked_prefill": DEFAULT, "max_num_batched_tokens": DEFAULT, "kv_cache_dtype": "fp8"})][0]
    assert fp8.outcome == "screened" and fp8.paired["dtype"].startswith("bfloat16: an FP8 KV cache on CUDA takes a bf16 model")
    w = winner(tuner)
    assert w.config["kv_cache_dtype"] == "fp8" and "dtype bfloat16" in markdown(tuner.record, None)


def test_a_start_that_fails_shows_its_root_cause_and_no_neighbour_is_started_for_the_same_cause(tmp_path):
    knobs = {"max_num_seqs": [DEFAULT, 128, 256], "kv_cache_dtype": [DEFAULT, "fp8"]}
    tuner, calls, _ = make(tmp_path, knobs=knobs, refuse=lambda c, p: FA3 if p.kv_cache_dtype == "fp8" else None, device="cpu")
    tuner.search()  # on CPU nothing pairs a bf16 model: the FP8 KV cache fails as it did on the H100
    fp8 = [t for t in tuner.record.trials if t.config["kv_cache_dtype"] == "fp8"]
    started = [t for t in fp8 if t.outcome == "cannot start"]
    assert len(started) == 1 and sum(1 for c in calls if c["kv_cache_dtype"] == "fp8") == 1
    assert started[0].cause == ("ValueError: For FP16/BF16 input, output must have the same dtype as inputs. For FP8 input, "
                                "output must have dtype BF16")
    assert started[0].reason.startswith("invalid combination: ValueError: For FP16/BF16 input")
    later = [t for t in fp8 if t.outcome == "not started"]
    assert later and all(f"which trial {started[0].number} could not start with" in t.reason for t in later)
    assert winner(tuner).config == {"max_num_seqs": 256, "kv_cache_dtype": DEFAULT}


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
    (tmp_path / "whole").mkdir()
    whole, _, _ = make(tmp_path / "whole")
    whole.search()
    tuner, calls, clock = make(tmp_path, max_trials=4)
    tuner.search()
    assert len(calls) == 5  # four trials of the search, the winner's confirmation beyond --max-trials
    saved = TuneRecord.model_validate_json((tmp_path / TUNE_JSON).read_text())
    interrupted = saved.trials[3]
    interrupted.outcome, interrupted.rungs = "running", interrupted.rungs[:1]  # killed after its ceiling
    saved.trials = saved.trials[:4]
    done = {(key(t.config), t.phase) for t in saved.trials[:3]}
    again, calls2, _ = make(tmp_path, record=saved, clock=clock)
    again.search()
    assert key(calls2[0]) == key(interrupted.config), "the interrupted trial runs first"
    assert [t for t in again.record.trials if key(t.config) == key(interrupted.config)][0].number == interrupted.number
    assert not done & {(key(t.config), t.phase) for t in again.record.trials if t.number > 4}, "a finished trial ran again"
    assert [(key(t.config), t.phase, t.outcome) for t in again.record.trials] == \
        [(key(t.config), t.phase, t.outcome) for t in whole.record.trials], "the resumed search made other choices"
    assert winner(again).config == BEST


def test_a_large_space_within_the_budget_never_starts_a_configuration_twice_in_one_phase(tmp_path):
    knobs = {"max_num_seqs": SEQS, "max_num_batched_tokens": TOKENS, "enable_chunked_prefill": [DEFAULT, False],
             "kv_cache_dtype": [DEFAULT, "fp8"], "gpu_memory_utilization": [DEFAULT, 0.95]}  # 120 configurations
    tuner, calls, clock = make(tmp_path, knobs=knobs, budget_s=2 * 3600)
    tuner.search()
    trials = tuner.record.trials
    assert len({(key(t.config), t.phase) for t in trials}) == len(trials) and len(calls) >= 10
    assert all(sum(1 for c in calls if key(c) == k) <= 3 for k in {key(c) for c in calls})  # screen, narrow, confirm at most
    assert clock.t <= 2 * 3600
    assert winner(tuner).config["max_num_seqs"] == 256 and winner(tuner).config["max_num_batched_tokens"] == 8192


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
