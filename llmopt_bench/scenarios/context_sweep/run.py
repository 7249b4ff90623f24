"""The context sweep's loop, written once for every engine that offers `SweepEngine`.

For each variant (an attention implementation, an attention backend): open it (a variant that
cannot open marks its rows skipped or failed, with the reason, and the sweep goes on); measure
every (context, batch) cell, each a timed window of its own (`variant@contextxbatch`: time and,
where the device has an energy counter, joules per output token on the row); a cell that fails
(an OOM at 8K, a kernel that refuses a shape) is a failed row, not the stage's end; then close
the variant (an engine's processes and memory gone) before the next opens. After the last:
speedups against the baseline variant, the story's claims where the stage judges them, and the
cell whose samples the stage returns, whose window becomes the stage's headline energy ("main").

A stage is ContextSweepStage plus `start_sweep`: which engine adapter, which plan."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Mapping, Protocol, TypedDict

from pydantic import BaseModel

from llmopt_bench.analysis.metrics import tpot, ttft
from llmopt_bench.core.contract import Stage, StageContext
from llmopt_bench.core.distribution import Distribution
from llmopt_bench.core.errors import describe, is_oom
from llmopt_bench.core.records import LoadInfo, RequestSample, StageRun
from llmopt_bench.core.workload import WorkloadConfig
from llmopt_bench.engines.variants import Measured, Opened, Timed, VariantUnavailable
from llmopt_bench.scenarios.context_sweep.plan import Claim, ContextSweepExtra, Speedup, SweepCell, speedups
from llmopt_bench.scenarios.context_sweep.report import SweepPresentation


class SweepEngine(Protocol):
    """What the sweep needs of an engine: its variants opened one at a time."""

    def open(self, variant: str, workload: WorkloadConfig) -> Opened:
        """Load or start the variant and verify what really runs. Raises VariantUnavailable
        with the adapter's reason (any other exception: the variant failed, described)."""

    def measure(self, variant: str, context: int, batch: int, workload: WorkloadConfig, timed: Timed) -> Measured:
        """One cell: untimed warm-up, then the timed repeats inside `timed`. May raise: the
        cell is a failed row; the adapter frees what the failure left (CUDA's cache after an OOM)."""

    def close(self) -> None:
        """Close the open variant, if any, and wait until it is gone. Idempotent."""

    def records(self) -> Mapping[str, object]:
        """The adapter's own records for the extra, each under its key (hf_attention.HFRecords:
        kernels and agreement; vllm/attention.VLLMRecords: engines); ContextSweepExtra checks them."""


@dataclass
class SweepPlan:
    variants: list[str]  # opened in this order; their rows are kept in it
    contexts: list[int]
    batches: list[int]
    decode_tokens: int  # a request is complete with its first token and these
    noun: str = "variant"  # how the error names them when none ran: "attention backend"
    baseline: str | None = None  # speedups against it; None: the first variant with an ok row
    samples_from: tuple[str, ...] = ()  # whose largest ok batch-1 cell is the stage's samples, before the baseline's
    claims: Callable[[list[Speedup], list[str], list[SweepCell]], list[Claim]] | None = None  # the story's claims it judges
    notes: list[str] = field(default_factory=list)


@dataclass
class SweepOutcome:
    extra: ContextSweepExtra
    samples: list[RequestSample]
    note: str


def cell_key(variant: str, context: int, batch: int) -> str:
    """The cell's timed-window key: its energy on the row, and "main" if its samples are the stage's."""
    return f"{variant}@{context}x{batch}"


class CellStats(TypedDict):
    """What measuring a cell gave (or its failure), for its row."""

    ttft_s: dict[str, float] | None  # Distribution.model_dump()
    tpot_s: dict[str, float] | None
    peak_bytes: int | None
    status: str
    reason: str | None


def row(variant: str, context: int, batch: int, status: str, reason: str | None = None, *, effective_impl: str | None = None,
        ttft_s: dict[str, float] | None = None, tpot_s: dict[str, float] | None = None, peak_bytes: int | None = None) -> SweepCell:
    return {"impl": variant, "effective_impl": effective_impl, "context": context, "batch": batch, "ttft_s": ttft_s,
            "tpot_s": tpot_s, "peak_bytes": peak_bytes, "status": status, "reason": reason}


def cell_stats(measured: Measured, decode_tokens: int) -> CellStats:
    """Prefill (TTFT) and decode (TPOT) of a cell. A request counts when it produced every token
    asked for; requests generated together share their times, so each repeat counts once."""
    complete = [s for s in measured.samples if s.ok and s.output_tokens == decode_tokens + 1]
    per_repeat: dict[int, RequestSample] = {}
    for s in complete:
        per_repeat.setdefault(s.repeat, s)
    ttft_d = Distribution.of([ttft(s) for s in per_repeat.values()])
    tpot_d = Distribution.of([t for s in per_repeat.values() if (t := tpot(s)) is not None])
    ok = ttft_d is not None and tpot_d is not None
    return {"ttft_s": ttft_d.model_dump() if ttft_d else None, "tpot_s": tpot_d.model_dump() if tpot_d else None,
            "peak_bytes": measured.peak_bytes, "status": "ok" if ok else "failed",
            "reason": None if ok else f"{len(complete)} of {len(measured.samples)} requests complete"}


def failure(e: BaseException) -> str:
    """A failed cell's reason: OOM said first, the exception, and what the adapter noted on it."""
    notes = " ".join(getattr(e, "__notes__", ()))
    return ("out of memory: " if is_oom(e) else "") + describe(e, 300) + (f" {notes}" if notes else "")


def timed_window(meter: Any, key: str) -> Timed:
    def timed(work: Callable[[], list[RequestSample]]) -> list[RequestSample]:
        with meter.window(key) as window:
            samples = work()
            window.tokens = sum(s.output_tokens for s in samples if s.ok)
        return samples

    return timed


def summary(r: SweepCell) -> str:
    ttft_s, tpot_s = r["ttft_s"], r["tpot_s"]
    if r["status"] != "ok" or ttft_s is None or tpot_s is None:  # an ok row has both (cell_stats)
        return f": {r['status']} ({r['reason']})"
    return f": ttft {ttft_s['p50'] * 1e3:.1f} ms, tpot {tpot_s['p50'] * 1e3:.2f} ms/tok"


class Sweep:
    """One run of the loop: its rows, each cell's samples, and the progress it reports."""

    def __init__(self, engine: SweepEngine, plan: SweepPlan, workload: WorkloadConfig, ctx: StageContext):
        self.engine, self.plan, self.workload, self.ctx = engine, plan, workload, ctx
        self.rows: list[SweepCell] = []
        self.cells: dict[tuple[str, int, int], list[RequestSample]] = {}
        self.done, self.total = 0, len(plan.variants) * len(plan.contexts) * len(plan.batches)

    def variant(self, variant: str) -> None:
        try:
            opened = self.open(variant)
            if opened is not None:
                for context in self.plan.contexts:
                    for batch in self.plan.batches:
                        self.cell(variant, opened, context, batch)
        finally:
            self.engine.close()

    def open(self, variant: str) -> Opened | None:
        try:
            return self.engine.open(variant, self.workload)
        except VariantUnavailable as e:
            self.mark(variant, e.status, e.reason)
        except Exception as e:  # noqa: BLE001 - one variant failing to open is rows, not the stage
            self.mark(variant, "failed", describe(e, 300))
        return None

    def mark(self, variant: str, status: str, reason: str) -> None:
        for context in self.plan.contexts:
            for batch in self.plan.batches:
                self.rows.append(row(variant, context, batch, status, reason))
                self.done += 1
        self.ctx.progress(f"{variant}: {status} ({reason})", self.done, self.total)

    def cell(self, variant: str, opened: Opened, context: int, batch: int) -> None:
        label, key = f"{variant} context {context} batch {batch}", cell_key(variant, context, batch)
        self.ctx.progress(label, self.done, self.total)
        try:
            measured = self.engine.measure(variant, context, batch, self.workload, timed_window(self.ctx.meter, key))
            stats = cell_stats(measured, self.plan.decode_tokens)
            self.cells[(variant, context, batch)] = measured.samples
        except Exception as e:  # noqa: BLE001 - OOM or a kernel error at one shape: a row, the sweep goes on
            stats = {"ttft_s": None, "tpot_s": None, "peak_bytes": None, "status": "failed", "reason": failure(e)}
        r = row(variant, context, batch, effective_impl=opened.effective, **stats)
        if r["status"] == "ok" and opened.mismatch:
            r["status"], r["reason"] = "failed", opened.mismatch
        energy = self.ctx.meter.record(key)  # None: no energy counter, or the cell failed inside its window
        if energy is not None:
            r["energy"] = energy
        self.rows.append(r)
        self.done += 1
        self.ctx.progress(label + summary(r), self.done, self.total)

    def ran(self) -> list[str]:
        return [v for v in self.plan.variants if any(r["impl"] == v and r["status"] == "ok" for r in self.rows)]

    def nothing_ran(self) -> RuntimeError:
        """A sweep that measured nothing is not ok: each tried variant's first reason."""
        why = [f"{v}: {next((r['reason'] for r in self.rows if r['impl'] == v and r['reason']), 'no cell completed')}"
               for v in self.plan.variants if not all(r["status"] == "skipped" for r in self.rows if r["impl"] == v)]
        return RuntimeError(f"no {self.plan.noun} ran: " + "; ".join(why))

    def pick_samples(self, baseline: str) -> tuple[list[RequestSample], str | None, str]:
        """The stage's samples: batch 1 at the largest ok context of the first of samples_from,
        else of the baseline. Returns them, their cell's window key, and the note saying which."""
        candidates = list(dict.fromkeys([*self.plan.samples_from, baseline]))
        for variant in candidates:
            ok = [r["context"] for r in self.rows if r["impl"] == variant and r["status"] == "ok" and r["batch"] == 1]
            if ok:
                c = max(ok)
                return (self.cells[(variant, c, 1)], cell_key(variant, c, 1),
                        f"samples (the metrics table): {variant}, batch 1, context {c}")
        return [], None, f"samples: none (no ok cell at batch 1 from {' or '.join(candidates)})"

    def outcome(self) -> SweepOutcome:
        ran = self.ran()
        if not ran:
            raise self.nothing_ran()
        baseline = self.plan.baseline or ran[0]
        speeds = speedups(self.rows, baseline)
        samples, key, note = self.pick_samples(baseline)
        if key is not None:
            self.ctx.meter.copy(key, "main")
        # checked once, here, by ContextSweepExtra: the rows, speedups and claims typed above, the adapter's records its own
        fields: dict[str, object] = {"sweep": self.rows, "speedups": speeds, "baseline": baseline, **self.engine.records()}
        if self.plan.claims is not None:
            fields["claims"] = self.plan.claims(speeds, self.plan.variants, self.rows)
        return SweepOutcome(ContextSweepExtra.model_validate(fields), samples, note)


def run_sweep(engine: SweepEngine, plan: SweepPlan, workload: WorkloadConfig, ctx: StageContext) -> SweepOutcome:
    sweep = Sweep(engine, plan, workload, ctx)
    for variant in plan.variants:
        sweep.variant(variant)
    return sweep.outcome()


class ContextSweepStage(SweepPresentation, Stage):
    """A stage that runs the context sweep on the engine adapter and plan start_sweep() gives."""

    own_workload = True  # a context-length sweep, not the fixed prompt set
    Extra: ClassVar[type[BaseModel]] = ContextSweepExtra

    def start_sweep(self, model: Any, params: Any, ctx: StageContext) -> tuple[SweepEngine, SweepPlan, LoadInfo]:
        raise NotImplementedError

    engine: SweepEngine | None  # None until load() starts one, and after teardown()
    plan: SweepPlan

    def load(self, model, params, ctx: StageContext) -> LoadInfo:
        self.engine = None
        self.engine, self.plan, info = self.start_sweep(model, params, ctx)
        return info

    # warm-up is per cell inside run(): each variant is its own model load or engine

    def run(self, workload: WorkloadConfig, ctx: StageContext) -> StageRun:
        assert self.engine is not None, "load() starts the engine before run()"
        out = run_sweep(self.engine, self.plan, workload, ctx)
        # exclude_unset: a stage's extra holds the records it wrote, as before the types
        return StageRun(samples=out.samples, extra=out.extra.model_dump(mode="json", exclude_unset=True),
                        notes=[*self.plan.notes, out.note])

    def teardown(self) -> None:
        engine, self.engine = getattr(self, "engine", None), None
        if engine is not None:
            engine.close()
