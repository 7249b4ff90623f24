#!/usr/bin/env python3
"""The nightly gate's measured rates (issue 46; docs/regression.md, "A gate that can pass"): how often
`llmopt compare`, with the baseline's gate file, fails two runs of the same code (A/A), and how
often it catches a stage made 10% slower (GPU-bound) or 20% slower (host-bound).

Every comparison goes through compare itself (compare_runs, the host's signals included) and its
one exit path (cli/compare.exit_status), stage by stage and for the pair as a whole; the pair alone,
no history (what a nightly has before its third run; a history only narrows the baseline's side).

- **A/A, real pairs**: every ordered pair of two independent committed runs of the same device,
  model and workload: results/h200/run.json (= the baseline) and results/h200-20261204/run (another
  H200 machine: hf-fp16, awq-int4, vllm in common), results/h200/20261204-host-noise/a and b
  (hf-fp16 on synthetic:tiny, 10 repeats each, cut where the standard preset's stopping rule would
  have stopped them), and results/cpu/gate-pairs's runs of the same code (hf-fp16: 14, bnb-nf4: 6;
  cut the same way). The gate file: the committed baseline's for the journey; for the other runs,
  scripts/gate/gate-file.py's rule on the runs themselves (results/cpu has no committed baseline).
- **Detection, real pairs**: the same ordered pairs with the new run's stage slowed as a whole
  (every latency of it times 1.10 for a GPU-bound stage, 1.20 for a host-bound one, its tok/s
  divided by it: tests/gatekit.py, real samples scaled: the regression is injected, the pair is
  real), and the CPU's real 1.2x slower builds (scripts/gate/slower_build.py) beside them.
- **Projected nightlies**: the committed baseline against `--draws` nightlies drawn from real
  repeats (with replacement, as many as the standard preset's stopping rule takes on them): from
  the other H200 machine's run where it has the stage, else from the baseline's own (within-run
  noise only: said in the row), as they are and slowed.

    scripts/gate/gate-rates.py                      # the tables of docs/regression.md (~5 min on 2 shared cores)
    scripts/gate/gate-rates.py --draws 50 --json rates.json"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from gatekit import only_stages, restage  # noqa: E402  (runs built from real runs only)

from llmopt_bench.analysis.gate import gate_file  # noqa: E402
from llmopt_bench.analysis.gate.compare import compare_runs  # noqa: E402
from llmopt_bench.analysis.hostbound import host_bound  # noqa: E402
from llmopt_bench.analysis.stopping import StoppingRule  # noqa: E402
from llmopt_bench.cli.compare import exit_status  # noqa: E402
from llmopt_bench.core.errors import LlmoptError  # noqa: E402
from llmopt_bench.core.results import RunResult  # noqa: E402
from llmopt_bench.run.registry import resolve_preset  # noqa: E402

_spec = importlib.util.spec_from_file_location("calibrate_gate", ROOT / "scripts" / "calibrate-gate.py")
calibrate = importlib.util.module_from_spec(_spec)  # its real-pairs loader and the stopping rule's replay
sys.modules["calibrate_gate"] = calibrate
_spec.loader.exec_module(calibrate)  # type: ignore[union-attr]

BASELINE = ROOT / "results" / "baselines" / "nvidia-h200-synthetic-llama2-7b.json"
OTHER_H200 = ROOT / "results" / "h200-20261204" / "run" / "run.json"
HOST_NOISE = [ROOT / "results" / "h200" / "20261204-host-noise" / x / "run.json" for x in ("a", "b")]
CPU_PAIRS = ROOT / "results" / "cpu" / "gate-pairs"
SLOWER = {True: 1.20, False: 1.10}  # host-bound / GPU-bound: what the gate must catch 90% of the time


def read(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def code(base: RunResult, new: RunResult, gate: gate_file.GateFile) -> tuple[int, object]:
    """compare's exit code for the pair under the gate file (its thresholds and watched figures)."""
    cmp = compare_runs(base, new, gate.merged({}), watch=gate.watched())
    try:
        exit_status(cmp, Path("baseline.json"), Path("new"))
    except LlmoptError as e:
        return int(e.code), cmp
    return 0, cmp


def slowed(raw: dict, stage: str, factor: float) -> dict:
    """The run with one stage's repeats as they were, every latency times `factor` (tok/s divided by it)."""
    out = copy.deepcopy(raw)
    out["stages"] = [restage(s, list(range(len(set(s["samples"]["repeat"])))), factor) if s["name"] == stage else s
                     for s in out["stages"]]
    return out


def ok_stages(raw: dict) -> list[str]:
    return [s["name"] for s in raw["stages"] if s["status"] == "ok" and s.get("samples")]


def is_host_bound(raw: dict, stage: str) -> bool:
    run = RunResult.model_validate(raw)
    return bool(host_bound(run.stage(stage), run).host_bound)


def stopped(raw: dict, preset: dict) -> dict:
    """A one-stage run cut where the preset's stopping rule would have stopped it."""
    return calibrate.cut(raw, calibrate.nightly_repeats(raw, preset))


class Tally:
    """Exit codes by row, and each row's pairs."""

    def __init__(self):
        self.rows: dict[str, Counter] = {}

    def add(self, row: str, rc: int) -> None:
        self.rows.setdefault(row, Counter())[rc] += 1

    def table(self, title: str, caught: bool) -> list[str]:
        head = "caught (exit 5) | red (not 0)" if caught else "green (exit 0) | false alarm (exit 5)"
        lines = [f"\n{title}\n", f"| pairs | n | {head} | exit 6 | exit 8 | exit 9 |",
                 "| --- | --- | --- | --- | --- | --- | --- |"]
        for row, c in sorted(self.rows.items()):
            n = sum(c.values())
            first = (c[5], n - c[0]) if caught else (c[0], c[5])
            lines.append(f"| {row} | {n} | **{first[0] / n:.1%}** | {first[1] / n:.1%} | "
                         + " | ".join(f"{c[k] / n:.1%}" for k in (6, 8, 9)) + " |")
        return lines

    def to_dict(self) -> dict:
        return {row: {str(k): v for k, v in sorted(c.items())} for row, c in self.rows.items()}


def gpu_real(aa: Tally, det: Tally, gate: gate_file.GateFile) -> None:
    """The two H200 journeys (the baseline and another machine's), both orders, stage by stage and whole."""
    a, b = read(BASELINE), read(OTHER_H200)
    common = [s for s in ok_stages(a) if s in ok_stages(b) and RunResult.model_validate(a).stage(s).params
              == RunResult.model_validate(b).stage(s).params]
    for base, new, name in ((a, b, "baseline vs the other H200"), (b, a, "the other H200 vs baseline")):
        base_c, new_c = only_stages(base, common), only_stages(new, common)
        rc, _ = code(RunResult.model_validate(base_c), RunResult.model_validate(new_c), gate)
        aa.add(f"H200 journey, {', '.join(common)}: {name}", rc)
        for stage in common:
            one_b, one_n = only_stages(base_c, [stage]), only_stages(new_c, [stage])
            hb = is_host_bound(base, stage)
            rc, _ = code(RunResult.model_validate(one_b), RunResult.model_validate(one_n), gate)
            aa.add(f"H200 {stage} ({'host' if hb else 'GPU'}-bound), real pair", rc)
            rc, _ = code(RunResult.model_validate(one_b), RunResult.model_validate(slowed(one_n, stage, SLOWER[hb])), gate)
            det.add(f"H200 {stage} {SLOWER[hb]:g}x ({'host' if hb else 'GPU'}-bound), real pair", rc)


def host_noise_real(aa: Tally, det: Tally, preset: dict) -> None:
    """hf-fp16 on synthetic:tiny on the H200, two runs of 10 repeats: cut by the stopping rule, both orders."""
    a, b = (stopped(read(p), preset) for p in HOST_NOISE)
    gate = gate_file.GateFile("run.json", tuple(gate_file.derive(RunResult.model_validate(a), [RunResult.model_validate(b)],
                                                                 preset)))
    for base, new in ((a, b), (b, a)):
        rc, _ = code(RunResult.model_validate(base), RunResult.model_validate(new), gate)
        aa.add("H200 host-noise hf-fp16 (tiny, host-bound), real pair", rc)
        rc, _ = code(RunResult.model_validate(base), RunResult.model_validate(slowed(new, "hf-fp16", 1.2)), gate)
        det.add("H200 host-noise hf-fp16 1.2x (host-bound), real pair", rc)


def cpu_real(aa: Tally, det: Tally) -> None:
    """results/cpu/gate-pairs: every ordered pair of two different runs of the same code, cut by the
    CPU preset's stopping rule; slowed 1.2x (every CPU stage is host-bound), and the real 1.2x builds."""
    preset = resolve_preset("standard", cuda=False)[1]
    for stage, kinds in calibrate.real_runs_by_kind(str(CPU_PAIRS)).items():
        same = [stopped(r, preset) for r in kinds.get("a", [])]
        builds = [stopped(calibrate.as_stage_of(r, same[0]), preset) for r in kinds.get("x0.2", [])]
        runs = [RunResult.model_validate(r) for r in same]
        for i, base in enumerate(same):
            gate = gate_file.GateFile("run.json", tuple(gate_file.derive(runs[i], runs[:i] + runs[i + 1:], preset)))
            for j, new in enumerate(same):
                if i != j:
                    aa.add(f"CPU {stage} (tiny, host-bound), real pair", code(runs[i], runs[j], gate)[0])
                    det.add(f"CPU {stage} 1.2x injected, real pair", code(runs[i], RunResult.model_validate(
                        slowed(new, stage, 1.2)), gate)[0])
            for build in builds:
                det.add(f"CPU {stage} real 1.2x slower build", code(runs[i], RunResult.model_validate(build), gate)[0])


def drawn_nightly(stage_raw: dict, preset: dict, own_workload: bool, rng) -> list[int]:
    """Repeat indices of a nightly drawn from a stage's real repeats, as many as the preset's
    stopping rule takes on them (a stage measuring its own workload: its own count)."""
    sm, tok = stage_raw["samples"], stage_raw["metrics"]["output_tok_s_repeats"]
    reps = sorted(set(sm["repeat"]))
    if own_workload:
        return list(rng.integers(0, len(reps), size=len(reps)))
    rule = StoppingRule(preset["repeats"], preset["max_repeats"], preset["stop_within"], "tpot_p50", preset["repeat_budget_s"])
    picks: list[int] = []
    while True:
        k = int(rng.integers(0, len(reps)))
        rows = [i for i, x in enumerate(sm["repeat"]) if x == reps[k]]
        figures = {"tpot_p50": float(np.median([sm["tpot_s"][i] for i in rows])),
                   "e2e_p50": float(np.median([sm["e2e_s"][i] for i in rows])), "output_tok_s": tok[k]}
        picks.append(k)
        if rule.add_figures(figures, sum(sm["output_tokens"][i] for i in rows) / tok[k]):
            return picks


def projected(aa: Tally, det: Tally, gate: gate_file.GateFile, draws: int, seed: int) -> None:
    """The committed baseline against nightlies drawn from real repeats, as they are and slowed."""
    preset = resolve_preset("standard", cuda=True)[1]
    base_raw, other = read(BASELINE), read(OTHER_H200)
    rng = np.random.default_rng(seed)
    for stage in ok_stages(base_raw):
        b_stage = next(s for s in base_raw["stages"] if s["name"] == stage)
        o_stage = next((s for s in other["stages"] if s["name"] == stage and s["status"] == "ok"
                        and s["params"] == b_stage["params"]), None)
        source, where = (o_stage, "the other H200's repeats") if o_stage else (b_stage, "the baseline's own repeats")
        base = RunResult.model_validate(only_stages(base_raw, [stage]))
        hb = is_host_bound(base_raw, stage)
        label = f"H200 {stage} ({'host' if hb else 'GPU'}-bound), drawn from {where}"
        for _ in range(draws):
            picks = drawn_nightly(source, preset, bool(b_stage.get("own_workload")), rng)
            for factor, tally in ((1.0, aa), (SLOWER[hb], det)):
                new = copy.deepcopy(base_raw)
                new["stages"] = [restage(source, picks, factor)]
                new["workload"]["repeats"] = len(picks)
                tally.add(label if factor == 1 else f"{label}, {factor:g}x", code(base, RunResult.model_validate(new), gate)[0])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--draws", type=int, default=200, help="projected nightlies per stage (default 200)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-cpu", action="store_true", help="skip results/cpu/gate-pairs (the slowest part)")
    ap.add_argument("--json", type=Path, help="also write the counts to FILE")
    args = ap.parse_args()
    gate = gate_file.load(gate_file.beside(BASELINE), BASELINE)  # type: ignore[arg-type]
    preset = resolve_preset("standard", cuda=True)[1]
    aa, det = Tally(), Tally()
    gpu_real(aa, det, gate)
    host_noise_real(aa, det, preset)
    if not args.no_cpu:
        cpu_real(aa, det)
    p_aa, p_det = Tally(), Tally()
    if args.draws:
        projected(p_aa, p_det, gate, args.draws, args.seed)
    lines = (aa.table("A/A, real pairs of independent runs (stage by stage, and the journey's common stages whole):", False)
             + det.table("Detection, the same real pairs with the new run's stage slowed:", True)
             + p_aa.table(f"A/A, the committed baseline against {args.draws} nightlies drawn from real repeats:", False)
             + p_det.table("Detection, the same drawn nightlies slowed:", True))
    print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps({"aa": aa.to_dict(), "detection": det.to_dict(), "projected_aa": p_aa.to_dict(),
                                         "projected_detection": p_det.to_dict()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
