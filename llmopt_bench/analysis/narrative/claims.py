"""The journey's own claim ("30 s to 2 s a request"), judged on any run, and the helpers that
stages use to judge theirs (Stage.claims): verdicts, and when an "N x" claim holds."""

from __future__ import annotations

from llmopt_bench.analysis.hostbound import host_bound, index_mean
from llmopt_bench.analysis.selectors import baseline, comparable_stages, p50_of, ratio
from llmopt_bench.analysis.speedup_interval import claim_interval
from llmopt_bench.core.fmt import num, times
from llmopt_bench.core.records import Claim, Verdict
from llmopt_bench.core.results import RunResult, StageResult

HELD_FRACTION = 0.8  # an "N x" claim holds when this run reaches 80% of N


def claim_verdict(ok: bool | None) -> Verdict:
    return "not measured" if ok is None else "held" if ok else "not held"


def holds(value: float | None, target: float) -> bool | None:
    """An "N x" claim: held at HELD_FRACTION of N."""
    return None if value is None else value >= target * HELD_FRACTION


def claim_overall(run: RunResult) -> Claim:
    base = baseline(run)
    others = [s for s in comparable_stages(run) if s is not base and p50_of(s, "e2e_s")]
    best = min(others, key=lambda s: p50_of(s, "e2e_s") or 0.0, default=None)
    value = ratio(p50_of(base, "e2e_s"), p50_of(best, "e2e_s")) if best else None
    detail = (f"{base.name} E2E p50 {num(p50_of(base, 'e2e_s'))} s -> {best.name} {num(p50_of(best, 'e2e_s'))} s"
              if value and base and best else "needs the baseline and at least one other ok stage")
    interval, note = with_interval(run, best, base, "e2e", 15) if value else ("", "")
    return Claim(key="overall", claim="30 s to 2 s a request", target="15x lower E2E p50 (held at >= 12x)",
                 measured=times(value) + interval, value=value, verdict=claim_verdict(holds(value, 15)),
                 detail=detail + (f"; {note}" if note else ""))


def with_interval(run: RunResult, stage: StageResult | None, ref: StageResult | None, what: str, target: float,
                  held_fraction: float = HELD_FRACTION) -> tuple[str, str]:
    """A speedup claim's interval over the repeats and what it says of the verdict, and whether
    the ratio depends on this host's CPU (a host-bound baseline: analysis/speedup_interval.py)."""
    interval, note = claim_interval(stage, ref, what, target, held_fraction)
    if ref is not None and host_bound(ref, run).host_bound:
        kops = index_mean(ref)
        note += ("; " if note else "") + f"{ref.name} is host-bound: the ratio depends on this host's CPU" + (
            f" (host-speed index {kops:.3g} kop/s)" if kops else "")
    return interval, note
