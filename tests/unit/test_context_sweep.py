"""The context sweep's loop (scenarios/context_sweep/run.py) for real, on a simulated engine
written here: each variant prefills at a known cost per prompt token and decodes at a known
cost per token on a virtual clock, so the loop's rows, speedups, picks and energy windows are
checked to the digit. The loop under test is the one flash-attn and vllm-attn run; only the
engine and the energy counter (a counter that adds 1 J per read) are stand-ins."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmopt_bench.core.contract import StageContext
from llmopt_bench.core.records import LoadInfo, RequestSample
from llmopt_bench.core.workload import WorkloadConfig
from llmopt_bench.engines.variants import Measured, Opened, VariantUnavailable
from llmopt_bench.measure.energy import TimedMeter
from llmopt_bench.scenarios.context_sweep.plan import ContextSweepExtra, sweep_claims
from llmopt_bench.scenarios.context_sweep.run import ContextSweepStage, SweepPlan, run_sweep

DECODE, REPEATS = 4, 3
STEP_S = 0.01  # a decode step on the virtual clock, every variant alike


class SimEngine:
    """Prefill costs `prefill_s[variant]` per prompt token (repeat r adds r microseconds, so the
    repeats spread); `skip`, `broken` and `oom` say what cannot open or which cells fail."""

    def __init__(self, prefill_s: dict[str, float], skip=(), broken=(), oom=(), short=(), mismatch=()):
        self.prefill_s, self.skip, self.broken, self.oom, self.short, self.mismatch = prefill_s, skip, broken, oom, short, mismatch
        self.clock = 0.0
        self.open_now: str | None = None
        self.log: list[str] = []  # open/close events, in order

    def open(self, variant: str, workload: WorkloadConfig) -> Opened:
        if variant in self.skip:
            raise VariantUnavailable("skipped", f"{variant} needs a GPU")
        if variant in self.broken:
            raise OSError(f"no weights for {variant}")
        self.open_now = variant
        self.log.append(f"open {variant}")
        if variant in self.mismatch:
            return Opened("other", mismatch=f"asked for {variant}, ran other")
        return Opened(variant)

    def measure(self, variant, context, batch, workload, timed) -> Measured:
        assert self.open_now == variant  # the loop measures only the variant it opened
        if (variant, context) in self.oom:
            e = RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
            e.add_note("(engine: at prefill)")
            raise e
        return Measured(timed(lambda: self.repeats(variant, context, batch)), peak_bytes=context * batch)

    def repeats(self, variant: str, context: int, batch: int) -> list[RequestSample]:
        out = []
        for rep in range(REPEATS):
            t0 = self.clock
            first = t0 + context * self.prefill_s[variant] + rep * 1e-6
            times = [first + i * STEP_S for i in range(DECODE + 1)]
            if (variant, context) in self.short:
                times = times[:2]  # stopped early: not a complete request
            out += [RequestSample(request_id=f"{variant}-{context}-{rep}-{i}", prompt_id="p", repeat=rep,
                                  prompt_tokens=context, output_tokens=len(times), t_submit=t0, t_first=first,
                                  t_done=times[-1], token_times=times) for i in range(batch)]
            self.clock = times[-1] + 1.0
        return out

    def close(self) -> None:
        if self.open_now is not None:
            self.log.append(f"close {self.open_now}")
        self.open_now = None

    def records(self) -> dict:
        return {"engines": [{"backend": e.split()[1]} for e in self.log if e.startswith("open")]}


def joule_counter():
    n = {"mj": 0}

    def read() -> int:
        n["mj"] += 1000
        return n["mj"]

    return read


def context(meter: TimedMeter | None = None) -> StageContext:
    return StageContext(run_dir=Path("."), stage_dir=Path("."), device="cpu", meter=meter or TimedMeter(read_mj=lambda: None))


def plan(variants, **kw) -> SweepPlan:
    return SweepPlan(variants=variants, contexts=kw.pop("contexts", [512, 2048]), batches=kw.pop("batches", [1]),
                     decode_tokens=DECODE, noun="attention implementation", **kw)


def rows_of(extra: ContextSweepExtra, impl: str):
    return [r for r in extra.sweep if r.impl == impl]


def test_every_cell_measured_with_speedups_against_the_baseline():
    eng = SimEngine({"eager": 2e-5, "flash": 1e-5})
    out = run_sweep(eng, plan(["eager", "flash"], baseline="eager", samples_from=("flash",), claims=sweep_claims),
                    WorkloadConfig(), context())
    x = out.extra
    assert [(r.impl, r.context, r.status) for r in x.sweep] == [
        ("eager", 512, "ok"), ("eager", 2048, "ok"), ("flash", 512, "ok"), ("flash", 2048, "ok")]
    r = rows_of(x, "flash")[1]
    assert r.effective_impl == "flash" and r.peak_bytes == 2048 and r.ttft_s.n == REPEATS
    assert r.ttft_s.min == pytest.approx(2048 * 1e-5) and r.ttft_s.max == pytest.approx(2048 * 1e-5 + 2e-6)
    assert r.tpot_s.p50 == pytest.approx(STEP_S)
    sp = {(s.impl, s.context): s for s in x.speedups}
    assert list(sp) == [("flash", 512), ("flash", 2048)]
    assert sp[("flash", 2048)].prefill_speedup == pytest.approx((2048 * 2e-5 + 1e-6) / (2048 * 1e-5 + 1e-6))
    assert sp[("flash", 2048)].decode_speedup == pytest.approx(1.0)
    assert [c.claim for c in x.claims] == ["2x at 2K", "4x at 8K"]  # the stage's claims hook ran
    assert eng.log == ["open eager", "close eager", "open flash", "close flash"]
    assert out.note == "samples (the metrics table): flash, batch 1, context 2048"
    assert [s.request_id for s in out.samples] == [f"flash-2048-{rep}-0" for rep in range(REPEATS)]


def test_a_variant_that_cannot_open_is_rows_and_the_sweep_goes_on():
    eng = SimEngine({"eager": 2e-5, "fa2": 1e-5, "flash": 1e-5}, skip=("fa2",), broken=("flash",))
    x = run_sweep(eng, plan(["fa2", "flash", "eager"]), WorkloadConfig(), context()).extra
    assert {(r.status, r.reason) for r in rows_of(x, "fa2")} == {("skipped", "fa2 needs a GPU")}
    assert {(r.status, r.reason) for r in rows_of(x, "flash")} == {("failed", "OSError: no weights for flash")}
    assert len(rows_of(x, "flash")) == 2 and all(r.ttft_s is None and r.effective_impl is None for r in rows_of(x, "flash"))
    assert [r.status for r in rows_of(x, "eager")] == ["ok", "ok"]
    assert x.baseline == "eager"  # no baseline given: the first variant that ran
    assert eng.log == ["open eager", "close eager"]


def test_a_failed_cell_is_a_row_with_its_reason_and_the_next_cell_runs():
    eng = SimEngine({"eager": 2e-5, "flash": 1e-5}, oom=(("eager", 2048),), short=(("flash", 512),))
    x = run_sweep(eng, plan(["eager", "flash"], contexts=[512, 2048, 4096], baseline="eager"), WorkloadConfig(), context()).extra
    eager = {r.context: r for r in rows_of(x, "eager")}
    assert eager[2048].status == "failed" and eager[2048].ttft_s is None
    assert eager[2048].reason == "out of memory: RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (engine: at prefill)"
    assert eager[512].status == eager[4096].status == "ok"  # before and after the OOM
    flash = {r.context: r for r in rows_of(x, "flash")}
    assert flash[512].status == "failed" and flash[512].reason == f"0 of {REPEATS} requests complete"
    assert [(s.impl, s.context) for s in x.speedups] == [("flash", 4096)]  # only where both rows are ok


def test_the_baseline_missing_gives_no_speedups_and_samples_from_the_preferred():
    eng = SimEngine({"eager": 2e-5, "flash": 1e-5}, broken=("eager",))
    out = run_sweep(eng, plan(["eager", "flash"], baseline="eager", samples_from=("flash",)), WorkloadConfig(), context())
    assert out.extra.baseline == "eager" and out.extra.speedups == []
    assert out.note == "samples (the metrics table): flash, batch 1, context 2048"
    out = run_sweep(SimEngine({"eager": 2e-5, "math": 1e-5}, broken=("eager",)), plan(["eager", "math"], baseline="eager",
                    samples_from=("flash",)), WorkloadConfig(), context())
    assert out.samples == [] and out.note == "samples: none (no ok cell at batch 1 from flash or eager)"


def test_nothing_measured_is_an_error_naming_each_tried_variant():
    eng = SimEngine({"a": 1e-5, "b": 1e-5, "c": 1e-5}, skip=("a",), broken=("b",), oom=(("c", 512), ("c", 2048)))
    with pytest.raises(RuntimeError) as e:
        run_sweep(eng, plan(["a", "b", "c"]), WorkloadConfig(), context())
    assert str(e.value) == ("no attention implementation ran: b: OSError: no weights for b; "
                            "c: out of memory: RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (engine: at prefill)")


def test_a_variant_verified_as_another_is_measured_and_failed():
    eng = SimEngine({"eager": 2e-5, "flash": 1e-5}, mismatch=("flash",))
    x = run_sweep(eng, plan(["eager", "flash"]), WorkloadConfig(), context()).extra
    for r in rows_of(x, "flash"):
        assert r.status == "failed" and r.reason == "asked for flash, ran other" and r.effective_impl == "other"
        assert r.ttft_s is not None  # measured all the same: the row shows what ran
    assert x.speedups == []


def test_each_cell_is_its_own_energy_window_and_the_samples_cell_is_main():
    meter = TimedMeter(read_mj=joule_counter())
    eng = SimEngine({"eager": 2e-5, "flash": 1e-5}, oom=(("eager", 2048),))
    out = run_sweep(eng, plan(["eager", "flash"], batches=[1, 2], baseline="eager", samples_from=("flash",)),
                    WorkloadConfig(), context(meter))
    for r in out.extra.sweep:
        if r.status != "ok":
            assert r.energy is None  # the window never closed
            continue
        # one window per cell: two counter reads 1 J apart, every timed token counted
        assert r.energy["joules"] == 1.0 and r.energy["windows"] == 1
        assert r.energy["output_tokens"] == REPEATS * r.batch * (DECODE + 1)
        assert r.energy["joules_per_output_token"] == pytest.approx(1.0 / (REPEATS * r.batch * (DECODE + 1)))
    assert meter.record("main") == meter.record("flash@2048x1")  # the headline is the cell the samples come from
    assert set(meter.totals) == {"main"} | {f"{v}@{c}x{b}" for v in ("eager", "flash") for c in (512, 2048) for b in (1, 2)} - {
        "eager@2048x1", "eager@2048x2"}


class SimSweepStage(ContextSweepStage):
    name = "sim-sweep"
    description = "the sweep on the simulated engine"

    def start_sweep(self, model, params, ctx):
        return SimEngine({"A": 2e-5, "B": 1e-5}, skip=("C",)), plan(["C", "A", "B"], notes=["planned"]), LoadInfo()


def test_a_sweep_stage_records_only_what_it_wrote():
    """run.json keeps each stage's extra as it was written: no empty records of the other stage."""
    stage = SimSweepStage()
    stage.load(None, None, context())
    run = stage.run(WorkloadConfig(), context())
    stage.teardown()
    assert set(run.extra) == {"sweep", "speedups", "baseline", "engines"}  # no claims, agreement or kernels
    assert all("energy" not in r for r in run.extra["sweep"])  # no counter, no energy key
    assert run.extra["baseline"] == "A" and run.notes == ["planned", "samples (the metrics table): A, batch 1, context 2048"]
    assert set(run.extra["sweep"][0]) == {"impl", "effective_impl", "context", "batch", "ttft_s", "tpot_s", "peak_bytes",
                                          "status", "reason"}
    ContextSweepExtra.model_validate(run.extra)


def test_the_sweep_table_shows_joules_per_token_only_where_measured():
    from llmopt_bench.scenarios.context_sweep.report import sweep_blocks

    with_counter = run_sweep(SimEngine({"A": 1e-5}), plan(["A"], contexts=[512]), WorkloadConfig(),
                             context(TimedMeter(read_mj=joule_counter()))).extra
    table = sweep_blocks(with_counter)[0]
    col = table.headers.index("J/token")
    assert table.rows[0][col] == "0.0667"  # 1 J over 3 repeats x 5 tokens
    without = run_sweep(SimEngine({"A": 1e-5}), plan(["A"], contexts=[512]), WorkloadConfig(), context()).extra
    assert "J/token" not in sweep_blocks(without)[0].headers
