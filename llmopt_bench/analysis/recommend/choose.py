"""What to deploy: among a run's results that pass the quality gate, the one that best meets the
SLO for a priority, the runner-up, the trade-off between them, and the `vllm serve` line that
reproduces the winner. Read from StageFacts and QualityRecord alone (no stage's extra, no
stage's name): a serving stage records its capacity under its SLO and every open-loop point it
measured (facts.slo_points), so another SLO is judged again from those (analysis/recommend/rejudge.py).

Priorities: throughput (the highest capacity under the SLO), latency (the lowest TPOT at one
request in flight among those that meet the SLO), memory (the smallest weights, else the lowest
peak, among the results whose quality holds: see below), cost (the fewest GPU-seconds per
request at capacity; energy per token breaks ties). A run with no serving result is ranked on
what it has, said so: the saturated throughput, the batch-1 TPOT, the weights, the energy per
token.

Two capacities whose intervals overlap cannot be told apart: the recommendation says so
(`distinct` False) rather than a winner by a margin the measurement does not support.

The memory priority's winner is, by construction, the most compressed result, the one most
likely to have lost quality; so it ranks first the results whose quality holds: those that pass
the quality gate and, where the gate cannot judge (random weights: no meaningful perplexity),
those whose token match with the reference is within the gate's margin (1 - min_quality) of
the reference's own (its match against its own re-run, the engine's nondeterminism). The
margin is the gate's, so the agreement bar is as strict as the perplexity one: on the
committed SmolLM2 runs every quantized stage the perplexity gate failed matched 80-92% of the
reference's tokens."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from llmopt_bench.analysis.recommend.rejudge import rejudge
from llmopt_bench.analysis.recommend.text import caveats, choice_sentence, memory_words, no_winner, rounded_size, tradeoffs
from llmopt_bench.analysis.scaling import batch1_tpot, saturated
from llmopt_bench.analysis.selectors import ok_stages, reference
from llmopt_bench.core.errors import UsageError
from llmopt_bench.core.fmt import num
from llmopt_bench.core.freeform import Json
from llmopt_bench.core.results import RunResult, StageResult, peak_memory
from llmopt_bench.core.slo import SLO

PRIORITIES = ("throughput", "latency", "memory", "cost")


@dataclass
class Candidate:
    name: str
    capacity_rps: float | None = None
    held: bool | None = None  # the capacity held for a longer window (load/capacity/hold.py); else "~N, not held"
    interval: list[float | None] | None = None
    known_within: float | None = None  # the precision reached: the interval's upper end / the capacity - 1
    goodput_rps: float | None = None
    meets: bool = False  # some measured rate met the SLO
    miss: str | None = None  # how the nearest point misses, in words
    miss_ratio: float | None = None  # its worst value / limit
    batch1_tpot_s: float | None = None
    batch1_ttft_s: float | None = None
    saturated_tok_s: float | None = None
    saturated_how: str | None = None
    weights_bytes: float | None = None
    peak_bytes: float | None = None
    j_per_token: float | None = None
    devices: int | None = None
    quality: str = "not measured"  # passes | regression | not judged (...) | not measured
    perplexity: float | None = None
    token_match_rate: float | None = None
    agreement_holds: bool | None = None  # token match within the gate's margin of the reference's own (None: not known)
    memory_share: float | None = None  # the card's share an engine takes whatever its weights (vLLM's gpu_memory_utilization)
    command: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def gpu_s_per_request(self) -> float | None:
        return (self.devices or 1) / self.capacity_rps if self.capacity_rps else None


@dataclass
class Recommendation:
    slo: str | None  # the SLO judged, as printed (several, comma-joined, where the run's serving stages differ)
    slo_note: str  # where the SLO and the capacities come from
    priority: str
    serving: bool  # the run measured capacity under an SLO
    winner: Candidate | None = None
    runner_up: Candidate | None = None
    distinct: bool = True  # False: the winner and the runner-up cannot be told apart (overlapping capacity intervals)
    candidates: list[Candidate] = field(default_factory=list)
    ruled_out: list[str] = field(default_factory=list)
    verdict: str = ""
    tradeoffs: list[str] = field(default_factory=list)
    caveats: list[str] = field(default_factory=list)
    command: str | None = None

    def as_dict(self) -> Json:
        return asdict(self)


def _quality(s: StageResult) -> tuple[str, list[str]]:
    q = s.quality
    if q is None:
        return "not measured", []
    if q.error:
        return "not measured", [f"its quality pass failed ({q.error})"]
    if q.quality_regression:
        return "regression", []
    if q.quality_regression is False:
        return "passes", []
    if not q.perplexity_meaningful:
        note = (q.perplexity_note or "no meaningful perplexity").split(":")[0]
        return f"not judged ({note})", []
    return f"not judged ({(q.gate or 'no perplexity').removeprefix('not applied: ')})", []


def candidate(s: StageResult, batch_size: int, rejudge_with: SLO | None = None) -> Candidate:
    """A result's figures for the ranking; a serving result's capacity under its SLO, or under
    `rejudge_with`, judged again from its measured points."""
    f = s.facts
    quality, notes = _quality(s)
    weights = s.load.weights_bytes if s.load else None
    sat, how = saturated(s)
    peak, source = peak_memory(s)
    if f.slo is not None and source == "host RSS peak":  # a served stage's own process is the client, not the server
        peak = None
    ttft = f.batch1_ttft_s or (s.metrics.ttft_s.p50 if batch_size == 1 and not s.own_workload and s.metrics and s.metrics.ttft_s
                               else None)
    c = Candidate(name=s.name, batch1_tpot_s=batch1_tpot(s, batch_size), batch1_ttft_s=ttft, saturated_tok_s=sat, saturated_how=how,
                  weights_bytes=float(weights) if weights else None, peak_bytes=peak,
                  j_per_token=s.energy.joules_per_output_token if s.energy else None, devices=f.devices, quality=quality,
                  perplexity=s.quality.perplexity if s.quality and s.quality.perplexity_meaningful else None,
                  token_match_rate=s.quality.token_match_rate if s.quality else None, command=f.serve_command, notes=notes,
                  memory_share=s.params.get("gpu_memory_utilization"))
    if f.slo is None:
        return c
    mfr = f.slo_max_failure_rate if f.slo_max_failure_rate is not None else 0.01
    judged = rejudge(f.slo_points, rejudge_with or f.slo, mfr)
    if rejudge_with is None and f.slo_capacity_rps is not None:  # the stage's own search: its interval is the tighter one
        c.capacity_rps, c.interval, c.goodput_rps = f.slo_capacity_rps, f.slo_capacity_interval, f.goodput_rps
        c.held = f.slo_capacity_held
    else:
        c.capacity_rps, c.interval, c.goodput_rps, c.held = judged.capacity_rps, judged.interval, judged.goodput_rps, judged.held
        c.notes += judged.notes
    c.known_within = known_within(c, f.slo_capacity_known_within if rejudge_with is None else None)
    c.meets = c.capacity_rps is not None
    near = judged.closest_miss()
    if not c.meets and near is not None and near.worst is not None:
        c.miss_ratio, c.miss = near.worst, f"at {num(near.rate_rps)} req/s, {near.reason}"
    return c


def known_within(c: Candidate, recorded: float | None) -> float | None:
    """The precision a capacity is known to: the stage's own (its search's untrusted trials
    taken into account), else the interval's upper end over the capacity, less 1 (runs from
    before issue 34 and capacities judged again under another SLO)."""
    if recorded is not None:
        return recorded
    hi = c.interval[1] if c.interval and len(c.interval) > 1 else None
    return hi / c.capacity_rps - 1 if hi and c.capacity_rps else None


def _key(c: Candidate, priority: str, serving: bool) -> tuple[float, ...]:
    inf = math.inf
    if priority == "throughput":
        return (-(c.capacity_rps or 0), -(c.goodput_rps or 0)) if serving else (-(c.saturated_tok_s or 0),)
    if priority == "latency":
        return (c.batch1_tpot_s or inf, c.batch1_ttft_s or inf)
    if priority == "memory":  # quality first (the module's doc): holds, then not known to, then known not to
        tier = 0 if c.quality == "passes" or c.agreement_holds else 2 if c.agreement_holds is False else 1
        return (rounded_size(c.weights_bytes or c.peak_bytes), c.peak_bytes or inf, tier)
    return (c.gpu_s_per_request or inf, c.j_per_token or inf) if serving else (c.j_per_token or inf,)


def _rank(c: Candidate, priority: str, serving: bool) -> tuple[float, ...]:
    """The sort order: for memory the quality tier leads, the figures follow."""
    key = _key(c, priority, serving)
    return (key[-1], *key[:-1]) if priority == "memory" else key


def agreement_holds(c: Candidate, reference_match: float | None, min_quality: float) -> bool | None:
    """Whether the candidate's token match is within the gate's margin of the reference's own;
    None where either is not measured."""
    if c.token_match_rate is None or not reference_match:
        return None
    return c.token_match_rate >= min_quality * reference_match


def overlap(a: Candidate, b: Candidate) -> bool:
    """Whether two capacities cannot be told apart: each lies in [its capacity, its first failing
    rate), and the better one's floor is below the other's ceiling (an unfound ceiling: above all)."""
    a_rps, b_rps = a.capacity_rps, b.capacity_rps
    if not (a_rps and b_rps):
        return False
    hi_rps, lo = (a_rps, b) if a_rps >= b_rps else (b_rps, a)
    ceiling = lo.interval[1] if lo.interval and len(lo.interval) > 1 else None
    return ceiling is None or hi_rps < ceiling


def _has_figure(c: Candidate, priority: str, serving: bool) -> bool:
    return _key(c, priority, serving)[0] not in (math.inf, 0)


def recommend(run: RunResult, priority: str = "throughput", slo: SLO | None = None) -> Recommendation:
    """The recommendation for `priority`; `slo` judges the measured points again under another SLO."""
    if priority not in PRIORITIES:
        raise UsageError(f"--priority {priority!r}: unknown", f"use one of {', '.join(PRIORITIES)}")
    served = [s for s in ok_stages(run) if s.facts.slo is not None]
    run_slos = sorted({str(s.facts.slo) for s in served})
    rejudging = slo is not None and run_slos != [str(slo)]
    pool = served or ok_stages(run)
    cands = [candidate(s, run.workload.batch_size, slo if rejudging else None) for s in pool]
    ref = reference(run)
    ref_match = ref.quality.token_match_rate if ref and ref.quality else None
    for c in cands:
        c.agreement_holds = agreement_holds(c, ref_match, run.min_quality)
    rec = Recommendation(slo=str(slo) if slo else (run_slos[0] if len(run_slos) == 1 else ", ".join(run_slos) or None),
                         slo_note=_slo_note(served, rejudging, run_slos), priority=priority, serving=bool(served), candidates=cands)
    rec.ruled_out = [f"{c.name}: fails the quality gate" for c in cands if c.quality == "regression"]
    ok = [c for c in cands if c.quality != "regression" and (c.meets or not served) and _has_figure(c, priority, bool(served))]
    ok.sort(key=lambda c: _rank(c, priority, bool(served)))
    ok = held_first(ok) if served else ok
    rec.winner, rec.runner_up = (ok[0] if ok else None), (ok[1] if len(ok) > 1 else None)
    rec.distinct = not (priority == "throughput" and len(ok) > 1 and overlap(ok[0], ok[1]))
    _explain(rec, cands, ok)
    rec.caveats += held_caveats(ok) if served else []
    return rec


def held_first(ranked: list[Candidate]) -> list[Candidate]:
    """A capacity that held for a longer window (load/capacity/hold.py) outranks one from short trials
    only, whatever the figures: the order among each kind is kept."""
    return [c for c in ranked if c.held] + [c for c in ranked if not c.held]


def held_caveats(ranked: list[Candidate]) -> list[str]:
    """Said when the recommendation rests on capacities that were not held."""
    if not ranked or any(c.held for c in ranked):
        return [f"{c.name}'s capacity was not held (~{num(c.capacity_rps)} req/s from short trials): not a figure to size a "
                "deployment by" for c in ranked[:2] if not c.held and c.capacity_rps]
    return ["No capacity in this run was held (hold_s = 0, a failed hold, or a run from before holds): each is the answer of "
            "short trials, ~N req/s; run the serving stage with --hold 60 (or more) before sizing a deployment by it."]


def _slo_note(served: list[StageResult], rejudging: bool, run_slos: list[str]) -> str:
    if not served:
        return ("no result in this run measured a capacity under an SLO (a serving stage does): ranked on what the run "
                "measured instead (saturated throughput, batch-1 TPOT, weights, energy per token)")
    if rejudging:
        return (f"re-judged from the measured open-loop points under this SLO (the run searched under {', '.join(run_slos)}): "
                "the capacity is the highest measured rate that meets it, known within the neighbouring measured rates")
    return "the capacity each serving result found by its own search"


def _explain(rec: Recommendation, cands: list[Candidate], pool: list[Candidate]) -> None:
    rec.caveats = caveats(rec, cands)
    if rec.winner is None:
        rec.verdict = no_winner(rec, cands)
        return
    rec.verdict = " ".join([choice_sentence(rec, pool), *memory_words(rec, cands)])
    rec.tradeoffs = tradeoffs(rec.winner, rec.runner_up, rec.serving, rec.distinct) if rec.runner_up else []
    rec.command = rec.winner.command
