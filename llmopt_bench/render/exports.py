"""The report's content as data, from run.json alone: the stage table, speedups and the story's
claims with their verdicts (report.md renders them), written as CSV for spreadsheets and JSON
for other tools."""

from __future__ import annotations

import csv
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from llmopt_bench.analysis.quality import NOT_SAME_WEIGHTS
from llmopt_bench.results import RunResult, StageResult, peak_memory

GB = 1e9
HELD_FRACTION = 0.8  # an "N x" claim holds when this run reaches 80% of N
INT8_HALVES_AT = 0.55  # INT8 weights / FP16 weights at most this
VLLM_AT_LEAST = 2.0  # vLLM TPOT at least this many times lower than transformers FP16
STAGE_COLUMNS = ("stage", "status", "load_s", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms",
                 "e2e_p50_s", "output_tok_s", "qps", "peak_mem_gb", "peak_mem_source", "weights_gb",
                 "token_match_rate", "kl_mean", "perplexity", "quality_regression", "reason")


def ok_stages(run: RunResult) -> list[StageResult]:
    return [s for s in run.stages if s.status == "ok" and s.metrics]


def comparable_stages(run: RunResult) -> list[StageResult]:
    """Ok stages measured on the run's fixed workload: the ones whose rows compare with each other."""
    return [s for s in ok_stages(run) if not s.own_workload]


def baseline(run: RunResult) -> StageResult | None:
    """The first comparable stage (hf-fp16 in the journey)."""
    ok = comparable_stages(run)
    return ok[0] if ok else None


AGREEMENT_KEYS = ("token_match_rate", "first_divergence_mean", "kl_mean", "nll_delta_mean")


def quality(stage: StageResult) -> dict[str, Any]:
    q = (stage.extra or {}).get("quality")
    if not isinstance(q, dict):
        return {}
    impl = (stage.load.implementation if stage.load else None) or {}
    if impl.get("load_format") == "dummy" and any(q.get(k) is not None for k in AGREEMENT_KEYS):
        # a run made before the stage stopped measuring it: random weights made up by the engine
        # agree with nothing, so the figure is not shown
        return {**{k: v for k, v in q.items() if k not in AGREEMENT_KEYS}, "agreement_note": NOT_SAME_WEIGHTS}
    return q


def p(dist: Any, attr: str, scale: float = 1.0) -> float | None:
    return getattr(dist, attr) * scale if dist is not None else None


def stage_row(stage: StageResult) -> dict[str, Any]:
    m, q = stage.metrics, quality(stage)
    peak, source = peak_memory(stage)
    weights = stage.load.weights_bytes if stage.load else None
    return {
        "stage": stage.name, "status": stage.status, "load_s": stage.load_s,
        "ttft_p50_ms": p(m and m.ttft_s, "p50", 1e3), "ttft_p99_ms": p(m and m.ttft_s, "p99", 1e3),
        "tpot_p50_ms": p(m and m.tpot_s, "p50", 1e3), "tpot_p99_ms": p(m and m.tpot_s, "p99", 1e3),
        "e2e_p50_s": p(m and m.e2e_s, "p50"), "output_tok_s": m.output_tok_s if m else None,
        "qps": m.qps if m else None, "peak_mem_gb": peak / GB if peak else None, "peak_mem_source": source,
        "weights_gb": weights / GB if weights else None, "token_match_rate": q.get("token_match_rate"),
        "kl_mean": q.get("kl_mean"), "perplexity": q.get("perplexity"),
        "quality_regression": q.get("quality_regression"), "reason": stage.reason,
    }


def stage_rows(run: RunResult) -> list[dict[str, Any]]:
    return [stage_row(s) for s in run.stages]


def ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num and den else None


def speedup(stage: StageResult, ref: StageResult) -> dict[str, float | None]:
    """How many times better `stage` is than `ref`: latencies ref/stage, throughput stage/ref."""
    a, b = stage.metrics, ref.metrics
    return {"tpot": ratio(p(b.tpot_s, "p50"), p(a.tpot_s, "p50")),
            "ttft": ratio(p(b.ttft_s, "p50"), p(a.ttft_s, "p50")),
            "e2e": ratio(p(b.e2e_s, "p50"), p(a.e2e_s, "p50")),
            "output_tok_s": ratio(a.output_tok_s, b.output_tok_s)}


def speedup_rows(run: RunResult) -> list[dict[str, Any]]:
    ok = comparable_stages(run)
    rows = []
    for i, s in enumerate(ok):
        base, prev = ok[0], ok[i - 1] if i else None
        vs_base = speedup(s, base)
        vs_prev = speedup(s, prev) if prev else {}
        rows.append({"stage": s.name, "baseline": base.name, "previous": prev.name if prev else None,
                     **{f"{k}_x_baseline": v for k, v in vs_base.items()},
                     **{f"{k}_x_previous": vs_prev.get(k) for k in vs_base},
                     "changes": s.changes})
    return rows


def num(v: Any) -> str:
    if v is None or isinstance(v, str):
        return v or "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return str(v)
    a = abs(v)
    if a == 0:
        return "0"
    return f"{v:.0f}" if a >= 100 else f"{v:.1f}" if a >= 10 else f"{v:.2f}" if a >= 1 else f"{v:.3g}"


def times(v: float | None) -> str:
    return f"{v:.2f}x" if v else "-"


def spread(lo_hi: list[float | None] | None) -> str:
    """A speedup's range over the repeats, [low, high] -> "1.70-1.77x"."""
    if not lo_hi or None in lo_hi:
        return "-"
    return f"{lo_hi[0]:.2f}-{lo_hi[1]:.2f}x"


def pct(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v * 100:.1f}%" if abs(v) >= 0.01 or v == 0 else f"{v * 100:.2g}%"


# --- claims --------------------------------------------------------------------------------

@dataclass
class Claim:
    key: str
    claim: str
    target: str
    measured: str
    value: float | None
    verdict: str  # "held" | "not held" | "not measured"
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _verdict(ok: bool | None) -> str:
    return "not measured" if ok is None else "held" if ok else "not held"


def p50_of(stage: StageResult | None, attr: str) -> float | None:
    d = getattr(stage.metrics, attr, None) if stage and stage.status == "ok" and stage.metrics else None
    return d.p50 if d else None


def claim_overall(run: RunResult) -> Claim:
    base = baseline(run)
    others = [s for s in comparable_stages(run) if s is not base and p50_of(s, "e2e_s")]
    best = min(others, key=lambda s: p50_of(s, "e2e_s"), default=None)
    value = ratio(p50_of(base, "e2e_s"), p50_of(best, "e2e_s")) if best else None
    detail = (f"{base.name} E2E p50 {num(p50_of(base, 'e2e_s'))} s -> {best.name} {num(p50_of(best, 'e2e_s'))} s"
              if value else "needs the baseline and at least one other ok stage")
    return Claim("overall", "30 s to 2 s a request", "15x lower E2E p50 (held at >= 12x)",
                 times(value), value, _verdict(None if value is None else value >= 15 * HELD_FRACTION), detail)


def claim_int8(run: RunResult) -> Claim:
    fp16, int8 = run.stage("hf-fp16"), run.stage("bnb-int8")
    w = [s.load.weights_bytes if s and s.status == "ok" and s.load else None for s in (fp16, int8)]
    value = ratio(w[1], w[0])
    if value is None:
        detail = "needs ok hf-fp16 and bnb-int8 stages with weights_bytes"
    else:
        dtype = (fp16.load.implementation or {}).get("dtype")
        detail = f"weights {num(w[1] / GB)} GB vs {num(w[0] / GB)} GB ({dtype or '?'} baseline)"
        if dtype == "float32":
            detail += "; the baseline holds FP32 here, so INT8 is compared with FP32"
    return Claim("int8-memory", "INT8 halves the memory", f"bnb-int8 / hf-fp16 weights <= {INT8_HALVES_AT}",
                 f"{value:.2f}" if value else "-", value, _verdict(None if value is None else value <= INT8_HALVES_AT), detail)


def claim_vllm(run: RunResult) -> Claim:
    hf, vl = p50_of(run.stage("hf-fp16"), "tpot_s"), p50_of(run.stage("vllm"), "tpot_s")
    value = ratio(hf, vl)
    detail = f"TPOT p50 {num(hf * 1e3)} ms (hf-fp16) vs {num(vl * 1e3)} ms (vllm)" if value else "needs ok hf-fp16 and vllm stages"
    return Claim("vllm-latency", "vLLM cuts per-token latency", f">= {VLLM_AT_LEAST:.0f}x lower TPOT p50 than transformers "
                 "(H200 reference: 4.63 ms vs ~31 ms)", times(value), value,
                 _verdict(None if value is None else value >= VLLM_AT_LEAST), detail)


def _ppl(stage: StageResult | None) -> float | None:
    q = quality(stage) if stage and stage.status == "ok" else {}
    return q.get("perplexity") if q.get("perplexity_meaningful") else None


def claim_awq(run: RunResult) -> Claim:
    """The story's INT4 lesson: 4 bits everywhere (NF4) costs quality that AWQ keeps."""
    fp16, nf4, awq = (_ppl(run.stage(n)) for n in ("hf-fp16", "bnb-nf4", "awq-int4"))
    if not (fp16 and nf4 and awq):
        return Claim("awq-quality", "INT4 ruins quality unless done carefully (AWQ)", "AWQ's perplexity rise below NF4's",
                     "-", None, "not measured", "needs ok hf-fp16, bnb-nf4 and awq-int4 with perplexity (real weights)")
    rise_nf4, rise_awq = nf4 / fp16 - 1, awq / fp16 - 1
    return Claim("awq-quality", "INT4 ruins quality unless done carefully (AWQ)", "AWQ's perplexity rise below NF4's",
                 f"AWQ {rise_awq * 100:+.1f}%, NF4 {rise_nf4 * 100:+.1f}%", rise_awq / rise_nf4 if rise_nf4 else None,
                 _verdict(rise_awq < rise_nf4),
                 f"perplexity {fp16:.4g} (hf-fp16), {nf4:.4g} (bnb-nf4), {awq:.4g} (awq-int4)")


def flash_at(speedups: list[dict[str, Any]], context: int) -> tuple[float | None, str]:
    """Best speedup at `context` over the non-eager implementations, and its phase."""
    best, phase = None, ""
    for row in speedups:
        if row.get("context") != context or row.get("impl") == "eager":
            continue
        for key in ("prefill", "decode"):
            v = row.get(f"{key}_speedup")
            if v is not None and (best is None or v > best):
                best, phase = v, f"{key}, {row.get('impl')}" + (f", batch {row['batch']}" if row.get("batch") else "")
    return best, phase


def claim_flash(run: RunResult) -> Claim:
    st = run.stage("flash-attn")
    speedups = (st.extra or {}).get("speedups") if st and st.status == "ok" else None
    parts, oks = [], []
    for context, want in ((2048, 2.0), (8192, 4.0)):
        v, phase = flash_at(speedups or [], context)
        oks.append(None if v is None else v >= want * HELD_FRACTION)
        parts.append(f"{context // 1024}K: " + (f"{v:.2f}x ({phase})" if v is not None else "not measured"))
    verdict = "not held" if False in oks else "not measured" if None in oks else "held"
    return Claim("flash-attention", "FlashAttention: 2x at 2K context, 4x at 8K", "2x at 2K and 4x at 8K vs eager "
                 "(held at 80%), either phase", "; ".join(parts), None, verdict,
                 "from extra['speedups'] of flash-attn" if speedups else "needs an ok flash-attn stage with a sweep")


def _load_key(row: dict[str, Any]) -> tuple:
    return (row.get("concurrency"), row.get("rate", row.get("rate_rps")))


def batching_speedup(curve: list[dict[str, Any]]) -> tuple[float | None, str]:
    """Best continuous / static output tok/s at the same load."""
    static = {_load_key(r): r for r in curve if r.get("mode") == "static" and r.get("output_tok_s")}
    best, where = None, ""
    for r in curve:
        s = static.get(_load_key(r))
        if r.get("mode") == "continuous" and s and r.get("output_tok_s"):
            v = r["output_tok_s"] / s["output_tok_s"]
            if best is None or v > best:
                c, rate = _load_key(r)
                best, where = v, f"concurrency {c}" if c is not None else f"{rate} req/s"
    return best, where


def claim_batching(run: RunResult) -> Claim:
    st = run.stage("continuous-batching")
    curve = (st.extra or {}).get("curve") if st and st.status == "ok" else None
    value, where = batching_speedup(curve or [])
    detail = f"continuous vs static at the same load ({where})" if value else ""
    if value is None and curve:
        cont = max((r.get("output_tok_s") or 0 for r in curve if r.get("mode") == "continuous"), default=0)
        one = (run.stage("hf-fp16").metrics.output_tok_s if p50_of(run.stage("hf-fp16"), "tpot_s") else None)
        value = ratio(cont, one)
        detail = "best continuous output tok/s vs hf-fp16 one request at a time" if value else ""
    return Claim("continuous-batching", "Continuous batching: 5x throughput", "5x output tok/s (held at >= 4x)",
                 times(value), value, _verdict(None if value is None else value >= 5 * HELD_FRACTION),
                 detail or ("its curve has no static replay and the run no ok hf-fp16 to compare with: run the stage with "
                           "static_replay = true, or hf-fp16 in the same run" if curve else "needs an ok continuous-batching stage with a curve"))


def claims(run: RunResult) -> list[Claim]:
    return [claim_overall(run), claim_int8(run), claim_awq(run), claim_vllm(run), claim_flash(run), claim_batching(run)]


def write_csv(run: RunResult, out_dir: Path) -> Path:
    path = Path(out_dir) / "stages.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=STAGE_COLUMNS)
        w.writeheader()
        for row in stage_rows(run):
            w.writerow({k: "" if v is None else v for k, v in row.items()})
    return path


def report_data(run: RunResult) -> dict[str, Any]:
    """Everything report.md states, as data."""
    from llmopt_bench.analysis.roofline import roofline
    from llmopt_bench.render.report import conclusions

    return {"run_id": run.run_id, "status": run.status, "created_at": run.created_at, "command": run.command,
            "model": run.model.model_dump() if run.model else None, "workload": run.workload.model_dump(),
            "env": run.env, "stages": stage_rows(run), "speedups": speedup_rows(run),
            "roofline": [r.as_dict() for r in roofline(run)], "claims": [c.as_dict() for c in claims(run)],
            "conclusions": conclusions(run)}


def write_json(run: RunResult, out_dir: Path) -> Path:
    path = Path(out_dir) / "report.json"
    path.write_text(json.dumps(report_data(run), indent=1, default=str), encoding="utf-8")
    return path
