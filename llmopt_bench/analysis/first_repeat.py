"""Was the warm-up enough? The first measured repeat against the others.

A warm-up that leaves something cold (kernels not loaded, an allocator that still has to grow,
caches not filled) shows as a first repeat slower than the rest. The fixed workload's warm-up is
short for transformers engines (one generation of a few tokens: scenarios/fixed/run.py), so the
report checks every run: repeat 0's time per output token (its requests' E2E over their tokens)
against the median of the other repeats'. Pure functions, from run.json's compact samples."""

from __future__ import annotations

import statistics
from collections import defaultdict

from llmopt_bench.core.results import Samples

SLOWER_PCT = 10.0  # repeat 0 slower than the others' median by more than this: said in the report


def per_repeat_s_per_token(samples: Samples) -> list[float]:
    """Each repeat's seconds per output token (sum of E2E / sum of tokens), in repeat order."""
    e2e: dict[int, float] = defaultdict(float)
    tokens: dict[int, int] = defaultdict(int)
    for rep, t, n in zip(samples.repeat, samples.e2e_s, samples.output_tokens):
        e2e[rep] += t
        tokens[rep] += n
    return [e2e[r] / tokens[r] for r in sorted(e2e) if tokens[r] > 0]


def first_repeat_excess_pct(per_repeat: list[float]) -> float | None:
    """How much slower repeat 0 ran than the median of the others, in %; None below two repeats."""
    if len(per_repeat) < 2:
        return None
    rest = statistics.median(per_repeat[1:])
    return 100.0 * (per_repeat[0] / rest - 1.0) if rest > 0 else None


def first_repeat_warning(samples: Samples | None, warmup: str) -> str | None:
    """The report's warning when repeat 0 ran more than SLOWER_PCT slower than the others; warmup
    says what the warm-up was."""
    per_repeat = per_repeat_s_per_token(samples) if samples else []
    excess = first_repeat_excess_pct(per_repeat)
    if excess is None or excess <= SLOWER_PCT:
        return None
    others = statistics.median(per_repeat[1:])
    return (f"Warning: the first measured repeat ran {excess:.0f}% slower than the median of the other "
            f"{len(per_repeat) - 1} ({per_repeat[0] * 1e3:.3g} vs {others * 1e3:.3g} ms per output token, E2E over tokens): "
            f"the warm-up ({warmup}) may have left something cold, or the host slowed down; every repeat is in the figures.")
