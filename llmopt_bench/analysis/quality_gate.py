"""The quality gate: a stage whose perplexity is more than (1 - min_quality) above the FP16
reference's is a quality regression (MLPerf's "99% of the reference" rule, for a metric where
lower is better). Applied by the runner to run.json after every stage, so a stage measured
before its reference (a resumed run) is judged once the reference exists.

Perplexity is the only measure gated: agreement and KL on random weights say that a stage
changed the model, not that its answers got worse, so synthetic runs record the gate as not
applied, with the reason."""

from __future__ import annotations

from typing import Any

REFERENCE = "hf-fp16"
DEFAULT_MIN_QUALITY = 0.99


def describe(min_quality: float) -> str:
    return f"perplexity within {(1 - min_quality) * 100:.3g}% of {REFERENCE}'s (min quality {min_quality:.3g})"


def judge(quality: dict[str, Any], reference: dict[str, Any] | None, min_quality: float) -> dict[str, Any]:
    """The gate fields for one stage's quality block: gate, quality_ratio, quality_regression."""
    gate = describe(min_quality)
    if not quality.get("perplexity_meaningful", True) or quality.get("perplexity") is None:
        return {"gate": f"not applied: no meaningful perplexity ({quality.get('perplexity_note') or 'none measured'})",
                "quality_ratio": None, "quality_regression": None}
    ref_ppl = (reference or {}).get("perplexity")
    if not ref_ppl:
        return {"gate": f"not applied: no {REFERENCE} perplexity in this run", "quality_ratio": None,
                "quality_regression": None}
    ratio = quality["perplexity"] / ref_ppl
    return {"gate": f"{gate}: {quality['perplexity']:.4g} vs {ref_ppl:.4g} ({(ratio - 1) * 100:+.2f}%)",
            "quality_ratio": ratio, "quality_regression": ratio > 1 + (1 - min_quality)}


def apply_gate(run: Any, min_quality: float) -> None:
    """Write the gate into every ok stage's extra["quality"] (the reference's included: it
    passes by definition, which shows the gate ran)."""
    ref_stage = run.stage(REFERENCE)
    reference = (ref_stage.extra or {}).get("quality") if ref_stage and ref_stage.status == "ok" else None
    for stage in run.stages:
        q = (stage.extra or {}).get("quality")
        if stage.status == "ok" and isinstance(q, dict):
            q.update(judge(q, reference, min_quality))
