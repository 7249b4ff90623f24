"""A run's results as `llmopt recommend` sees them: the configurations someone can deploy
(candidates), each with its figures read once, its quality verdict judged once and its
capacity's standing, and the results that are reference points only.

A candidate is a configuration someone can serve: a result measured through a server under an
SLO (vllm-serve, tune's results, an OpenAI endpoint), or, in a run that served none, vLLM's
offline engine measured as one configuration on the run's fixed workload (vllm, vllm-fp8,
awq-int4: their engine settings are what `vllm serve` takes). Where the run served
configurations under an SLO, the answer rests on those alone: the offline engine beside them is
what the server adds, and whether it meets the SLO is not measured. transformers' `generate`
(hf-fp16, bitsandbytes, compiled, the attention variants) and the comparisons on a workload of
their own (continuous batching against static batching, vLLM's attention backends) are
reference points: shown as such, never deployed.
Read from StageFacts, LoadInfo, QualityRecord and the metrics alone (no stage's extra, no name).

A capacity is offered as what a configuration carries only when it was held in steady state
(load/capacity/hold.py) and lies at or under the server's ceiling, the highest completion rate
it measured: an arrival rate above what the server completes cannot be sustained, whatever a
short trial's latencies said (results/h200-20261204: ~125 req/s "met" at FP16 while its server
completed 50 a second, 229 of its 236 requests still in flight when the window closed). Runs
from before the saturation check recorded no ceiling: it is estimated from their load points
(`served_rps`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from llmopt_bench.analysis.figures import stage_figure
from llmopt_bench.analysis.recommend.rejudge import rejudge
from llmopt_bench.analysis.scaling import batch1_tpot, saturated
from llmopt_bench.core.fmt import num
from llmopt_bench.core.records import SLOPoint, StageFacts
from llmopt_bench.core.results import StageResult, peak_memory
from llmopt_bench.core.slo import SLO

# a capacity's standing: only HELD is offered as what the configuration carries
HELD = "held"
NOT_HELD = "not held"
ABOVE_CEILING = "above the ceiling"
NONE_MET = "no measured rate met the SLO"
NOT_MEASURED = "not measured"  # the offline engine: no server, no SLO

SATURATION_HOW = "the highest completion rate the stage measured"
ESTIMATED_HOW = "estimated from its load points' output rates: the run is from before the saturation check"


@dataclass
class Candidate:
    name: str
    served: bool  # measured through a server under an SLO; False: vLLM's offline engine on the fixed workload
    command: str | None = None  # the `vllm serve` line that reproduces it
    capacity_rps: float | None = None  # the highest rate that met the SLO, as the stage (or the re-judge) found it
    capacity_status: str = NOT_MEASURED  # HELD, NOT_HELD, ABOVE_CEILING, NONE_MET, NOT_MEASURED
    held: bool | None = None  # the capacity held for a longer window (load/capacity/hold.py)
    interval: list[float | None] | None = None  # [capacity, the first failing rate (or the ceiling) above it]
    known_within: float | None = None  # the precision reached: the interval's upper end / the capacity - 1
    goodput_rps: float | None = None
    ceiling_rps: float | None = None  # the highest completion rate the server was measured at
    ceiling_how: str | None = None
    deployable_rps: float | None = None  # the capacity, where it is offered (HELD); else None
    gpu_s_per_request: float | None = None  # devices / the deployable capacity: the cost priority's figure
    meets: bool = False  # some measured rate met the SLO (always True for the offline engine: it has none)
    miss: str | None = None  # how the nearest point misses, in words
    miss_ratio: float | None = None  # its worst value / limit
    batch1_tpot_s: float | None = None
    batch1_ttft_s: float | None = None
    saturated_tok_s: float | None = None
    saturated_how: str | None = None
    weights_bytes: float | None = None
    peak_bytes: float | None = None
    memory_share: float | None = None  # the card's share an engine takes whatever its weights (vLLM's gpu_memory_utilization)
    j_per_token: float | None = None
    devices: int | None = None
    quality: str = "not measured"  # passes | regression | not judged (...) | not measured: judged once, for every priority
    perplexity: float | None = None  # where the gate judged it (real weights)
    token_match_rate: float | None = None  # likewise: on random weights a token match judges nothing
    notes: list[str] = field(default_factory=list)


@dataclass
class Reference:
    """A result that is not a configuration to deploy, and why."""

    name: str
    why: str


OFFLINE_BESIDE_SERVED = "vLLM's offline engine, beside the served configurations: not served under the SLO"


def reference_why(s: StageResult, serving: bool) -> str | None:
    """None where `s` is a configuration someone can serve; else why it is a reference point.
    `serving`: the run served some configuration under an SLO."""
    f = s.facts
    if f.slo is not None or f.serve_command:
        return None
    engine = (s.load.implementation if s.load else {}).get("engine")
    if s.own_workload:
        return "a comparison on a workload of its own, not one configuration"
    if engine == "vllm":
        return OFFLINE_BESIDE_SERVED if serving else None
    if engine == "transformers":
        return "transformers generate, not a server"
    return f"{engine or 'an engine'} that is not served"


def quality_verdict(s: StageResult) -> tuple[str, list[str]]:
    """The quality gate's verdict on a result, the same under every priority: passes,
    regression, or not judged (random weights, or why not) / not measured."""
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
        return f"not judged ({(q.perplexity_note or 'no meaningful perplexity').split(':')[0]})", []
    return f"not judged ({(q.gate or 'no perplexity').removeprefix('not applied: ')})", []


def candidate(s: StageResult, batch_size: int, rejudge_with: SLO | None = None) -> Candidate:
    """A deployable result's figures, read once; a served one's capacity under its SLO, or under
    `rejudge_with`, judged again from its measured points, with its standing."""
    f = s.facts
    quality, notes = quality_verdict(s)
    judged = quality in ("passes", "regression")
    weights = s.load.weights_bytes if s.load else None
    sat, how = saturated(s)
    peak, source = peak_memory(s)
    if f.slo is not None and source == "host RSS peak":  # a served stage's own process is the client, not the server
        peak = None
    ttft = f.batch1_ttft_s or (stage_figure(s, "ttft_p50").recorded  # the figure the tables show (analysis/figures.py)
                               if batch_size == 1 and not s.own_workload and s.metrics and s.metrics.ttft_s else None)
    c = Candidate(name=s.name, served=f.slo is not None, command=f.serve_command, batch1_tpot_s=batch1_tpot(s, batch_size),
                  batch1_ttft_s=ttft, saturated_tok_s=sat, saturated_how=how, weights_bytes=float(weights) if weights else None,
                  peak_bytes=peak, j_per_token=s.energy.joules_per_output_token if s.energy else None, devices=f.devices,
                  quality=quality, perplexity=s.quality.perplexity if judged and s.quality else None,
                  token_match_rate=s.quality.token_match_rate if judged and s.quality else None, notes=notes,
                  memory_share=s.params.get("gpu_memory_utilization"), meets=f.slo is None)
    if f.slo is not None:
        _capacity(c, f, rejudge_with)
    return c


def _capacity(c: Candidate, f: StageFacts, rejudge_with: SLO | None) -> None:
    mfr = f.slo_max_failure_rate if f.slo_max_failure_rate is not None else 0.01
    assert f.slo is not None
    judged = rejudge(f.slo_points, rejudge_with or f.slo, mfr)
    if rejudge_with is None and f.slo_capacity_rps is not None:  # the stage's own search: its interval is the tighter one
        c.capacity_rps, c.interval, c.goodput_rps, c.held = f.slo_capacity_rps, f.slo_capacity_interval, f.goodput_rps, f.slo_capacity_held
    else:
        c.capacity_rps, c.interval, c.goodput_rps, c.held = judged.capacity_rps, judged.interval, judged.goodput_rps, judged.held
        c.notes += judged.notes
    c.known_within = known_within(c, f.slo_capacity_known_within if rejudge_with is None else None)
    c.meets = c.capacity_rps is not None
    c.ceiling_rps, c.ceiling_how = ceiling(f)
    c.capacity_status = standing(c.capacity_rps, c.held, c.ceiling_rps)
    if c.capacity_status == HELD:
        c.deployable_rps = c.capacity_rps
        c.gpu_s_per_request = (c.devices or 1) / c.capacity_rps if c.capacity_rps else None
    near = judged.closest_miss()
    if not c.meets and near is not None and near.worst is not None:
        c.miss_ratio, c.miss = near.worst, f"at {num(near.rate_rps)} req/s, {near.reason}"


def standing(capacity: float | None, held: bool | None, ceiling_rps: float | None) -> str:
    """Whether a capacity is offered: held, and not above what the server was measured to complete."""
    if capacity is None:
        return NONE_MET
    if ceiling_rps is not None and capacity > ceiling_rps:
        return ABOVE_CEILING
    return HELD if held else NOT_HELD


def known_within(c: Candidate, recorded: float | None) -> float | None:
    """The precision a capacity is known to: the stage's own (its search's untrusted trials
    taken into account), else the interval's upper end over the capacity, less 1 (runs from
    before issue 34 and capacities judged again under another SLO)."""
    if recorded is not None:
        return recorded
    hi = c.interval[1] if c.interval and len(c.interval) > 1 else None
    return hi / c.capacity_rps - 1 if hi and c.capacity_rps else None


def ceiling(f: StageFacts) -> tuple[float | None, str | None]:
    """The highest completion rate the server was measured at: the stage's saturation check,
    else (older runs) the highest of its load points' served rates."""
    if f.saturation_rps:
        return f.saturation_rps, SATURATION_HOW
    rates = [r for p in f.slo_points if (r := served_rps(p))]
    return (max(rates), ESTIMATED_HOW) if rates else (None, None)


def served_rps(p: SLOPoint) -> float | None:
    """Requests a second the server answered at a load point: its output tokens a second over
    its window, over its requests' mean output length (each (E2E - TTFT) / TPOT + 1, TPOT's
    definition turned round; a one-token answer has no TPOT and counts 1)."""
    if not p.output_tok_s or not p.e2e_s:
        return None
    lengths = []
    for i, e2e in enumerate(p.e2e_s):
        tpot = p.tpot_s[i] if i < len(p.tpot_s) else None
        ttft = p.ttft_s[i] if i < len(p.ttft_s) else None
        lengths.append((e2e - ttft) / tpot + 1 if tpot and ttft is not None else 1.0)
    return p.output_tok_s / (sum(lengths) / len(lengths))
