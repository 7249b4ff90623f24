"""One configuration of `llmopt tune`, on one server start: the server (`vllm serve` with the
configuration's flags), its quality against the FP16 reference, then rung by rung: its ceiling
(one all-at-once point: the screen), its capacity under the SLO (short points to a coarse
precision, then narrowed), then held, asking the tuner between rungs whether to go on (the screen
ends there; a capacity that cannot beat the best held stops; the budget). A new best held
capacity is confirmed by `vllm bench serve` while its server is still up; a start planned for the
confirmation alone runs it at once.

Whatever happens is the trial's outcome, never the command's crash: a server that does not start
(out of memory, a combination vLLM refuses, a kernel this device lacks) is "cannot start" with the
reason from its log; a server that dies under load is "error"."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

from llmopt_bench.core.contract import StageContext, StageSkipped
from llmopt_bench.core.errors import LlmoptError, describe
from llmopt_bench.core.records import LoadInfo, QualityRecord, StageFacts
from llmopt_bench.core.workload import WorkloadConfig
from llmopt_bench.scenarios.serving.record import ServingExtra, ServingParams
from llmopt_bench.tune.record import Confirmation, Rung, TrialRecord
from llmopt_bench.tune.space import Space, engine_params

if TYPE_CHECKING:
    from llmopt_bench.engines.vllm.served import Served

MARKER = "LLMOPT_TUNE_SERVER"  # in each server's environment: its trial's directory (a resumed run finds leftovers by it)


class Steer(Protocol):
    """What a trial asks the tuner (tune/tuner.py) as it goes."""

    def say(self, msg: str) -> None: ...
    def save(self, rec: TrialRecord) -> None: ...
    def start_rps(self) -> float | None: ...  # a capacity already known, where the search starts
    def go_on(self, rec: TrialRecord, rung: Rung) -> str | None: ...  # why to stop after this rung (None: go on)
    def confirm_rate(self, rec: TrialRecord) -> float | None: ...  # a start for the confirmation alone: its rate
    def fits(self, what: str, seconds: float) -> bool: ...  # the budget
    def rung_s(self, rung: str) -> float: ...  # what a rung is expected to cost
    def confirm(self, rec: TrialRecord) -> bool: ...  # whether to confirm this held capacity now


@dataclass
class Shared:
    """What every trial of a tune run shares."""

    model: Any  # ModelInfo, prepared
    device: str
    space: Space
    load: ServingParams
    workload: WorkloadConfig
    run_dir: Path
    reference_file: Path | None
    reference_name: str | None
    reference_quality: QualityRecord | None
    min_quality: float
    hold_s: float
    server_timeout_s: float = 900.0


@dataclass
class Measured:
    """What run.json keeps of a held trial (its vllm-serve-like result)."""

    samples: list
    extra: ServingExtra
    facts: StageFacts
    load: LoadInfo | None


def run_trial(shared: Shared, rec: TrialRecord, steer: Steer) -> Measured | None:
    """Run one configuration to its outcome (written into rec); what run.json keeps when it was held."""
    t0 = time.monotonic()
    trial_dir = shared.run_dir / "trials" / f"{rec.number:03d}"
    trial_dir.mkdir(parents=True, exist_ok=True)
    server = None
    try:
        server, info = _start(shared, rec, trial_dir, steer)
        if server is None or info is None:
            return None
        return _measure(shared, rec, server, info, trial_dir, steer)
    except StageSkipped as e:
        rec.outcome, rec.reason, rec.fix = "skipped", e.reason, e.fix
    except LlmoptError as e:
        rec.outcome, rec.reason, rec.fix = "error", e.message, e.fix
    except Exception as e:  # noqa: BLE001 - one configuration's failure is its outcome; the search goes on
        rec.outcome, rec.reason = "error", describe(e, 300)
    finally:
        if server is not None:
            stopped = server.stop()
            rec.memory.host_peak_rss_bytes = stopped.get("host_peak_rss_bytes")
        rec.seconds = round(time.monotonic() - t0, 3)
    return None


def _start(shared: Shared, rec: TrialRecord, trial_dir: Path, steer: Steer) -> tuple[Served | None, LoadInfo | None]:
    """The configuration's server, healthy (engines/vllm/served.py, as the vllm-serve stage starts
    its own); (None, None) with the outcome written when it did not start, the reason the line of
    its log that says why."""
    from llmopt_bench.engines import lifecycle
    from llmopt_bench.engines.vllm.served import CannotStart, Served

    params, awq = engine_params(shared.space, rec.config)
    log = trial_dir / "server.log"
    served = Served(shared.model, params, device=shared.device, log_path=log, awq=shared.space.awq if awq else None,
                    ctx=context(shared, trial_dir, steer), env={MARKER: str(trial_dir)})
    rec.command, rec.log = served.reproduce(), str(log.relative_to(shared.run_dir))
    steer.save(rec)
    before = lifecycle.device_memory(use_torch=False)
    t0 = time.monotonic()
    try:
        info = served.start(timeout_s=shared.server_timeout_s)
    except CannotStart as e:
        rec.outcome, rec.reason, rec.fix = "cannot start", f"{e.kind}: {e.said}", f"see {rec.log}"
        return None, None
    rec.start_s = round(time.monotonic() - t0, 3)
    after = lifecycle.device_memory(use_torch=False)
    if after.get("nvml_used_bytes") is not None:
        rec.memory.gpu_used_bytes = after["nvml_used_bytes"] - before.get("nvml_used_bytes", 0)
    rec.memory.kv_cache_tokens = info.implementation.get("kv_cache_tokens")
    return served, info


def context(shared: Shared, trial_dir: Path, steer: Steer) -> StageContext:
    from llmopt_bench.measure.energy import TimedMeter, device_energy_mj

    return StageContext(run_dir=shared.run_dir, stage_dir=trial_dir, device=shared.device,
                        progress=lambda msg, done=None, total=None: steer.say(f"  {msg}") if done is None else None,
                        reference_file=shared.reference_file, reference_name=shared.reference_name,
                        meter=TimedMeter(read_mj=device_energy_mj if shared.device == "cuda" else lambda: None))


def _measure(shared: Shared, rec: TrialRecord, server: Served, info: LoadInfo, trial_dir: Path, steer: Steer) -> Measured | None:
    """Quality first (a configuration that fails the gate is no answer, whatever its speed), then the rungs."""
    from llmopt_bench.client.http_load import HTTPLoad
    from llmopt_bench.client.openai_http import Endpoint
    from llmopt_bench.load.plans import PlanLoad
    from llmopt_bench.scenarios.serving.run import serving_plans
    from llmopt_bench.tune.confirm import confirm
    from llmopt_bench.tune.server_capacity import ServerCapacity
    from llmopt_bench.workloads.text import PromptTexts

    tok = tokenizer(shared.model.path)
    encode = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    endpoint = Endpoint(server.base_url, server.name, request_timeout_s=shared.load.request_timeout_s,
                        sampling=shared.load.sampling())
    # what the vllm-serve stage sends: text of the asked length on the server's tokenizer (workloads/text.py), or token ids
    texts = PromptTexts(tok, shared.workload.seed) if shared.load.prompt_format == "text" else None
    ctx = context(shared, trial_dir, steer)
    if not passes(shared, rec, quality(endpoint, encode, shared, ctx, server)):
        return None
    plan = serving_plans(shared.workload, tok, shared.model.vocab_size, encode, server.cfg.max_model_len, shared.load)[0]
    load = PlanLoad(plan)
    warm_up(endpoint, load, shared.workload, texts)
    target = {"kind": "vllm serve (started by llmopt tune)", "url": server.base_url, "model": server.name,
              "command": server.reproduce(), "entry": " ".join(server.server.entry)}
    cap = ServerCapacity.serving(HTTPLoad(endpoint, texts=texts), target, shared.load, load, ctx, shared.workload.seed)
    if not climb(shared, rec, cap, steer, lambda rate: confirm(server, shared, rate, trial_dir.relative_to(shared.run_dir), load.lengths())):
        return None
    samples, extra, facts = cap.result()
    return Measured(samples=samples, extra=extra, facts=facts, load=info)


def passes(shared: Shared, rec: TrialRecord, measured: QualityRecord) -> bool:
    """The quality gate against the FP16 reference (analysis/quality_gate.py); a configuration
    that fails it ends there: it is no answer, whatever its speed."""
    from llmopt_bench.analysis.quality_gate import judge

    rec.quality = measured.model_copy(update=judge(measured, shared.reference_quality, shared.reference_name, shared.min_quality))
    if rec.quality.quality_regression:
        rec.outcome, rec.reason = "quality", f"fails the quality gate: {rec.quality.gate}"
        return False
    return True


def climb(shared: Shared, rec: TrialRecord, cap: Any, steer: Steer, confirm: Callable[[float], Confirmation]) -> bool:
    """The rungs, as long as the tuner lets this configuration go on; True when it climbed them all
    (or ran the confirmation it was started for)."""
    s = shared.space.search
    rate = steer.confirm_rate(rec)
    if rate is not None:  # started again for the winner's confirmation alone
        steer.say(f"  vllm bench serve at {rate:g} req/s for {shared.hold_s:g} s (the confirmation)")
        rec.confirmation, rec.outcome = confirm(rate), "confirmed"
        return True
    t0 = time.monotonic()
    cap.start(steer.start_rps(), s.start_concurrency)
    rungs = [("ceiling", lambda: cap.ceiling_rung(time.monotonic() - t0)),
             ("short", lambda: cap.narrow("short", s.short_precision, s.short_point_s, s.short_probes)),
             ("precise", lambda: cap.narrow("precise", s.precision, s.point_s, s.probes)),
             ("held", lambda: cap.hold(shared.hold_s, shared.load.hold_attempts))]
    for i, (name, run) in enumerate(rungs):
        if i and not steer.fits(f"trial {rec.number}'s {name} rung", steer.rung_s(name)):
            rec.outcome, rec.reason = "stopped", f"the budget left no time for the {name} rung"
            return False
        rung = run()
        rec.rungs.append(rung)
        rec.value = rung.capacity_rps or rung.ceiling_rps or 0.0
        steer.save(rec)
        why = steer.go_on(rec, rung) if name != "held" else None  # told even when nothing met the SLO
        if name == "ceiling":
            if rung.ceiling_rps is None:
                rec.outcome, rec.reason = "pruned", "no ceiling measured (every request of the all-at-once point failed)"
                return False
            if why:  # the screen ends here as planned; a start for more ends here where it cannot win
                rec.outcome, rec.reason = ("screened" if rec.phase in ("screen", "combine") else "pruned"), why
                return False
            continue
        if rung.capacity_rps is None:
            rec.outcome, rec.reason = "pruned", f"no rate met the SLO ({'; '.join(rung.notes) or 'none'})"
            return False
        if why:
            rec.outcome, rec.reason = "pruned", why
            return False
    held = rec.held_rung.capacity_rps if rec.held_rung else None
    rec.outcome = "held" if held else "hold failed" if rung.held is False else "hold not judged"
    if not held:
        rec.reason = rung.notes[-1] if rung.notes else "the hold missed the SLO"
    if held and steer.confirm(rec):
        steer.say(f"  vllm bench serve at {held:g} req/s for {shared.hold_s:g} s (the confirmation)")
        rec.confirmation = confirm(held)
    return True


def estimate(shared: Shared, rung: str) -> float:
    """A rung's seconds from its settings, before any was timed (a point of a few seconds' arrivals
    at its minimum length, its warm-up, the drain)."""
    s, p = shared.space.search, shared.load
    per_point = lambda point_s: max(point_s, p.requests_per_point / 2.0) + p.warmup_s + 5  # noqa: E731
    if rung == "ceiling":
        return per_point(0.0) if p.ceiling_requests else per_point(s.short_point_s)
    if rung == "short":
        return s.short_probes * per_point(s.short_point_s)
    if rung == "precise":
        return s.probes * per_point(s.point_s)
    return (p.hold_attempts or 2) * (shared.hold_s + p.warmup_s + 10)  # no cap: a hold and one below it, most often


def tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def quality(endpoint: Any, encode: Any, shared: Shared, ctx: StageContext, server: Served) -> QualityRecord:
    """Perplexity (real weights) and agreement with the FP16 reference, through the server (as vllm-serve)."""
    from llmopt_bench.engines.vllm.served_quality import served_quality

    dummy = server.cfg.load_format == "dummy"
    try:
        return QualityRecord(**served_quality(endpoint, encode, shared.reference_file, shared.reference_name,
                                              shared.model.real_weights and not dummy, ctx.progress, dummy=dummy))
    except Exception as e:  # noqa: BLE001 - the trial's load points are still worth measuring
        return QualityRecord(reference=shared.reference_name, error=describe(e, 300))


def warm_up(endpoint: Any, load: Any, workload: WorkloadConfig, texts: Any) -> None:
    """A few requests one at a time, untimed, sent as the load sends them: a server's first answers pay for lazy set-up."""
    import asyncio

    from llmopt_bench.client.openai_http import OpenAIClient

    async def go() -> None:
        async with OpenAIClient(endpoint) as client:
            for r in load.warmup(max(1, workload.warmup)):
                await client.complete(r.id, r.prompt_id, texts.text(r.token_ids) if texts else list(r.token_ids),
                                      r.output_len or workload.max_new_tokens)
    asyncio.run(go())


def leftover_servers(trial_dirs: list[str]) -> list[int]:
    """The process groups of servers a killed run left behind for these trials (found by MARKER;
    each server leads a group of its own)."""
    from llmopt_bench.procs.tree import PGRP, live_processes

    wanted, found = {f"{MARKER}={d}".encode() for d in trial_dirs}, set()
    for pid, stat in live_processes().items():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = set(f.read().split(b"\0"))
        except OSError:
            continue
        if env & wanted and int(stat[PGRP]) != os.getpgrp():
            found.add(int(stat[PGRP]))
    return sorted(found)
