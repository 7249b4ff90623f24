"""The load scenario as a stage: requests arrive over time at a continuous-batching engine, and
the same arrivals are replayed against transformers with a static batcher. A stage is this
scenario on an engine (BatchingStage.start_engine); run() is its phases, in order:

1. sweep: every load point on the continuous engine (closed loop or Poisson), on the load machine (load/);
2. throughput: the all-at-once point (throughput_point = true);
3. mixed_continuous: the mixed-length set on the continuous engine;
4. kv_capacity: the KV cache and the sequences of each context it holds;
5. shutdown: the engine goes; device memory before, with and after it (lifecycle);
6. static_replay: transformers in this process, the same points (requests, loops, arrivals), static batches;
7. mixed_probes, transformers_capacity: transformers probes through one probe worker that loads
   the model once (engines/hf/model_worker.py: an OOM ends the probe only).

Each point's serving is a timed window of the energy meter (the main point's continuous one is
"main", the stage's headline); its joules per token go into its CurveRow. What is measured is
kept on disk after each phase (ctx.keep_partial). docs/batching.md defines the figures."""

from __future__ import annotations

import time
from typing import Any, ClassVar, Protocol

from pydantic import BaseModel

from llmopt_bench.core.contract import Stage, StageContext
from llmopt_bench.core.errors import describe, is_oom
from llmopt_bench.core.freeform import Json
from llmopt_bench.core.records import LoadInfo, RequestSample, StageRun
from llmopt_bench.core.workload import WorkloadConfig, build_requests
from llmopt_bench.engines.hf.model_worker import ModelWorker
from llmopt_bench.engines.hf.static_engine import StaticEngine
from llmopt_bench.engines.lifecycle import device_memory, rss, wait_freed
from llmopt_bench.engines.vllm.kv import KVCacheRecord
from llmopt_bench.load.dispatchers import cycled
from llmopt_bench.load.engine import LoadEngine, run_point
from llmopt_bench.load.point import LoadPoint, PointResult, combine
from llmopt_bench.measure.energy import EnergyFigures
from llmopt_bench.procs.tree import cmdline, descendants
from llmopt_bench.scenarios.batching import mixed
from llmopt_bench.scenarios.batching.curve import (
    H200_REFERENCE,
    CurveParams,
    CurvePoint,
    EngineRequests,
    add_speedups,
    facts,
    plan_points,
    plan_throughput_point,
    point_row,
    sweep_settings,
)
from llmopt_bench.scenarios.batching.kv_capacity import hf_capacity, vllm_capacity_rows
from llmopt_bench.scenarios.batching.record import BatchingExtra, CapacityRow, CurveRow, EngineLifecycle, ThroughputPoint


class ContinuousEngine(LoadEngine, Protocol):
    """What the scenario needs of a continuous-batching engine (engines/vllm/engine.VLLMEngine):
    the load machine's engine (drive), and what the stage records of it."""

    cfg: Any  # .dtype: the dtype the static replay and the probes load transformers in
    params: Any  # .max_num_seqs, .max_num_batched_tokens: the scheduler's limits, recorded
    max_model_len: int

    def encode(self, text: str) -> list[int]: ...

    def kv_cache(self, max_num_seqs: int | None = None, log_path: Any = None) -> KVCacheRecord | None: ...

    def close(self) -> None: ...


class BatchingStage(Stage):
    """A stage that runs the load scenario on the engine start_engine() gives."""

    own_workload = True  # arrivals at several concurrencies, not one request at a time
    Extra: ClassVar[type[BaseModel]] = BatchingExtra

    def start_engine(self, model: Any, params: Any, ctx: StageContext) -> tuple[ContinuousEngine, LoadInfo]:
        raise NotImplementedError

    def load(self, model, params, ctx: StageContext) -> LoadInfo:
        self.engine: ContinuousEngine | None = None
        self.static: StaticEngine | None = None
        self.params: CurveParams = params
        self.model, self.device, self.ctx = model, ctx.device, ctx
        self.notes: list[str] = []
        # NVML only before the engine: touching CUDA here would force vLLM to spawn
        self.lifecycle: EngineLifecycle = {"device": ctx.device, "before_engine": device_memory(use_torch=False),
                                           "processes_before_engine": len(descendants())}
        self.points: list[CurvePoint] = []
        self.samples: list[RequestSample] = []  # the main point's: the stage's samples
        self.tp_point: CurvePoint | None = None
        self.prober: ModelWorker | None = None
        engine, info = self.start_engine(model, params, ctx)
        self.engine = engine
        if info.implementation.get("engine_shared_with"):  # the engine was up before this stage: its baseline
            baseline: EngineLifecycle = getattr(engine, "baseline", EngineLifecycle())  # before_engine, processes_before_engine
            self.lifecycle.update(baseline)
        self.dtype = engine.cfg.dtype  # transformers loads in the engine's dtype, after the engine is gone
        self.source = EngineRequests(engine.encode, engine.max_model_len, self.notes)
        return info

    @property
    def running(self) -> ContinuousEngine:
        """The continuous engine, from load() until shutdown()."""
        if self.engine is None:
            raise RuntimeError("the continuous engine is not running (shut down, or never started)")
        return self.engine

    def warmup(self, workload: WorkloadConfig, ctx: StageContext) -> None:
        if workload.warmup:
            reqs = self.source.fit(build_requests(workload, self.running.encode, count=max(workload.warmup, 2), tag="w"),
                                   workload.max_new_tokens)
            run_point(self.running, LoadPoint(concurrency=min(len(reqs), self.params.main_concurrency), num_requests=len(reqs)),
                      cycled(reqs), workload.max_new_tokens)

    def run(self, workload: WorkloadConfig, ctx: StageContext) -> StageRun:
        p = self.params
        self.sweep(workload)
        if p.throughput_point:
            self.throughput(workload)
        mixed_point = None
        if mixed.mixed_on(p, workload, self.device):
            mixed_point, self.n_long = mixed.mixed_point(p, workload, self.source, self.points[0].new, self.device)
            self.mixed_continuous(mixed_point)
        self.kv_capacity()
        self.keep()
        self.shutdown()
        if p.static_replay:
            self.static_replay()
        self.keep()
        prober = self.prober = ModelWorker(self.ctx.stage_dir / "probes")
        try:
            if mixed_point:
                self.mixed_probes(mixed_point, prober)
                self.keep()
            if p.capacity:
                self.transformers_capacity(prober)
        finally:
            self.close_prober()
        return StageRun(samples=self.samples, extra=self.dump(), notes=self.notes,
                        facts=facts(self.extra, p.main_concurrency if p.mode == "closed" else None))

    # --- the continuous engine ------------------------------------------------------------

    def serve(self, point: CurvePoint, repeats: int = 1) -> PointResult:
        """A point on the continuous engine, each repeat a timed window under the point's key."""
        got: list[PointResult] = []
        label, n = point.label("continuous"), len(point.requests) + len(point.ramp)
        for rep in range(repeats):
            with self.ctx.meter.window(point.meter_key("continuous")) as window:
                res = run_point(self.running, point.load, point.source(), point.new, expected_tokens=point.new, repeat=rep,
                                progress=lambda d: self.ctx.progress(label, d, n))
                window.tokens = res.all_output_tokens
            got.append(res)
        return combine(got)

    def energy(self, point: CurvePoint, mode: str) -> EnergyFigures | None:
        """The point's joules per output token over its timed windows; None without a counter."""
        return self.ctx.meter.per_key().get(point.meter_key(mode))

    def sweep(self, workload: WorkloadConfig) -> None:
        p = self.params
        self.points = plan_points(p, workload, self.source)
        self.extra = BatchingExtra(
            sweep=sweep_settings(p, workload, self.points[0].new),
            engine={"max_num_seqs": self.running.params.max_num_seqs,
                    "max_num_batched_tokens": self.running.params.max_num_batched_tokens,
                    "max_model_len": self.running.max_model_len, "dtype": self.dtype},
            h200_reference=H200_REFERENCE, curve=[])
        self.extra.lifecycle = self.lifecycle  # the same dict: filled in as the engine goes
        for point in self.points:
            got = self.serve(point, workload.repeats if point.main else 1)
            if point.main:
                self.samples = got.samples
            self.extra.curve.append(point_row(point, "continuous", got, p, energy=self.energy(point, "continuous")))

    def throughput(self, workload: WorkloadConfig) -> None:
        p = self.params
        point = self.tp_point = plan_throughput_point(p, workload, self.source)
        got = self.serve(point)
        self.extra.throughput_point = ThroughputPoint(
            continuous=point_row(point, "continuous", got, p, energy=self.energy(point, "continuous")),
            reference_h200_out_tok_s=H200_REFERENCE["vllm_fp16_256x128_out_tok_s"])

    def mixed_continuous(self, point: CurvePoint) -> None:
        t0 = time.perf_counter()
        got = run_point(self.running, point.load, point.source(), point.new, expected_tokens=point.new,
                        progress=lambda d: self.ctx.progress(point.label("continuous"), d, len(point.requests)))
        wall = time.perf_counter() - t0
        row = point_row(point, "continuous", got, self.params)
        self.extra.mixed = [mixed.continuous_row(point, self.n_long, got.samples, wall, row)]

    def kv_capacity(self) -> None:
        limit = self.running.params.max_num_seqs
        kv = self.running.kv_cache(limit, self.ctx.log_path)
        self.extra.kv_cache = kv
        self.extra.capacity = [CapacityRow(**r) for r in vllm_capacity_rows(kv, self.params.contexts, limit)]

    def shutdown(self) -> None:
        """The engine goes, and its memory with it: what it held, and proof that it is back."""
        life = self.lifecycle
        pids = descendants()
        life.update({"with_engine": device_memory(use_torch=self.device == "cuda"), "engine_processes": len(pids),
                     "engine_rss_bytes": rss(pids), "engine_process_names": [cmdline(pid)[:120] for pid in pids]})
        if self.extra.mixed:  # the continuous configuration's peak: the engine's footprint
            used, before = life["with_engine"].get("nvml_used_bytes"), life["before_engine"].get("nvml_used_bytes")
            self.extra.mixed[0].peak_bytes = used - before if used is not None and before is not None else life["engine_rss_bytes"]
        self.ctx.progress("shutting the vLLM engine down", None, None)
        t0 = time.perf_counter()
        engine, self.engine = self.running, None
        engine.close()
        del engine
        life.update(wait_freed(life["before_engine"], self.device == "cuda"))
        life["shutdown_s"] = round(time.perf_counter() - t0, 3)

    # --- the static replay, in this process -----------------------------------------------

    def static_replay(self) -> None:
        p, life = self.params, self.lifecycle
        self.ctx.progress(f"loading transformers ({self.dtype}, {p.static_attn_implementation}) for the "
                          "static-batching replay", None, None)
        life["t_transformers_load"] = time.perf_counter()
        static = self.static = StaticEngine.load(self.model.path, self.device, self.dtype, p.static_attn_implementation)
        life["transformers_loaded"] = device_memory(use_torch=self.device == "cuda")
        static.warm()
        self.extra.curve += [self.serve_static(static, point) for point in self.points]
        if self.extra.throughput_point is not None and self.tp_point is not None:
            self.extra.throughput_point.static = self.serve_static(static, self.tp_point)
        self.close_static()
        add_speedups(self.extra.curve)

    def serve_static(self, static: StaticEngine, point: CurvePoint) -> CurveRow:
        """A point through the static batcher in one timed window; an OOM at this batch size is
        a row (oom, the error), with no energy: its window never closed."""
        label, n, key = point.label("static"), len(point.requests) + len(point.ramp), point.meter_key("static")
        batcher = static.batcher(point.static_batch, self.params.static_timeout_s, lambda d: self.ctx.progress(label, d, n))
        try:
            with self.ctx.meter.window(key) as window:
                got = run_point(batcher, point.load, point.source(), point.new, expected_tokens=point.new)
                window.tokens = got.all_output_tokens
        except BaseException as e:  # noqa: BLE001 - an OOM at this batch size is a result
            if not is_oom(e):
                raise
            msg = describe(e, 200)
            static.release_cache()
            return point_row(point, "static", None, self.params, oom=True, error=msg)
        return point_row(point, "static", got, self.params, energy=self.energy(point, "static"))

    def close_static(self) -> None:
        static, self.static = getattr(self, "static", None), None
        if static is not None:
            static.close()
            self.lifecycle["transformers_unloaded"] = device_memory(use_torch=self.device == "cuda")

    # --- transformers probes, through the probe worker ------------------------------------

    def mixed_probes(self, point: CurvePoint, prober: ModelWorker) -> None:
        rows = mixed.static_probes(self.params, point, self.model.path, self.device, self.dtype,
                                   self.ctx.stage_dir / "probes", progress=lambda m: self.ctx.progress(m, None, None),
                                   probe=prober)
        self.extra.mixed = mixed.in_order(self.extra.mixed + rows)
        self.extra.mixed_setup = mixed.setup(self.params, point, self.n_long)
        if self.device != "cuda":
            self.notes.append(mixed.CPU_NOTE)

    def transformers_capacity(self, prober: ModelWorker) -> None:
        p = self.params
        rows, probes = hf_capacity(self.model.path, self.device, self.dtype, p.capacity_attn_implementation, p.contexts,
                                   p.max_batch, p.capacity_decode_steps, p.probe_timeout_s, self.ctx.stage_dir / "probes",
                                   progress=lambda m: self.ctx.progress(m, None, None), probe=prober)
        self.extra.capacity = self.extra.capacity + [CapacityRow(**r) for r in rows]
        self.extra.capacity_probes = probes

    def close_prober(self) -> None:
        """The worker goes; the model loads and wall time the probes took are recorded."""
        prober, self.prober = getattr(self, "prober", None), None
        if prober is not None:
            prober.close()
            if prober.probes:
                for key, value in prober.stats().items():
                    setattr(self.extra, key, value)

    # --- the record -----------------------------------------------------------------------

    def dump(self) -> Json:
        """The extra as run.json keeps it: the keys the stage set (a phase that did not run
        leaves none behind, as before the record was typed). Json: written out as it is, into
        StageRun.extra (BatchingExtra has checked it)."""
        return self.extra.model_dump(mode="json", exclude_unset=True)

    def keep(self) -> None:
        """What is measured so far, on disk in the stage's directory: a stage cut off by its
        timeout or a signal still leaves its sweep (and static replay) behind."""
        self.ctx.keep_partial({"curve": [], "mixed": [], **self.dump(), "notes": list(self.notes)})

    def teardown(self) -> None:
        engine, self.engine = getattr(self, "engine", None), None
        if engine is not None:
            engine.close()
        self.close_static()
        self.close_prober()
