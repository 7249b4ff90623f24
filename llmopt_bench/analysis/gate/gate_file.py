"""A baseline's gate file: for each stage and figure judged on its repeats (TTFT, TPOT and E2E p50,
output tok/s), gated at the threshold its measured noise supports, or watched, with the
arithmetic that decided it (docs/regression.md, "A gate that can pass"). It sits beside the baseline
(`results/baselines/<gpu>-<model>.gate.toml` beside `<gpu>-<model>.json`) and `llmopt compare`
reads it there.

Why: compare passes a gated figure only when its interval lies wholly within the threshold. A
figure whose repeats spread by more than the threshold allows (H200 hf-fp16's TPOT: 21.3 / 32.7
/ 24.0 ms) then fails every night, the baseline against its own run included, and a gate that
is never green gets switched off. So each figure's threshold is chosen, once and in review, from
its noise, with the interval compare computes:

- sigma: the spread of log(the figure) between repeats, pooled over the baseline and the other
  runs given with its device, model, workload and stage params (their repeats' variance weighted
  by degrees of freedom), and the spread of whole runs beyond what their repeats explain (where
  two runs or more say it); R_b the baseline's repeats, R_n what the nightly's stopping rule
  takes of such a stage (its minimum to maximum, within its target and time budget: a stage
  measuring its own workload keeps its own count);
- DRAWS pairs of runs of the same code are simulated from that noise and put through compare's
  own interval (each side's repeats' variance over R, t on Welch's degrees of freedom: with 2
  repeats a side it is t on ~1-2 df, whose tail no closed form with a typical SE shows);
- the threshold is the class's default (5% for a GPU-bound stage, 10% for a host-bound one), raised
  to where those pairs settle (their interval wholly within +-T) in all but ALARM (0.3%: ~20 gated
  figures a night leave a nightly of the same code green ~94% of the time);
- at that threshold, where a slowdown of what the gate must catch (10% GPU-bound, 20% host-bound:
  issue 46) moved onto the same pairs regresses in at least 90% of them, the figure is **gated**
  at T; otherwise it is **watched**: judged at the least threshold (the default at least) where
  pairs of the same code regress in at most ALARM, so that a regression of it still exits 5, its
  inconclusive verdict does not fail, and `llmopt history check` watches it across nights.

Pure functions over RunResult; numpy is imported inside (through noise)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import tomllib

from llmopt_bench.analysis import hostbound
from llmopt_bench.analysis.gate import noise
from llmopt_bench.analysis.gate.compare import mismatches, noise_groups
from llmopt_bench.analysis.gate.host_signals import kept_repeats
from llmopt_bench.analysis.gate.judge import METRICS, SAMPLE_COLUMNS
from llmopt_bench.core.errors import UsageError
from llmopt_bench.core.results import RunResult, StageResult

SUFFIX = ".gate.toml"
# the figures judged on their repeats' noise (peak memory on its value, load on its one value a run)
NOISY = tuple(k for k in METRICS if k in SAMPLE_COLUMNS or k == "output_tok_s")
MAX_THRESHOLD = 9.99  # a gate file's thresholds stay under 1000% (a noisier figure is judged there)
CLASS_THRESHOLD = {True: 0.10, False: 0.05}  # host-bound / GPU-bound (compare's defaults)
MUST_CATCH = {True: 0.20, False: 0.10}  # the slowdown the gate must catch 90% of the time (issue 46)
ALARM = 0.003  # pairs of the same code left unsettled (or regressed): ~20 gated figures a night, 1 - 20 x 0.3% ~ 94% green
CATCH = 0.90  # the share of slowdowns of MUST_CATCH a gated figure must catch
CONFIDENCE = 0.95  # compare's default interval
DRAWS = 20_000  # simulated pairs a figure (seeded: the same runs give the same file)
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
        raise UsageError(f"gate file not found: {path}", "pass a baseline's .gate.toml (scripts/gate/gate-file.py makes one), "
                                                         "or drop --gate-file") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"{path}: not valid TOML ({e})", "regenerate it: scripts/gate/gate-file.py") from None
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
            raise UsageError(f"{where} needs exactly {', '.join(FIELDS)}", "regenerate it: scripts/gate/gate-file.py")
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
    """A figure's spread in log space: between repeats, pooled over runs, and between whole runs
    beyond what their repeats explain (0 where fewer than two runs, or none beyond)."""
    var: float
    df: int
    repeats: int  # in all
    runs: int
    run_var: float = 0.0


def pooled_spread(stages: Sequence[StageResult], key: str) -> Spread | None:
    """The variance of log(one repeat's figure), pooled over the stages' runs by degrees of
    freedom (each stage's disturbed repeats set aside first, as compare does), and the variance
    of the runs' own values (their mean log) beyond the part their repeats make."""
    runs = [[math.log(v) for v in noise.repeat_values(*noise_groups(kept_repeats(st)[0], key))] for st in stages]
    runs = [logs for logs in runs if len(logs) >= 2]
    df = sum(len(logs) - 1 for logs in runs)
    if not df:
        return None
    means = [sum(logs) / len(logs) for logs in runs]
    var = sum((x - m) ** 2 for logs, m in zip(runs, means) for x in logs) / df
    run_var = 0.0
    if len(means) >= 2:
        centre = sum(means) / len(means)
        between = sum((m - centre) ** 2 for m in means) / (len(means) - 1)
        run_var = max(0.0, between - sum(var / len(logs) for logs in runs) / len(runs))
    return Spread(var, df, sum(len(logs) for logs in runs), len(runs), run_var)


@dataclass(frozen=True)
class Pairs:
    """Simulated pairs of runs of the same code: each one's log(ratio) estimate and its interval's
    half-width, as compare computes them (noise.combine: each side's repeats' variance over R,
    t on Welch's degrees of freedom)."""
    change: object  # numpy arrays
    half: object


def simulate(spread: Spread, r_base: int, r_new: int, draws: int = DRAWS, seed: int = 0) -> Pairs:
    """`draws` pairs: R_b and R_n repeats of log-normal noise (the repeats' sigma), the new run's
    whole level moved by the runs' own spread (both runs': twice its variance)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    sigma = math.sqrt(spread.var)
    b = rng.normal(0.0, sigma, size=(draws, r_base))
    n = rng.normal(0.0, sigma, size=(draws, r_new)) + rng.normal(0.0, math.sqrt(2 * spread.run_var), size=(draws, 1))
    vb, vn = b.var(axis=1, ddof=1) / r_base, n.var(axis=1, ddof=1) / r_new
    var = vb + vn
    with np.errstate(divide="ignore", invalid="ignore"):
        df = var ** 2 / (vb ** 2 / (r_base - 1) + vn ** 2 / (r_new - 1))
    grid = np.arange(1.0, 60.0, 0.05)  # t by df, interpolated (compare takes it at df rounded to 0.01)
    t_at = np.array([noise.t_quantile(0.5 + CONFIDENCE / 2, float(round(d, 2))) for d in grid])
    t = np.interp(np.nan_to_num(df, nan=60.0), grid, t_at, left=t_at[0], right=t_at[-1])
    return Pairs(n.mean(axis=1) - b.mean(axis=1), t * np.sqrt(var))


def shares(pairs: Pairs, shift: float, higher_is_better: bool):
    """Per simulated pair, the new run's level moved by `shift` in log space in the bad direction
    (0: runs of the same code): the least threshold its interval lies wholly within, and the
    threshold below which it regresses (numpy arrays)."""
    import numpy as np

    d = pairs.change + (-shift if higher_is_better else shift)  # type: ignore[operator]
    lo, hi = d - pairs.half, d + pairs.half  # type: ignore[operator]
    within = np.maximum(np.exp(hi) - 1, 1 - np.exp(lo))
    regresses_below = 1 - np.exp(hi) if higher_is_better else np.exp(lo) - 1
    return within, regresses_below


def at_least(values, share: float, floor: float) -> float:
    """The least threshold (to 0.1%, at least `floor`) that `share` of the values stay under."""
    import numpy as np

    return min(MAX_THRESHOLD, max(floor, math.ceil(float(np.quantile(values, share)) * 1000) / 1000))


def pct(x: float) -> str:
    return f"{x * 100:.3g}%"


def decide(stage: str, key: str, spread: Spread | None, r_base: int, r_new: int, host_bound: bool) -> Entry:
    """One figure's entry from its spread and the repeats a side (the module's docstring)."""
    floor, must = CLASS_THRESHOLD[host_bound], MUST_CATCH[host_bound]
    kind = "host-bound" if host_bound else "GPU-bound"
    if spread is None or r_base < 2 or r_new < 2:
        return Entry(stage, key, "watched", floor, f"{kind}; one repeat a run: no interval can settle it")
    better = METRICS[key].higher_is_better
    pairs = simulate(spread, r_base, r_new)
    within, false_below = shares(pairs, 0.0, better)
    settles = at_least(within, 1 - ALARM, floor)  # pairs of the same code settled in all but ALARM
    caught = float((shares(pairs, math.log(1 + must), better)[1] > settles).mean()) if settles < 1 else 0.0
    gated = caught >= CATCH
    # watched: judged where pairs of the same code regress in at most ALARM (a regression still exits 5)
    threshold = settles if gated else at_least(false_below, 1 - ALARM, floor)
    why = (f"{kind}: sigma {pct(math.sqrt(spread.var))} a repeat ({spread.repeats} repeats in {spread.runs} run(s), "
           f"{spread.df} df), whole runs {pct(math.sqrt(spread.run_var))} beyond it; {r_base} repeats vs {r_new}; "
           f"{DRAWS} pairs simulated with compare's interval: pairs of the same code settle in {1 - ALARM:.1%} from "
           f"{pct(settles)}" + (f" (the {pct(floor)} default)" if settles == floor else "")
           + f", where a {pct(must)} slowdown is caught in {caught:.1%}"
           + (f": gated at {pct(threshold)}" if gated else
              f" (under {CATCH:.0%}): watched, judged at {pct(threshold)}, where pairs of the same code regress in at "
              f"most {ALARM:.1%} (a regression still exits 5)")
           + ("" if METRICS[key].gated else f"; {key} is watched unless compare's --gate names it"))
    return Entry(stage, key, "gated" if gated else "watched", threshold, why)


def repeat_seconds(stage: StageResult) -> float | None:
    """A repeat's time, on average: its output tokens over its windowed tok/s."""
    s, m = stage.samples, stage.metrics
    rates = m.output_tok_s_repeats if m else []
    if not s or not rates:
        return None
    reps = sorted(set(s.repeat))
    secs = [sum(t for t, r in zip(s.output_tokens, s.repeat) if r == rep) / rate
            for rep, rate in zip(reps, rates) if rate and rate > 0]
    return sum(secs) / len(secs) if secs else None


def nightly_repeats(stage: StageResult, spreads: Sequence[Spread | None], preset: Mapping[str, float]) -> int:
    """The repeats a nightly's stopping rule (analysis/stopping.py) would take of a fixed-workload
    stage with these spreads, at the preset's minimum, maximum, target and time budget: the first
    count whose every figure's expected half-width is within the target, within the budget."""
    low, high = int(preset["repeats"]), int(preset.get("max_repeats") or preset["repeats"])
    target, budget, secs = float(preset.get("stop_within") or 0) / 100, preset.get("repeat_budget_s"), repeat_seconds(stage)
    if budget and secs:
        high = max(low, min(high, int(budget // secs)))
    for r in range(max(low, 2), high + 1):
        t = noise.t_quantile(0.5 + CONFIDENCE / 2, r - 1)
        if all(math.exp(t * math.sqrt(sp.var / r)) - 1 <= target for sp in spreads if sp is not None):
            return r
    return high


def derive(baseline: RunResult, others: Sequence[RunResult] = (), preset: Mapping[str, float] | None = None) -> list[Entry]:
    """Every ok stage's noisy gated figures of `baseline`, their spread pooled with the same stage
    (same params) of `others` that compare would compare (same device, model and workload);
    `preset`: the nightly's stopping rule (its [preset_workload] table), which sets the repeats of
    a fixed-workload stage's new run (a stage measuring its own workload, or no preset: as many
    as the baseline's)."""
    like = [r for r in others if not mismatches(baseline, r)]
    out = []
    for stage in baseline.stages:
        if stage.status != "ok" or not stage.samples:
            continue
        same = [stage] + [s for r in like if (s := r.stage(stage.name)) is not None and s.status == "ok"
                          and s.params == stage.params and s.samples]
        spreads = {key: pooled_spread(same, key) for key in NOISY}
        r_base = repeats_of(stage)
        rule_sees = [sp for key, sp in spreads.items() if METRICS[key].gated]  # the stopping rule's figures
        r_new = r_base if stage.own_workload or preset is None else nightly_repeats(stage, rule_sees, preset)
        bound = bool(hostbound.host_bound(stage, baseline).host_bound)
        out += [decide(stage.name, key, spreads[key], r_base, r_new, bound) for key in NOISY]
    return out


def repeats_of(stage: StageResult) -> int:
    """The repeats of a stage that compare judges (the host's disturbed ones set aside)."""
    kept = kept_repeats(stage)[0]
    return len(set(kept.samples.repeat)) if kept.samples else 0


def to_toml(baseline_name: str, entries: Sequence[Entry], made_from: Sequence[str], preset: str) -> str:
    """The gate file's text: a header that says how it was made, then one [[figure]] per entry."""
    def q(s: str) -> str:
        return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'

    lines = [
        "# What `llmopt compare` gates for this baseline, figure by figure: gated at the threshold its measured",
        "# noise supports, or watched (judged, a regression still exits 5, an inconclusive verdict does not fail).",
        "# Made by scripts/gate/gate-file.py from the runs below (llmopt_bench/analysis/gate/gate_file.py has the rule;",
        "# docs/regression.md, \"A gate that can pass\"). Regenerate it with the baseline; do not edit by hand.",
        f"# made from: {', '.join(made_from)}; the nightly's repeats: {preset}",
        f"baseline = {q(baseline_name)}",
        "",
    ]
    for e in entries:
        lines += ["[[figure]]", f"stage = {q(e.stage)}", f"metric = {q(e.metric)}", f"decision = {q(e.decision)}",
                  f"max_regression = {e.max_regression:g}", f"why = {q(e.why)}", ""]
    return "\n".join(lines)
