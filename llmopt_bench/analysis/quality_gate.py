"""The quality gate: a stage whose perplexity is more than (1 - min_quality) above the quality
reference's is a quality regression (MLPerf's "99% of the reference" rule, for a metric where
lower is better). Applied by the runner to run.json after every stage, so a stage measured
before its reference (a resumed run) is judged once the reference exists. The reference is the
result whose stage declares `quality_reference` (the FP16 baseline in the journey).

Perplexity is the only measure gated: agreement and KL on random weights say that a stage
changed the model, not that its answers got worse, so synthetic runs record the gate as not
applied, with the reason."""

from __future__ import annotations

from llmopt_bench.analysis.selectors import reference
from llmopt_bench.core.records import QualityRecord
from llmopt_bench.core.results import RunResult

DEFAULT_MIN_QUALITY = 0.99


def describe(min_quality: float, reference_name: str) -> str:
    return f"perplexity within {(1 - min_quality) * 100:.3g}% of {reference_name}'s (min quality {min_quality:.3g})"


def judge(quality: QualityRecord, ref: QualityRecord | None, ref_name: str | None, min_quality: float) -> dict:
    """The gate fields for one stage's quality record: gate, quality_ratio, quality_regression."""
    if not quality.perplexity_meaningful or quality.perplexity is None:
        return {"gate": f"not applied: no meaningful perplexity ({quality.perplexity_note or quality.error or 'none measured'})",
                "quality_ratio": None, "quality_regression": None}
    if ref is None or not ref.perplexity:
        return {"gate": "not applied: no quality reference with a perplexity in this run", "quality_ratio": None,
                "quality_regression": None}
    ratio = quality.perplexity / ref.perplexity
    return {"gate": f"{describe(min_quality, ref_name or 'the reference')}: {quality.perplexity:.4g} vs "
                    f"{ref.perplexity:.4g} ({(ratio - 1) * 100:+.2f}%)",
            "quality_ratio": ratio, "quality_regression": ratio > 1 + (1 - min_quality)}


def apply_gate(run: RunResult, min_quality: float) -> None:
    """Write the gate into every ok stage's quality record (the reference's included: it
    passes by definition, which shows the gate ran)."""
    ref = reference(run)
    for stage in run.stages:
        if stage.status == "ok" and stage.quality is not None:
            for key, value in judge(stage.quality, ref.quality if ref else None, ref.name if ref else None,
                                    min_quality).items():
                setattr(stage.quality, key, value)
