"""The report's content as data, from run.json alone: the stage table as CSV for spreadsheets,
and everything report.md states (stages, speedups, roofline, claims, conclusions) as JSON."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from llmopt_bench.analysis.figures import stage_figure
from llmopt_bench.analysis.metric_registry import REGISTRY
from llmopt_bench.analysis.narrative.conclusions import conclusions
from llmopt_bench.analysis.roofline import roofline
from llmopt_bench.analysis.selectors import STAGE_COLUMNS, ok_stages, speedup_rows, stage_table_rows
from llmopt_bench.core.freeform import Json
from llmopt_bench.core.results import RunResult
from llmopt_bench.render.hooks import collect_claims


def write_csv(run: RunResult, out_dir: Path) -> Path:
    path = Path(out_dir) / "stages.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=STAGE_COLUMNS)
        w.writeheader()
        for row in stage_table_rows(run):
            w.writerow({k: "" if v is None else v for k, v in row.model_dump().items()})
    return path


# report.json: what its numbers without a unit in their key (or a `unit` beside them) measure
JSON_UNITS = {
    "stages": "each column's unit is in its name (ttft_p50_ms, e2e_p50_s, peak_mem_gb, output_tok_s; qps: req/s); "
              "requests: count; token_match_rate: fraction; kl_mean: nats; perplexity: ratio",
    "figures": "each figure's `unit` beside its value and interval; n_repeats: count; set_aside: 0-based repeat indices",
    "speedups": "x: how many times better than the other stage (a ratio)",
    "claims.value": "the claim's measure: an x speedup or a ratio (its `target` says which)",
    "roofline.achieved": "fraction of the measured memory ceiling", "roofline.compute_fraction": "fraction of the compute ceiling",
    "roofline.intensity": "FLOP/byte", "roofline.ridge": "FLOP/byte", "roofline.batch": "count",
    "roofline.context_tokens": "count", "roofline.flops_per_step": "FLOP", "roofline.bytes_per_step": "bytes",
    "env.ceilings.matmul_flops": "FLOP/s (OP/s for int8)", "env.ceilings.matmul_flops_by_dtype": "FLOP/s (OP/s for int8)",
    "env.cpu_count": "count", "env.torch_threads": "count", "env.gpus.multiprocessors": "count",
    "env.cudnn": "version number", "workload.stop_within": "%", "workload.seed": "number",
    **{f"workload.{k}": "count" for k in ("batch_size", "input_len", "max_new_tokens", "max_prompt_len", "num_prompts",
                                          "repeats", "max_repeats", "warmup")},
    **{f"model.{k}": "count" for k in ("head_dim", "hidden_size", "intermediate_size", "max_position_embeddings",
                                       "num_heads", "num_kv_heads", "num_layers", "num_params", "vocab_size")},
}


def stage_figures(run: RunResult) -> Json:
    """Every ok stage's registered figures (analysis/figures.py) with their unit, 95% interval,
    the repeats they rest on and how they were computed: what report.md's numbers are."""
    out: Json = {}
    for s in ok_stages(run):
        figures = {m.key: f for m in REGISTRY.values() if (f := stage_figure(s, m)).value is not None}
        out[s.name] = {k: {"value": f.value, "unit": f.unit, "interval": list(f.interval) if f.interval else None,
                           "n_repeats": f.n_repeats, "set_aside": list(f.set_aside), "how": f.how}
                       for k, f in figures.items()}
    return out


def report_data(run: RunResult) -> Json:
    """Everything report.md states, as data."""

    claims = collect_claims(run)
    return {"run_id": run.run_id, "status": run.status, "created_at": run.created_at, "command": run.command,
            "model": run.model.model_dump() if run.model else None, "workload": run.workload.model_dump(),
            "env": run.env.model_dump(mode="json"), "stages": [r.model_dump() for r in stage_table_rows(run)],
            "figures": stage_figures(run), "speedups": [r.model_dump() for r in speedup_rows(run)],
            "roofline": [r.as_dict() for r in roofline(run)], "claims": [c.model_dump() for c in claims],
            "conclusions": conclusions(run, claims), "units": JSON_UNITS}


def write_json(run: RunResult, out_dir: Path) -> Path:
    path = Path(out_dir) / "report.json"
    path.write_text(json.dumps(report_data(run), indent=1, default=str), encoding="utf-8")
    return path
