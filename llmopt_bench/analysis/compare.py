"""Compare two runs stage by stage: the ratio new/baseline of each metric with an interval that
carries run-to-run noise (analysis/noise.py: a cluster bootstrap over repeats, or the spread of
earlier runs of the same fingerprint), a verdict that is a regression only when the whole
interval lies beyond the allowed change in the bad direction, the smallest change the pair could
detect, and whether the new run is a complete comparison (docs/regression.md).

Pure functions over RunResult/StageResult; numpy is imported inside the bootstrap."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field

from llmopt_bench.analysis import noise
from llmopt_bench.core.errors import UsageError
from llmopt_bench.core.results import RunResult, StageResult, peak_memory
from llmopt_bench.measure.conditions import conditions_summary


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    unit: str  # how values are shown: ms, s, tok/s, GB
    higher_is_better: bool = False
    # a value that moves between runs of the same code (load: 4.2-11.7 s over 12 CPU runs, 79 vs
    # 110 s in two H200 sessions; a latency by whole-run shifts) is judged only with an interval
    # that holds that noise; peak memory, the same from run to run, is judged on its value alone
    needs_noise: bool = True


METRICS: dict[str, Metric] = {m.key: m for m in (
    Metric("ttft_p50", "TTFT p50", "ms"),
    Metric("tpot_p50", "TPOT p50", "ms"),
    Metric("e2e_p50", "E2E p50", "s"),
    Metric("output_tok_s", "output tok/s", "tok/s", higher_is_better=True),
    Metric("load_s", "load", "s"),
    Metric("peak_memory", "peak memory", "GB", needs_noise=False),
)}
ALIASES = {"ttft": "ttft_p50", "tpot": "tpot_p50", "e2e": "e2e_p50", "tok_s": "output_tok_s",
           "throughput": "output_tok_s", "tok/s": "output_tok_s", "load": "load_s", "memory": "peak_memory",
           "mem": "peak_memory", "peak_mem": "peak_memory"}
DEFAULT_MAX_REGRESSION = 0.05
# load_s is one measurement per run (no interval), and a cold page cache alone moves it by more
# than 5%: it gets a wider default allowance. Name it to change it: --max-regression load=10%.
DEFAULT_THRESHOLDS = {"load_s": 0.20}
SAMPLE_COLUMNS = {"ttft_p50": "ttft_s", "tpot_p50": "tpot_s", "e2e_p50": "e2e_s"}
# workload fields that change how much is measured, not what: a run with more repeats is the
# same measurement with a narrower interval (how a nightly outgrows its baseline's noise)
# (and workload.notes: why the values were chosen, the values themselves compared above; the CPU
# note names only the defaults it chose, so `--repeats 10` would otherwise change it)
SAME_MEASUREMENT = ("repeats", "notes")


def metric_key(name: str) -> str:
    key = name.strip().lower().replace("-", "_")
    key = ALIASES.get(key, key)
    if key not in METRICS:
        raise UsageError(f"unknown metric {name!r}", f"use one of {', '.join(METRICS)} (or ttft, tpot, e2e, tok_s, load, memory)")
    return key


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


def threshold_for(key: str, thresholds: dict[str, float] | None) -> float:
    """A metric named explicitly, else its own default (load_s), else the bare value, else 5%."""
    t = thresholds or {}
    if key in t:
        return t[key]
    return DEFAULT_THRESHOLDS.get(key, t.get("*", DEFAULT_MAX_REGRESSION))


def device_name(run: RunResult) -> str | None:
    return run.env.get("gpu") or run.env.get("cpu")


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

def peak_memory_bytes(stage: StageResult) -> float | None:
    return peak_memory(stage)[0]  # the report's value and source order


def metric_value(stage: StageResult, key: str) -> float | None:
    """The run's own point value of a metric (what the summary table shows)."""
    m = stage.metrics
    if key in SAMPLE_COLUMNS:
        d = getattr(m, SAMPLE_COLUMNS[key]) if m else None
        return d.p50 if d else None
    if key == "output_tok_s":
        return m.output_tok_s if m else None
    if key == "load_s":
        return stage.load_s
    if key == "peak_memory":
        return peak_memory_bytes(stage)
    raise KeyError(key)


def noise_groups(stage: StageResult, key: str) -> tuple[list[list[float]], str]:
    """What the bootstrap draws from: per-request values grouped by repeat for the latencies
    (statistic: the median of the drawn requests), each repeat's windowed tok/s for throughput
    (statistic: their mean), nothing for load and memory (one value per run)."""
    if key in SAMPLE_COLUMNS:
        s = stage.samples
        return (noise.repeat_groups(getattr(s, SAMPLE_COLUMNS[key]), s.repeat) if s else []), "median"
    if key == "output_tok_s":
        reps = stage.metrics.output_tok_s_repeats if stage.metrics else []
        return [[v] for v in reps if v and math.isfinite(v)], "mean"
    return [], "mean"


def fingerprint_values(history: Iterable[RunResult], stage: StageResult, key: str) -> list[float]:
    """The metric in earlier runs whose stage has the same name, params and status ok (the runs
    were chosen with the same device, model and workload)."""
    out = []
    for run in history:
        s = run.stage(stage.name)
        if s is not None and s.status == "ok" and s.params == stage.params:
            value = metric_value(s, key)
            if value is not None:
                out.append(value)
    return out


# ---- verdicts -----------------------------------------------------------------------------------

@dataclass
class MetricDelta:
    metric: str
    label: str
    unit: str
    higher_is_better: bool
    baseline: float | None
    new: float | None
    ratio: float | None
    ci: tuple[float, float] | None
    threshold: float
    method: str  # bootstrap-repeats | bootstrap-requests | history | single value | no data
    verdict: str  # regressed | improved | unchanged | inconclusive | n/a
    mde: float | None = None  # the smallest change in the bad direction caught 80% of the time
    noise: str = ""  # where each side's noise came from

    @property
    def change(self) -> float | None:
        return None if self.ratio is None else self.ratio - 1


def verdict(ratio: float | None, ci: tuple[float, float] | None, threshold: float, higher_is_better: bool) -> str:
    """Regressed/improved only when the whole interval (or the single value) lies beyond the threshold."""
    if ratio is None or not math.isfinite(ratio):
        return "n/a"
    lo, hi = ci if ci else (ratio, ratio)
    above, below = lo > 1 + threshold, hi < 1 - threshold  # the whole interval beyond the threshold
    if above or below:
        return "regressed" if above != higher_is_better else "improved"
    return "inconclusive" if abs(ratio - 1) > threshold else "unchanged"


def _method(b: noise.SideNoise, n: noise.SideNoise) -> str:
    if "history" in b.source:
        return "history"
    return "bootstrap-requests" if "request" in b.source + n.source else "bootstrap-repeats"


def compare_metric(key: str, base: StageResult, new: StageResult, threshold: float, resamples: int = 2000,
                   confidence: float = 0.95, seed: int = 0, history: Sequence[float] = ()) -> MetricDelta:
    """`history`: the metric in earlier runs of the baseline's fingerprint (fingerprint_values)."""
    (b_groups, statistic), (n_groups, _) = noise_groups(base, key), noise_groups(new, key)
    return judge(key, metric_value(base, key), metric_value(new, key), b_groups, n_groups, statistic, threshold,
                 resamples, confidence, seed, history)


def judge(key: str, b_val: float | None, n_val: float | None, b_groups: list[list[float]], n_groups: list[list[float]],
          statistic: str, threshold: float, resamples: int = 2000, confidence: float = 0.95, seed: int = 0,
          history: Sequence[float] = ()) -> MetricDelta:
    """The verdict on one metric from each side's value and its per-repeat groups (noise_groups):
    compare_metric's core, and what scripts/calibrate-gate.py measures."""
    import numpy as np

    m = METRICS[key]
    out = MetricDelta(key, m.label, m.unit, m.higher_is_better, b_val, n_val, None, None, threshold, "no data", "n/a")
    if not (b_val and n_val is not None and b_val > 0 and n_val >= 0):
        return out
    out.ratio, out.method = n_val / b_val, "single value"
    rng = np.random.default_rng(seed)
    b_own, n_own = (noise.side_noise(g, statistic, resamples, rng) for g in (b_groups, n_groups))
    b_own, n_own = noise.fill_in(b_own, n_own, len(b_groups)), noise.fill_in(n_own, b_own, len(n_groups))
    past = noise.history_noise(history)
    b_noise, n_noise = noise.with_history(b_own, past, new_side=False), noise.with_history(n_own, past, new_side=True)
    if b_noise and n_noise and out.ratio > 0:
        iv = noise.combine(out.ratio, b_noise, n_noise, confidence)
        out.ci, out.method = (iv.lo, iv.hi), _method(b_noise, n_noise)
        out.mde = noise.min_detectable(iv, threshold, m.higher_is_better)
        out.noise = f"baseline: {b_noise.source}; new: {n_noise.source}"
    out.verdict = verdict(out.ratio, out.ci, threshold, m.higher_is_better)
    # without any between-run information the interval holds the requests' scatter only, and
    # a shift of a whole run passes for a change: report it, do not judge it
    one_repeat_each = out.ci is not None and all("(1 repeat)" in side.source for side in (b_noise, n_noise))
    blind = (out.ci is None and m.needs_noise) or one_repeat_each
    if blind and out.verdict in ("regressed", "improved"):
        out.verdict = "inconclusive"
    if blind:
        out.mde = None
        out.method += " (not judged: one repeat per side)" if out.ci else " (not judged: no repeats or history to show its noise)"
    return out


@dataclass
class StageDelta:
    stage: str
    state: str  # compared | only in baseline | only in new | not ok | failed in new
    baseline_status: str | None = None
    new_status: str | None = None
    note: str | None = None
    metrics: list[MetricDelta] = field(default_factory=list)

    @property
    def regressions(self) -> list[str]:
        return [d.metric for d in self.metrics if d.verdict == "regressed"]

    @property
    def improvements(self) -> list[str]:
        return [d.metric for d in self.metrics if d.verdict == "improved"]


def compare_stage(base: StageResult | None, new: StageResult | None, thresholds: dict[str, float] | None = None,
                  resamples: int = 2000, confidence: float = 0.95, seed: int = 0,
                  history: Sequence[RunResult] = ()) -> StageDelta:
    if base is None or new is None:
        only = new if base is None else base
        return StageDelta(only.name, "only in new" if base is None else "only in baseline",
                          None if base is None else base.status, None if new is None else new.status)
    out = StageDelta(base.name, "compared", base.status, new.status)
    if base.status != "ok" or new.status != "ok":
        out.state = "failed in new" if base.status == "ok" else "not ok"
        side = new if new.status != "ok" else base
        out.note = f"{'new' if side is new else 'baseline'}: {side.status}" + (f" ({side.reason})" if side.reason else "")
        return out
    out.metrics = [compare_metric(k, base, new, threshold_for(k, thresholds), resamples, confidence, seed,
                                  fingerprint_values(history, base, k)) for k in METRICS]
    return out


# ---- completeness -------------------------------------------------------------------------------

ALLOW_ALL, ALLOW_RUN = "all", "run"  # --allow-missing names besides stages


def parse_allowed(specs: Sequence[str] | None) -> set[str]:
    return {p.strip() for spec in specs or [] for p in spec.split(",") if p.strip()}


def incomplete(base: RunResult, new: RunResult, allowed: set[str] = frozenset()) -> list[str]:
    """Why the new run is not a complete comparison with the baseline: a stage the baseline
    measured that the new run lacks or did not finish ok, a stage that crashed (error, oom,
    timeout, interrupted: never accepted silently, even when the baseline crashed too), or a
    run that did not complete. `skipped` on both sides is the same outcome, not a gap."""
    every = ALLOW_ALL in allowed
    out = []
    if new.status != "complete" and not (every or ALLOW_RUN in allowed):
        out.append(f"the new run is {new.status}, not complete")
    names = [s.name for s in base.stages] + [s.name for s in new.stages if base.stage(s.name) is None]
    for name in names:
        b, n = base.stage(name), new.stage(name)
        if every or name in allowed:
            continue
        if n is None:
            if b.status == "ok":
                out.append(f"{name}: missing from the new run (ok in the baseline)")
        elif n.status != "ok" and (n.status != "skipped" or (b is not None and b.status == "ok")):
            why = f" ({n.reason})" if n.reason else ""
            out.append(f"{name}: {n.status} in the new run{why}" + (" (ok in the baseline)" if b and b.status == "ok" else ""))
    return out


@dataclass
class Comparison:
    baseline: dict
    new: dict
    stages: list[StageDelta]
    mismatches: list[str]  # accepted with force
    resamples: int
    confidence: float
    seed: int
    thresholds: dict[str, float]
    incomplete: list[str] = field(default_factory=list)
    allowed: list[str] = field(default_factory=list)
    history_runs: int = 0  # earlier runs of the same device, model and workload that were consulted
    # per regressed stage, what the machine did during each side's repeats (measure/conditions.py)
    conditions: dict[str, dict[str, str | None]] = field(default_factory=dict)

    @property
    def regressions(self) -> list[tuple[str, str]]:
        return [(s.stage, m) for s in self.stages for m in s.regressions]

    @property
    def improvements(self) -> list[tuple[str, str]]:
        return [(s.stage, m) for s in self.stages for m in s.improvements]

    def to_dict(self) -> dict:
        d = asdict(self)
        for s, sd in zip(self.stages, d["stages"]):
            sd["regressions"], sd["improvements"] = s.regressions, s.improvements
            for m, md in zip(s.metrics, sd["metrics"]):
                md["change"] = m.change
        d["regressions"] = [list(r) for r in self.regressions]
        d["improvements"] = [list(r) for r in self.improvements]
        return d


def run_summary(run: RunResult) -> dict:
    return {"run_id": run.run_id, "created_at": run.created_at, "commit": run.env.get("llmopt_commit"),
            "device": device_name(run), "model": run.model.source if run.model else None}


def compare_runs(base: RunResult, new: RunResult, thresholds: dict[str, float] | None = None, force: bool = False,
                 resamples: int = 2000, confidence: float = 0.95, seed: int = 0,
                 history: Sequence[RunResult] = (), allowed: set[str] = frozenset()) -> Comparison:
    """`history`: earlier runs of the same device, model and workload (history.fingerprint_runs),
    the new run not among them; `allowed`: stages (or "run", "all") whose absence is accepted."""
    if not (0.5 <= confidence < 1):
        raise UsageError(f"confidence {confidence}: out of range", "use a level between 0.5 and 0.999, e.g. 0.95")
    if resamples < 100:
        raise UsageError(f"{resamples} resamples: too few for an interval", "use at least 100 (default 2000)")
    accepted = check_comparable(base, new, force)
    history = [r for r in history if (r.run_id, r.created_at) != (new.run_id, new.created_at)]
    names = [s.name for s in base.stages] + [s.name for s in new.stages if base.stage(s.name) is None]
    stages = [compare_stage(base.stage(n), new.stage(n), thresholds, resamples, confidence, seed, history) for n in names]
    effective = {k: threshold_for(k, thresholds) for k in METRICS}
    conditions = {s.stage: {"baseline": conditions_summary(base.stage(s.stage).extra.get("conditions")),
                            "new": conditions_summary(new.stage(s.stage).extra.get("conditions"))}
                  for s in stages if s.regressions}
    return Comparison(run_summary(base), run_summary(new), stages, accepted, resamples, confidence, seed, effective,
                      incomplete(base, new, allowed), sorted(allowed), len(history), conditions)
