"""Compare two runs stage by stage: the ratio new/baseline of each metric with an interval that
carries run-to-run noise (analysis/gate/noise.py: each run's repeats, or the spread of earlier runs of
the same fingerprint), a verdict that is a regression only when the whole interval lies beyond
the allowed change in the bad direction and "unchanged" only when it lies wholly within it
(otherwise inconclusive: a gated metric's fails the comparison), the smallest change the pair
could detect, the host's part (analysis/gate/host_verdict.py), and whether the new run is a complete
comparison (docs/regression.md).

Pure functions over RunResult/StageResult; numpy is imported inside."""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

from llmopt_bench.analysis import figures
from llmopt_bench.analysis.gate import host_signals, host_verdict, noise
from llmopt_bench.analysis.gate.baseline_drift import Drift
from llmopt_bench.analysis.gate.completeness import (  # noqa: F401 - the names compare's callers import from here
    ALLOW_ALL,
    ALLOW_RUN,
    Gap,
    gaps,
    incomplete,
    params_diff,
    params_note,
    parse_allowed,
)
from llmopt_bench.analysis.gate.judge import (  # noqa: F401 - the names compare's callers import from here
    GATED,
    METRICS,
    SAMPLE_COLUMNS,
    Metric,
    MetricDelta,
    change_verdict,
    judge,
)
from llmopt_bench.analysis.metric_registry import lookup
from llmopt_bench.core.errors import UsageError
from llmopt_bench.core.results import RunResult, StageResult
from llmopt_bench.measure.conditions import conditions_summary

DEFAULT_MAX_REGRESSION = 0.05
# load_s is one measurement per run (no interval), and a cold page cache alone moves it by more
# than 5%: it gets a wider default allowance. Name it to change it: --max-regression load=10%.
DEFAULT_THRESHOLDS = {"load_s": 0.20}
# A host-bound stage (analysis/hostbound.py: the GPU waits on the host CPU, or a CPU run) moves
# with the host from repeat to repeat by far more than a GPU-bound one (H200 hf-fp16's TPOT
# repeats 21-33 ms, vLLM's within 0.2%): its timings are gated at 10% by default, so that a 20%
# slowdown, the size the gate must catch there (issue 33), is caught, and a GPU-bound stage's at
# 5%, to catch 10%. A bare --max-regression PCT sets every stage's; METRIC=PCT names one metric.
HOST_BOUND_MAX_REGRESSION = 0.10
# workload fields that change how much is measured, not what: a run with more repeats is the
# same measurement with a narrower interval (how a nightly outgrows its baseline's noise)
# (and workload.notes: why the values were chosen, the values themselves compared above; the CPU
# note names only the defaults it chose, so `--repeats 10` would otherwise change it)
# (max_repeats, stop_within and repeat_budget_s: the stopping rule's, how many repeats to take)
SAME_MEASUREMENT = ("repeats", "max_repeats", "stop_within", "repeat_budget_s", "notes")


def metric_key(name: str, option: str = "--max-regression") -> str:
    """A judged metric's key from any name the registry knows for it (tpot, tpot_p50_ms, ttft_s.p50)."""
    m = lookup(name)
    if m is None or m.key not in METRICS:
        raise UsageError(f"{option}: unknown metric {name!r}",
                         f"use one of {', '.join(METRICS)} (or ttft, tpot, e2e, tok_s, load, memory)")
    return m.key


def parse_gate(specs: Sequence[str] | None) -> list[str]:
    """--gate tpot,tok_s (repeatable; 'all': every metric) -> metric keys; none given: GATED."""
    names = [p.strip() for spec in specs or [] for p in spec.split(",") if p.strip()]
    if not names:
        return list(GATED)
    return list(METRICS) if "all" in names else list(dict.fromkeys(metric_key(n, "--gate") for n in names))


def parse_watch(specs: Sequence[str] | None, stages: Collection[str] | None = None) -> set[tuple[str, str]]:
    """--watch flash-attn:tpot,vllm-attn (repeatable) -> {(stage, metric key or "*")}: gated metrics
    of those stages that are only watched (their inconclusive verdict is reported, does not fail).
    `stages`: the names a stage may take (the runs' and the registered ones): another is refused,
    as a typo would otherwise watch nothing, silently."""
    out = set()
    for part in (p.strip() for spec in specs or [] for p in spec.split(",") if p.strip()):
        stage, _, metric = part.partition(":")
        if stages is not None and stage not in stages:
            raise UsageError(f"--watch {part!r}: no stage {stage!r} in either run",
                             f"name a stage ({', '.join(sorted(stages)) or 'none'}), or STAGE:METRIC with a metric of "
                             f"{', '.join(METRICS)} (or ttft, tpot, e2e, tok_s, load, memory)")
        out.add((stage, metric_key(metric, "--watch") if metric else "*"))
    return out


def parse_percent(text: str) -> float:
    """'5%' or '5' -> 0.05 (a plain number is a percentage too)."""
    t = text.strip().rstrip("%").strip()
    try:
        value = float(t) / 100.0
    except ValueError:
        raise UsageError(f"--max-regression {text!r}: not a percentage", "write e.g. 5% or tpot=3%") from None
    if not (0 <= value < 10) or not math.isfinite(value):
        raise UsageError(f"--max-regression {text!r}: out of range", "use a percentage between 0% and 1000%")
    return value


def parse_thresholds(specs: Sequence[str] | None) -> dict[str, float]:
    """['5%', 'tpot=3%', 'ttft=10%,load=30%'] -> {'*': 0.05, 'tpot_p50': 0.03, ...}."""
    out: dict[str, float] = {}
    for spec in specs or []:
        for part in filter(None, (p.strip() for p in spec.split(","))):
            if "=" in part:
                name, value = part.split("=", 1)
                out[metric_key(name)] = parse_percent(value)
            else:
                out["*"] = parse_percent(part)
    return out


def threshold_for(key: str, thresholds: dict[str, float] | None, host_bound: bool | None = False,
                  stage: str | None = None) -> float:
    """The stage's own for this metric ("stage:metric", a baseline's gate file), else a metric
    named explicitly, else its own default (load_s), else the bare value, else 10% for a
    host-bound stage's timings and 5% otherwise."""
    t = thresholds or {}
    if stage is not None and f"{stage}:{key}" in t:
        return t[f"{stage}:{key}"]
    if key in t:
        return t[key]
    if key in DEFAULT_THRESHOLDS:
        return DEFAULT_THRESHOLDS[key]
    if "*" in t:
        return t["*"]
    return HOST_BOUND_MAX_REGRESSION if host_bound and METRICS[key].needs_noise else DEFAULT_MAX_REGRESSION


def device_name(run: RunResult) -> str | None:
    return run.env.machine


def mismatches(base: RunResult, new: RunResult) -> list[str]:
    """What makes the two runs measure different things (compare refuses unless forced)."""
    out = []
    if device_name(base) != device_name(new):
        out.append(f"device {device_name(base)!r} vs {device_name(new)!r}")
    b_model, n_model = (base.model.source if base.model else None), (new.model.source if new.model else None)
    if b_model != n_model:
        out.append(f"model {b_model!r} vs {n_model!r}")
    b_wl, n_wl = base.workload.model_dump(), new.workload.model_dump()
    diff = [f"{k} {b_wl.get(k)!r} vs {n_wl.get(k)!r}" for k in sorted(set(b_wl) | set(n_wl))
            if b_wl.get(k) != n_wl.get(k) and k not in SAME_MEASUREMENT]
    if diff:
        out.append("workload " + ", ".join(diff))
    return out


def check_comparable(base: RunResult, new: RunResult, force: bool = False) -> list[str]:
    found = mismatches(base, new)
    if found and not force:
        raise UsageError("the runs are not comparable: " + "; ".join(found),
                         "compare runs of the same device, model and workload, or pass --force to compare anyway")
    return found


# ---- values -------------------------------------------------------------------------------------

def metric_value(stage: StageResult, key: str) -> float | None:
    """The figure of a judged metric over the repeats given (analysis/figures.py: what every
    output shows), in run.json's unit."""
    return figures.figure_over(stage, key).recorded


def noise_groups(stage: StageResult, key: str) -> tuple[list[list[float]], str]:
    """What the interval draws from: the figure's per-repeat groups (analysis/figures.repeat_groups):
    per-request values grouped by repeat for the latencies (statistic: the median), each repeat's
    windowed tok/s for throughput, nothing for load and memory (one value per run)."""
    return figures.repeat_groups(stage, key)


def centre_value(stage: StageResult, key: str) -> float | None:
    """The run's value as the gate takes it: the geometric mean of its repeats' figures
    (noise.centre), else (load, memory) its one value."""
    groups, statistic = noise_groups(stage, key)
    return noise.centre(groups, statistic) or metric_value(stage, key)


def fingerprint_values(history: Iterable[RunResult], stage: StageResult, key: str) -> list[float]:
    """The metric in earlier runs whose stage has the same name, params and status ok (the runs
    were chosen with the same device, model and workload)."""
    out = []
    for run in history:
        s = run.stage(stage.name)
        if s is not None and s.status == "ok" and s.params == stage.params:
            value = centre_value(s, key)
            if value is not None:
                out.append(value)
    return out


# ---- verdicts -----------------------------------------------------------------------------------

def compare_metric(key: str, base: StageResult, new: StageResult, threshold: float, resamples: int = 2000,
                   confidence: float = 0.95, seed: int = 0, history: Sequence[float] = ()) -> MetricDelta:
    """`history`: the metric in earlier runs of the baseline's fingerprint (fingerprint_values)."""
    (b_groups, statistic), (n_groups, _) = noise_groups(base, key), noise_groups(new, key)
    return judge(key, metric_value(base, key), metric_value(new, key), b_groups, n_groups, statistic, threshold,
                 resamples, confidence, seed, history)


@dataclass
class StageDelta:
    stage: str
    state: str  # compared | only in baseline | only in new | not ok | failed in new | not comparable
    baseline_status: str | None = None
    new_status: str | None = None
    note: str | None = None
    metrics: list[MetricDelta] = field(default_factory=list)
    host_bound: bool | None = None  # analysis/hostbound.py, with why
    host_bound_why: str = ""
    host: host_verdict.HostChange | None = None  # the host-speed change, where either run recorded the index
    host_moved: list[host_signals.Moved] = field(default_factory=list)  # the repeats' signals that moved
    set_aside: dict[str, list[int]] = field(default_factory=dict)  # "baseline"/"new": repeats the host disturbed, not judged

    @property
    def regressions(self) -> list[str]:
        return [d.metric for d in self.metrics if d.verdict == "regressed"]

    @property
    def improvements(self) -> list[str]:
        return [d.metric for d in self.metrics if d.verdict == "improved"]

    @property
    def host_inconclusive(self) -> list[str]:
        return [d.metric for d in self.metrics if d.verdict == host_verdict.HOST_INCONCLUSIVE]

    @property
    def inconclusive(self) -> list[str]:
        """The gated metrics left unsettled (not the host's: those are host_inconclusive)."""
        return [d.metric for d in self.metrics if d.verdict == "inconclusive" and d.gated]


def compare_stage(base: StageResult | None, new: StageResult | None, thresholds: dict[str, float] | None = None,
                  resamples: int = 2000, confidence: float = 0.95, seed: int = 0,
                  history: Sequence[RunResult] = (), gate: Collection[str] = GATED,
                  host_bound: bool | None = False, watch: Collection[tuple[str, str]] = ()) -> StageDelta:
    if base is None or new is None:
        only = new if base is None else base
        assert only is not None, "compare_stage takes a stage of either run"
        return StageDelta(only.name, "only in new" if base is None else "only in baseline",
                          None if base is None else base.status, None if new is None else new.status)
    out = StageDelta(base.name, "compared", base.status, new.status)
    if base.status != "ok" or new.status != "ok":
        out.state = "failed in new" if base.status == "ok" else "not ok"
        side = new if new.status != "ok" else base
        out.note = f"{'new' if side is new else 'baseline'}: {side.status}" + (f" ({side.reason})" if side.reason else "")
        return out
    if diff := params_diff(base, new):  # other settings measure other things (history show: "not comparable")
        out.state, out.note = "not comparable", params_note(diff)
        return out
    out.metrics = [compare_metric(k, base, new, threshold_for(k, thresholds, host_bound, base.name), resamples, confidence, seed,
                                  fingerprint_values(history, base, k)) for k in METRICS]
    for d in out.metrics:
        d.gated = d.metric in gate and not {(base.name, d.metric), (base.name, "*")} & set(watch)
    return out


@dataclass(frozen=True)
class RunSummary:
    """Who a compared run is, as the comparison's header and its JSON name it."""
    run_id: str
    created_at: str
    commit: str | None
    device: str | None
    model: str | None
    name: str = ""  # what the header calls it: the run's name (core/results.RunResult.label)


@dataclass(frozen=True)
class SidesConditions:
    """What the machine did during each side's repeats of a stage (measure/conditions.py), in words."""
    baseline: str | None
    new: str | None


@dataclass
class Comparison:
    baseline: RunSummary
    new: RunSummary
    stages: list[StageDelta]
    mismatches: list[str]  # accepted with force
    resamples: int
    confidence: float
    seed: int
    thresholds: dict[str, float]
    incomplete: list[str] = field(default_factory=list)
    allowed: list[str] = field(default_factory=list)
    history_runs: int = 0  # earlier runs of the same device, model and workload that were consulted
    # per regressed (or host-inconclusive) stage, what the machine did during each side's repeats
    conditions: dict[str, SidesConditions] = field(default_factory=dict)
    gaps: list[Gap] = field(default_factory=list)  # the incomplete list, each with its kind (the fix says what to do)
    host_rule: str = host_verdict.DEFAULT_RULE  # how a host-bound stage's verdict weighs the host
    gate: list[str] = field(default_factory=lambda: list(GATED))  # the metrics whose inconclusive verdict fails
    pass_inconclusive: bool = False  # --pass-inconclusive: an unsettled gated metric passes (the gate before issue 33)
    watched: list[str] = field(default_factory=list)  # --watch: "stage:metric" (or "stage") only watched
    accepted_drift: dict[str, str] = field(default_factory=dict)  # stage -> its declared params drift, accepted (--drift)
    gate_file: str | None = None  # the baseline's gate file whose thresholds and watched figures were applied

    @property
    def regressions(self) -> list[tuple[str, str]]:
        return [(s.stage, m) for s in self.stages for m in s.regressions]

    @property
    def improvements(self) -> list[tuple[str, str]]:
        return [(s.stage, m) for s in self.stages for m in s.improvements]

    @property
    def host_inconclusive(self) -> list[tuple[str, str]]:
        return [(s.stage, m) for s in self.stages for m in s.host_inconclusive]

    @property
    def inconclusive(self) -> list[tuple[str, str]]:
        """Gated metrics the pair could not settle: the comparison does not pass (unless
        pass_inconclusive), and never says "No regression."."""
        return [(s.stage, m) for s in self.stages for m in s.inconclusive]

    @property
    def watched_unsettled(self) -> list[tuple[str, str]]:
        """Gated metrics only watched (--watch, the baseline's gate file) that the pair left
        inconclusive: they do not fail, and no one should read the pass as their evidence."""
        return [(s.stage, d.metric) for s in self.stages for d in s.metrics
                if d.verdict == "inconclusive" and not d.gated and d.metric in self.gate]

    def to_dict(self) -> dict:
        d = asdict(self)
        for s, sd in zip(self.stages, d["stages"]):
            sd["regressions"], sd["improvements"], sd["host_inconclusive"] = s.regressions, s.improvements, s.host_inconclusive
            sd["inconclusive"] = s.inconclusive
            for m, md in zip(s.metrics, sd["metrics"]):
                md["change"] = m.change
            if s.host is not None:  # the JSON keeps each host finding's sentence beside its fields
                sd["host"]["text"] = s.host.text()
            for moved, md in zip(s.host_moved, sd["host_moved"]):
                md["text"] = moved.text()
        d["regressions"] = [list(r) for r in self.regressions]
        d["improvements"] = [list(r) for r in self.improvements]
        d["host_inconclusive"] = [list(r) for r in self.host_inconclusive]
        d["inconclusive"] = [list(r) for r in self.inconclusive]
        return d


def quiet_pairs(pairs: list[tuple[StageResult | None, StageResult | None]]) -> tuple[list, list[dict[str, list[int]]]]:
    """Each ok pair with the repeats the host disturbed set aside on either side
    (host_signals.kept_repeats), and which they were."""
    out: list = []
    aside: list[dict[str, list[int]]] = []
    for b, n in pairs:
        if b is None or n is None or b.status != "ok" or n.status != "ok":
            out.append((b, n))
            aside.append({})
            continue
        (b, b_out), (n, n_out) = host_signals.kept_repeats(b), host_signals.kept_repeats(n)
        out.append((b, n))
        aside.append({side: idx for side, idx in (("baseline", b_out), ("new", n_out)) if idx})
    return out, aside


def run_summary(run: RunResult) -> RunSummary:
    return RunSummary(run.run_id, run.created_at, run.env.llmopt_commit, device_name(run),
                      run.model.source if run.model else None, run.label)


def compare_runs(base: RunResult, new: RunResult, thresholds: dict[str, float] | None = None, force: bool = False,
                 resamples: int = 2000, confidence: float = 0.95, seed: int = 0, history: Sequence[RunResult] = (),
                 allowed: Collection[str] = frozenset(), host_rule: str = host_verdict.DEFAULT_RULE,
                 gate: Collection[str] = GATED, pass_inconclusive: bool = False,
                 drift: Mapping[str, Drift] | None = None, watch: Collection[tuple[str, str]] = ()) -> Comparison:
    """`history`: earlier runs of the same device, model and workload (history.fingerprint_runs),
    the new run not among them; `allowed`: stages (or "run", "all") whose absence is accepted;
    `host_rule`: how a host-bound stage's verdict weighs the host (host_verdict.RULES); `gate`:
    the metrics an inconclusive verdict fails (judge.GATED), less the (stage, metric) pairs in
    `watch`; `drift`: the baseline's declared params drift by stage (baseline_drift.declared_for),
    accepted as no gap."""
    if not (0.5 <= confidence < 1):
        raise UsageError(f"confidence {confidence}: out of range", "use a level between 0.5 and 0.999, e.g. 0.95")
    if resamples < 100:
        raise UsageError(f"{resamples} resamples: too few for an interval", "use at least 100 (default 2000)")
    if host_rule not in host_verdict.RULES:
        raise UsageError(f"host rule {host_rule!r}: unknown", f"use one of {', '.join(host_verdict.RULES)}")
    accepted = check_comparable(base, new, force)
    history = [r for r in history if (r.run_id, r.created_at) != (new.run_id, new.created_at)]
    names = [s.name for s in base.stages] + [s.name for s in new.stages if base.stage(s.name) is None]
    pairs, set_aside = quiet_pairs([(base.stage(n), new.stage(n)) for n in names])
    bounds = [host_verdict.boundness(b, n, base, new) if b is not None and n is not None else None for b, n in pairs]
    stages = [compare_stage(b, n, thresholds, resamples, confidence, seed, history, gate, bound.host_bound if bound else False,
                            watch) for (b, n), bound in zip(pairs, bounds)]
    for s, aside in zip(stages, set_aside):
        s.set_aside = aside if s.state == "compared" else {}
    both = [(s, b, n, bound) for s, (b, n), bound in zip(stages, pairs, bounds) if b is not None and n is not None]
    for s, b, n, bound in both:
        if s.state == "compared" and bound is not None:
            s.host_bound, s.host_bound_why = bound.host_bound, bound.why
            weighed = host_verdict.weigh_host(s.metrics, b, n, bound, host_rule, resamples, confidence, seed)
            s.host, s.host_moved = weighed.change, weighed.moved
    effective = {k: threshold_for(k, thresholds) for k in METRICS}
    conditions = {s.stage: SidesConditions(conditions_summary(b.extra.get("conditions")), conditions_summary(n.extra.get("conditions")))
                  for s, b, n, _ in both if s.regressions or s.host_inconclusive or s.host_moved}
    declared = {name: d.params for name, d in (drift or {}).items()}
    found = gaps(base, new, allowed, declared)
    accepted_drift = {s.stage: f"{s.note}: declared drift ({drift[s.stage].reason})" for s in stages
                      if s.state == "not comparable" and drift and s.stage in drift and not any(g.stage == s.stage for g in found)}
    return Comparison(run_summary(base), run_summary(new), stages, accepted, resamples, confidence, seed, effective,
                      [g.text for g in found], sorted(allowed), len(history), conditions, found, host_rule,
                      gate=[k for k in METRICS if k in gate], pass_inconclusive=pass_inconclusive,
                      watched=sorted(f"{st}:{m}" if m != "*" else st for st, m in watch), accepted_drift=accepted_drift)
