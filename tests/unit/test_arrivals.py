"""continuous-batching's load scenario in pieces: the points it plans (closed loop with its ramp
left out, and Poisson), the prompts it fits to the engine, a point's result as a CurveRow, and
the whole phase chain (sweep, throughput point, shutdown, static replay) on the load machine,
with the real static engine on synthetic:tiny and an energy counter that counts reads, so that
every point's joules per token is known exactly. vLLM itself runs in
tests/integration/test_batching.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from llmopt_bench.core.contract import StageContext
from llmopt_bench.core.records import LoadInfo, RequestSample
from llmopt_bench.core.workload import Request, WorkloadConfig
from llmopt_bench.load.dispatchers import Timeline
from llmopt_bench.load.point import LoadPoint, point_result
from llmopt_bench.measure.energy import TimedMeter
from llmopt_bench.scenarios.batching.curve import CurveParams, CurvePoint, EngineRequests, fit_requests, plan_points, point_row
from llmopt_bench.scenarios.batching.record import BatchingExtra


def source(max_model_len: int = 100_000, notes: list[str] | None = None) -> EngineRequests:
    return EngineRequests(encode=lambda text: [ord(c) % 97 + 1 for c in text], max_model_len=max_model_len,
                          notes=[] if notes is None else notes)


def python_poisson(rate: float, n: int, seed: int) -> list[float]:
    """The Poisson schedule continuous-batching has always drawn (workload.poisson_arrivals was
    this): the load machine's draws must be the same times."""
    import random

    rng, t, out = random.Random(seed), 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


# --- planning ---------------------------------------------------------------------------------

def test_closed_loop_points_every_concurrency_and_the_main_one():
    p = CurveParams(concurrency=[4, 1], main_concurrency=16, min_requests=8, max_requests=40)
    points = plan_points(p, WorkloadConfig(max_new_tokens=5), source())
    assert [pt.concurrency for pt in points] == [1, 4, 16]
    assert [len(pt.requests) for pt in points] == [8, 16, 40]  # max(min_requests, 4 x c), at most max_requests
    # each user's first request (the ramp) goes first and is left out: the measured ones follow
    assert [len(pt.ramp) for pt in points] == [1, 4, 16]
    assert [(pt.load.num_requests, pt.load.warmup_requests) for pt in points] == [(9, 1), (20, 4), (56, 16)]
    assert [pt.main for pt in points] == [False, False, True]
    assert all(pt.rate_rps is None and pt.new == 5 and pt.static_batch == pt.concurrency for pt in points)
    # the main point's continuous serving is the stage's headline energy; the others are named
    assert [pt.meter_key("continuous") for pt in points] == ["continuous@c1", "continuous@c4", "main"]
    assert [pt.meter_key("static") for pt in points] == ["static@c1", "static@c4", "static@c16"]
    assert points[1].row_key("continuous") == {"mode": "continuous", "concurrency": 4}
    assert points[1].row_key("static") == {"mode": "static", "concurrency": 4, "static_batch": 4}
    assert points[1].label("static") == "static: concurrency 4"


def test_closed_loop_static_batch_and_lengths_from_params():
    p = CurveParams(concurrency=[2], main_concurrency=2, static_batch_size=3, input_len=7, output_len=2)
    (point,) = plan_points(p, WorkloadConfig(max_new_tokens=50), source())
    assert point.static_batch == 3 and point.new == 2
    assert {len(r.token_ids) for r in point.requests} == {7}


def test_poisson_points_every_rate_with_seeded_arrivals():
    p = CurveParams(mode="poisson", rates=[1.0, 8.0, 2.0], poisson_requests=12, max_requests=10, main_concurrency=4)
    workload = WorkloadConfig(max_new_tokens=3, seed=5)
    points = plan_points(p, workload, source())
    assert [pt.rate_rps for pt in points] == [1.0, 2.0, 8.0]
    assert [pt.main for pt in points] == [False, True, False]  # the middle rate
    for k, pt in enumerate(points):
        assert len(pt.requests) == 10 and pt.concurrency is None and pt.static_batch == 4 and not pt.ramp
        assert pt.load.offsets() == python_poisson(pt.rate_rps, 10, seed=5 + k)
    assert points[2].row_key("continuous") == {"mode": "continuous", "concurrency": None, "rate_rps": 8.0}
    assert points[2].row_key("static") == {"mode": "static", "concurrency": None, "rate_rps": 8.0, "static_batch": 4}
    assert [pt.meter_key("continuous") for pt in points] == ["continuous@1rps", "main", "continuous@8rps"]
    assert points[2].label("continuous") == "continuous: 8.0 req/s"


def test_poisson_main_rate_off_the_list_is_added():
    p = CurveParams(mode="poisson", rates=[1.0, 4.0], main_rate=3.0)
    points = plan_points(p, WorkloadConfig(), source())
    assert [(pt.rate_rps, pt.main) for pt in points] == [(1.0, False), (3.0, True), (4.0, False)]


def test_long_prompts_keep_their_tail_and_one_note():
    notes: list[str] = []
    reqs = [Request("a", "p", tuple(range(1, 10))), Request("b", "p", (1, 2))]
    out = fit_requests(reqs, 4, 10, notes)
    assert out[0].token_ids == (4, 5, 6, 7, 8, 9) and out[1] is reqs[1]  # room: 10 - 4 new tokens
    fit_requests(reqs, 4, 10, notes)
    assert notes == ["1 prompt(s) truncated to 6 tokens to fit max_model_len=10 with 4 new tokens"]


# --- a point as a row -----------------------------------------------------------------------------

def sample(i: int, *, submit: float, first: float, tokens: int, step: float, repeat: int = 0) -> RequestSample:
    times = [first + k * step for k in range(tokens)]
    return RequestSample(request_id=f"r{i}", prompt_id="p", repeat=repeat, prompt_tokens=5, output_tokens=tokens,
                         t_submit=submit, t_first=times[0], t_done=times[-1], token_times=times)


def closed_row(samples: list[RequestSample], p: CurveParams, expected: int, mode: str = "continuous", **kw):
    """The samples as a closed loop's requests (each arrived when sent, answered at its last
    token), summarized and written as the point's row."""
    point = CurvePoint(load=LoadPoint(concurrency=len(samples), num_requests=len(samples)),
                       requests=[Request(s.request_id, "p", (1,)) for s in samples], new=expected,
                       static_batch=len(samples))
    tls = [Timeline(i, s.t_submit, s.t_submit, s.t_done, s) for i, s in enumerate(samples)]
    return point_row(point, mode, point_result(point.load, tls, 0.0, expected), p, **kw)


def test_a_row_counts_complete_requests_and_goodput():
    samples = [sample(0, submit=0.0, first=0.1, tokens=4, step=0.1),  # TTFT 0.1, TPOT 0.1: good
               sample(1, submit=0.0, first=1.5, tokens=4, step=0.1),  # TTFT 1.5 > 1.0: served, not good
               sample(2, submit=0.5, first=0.6, tokens=4, step=0.3),  # TPOT 0.3 > 0.2: not good
               sample(3, submit=0.5, first=0.6, tokens=2, step=0.1)]  # 2 of 4 tokens: not complete
    row = closed_row(samples, CurveParams(slo_ttft_s=1.0, slo_tpot_s=0.2), 4)
    assert (row.mode, row.concurrency, row.requests, row.completed, row.failed, row.oom) == ("continuous", 4, 4, 3, 1, False)
    window = 1.5 + 3 * 0.1 - 0.0  # first submit to the last token of the complete ones (request 1)
    assert row.output_tok_s == pytest.approx(12 / window) and row.qps == pytest.approx(3 / window)
    assert row.goodput_rps == pytest.approx(1 / window)
    assert row.ttft_p50_s == pytest.approx(0.1) and row.tpot_p50_s == pytest.approx(0.1)
    assert row.errors == {"short": 1} and row.steady is None  # a closed loop is not judged
    assert row.energy is None and "energy" not in row.model_dump(exclude_unset=True)


def test_a_row_keeps_the_energy_it_is_given_and_an_oom_row_has_none():
    energy = {"joules": 30.0, "seconds": 2.0, "output_tokens": 12, "windows": 1, "avg_watts": 15.0,
              "joules_per_output_token": 2.5}
    samples = [sample(i, submit=0.0, first=0.1, tokens=4, step=0.1) for i in range(3)]
    p = CurveParams(slo_ttft_s=1.0, slo_tpot_s=1.0)
    row = closed_row(samples, p, 4, mode="static", energy=energy)
    assert row.energy == energy and row.goodput_rps == pytest.approx(3 / 0.4) and row.static_batch == 3
    point = CurvePoint(load=LoadPoint(concurrency=3, num_requests=3), requests=[Request(f"r{i}", "p", (1,)) for i in range(3)],
                       new=4, static_batch=3)
    oom = point_row(point, "static", None, p, oom=True, error="OOM")
    assert (oom.completed, oom.failed, oom.output_tok_s, oom.goodput_rps, oom.energy) == (0, 3, None, 0.0, None)


# --- the phases, with the real static engine ------------------------------------------------------

class ScriptedEngine:
    """A continuous engine that answers every request it is given at once, at a fixed pace: it
    stands in for vLLM (tests/integration/test_batching.py runs the real one) so that the
    scenario's phases, windows and rows are what is tested here."""

    def __init__(self, tok, events: list[str]):
        self.tok, self.events = tok, events
        self.cfg = SimpleNamespace(dtype="float32")
        self.params = SimpleNamespace(max_num_seqs=8, max_num_batched_tokens=64)
        self.max_model_len = 512

    def encode(self, text):
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def drive(self, dispatcher):
        from llmopt_bench.measure.timing import now

        while not dispatcher.finished():
            t = now()
            for i, s in enumerate(dispatcher.due(t)):
                answer = sample(i, submit=t, first=t + 0.01 * (i + 1), tokens=s.output_len, step=0.002, repeat=s.repeat)
                dispatcher.done(s, answer.model_copy(update={"request_id": s.id, "prompt_tokens": len(s.token_ids)}),
                                answer.t_done)

    def kv_cache(self, max_num_seqs=None, log_path=None):
        return None

    def close(self):
        from llmopt_bench.measure.timing import now

        self.events.append(f"closed {now()}")


def counting_meter() -> TimedMeter:
    """An energy counter that goes up 1 J at every read: a window (two reads) is 1 J."""
    reads = iter(range(0, 10**9, 1000))
    return TimedMeter(read_mj=lambda: next(reads))


def run_scenario(tiny_model, tmp_path, **params):
    from transformers import AutoTokenizer

    from llmopt_bench.scenarios.batching.run import BatchingStage

    events: list[str] = []

    class Scripted(BatchingStage):
        name = "scripted-arrivals"
        description = "the load scenario on a scripted continuous engine"
        Params = CurveParams

        def start_engine(self, model, params, ctx):
            return ScriptedEngine(AutoTokenizer.from_pretrained(model.path), events), LoadInfo()

    partials: list[dict] = []
    ctx = StageContext(run_dir=tmp_path, stage_dir=tmp_path / "stage", device="cpu", meter=counting_meter(),
                       keep_partial=partials.append)
    p = CurveParams(**{"concurrency": [1, 2], "main_concurrency": 2, "min_requests": 3, "max_requests": 3,
                          "throughput_point": True, "throughput_requests": 4, "throughput_input_len": 8,
                          "throughput_output_len": 3, "capacity": False, "mixed": "off", **params})
    workload = WorkloadConfig(max_new_tokens=4, repeats=2, warmup=1, num_prompts=3)
    stage = Scripted()
    stage.load(tiny_model, p, ctx)
    stage.warmup(workload, ctx)
    try:
        run = stage.run(workload, ctx)
    finally:
        stage.teardown()
    return run, ctx.meter, partials, events


@pytest.mark.slow
def test_phases_record_every_point_with_its_energy(tiny_model, tmp_path):
    run, meter, partials, events = run_scenario(tiny_model, tmp_path)
    extra = BatchingExtra.model_validate(run.extra)
    rows = {(r.mode, r.concurrency): r for r in extra.curve}
    assert list(rows) == [("continuous", 1), ("continuous", 2), ("static", 1), ("static", 2)]
    for r in extra.curve:  # every forced token produced (static: by the real engine), the main point twice
        assert (r.requests, r.completed, r.failed, r.oom) == (3, 3 * r.repeats, 0, False), r
    assert rows["continuous", 2].repeats == 2 and rows["static", 2].repeats == 1 and rows["continuous", 1].repeats == 1
    # one window per serving, 1 J each: the main point served twice (repeats), the others once;
    # a window's tokens are all it produced, its ramp's (c requests) with its 3 measured ones
    assert meter.per_key().keys() == {"main", "continuous@c1", "continuous@throughput", "static@c1", "static@c2",
                                      "static@throughput"}
    for (mode, c), windows in {("continuous", 1): 1, ("continuous", 2): 2, ("static", 1): 1, ("static", 2): 1}.items():
        e = rows[mode, c].energy
        assert (e["windows"], e["joules"], e["output_tokens"]) == (windows, windows * 1.0, windows * (3 + c) * 4), (mode, c, e)
        assert e["joules_per_output_token"] == pytest.approx(1.0 / ((3 + c) * 4))
    assert meter.record("main") == rows["continuous", 2].energy  # the headline is the main point's
    tp = extra.throughput_point
    assert tp.continuous.energy["output_tokens"] == 4 * 3 and tp.static.energy["output_tokens"] == 4 * 3
    assert (tp.static.concurrency, tp.static.static_batch, tp.static.input_len, tp.static.output_len) == (4, 4, 8, 3)
    assert [(s.request_id, s.repeat) for s in run.samples] == [(f"r{i:04d}", rep) for rep in (0, 1) for i in range(3)]
    # run.json keeps the keys each row had before it was typed, the load machine's closed-loop
    # figures (load/record.figures) and energy beside them
    assert set(run.extra["curve"][0]) == {"mode", "concurrency", "requests", "completed", "repeats", "output_tok_s", "qps",
                                          "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "e2e_p50_s", "e2e_p99_s",
                                          "goodput_rps", "failed", "oom", "energy", "failure_rate", "errors", "warmup_excluded",
                                          "window_s", "itl_p50_s", "itl_p99_s"}
    assert set(run.extra["curve"][3]) - set(run.extra["curve"][1]) == {"static_batch", "continuous_speedup"}
    assert rows["static", 2].continuous_speedup == pytest.approx(rows["continuous", 2].output_tok_s / rows["static", 2].output_tok_s)
    assert set(run.extra) == {"sweep", "engine", "h200_reference", "curve", "throughput_point", "kv_cache", "capacity",
                              "lifecycle"}
    # the engine was gone before transformers loaded; what was measured was on disk as it went
    life = extra.lifecycle
    assert float(events[0].split()[1]) < life["t_transformers_load"] and "transformers_unloaded" in life
    assert partials[-1]["curve"] == run.extra["curve"] and len(partials) == 2
    assert {r["mode"] for r in partials[0]["curve"]} == {"continuous"}
    assert run.facts.decode_batch == 2 and run.facts.batch1_tpot_s == rows["continuous", 1].tpot_p50_s
    assert run.facts.saturated_tok_s == tp.continuous.output_tok_s


@pytest.mark.slow
def test_a_static_oom_is_a_row_without_energy(tiny_model, tmp_path, monkeypatch):
    from llmopt_bench.engines.hf.static_engine import StaticEngine

    generate = StaticEngine.generate

    def small_batches_only(self, batch, b):
        if len(batch) > 1:  # what a card does at a batch it cannot hold
            raise MemoryError(f"out of memory at batch {len(batch)}")
        return generate(self, batch, b)

    monkeypatch.setattr(StaticEngine, "generate", small_batches_only)
    run, meter, _, _ = run_scenario(tiny_model, tmp_path, throughput_point=False)
    static = {r["concurrency"]: r for r in run.extra["curve"] if r["mode"] == "static"}
    assert static[2]["oom"] is True and static[2]["error"] == "MemoryError: out of memory at batch 2"
    assert static[2]["completed"] == 0 and static[2]["failed"] == 3 and "energy" not in static[2]
    assert "continuous_speedup" not in static[2] and static[1]["oom"] is False and static[1]["energy"]["windows"] == 1
    assert "static@c2" not in meter.per_key()
