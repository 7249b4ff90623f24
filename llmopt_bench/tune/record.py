"""What `llmopt tune` keeps in its run directory's tune.json, rewritten (atomically) as each trial
starts and ends, so an interrupted run loses only the trial it was in: the settings, the space,
every trial with its rungs, quality, memory and outcome, the winner and the defaults."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from llmopt_bench.core.freeform import Json
from llmopt_bench.core.records import QualityRecord, StrictModel
from llmopt_bench.core.slo import SLO
from llmopt_bench.core.workload import WorkloadConfig
from llmopt_bench.tune.space import Config, Space

TUNE_JSON = "tune.json"

SCHEMA = 2  # 2: the ceiling rung, the phases, the upper ends, the root cause (issue 43)
RungName = Literal["ceiling", "short", "precise", "held"]
RUNGS: tuple[RungName, ...] = ("ceiling", "short", "precise", "held")
# why a server was started (tune/tuner.py): the defaults (every rung: the reference), a screen (the
# ceiling alone: a single-knob change, or a combination of the knobs that helped), a narrowing (a
# screened configuration started again for its capacity under the SLO), the winner's confirmation
Phase = Literal["defaults", "screen", "combine", "narrow", "confirm"]
# running: started, not ended (an interrupted run starts it again); screened: its ceiling measured,
# as planned; held: it climbed every rung and its capacity held (hold failed: every hold missed the
# SLO; hold not judged: the client could not deliver or time it); pruned: it could not beat the
# best held (its interval says so) or no rate met the SLO; stopped: the budget did; confirmed: a
# start for the winner's confirmation; cannot start: the server refused (its root cause); not
# started: vLLM is known to refuse it, or refused the same knobs in another trial (no server
# started); quality: it failed the quality gate; skipped: it could not run here; error: it broke
# while measured
Outcome = Literal["running", "screened", "held", "hold failed", "hold not judged", "pruned", "stopped", "confirmed",
                  "cannot start", "not started", "quality", "skipped", "error"]


class Rung(StrictModel):
    """The capacity one rung found: its interval, its precision, its latency there."""

    name: RungName
    capacity_rps: float | None = None  # the highest rate that met the SLO (held: the rate that held); None on the ceiling rung
    passing_rps: float | None = None
    failing_rps: float | None = None  # None: it met the SLO at every rate tried
    # the interval's upper end: the lowest rate that failed, or the highest completion rate measured
    # (a rate above what the server completes cannot be sustained) where that is lower; None: unbounded
    upper_rps: float | None = None
    ceiling_rps: float | None = None  # the highest completion rate measured (the ceiling rung: its all-at-once point's)
    precision: float = 0.0  # asked of the search (upper / passing - 1)
    converged: bool = False
    held: bool | None = None  # the held rung only: whether the hold met the SLO
    hold_s: float | None = None
    probes: int = 0  # load points this rung ran
    seconds: float = 0.0
    ttft_p99_s: float | None = None  # at the capacity's point
    tpot_p99_s: float | None = None
    notes: list[str] = Field(default_factory=list)

    @property
    def reached(self) -> float | None:
        """The precision reached: the interval's width over its lower end (None: not bracketed)."""
        top = self.top
        if self.passing_rps and top:
            return top / self.passing_rps - 1
        return None

    @property
    def top(self) -> float | None:
        """The interval's upper end (records before schema 2 kept only the lowest failure)."""
        return self.upper_rps or self.failing_rps


class Confirmation(StrictModel):
    """vLLM's own client (`vllm bench serve`) at the capacity, on the same server."""

    rate_rps: float
    seconds: float  # of arrivals asked
    num_prompts: int
    command: str
    verdict: Literal["held", "missed", "failed"]
    why: str = ""
    # free-form: vLLM's own figures as its result JSON names them (completed, failed, request_throughput,
    # duration), llmopt's verdict's p-values for each of the SLO's targets (ttft_p99_ms ...), its steady state (tune/confirm.py)
    figures: Json = Field(default_factory=dict)
    on_trial: int | None = None  # where it ran on another start of the same configuration (phase confirm)


class Memory(StrictModel):
    gpu_used_bytes: int | None = None  # the card's memory the server took (NVML, after its start)
    host_peak_rss_bytes: int | None = None  # the server's processes' peak resident memory
    kv_cache_tokens: int | None = None  # the KV cache's size vLLM logged

    @property
    def bytes(self) -> int | None:
        return self.gpu_used_bytes or self.host_peak_rss_bytes


class TrialRecord(StrictModel):
    number: int
    config: Config
    label: str
    defaults: bool = False
    phase: Phase | None = None
    why: str | None = None  # why the search started it (or did not: outcome "not started")
    decision: str | None = None  # what the search made of it afterwards: narrowed in trial N, or why not
    paired: dict[str, str] = Field(default_factory=dict)  # a setting the configuration brings with it -> why (tune/constraints.py)
    confirms: int | None = None  # phase confirm: the held trial it confirms
    outcome: Outcome = "running"
    reason: str | None = None
    cause: str | None = None  # cannot start: the root cause, the exception line of the engine's log
    fix: str | None = None
    command: str | None = None  # the `vllm serve` line of this configuration
    started_at: str | None = None
    seconds: float | None = None
    start_s: float | None = None  # the server's start, to /health
    rungs: list[Rung] = Field(default_factory=list)
    quality: QualityRecord | None = None
    memory: Memory = Field(default_factory=Memory)
    confirmation: Confirmation | None = None
    value: float | None = None  # what the study was told: the capacity's lower bound at its last rung (0: none)
    server_pid: int | None = None  # while running: the server's session, stopped by a resumed run if still there
    log: str | None = None  # the server's log, relative to the run directory

    @property
    def last(self) -> Rung | None:
        return self.rungs[-1] if self.rungs else None

    @property
    def ceiling_rps(self) -> float | None:
        """The screen's figure: what the server completed a second, all at once."""
        return next((r.ceiling_rps for r in self.rungs if r.name == "ceiling"), None)

    @property
    def held_rung(self) -> Rung | None:
        return next((r for r in self.rungs if r.name == "held" and r.held), None)

    @property
    def quality_ok(self) -> bool:
        return not (self.quality is not None and self.quality.quality_regression)


class Ratio(StrictModel):
    """The winner's held capacity over the defaults', with the interval both capacities allow."""

    value: float
    lo: float | None  # winner's capacity / defaults' upper end (None: the defaults' capacity is not bounded)
    hi: float | None  # winner's upper end / defaults' capacity (None: the winner's capacity is not bounded)


class TuneSettings(StrictModel):
    """What every trial of one tune run shares, kept so that --resume goes on with the same."""

    slo: SLO  # written as its text
    hold_s: float
    budget_s: float
    seed: int
    min_quality: float
    max_trials: int | None = None
    workload: WorkloadConfig
    real_weights: bool | None = None  # the model's: FP8 and AWQ must pass the quality gate to win


class TuneRecord(StrictModel):
    schema_version: int = SCHEMA
    command: str
    created_at: str
    status: Literal["running", "complete", "interrupted", "failed"] = "running"
    device: str
    model: str
    settings: TuneSettings
    space: Space
    trials: list[TrialRecord] = Field(default_factory=list)
    wall_s: float = 0.0  # every invocation's time together (the budget's clock)
    winner: int | None = None  # the trial number
    defaults: int | None = None
    ratio: Ratio | None = None
    notes: list[str] = Field(default_factory=list)

    def trial(self, number: int | None) -> TrialRecord | None:
        return next((t for t in self.trials if t.number == number), None)

    def finished(self) -> list[TrialRecord]:
        return [t for t in self.trials if t.outcome != "running"]
