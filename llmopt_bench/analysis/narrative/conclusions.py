"""The report's conclusions: sentences computed from the numbers alone (and the claims the
stages judged), so that a report says nothing its run.json does not support; every figure is
analysis/figures.py's, the one the tables show."""

from __future__ import annotations

from llmopt_bench.analysis.figures import figure_value
from llmopt_bench.analysis.hostbound import busy_sentence
from llmopt_bench.analysis.narrative.roofline_text import prefill_sentences, roofline_sentence
from llmopt_bench.analysis.roofline import roofline
from llmopt_bench.analysis.selectors import GB, baseline, comparable_stages, ok_stages, p50_of
from llmopt_bench.analysis.speedup_interval import host_caveat, speedups_sentence
from llmopt_bench.core.fmt import num, pct, times
from llmopt_bench.core.records import Claim
from llmopt_bench.core.results import RunResult, StageResult


def host_sentences(run: RunResult, base: StageResult | None, ok: list[StageResult]) -> list[str]:
    """The bottleneck by measurement (GPU busy per token), the speedups' intervals, and whether
    they depend on this host's CPU (issue 25)."""
    out = [line for s in ok if (line := busy_sentence(s, run))]
    if base is not None:
        out += [line for line in (speedups_sentence(run, base, [s for s in ok if s is not base]), host_caveat(base, run)) if line]
    return out


def fastest_decode(ok: list[StageResult], base: StageResult | None) -> list[str]:
    """The stage with the lowest TPOT p50 against the baseline's."""
    timed = [(s, v) for s in ok if s is not base and (v := p50_of(s, "tpot_s"))]
    base_tpot = p50_of(base, "tpot_s")
    if not timed or base is None or not base_tpot:
        return []
    f, f_tpot = min(timed, key=lambda sv: sv[1])
    x = base_tpot / f_tpot
    lead = "The fastest decode is" if x >= 1 else f"No stage decodes faster than the baseline ({base.name}); the fastest other is"
    return [f"{lead} {f.name} at {num(f_tpot * 1e3)} ms/token, {times(x)} the baseline" + (f" ({base.name})." if x >= 1 else ".")]


def best_throughput(ok: list[StageResult], base: StageResult | None) -> list[str]:
    """The stage with the highest output tokens/s against the baseline's."""
    tput = [(s, v) for s in ok if s is not base and (v := figure_value(s, "output_tok_s"))]
    base_tput = figure_value(base, "output_tok_s")
    if not tput or not base_tput:
        return []
    t, t_tput = max(tput, key=lambda sv: sv[1])
    x = t_tput / base_tput
    lead = "The highest output throughput is" if x >= 1 else "No stage beats the baseline's output throughput; the best other is"
    return [f"{lead} {t.name} at {num(t_tput)} tok/s, {times(x)} the baseline."]


def smallest_weights(ok: list[StageResult], base: StageResult | None) -> list[str]:
    """The stage with the smallest weights, as a share of the baseline's (base is one of ok)."""
    weighed = [(s, b) for s in ok if s.load and (b := s.load.weights_bytes)]
    base_weights = base.load.weights_bytes if base and base.load else None
    if len(weighed) < 2 or not base_weights:
        return []
    small, w_bytes = min(weighed, key=lambda sb: sb[1])
    return [f"The smallest weights are {small.name}'s at {num(w_bytes / GB)} GB, {pct(w_bytes / base_weights)} of the baseline's."]


def conclusions(run: RunResult, claims: list[Claim]) -> list[str]:
    """Sentences computed from the numbers: fastest decode, best throughput, smallest weights, the
    roofline's verdicts, quality regressions, noisy repeats, stages that stopped, the claims' tally."""
    every, ok, base = ok_stages(run), comparable_stages(run), baseline(run)
    out = fastest_decode(ok, base) + best_throughput(ok, base) + smallest_weights(ok, base)
    out += host_sentences(run, base, ok)
    rows = roofline(run)
    out += [roofline_sentence(r) for r in rows if r.phase == "decode"]
    out += prefill_sentences([r for r in rows if r.phase == "prefill"])
    for s in every:
        if s.quality and s.quality.quality_regression:
            out.append(f"{s.name} fails its quality gate ({s.quality.gate or 'see its quality block'}).")
        reps = s.metrics.tpot_p50_repeats_s if s.metrics else []
        if len(reps) > 1 and min(reps) > 0 and max(reps) / min(reps) > 1.5:
            out.append(f"{s.name}'s TPOT p50 varies {max(reps) / min(reps):.1f}x between repeats: the machine was "
                       "noisy, read its numbers with care.")
    missed = [s.name for s in run.stages if s.status != "ok"]
    if missed:
        out.append(f"{len(missed)} stage(s) did not run to completion: {', '.join(missed)}.")
    counts = {v: sum(c.verdict == v for c in claims) for v in ("held", "not held", "not measured")}
    out.append(f"Of the story's {len(claims)} claims, {counts['held']} held, {counts['not held']} did not, "
               f"{counts['not measured']} could not be measured in this run.")
    return out
