"""The report's conclusions: sentences computed from the numbers alone (and the claims the
stages judged), so that a report says nothing its run.json does not support."""

from __future__ import annotations

from llmopt_bench.analysis.selectors import GB, baseline, comparable_stages, ok_stages, p50_of, ratio
from llmopt_bench.core.fmt import num, pct, times
from llmopt_bench.core.records import Claim
from llmopt_bench.core.results import RunResult


def host_sentences(run: RunResult, base, ok: list) -> list[str]:
    """The bottleneck by measurement (GPU busy per token), the speedups' intervals, and whether
    they depend on this host's CPU (issue 25)."""
    from llmopt_bench.analysis.hostbound import busy_sentence
    from llmopt_bench.analysis.speedup_interval import host_caveat, speedups_sentence

    out = [line for s in ok if (line := busy_sentence(s, run))]
    if base is not None:
        out += [line for line in (speedups_sentence(run, base, [s for s in ok if s is not base]), host_caveat(base, run)) if line]
    return out


def conclusions(run: RunResult, claims: list[Claim]) -> list[str]:
    """Sentences computed from the numbers: fastest decode, best throughput, smallest weights, the
    roofline's verdicts, quality regressions, noisy repeats, stages that stopped, the claims' tally."""
    from llmopt_bench.analysis.roofline import roofline
    from llmopt_bench.analysis.roofline_text import prefill_sentences, roofline_sentence

    out: list[str] = []
    every, ok, base = ok_stages(run), comparable_stages(run), baseline(run)
    timed = [s for s in ok if s is not base and p50_of(s, "tpot_s")]
    if timed and base and p50_of(base, "tpot_s"):
        f = min(timed, key=lambda s: p50_of(s, "tpot_s"))
        x = ratio(p50_of(base, "tpot_s"), p50_of(f, "tpot_s"))
        lead = "The fastest decode is" if x >= 1 else f"No stage decodes faster than the baseline ({base.name}); the fastest other is"
        out.append(f"{lead} {f.name} at {num(p50_of(f, 'tpot_s') * 1e3)} ms/token, {times(x)} the baseline"
                   + (f" ({base.name})." if x >= 1 else "."))
    tput = [s for s in ok if s is not base and s.metrics.output_tok_s]
    if tput and base and base.metrics.output_tok_s:
        t = max(tput, key=lambda s: s.metrics.output_tok_s)
        x = ratio(t.metrics.output_tok_s, base.metrics.output_tok_s)
        lead = "The highest output throughput is" if x >= 1 else "No stage beats the baseline's output throughput; the best other is"
        out.append(f"{lead} {t.name} at {num(t.metrics.output_tok_s)} tok/s, {times(x)} the baseline.")
    weighed = [s for s in ok if s.load and s.load.weights_bytes]
    if len(weighed) > 1 and base in weighed:
        w = min(weighed, key=lambda s: s.load.weights_bytes)
        out.append(f"The smallest weights are {w.name}'s at {num(w.load.weights_bytes / GB)} GB, "
                   f"{pct(w.load.weights_bytes / base.load.weights_bytes)} of the baseline's.")
    out += host_sentences(run, base, ok)
    rows = roofline(run)
    out += [roofline_sentence(r) for r in rows if r.phase == "decode"]
    out += prefill_sentences([r for r in rows if r.phase == "prefill"])
    for s in every:
        if s.quality and s.quality.quality_regression:
            out.append(f"{s.name} fails its quality gate ({s.quality.gate or 'see its quality block'}).")
        reps = s.metrics.tpot_p50_repeats_s
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
