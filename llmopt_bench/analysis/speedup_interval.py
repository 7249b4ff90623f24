"""Speedups against the baseline with their uncertainty (issue 25): the ratio of two stages'
figures (analysis/figures.py) with the interval of the regression gate (analysis/gate/noise.py: each
stage's repeats, a t quantile on Welch's degrees of freedom), so that "4.81x" reads with the spread two runs of
the same stacks would show. Where the baseline is host-bound the ratio also depends on this
host's CPU: `host_caveat` says so, with the host-speed index the baseline's repeats recorded.

Latency speedups are baseline / stage, throughput stage / baseline (as the report's table)."""

from __future__ import annotations

from dataclasses import dataclass

from llmopt_bench.analysis.hostbound import host_bound, index_mean
from llmopt_bench.core.results import RunResult, StageResult

KEYS = {"tpot": "tpot_p50", "e2e": "e2e_p50", "output_tok_s": "output_tok_s"}
RESAMPLES = 1000  # a report figure, not a gate: half the gate's resamples keep the report quick


@dataclass(frozen=True)
class Speedup:
    value: float
    lo: float
    hi: float
    between_repeats: bool  # False: one repeat on a side, the interval holds its requests' scatter only

    def text(self) -> str:
        return f"{self.value:.2f}x [{self.lo:.2f}-{self.hi:.2f}x]"


def speedup_interval(stage: StageResult, ref: StageResult, what: str = "tpot", confidence: float = 0.95) -> Speedup | None:
    """How many times better `stage` is than `ref` on `what` (tpot, e2e, output_tok_s), with its
    interval: the ratio of the two figures (analysis/figures.py, the repeats the host disturbed
    set aside), judged as compare judges it."""
    from llmopt_bench.analysis.figures import quiet, repeat_groups
    from llmopt_bench.analysis.gate.judge import METRICS, judge

    key = KEYS[what]
    (ref, _), (stage, _) = quiet(ref), quiet(stage)
    (r_groups, statistic), (s_groups, _) = repeat_groups(ref, key), repeat_groups(stage, key)
    d = judge(key, None, None, r_groups, s_groups, statistic, 0.05, resamples=RESAMPLES, confidence=confidence)
    if d.ratio is None or d.ci is None or d.ratio <= 0:
        return None
    repeats = len(r_groups) > 1 and len(s_groups) > 1
    if METRICS[key].higher_is_better:
        return Speedup(d.ratio, d.ci[0], d.ci[1], repeats)
    return Speedup(1 / d.ratio, 1 / d.ci[1], 1 / d.ci[0], repeats)


def host_caveat(base: StageResult, run: RunResult) -> str | None:
    """Where the baseline is host-bound: the speedups against it depend on this host's CPU."""
    bound = host_bound(base, run)
    if not bound.host_bound:
        return None
    kops = index_mean(base)
    index = (f"host-speed index {kops:.3g} kop/s, the mean of its repeats" if kops
             else "the host-speed index was not recorded in this run")
    return (f"The baseline {base.name} is host-bound ({bound.why}): every speedup against it depends on this host's CPU "
            f"as much as on the stacks compared ({index}).")


def speedups_sentence(run: RunResult, base: StageResult, others: list[StageResult]) -> str | None:
    """Each stage's TPOT speedup against the baseline with its interval, in one sentence."""
    parts = [(s.name, iv) for s in others if (iv := speedup_interval(s, base, "tpot"))]
    if not parts:
        return None
    one = any(not iv.between_repeats for _, iv in parts)
    return (f"TPOT speedups against {base.name} with their 95% intervals over the repeats: "
            + ", ".join(f"{name} {iv.text()}" for name, iv in parts) + "."
            + (" (A stage measured once has only its requests' scatter in its interval.)" if one else ""))


def claim_interval(stage: StageResult | None, ref: StageResult | None, what: str, target: float,
                   held_fraction: float) -> tuple[str, str]:
    """(the measured speedup's interval, a note for the claim's detail) for a claim "N x better
    than the baseline": whether the interval straddles the line the claim is held at, and
    whether the baseline's host bounds it."""
    iv = speedup_interval(stage, ref, what) if stage is not None and ref is not None else None
    if iv is None:
        return "", ""
    line = target * held_fraction
    note = f"95% interval over the repeats {iv.lo:.2f}-{iv.hi:.2f}x"
    if iv.lo < line <= iv.value:
        note += f": it reaches below the {line:.3g}x the claim is held at, another run may not hold it"
    elif iv.value < line <= iv.hi:
        note += f": it reaches the {line:.3g}x the claim is held at, another run may hold it"
    return f" [{iv.lo:.2f}-{iv.hi:.2f}x]", note
