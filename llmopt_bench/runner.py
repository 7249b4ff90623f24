"""Runs a journey: a probe process first (environment, ceilings, model checkpoint), then each
stage in its own process, in order. A crash, an OOM, a hang or a leak ends that stage only;
run.json is rewritten after every stage, so an interrupted run keeps what finished."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from llmopt_bench.analysis.metrics import compute
from llmopt_bench.analysis.quality_gate import apply_gate
from llmopt_bench.errors import ExitCode, LlmoptError, UsageError
from llmopt_bench.events import FD_ENV, start_reader
from llmopt_bench.measure.memory import MemorySampler, session_pids, wait_until_free
from llmopt_bench.models import ModelInfo, ModelSpec
from llmopt_bench.registry import (StagePlan, engine_python, entry_value, journey_path, load_stage, parse_journey,
                                   unavailable)
from llmopt_bench.results import (FAILED, RunResult, Samples, StageResult, append_requests, drop_requests,
                                  host_fingerprint, save_run, utcnow)
from llmopt_bench.stage import RequestSample, StageRun
from llmopt_bench.workload import WorkloadConfig

# Multi-GPU hosts here forbid NVLink multicast; engines' own processes inherit this.
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
            "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}


class Reporter(Protocol):
    def phase(self, msg: str) -> None: ...
    def stage_start(self, name: str, index: int, total: int) -> None: ...
    def progress(self, name: str, msg: str, done: int | None, total: int | None) -> None: ...
    def stage_end(self, result: StageResult) -> None: ...


@dataclass
class RunOptions:
    out_dir: Path
    model: ModelSpec
    workload: WorkloadConfig
    plans: list[StagePlan]
    command: str
    resume: bool = False
    fail_fast: bool = False
    timeout_s: float | None = None  # overrides every stage's own timeout
    min_quality: float | None = None  # the quality gate; None: the resumed run's, else the default
    extra_env: dict[str, str] = field(default_factory=dict)


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {**os.environ, **SAFE_ENV, **(extra or {})}
    # The child imports llmopt_bench from this checkout even under another interpreter.
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    # llmopt's own interpreter, for work a child in another interpreter hands back (AWQ calibration)
    env.setdefault("LLMOPT_PYTHON", sys.executable)
    return env


def _kill_session(sid: int) -> None:
    try:
        os.killpg(sid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for pid in session_pids(sid):  # processes that moved to another group but kept the session
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def probe(opts: RunOptions, reporter: Reporter) -> tuple[dict[str, Any], ModelInfo]:
    """Fingerprint the machine and prepare the model, in a child (the runner never touches CUDA)."""
    job = opts.out_dir / "probe.job.json"
    answer_path = opts.out_dir / "probe.json"
    job.write_text(json.dumps({"model": opts.model.model_dump(), "out": str(answer_path)}))
    reporter.phase(f"probing the environment and preparing {opts.model.source} (first use writes its checkpoint)")
    with open(opts.out_dir / "logs" / "probe.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "llmopt_bench.probe", str(job)], stdout=log, stderr=subprocess.STDOUT,
                                env=child_env(opts.extra_env), start_new_session=True)
        try:
            proc.wait()
        except BaseException:
            _kill_session(proc.pid)
            raise
    if not answer_path.is_file():
        raise LlmoptError(f"the probe process died (exit {proc.returncode})", f"see {opts.out_dir / 'logs' / 'probe.log'}",
                          code=ExitCode.INTERNAL)
    answer = json.loads(answer_path.read_text())
    if not answer["ok"]:
        code = ExitCode.USAGE if answer.get("user_error") else ExitCode.INTERNAL
        raise LlmoptError(answer["message"], answer.get("fix") or f"see {opts.out_dir / 'logs' / 'probe.log'}", code=code)
    env = {**host_fingerprint(), **answer["env"], "command": opts.command}
    return env, ModelInfo(**answer["model"])


def _named(plan: StagePlan) -> dict[str, Any]:
    return {"name": plan.name, **({"stage": plan.stage} if plan.stage != plan.name else {})}


def _failed(plan: StagePlan, cls, status: str, reason: str, fix: str | None = None, **kw) -> StageResult:
    return StageResult(**_named(plan), description=getattr(cls, "description", ""), changes=getattr(cls, "changes", ""),
                       own_workload=getattr(cls, "own_workload", False), status=status, reason=reason, fix=fix, params=plan.params, **kw)


def run_stage(plan: StagePlan, run: RunResult, opts: RunOptions, reporter: Reporter) -> tuple[StageResult, list[RequestSample]]:
    cls = load_stage(plan.stage)
    why = unavailable(cls)
    if why:
        return _failed(plan, cls, "skipped", why[0], why[1]), []
    stage_dir = opts.out_dir / "stages" / plan.name
    stage_dir.mkdir(parents=True, exist_ok=True)
    log_path = opts.out_dir / "logs" / f"{plan.name}.log"
    job = stage_dir / "job.json"
    spawned = time.time()
    job.write_text(json.dumps({"stage": plan.name, "entry": entry_value(plan.stage), "params": plan.params, "model": run.model.model_dump(mode="json"),
                               "workload": run.workload.model_dump(mode="json"), "run_dir": str(opts.out_dir),
                               "stage_dir": str(stage_dir), "log": str(log_path), "spawned_at": spawned}))
    timeout = opts.timeout_s or plan.timeout_s
    rfd, wfd = os.pipe()
    with open(log_path, "w") as log:
        proc = subprocess.Popen([engine_python(cls.requires.engine), "-m", "llmopt_bench.worker", str(job)],
                                stdout=log, stderr=subprocess.STDOUT, pass_fds=(wfd,), start_new_session=True,
                                env=child_env({**opts.extra_env, FD_ENV: str(wfd)}))
    base = dict(started_at=utcnow(), log=str(log_path.relative_to(opts.out_dir)))
    load_evt: dict | None = None
    final: dict | None = None
    # from here on an interrupt (Ctrl-C, SIGTERM) must take the worker's session with it, even
    # one that lands before the event loop (seen under load: the worker outlived llmopt)
    try:
        os.close(wfd)
        events = start_reader(rfd)
        sampler = MemorySampler(proc.pid)
        with sampler:
            deadline = time.monotonic() + timeout
            while final is None:
                try:
                    evt = events.get(timeout=max(0.05, min(1.0, deadline - time.monotonic())))
                except queue.Empty:
                    if time.monotonic() > deadline:
                        final = {"type": "timeout", "reason": f"exceeded its {timeout:.0f} s timeout"}
                    continue
                if evt is None:
                    code = proc.wait()
                    sig = -code if code < 0 else None
                    reason = (f"worker killed by signal {sig}" + (" (likely the host OOM killer)" if sig == 9 else "")
                              if sig else f"worker exited with code {code} without a result")
                    final = {"type": "oom" if sig == 9 else "error", "reason": reason}
                elif evt["type"] == "progress":
                    reporter.progress(plan.name, evt["msg"], evt.get("done"), evt.get("total"))
                elif evt["type"] == "load":
                    load_evt = evt
                    reporter.progress(plan.name, f"loaded in {evt['load_s']:.1f} s", None, None)
                elif evt["type"] != "log":
                    final = evt
    except BaseException:
        _kill_session(proc.pid)
        raise
    finally:
        try:
            proc.wait(timeout=60 if final and final["type"] in ("result", "skipped") else 1)
        except subprocess.TimeoutExpired:
            pass
        _kill_session(proc.pid)
        proc.wait()
    free = wait_until_free(proc.pid, sampler.peaks.device_baseline_bytes) if sampler.peaks.nvml else None
    memory = {**(load_evt or {}).get("memory", {}), **final.get("memory", {}), **sampler.peaks.as_dict()}
    if load_evt and "memory" in load_evt and "torch_allocated_bytes" in load_evt["memory"]:
        memory["after_load_allocated_bytes"] = load_evt["memory"]["torch_allocated_bytes"]
    common = dict(**base, duration_s=round(time.time() - spawned, 3), memory=memory, gpu_free_after=free,
                  load_s=load_evt["load_s"] if load_evt else None, load=(load_evt or {}).get("info"))
    kind = final["type"]
    if kind == "result":
        stage_run = StageRun(**final["run"])
        samples = stage_run.samples
        result = StageResult(**_named(plan), description=cls.description, changes=cls.changes,
                             own_workload=cls.own_workload, status="ok",
                             params=plan.params, metrics=compute(samples), samples=Samples.of(samples),
                             energy=final.get("energy"), extra=stage_run.extra, notes=stage_run.notes, **common)
        if result.metrics is None and samples:
            result.status, result.reason = "error", f"all {len(samples)} requests failed: {samples[0].error}"
        return result, samples
    if kind == "skipped":
        return _failed(plan, cls, "skipped", final["reason"], final.get("fix"), **common), []
    fix = {"oom": "lower --batch-size, --input-len or the stage's max_model_len, or use a smaller model",
           "timeout": "raise --timeout, or lower --num-prompts / --max-new-tokens"}.get(kind, f"see {log_path}")
    return _failed(plan, cls, kind if kind in FAILED + ("interrupted",) else "error", final.get("reason", kind), fix,
                   **partial(stage_dir, spawned), **common), []


def partial(stage_dir: Path, since: float) -> dict[str, Any]:
    """A stage that did not finish keeps what it measured: a stage may write partial.json in its
    directory as it goes (continuous-batching does, after each phase); this attempt's copy
    becomes the record's extra["partial"]."""
    path = stage_dir / "partial.json"
    try:
        if path.stat().st_mtime >= since:
            return {"extra": {"partial": json.loads(path.read_text())}}
    except (OSError, ValueError):
        pass
    return {}


def _matches(old: RunResult, model: ModelSpec, workload: WorkloadConfig) -> str | None:
    if old.model and old.model.source != model.source:
        return f"model {old.model.source} vs {model.source}"
    if old.workload != workload:
        return "the workload differs"
    return None


def run_journey(opts: RunOptions, reporter: Reporter) -> RunResult:
    out = opts.out_dir
    (out / "logs").mkdir(parents=True, exist_ok=True)
    previous = None
    if opts.resume and (out / "run.json").is_file():
        from llmopt_bench.results import load_run

        previous = load_run(out)
        mismatch = _matches(previous, opts.model, opts.workload)
        if mismatch:
            raise UsageError(f"cannot resume {out}: {mismatch}", "resume with the same --model and workload options, or use a new --output")
    env, model = probe(opts, reporter)
    run = previous or RunResult(run_id=out.name, created_at=utcnow(), command=opts.command, workload=opts.workload)
    run.env, run.model, run.status, run.command = env, model, "running", opts.command
    if opts.min_quality is not None:
        run.min_quality = opts.min_quality
    save_run(run, out)
    todo = [p for p in opts.plans if not (previous and (s := previous.stage(p.name)) and s.status != "interrupted")]
    try:
        for i, plan in enumerate(opts.plans):
            if plan not in todo:
                reporter.progress(plan.name, "already in the run: kept (resume)", None, None)
                continue
            reporter.stage_start(plan.name, i + 1, len(opts.plans))
            drop_requests(out, plan.name)
            started = time.time()
            try:
                result, samples = run_stage(plan, run, opts, reporter)
            except KeyboardInterrupt:
                cls = load_stage(plan.stage)
                run.put(_failed(plan, cls, "interrupted", "stopped before it finished (Ctrl-C or SIGTERM)",
                                f"llmopt bench --resume {out}", log=f"logs/{plan.name}.log",
                                **partial(out / "stages" / plan.name, started)))
                run.status = "interrupted"
                save_run(run, out)
                raise
            if samples:
                append_requests(out, plan.name, samples)
            run.put(result)
            apply_gate(run, run.min_quality)
            save_run(run, out)
            reporter.stage_end(result)
            if opts.fail_fast and result.status in FAILED:
                break
    finally:
        if run.status != "interrupted":
            run.status = "complete"
        run.finished_at = utcnow()
        run.stages.sort(key=journey_order(previous, opts.plans))
        save_run(run, out)
    return run


def journey_order(previous: RunResult | None, plans: list[StagePlan]):
    """Sort key: the default journey's order (a run resumed call by call with a few stages each
    still reads as one journey), then first appearance: kept stages, then this call's."""
    canon = [p.name for p in parse_journey(journey_path())] if journey_path().is_file() else []
    seen = [s.name for s in previous.stages] if previous else []
    seen += [p.name for p in plans if p.name not in seen]
    return lambda s: (canon.index(s.name) if s.name in canon else len(canon),
                      seen.index(s.name) if s.name in seen else len(seen))
