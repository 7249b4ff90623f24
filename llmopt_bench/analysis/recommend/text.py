"""The recommendation in words (analysis/recommend/choose.py): the verdict with what the winner
carries and costs, a sentence per trade-off between the winner and the runner-up, the
candidates not ranked and why, the reference points, what is missing and which stage measures
it, and the report's "What to deploy" lines (the same as `llmopt recommend` prints)."""

from __future__ import annotations

import math
from typing import Any

from llmopt_bench.analysis.recommend.candidates import ABOVE_CEILING, HELD, NOT_HELD, OFFLINE_BESIDE_SERVED
from llmopt_bench.analysis.scaling import NOT_SATURATED
from llmopt_bench.core.fmt import gb_text, ms_text, num, pct

# what the winner is best at, per figure ranked on (choose.BASES)
FIGURE = {"capacity": "the highest held capacity under the SLO",
          "saturated": "the highest saturated output throughput",
          "fixed": "the highest output throughput on the fixed workload (not a saturated figure)",
          "served": "the lowest TPOT at one request in flight through the server",
          "offline": "the lowest TPOT at one request in flight (vLLM's offline engine, no server)",
          "weights": "the smallest weights",
          "gpu_s": "the fewest GPU-seconds per request at its held capacity"}
# the figure as a noun, for the candidates not ranked on it
NOUN = {"capacity": "a held capacity", "saturated": "saturated output throughput", "fixed": "fixed-workload output throughput",
        "served": "TPOT at one request in flight through the server", "offline": "the offline engine's TPOT at one request in flight",
        "weights": "weights", "gpu_s": "GPU-seconds per request"}
# what each priority needs, for the answer that has none
WANTS = {"throughput": "a held capacity under the SLO, a saturated or a fixed-workload output throughput",
         "latency": "a TPOT at one request in flight", "memory": "the weights' size",
         "cost": "GPU-seconds per request, which needs a capacity held under the SLO"}
SERVE_JOURNEY = ("`llmopt bench --stages journeys/serving.toml` serves FP16, FP8 and AWQ with `vllm serve`, finds each one's "
                 "capacity under the SLO in steady state and holds it for 60 s (`--hold 600` for an MLPerf-like check)")


def rounded_size(size: float | None) -> float:
    """A size to 3 significant digits (inf when unknown): the same weights counted two ways
    (transformers 13,476,831,744 bytes, vLLM 13,475,459,891) are one size."""
    return float(f"{size:.3g}") if size else math.inf


def _rel(a: float | None, b: float | None) -> str:
    return f" ({(a / b - 1) * 100:+.0f}%)" if a and b else ""


def capacity_text(c: Any) -> str:
    """"38.0 req/s, held, known within 4.1% ([38.0, 39.6])" where it is offered; "~N req/s, not
    held" or "~N req/s, above the server's ceiling of M req/s" where it is not; "at least" where
    no rate above it failed."""
    if c.capacity_rps is None:
        return "none (no measured rate met the SLO)" if c.served else "not measured (offline engine, no server)"
    hi = c.interval[1] if c.interval and len(c.interval) > 1 else None
    if c.capacity_status == HELD:
        base = f"{num(c.capacity_rps)} req/s, held"
    elif c.capacity_status == ABOVE_CEILING:
        base = (f"~{num(c.capacity_rps)} req/s{'' if c.held else ', not held'}, above the server's measured ceiling of "
                f"{num(c.ceiling_rps)} req/s")
    else:
        base = f"~{num(c.capacity_rps)} req/s, not held"
    if c.known_within is not None:
        return f"{base}, known within {pct(c.known_within)} ([{num(c.capacity_rps)}, {num(hi)}])"
    return f"{base}, at least ({'no rate above it failed' if hi is None else 'the rates above it measured the client'})"


def figure_text(key: str | None, c: Any) -> str:
    """The winner's (or the runner-up's) figure the ranking was on."""
    if key == "capacity":
        return capacity_text(c)
    if key in ("saturated", "fixed"):
        return f"{num(c.saturated_tok_s)} tok/s" + (f" ({c.saturated_how})" if key == "saturated" else "")
    if key in ("served", "offline"):
        return f"TPOT p50 {ms_text(c.batch1_tpot_s)}"
    if key == "weights":
        return gb_text(c.weights_bytes)
    if key == "gpu_s":
        return f"{num(c.gpu_s_per_request)} GPU-s per request ({c.devices or 1} GPU / {num(c.deployable_rps)} req/s)"
    return "-"


def _figure_rel(key: str | None, w: Any, r: Any) -> str:
    value = {"capacity": lambda c: c.capacity_rps, "saturated": lambda c: c.saturated_tok_s, "fixed": lambda c: c.saturated_tok_s,
             "served": lambda c: c.batch1_tpot_s, "offline": lambda c: c.batch1_tpot_s, "weights": lambda c: c.weights_bytes,
             "gpu_s": lambda c: c.gpu_s_per_request}.get(key or "")
    return _rel(value(r), value(w)) if value else ""


def gate_words(cands: list[Any]) -> str:
    """What the quality gate judged of the deployable configurations: the same whatever the priority."""
    judged = [c for c in cands if c.quality == "passes"]
    unjudged = [c.name for c in cands if c.quality not in ("passes", "regression")]
    if not unjudged:
        return "among the deployable configurations that pass the quality gate"
    if not judged:
        reasons = sorted({c.quality.removeprefix("not judged (").rstrip(")") for c in cands if c.quality != "regression"})
        return f"among the deployable configurations (the quality gate judged none of them: {'; '.join(reasons)})"
    return (f"among the deployable configurations that pass the quality gate ({', '.join(c.name for c in judged)}) or that it "
            f"could not judge ({', '.join(unjudged)})")


def choice_sentence(rec: Any) -> str:
    """The verdict: the winner, why, what the gate judged, the runner-up and why it lost, then
    what the winner carries and what it costs; or, where the winner and the runner-up cannot be
    told apart, both, and why not one."""
    w, r, key = rec.winner, rec.runner_up, rec.basis
    if not rec.distinct:
        why = {"capacity": "their capacity intervals overlap", "gpu_s": "the capacity intervals they rest on overlap",
               "weights": "they are one size to 3 significant digits"}.get(key, "the interval of their ratio over the repeats holds 1")
        head = (f"No single winner on {rec.priority}: {w.name} and {r.name} cannot be told apart on {FIGURE[key]} "
                f"{gate_words(rec.candidates)}: {figure_text(key, w)} and {figure_text(key, r)} ({why}). {w.name} is listed "
                "first for its measured figure; the trade-offs below may decide.")
    else:
        head = f"Deploy {w.name}: {FIGURE[key]}, {figure_text(key, w)}, {gate_words(rec.candidates)}."
        head += (f" Runner-up: {r.name}, {figure_text(key, r)}{_figure_rel(key, w, r)}." if r
                 else " No runner-up: no other deployable configuration has this figure.")
    return " ".join([head, carries(w, rec.slo), costs(w)])


def carries(c: Any, slo: str | None) -> str:
    """How many requests a second the winner carries within the SLO: the held capacity, or why it is not known."""
    if not c.served:
        return ("What it carries under an SLO is not measured: it ran on vLLM's offline engine, without a server "
                "(serve it to measure it: see below).")
    if c.capacity_status == HELD:
        good = f", goodput {num(c.goodput_rps)} req/s there" if c.goodput_rps else ""
        return f"It carries {capacity_text(c)} under {slo}{good}."
    why = {NOT_HELD: "was not held (short trials only)",
           ABOVE_CEILING: f"lies above the highest rate its server was measured to complete, {num(c.ceiling_rps)} req/s "
                          f"({c.ceiling_how})" + ("" if c.held else ", and was not held")}.get(c.capacity_status, "")
    return (f"What it carries under {slo} is not known: its search's ~{num(c.capacity_rps)} req/s {why}: not a figure "
            "to size a deployment by.")


def costs(c: Any) -> str:
    """What the winner costs: memory, the quality verdict, GPU-seconds per request, energy."""
    parts = [f"weights {gb_text(c.weights_bytes)} (peak {gb_text(c.peak_bytes)}"
             + (f", {c.memory_share:.0%} of the card by gpu_memory_utilization" if c.memory_share else "") + ")",
             f"quality {quality_text(c)}"]
    if c.gpu_s_per_request:
        parts.append(f"{num(c.gpu_s_per_request)} GPU-s per request")
    if c.j_per_token:
        parts.append(f"{num(c.j_per_token)} J per output token")
    return "It costs: " + "; ".join(parts) + "."


def quality_text(c: Any) -> str:
    parts = [c.quality]
    if c.perplexity:
        parts.append(f"perplexity {num(c.perplexity)}")
    if c.token_match_rate is not None:
        parts.append(f"token match with the reference {pct(c.token_match_rate)}")
    return ", ".join(parts)


def tradeoffs(w: Any, r: Any, serving: bool, distinct: bool = True) -> list[str]:
    """One sentence each: capacity, throughput, latency, memory, quality, energy per token."""
    out = []
    if w.served or r.served:
        rel = _rel(w.capacity_rps, r.capacity_rps) if distinct and w.deployable_rps and r.deployable_rps else ""
        out.append(f"Capacity: {w.name} {capacity_text(w)}, {r.name} {capacity_text(r)}{rel}.")
    out.append(f"Throughput: {w.name} {num(w.saturated_tok_s)} tok/s {_how(w)}, {r.name} {num(r.saturated_tok_s)} tok/s {_how(r)}"
               f"{_throughput_rel(w, r)}.")
    out.append(f"Latency at one request in flight: {w.name} TPOT p50 {ms_text(w.batch1_tpot_s)} (TTFT {ms_text(w.batch1_ttft_s)}"
               f"{', ' + _where(w)}), {r.name} {ms_text(r.batch1_tpot_s)} (TTFT {ms_text(r.batch1_ttft_s)}, {_where(r)}).")
    out.append(f"Memory: {w.name}'s weights {gb_text(w.weights_bytes)} (peak {gb_text(w.peak_bytes)}), {r.name}'s "
               f"{gb_text(r.weights_bytes)} (peak {gb_text(r.peak_bytes)}){_shares(w, r)}.")
    out.append(f"Quality: {w.name} {quality_text(w)}; {r.name} {quality_text(r)}.")
    if w.j_per_token or r.j_per_token:
        where = "its headline load point" if w.served else "its timed run"  # the candidates of one answer are all served, or none
        out.append(f"Energy: {w.name} {num(w.j_per_token)} J per output token, {r.name} {num(r.j_per_token)} "
                   f"(each over {where}, whole device).")
    else:
        out.append("Energy: not measured (no GPU energy counter here, or a server llmopt did not start).")
    return out


def _how(c: Any) -> str:
    return "on the fixed workload (not saturated)" if c.saturated_how == NOT_SATURATED else f"({c.saturated_how or '-'})"


def _where(c: Any) -> str:
    return "through the server" if c.served else "offline engine"


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


def _throughput_rel(w: Any, r: Any) -> str:
    """The ratio of two throughputs of one kind; figures measured two ways make no ratio."""
    if (w.saturated_how or "") != (r.saturated_how or ""):
        return " (measured two ways: no ratio)"
    return _rel(w.saturated_tok_s, r.saturated_tok_s)


def not_ranked(key: str | None, eligible: list[Any], ranked: list[Any]) -> list[str]:
    """The candidates left out of the ranking, each with what it lacks of the figure ranked on."""
    if key is None:
        return []
    names = {c.name for c in ranked}
    return [f"{c.name} ({_lacks(key, c, ranked)})" for c in eligible if c.name not in names]


def _lacks(key: str, c: Any, ranked: list[Any]) -> str:
    if key in ("capacity", "gpu_s"):
        return f"capacity {capacity_text(c)}"
    if key == "saturated":
        if c.saturated_how == NOT_SATURATED or not c.saturated_tok_s:
            return "no saturated figure: the fixed workload only"
        return f"its saturated figure was measured another way ({c.saturated_how}) than {ranked[0].saturated_how}'s"
    return {"served": "no TPOT at one request in flight", "offline": "no TPOT at one request in flight",
            "weights": "weights not measured"}.get(key, "no fixed-workload throughput")


def missing(rec: Any) -> list[str]:
    """What the run lacks for a sounder answer, and what measures it: the same whatever the priority."""
    if not rec.candidates:
        return [f"A deployable configuration: this run measured reference points only. {SERVE_JOURNEY}."]
    cands, out = [c for c in rec.candidates if c.quality != "regression"], []
    if not cands:
        return []
    if not any(c.deployable_rps for c in cands):
        served = [c for c in cands if c.served]
        state = (f"{', '.join(c.name for c in served)} {'was' if len(served) == 1 else 'were'} searched, but no capacity was held "
                 "under its server's ceiling" if served else "no configuration here was served")
        out.append(f"A held capacity under the SLO (what a configuration carries, and its GPU-seconds per request): {state}. "
                   f"{SERVE_JOURNEY}.")
    lineless = [c.name for c in cands if not c.command and not c.served]
    if lineless:
        out.append(f"The `vllm serve` line of {', '.join(lineless)}: vLLM's offline engine records none (its engine params are "
                   "in run.json); serving it records it (journeys/serving.toml).")
    offline = [r.name for r in rec.references if r.why == OFFLINE_BESIDE_SERVED]
    if offline:
        one = len(offline) == 1
        out.append(f"Whether {', '.join(offline)} {'meets' if one else 'meet'} the SLO: {'it' if one else 'they'} ran on vLLM's offline "
                   "engine only; a configuration is ranked here once served under the SLO (a vllm-serve entry with its engine "
                   "params: journeys/serving.toml serves FP16, FP8 and AWQ).")
    if any(c.quality.startswith("not judged (random weights") for c in cands):
        out.append("Quality: the weights are random, so the quality gate judges no configuration (perplexity means nothing on "
                   "them); the same stages on the real model (`--model` a checkpoint directory or hub id) give its verdict.")
    return out


def no_winner(rec: Any) -> str:
    cands = rec.candidates
    if not cands:
        refs = ", ".join(r.name for r in rec.references) or "none"
        return f"No deployable configuration in this run (reference points only: {refs}): nothing to recommend."
    passing = [c for c in cands if c.quality != "regression"]
    if not passing:
        return "Every deployable configuration fails the quality gate: nothing to recommend."
    if not any(c.meets for c in passing):
        misses = sorted((c for c in passing if c.miss_ratio is not None), key=lambda c: c.miss_ratio)
        if misses:
            b = misses[0]
            return (f"No result meets the SLO {rec.slo} at any measured rate. The nearest, {b.name}, misses by "
                    f"{(b.miss_ratio - 1) * 100:.0f}% {b.miss}: relax the SLO, or serve a lighter configuration.")
        return f"No result that passes the quality gate meets the SLO {rec.slo}."
    return (f"No deployable configuration has the figure the {rec.priority} priority ranks on ({WANTS[rec.priority]}): "
            f"nothing to recommend on {rec.priority}.")


def caveats(rec: Any) -> list[str]:
    out = []
    unjudged = [c.name for c in rec.candidates if c.quality not in ("passes", "regression")]
    if unjudged and len(unjudged) < len(rec.candidates):
        out.append(f"The quality gate could not judge {', '.join(unjudged)} (a server llmopt did not start, or no quality pass): "
                   "their quality is not known.")
    if rec.winner is not None and rec.winner.command is None and rec.winner.served:
        out.append(f"No `vllm serve` line for {rec.winner.name}: llmopt did not start its server.")
    if rec.runner_up is not None and rec.basis in ("served", "saturated"):
        noun = NOUN[rec.basis]
        out.append(f"{noun[0].upper() + noun[1:]} was measured once per configuration: no interval says whether a second run "
                   "would rank them the same.")
    for c in rec.candidates:
        out += [f"{c.name}: {n}" for n in c.notes]
    return out


def lines(rec: Any, markdown: bool = True) -> list[str]:
    """The report's "What to deploy" section; markdown False: the same for a terminal (no bold)."""
    head = rec.verdict
    if markdown and rec.winner is not None and head.startswith(f"Deploy {rec.winner.name}:"):
        head = head.replace(f"Deploy {rec.winner.name}:", f"Deploy **{rec.winner.name}**:", 1)
    out = [f"Priority: {rec.priority}. SLO: {rec.slo or '-'} ({rec.slo_note}).", "", head]
    if rec.ruled_out:
        out += ["", "Ruled out (under every priority): " + "; ".join(rec.ruled_out) + "."]
    if rec.tradeoffs:
        out += ["", f"{rec.winner.name} against {rec.runner_up.name}:", ""] + [f"- {t}" for t in rec.tradeoffs]
    if rec.command:
        cache = (" ($LLMOPT_CACHE: llmopt's model cache, ~/.cache/llmopt unless the variable is set)"
                 if markdown and "$LLMOPT_CACHE" in rec.command else "")  # a terminal gets the path itself (cli/recommend.py)
        out += ["", f"Reproduce the {'first listed' if not rec.distinct else 'winner'}{cache}:", "", f"    {rec.command}"]
    if rec.not_ranked:
        out += ["", f"Not ranked on {NOUN[rec.basis]}: " + "; ".join(rec.not_ranked) + "."]
    if rec.references:
        why: dict[str, list[str]] = {}
        for r in rec.references:
            why.setdefault(r.why, []).append(r.name)
        out += ["", "Reference points, not configurations to deploy: " + "; ".join(f"{', '.join(n)} ({w})" for w, n in why.items()) + "."]
    if rec.missing:
        out += ["", "Missing, and what measures it:", ""] + [f"- {m}" for m in rec.missing]
    if rec.caveats:
        out += [""] + [f"- {c}" for c in rec.caveats]
    out += ["", "Other priorities and SLOs: `llmopt recommend RUN_DIR --priority latency|throughput|memory|cost --slo ...`."]
    return out
