"""What to deploy: among a run's deployable configurations (analysis/recommend/candidates.py),
the one that best meets the SLO for a priority, the runner-up and why it lost, what is missing
and which stage measures it, and the `vllm serve` line that reproduces the winner.

One answer whatever is asked: the candidates, the reference points, the quality verdicts and
the results ruled out (failing the quality gate, or meeting the SLO at no measured rate) are the
same under every priority; only the figure ranked on changes. A priority ranks like with like:
its figures in order of evidence (BASES), and the first that some candidate has is the one
ranked on; the candidates without it are named as not ranked, with what would measure it.

- throughput: the highest held capacity under the SLO (held in steady state, under the server's
  ceiling); else the highest saturated output throughput measured the same way; else the
  highest output throughput on the fixed workload (not saturated, said so);
- latency: the lowest TPOT at one request in flight through the server; else the offline
  engine's at batch 1 (the server adds its own cost: docs/serving.md);
- memory: the smallest weights (to 3 significant digits: the same weights counted two ways are
  one size);
- cost: the fewest GPU-seconds per request at the held capacity (GPUs / capacity). Energy per
  token needs a counter not every card has (nor a server llmopt did not start); a held capacity
  and a GPU count are measured on any card. No held capacity: no cost, and the answer says so.

Two figures that cannot be told apart are not a winner: capacities (and GPU-seconds) whose
intervals overlap, offline figures whose interval over the repeats (analysis/speedup_interval.py,
the gate's noise) holds a ratio of 1 (`distinct` False)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from llmopt_bench.analysis.recommend.candidates import Candidate, Reference, candidate, reference_why
from llmopt_bench.analysis.recommend.text import caveats, choice_sentence, missing, no_winner, not_ranked, rounded_size, tradeoffs
from llmopt_bench.analysis.scaling import NOT_SATURATED
from llmopt_bench.analysis.selectors import ok_stages
from llmopt_bench.analysis.speedup_interval import speedup_interval
from llmopt_bench.core.errors import UsageError
from llmopt_bench.core.freeform import Json
from llmopt_bench.core.results import RunResult, StageResult
from llmopt_bench.core.slo import SLO

PRIORITIES = ("throughput", "latency", "memory", "cost")


@dataclass(frozen=True)
class Basis:
    """A figure a priority ranks on, and how: like with like (`group`: only the candidates of
    one group are ranked together), the better direction, and its interval's source."""

    key: str  # its words: analysis/recommend/text.FIGURE
    value: Callable[[Candidate], float | None]
    higher_is_better: bool
    group: Callable[[Candidate], str] = lambda c: ""
    repeats: str | None = None  # the figure's key in analysis/speedup_interval (offline figures with repeats)


def _fixed(c: Candidate) -> float | None:
    return c.saturated_tok_s if c.saturated_how == NOT_SATURATED else None


def _saturated(c: Candidate) -> float | None:
    return c.saturated_tok_s if c.saturated_how and c.saturated_how != NOT_SATURATED else None


BASES: dict[str, tuple[Basis, ...]] = {
    "throughput": (Basis("capacity", lambda c: c.deployable_rps, True),
                   Basis("saturated", _saturated, True, group=lambda c: c.saturated_how or ""),
                   Basis("fixed", _fixed, True, repeats="output_tok_s")),
    "latency": (Basis("served", lambda c: c.batch1_tpot_s if c.served else None, False),
                Basis("offline", lambda c: c.batch1_tpot_s if not c.served else None, False, repeats="tpot")),
    "memory": (Basis("weights", lambda c: rounded_size(c.weights_bytes) if c.weights_bytes else None, False),),
    "cost": (Basis("gpu_s", lambda c: c.gpu_s_per_request, False),),
}


@dataclass
class Recommendation:
    slo: str | None  # the SLO judged, as printed (several, comma-joined, where the run's serving stages differ)
    slo_note: str  # where the SLO and the capacities come from
    priority: str
    serving: bool  # some candidate measured a capacity under an SLO
    basis: str | None = None  # the figure ranked on (a key of BASES' figures: text.FIGURE says it); None: no candidate has one
    winner: Candidate | None = None
    runner_up: Candidate | None = None
    distinct: bool = True  # False: the winner and the runner-up cannot be told apart
    candidates: list[Candidate] = field(default_factory=list)  # every deployable configuration, the same under every priority
    references: list[Reference] = field(default_factory=list)  # results that are not configurations to deploy
    ruled_out: list[str] = field(default_factory=list)  # the same under every priority
    not_ranked: list[str] = field(default_factory=list)  # candidates without the figure ranked on, and what measures it
    missing: list[str] = field(default_factory=list)  # what the run lacks for a sounder answer, and which stage measures it
    verdict: str = ""
    tradeoffs: list[str] = field(default_factory=list)
    caveats: list[str] = field(default_factory=list)
    command: str | None = None

    def as_dict(self) -> Json:
        return asdict(self)


def recommend(run: RunResult, priority: str = "throughput", slo: SLO | None = None) -> Recommendation:
    """The recommendation for `priority`; `slo` judges the measured points again under another SLO."""
    if priority not in PRIORITIES:
        raise UsageError(f"--priority {priority!r}: unknown", f"use one of {', '.join(PRIORITIES)}")
    results = {s.name: s for s in ok_stages(run)}
    serving = any(s.facts.slo is not None for s in results.values())
    deployable = [s for s in results.values() if reference_why(s, serving) is None]
    served = [s for s in deployable if s.facts.slo is not None]
    run_slos = sorted({str(s.facts.slo) for s in served})
    rejudging = slo is not None and run_slos != [str(slo)]
    cands = [candidate(s, run.workload.batch_size, slo if rejudging else None) for s in deployable]
    rec = Recommendation(slo=str(slo) if slo else (run_slos[0] if len(run_slos) == 1 else ", ".join(run_slos) or None),
                         slo_note=_slo_note(served, rejudging, run_slos), priority=priority, serving=bool(served), candidates=cands,
                         references=[Reference(s.name, why) for s in results.values() if (why := reference_why(s, serving))])
    rec.ruled_out = [f"{c.name}: fails the quality gate" for c in cands if c.quality == "regression"] + \
        [f"{c.name}: meets the SLO at no measured rate" for c in cands if c.quality != "regression" and not c.meets]
    eligible = [c for c in cands if c.quality != "regression" and c.meets]
    basis, ranked = rank(eligible, priority)
    rec.basis = basis.key if basis else None
    rec.winner, rec.runner_up = (ranked[0] if ranked else None), (ranked[1] if len(ranked) > 1 else None)
    if basis and rec.winner and rec.runner_up:
        rec.distinct = distinct(basis, rec.winner, rec.runner_up, results)
    rec.not_ranked = not_ranked(rec.basis, eligible, ranked)
    rec.missing = missing(rec)
    _explain(rec)
    return rec


def rank(eligible: list[Candidate], priority: str) -> tuple[Basis | None, list[Candidate]]:
    """The first figure of the priority's BASES that some candidate has, and the candidates of
    its largest like-with-like group (groups of one size: the first in the run's order) ranked on
    it (ties: the lower TTFT at one request, then the run's order)."""
    for basis in BASES[priority]:
        have = [c for c in eligible if basis.value(c) is not None]
        if not have:
            continue
        groups: dict[str, list[Candidate]] = {}
        for c in have:
            groups.setdefault(basis.group(c), []).append(c)
        pool = max(groups.values(), key=len)
        sign = -1.0 if basis.higher_is_better else 1.0
        return basis, sorted(pool, key=lambda c: (sign * (basis.value(c) or 0.0), c.batch1_ttft_s or math.inf))
    return None, []


def distinct(basis: Basis, w: Candidate, r: Candidate, results: dict[str, StageResult]) -> bool:
    """Whether the winner's figure is told apart from the runner-up's by more than their
    measurement allows: capacity intervals (and the GPU-seconds they give) that do not overlap, an
    interval over the repeats that excludes a ratio of 1; a figure measured once, with no interval,
    is taken as it is (the answer says it has none)."""
    if basis.key in ("capacity", "gpu_s"):
        return not overlap(w, r)
    if basis.key == "weights":
        return basis.value(w) != basis.value(r)
    if basis.repeats:
        iv = speedup_interval(results[w.name], results[r.name], basis.repeats)
        return iv is None or not (iv.lo <= 1.0 <= iv.hi)
    return True


def overlap(a: Candidate, b: Candidate) -> bool:
    """Whether two capacities cannot be told apart: each lies in [its capacity, its first failing
    rate), and the better one's floor is below the other's ceiling (an unfound ceiling: above all)."""
    a_rps, b_rps = a.capacity_rps, b.capacity_rps
    if not (a_rps and b_rps):
        return False
    hi_rps, lo = (a_rps, b) if a_rps >= b_rps else (b_rps, a)
    upper = lo.interval[1] if lo.interval and len(lo.interval) > 1 else None
    return upper is None or hi_rps < upper


def _slo_note(served: list[StageResult], rejudging: bool, run_slos: list[str]) -> str:
    if not served:
        return "no configuration in this run measured a capacity under an SLO (a serving stage does)"
    if rejudging:
        return (f"re-judged from the measured open-loop points under this SLO (the run searched under {', '.join(run_slos)}): "
                "the capacity is the highest measured rate that meets it, known within the neighbouring measured rates")
    return "the capacity each serving result found by its own search"


def _explain(rec: Recommendation) -> None:
    rec.caveats = caveats(rec)
    if rec.winner is None:
        rec.verdict = no_winner(rec)
        return
    rec.verdict = choice_sentence(rec)
    rec.tradeoffs = tradeoffs(rec.winner, rec.runner_up, rec.serving, rec.distinct) if rec.runner_up else []
    rec.command = rec.winner.command
