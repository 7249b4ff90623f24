"""The recommendation in words (analysis/recommend.py): the verdict, a sentence per trade-off
between the winner and the runner-up, the caveats, and the report's "What to deploy" lines."""

from __future__ import annotations

from typing import Any

from llmopt_bench.core.fmt import GB, num, pct

WHY = {"throughput": "the highest capacity under the SLO", "latency": "the lowest TPOT at one request in flight",
       "memory": "the smallest weights", "cost": "the fewest GPU-seconds per request at its capacity"}
WHY_OFFLINE = {"throughput": "the highest saturated output throughput", "latency": "the lowest TPOT at one request in flight",
               "memory": "the smallest weights", "cost": "the least energy per output token"}


def _ms(v: float | None) -> str:
    return f"{num(v * 1e3)} ms" if v else "-"


def _gb(v: float | None) -> str:
    return f"{num(v / GB)} GB" if v else "-"


def _rel(a: float | None, b: float | None) -> str:
    return f" ({(a / b - 1) * 100:+.0f}%)" if a and b else ""


def _capacity(c: Any) -> str:
    if c.capacity_rps is None:
        return "none"
    hi = c.interval[1] if c.interval and len(c.interval) > 1 else None
    held = "" if getattr(c, "held", None) else "~"  # a capacity that was not held is never the deployable figure
    return (f"{held}{num(c.capacity_rps)} req/s{', not held' if held else ''} "
            f"(within [{num(c.capacity_rps)}, {num(hi) if hi else 'not found'}])")


def verdict(rec: Any) -> str:
    w = rec.winner
    why = (WHY if rec.serving else WHY_OFFLINE)[rec.priority]
    head = f"Deploy **{w.name}**: {why} among the results that pass the quality gate"
    if rec.serving:
        head += f"; it carries {_capacity(w)} under {rec.slo}"
        if w.goodput_rps:
            head += f", goodput {num(w.goodput_rps)} req/s there"
    return head + "." + (f" Runner-up: {rec.runner_up.name}." if rec.runner_up else " No runner-up: no other result qualifies.")


def tradeoffs(w: Any, r: Any, serving: bool) -> list[str]:
    """One sentence each: capacity, latency, memory, quality, energy per token."""
    out = []
    if serving:
        out.append(f"Capacity: {w.name} {_capacity(w)}, {r.name} {_capacity(r)}{_rel(w.capacity_rps, r.capacity_rps)}.")
    else:
        out.append(f"Throughput: {w.name} {num(w.saturated_tok_s)} tok/s ({w.saturated_how or '-'}), {r.name} "
                   f"{num(r.saturated_tok_s)} tok/s ({r.saturated_how or '-'}){_rel(w.saturated_tok_s, r.saturated_tok_s)}.")
    out.append(f"Latency at one request in flight: {w.name} TPOT p50 {_ms(w.batch1_tpot_s)} (TTFT {_ms(w.batch1_ttft_s)}), "
               f"{r.name} {_ms(r.batch1_tpot_s)} (TTFT {_ms(r.batch1_ttft_s)}).")
    out.append(f"Memory: {w.name}'s weights {_gb(w.weights_bytes)} (peak {_gb(w.peak_bytes)}), {r.name}'s {_gb(r.weights_bytes)} "
               f"(peak {_gb(r.peak_bytes)}); vLLM takes its gpu_memory_utilization share of the card whatever the weights, "
               "the rest goes to the KV cache.")
    out.append(f"Quality: {w.name} {_quality(w)}; {r.name} {_quality(r)}.")
    if w.j_per_token or r.j_per_token:
        where = "the headline load point of each" if serving else "the timed run of each"
        out.append(f"Energy: {w.name} {num(w.j_per_token)} J per output token, {r.name} {num(r.j_per_token)} "
                   f"(over {where}, whole device).")
    else:
        out.append("Energy: not measured (no GPU energy counter here, or a server llmopt did not start).")
    return out


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
        out.append(f"The quality gate could not judge {', '.join(unjudged)} (random weights, a server llmopt did not start, "
                   "or no quality pass): where it could not, the choice rests on speed alone.")
    if rec.winner is not None and rec.winner.command is None:
        out.append(f"No `vllm serve` line for {rec.winner.name}: llmopt did not serve it (its engine params are in run.json).")
    for c in cands:
        out += [f"{c.name}: {n}" for n in c.notes]
    return out


def lines(rec: Any) -> list[str]:
    """The report's "What to deploy" section."""
    out = [f"Priority: {rec.priority}. SLO: {rec.slo or '-'} ({rec.slo_note}).", "", rec.verdict]
    if rec.ruled_out:
        out += ["", "Ruled out: " + "; ".join(rec.ruled_out) + "."]
    if rec.tradeoffs:
        out += ["", f"{rec.winner.name} against {rec.runner_up.name}:", ""] + [f"- {t}" for t in rec.tradeoffs]
    if rec.command:
        out += ["", "Reproduce the winner:", "", f"    {rec.command}"]
    if rec.caveats:
        out += [""] + [f"- {c}" for c in rec.caveats]
    out += ["", "Other priorities and SLOs: `llmopt recommend RUN_DIR --priority latency|throughput|memory|cost --slo ...`."]
    return out
