"""Runs for the regression gate's tests, built from real runs only: a run holding some of a real
run's repeats (drawn, or one of them), optionally shifted as a whole (every latency of the run
times a factor, its throughput divided by it: what a slower build or a slower machine does).
Never independent per-request noise, never a scaled copy standing in for an independent run."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from llmopt_bench.core.distribution import Distribution

ROOT = Path(__file__).resolve().parent.parent
H200 = ROOT / "results" / "h200"  # the H200 journey, one session
H200_BATCHING = ROOT / "results" / "h200" / "20261203-batching-vllm-only"  # continuous-batching, another session
BASELINE = ROOT / "results" / "baselines" / "nvidia-h200-synthetic-llama2-7b.json"
CPU_RUNS = sorted((ROOT / "results" / "cpu" / "gate-calibration").glob("run*/run.json"))  # 12 independent CPU runs


def load(path: Path) -> dict:
    path = Path(path)
    return json.loads((path / "run.json" if path.is_dir() else path).read_text())


def write(path: Path, raw: dict) -> Path:
    """A run directory holding raw as its run.json."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "run.json").write_text(json.dumps(raw))
    return path


def restage(stage: dict, picks: list[int], factor: float = 1.0) -> dict:
    """The stage as if it had run the repeats `picks` (indices into its own, repetition allowed)
    and `factor` times slower as a whole; its metrics recomputed from those samples."""
    st = copy.deepcopy(stage)
    sm, m = st["samples"], st["metrics"]
    reps = sorted(set(sm["repeat"]))
    rows = [[j for j, r in enumerate(sm["repeat"]) if r == reps[k]] for k in picks]
    new = {c: [] for c in sm}
    for i, idx in enumerate(rows):
        for c in sm:
            new[c] += [i for _ in idx] if c == "repeat" else [sm[c][j] for j in idx]
    for c in ("ttft_s", "tpot_s", "e2e_s"):
        new[c] = [v * factor if v is not None else None for v in new[c]]
    st["samples"] = new
    for c in ("ttft_s", "tpot_s", "e2e_s"):
        m[c] = Distribution.of([v for v in new[c] if v is not None]).model_dump()
    if m.get("itl_s"):
        m["itl_s"] = {k: v * factor if k != "n" else v for k, v in m["itl_s"].items()}
    for key, scale in (("output_tok_s_repeats", 1 / factor), ("qps_repeats", 1 / factor), ("tpot_p50_repeats_s", factor)):
        if len(m.get(key) or []) == len(reps):
            m[key] = [m[key][k] * scale for k in picks]
    for key, per in (("output_tok_s", "output_tok_s_repeats"), ("qps", "qps_repeats")):
        if m.get(per):
            m[key] = sum(m[per]) / len(m[per])
    m.update(requests=len(new["e2e_s"]), output_tokens=sum(new["output_tokens"]), repeats=len(picks))
    return st


def repeats_run(raw: dict, picks: list[int], factor: float = 1.0, run_id: str | None = None,
                created_at: str | None = None) -> dict:
    """The whole run restaged: every ok stage with samples as if it had run the repeats `picks`."""
    out = copy.deepcopy(raw)
    out["stages"] = [restage(s, picks, factor) if s["status"] == "ok" and s.get("samples") else s for s in out["stages"]]
    out["workload"]["repeats"] = len(picks)
    if run_id:
        out["run_id"] = run_id
    if created_at:
        out["created_at"] = created_at
    return out


def only_stages(raw: dict, names: list[str]) -> dict:
    out = copy.deepcopy(raw)
    out["stages"] = [s for s in out["stages"] if s["name"] in names]
    return out
