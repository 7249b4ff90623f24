"""A baseline's gate file: for each stage and noisy gated figure (TPOT p50, E2E p50, output tok/s),
gated at the threshold its measured noise supports, or watched, with the arithmetic that decided
it (docs/regression.md, "A gate that can pass"). It sits beside the baseline
(`results/baselines/<gpu>-<model>.gate.toml` beside `<gpu>-<model>.json`) and `llmopt compare`
reads it there.

Why: compare passes a gated figure only when its interval lies wholly within the threshold. A
figure whose repeats spread by more than the threshold allows (H200 hf-fp16's TPOT: 21.3 / 32.7
/ 24.0 ms) then fails every night, the baseline against its own run included, and a gate that
is never green gets switched off. So each figure's threshold is chosen, once and in review, from
its noise, with the same interval compare computes:

- sigma: the spread of log(the figure) between repeats, pooled over the baseline and the other
  runs given with its device, model, workload and stage params (their repeats' variance
  weighted by degrees of freedom); SE = sigma x sqrt(1/R_b + 1/R_n), R_b the baseline's repeats,
  R_n the fewest a nightly takes (the stopping rule's minimum for a fixed-workload stage, the
  stage's own count for one that measures its own workload); t on Welch's degrees of freedom;
- a pair of runs of the same code settles (its interval wholly within +-T) in all but
  ~0.3% of pairs when ln(1 + T) >= (t + 3) x SE: the threshold is the class's default (5% for a
  GPU-bound stage, 10% for a host-bound one), raised to that where the noise needs more: ~20
  gated figures a night then leave a nightly of the same code green ~95% of the time;
- at that threshold a slowdown is caught 90% of the time from (1 + T) x exp((t + z0.9) x SE) - 1;
  where that is no more than what the gate must catch (10% GPU-bound, 20% host-bound: issue 46),
  the figure is **gated** at T; otherwise it is **watched**: judged at the class's threshold, a
  regression of it still exits 5, its inconclusive verdict does not fail, and `llmopt history
  check` watches it across nights.

Pure functions over RunResult; numpy is imported inside (through noise)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist

import tomllib

from llmopt_bench.analysis import hostbound
from llmopt_bench.analysis.gate import noise
from llmopt_bench.analysis.gate.compare import mismatches, noise_groups
from llmopt_bench.analysis.gate.host_signals import kept_repeats
from llmopt_bench.analysis.gate.judge import METRICS
from llmopt_bench.core.errors import UsageError
from llmopt_bench.core.results import RunResult, StageResult

SUFFIX = ".gate.toml"
# the figures whose noise decides (peak memory is judged on its value: no noise to weigh)
NOISY = tuple(k for k, m in METRICS.items() if m.gated and m.needs_noise)
CLASS_THRESHOLD = {True: 0.10, False: 0.05}  # host-bound / GPU-bound (compare's defaults)
MUST_CATCH = {True: 0.20, False: 0.10}  # the slowdown the gate must catch 90% of the time (issue 46)
Z_SETTLE = 3.0  # a pair of the same code unsettled in ~0.3% of pairs: 1 - 20 x 0.27% ~ 95% green nights
Z_CATCH = NormalDist().inv_cdf(0.9)
CONFIDENCE = 0.95  # compare's default interval
DECISIONS = ("gated", "watched")
FIELDS = ("stage", "metric", "decision", "max_regression", "why")


@dataclass(frozen=True)
class Entry:
    stage: str
    metric: str  # a judged metric's key (tpot_p50, e2e_p50, output_tok_s)
    decision: str  # gated | watched
    max_regression: float  # gated: the threshold the noise supports; watched: the class's, a regression still exits 5
    why: str  # the arithmetic


@dataclass(frozen=True)
class GateFile:
    baseline: str  # the baseline file's name it belongs to
    entries: tuple[Entry, ...]
    path: str = ""

    def thresholds(self) -> dict[str, float]:
        """{"stage:metric": threshold} for compare (analysis/gate/compare.threshold_for)."""
        return {f"{e.stage}:{e.metric}": e.max_regression for e in self.entries}

    def watched(self) -> set[tuple[str, str]]:
        return {(e.stage, e.metric) for e in self.entries if e.decision == "watched"}

    def merged(self, user: dict[str, float]) -> dict[str, float]:
        """compare's thresholds: the user's --max-regression, and this file's for each figure whose
        metric the user named no threshold for (a bare --max-regression PCT names them all)."""
        if "*" in user:
            return dict(user)
        return {**{k: v for k, v in self.thresholds().items() if k.split(":", 1)[1] not in user}, **user}


def beside(baseline: Path) -> Path | None:
    """The gate file of a baseline file (X.json -> X.gate.toml), where there is one."""
    baseline = Path(baseline)
    if baseline.is_dir() or baseline.suffix != ".json":
        return None
    path = baseline.with_name(baseline.stem + SUFFIX)
    return path if path.is_file() else None


def load(path: Path, baseline: Path | None = None) -> GateFile:
    """A gate file, checked; `baseline`: the file compared against, which it must name."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"gate file not found: {path}", "pass a baseline's .gate.toml (scripts/gate-file.py makes one), "
                                                         "or drop --gate-file") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"{path}: not valid TOML ({e})", "regenerate it: scripts/gate-file.py") from None
    name = data.get("baseline")
    if not isinstance(name, str) or not name:
        raise UsageError(f"{path}: no baseline = \"<file name>\"", "a gate file names the baseline whose noise it holds")
    if baseline is not None and Path(baseline).name != name:
        raise UsageError(f"{path} is the gate file of {name}, not of {Path(baseline).name}",
                         "a gate file's thresholds hold for its own baseline's noise only: pass that baseline's, or none")
    entries = []
    for i, raw in enumerate(data.get("figure", [])):
        where = f"{path}: [[figure]] #{i + 1}"
        if set(raw) != set(FIELDS):
            raise UsageError(f"{where} needs exactly {', '.join(FIELDS)}", "regenerate it: scripts/gate-file.py")
        if raw["metric"] not in NOISY or raw["decision"] not in DECISIONS:
            raise UsageError(f"{where}: metric {raw['metric']!r}, decision {raw['decision']!r}",
                             f"metric one of {', '.join(NOISY)}; decision one of {', '.join(DECISIONS)}")
        t = raw["max_regression"]
        if not isinstance(t, (int, float)) or not 0 <= t < 10:
            raise UsageError(f"{where}: max_regression {t!r}", "a fraction: 0.05 is 5%")
        entries.append(Entry(raw["stage"], raw["metric"], raw["decision"], float(t), raw["why"]))
    return GateFile(name, tuple(entries), str(path))


# ---- the arithmetic -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Spread:
    """A figure's between-repeat spread in log space, pooled over runs."""
    var: float
    df: int
    repeats: int  # in all
    runs: int


def pooled_spread(stages: Sequence[StageResult], key: str) -> Spread | None:
    """The variance of log(one repeat's figure), pooled over the stages' runs by degrees of
    freedom; each stage's disturbed repeats set aside first, as compare does."""
    ss, df, n, runs = 0.0, 0, 0, 0
    for stage in stages:
        values = noise.repeat_values(*noise_groups(kept_repeats(stage)[0], key))
        if len(values) < 2:
            continue
        logs = [math.log(v) for v in values]
        mean = sum(logs) / len(logs)
        ss += sum((x - mean) ** 2 for x in logs)
        df, n, runs = df + len(logs) - 1, n + len(logs), runs + 1
    return Spread(ss / df, df, n, runs) if df else None


def welch_df(r_base: int, r_new: int) -> float:
    """Welch-Satterthwaite's degrees of freedom for two sides of one per-repeat variance."""
    a, b = 1 / r_base, 1 / r_new
    return (a + b) ** 2 / (a * a / max(r_base - 1, 1) + b * b / max(r_new - 1, 1))


def pct(x: float) -> str:
    return f"{x * 100:.3g}%"


def decide(stage: str, key: str, spread: Spread | None, r_base: int, r_new: int, host_bound: bool) -> Entry:
    """One figure's entry from its spread and the repeats a side (the module's docstring)."""
    floor, must = CLASS_THRESHOLD[host_bound], MUST_CATCH[host_bound]
    kind = "host-bound" if host_bound else "GPU-bound"
    if spread is None or r_base < 2 or r_new < 2:
        return Entry(stage, key, "watched", floor, f"{kind}; one repeat a run: no interval can settle it")
    sigma = math.sqrt(spread.var)
    se = sigma * math.sqrt(1 / r_base + 1 / r_new)
    df = welch_df(r_base, r_new)
    t = noise.t_quantile(0.5 + CONFIDENCE / 2, round(df, 2))
    needs = math.exp((t + Z_SETTLE) * se) - 1
    threshold = max(floor, math.ceil(needs * 1000) / 1000)
    caught = (1 + threshold) * math.exp((t + Z_CATCH) * se) - 1
    gated = caught <= must
    why = (f"{kind}: sigma {pct(sigma)} a repeat ({spread.repeats} repeats in {spread.runs} run(s), {spread.df} df); "
           f"{r_base} repeats vs {r_new}: SE = sigma x sqrt(1/{r_base} + 1/{r_new}) = {pct(se)}, t({df:.1f} df) = {t:.2f}; "
           f"a pair of the same code settles from exp((t + {Z_SETTLE:g}) x SE) - 1 = {pct(needs)}"
           f"{'' if threshold > floor else f', within the {pct(floor)} default'}; "
           f"at {pct(threshold)} a slowdown is caught 90% of the time from (1 + T) x exp((t + 1.28) x SE) - 1 = {pct(caught)}, "
           + (f"within the {pct(must)} the gate must catch: gated at {pct(threshold)}" if gated else
              f"beyond the {pct(must)} the gate must catch: watched at {pct(floor)} (a regression still exits 5)"))
    return Entry(stage, key, "gated" if gated else "watched", threshold if gated else floor, why)


def derive(baseline: RunResult, others: Sequence[RunResult] = (), new_repeats: int = 2) -> list[Entry]:
    """Every ok stage's noisy gated figures of `baseline`, their spread pooled with the same stage
    (same params) of `others` that compare would compare (same device, model and workload);
    `new_repeats`: the fewest repeats a nightly's fixed-workload stage takes (its preset's minimum)."""
    like = [r for r in others if not mismatches(baseline, r)]
    out = []
    for stage in baseline.stages:
        if stage.status != "ok" or not stage.samples:
            continue
        same = [stage] + [s for r in like if (s := r.stage(stage.name)) is not None and s.status == "ok"
                          and s.params == stage.params and s.samples]
        r_base = repeats_of(stage)
        r_new = r_base if stage.own_workload else min(r_base, new_repeats)
        bound = bool(hostbound.host_bound(stage, baseline).host_bound)
        out += [decide(stage.name, key, pooled_spread(same, key), r_base, r_new, bound) for key in NOISY]
    return out


def repeats_of(stage: StageResult) -> int:
    """The repeats of a stage that compare judges (the host's disturbed ones set aside)."""
    kept = kept_repeats(stage)[0]
    return len(set(kept.samples.repeat)) if kept.samples else 0


def to_toml(baseline_name: str, entries: Sequence[Entry], made_from: Sequence[str], new_repeats: int) -> str:
    """The gate file's text: a header that says how it was made, then one [[figure]] per entry."""
    def q(s: str) -> str:
        return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'

    lines = [
        "# What `llmopt compare` gates for this baseline, figure by figure: gated at the threshold its measured",
        "# noise supports, or watched (judged, a regression still exits 5, an inconclusive verdict does not fail).",
        "# Made by scripts/gate-file.py from the runs below (llmopt_bench/analysis/gate/gate_file.py has the rule;",
        "# docs/regression.md, \"A gate that can pass\"). Regenerate it with the baseline; do not edit by hand.",
        f"# made from: {', '.join(made_from)}; a nightly's fixed-workload stage takes at least {new_repeats} repeats",
        f"baseline = {q(baseline_name)}",
        "",
    ]
    for e in entries:
        lines += ["[[figure]]", f"stage = {q(e.stage)}", f"metric = {q(e.metric)}", f"decision = {q(e.decision)}",
                  f"max_regression = {e.max_regression:g}", f"why = {q(e.why)}", ""]
    return "\n".join(lines)
