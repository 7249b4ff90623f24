"""The report's rows are typed (analysis/selectors.StageRow, SpeedupRow) and the exports write
them with the columns and keys they always had (stages.csv, report.json)."""

from __future__ import annotations

import csv
from pathlib import Path

from llmopt_bench.analysis.figures import stage_figure
from llmopt_bench.analysis.selectors import speedup_rows, stage_table_rows
from llmopt_bench.core.results import load_run
from llmopt_bench.render.exports import report_data, write_csv

RUN = Path(__file__).resolve().parents[2] / "results" / "h200" / "20261203-transformers"
CSV_COLUMNS = ["stage", "status", "load_s", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "e2e_p50_s",
               "output_tok_s", "qps", "requests", "peak_mem_gb", "peak_mem_source", "weights_gb", "token_match_rate",
               "kl_mean", "perplexity", "quality_regression", "reason"]
SPEEDUP_KEYS = ["stage", "baseline", "previous", "tpot_x_baseline", "ttft_x_baseline", "e2e_x_baseline",
                "output_tok_s_x_baseline", "tpot_x_baseline_interval", "output_tok_s_x_baseline_interval",
                "tpot_x_previous", "ttft_x_previous", "e2e_x_previous", "output_tok_s_x_previous", "changes"]


def test_the_rows_are_typed_and_the_exports_keep_their_columns(tmp_path):
    run = load_run(RUN)
    rows, speedups = stage_table_rows(run), speedup_rows(run)
    assert rows[0].stage == "hf-fp16" and rows[0].ttft_p50_ms == stage_figure(run.stages[0], "ttft_p50").value
    assert speedups[1].previous == "hf-fp16" and speedups[0].tpot_x_baseline == 1.0
    with open(write_csv(run, tmp_path), newline="") as f:
        table = list(csv.DictReader(f))
    assert list(table[0]) == CSV_COLUMNS and len(table) == len(run.stages)
    data = report_data(run)
    assert list(data["stages"][0]) == CSV_COLUMNS and list(data["speedups"][0]) == SPEEDUP_KEYS
