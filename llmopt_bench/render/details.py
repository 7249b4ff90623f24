"""The report's per-stage details: what every stage has (implementation, params, weights,
energy, notes, quality), then the stage's own blocks and charts from its hooks."""

from __future__ import annotations

from pathlib import Path

from llmopt_bench.analysis.scaling import per_gpu
from llmopt_bench.analysis.selectors import GB, ok_stages
from llmopt_bench.core.fmt import num, pct, table
from llmopt_bench.core.records import Block, QualityRecord
from llmopt_bench.core.results import EnergyRecord, RunResult, StageResult
from llmopt_bench.render.hooks import stage_blocks


def per_gpu_line(s: StageResult) -> list[str]:
    """The stage's processes' peak on each GPU, where it used more than one (tensor parallelism)."""
    by_dev = per_gpu(s)
    if len(by_dev) < 2:
        return []
    return ["- peak memory per GPU (the stage's processes): " + ", ".join(f"GPU {k} {num(v / GB)} GB" for k, v in sorted(by_dev.items()))]


def stage_notes(s: StageResult) -> list[str]:
    """The stage's notes, then its load's, each once: a stage may repeat at run time what it said at load."""
    return list(dict.fromkeys([*s.notes, *(s.load.notes if s.load else [])]))


def energy_line(e: EnergyRecord | None) -> list[str]:
    if e is None:
        return []
    per_token = f", {num(e.joules_per_output_token)} J per output token" if e.joules_per_output_token else ""
    windows = f" in {e.windows} timed window(s)" if e.windows else ""
    return [f"- energy: {num(e.joules)} J over {num(e.seconds)} s{windows}, {num(e.avg_watts)} W average{per_token} "
            f"(whole device; scope: {e.scope})"]


def quality_line(q: QualityRecord | None, is_reference: bool = False) -> list[str]:
    if q is None:
        return []
    if q.error:
        return [f"Quality: not measured, the quality pass failed ({q.error}); the timing samples are kept.", ""]
    ppl = num(q.perplexity) if q.perplexity_meaningful else "not meaningful (random weights)"
    if q.agreement_note and q.token_match_rate is None:
        return [f"Quality: perplexity {ppl}; agreement: {q.agreement_note}", ""]
    versus = f"{q.reference or 'the reference'}" + (" (itself, re-run: what the engine's own nondeterminism leaves)"
                                                    if is_reference else "")
    return [f"Quality vs {versus}: token match {pct(q.token_match_rate)}, {divergence(q)}, KL {num(q.kl_mean)}, "
            f"perplexity {ppl}; gate: {q.gate or '-'}" + (" — **quality regression**" if q.quality_regression else ""), ""]


def divergence(q: QualityRecord) -> str:
    """Where the outputs first part from the reference's, on average: a prompt that never parts
    counts as its whole length, so when none did the mean is the length, and says so."""
    if q.first_divergence_mean is None:
        return "first divergence not measured"
    if q.token_match_rate == 1.0:
        return f"no divergence (every one of the {q.agreement_positions or 'checked'} tokens matched)"
    return f"first divergence at token {num(q.first_divergence_mean)} on average (a prompt that never diverged counts as its length)"


def quality_cell(q: QualityRecord | None, is_reference: bool = False) -> str:
    """The quality column of the stage table: agreement, perplexity, the gate's verdict."""
    if q is None:
        return "-"
    if q.error:
        return "quality pass failed"
    itself = " (reference vs its re-run)" if is_reference else ""
    parts = [f"match {pct(q.token_match_rate)}{itself}" if q.token_match_rate is not None else "",
             f"KL {num(q.kl_mean)}" if q.kl_mean is not None else "",
             f"ppl {num(q.perplexity)}" if q.perplexity is not None and q.perplexity_meaningful else "",
             "REGRESSION" if q.quality_regression else "",
             "agreement n/a (see details)" if q.agreement_note and q.token_match_rate is None else ""]
    return "; ".join(x for x in parts if x) or "-"


def block_lines(b: Block) -> list[str]:
    out = [b.text, ""] if b.text else []
    if b.headers:
        out += table(b.headers, b.rows) + [""]
    return out


def details(run: RunResult, stage_charts: dict[str, list[Path]]) -> list[str]:
    out: list[str] = []
    for s in ok_stages(run):
        impl = (s.load.implementation if s.load else {}) or {}
        out += [f"### {s.name}", "", s.description or "", "",
                "- implementation: " + (", ".join(f"{k} {v}" for k, v in impl.items()) or "-"),
                f"- params: {s.params or '-'}; weights {num((s.load.weights_bytes or 0) / GB or None) if s.load else '-'} GB",
                *energy_line(s.energy), *per_gpu_line(s),
                *(f"- note: {n}" for n in stage_notes(s)), "", *quality_line(s.quality, s.quality_reference)]
        for b in stage_blocks(s, run):
            out += block_lines(b)
        out += [f"![{s.name}: {p.stem}](charts/{p.name})" for p in stage_charts.get(s.name, [])]
        if stage_charts.get(s.name):
            out.append("")
    return out or ["No stage finished."]
