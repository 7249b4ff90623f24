"""The host's part in a comparison (issue 25): how much faster or slower the new run's host was,
by the host-speed index its repeats recorded (measure/hostspeed.py), and what that does to the
verdict of a host-bound stage (analysis/hostbound.py).

**Did the host change?** Each side's index, one value per repeat, is compared like a throughput:
the ratio new/baseline of their means with the interval of analysis/gate/noise.py (repeats drawn, a
t quantile on Welch's degrees of freedom). The host is *slower* (or *faster*) only when the
whole interval lies beyond HOST_THRESHOLD: less is the index's own noise.

**What the host explains.** A host-bound stage's figures are also judged *normalised* by the
index, each repeat's latencies times its index over the baseline's mean index (throughput
divided by it): the run as if it had run on the baseline's host. Then:

- `attribute` rule (the default): the verdict is the raw one, except where the host changed
  beyond its noise: on a slower host, a host-bound stage that got worse (regressed, or
  inconclusive in the bad direction) is `inconclusive (host)`: how much of it the host made,
  the index cannot say exactly (on the shared 2-core CPU, TPOT moved about as the index to the
  power -1.8, not -1: docs/regression.md); on a faster host, a regression the normalised figures show
  and the raw ones hide is `inconclusive (host)` too;
- `normalise` rule: the verdict is the normalised one; a raw regression that normalising takes
  away is `inconclusive (host)`.

Either way a run on a slower host never passes silently: `inconclusive (host)` exits with its
own code (errors.ExitCode.HOST_INCONCLUSIVE, 8), neither 0 nor the regression's 5. Which rule
is the default was decided by the calibration (scripts/gate/calibrate-gate.py, docs/regression.md).

**What else the repeats saw** (analysis/gate/host_signals.py, issue 33): the index need not move when
a neighbour takes a core (219.7 -> 232.1 kop/s beside two busy loops on the 2-core CPU host,
while the stage's CPU share fell from 1.99 to 1.00). So every stage's recorded CPU share,
preemptions, steal and load are weighed too, host-bound or not: where one of them moved, a
verdict in the direction the host pushed it is `inconclusive (host)`: on a busier new host a
regression or an inconclusive change; on a busier baseline host an improvement, "unchanged"
(a regression may hide under the better host) or an inconclusive change."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from llmopt_bench.analysis import hostbound
from llmopt_bench.analysis.gate import host_signals, noise
from llmopt_bench.analysis.gate.judge import SAMPLE_COLUMNS, MetricDelta, judge
from llmopt_bench.core.results import RunResult, StageResult

HOST_THRESHOLD = 0.05  # a host-speed change smaller than this is the index's own noise
HOST_INCONCLUSIVE = "inconclusive (host)"
RULES = ("attribute", "normalise")
# the calibration (docs/regression.md, "The host"): on the CPU host neither rule reached 90% of
# 1.2x slowdowns at <= 5% false alarms; attribute halved the false alarms (16% to 8.5% for TPOT)
DEFAULT_RULE = "attribute"


@dataclass
class HostChange:
    baseline_kops: float | None
    new_kops: float | None
    baseline_repeats: int = 0
    new_repeats: int = 0
    ratio: float | None = None  # new / baseline speed: 0.5 = the new host is half as fast
    ci: tuple[float, float] | None = None
    state: str = "not recorded"  # slower | faster | same | not recorded

    @property
    def differs(self) -> bool:
        return self.state in ("slower", "faster")

    def text(self) -> str:
        if self.state == "not recorded" or self.ratio is None:  # a state other than that comes with its ratio
            side = "either run" if not (self.baseline_kops or self.new_kops) else "the baseline" if not self.baseline_kops else "the new run"
            return f"host speed not recorded in {side}"
        how = (f"host {1 / self.ratio:.2f}x slower" if self.state == "slower" else f"host {self.ratio:.2f}x faster"
               if self.state == "faster" else "host speed unchanged")
        ci = f", interval {self.ci[0]:.2f}-{self.ci[1]:.2f}x" if self.ci else ""
        return f"{how} (index {self.baseline_kops:.3g} -> {self.new_kops:.3g} kop/s{ci})"


def _mean(values: Sequence[float | None]) -> tuple[float | None, list[list[float]]]:
    known = [float(v) for v in values if v and math.isfinite(v) and v > 0]
    return (sum(known) / len(known) if known else None), [[v] for v in known]


def host_change(base_index: Sequence[float | None], new_index: Sequence[float | None], confidence: float = 0.95,
                resamples: int = 2000, seed: int = 0) -> HostChange:
    """The new host's speed against the baseline's, from each side's per-repeat index."""
    import numpy as np

    (b, b_groups), (n, n_groups) = _mean(base_index), _mean(new_index)
    out = HostChange(b, n, len(b_groups), len(n_groups))
    if not (b and n):
        return out
    out.ratio = n / b
    rng = np.random.default_rng(seed)
    b_noise, n_noise = (noise.side_noise(g, "mean", resamples, rng) for g in (b_groups, n_groups))
    b_noise, n_noise = noise.fill_in(b_noise, n_noise, len(b_groups)), noise.fill_in(n_noise, b_noise, len(n_groups))
    if b_noise and n_noise:
        iv = noise.combine(out.ratio, b_noise, n_noise, confidence)
        out.ci = (iv.lo, iv.hi)
    lo, hi = out.ci or (out.ratio, out.ratio)  # the whole interval beyond the threshold, as compare decides
    out.state = "slower" if hi < 1 - HOST_THRESHOLD else "faster" if lo > 1 + HOST_THRESHOLD else "same"
    return out


def normalised(values: Sequence[float | None], repeats: Sequence[int], index: Sequence[float | None], reference: float,
               higher_is_better: bool) -> list[float | None] | None:
    """Each value as if measured on a host of speed `reference`: a latency times its repeat's
    index / reference, a throughput divided by it; None where a repeat's index is missing."""
    out: list[float | None] = []
    for v, r in zip(values, repeats):
        speed = index[r] if 0 <= r < len(index) else None
        if not speed or speed <= 0:
            return None
        factor = speed / reference
        out.append(None if v is None else (v / factor if higher_is_better else v * factor))
    return out


def final_verdict(raw: str, normal: str | None, host: HostChange, rule: str, worse: bool = False) -> str:
    """The verdict of a host-bound stage's metric from its raw and normalised verdicts; `worse`:
    the raw change lies beyond the threshold in the bad direction (regressed or inconclusive)."""
    if normal is None:
        return raw
    if rule == "normalise":
        return HOST_INCONCLUSIVE if raw == "regressed" and normal != "regressed" else normal
    if host.state == "slower" and (raw == "regressed" or (raw == "inconclusive" and worse)):
        return HOST_INCONCLUSIVE
    if host.state == "faster" and normal == "regressed" and raw != "regressed":
        return HOST_INCONCLUSIVE
    return raw


def worse(ratio: float | None, threshold: float, higher_is_better: bool) -> bool:
    if ratio is None:
        return False
    return ratio < 1 - threshold if higher_is_better else ratio > 1 + threshold


def normalised_inputs(stage: StageResult, key: str, index: list, reference: float) -> tuple[float | None, list[list[float]]]:
    """(value, groups) of a metric as if every repeat had run on a host of speed `reference`."""
    import numpy as np

    if key in SAMPLE_COLUMNS and stage.samples:
        values = normalised(getattr(stage.samples, SAMPLE_COLUMNS[key]), stage.samples.repeat, index, reference, False) or []
        known = [v for v in values if v is not None and math.isfinite(v)]
        return (float(np.median(known)) if known else None), (noise.repeat_groups(values, stage.samples.repeat) if known else [])
    reps = stage.metrics.output_tok_s_repeats if key == "output_tok_s" and stage.metrics else []
    scaled = normalised(reps, list(range(len(reps))), index, reference, True) if len(reps) == len(index) else None
    known = [v for v in scaled or [] if v is not None and math.isfinite(v)]
    return (float(np.mean(known)) if known else None), [[v] for v in known]


def signal_verdict(verdict: str, busier: set[str]) -> str:
    """A timing metric's verdict where the host's signals moved (`busier`: which run's host was
    the busier, "new" and/or "baseline"): the verdicts the host could have made are the host's."""
    if "new" in busier and verdict in ("regressed", "inconclusive"):
        return HOST_INCONCLUSIVE
    if "baseline" in busier and verdict in ("improved", "unchanged", "inconclusive"):
        return HOST_INCONCLUSIVE
    return verdict


def boundness(base: StageResult, new: StageResult, base_run: RunResult, new_run: RunResult) -> hostbound.Bound:
    """Whether a stage is host-bound, by the new run (else the baseline, where the new cannot say)."""
    bound = hostbound.host_bound(new, new_run)
    return hostbound.host_bound(base, base_run) if bound.host_bound is None else bound


@dataclass(frozen=True)
class HostWeighing:
    """What the host did beside a compared stage: its speed's change (None: neither run recorded
    the index) and the repeats' other signals that moved."""

    change: HostChange | None
    moved: list[host_signals.Moved]


def weigh_host(metrics: list[MetricDelta], base: StageResult, new: StageResult, bound: hostbound.Bound,
               rule: str, resamples: int, confidence: float, seed: int) -> HostWeighing:
    """The host's change beside a compared stage's judged metrics: where the stage is host-bound
    and both runs recorded the index, every metric judged again as if on the baseline's host
    (host_verdict.final_verdict decides); then, for every stage, the repeats' other signals
    (host_signals.moved): a verdict the moved host explains is inconclusive (host). The metrics'
    verdicts are changed in place; the host's part is returned for the stage's delta."""
    change = _weigh_index(metrics, bool(bound.host_bound), base, new, rule, resamples, confidence, seed)
    moved = host_signals.moved((base.extra or {}).get("conditions"), (new.extra or {}).get("conditions"))
    busier = {m.busier for m in moved if m.weighs}
    for d in metrics if busier else []:
        # a watched metric's inconclusive verdict does not fail, nor does the host's version of it
        weighed = d.judged and (d.gated or d.verdict != "inconclusive")
        if weighed and d.metric != "peak_memory" and (verdict := signal_verdict(d.verdict, busier)) != d.verdict:
            d.raw_verdict = d.raw_verdict or d.verdict
            d.verdict = verdict
    return HostWeighing(change, list(moved))


def _weigh_index(metrics: list[MetricDelta], host_bound: bool, base: StageResult, new: StageResult, rule: str,
                 resamples: int, confidence: float, seed: int) -> HostChange | None:
    b_index, n_index = hostbound.index_per_repeat(base), hostbound.index_per_repeat(new)
    if not any(b_index) and not any(n_index):
        return None
    change = host_change(b_index, n_index, confidence, resamples, seed)
    if not host_bound or change.baseline_kops is None or change.new_kops is None:
        return change
    for d in metrics:
        if d.metric not in SAMPLE_COLUMNS and d.metric != "output_tok_s":
            continue  # load and memory: one figure a run, no repeat's host speed to weigh it by
        (b_val, b_groups), (n_val, n_groups) = (normalised_inputs(s, d.metric, idx, change.baseline_kops)
                                                for s, idx in ((base, b_index), (new, n_index)))
        if not b_groups or not n_groups:
            continue
        statistic = "mean" if d.metric == "output_tok_s" else "median"
        normal = judge(d.metric, b_val, n_val, b_groups, n_groups, statistic, d.threshold, resamples, confidence, seed)
        d.raw_verdict, d.normalised_ratio, d.normalised_ci, d.normalised_verdict = d.verdict, normal.ratio, normal.ci, normal.verdict
        d.verdict = final_verdict(d.verdict, normal.verdict, change, rule, worse(d.ratio, d.threshold, d.higher_is_better))
    return change
