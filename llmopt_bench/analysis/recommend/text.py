"""The recommendation in words (analysis/recommend/choose.py): the verdict, a sentence per trade-off
between the winner and the runner-up, the caveats, and the report's "What to deploy" lines."""

from __future__ import annotations

import math
from typing import Any

from llmopt_bench.analysis.scaling import NOT_SATURATED
from llmopt_bench.core.fmt import gb_text, ms_text, num, pct

WHY = {"throughput": "the highest capacity under the SLO", "latency": "the lowest TPOT at one request in flight",
       "memory": "the smallest weights", "cost": "the fewest GPU-seconds per request at its capacity"}
WHY_OFFLINE = {"throughput": "the highest saturated output throughput", "latency": "the lowest TPOT at one request in flight",
               "memory": "the smallest weights", "cost": "the least energy per output token"}


def rounded_size(size: float | None) -> float:
    """A size to 3 significant digits (inf when unknown): the same weights counted two ways
    (transformers 13,476,831,744 bytes, vLLM 13,475,459,891) are one size, and the peak decides."""
    return float(f"{size:.3g}") if size else math.inf


def _rel(a: float | None, b: float | None) -> str:
    return f" ({(a / b - 1) * 100:+.0f}%)" if a and b else ""


def _capacity(c: Any) -> str:
    """"38.0 req/s, known within 4.1% ([38.0, 39.6])"; "~N req/s, not held, ..." for a capacity
    that was not held, never the deployable figure; "at least" where no rate above it failed."""
    if c.capacity_rps is None:
        return "none"
    hi = c.interval[1] if c.interval and len(c.interval) > 1 else None
    held = "" if getattr(c, "held", None) else "~"
    base = f"{held}{num(c.capacity_rps)} req/s{', not held' if held else ''}"
    kw = getattr(c, "known_within", None)
    if kw is not None:
        return f"{base}, known within {pct(kw)} ([{num(c.capacity_rps)}, {num(hi)}])"
    return f"{base}, at least ({'no rate above it failed' if hi is None else 'the rates above it measured the client'})"


def _why(rec: Any) -> str:
    """What the winner is best at; a fixed-workload throughput is not called saturated."""
    w = rec.winner
    if not rec.serving and rec.priority == "throughput" and w.saturated_how == NOT_SATURATED:
        return (f"the highest output throughput measured, {num(w.saturated_tok_s)} tok/s on the fixed workload (not a "
                "saturated figure: no result here measured one)")
    if rec.priority == "memory" and w.quality != "passes":
        return ("the smallest weights among the results whose token match with the reference holds" if w.agreement_holds
                else "the smallest weights, though its quality is not known to hold")
    return (WHY if rec.serving else WHY_OFFLINE)[rec.priority]


def gate_words(rec: Any, pool: list[Any]) -> str:
    """What the quality gate judged of the results the choice was made among."""
    judged = [c for c in pool if c.quality == "passes"]
    unjudged = [c.name for c in pool if c.quality != "passes"]
    if not unjudged:
        return "among the results that pass the quality gate"
    if not judged:
        reasons = sorted({c.quality.removeprefix("not judged (").rstrip(")") for c in pool})
        return f"(the quality gate judged none of them: {'; '.join(reasons)})"
    return (f"among the results that pass the quality gate ({', '.join(c.name for c in judged)}) or that it could not "
            f"judge ({', '.join(unjudged)})")


def choice_sentence(rec: Any, pool: list[Any]) -> str:
    """The first sentence: the winner, why, what the gate judged; or, where the winner and the
    runner-up cannot be told apart, both, and why not one."""
    w, r = rec.winner, rec.runner_up
    if not rec.distinct:
        head = (f"No single winner on {rec.priority}: {w.name} and {r.name} cannot be told apart {gate_words(rec, pool)}: "
                f"their capacities under {rec.slo}, {_capacity(w)} and {_capacity(r)}, overlap. "
                f"{w.name} is listed first for its higher measured rate; a finer capacity search (more rates between "
                "them) would separate them, and the trade-offs below may decide")
        return head + "."
    head = f"Deploy {w.name}: {_why(rec)} {gate_words(rec, pool)}"
    if rec.serving:
        head += f"; it carries {_capacity(w)} under {rec.slo}"
        if w.goodput_rps:
            head += f", goodput {num(w.goodput_rps)} req/s there"
    return head + "." + (f" Runner-up: {r.name}." if r else " No runner-up: no other result qualifies.")


def memory_words(rec: Any, cands: list[Any]) -> list[str]:
    """The memory priority: the smaller results passed over because their quality does not hold,
    or is not known to."""
    w = rec.winner
    if rec.priority != "memory" or w is None or not w.weights_bytes:
        return []
    smaller = [c for c in cands if c.quality != "regression" and rounded_size(c.weights_bytes) < rounded_size(w.weights_bytes)
               and c.quality != "passes" and not c.agreement_holds]
    low = [c for c in smaller if c.agreement_holds is False]
    unknown = [c for c in smaller if c.agreement_holds is None]
    out = []
    if low:
        out.append("Smaller, passed over for quality: " + "; ".join(f"{c.name} ({gb_text(c.weights_bytes)}, token match "
                   f"{pct(c.token_match_rate)})" for c in low) + ": their token match with the reference falls further "
                   "below the reference's own (its match with its own re-run) than the quality gate's margin.")
    if unknown:
        out.append("Smaller, passed over as their quality is not known: " + ", ".join(f"{c.name} ({gb_text(c.weights_bytes)})"
                   for c in unknown) + " (no perplexity the gate could judge, no token match with the reference).")
    if out:
        out.append(f"{w.name} passes the gate." if w.quality == "passes" else f"{w.name}'s token match "
                   f"({pct(w.token_match_rate)}) is within the margin." if w.agreement_holds else
                   f"{w.name}'s quality is not known to hold either.")
    return out


def tradeoffs(w: Any, r: Any, serving: bool, distinct: bool = True) -> list[str]:
    """One sentence each: capacity, latency, memory, quality, energy per token."""
    out = []
    if serving:
        rel = _rel(w.capacity_rps, r.capacity_rps) if distinct else " (the intervals overlap: no measured difference)"
        out.append(f"Capacity: {w.name} {_capacity(w)}, {r.name} {_capacity(r)}{rel}.")
    else:
        out.append(f"Throughput: {w.name} {num(w.saturated_tok_s)} tok/s ({w.saturated_how or '-'}), {r.name} "
                   f"{num(r.saturated_tok_s)} tok/s ({r.saturated_how or '-'}){_throughput_rel(w, r)}.")
    out.append(f"Latency at one request in flight: {w.name} TPOT p50 {ms_text(w.batch1_tpot_s)} (TTFT {ms_text(w.batch1_ttft_s)}), "
               f"{r.name} {ms_text(r.batch1_tpot_s)} (TTFT {ms_text(r.batch1_ttft_s)}).")
    out.append(f"Memory: {w.name}'s weights {gb_text(w.weights_bytes)} (peak {gb_text(w.peak_bytes)}), {r.name}'s {gb_text(r.weights_bytes)} "
               f"(peak {gb_text(r.peak_bytes)}){_shares(w, r)}.")
    out.append(f"Quality: {w.name} {_quality(w)}; {r.name} {_quality(r)}.")
    if w.j_per_token or r.j_per_token:
        where = "the headline load point of each" if serving else "the timed run of each"
        out.append(f"Energy: {w.name} {num(w.j_per_token)} J per output token, {r.name} {num(r.j_per_token)} "
                   f"(over {where}, whole device).")
    else:
        out.append("Energy: not measured (no GPU energy counter here, or a server llmopt did not start).")
    return out


def _shares(w: Any, r: Any) -> str:
    """The card's share an engine takes whatever its weights (vLLM's gpu_memory_utilization), for
    those of the two that have one."""
    have = [c for c in (w, r) if c.memory_share]
    if not have:
        return ""
    if len(have) == 2 and w.memory_share != r.memory_share:
        who = f"{w.name} takes {w.memory_share:.0%} and {r.name} {r.memory_share:.0%}"
    else:
        who = f"{'both take' if len(have) == 2 else have[0].name + ' takes'} {have[0].memory_share:.0%}"
    return f"; {who} of the card (gpu_memory_utilization) whatever the weights, the rest of that share for the KV cache"


def _quality(c: Any) -> str:
    parts = [c.quality]
    if c.perplexity:
        parts.append(f"perplexity {num(c.perplexity)}")
    if c.token_match_rate is not None:
        parts.append(f"token match with the reference {pct(c.token_match_rate)}")
    return ", ".join(parts)


def no_winner(rec: Any, cands: list[Any]) -> str:
    if not cands:
        return "No result finished: nothing to recommend."
    if not rec.serving:
        return f"No result has the figure the {rec.priority} priority ranks on: nothing to recommend."
    passing = [c for c in cands if c.quality != "regression"]
    if any(c.meets for c in passing):
        return (f"The results that meet the SLO {rec.slo} lack the figure the {rec.priority} priority ranks on "
                "(latency: a sweep point at concurrency 1; memory: the weights' size): nothing to rank.")
    misses = sorted((c for c in passing if c.miss_ratio is not None), key=lambda c: c.miss_ratio)
    if misses:
        b = misses[0]
        return (f"No result meets the SLO {rec.slo} at any measured rate. The nearest, {b.name}, misses by "
                f"{(b.miss_ratio - 1) * 100:.0f}% {b.miss}: relax the SLO, or serve a lighter configuration.")
    return f"No result that passes the quality gate meets the SLO {rec.slo}."


def caveats(rec: Any, cands: list[Any]) -> list[str]:
    out = []
    unjudged = [c.name for c in cands if c.quality.startswith("not judged") or c.quality == "not measured"]
    if unjudged:
        rests = {"memory": "size and token match with the reference", "cost": "cost"}.get(rec.priority, "speed")
        out.append(f"The quality gate could not judge {', '.join(unjudged)} (random weights, a server llmopt did not start, "
                   f"or no quality pass): where it could not, the choice rests on {rests} alone.")
    if rec.winner is not None and rec.winner.command is None:
        out.append(f"No `vllm serve` line for {rec.winner.name}: llmopt did not serve it (its engine params are in run.json).")
    for c in cands:
        out += [f"{c.name}: {n}" for n in c.notes]
    return out


def lines(rec: Any, markdown: bool = True) -> list[str]:
    """The report's "What to deploy" section; markdown False: the same for a terminal (no bold)."""
    head = rec.verdict
    if markdown and rec.winner is not None and head.startswith(f"Deploy {rec.winner.name}:"):
        head = head.replace(f"Deploy {rec.winner.name}:", f"Deploy **{rec.winner.name}**:", 1)
    out = [f"Priority: {rec.priority}. SLO: {rec.slo or '-'} ({rec.slo_note}).", "", head]
    if rec.ruled_out:
        out += ["", "Ruled out: " + "; ".join(rec.ruled_out) + "."]
    if rec.tradeoffs:
        out += ["", f"{rec.winner.name} against {rec.runner_up.name}:", ""] + [f"- {t}" for t in rec.tradeoffs]
    if rec.command:
        cache = (" ($LLMOPT_CACHE: llmopt's model cache, ~/.cache/llmopt unless the variable is set)"
                 if markdown and "$LLMOPT_CACHE" in rec.command else "")  # a terminal gets the path itself (cli/recommend.py)
        out += ["", f"Reproduce the {'first listed' if not rec.distinct else 'winner'}{cache}:", "", f"    {rec.command}"]
    if rec.caveats:
        out += [""] + [f"- {c}" for c in rec.caveats]
    out += ["", "Other priorities and SLOs: `llmopt recommend RUN_DIR --priority latency|throughput|memory|cost --slo ...`."]
    return out


def _throughput_rel(w: Any, r: Any) -> str:
    """The ratio of two throughputs of one kind; a saturated figure against a fixed workload's is no ratio."""
    if (w.saturated_how == NOT_SATURATED) != (r.saturated_how == NOT_SATURATED):
        return " (one saturated, one not: no ratio)"
    return _rel(w.saturated_tok_s, r.saturated_tok_s)
