"""Runs a journey: the environment probe first (environment, ceilings, model checkpoint), then each
stage in its own process, in order. A crash, an OOM, a hang or a leak ends that stage only;
run.json is rewritten after every stage, so an interrupted run keeps what finished.

Stages that start the same engine configuration (Stage.share_key: the `vllm` stage and
continuous batching's vLLM side) run one after the other in one process on one engine, a
stage group (engines/engine_pool.py); a failure in a group ends the group, and its remaining
stages run each in its own process. --no-share-engines turns groups off.

With --prefetch the next group's worker starts while the current one loads, imports, and waits
for its turn (run/prefetch.py); the run's end, however it comes, discards it.

    run_journey   the run: lock the directory, probe, then a RunSession (run/session.py: what every
                  stage of the run shares) and each plan (or group) in turn, the outcome
    run_stage     one stage: skip it here, or spawn its worker and supervise it (supervisor.py)
    plan_groups   the order stages run in, and which share an engine; ready() makes a group's
                  stages ReadyStages (class, timeout, share key) for the supervisor"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from llmopt_bench.analysis.quality_gate import apply_gate
from llmopt_bench.core.contract import Stage
from llmopt_bench.core.errors import ExitCode, LlmoptError, UsageError
from llmopt_bench.core.host import Host
from llmopt_bench.core.models import ModelInfo, ModelSpec, portable_path
from llmopt_bench.core.results import FAILED, RunResult, StageResult, utc_at, utcnow
from llmopt_bench.core.workload import WorkloadConfig
from llmopt_bench.run.outcomes import interrupted, skipped
from llmopt_bench.run.prefetch import Ahead, Launched, Turn
from llmopt_bench.run.registry import StagePlan, journey_order, load_stage, plan_of, unavailable
from llmopt_bench.run.rundir import RunDir
from llmopt_bench.run.session import ReadyStage, Reference, Reporter, RunSession
from llmopt_bench.run.supervisor import launch, supervise, supervise_group
from llmopt_bench.scenarios.fixed.requests import multi_turn_refusal
from llmopt_bench.workloads.spec import parse_spec

# Multi-GPU hosts here forbid NVLink multicast; engines' own processes inherit this.
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
            "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
REFERENCE_FILE = "quality_reference.pt"
RERUN = ("interrupted", "killed")  # what --resume runs again: stopped from outside, not by the stage itself
RERUN_FAILED = "failed"  # --rerun failed: every stage that ended in error, oom or timeout, run again too


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
    preset: str | None = None  # the --preset that chose the journey and workload, recorded in run.json
    name: str | None = None  # `llmopt bench --name`: what compare and history call the run (None: its directory's name)
    share_engines: bool = True  # stages of one engine configuration run on one engine (engines/engine_pool.py)
    prefetch: bool = False  # start the next stage's worker while the current one loads (run/prefetch.py)
    rerun: frozenset[str] = frozenset()  # --resume --rerun: stages (or "failed") measured again, the rest kept
    extra_env: dict[str, str] = field(default_factory=dict)
    # run.wall_s before this invocation, and when it began: wall_s is saved with every stage, so
    # that an invocation killed from outside (a machine taken away) still counts what it ran
    wall_before: float = 0.0
    began: float = field(default_factory=time.monotonic)

    def wall_s(self) -> float:
        return round(self.wall_before + time.monotonic() - self.began, 3)


def env_for_children(opts: RunOptions) -> dict[str, str]:
    from llmopt_bench.core.models import cache_dir

    return {**SAFE_ENV, "LLMOPT_CACHE": str(cache_dir()), **opts.extra_env}


def probe(rd: RunDir, opts: RunOptions, reporter: Reporter) -> tuple[Host, ModelInfo]:
    """Fingerprint the machine and prepare the model, in a child (the runner never touches CUDA).
    The fingerprint is run.json's `env` (core/host.py): what the probe could learn of this host."""
    import json
    import sys

    from llmopt_bench.procs import spawn
    from llmopt_bench.run.fingerprint import host_fingerprint

    job, answer_path, log = rd.root / "probe.job.json", rd.root / "probe.json", rd.logs / "probe.log"
    answer_path.unlink(missing_ok=True)
    rd.write_json(job, {"model": opts.model.model_dump(), "out": answer_path.name, "vllm": starts_vllm(opts.plans)})
    reporter.phase(f"probing the environment ({opts.model.source}: the server's model, nothing of it prepared here)"
                   if opts.model.kind == "endpoint" else
                   f"probing the environment and preparing {opts.model.source} (first use writes its checkpoint)")
    with open(log, "w") as f:
        ended = spawn.run([sys.executable, "-m", "llmopt_bench.run.envprobe", str(job)], log=f,
                          env=spawn.child_env(env_for_children(opts)))
    if not answer_path.is_file():
        raise LlmoptError(f"the probe process died ({ended.outcome()[1]})", f"see {log}", code=ExitCode.INTERNAL)
    answer = json.loads(answer_path.read_text())
    if answer["ok"]:
        answer_path.unlink()  # its content goes into run.json (in portable form); kept when the probe failed
    else:
        code = ExitCode.USAGE if answer.get("user_error") else ExitCode.INTERNAL
        raise LlmoptError(answer["message"], answer.get("fix") or f"see {log}", code=code)
    return Host.model_validate({**host_fingerprint(), **answer["env"], "command": opts.command}), ModelInfo(**answer["model"])


def starts_vllm(plans: list[StagePlan]) -> bool:
    """Whether a stage of the journey that can run here starts a vLLM engine (the probe then fills
    vLLM's model-inspection cache: engines/vllm/modelinfo.py)."""
    classes = [load_stage(p.stage) for p in plans]
    return any(cls.requires.engine == "vllm" and not unavailable(cls) for cls in classes)


def find_reference(rd: RunDir, plans: list[StagePlan], previous: RunResult | None) -> Reference:
    """The first plan whose stage provides the quality reference, else a result of the run that did."""
    for p in plans:
        if load_stage(p.stage).quality_reference:
            return Reference(p.name, rd.stage_dir(p.name) / REFERENCE_FILE)
    done = next((s for s in (previous.stages if previous else []) if s.quality_reference), None)
    return Reference(done.name, rd.stage_dir(done.name) / REFERENCE_FILE) if done else Reference()


def run_stage(session: RunSession, plan: StagePlan, opts: RunOptions, turn: Turn | None = None) -> StageResult:
    """One stage: skipped here when it cannot run on this machine or workload, else supervised
    in a worker of its own."""
    cls = load_stage(plan.stage)
    why = unavailable(cls) or prompt_file_only(cls, opts.workload)
    if why:
        if turn is not None:
            turn.start_ahead()  # the next stage's worker, as if this one had started
        return skipped(plan, cls, why[0], why[1])
    return supervise(session, ReadyStage(plan, cls, opts.timeout_s or plan.timeout_s), turn)


def ready(group: list[StagePlan], keys: dict[str, str], opts: RunOptions) -> list[ReadyStage]:
    """A stage group made ready to run: each stage's class, timeout and engine share key (a
    stage alone shares its engine with none)."""
    return [ReadyStage(p, load_stage(p.stage), opts.timeout_s or p.timeout_s, keys[p.name] if len(group) > 1 else None)
            for p in group]


def prompt_file_only(cls: type[Stage], workload: WorkloadConfig) -> tuple[str, str] | None:
    """(reason, fix) when the run's workload is a generated kind the stage does not send."""
    if workload.from_prompt_file or cls.any_workload:
        return None
    if cls.single_turn_workload:
        return None if parse_spec(workload.spec).single_turn else multi_turn_refusal(cls.name)
    return (f"{cls.name} measures the prompt file's workload (fixed, mixed) or its own sweep, not --workload {workload.kind}; "
            "the serving stages (vllm-serve, openai-endpoint, prefix-caching) send every kind, the fixed-workload stages "
            "(hf-fp16, bnb-*, awq-int4, vllm, vllm-fp8) every kind but multi-turn",
            f"run {cls.name} in a run without --workload {workload.kind} (docs/workloads.md)")


def _matches(old: RunResult, model: ModelSpec, workload: WorkloadConfig) -> str | None:
    if old.model and old.model.source != model.source:
        return f"model {old.model.source} vs {model.source}"
    if old.workload != workload:
        return "the workload differs"
    return None


def start_run(rd: RunDir, opts: RunOptions, reporter: Reporter) -> tuple[RunResult, RunResult | None, ModelInfo]:
    previous = None
    if opts.resume and rd.run_json.is_file():
        previous = rd.load()
        mismatch = _matches(previous, opts.model, opts.workload)
        if mismatch:
            raise UsageError(f"cannot resume {rd.root}: {mismatch}", "resume with the same --model and workload options, or use a new --output")
    env, model = probe(rd, opts, reporter)
    run = previous or RunResult(run_id=rd.root.name, created_at=utcnow(), command=opts.command, workload=opts.workload)
    run.name = opts.name or run.name or rd.root.resolve().name  # a resumed run keeps its name unless --name renames it
    opts.wall_before = run.wall_s or 0.0
    run.env, run.status, run.command = env, "running", opts.command
    run.journey = [p.as_dict() for p in opts.plans]  # a resumed run: its journey and any stages added
    run.model = model.model_copy(update={"path": portable_path(model.path)})
    if opts.min_quality is not None:
        run.min_quality = opts.min_quality
    if opts.preset is not None:
        run.preset = opts.preset
    rd.save(run)
    return run, previous, model


def run_journey(opts: RunOptions, reporter: Reporter) -> RunResult:
    rd = RunDir(opts.out_dir)
    rd.create()
    rd.lock()
    opts.began = time.monotonic()
    run: RunResult | None = None
    try:
        run, previous, model = start_run(rd, opts, reporter)
        session = RunSession(run, rd, model, find_reference(rd, opts.plans, previous), env_for_children(opts), reporter)
        _run_plans(session, previous, opts)
        run.status = "complete"
    except KeyboardInterrupt:
        if run is not None:
            run.status = "interrupted"
        raise
    except BaseException as e:
        if run is not None:
            run.status, run.failure = "failed", f"{type(e).__name__}: {str(e).strip()[:300]}"
        raise
    finally:
        if run is not None:
            run.finished_at = utcnow()
            run.wall_s = opts.wall_s()
            run.stages.sort(key=journey_order(run, opts.plans))
            _save_last(rd, run)
        rd.unlock()
    return run


def _save_last(rd: RunDir, run: RunResult) -> None:
    """The run's last write: a failure here (a full disk) must not hide the run's own outcome."""
    try:
        rd.save(run)
    except LlmoptError as e:
        import sys

        print(f"error: {e.message}", file=sys.stderr)


def _duration_key(run: RunResult, plan: StagePlan) -> str:
    from llmopt_bench.run import durations

    return durations.key(run.env.machine, run.model.source if run.model else "", run.workload, plan.stage, plan.params)


def say_eta(run: RunResult, plans: list[StagePlan], reporter: Reporter) -> None:
    """The time the remaining stages took last time here (the journey's ETA), when known."""
    from llmopt_bench.run import durations

    seconds, known = durations.eta([_duration_key(run, p) for p in plans])
    if known:
        rest = "" if known == len(plans) else f" (+ {len(plans) - known} stage(s) never timed here)"
        left = f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"
        reporter.phase(f"ETA ~{left} for {known} stage(s), from their last run here{rest}")


def _run_plans(session: RunSession, previous: RunResult | None, opts: RunOptions) -> None:
    run, reporter = session.run, session.reporter
    todo = [p for p in opts.plans if not ((d := previous.stage(p.name) if previous else None) and not again(d, opts.rerun))]
    for plan in opts.plans:
        if plan not in todo and previous is not None and (done := previous.stage(plan.name)) is not None:
            hint = "; --rerun failed measures it again" if done.status in FAILED else ""
            reporter.progress(plan.name, f"already in the run ({done.status}): kept (resume{hint})", None, None)
    keys = share_keys(todo, opts.workload) if opts.share_engines else {}
    groups = plan_groups(todo, keys, session.reference.name)
    ahead: Ahead | None = None
    try:
        for g, group in enumerate(groups):
            say_eta(run, [p for later in groups[g:] for p in later], reporter)
            worker, notes = ahead.take() if ahead else (None, [])
            ahead = Ahead(_launcher(session, groups[g + 1], keys, opts)) if opts.prefetch and g + 1 < len(groups) else None
            turn = Turn(worker, notes, ahead)
            left, stop = _run_group(session, group, keys, opts, turn) if len(group) > 1 else (group, False)
            if stop:
                return
            for plan in left:  # alone, or after its group stopped at a failure: each in its own process
                if not _run_one(session, plan, opts, turn if plan is group[0] else Turn(ahead=ahead)):
                    return
    finally:
        if ahead is not None:  # the run stopped (--fail-fast, Ctrl-C, an error): no worker waits on
            ahead.discard()


def again(done: StageResult, rerun: frozenset[str]) -> bool:
    """Whether --resume runs a stage already in the run: stopped from outside (RERUN), named by
    --rerun, or failed under --rerun failed. Everything else stays as measured."""
    return done.status in RERUN or done.name in rerun or (RERUN_FAILED in rerun and done.status in FAILED)


def _launcher(session: RunSession, group: list[StagePlan], keys: dict[str, str], opts: RunOptions) -> Callable[[], Launched] | None:
    """How to start the group's worker ahead; None when its first stage cannot run here."""
    if unavailable(load_stage(group[0].stage)):
        return None
    return lambda: launch(session, ready(group, keys, opts), ahead=True)


def _index(opts: RunOptions, plan: StagePlan) -> int:
    return opts.plans.index(plan) + 1


def _run_one(session: RunSession, plan: StagePlan, opts: RunOptions, turn: Turn | None = None) -> bool:
    """One stage in its own process; False when --fail-fast says to stop."""
    session.reporter.stage_start(plan.name, _index(opts, plan), len(opts.plans))
    started = time.time()
    try:
        result = run_stage(session, plan, opts, turn)
    except KeyboardInterrupt:
        _interrupted(session, plan, started)
        raise
    return _record(session, plan, result, opts)


def _run_group(session: RunSession, group: list[StagePlan], keys: dict[str, str], opts: RunOptions,
               turn: Turn) -> tuple[list[StagePlan], bool]:
    """Stages that share an engine, in one process (supervisor.supervise_group): the plans it
    did not run, and whether --fail-fast stops the journey."""
    current: list[tuple[StagePlan, float]] = []  # the stage running now, and since when
    stop: list[bool] = [False]

    def begin(plan: StagePlan) -> None:
        current[:] = [(plan, time.time())]
        session.reporter.stage_start(plan.name, _index(opts, plan), len(opts.plans))

    def done(plan: StagePlan, result: StageResult) -> None:
        current.clear()
        stop[0] = stop[0] or not _record(session, plan, result, opts)

    try:
        left = supervise_group(session, ready(group, keys, opts), begin, done, turn)
    except KeyboardInterrupt:
        if current:
            _interrupted(session, *current[0])
        raise
    return left, stop[0]


def _interrupted(session: RunSession, plan: StagePlan, started: float) -> None:
    """The stage Ctrl-C stopped, recorded with what it had kept (its partial.json)."""
    rd = session.rundir
    session.run.put(interrupted(plan, load_stage(plan.stage), "stopped before it finished (Ctrl-C or SIGTERM)",
                                f"llmopt bench --resume {rd.root}", log=rd.relative(rd.log(plan.name)), started_at=utc_at(started),
                                partial=rd.read_partial(plan.name, started)))


def _record(session: RunSession, plan: StagePlan, result: StageResult, opts: RunOptions) -> bool:
    """A stage's result into the run, saved; False when --fail-fast says to stop."""
    from llmopt_bench.run import durations

    run = session.run
    run.put(result)
    run.wall_s = opts.wall_s()  # so far: a kill from outside (a machine taken away) keeps this invocation's time
    if result.status == "ok" and result.duration_s:
        durations.record(_duration_key(run, plan), result.duration_s)
    apply_gate(run, run.min_quality)
    session.rundir.save(run)
    session.reporter.stage_end(result)
    return not (opts.fail_fast and result.status in FAILED)


def share_keys(plans: list[StagePlan], workload: WorkloadConfig | None = None) -> dict[str, str]:
    """Each plan's engine share key (Stage.share_key), for the stages that can run here, on
    this workload, and declare one."""
    keys = {}
    for plan in plans:
        cls = load_stage(plan.stage)
        if unavailable(cls) or (workload is not None and prompt_file_only(cls, workload)):
            continue
        key = cls.share_key(cls.Params(**plan.params))
        if key:
            keys[plan.name] = key
    return keys


def plan_groups(todo: list[StagePlan], keys: dict[str, str], reference: str | None) -> list[list[StagePlan]]:
    """The order stages run in: the journey's, except that the later stages sharing a stage's
    engine key run right after it, in one group (results are still saved in journey order).
    Nothing is moved past the quality reference's provider, which the others need first."""
    rest, groups = list(todo), []
    while rest:
        head = rest.pop(0)
        group = [head]
        if head.name in keys:
            for plan in list(rest):
                if plan.name == reference:
                    break
                if keys.get(plan.name) == keys[head.name]:
                    group.append(plan)
                    rest.remove(plan)
        groups.append(group)
    return groups


def resume_plans(previous: RunResult, added: list[StagePlan] | None) -> list[StagePlan]:
    """--resume finishes the journey the run was started with; --stages with it adds stages."""
    plans = [plan_of(d) for d in previous.journey]
    return plans + [p for p in added or [] if all(p.name != q.name for q in plans)]
