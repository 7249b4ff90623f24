#!/usr/bin/env python3
"""Calibrate `llmopt compare`'s regression gate on real runs: how often it flags a pair of runs
of the same code (false alarms) and how often it flags a slowdown (detection). The figures in
docs/regression.md ("Calibration") come from it.

**Real pairs at the nightly preset** (`--real-pairs DIR`, issue 33; the runs of
scripts/gate/gate-pairs.sh): rounds of independent runs of one stage, two of the same code (A) and two
of a real slower build of known size (scripts/gate/slower_build.py: every forward pass 1.1x and 1.2x
as long), each recording 10 repeats. Each run is cut where the standard preset's stopping rule
would have stopped it (analysis/stopping.py replayed on its recorded repeats, the preset's
min/max repeats, target and time budget), then every ordered pair of two different A runs (false
alarms) and every (A, slower) pair (detection) goes through compare itself (compare_runs, the
host signals included), each counted by the exit code it gives: 5 regression, 8 the host, 9
inconclusive, 0 pass. `--statistics` sets the statistic chosen (each repeat's median, their
geometric mean, a t interval) beside the one it replaced (the pooled requests' median with a
cluster bootstrap) and shorter repeats (each repeat's requests split in two halves), on the same
real pairs at 3 repeats.

    scripts/gate/calibrate-gate.py --real-pairs results/cpu/gate-pairs --statistics --json results/cpu/gate-pairs/calibration.json

**Synthetic pairs** (the earlier calibration, kept): a pair is drawn from a pool of real repeats
and a slowdown of 1.1x, 1.2x and 1.3x is injected as a whole-run factor:

    scripts/gate/calibrate-gate.py                       # the committed runs, default repeats (3)
    scripts/gate/calibrate-gate.py --pairs 400 --json calibration.json
    scripts/gate/calibrate-gate.py --ladder 3,5,10,20    # what it takes: detection by repeats per run
    scripts/gate/calibrate-gate.py --cpu-runs 'my-runs/*/run.json'   # fresh runs of your own

Pools of repeats, each from real runs (one stage of one device):
- results/h200/run.json (the H200 journey, = results/baselines/nvidia-h200-synthetic-llama2-7b.json):
  one run, so a pair is two synthetic runs, each R repeats drawn from the stage's repeats and
  scaled by a whole-run factor exp(N(0, --run-shift)) (GPU clocks, another session);
- results/cpu/gate-calibration/run*/run.json: independent CPU runs (`llmopt bench --stages
  hf-fp16 --model synthetic:tiny --num-prompts 8 --max-new-tokens 16`, one after another on a
  shared 2-core host), so a pair is two different real runs, each R repeats drawn from its own:
  the whole-run shift between them is the real one;
- results/cpu/20261203-smollm2-quantization: one CPU run, as the H200 run.

- results/cpu/host-calibration/run*/run.json (--host-runs; scripts/gate/host-noise-runs.sh): CPU runs
  that recorded the host-speed index per repeat, half of them beside busy processes we started:
  pairs of real runs, as above, on hosts of a known and an unknown change.

A slowdown multiplies every latency of the new run (and divides its tok/s) by the factor: a
shift of the whole run, as a real regression is (the host's index is left as it was: a slower
build does not slow the host). Methods: `requests` is the gate before this change (a paired
bootstrap over requests), `repeats` the cluster bootstrap over repeats (analysis/gate/noise.py),
`history` the same with the baseline's noise from 10 earlier runs; on pools with the index,
`attribute` and `normalise` are compare's two host rules for a host-bound stage
(analysis/gate/host_verdict.py): a flag is a regression (exit 5), and how often the verdict was
"inconclusive (host)" (exit 8, not a pass) is counted apart."""

from __future__ import annotations

import argparse
import copy
import glob
import itertools
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from llmopt_bench.analysis.gate import changepoint, compare, host_verdict, noise  # noqa: E402
from llmopt_bench.analysis.hostbound import index_per_repeat  # noqa: E402
from llmopt_bench.analysis.stopping import StoppingRule  # noqa: E402
from llmopt_bench.core.distribution import Distribution  # noqa: E402
from llmopt_bench.core.results import RunResult, load_run  # noqa: E402
from llmopt_bench.run.registry import resolve_preset  # noqa: E402

FACTORS = (1.0, 1.1, 1.2, 1.3)
COLUMNS = {"ttft_p50": "ttft_s", "tpot_p50": "tpot_s", "e2e_p50": "e2e_s"}
HISTORY_RUNS = 10


@dataclass
class Pool:
    name: str
    runs: list[list[dict]]  # real runs, each a list of repeats: {column: values, "tok_s": windowed}
    run_shift: float  # sigma of the synthetic whole-run log factor (0: pairs of real runs)

    @property
    def requests(self) -> int:
        return len(self.runs[0][0]["tpot_s"])


def repeats_of(stage) -> list[dict]:
    s, reps = stage.samples, sorted(set(stage.samples.repeat))
    tok = stage.metrics.output_tok_s_repeats if stage.metrics else []
    index = index_per_repeat(stage)
    out = []
    for i, r in enumerate(reps):
        rows = [j for j, x in enumerate(s.repeat) if x == r]
        rep = {c: [getattr(s, c)[j] for j in rows if getattr(s, c)[j] is not None] for c in COLUMNS.values()}
        rep["tok_s"] = tok[i] if i < len(tok) else None
        rep["host"] = index[r] if r < len(index) else None  # the host-speed index of this repeat
        out.append(rep)
    return out


def real_runs(pattern: str) -> list:
    paths = sorted(glob.glob(str(ROOT / pattern) if not Path(pattern).is_absolute() else pattern))
    runs = [load_run(p) for p in paths]
    return [r for r in runs if r.status == "complete" and r.stage("hf-fp16") and r.stage("hf-fp16").status == "ok"]


def pools(cpu_glob: str, run_shift: float, stages: list[str] | None, host_glob: str = "") -> list[Pool]:
    out = []
    hosted = real_runs(host_glob) if host_glob else []
    if len(hosted) >= 4:
        out.append(Pool(f"CPU tiny hf-fp16 with the index ({len(hosted)} runs)", [repeats_of(r.stage("hf-fp16")) for r in hosted], 0.0))
    journey = load_run(ROOT / "results" / "h200")
    for st in journey.stages:
        if st.status == "ok" and len(set(st.samples.repeat)) >= 2 and (not stages or st.name in stages):
            out.append(Pool(f"H200 {st.name}", [repeats_of(st)], run_shift))
    fresh = real_runs(cpu_glob)
    if len(fresh) >= 4:
        out.append(Pool(f"CPU tiny hf-fp16 ({len(fresh)} runs)", [repeats_of(r.stage("hf-fp16")) for r in fresh], 0.0))
    smol = load_run(ROOT / "results" / "cpu" / "20261203-smollm2-quantization")
    for st in smol.stages:
        if st.status == "ok" and (not stages or st.name in stages):
            out.append(Pool(f"CPU smollm2 {st.name}", [repeats_of(st)], run_shift))
    return out


def draw_run(pool: Pool, repeats: int, rng, avoid: set[int]) -> tuple[int, list[dict], float]:
    """One synthetic run: a real run (another than those in `avoid` when the pool has several),
    R repeats drawn from its own with replacement, and its whole-run factor."""
    choices = [i for i in range(len(pool.runs)) if i not in avoid] or list(range(len(pool.runs)))
    i = int(rng.choice(choices))
    reps = [pool.runs[i][int(k)] for k in rng.integers(0, len(pool.runs[i]), size=repeats)]
    return i, reps, float(math.exp(rng.normal(0, pool.run_shift))) if pool.run_shift else 1.0


def inputs(reps: list[dict], factor: float, key: str, host_ref: float | None = None) -> tuple[float, list[list[float]], str]:
    """(the run's value, its groups, the statistic) as compare.noise_groups gives them; with
    host_ref, each repeat as if on a host of that speed (host_verdict.normalised)."""
    scale = [r["host"] / host_ref if host_ref else 1.0 for r in reps]
    if key == "output_tok_s":
        groups = [[r["tok_s"] / factor / k] for r, k in zip(reps, scale) if r["tok_s"]]
        return float(np.mean([g[0] for g in groups])), groups, "mean"
    groups = [[v * factor * k for v in r[COLUMNS[key]]] for r, k in zip(reps, scale)]
    return float(np.median([v for g in groups for v in g])), groups, "median"


HOST_RULES = ("attribute", "normalise")


def host_rule_verdict(a: list[dict], b: list[dict], fb: float, key: str, thr: float, rule: str, seed: int) -> str:
    """compare's verdict for a host-bound stage under `rule`, from both runs' per-repeat index."""
    if any(not r.get("host") for r in a + b):
        return "n/a"
    change = host_verdict.host_change([r["host"] for r in a], [r["host"] for r in b])
    ref = change.baseline_kops
    (bv, bg, stat), (nv, ng, _) = inputs(a, 1.0, key), inputs(b, fb, key)
    raw = compare.judge(key, bv, nv, bg, ng, stat, thr, seed=seed)
    (bv, bg, stat), (nv, ng, _) = inputs(a, 1.0, key, ref), inputs(b, fb, key, ref)
    normal = compare.judge(key, bv, nv, bg, ng, stat, thr, seed=seed)
    return host_verdict.final_verdict(raw.verdict, normal.verdict, change, rule,
                                      host_verdict.worse(raw.ratio, thr, compare.METRICS[key].higher_is_better))


def requests_verdict(b: list[list[float]], n: list[list[float]], threshold: float, seed: int) -> str:
    """The gate before this change: requests drawn (paired when the rows line up), percentile
    interval of the ratio of medians."""
    bv, nv = np.concatenate(b), np.concatenate(n)
    rng = np.random.default_rng(seed)
    bi = rng.integers(0, len(bv), size=(2000, len(bv)))
    ni = bi if len(bv) == len(nv) else rng.integers(0, len(nv), size=(2000, len(nv)))
    ratios = np.median(nv[ni], axis=1) / np.median(bv[bi], axis=1)
    lo, hi = np.percentile(ratios, [2.5, 97.5])
    return compare.change_verdict(float(np.median(nv) / np.median(bv)), (float(lo), float(hi)), threshold, False)


def one_pair(pool: Pool, key: str, repeats: int, rng, methods: list[str], seed: int) -> dict:
    """Verdicts for one A/B pair at every factor and method (common random numbers)."""
    ia, a, fa = draw_run(pool, repeats, rng, set())
    ib, b, fb = draw_run(pool, repeats, rng, {ia})
    past = [draw_run(pool, repeats, rng, {ia, ib}) for _ in range(HISTORY_RUNS - 1)] if "history" in methods else []
    thr = compare.threshold_for(key, None)
    b_val, b_groups, stat = inputs(a, fa, key)
    history = [b_val] + [inputs(r, f, key)[0] for _, r, f in past]
    out = {}
    for factor in FACTORS:
        n_val, n_groups, _ = inputs(b, fb * factor, key)
        for m in methods:
            if m in HOST_RULES:
                out[(m, factor)] = (host_rule_verdict(a, b, fb * factor, key, thr, m, seed), None)
            elif m == "requests":
                v = requests_verdict(b_groups, n_groups, thr, seed) if key != "output_tok_s" else "n/a"
                out[(m, factor)] = (v, None)
            else:
                d = compare.judge(key, b_val, n_val, b_groups, n_groups, stat, thr, seed=seed,
                                  history=history if m == "history" else ())
                out[(m, factor)] = (d.verdict, d.mde)
    return out


def calibrate(pool: Pool, key: str, repeats: int, pairs: int, methods: list[str], seed: int) -> dict:
    rng = np.random.default_rng(seed)
    flags = {(m, f): 0 for m in methods for f in FACTORS}
    host = {(m, f): 0 for m in methods for f in FACTORS}  # inconclusive (host): exit 8, not a pass
    judged = {m: 0 for m in methods}
    mdes = {m: [] for m in methods}
    for i in range(pairs):
        for (m, f), (verdict, mde) in one_pair(pool, key, repeats, rng, methods, seed + i).items():
            flags[(m, f)] += verdict == "regressed"
            host[(m, f)] += verdict == host_verdict.HOST_INCONCLUSIVE
            judged[m] += f == 1.0 and verdict != "n/a"
            if f == 1.0 and mde is not None:
                mdes[m].append(mde)
    return {m: {"false_alarm": flags[(m, 1.0)] / pairs if judged[m] else None,
                **{f"detect_{f:g}x": flags[(m, f)] / pairs if judged[m] else None for f in FACTORS[1:]},
                **{f"host_{f:g}x": host[(m, f)] / pairs if judged[m] else None for f in FACTORS},
                "median_mde": float(np.median(mdes[m])) if mdes[m] else None} for m in methods}


def noise_split(pool: Pool, key: str, seed: int) -> tuple[float, float]:
    """Where the noise of a repeat's median lives: (between repeats of a run, CV of the repeat
    medians; within a repeat, CV of its median from its own requests' scatter). Between >> within
    means the whole repeat moves: more repeats help, more requests per repeat do not."""
    rng = np.random.default_rng(seed)
    between, within = [], []
    for run in pool.runs:
        logs = [np.log(np.median(r[COLUMNS[key]])) for r in run]
        between += [x - np.mean(logs) for x in logs] if len(logs) > 1 else []
        for r in run:
            v = np.asarray(r[COLUMNS[key]])
            within.append(np.var(np.log(np.median(v[rng.integers(0, len(v), size=(500, len(v)))], axis=1))))
    reps = sum(len(run) for run in pool.runs)
    return float(np.sqrt(np.sum(np.square(between)) / max(reps - len(pool.runs), 1))), float(np.sqrt(np.mean(within)))


def series_check(pool: Pool, key: str, repeats: int, count: int, nights: int, seed: int) -> dict:
    """`llmopt history check` on `count` nightly series of `nights` runs (each run drawn as in a
    pair): how many same-code series it fails (false alarms), and how many with a 1.2x whole-run
    slowdown from night `nights - 10` on it fails, naming that night as the first."""
    rng = np.random.default_rng(seed)
    start, out = nights - 10, {"false_alarm": 0, "detected": 0, "first_night_right": 0}
    higher = key == "output_tok_s"
    for i in range(count):
        runs = [draw_run(pool, repeats, rng, set()) for _ in range(nights)]
        for label, shift in (("false_alarm", 1.0), ("detected", 1.2)):
            values = [inputs(r, f * (shift if n >= start else 1.0), key)[0] for n, (_, r, f) in enumerate(runs)]
            found = [s for s in changepoint.level_shifts(values, higher, compare.threshold_for(key, None), seed=seed + i)
                     if s.direction == "regression" and s.in_effect]
            out[label] += bool(found)
            if shift != 1.0 and found:
                out["first_night_right"] += found[0].index == start
    return {k: v / count for k, v in out.items()}


def pct(x) -> str:
    return "-" if x is None else f"{x * 100:.1f}%" if abs(x) < 0.1 else f"{x * 100:.0f}%"


def main_table(all_pools: list[Pool], args, methods: list[str], metrics: list[str], results: dict) -> None:
    print("| pool | requests/repeat | metric | method | false alarms | 1.1x | 1.2x | 1.3x | median detectable | "
          "inconclusive (host) at 1.0x / 1.2x |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for pool in all_pools:
        for key in metrics:
            cell = calibrate(pool, key, args.repeats, args.pairs, methods, args.seed)
            for m, r in cell.items():
                results["cells"].append({"pool": pool.name, "metric": key, "method": m, "repeats": args.repeats, **r})
                if r["false_alarm"] is None:
                    continue  # a host rule on a pool without the index
                print(f"| {pool.name} | {pool.requests} | {key} | {m} | {pct(r['false_alarm'])} | {pct(r['detect_1.1x'])} | "
                      f"{pct(r['detect_1.2x'])} | {pct(r['detect_1.3x'])} | {pct(r['median_mde'])} | "
                      f"{pct(r['host_1x'])} / {pct(r['host_1.2x'])} |", flush=True)


def ladder_table(all_pools: list[Pool], args, methods: list[str], metrics: list[str], results: dict) -> None:
    print("\n| pool | metric | method | repeats | false alarms | 1.2x detected | median detectable |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for pool in all_pools:
        for key in (k for k in metrics if k in COLUMNS):
            between, within = noise_split(pool, key, args.seed)
            results["ladder"].append({"pool": pool.name, "metric": key, "cv_between_repeats": between,
                                      "cv_within_repeat": within})
            print(f"| {pool.name} | {key} | noise of a repeat's median: {pct(between)} between repeats, "
                  f"{pct(within)} from its requests | | | | |")
        for key in metrics:
            for r in (int(x) for x in args.ladder.split(",")):
                cell = calibrate(pool, key, r, args.pairs, [m for m in methods if m != "requests"], args.seed)
                for m, c in ((m, c) for m, c in cell.items() if c["false_alarm"] is not None):
                    results["ladder"].append({"pool": pool.name, "metric": key, "method": m, "repeats": r, **c})
                    print(f"| {pool.name} | {key} | {m} | {r} | {pct(c['false_alarm'])} | {pct(c['detect_1.2x'])} | "
                          f"{pct(c['median_mde'])} |", flush=True)


def series_table(all_pools: list[Pool], args, metrics: list[str], results: dict) -> None:
    print("\n| pool | metric | series | false alarms | 1.2x from night N-10 flagged | ... first run named right |")
    print("| --- | --- | --- | --- | --- | --- |")
    results["series"] = []
    for pool in all_pools:
        for key in metrics:
            c = series_check(pool, key, args.repeats, args.series, args.nights, args.seed)
            results["series"].append({"pool": pool.name, "metric": key, **c})
            print(f"| {pool.name} | {key} | {args.series} x {args.nights} | {pct(c['false_alarm'])} | "
                  f"{pct(c['detected'])} | {pct(c['first_night_right'])} |", flush=True)


# ---- real pairs at the nightly preset (issue 33) ------------------------------------------------

KINDS = {"a": "same code", "x0.1": "1.1x slower build", "x0.2": "1.2x slower build"}


def real_runs_by_kind(directory: str) -> dict[str, dict[str, list[dict]]]:
    """{stage: {"a": [raw runs], "x0.1": [...], "x0.2": [...]}} from DIR/<stage>-roundN-<kind>/run.json."""
    out: dict[str, dict[str, list[dict]]] = {}
    for path in sorted(Path(directory).glob("*-round*-*/run.json")):
        stage, _, kind = path.parent.name.rpartition("-")
        stage = stage.rsplit("-round", 1)[0]
        raw = json.loads(path.read_text())
        if raw.get("status") == "complete" and raw["stages"] and raw["stages"][0]["status"] == "ok":
            out.setdefault(stage, {}).setdefault(kind.rstrip("12") if kind.startswith("a") else kind, []).append(raw)
    return out


def cut(raw: dict, k: int) -> dict:
    """The run as if it had measured its first k repeats: samples, metrics and conditions."""
    out = copy.deepcopy(raw)
    st = out["stages"][0]
    sm, m = st["samples"], st["metrics"]
    keep = [i for i, r in enumerate(sm["repeat"]) if r < k]
    st["samples"] = {c: [v[i] for i in keep] for c, v in sm.items()}
    for c in ("ttft_s", "tpot_s", "e2e_s"):
        d = Distribution.of([v for v in st["samples"][c] if v is not None])
        m[c] = d.model_dump() if d else None
    for key in ("output_tok_s_repeats", "qps_repeats", "tpot_p50_repeats_s"):
        m[key] = (m.get(key) or [])[:k]
    m["output_tok_s"] = sum(m["output_tok_s_repeats"]) / k if m["output_tok_s_repeats"] else None
    m.update(repeats=k, requests=len(keep))
    st["extra"]["conditions"] = (st["extra"].get("conditions") or [])[:k]
    out["workload"]["repeats"] = k
    return out


def nightly_repeats(raw: dict, preset: dict) -> int:
    """Where the preset's stopping rule would have stopped this run: its recorded repeats replayed
    through analysis/stopping.StoppingRule, in order."""
    st = raw["stages"][0]
    sm, tok = st["samples"], st["metrics"]["output_tok_s_repeats"]
    rule = StoppingRule(preset["repeats"], preset.get("max_repeats") or preset["repeats"], preset["stop_within"], "tpot_p50",
                        preset.get("repeat_budget_s"))
    conditions = st["extra"].get("conditions") or []
    for r in sorted(set(sm["repeat"])):
        rows = [i for i, x in enumerate(sm["repeat"]) if x == r]
        figures = {"tpot_p50": float(np.median([sm["tpot_s"][i] for i in rows])),
                   "e2e_p50": float(np.median([sm["e2e_s"][i] for i in rows])), "output_tok_s": tok[r]}
        seconds = sum(sm["output_tokens"][i] for i in rows) / tok[r]
        if rule.add_figures(figures, seconds, conditions[r] if r < len(conditions) else None):
            break
    return rule.record.repeats_run


def exit_code(cmp) -> int:
    return 5 if cmp.regressions else 6 if cmp.incomplete else 8 if cmp.host_inconclusive else 9 if cmp.inconclusive else 0


def as_stage_of(raw: dict, like: dict) -> dict:
    """A slower build's run named and configured as the stage it slows (compare pairs by name and params)."""
    out = copy.deepcopy(raw)
    out["stages"][0].update(name=like["stages"][0]["name"], params=like["stages"][0]["params"])
    return out


def real_pairs(directory: str, results: dict) -> None:
    runs = real_runs_by_kind(directory)
    cuda = any(r["env"].get("gpu") for kinds in runs.values() for rs in kinds.values() for r in rs)
    preset = resolve_preset("standard", cuda=cuda)[1]  # the nightly's rule on this device
    print(f"\nReal pairs at the standard preset's stopping rule ({preset}), every ordered pair of two runs:\n")
    print("| stage | pair | pairs | repeats a run (median, range) | TPOT change (median) | exit 5: regression | exit 8: host | "
          "exit 9: inconclusive | exit 0: pass | host still (pairs): 5 / 9 / 0 |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for stage, kinds in runs.items():
        same = kinds.get("a", [])
        for kind in ("a", "x0.1", "x0.2"):
            others = [as_stage_of(r, same[0]) for r in kinds.get(kind, [])] if kind != "a" else same
            cuts = {id(r): RunResult.model_validate(cut(r, nightly_repeats(r, preset))) for r in same + others}
            for label, with_history in (("", False), (" (history: the other A runs)", True)):
                real_pair_row(stage, kind + label, same, others, cuts, with_history, results)


def real_pair_row(stage: str, kind: str, same: list[dict], others: list[dict], cuts: dict, with_history: bool,
                  results: dict) -> None:
    """Every (A, other) pair of two different runs through compare, by exit code; with_history:
    the A runs other than the pair's as the history (the nightly keeps one), where 3 or more."""
    codes, changes = [], []
    for a in same:
        for b in others:
            if a is b:
                continue
            past = [cuts[id(r)] for r in same if r is not a and r is not b] if with_history else []
            if with_history and len(past) < 3:
                continue
            cmp = compare.compare_runs(cuts[id(a)], cuts[id(b)], history=past)
            codes.append(exit_code(cmp))
            changes.append(next(d.change for d in cmp.stages[0].metrics if d.metric == "tpot_p50"))
    if not codes:
        return
    reps = [cuts[id(r)].workload.repeats for r in others]
    rate = {c: codes.count(c) / len(codes) for c in (5, 8, 9, 0)}
    still = [c for c in codes if c != 8]  # the pairs whose host held still: what the gate judged
    calm = {c: still.count(c) / len(still) if still else None for c in (5, 9, 0)}
    name = KINDS[kind.split(" ")[0]] + kind[len(kind.split(" ")[0]):]
    results["real_pairs"].append({"stage": stage, "pair": name, "pairs": len(codes), "repeats": reps,
                                  "tpot_change_median": float(np.median(changes)), **{f"exit_{c}": v for c, v in rate.items()},
                                  "host_still": len(still), **{f"host_still_exit_{c}": v for c, v in calm.items()}})
    print(f"| {stage} | A vs {name} | {len(codes)} | {int(np.median(reps))} ({min(reps)}-{max(reps)}) | "
          f"{np.median(changes) * 100:+.1f}% | {pct(rate[5])} | {pct(rate[8])} | {pct(rate[9])} | {pct(rate[0])} | "
          f"({len(still)}): {pct(calm[5])} / {pct(calm[9])} / {pct(calm[0])} |", flush=True)


def pooled_noise(groups: list[list[float]], resamples: int = 2000, seed: int = 0) -> noise.SideNoise:
    """The statistic before issue 33: the pooled requests' median, a cluster bootstrap over repeats."""
    rng = np.random.default_rng(seed)
    width = max(len(g) for g in groups)
    table = np.full((len(groups), width), np.nan)
    for i, g in enumerate(groups):
        table[i, :len(g)] = g
    draws = np.log(np.nanmedian(table[rng.integers(0, len(groups), size=(resamples, len(groups)))].reshape(resamples, -1), axis=1))
    r = len(groups)
    return noise.SideNoise(float(np.var(draws)) * r / (r - 1), r - 1, f"{r} repeats")


def tpot_groups(raw: dict, k: int, halves: bool = False) -> list[list[float]]:
    sm = raw["stages"][0]["samples"]
    groups = noise.repeat_groups(sm["tpot_s"], sm["repeat"])[:k]
    return [h for g in groups for h in (g[:len(g) // 2], g[len(g) // 2:])] if halves else groups


def statistic_verdict(name: str, a: dict, b: dict, k: int, threshold: float) -> tuple[str, float]:
    """(verdict, interval width as a ratio) of TPOT for one pair under one statistic."""
    ga, gb = tpot_groups(a, k, name == "half repeats"), tpot_groups(b, k, name == "half repeats")
    if name == "pooled median, cluster bootstrap (before)":
        va, vb = float(np.median(np.concatenate(ga))), float(np.median(np.concatenate(gb)))
        iv = noise.combine(vb / va, pooled_noise(ga), pooled_noise(gb), 0.95)
    else:
        va, vb = noise.centre(ga, "median"), noise.centre(gb, "median")
        iv = noise.combine(vb / va, *(noise.side_noise(g, "median", 100, None) for g in (ga, gb)), 0.95)
    return compare.change_verdict(iv.ratio, (iv.lo, iv.hi), threshold, False), iv.hi / iv.lo


def widths_table(pattern: str, results: dict, ks: tuple[int, ...] = (3, 5, 10)) -> None:
    """One run's own TPOT interval half-width under each statistic, over every subset of k of its
    repeats (the H200 host-noise runs: 10 repeats, a fast and a slow host state)."""
    print(f"\nOne run's TPOT interval half-width (median over every {'/'.join(map(str, ks))} of its repeats):\n")
    print("| run | repeats | " + " | ".join(STATISTICS[:2]) + " |")
    print("| --- | --- | --- | --- |")
    for path in sorted(glob.glob(str(ROOT / pattern))):
        raw = json.loads(Path(path).read_text())
        groups = tpot_groups(raw, 10 ** 6)
        for k in ks:
            if k > len(groups):
                continue
            half = {name: [] for name in STATISTICS[:2]}
            for subset in itertools.combinations(groups, k):
                chosen = noise.side_noise(list(subset), "median", 100, None)
                half[STATISTICS[0]].append(math.exp(noise.t_quantile(0.975, chosen.df) * math.sqrt(chosen.var)) - 1)
                before = pooled_noise(list(subset))
                half[STATISTICS[1]].append(math.exp(noise.t_quantile(0.975, before.df) * math.sqrt(before.var)) - 1)
            row = {name: float(np.median(v)) for name, v in half.items()}
            results["widths"].append({"run": str(Path(path).parent.relative_to(ROOT)), "repeats": k, **row})
            print(f"| {Path(path).parent.relative_to(ROOT)} | {k} | " + " | ".join(f"±{v * 100:.0f}%" for v in row.values()) + " |",
                  flush=True)


STATISTICS = ("geometric mean of the repeats' medians, t (chosen)", "pooled median, cluster bootstrap (before)", "half repeats")


def statistics_table(directory: str, results: dict, k: int = 3) -> None:
    print(f"\nTPOT at {k} repeats a run (half repeats: {2 * k} of half the requests), the 10% threshold of a "
          "host-bound stage, every ordered pair:\n")
    print("| stage | statistic | A/A: regressed | A/A: unchanged | A/A: interval width (median) | 1.2x build: regressed |")
    print("| --- | --- | --- | --- | --- | --- |")
    for stage, kinds in real_runs_by_kind(directory).items():
        same, slow = kinds.get("a", []), kinds.get("x0.2", [])
        for name in STATISTICS:
            aa = [statistic_verdict(name, a, b, k, 0.10) for a in same for b in same if a is not b]
            ab = [statistic_verdict(name, a, b, k, 0.10)[0] for a in same for b in slow]
            row = {"stage": stage, "statistic": name, "aa_regressed": sum(v == "regressed" for v, _ in aa) / len(aa),
                   "aa_unchanged": sum(v == "unchanged" for v, _ in aa) / len(aa),
                   "aa_width": float(np.median([w for _, w in aa])), "slow_regressed": ab.count("regressed") / len(ab) if ab else None}
            results["statistics"].append(row)
            print(f"| {stage} | {name} | {pct(row['aa_regressed'])} | {pct(row['aa_unchanged'])} | x{row['aa_width']:.3f} | "
                  f"{pct(row['slow_regressed'])} |", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=200, help="pairs per cell (default 200)")
    ap.add_argument("--repeats", type=int, default=3, help="repeats per synthetic run (default 3, the bench default)")
    ap.add_argument("--ladder", default="", help="also: detection at 1.2x by repeats per run, e.g. 3,5,10,20")
    ap.add_argument("--no-table", action="store_true", help="skip the main table (with --ladder or --series)")
    ap.add_argument("--metrics", default="tpot_p50,ttft_p50", help="comma-separated (default tpot_p50,ttft_p50)")
    ap.add_argument("--methods", default="requests,repeats,history,attribute,normalise",
                    help="requests,repeats,history,attribute,normalise (the last two on pools with the host-speed index)")
    ap.add_argument("--host-runs", default="results/cpu/host-calibration/run*/run.json",
                    help="independent CPU runs with the host-speed index (glob; '' to leave them out)")
    ap.add_argument("--stages", default="", help="only these stages (comma-separated)")
    ap.add_argument("--cpu-runs", default="results/cpu/gate-calibration/run*/run.json", help="independent CPU runs (glob)")
    ap.add_argument("--run-shift", type=float, default=0.01, help="sigma of a single-run pool's whole-run log shift (default 0.01)")
    ap.add_argument("--series", type=int, default=0, help="also: history check on N nightly series per pool (e.g. 50)")
    ap.add_argument("--nights", type=int, default=30, help="nights per series (default 30; the shift starts 10 before the end)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="also write the figures to FILE")
    ap.add_argument("--real-pairs", default="", help="real runs of scripts/gate/gate-pairs.sh (a directory): compare at the "
                    "standard preset's stopping rule on every pair, by exit code (skips the synthetic tables)")
    ap.add_argument("--statistics", action="store_true", help="with --real-pairs: the chosen statistic beside the one it "
                    "replaced and shorter repeats, on the same pairs")
    ap.add_argument("--widths", default="", help="runs of many repeats (a glob, e.g. 'results/h200/20261204-host-noise/*/run.json'): "
                    "one run's interval width under each statistic by repeats")
    args = ap.parse_args()
    methods, metrics = args.methods.split(","), args.metrics.split(",")
    results = {"args": {k: str(v) for k, v in vars(args).items()}, "cells": [], "ladder": [], "real_pairs": [], "statistics": [],
               "widths": []}
    if args.real_pairs or args.widths:
        if args.widths:
            widths_table(args.widths, results)
        if args.real_pairs:
            real_pairs(args.real_pairs, results)
        if args.real_pairs and args.statistics:
            statistics_table(args.real_pairs, results)
        if args.json:
            args.json.write_text(json.dumps(results, indent=1))
        return 0
    all_pools = pools(args.cpu_runs, args.run_shift, args.stages.split(",") if args.stages else None, args.host_runs)
    if not args.no_table:
        main_table(all_pools, args, methods, metrics, results)
    if args.ladder:
        ladder_table(all_pools, args, methods, metrics, results)
    if args.series:
        series_table(all_pools, args, metrics, results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
