"""Compare two runs stage by stage: the ratio new/baseline of each metric with a bootstrap
confidence interval, and a verdict that is a regression only when the whole interval lies
beyond the allowed change in the bad direction (docs/regression.md).

Pure functions over RunResult/StageResult; numpy is imported inside the bootstrap."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

from llmopt_bench.errors import UsageError
from llmopt_bench.results import FAILED, RunResult, StageResult, peak_memory


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    unit: str  # how values are shown: ms, s, tok/s, GB
    higher_is_better: bool = False


METRICS: dict[str, Metric] = {m.key: m for m in (
    Metric("ttft_p50", "TTFT p50", "ms"),
    Metric("tpot_p50", "TPOT p50", "ms"),
    Metric("e2e_p50", "E2E p50", "s"),
    Metric("output_tok_s", "output tok/s", "tok/s", higher_is_better=True),
    Metric("load_s", "load", "s"),
    Metric("peak_memory", "peak memory", "GB"),
)}
ALIASES = {"ttft": "ttft_p50", "tpot": "tpot_p50", "e2e": "e2e_p50", "tok_s": "output_tok_s",
           "throughput": "output_tok_s", "tok/s": "output_tok_s", "load": "load_s", "memory": "peak_memory",
           "mem": "peak_memory", "peak_mem": "peak_memory"}
DEFAULT_MAX_REGRESSION = 0.05
# load_s is one measurement per run (no interval), and a cold page cache alone moves it by more
# than 5%: it gets a wider default allowance. Name it to change it: --max-regression load=10%.
DEFAULT_THRESHOLDS = {"load_s": 0.20}
SAMPLE_COLUMNS = {"ttft_p50": "ttft_s", "tpot_p50": "tpot_s", "e2e_p50": "e2e_s"}
MIN_SAMPLES = 2


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
    if base.schema_version != new.schema_version:
        out.append(f"schema version {base.schema_version} vs {new.schema_version}")
    if device_name(base) != device_name(new):
        out.append(f"device {device_name(base)!r} vs {device_name(new)!r}")
    b_model, n_model = (base.model.source if base.model else None), (new.model.source if new.model else None)
    if b_model != n_model:
        out.append(f"model {b_model!r} vs {n_model!r}")
    b_wl, n_wl = base.workload.model_dump(), new.workload.model_dump()
    diff = [f"{k} {b_wl.get(k)!r} vs {n_wl.get(k)!r}" for k in sorted(set(b_wl) | set(n_wl)) if b_wl.get(k) != n_wl.get(k)]
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


def _column(stage: StageResult, name: str) -> list[float]:
    return [float(v) for v in getattr(stage.samples, name)] if stage.samples else []


# ---- the bootstrap ------------------------------------------------------------------------------

Statistic = Callable[..., object]  # (columns resampled: arrays of shape (R, n)) -> array (R,)


def bootstrap_ratio(base: Sequence[Sequence[float]], new: Sequence[Sequence[float]], statistic: Statistic,
                    resamples: int = 2000, confidence: float = 0.95, seed: int = 0,
                    paired: bool = False) -> tuple[float, float, float]:
    """Ratio statistic(new)/statistic(baseline) and its percentile interval. Each side's rows
    (one per request or repeat; several columns resampled together) are drawn with replacement
    `resamples` times from a seeded generator: independently for each side, or, when `paired`
    (row i is the same request in both runs), with the same draw for both sides."""
    import numpy as np

    rng = np.random.default_rng(seed)
    b_cols, n_cols = [np.asarray(c, dtype=float) for c in base], [np.asarray(c, dtype=float) for c in new]
    point = float(statistic(*(c[None, :] for c in n_cols))[0] / statistic(*(c[None, :] for c in b_cols))[0])
    if paired and len(b_cols[0]) != len(n_cols[0]):
        raise ValueError("paired bootstrap needs as many rows on both sides")
    bi = rng.integers(0, len(b_cols[0]), size=(resamples, len(b_cols[0])))
    ni = bi if paired else rng.integers(0, len(n_cols[0]), size=(resamples, len(n_cols[0])))
    ratios = np.asarray(statistic(*(c[ni] for c in n_cols))) / np.asarray(statistic(*(c[bi] for c in b_cols)))
    alpha = (1 - confidence) / 2 * 100
    lo, hi = np.percentile(ratios, [alpha, 100 - alpha])
    return point, float(lo), float(hi)


def _median(x):
    import numpy as np

    return np.median(x, axis=1)


def _mean(x):
    return x.mean(axis=1)


def _rate(tokens, seconds):
    return tokens.sum(axis=1) / seconds.sum(axis=1)


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
    method: str  # bootstrap-{requests-median,requests-rate,repeats-mean}-{paired,independent} | single value | no data
    verdict: str  # regressed | improved | unchanged | inconclusive | n/a

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


def aligned(base: StageResult, new: StageResult) -> bool:
    """Row i is the same request in both runs: as many samples, the same repeat of each (the
    workload, hence the prompts and their order, is checked equal before)."""
    return bool(base.samples and new.samples and base.samples.repeat == new.samples.repeat
                and len(base.samples.e2e_s) == len(new.samples.e2e_s))


def _pairs(base: list, new: list, paired: bool) -> tuple[list[float], list[float]]:
    ok = lambda v: v is not None and math.isfinite(v)  # noqa: E731
    if paired:
        kept = [(b, n) for b, n in zip(base, new) if ok(b) and ok(n)]
        return [b for b, _ in kept], [n for _, n in kept]
    return [v for v in base if ok(v)], [v for v in new if ok(v)]


def compare_metric(key: str, base: StageResult, new: StageResult, threshold: float,
                   resamples: int = 2000, confidence: float = 0.95, seed: int = 0, paired: bool = True) -> MetricDelta:
    """paired=False forbids pairing requests (runs of different workloads, compared with --force)."""
    m = METRICS[key]
    b_val, n_val = metric_value(base, key), metric_value(new, key)
    ratio, ci, method = None, None, "no data"
    pair = paired and aligned(base, new)
    how = "paired" if pair else "independent"
    if key in SAMPLE_COLUMNS:
        b, n = _pairs(_column(base, SAMPLE_COLUMNS[key]), _column(new, SAMPLE_COLUMNS[key]), pair)
        if len(b) >= MIN_SAMPLES and len(n) >= MIN_SAMPLES:
            ratio, lo, hi = bootstrap_ratio([b], [n], _median, resamples, confidence, seed, pair)
            ci, method = (lo, hi), f"bootstrap-requests-median-{how}"
    elif key == "output_tok_s":
        b_rep = base.metrics.output_tok_s_repeats if base.metrics else []
        n_rep = new.metrics.output_tok_s_repeats if new.metrics else []
        if len(b_rep) >= MIN_SAMPLES and len(n_rep) >= MIN_SAMPLES:
            pair_rep = paired and len(b_rep) == len(n_rep)
            ratio, lo, hi = bootstrap_ratio([b_rep], [n_rep], _mean, resamples, confidence, seed, pair_rep)
            ci, method = (lo, hi), f"bootstrap-repeats-mean-{'paired' if pair_rep else 'independent'}"
        else:
            bt, be, nt, ne = (_column(base, "output_tokens"), _column(base, "e2e_s"),
                              _column(new, "output_tokens"), _column(new, "e2e_s"))
            if min(len(bt), len(be), len(nt), len(ne)) >= MIN_SAMPLES and len(bt) == len(be) and len(nt) == len(ne):
                ratio, lo, hi = bootstrap_ratio([bt, be], [nt, ne], _rate, resamples, confidence, seed, pair)
                ci, method = (lo, hi), f"bootstrap-requests-rate-{how}"
                b_val, n_val = sum(bt) / sum(be), sum(nt) / sum(ne)
    if ratio is None and b_val and n_val is not None:
        ratio, method = n_val / b_val, "single value"
    return MetricDelta(key, m.label, m.unit, m.higher_is_better, b_val, n_val, ratio, ci, threshold, method,
                       verdict(ratio, ci, threshold, m.higher_is_better))


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
        if self.state == "failed in new":
            return ["status"]
        return [d.metric for d in self.metrics if d.verdict == "regressed"]

    @property
    def improvements(self) -> list[str]:
        return [d.metric for d in self.metrics if d.verdict == "improved"]


def compare_stage(base: StageResult | None, new: StageResult | None, thresholds: dict[str, float] | None = None,
                  resamples: int = 2000, confidence: float = 0.95, seed: int = 0, paired: bool = True) -> StageDelta:
    if base is None or new is None:
        only = new if base is None else base
        return StageDelta(only.name, "only in new" if base is None else "only in baseline",
                          None if base is None else base.status, None if new is None else new.status)
    out = StageDelta(base.name, "compared", base.status, new.status)
    if base.status != "ok" or new.status != "ok":
        failed_now = base.status == "ok" and new.status in FAILED
        out.state = "failed in new" if failed_now else "not ok"
        side = new if new.status != "ok" else base
        out.note = f"{'new' if side is new else 'baseline'}: {side.status}" + (f" ({side.reason})" if side.reason else "")
        return out
    out.metrics = [compare_metric(k, base, new, threshold_for(k, thresholds), resamples, confidence, seed, paired)
                   for k in METRICS]
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
                 resamples: int = 2000, confidence: float = 0.95, seed: int = 0) -> Comparison:
    if not (0.5 <= confidence < 1):
        raise UsageError(f"confidence {confidence}: out of range", "use a level between 0.5 and 0.999, e.g. 0.95")
    if resamples < 100:
        raise UsageError(f"{resamples} resamples: too few for an interval", "use at least 100 (default 2000)")
    accepted = check_comparable(base, new, force)
    names = [s.name for s in base.stages] + [s.name for s in new.stages if base.stage(s.name) is None]
    paired = not any(m.startswith("workload") for m in accepted)  # same prompts in the same order
    stages = [compare_stage(base.stage(n), new.stage(n), thresholds, resamples, confidence, seed, paired) for n in names]
    effective = {k: threshold_for(k, thresholds) for k in METRICS}
    return Comparison(run_summary(base), run_summary(new), stages, accepted, resamples, confidence, seed, effective)
