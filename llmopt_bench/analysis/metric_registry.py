"""Every figure llmopt names, once: its key (the one name from run.json to the CSV), where a
stage's result records it, the unit it is shown in and the scale from the recorded one, which
way is better, its label, the other names users type for it, its column in stages.csv and
report.json, and whether compare judges it and gates on it.

judge and compare (analysis/), the history (run/history.py), the renderers (render/) and the
exports read it; tests/unit/test_metric_registry.py checks that every metric name they print is
here and that no figure has two entries. Pure data over core.results; nothing above is imported.
A figure's one statistic over repeats, what every output shows, is analysis/figures.py's."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, overload

from llmopt_bench.core.results import StageResult, peak_memory


@dataclass(frozen=True)
class Metric:
    key: str
    label: str  # how a table or a sentence names it: "TTFT p50"
    unit: str  # the unit it is shown in: ms, s, tok/s, req/s, GB, or "" (a count, a ratio)
    # shown = recorded * scale (run.json keeps seconds and bytes); a scale below 1 is applied as a
    # division by its whole inverse (bytes / 1e9), as these figures were always computed, so the
    # CSV keeps its digits
    scale: float
    figure: str  # where a StageResult records it: "metrics.ttft_s.p50", "load_s", "peak_memory", ...
    higher_is_better: bool = False
    aliases: tuple[str, ...] = ()  # other names users type for it (--metric, --max-regression, --gate)
    csv: str | None = None  # its column in stages.csv and report.json's stage rows (documented names)
    column: str | None = None  # its head in the report's stage table where label and unit are too wide
    judged: bool = False  # compare judges it stage by stage (analysis/gate/judge.py)
    gated: bool = False  # an inconclusive verdict of it fails a comparison by default (compare --gate)
    # a value that moves between runs of the same code (load: 4.2-11.7 s over 12 CPU runs, 79 vs
    # 110 s in two H200 sessions; a latency by whole-run shifts) is judged only with an interval
    # that holds that noise; peak memory, the same from run to run, is judged on its value alone
    needs_noise: bool = True

    @property
    def names(self) -> tuple[str, ...]:
        """Every name that means this figure: the key, the aliases, the CSV column."""
        return (self.key, *self.aliases, *(n for n in (self.csv, self.column) if n))

    @property
    def header(self) -> str:
        """The report's column head: the label and the unit ("TTFT p50 ms"), or its short column."""
        return self.column or f"{self.label} {self.unit}".strip()

    def value(self, stage: StageResult) -> float | None:
        """The figure as the stage's result records it (seconds, bytes, tok/s)."""
        if self.figure == "peak_memory":
            obj: Any = peak_memory(stage)[0]  # the report's value and source order
        else:
            obj = stage
            for part in self.figure.split("."):
                obj = getattr(obj, part, None) if obj is not None else None
        return (obj or None) if self.unit == "GB" else obj  # 0 bytes: not recorded

    @overload
    def shown(self, recorded: float) -> float: ...
    @overload
    def shown(self, recorded: float | None) -> float | None: ...

    def shown(self, recorded: float | None) -> float | None:
        """A recorded value in the unit it is shown in."""
        if recorded is None or self.scale == 1:
            return recorded  # a count stays a whole number
        return recorded * self.scale if self.scale >= 1 else recorded / round(1 / self.scale)

    @property
    def distribution(self) -> str | None:
        """The per-request samples column behind a latency's p50 ("ttft_s"), else None."""
        parts = self.figure.split(".")
        return parts[1] if len(parts) == 3 and parts[0] == "metrics" and parts[2] == "p50" else None


def _latencies() -> Iterator[Metric]:
    """Each latency distribution's statistics, as the history stores them (ttft_p90, itl_mean)."""
    units = {"ttft": ("ms", 1e3), "tpot": ("ms", 1e3), "itl": ("ms", 1e3), "e2e": ("s", 1.0)}
    for name, (unit, scale) in units.items():
        for stat in ("p50", "p90", "p99", "mean"):
            key = f"{name}_{stat}"
            aliases = [f"{name}_s.{stat}"] + ([name] if stat == "p50" else [])
            csv = f"{key}_{unit}" if (name, stat) in (("ttft", "p50"), ("ttft", "p99"), ("tpot", "p50"), ("tpot", "p99"),
                                                       ("e2e", "p50")) else None
            judged = stat == "p50" and name != "itl"
            yield Metric(key, f"{name.upper()} {stat}", unit, scale, f"metrics.{name}_s.{stat}", aliases=tuple(aliases),
                         csv=csv, judged=judged, gated=judged and name != "ttft")


REGISTRY: dict[str, Metric] = {m.key: m for m in (
    *_latencies(),
    Metric("output_tok_s", "output tok/s", "tok/s", 1.0, "metrics.output_tok_s", higher_is_better=True,
           aliases=("tok_s", "throughput", "tok/s"), csv="output_tok_s", column="out tok/s", judged=True, gated=True),
    Metric("load_s", "load", "s", 1.0, "load_s", aliases=("load",), csv="load_s", judged=True),
    Metric("peak_memory", "peak memory", "GB", 1e-9, "peak_memory", aliases=("memory", "mem", "peak_mem"),
           csv="peak_mem_gb", column="peak mem GB", judged=True, gated=True, needs_noise=False),
    Metric("qps", "QPS", "req/s", 1.0, "metrics.qps", higher_is_better=True, csv="qps", column="QPS"),
    Metric("requests", "requests", "", 1.0, "metrics.requests", higher_is_better=True, csv="requests", column="n"),
    Metric("weights_memory", "weights", "GB", 1e-9, "load.weights_bytes", aliases=("weights",), csv="weights_gb"),
    Metric("token_match_rate", "token match", "", 1.0, "quality.token_match_rate", higher_is_better=True,
           csv="token_match_rate"),
    Metric("kl_mean", "KL mean", "", 1.0, "quality.kl_mean", csv="kl_mean"),
    Metric("perplexity", "perplexity", "", 1.0, "quality.perplexity", csv="perplexity"),
    Metric("j_per_token", "energy per output token", "J/token", 1.0, "energy.joules_per_output_token",
           aliases=("energy", "joules_per_output_token")),
    Metric("capacity_rps", "capacity under the SLO", "req/s", 1.0, "facts.slo_capacity_rps", higher_is_better=True,
           aliases=("capacity", "slo_capacity_rps")),
)}

# every name a user may type for a figure -> its key (a name of two figures is a bug the test catches)
_BY_NAME: dict[str, str] = {name.lower(): m.key for m in REGISTRY.values() for name in m.names}


def lookup(name: str) -> Metric | None:
    """The metric a typed name means ("tpot", "TTFT_p50_ms", "ttft_s.p50", "peak-mem"), else None."""
    key = _BY_NAME.get(name.strip().lower().replace("-", "_")) or _BY_NAME.get(name.strip().lower())
    return REGISTRY[key] if key else None


def judged() -> dict[str, Metric]:
    """The metrics compare judges, in the order its table shows them (the registry's)."""
    return {k: m for k, m in REGISTRY.items() if m.judged}
