"""`llmopt report` on a real CPU run, and the report's logic (claims, conclusions, extra blocks)
on hand-built runs."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest
from testkit import read_run, run_cli

from llmopt_bench.analysis.figures import stage_figure
from llmopt_bench.analysis.narrative.conclusions import conclusions as _conclusions
from llmopt_bench.core.distribution import Distribution
from llmopt_bench.core.models import ModelInfo
from llmopt_bench.core.records import LoadInfo, QualityRecord, StageFacts
from llmopt_bench.core.results import RunResult, Samples, StageMetrics, StageResult, load_run
from llmopt_bench.core.workload import WorkloadConfig
from llmopt_bench.render.hooks import collect_claims
from llmopt_bench.render.report import SECTIONS, write_outputs

PROMPTS = [f"Question {i}: where is my parcel number {i}, it has not arrived." for i in range(4)]


# --- a real run ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def real_run(tmp_path_factory, llmopt_cache) -> Path:
    tmp = tmp_path_factory.mktemp("report")
    prompts = tmp / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "text": t}) + "\n" for i, t in enumerate(PROMPTS)))
    out = tmp / "run"
    res = run_cli("bench", "--stages", "hf-fp16", "--model", "synthetic:tiny", "--prompts", str(prompts),
                  "--num-prompts", "2", "--max-new-tokens", "6", "--input-len", "16", "--warmup", "1",
                  "--repeats", "2", "--output", str(out))
    assert res.returncode == 0, res.stderr[-3000:]
    return out


def md_row(text: str, stage: str) -> dict[str, str]:
    """The stage table's row for `stage`, as header -> cell."""
    lines = text[text.index("## Stages\n"):].splitlines()
    header = next(line for line in lines if line.startswith("| stage |"))
    row = next(line for line in lines if line.startswith(f"| {stage} |"))
    cells = lambda line: [c.strip() for c in line.strip().strip("|").split("|")]  # noqa: E731
    return dict(zip(cells(header), cells(row)))


def close(cell: str, value: float) -> bool:
    """A table cell against a value; a tail percentile of few requests is marked "(~max)"."""
    return float(cell.removesuffix(" (~max)")) == pytest.approx(value, rel=0.01, abs=0.006)


def non_blank(path: Path) -> bool:
    import matplotlib.image as mpimg

    img = mpimg.imread(path)
    return img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100 and float(img[..., :3].std()) > 0.05


def test_bench_writes_the_report_itself(real_run):
    assert (real_run / "report.md").is_file()
    assert (real_run / "charts" / "latency_waterfall.png").is_file()


def test_report_command_writes_every_section_with_the_run_numbers(real_run, tmp_path):
    res = run_cli("report", str(real_run), "--output", str(tmp_path))
    assert res.returncode == 0, res.stderr
    printed = [Path(p) for p in res.stdout.split()]
    assert printed[0] == tmp_path / "report.md" and all(p.is_file() for p in printed)
    text = (tmp_path / "report.md").read_text()
    for title in SECTIONS:
        assert f"\n## {title}\n" in text
    run = read_run(real_run)
    stage = load_run(real_run).stages[0]
    row = md_row(text, "hf-fp16")
    assert row["status"] == "ok"
    for head, key in (("TTFT p50 ms", "ttft_p50"), ("TTFT p99 ms", "ttft_p99"), ("TPOT p50 ms", "tpot_p50"),
                      ("TPOT p99 ms", "tpot_p99"), ("E2E p50 s", "e2e_p50"), ("out tok/s", "output_tok_s"), ("QPS", "qps")):
        assert close(row[head], stage_figure(stage, key).value), head  # the run's figures (analysis/figures.py)
    assert close(row["load s"], run["stages"][0]["load_s"])
    assert "Decode in hf-fp16 is " in text  # a roofline conclusion from the numbers
    assert re.search(r"\| hf-fp16 \| decode \| 1 \|", text)


def test_charts_exist_and_are_not_blank(real_run, tmp_path):
    res = run_cli("report", str(real_run), "-o", str(tmp_path))
    assert res.returncode == 0, res.stderr
    for name in ("latency_waterfall", "throughput", "memory", "distributions", "roofline"):
        path = tmp_path / "charts" / f"{name}.png"
        assert path.is_file() and non_blank(path), name
        assert f"charts/{name}.png" in (tmp_path / "report.md").read_text()
    # no data, no chart: this run has no batching curve, quality sweep or FlashAttention sweep
    assert not (tmp_path / "charts" / "batching_curve.png").exists()


def test_csv_and_json_exports_parse_and_match(real_run, tmp_path):
    res = run_cli("report", str(real_run), "--format", "csv", "--format", "json", "-o", str(tmp_path))
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == [str(tmp_path / "stages.csv"), str(tmp_path / "report.json")]
    tpot = stage_figure(load_run(real_run).stages[0], "tpot_p50").value
    rows = list(csv.DictReader((tmp_path / "stages.csv").open()))
    assert rows[0]["stage"] == "hf-fp16" and float(rows[0]["tpot_p50_ms"]) == pytest.approx(tpot)
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["stages"][0]["tpot_p50_ms"] == pytest.approx(tpot)
    assert [c["verdict"] for c in data["claims"]] == ["not measured"]  # one stage: only the overall claim, not measured
    assert {r["phase"] for r in data["roofline"]} == {"decode", "prefill"}


@pytest.mark.parametrize("args,needle", [(["/nonexistent/run"], "no run directory"),
                                         (["{tmp}"], "no run.json"), (["{run}", "--format", "pdf"], "unknown")])
def test_usage_errors_exit_2(real_run, tmp_path, args, needle):
    args = [a.format(tmp=tmp_path, run=real_run) for a in args]
    res = run_cli("report", *args)
    assert res.returncode == 2 and needle in res.stderr and "Traceback" not in res.stderr


# --- hand-built runs -------------------------------------------------------------------------

GB = 10**9


def d(v: float) -> Distribution:
    return Distribution.of([v * 0.9, v, v * 1.1])


def stage(name: str, tpot: float | None = None, e2e: float | None = None, weights: int | None = None, tok_s=None,
          extra=None, status="ok", quality=None, kv=None, facts=None) -> StageResult:
    if status != "ok":
        return StageResult(name=name, status=status, reason="bitsandbytes not installed", fix="pip install x")
    tpot = tpot or 0.03
    e2e = e2e or 0.05 + tpot * 99
    m = StageMetrics(requests=3, output_tokens=300, prompt_tokens=300, repeats=1, ttft_s=d(0.05), tpot_s=d(tpot),
                     e2e_s=d(e2e), output_tok_s=tok_s or 1 / tpot, output_tok_s_repeats=[tok_s or 1 / tpot],
                     qps=1 / e2e, tpot_p50_repeats_s=[tpot])
    samples = Samples(ttft_s=[0.045, 0.05, 0.055], tpot_s=[tpot * 0.9, tpot, tpot * 1.1], e2e_s=[e2e] * 3,
                      output_tokens=[100] * 3, repeat=[0] * 3)
    return StageResult(name=name, status="ok", changes=f"{name} changes", metrics=m, samples=samples,
                       load=LoadInfo(weights_bytes=weights, implementation={"dtype": "float16"}, kv_cache_bytes=kv),
                       memory={"process_peak_bytes": (weights or 0) + (kv or 0) + 2 * GB}, extra=extra or {},
                       quality=quality, quality_reference=name == "hf-fp16", facts=facts or StageFacts(),
                       own_workload=name in ("flash-attn", "continuous-batching"))


def run_of(*stages: StageResult) -> RunResult:
    model = ModelInfo(source="synthetic:llama2-7b", kind="synthetic", path="/x", real_weights=False, num_layers=32,
                      num_heads=32, num_kv_heads=32, head_dim=128, num_params=6_740_000_000, checkpoint_dtype="float16")
    return RunResult(run_id="hand", created_at="now", command="test", model=model, workload=WorkloadConfig(),
                     env={"gpu": "H200", "ceilings": {"mem_bandwidth_bytes_s": 4.28e12, "matmul_flops": 7e14}},
                     stages=list(stages))


def verdict(run: RunResult, key: str) -> str:
    return next(c for c in collect_claims(run) if c.key == key).verdict


def conclusions(run: RunResult) -> list[str]:
    return _conclusions(run, collect_claims(run))


def test_int8_halving_memory_holds():
    assert verdict(run_of(stage("hf-fp16", weights=13_480 * 10**6), stage("bnb-int8", weights=7_000 * 10**6)),
                   "int8-memory") == "held"


def test_int8_not_halving_memory_is_not_held():
    assert verdict(run_of(stage("hf-fp16", weights=13_480 * 10**6), stage("bnb-int8", weights=10_000 * 10**6)),
                   "int8-memory") == "not held"


def test_skipped_stage_is_not_measured_and_a_missing_one_not_judged():
    assert verdict(run_of(stage("hf-fp16", weights=13 * GB), stage("bnb-int8", status="skipped")),
                   "int8-memory") == "not measured"
    assert verdict(run_of(stage("hf-fp16", weights=13 * GB), stage("vllm", status="skipped")), "vllm-latency") == "not measured"
    assert [c.key for c in collect_claims(run_of(stage("hf-fp16")))] == ["overall"]  # no stage, no claim of it


@pytest.mark.parametrize("best_e2e,expected", [(2.0, "held"), (10.0, "not held")])
def test_overall_claim_compares_baseline_with_the_best_stage(best_e2e, expected):
    run = run_of(stage("hf-fp16", e2e=30.0), stage("bnb-int8", e2e=20.0), stage("vllm", e2e=best_e2e))
    assert verdict(run, "overall") == expected


@pytest.mark.parametrize("vllm_tpot,expected", [(4.63e-3, "held"), (25e-3, "not held")])
def test_vllm_latency_claim(vllm_tpot, expected):
    assert verdict(run_of(stage("hf-fp16", tpot=31e-3), stage("vllm", tpot=vllm_tpot)), "vllm-latency") == expected


@pytest.mark.parametrize("speedups,expected", [
    ([{"impl": "flash_attention_2", "context": 2048, "prefill_speedup": 2.2, "decode_speedup": 1.1},
      {"impl": "flash_attention_2", "context": 8192, "prefill_speedup": 4.5, "decode_speedup": 1.3}], "held"),
    ([{"impl": "flash_attention_2", "context": 2048, "prefill_speedup": 1.1, "decode_speedup": 1.0},
      {"impl": "flash_attention_2", "context": 8192, "prefill_speedup": 4.5}], "not held"),
    ([{"impl": "flash_attention_2", "context": 2048, "prefill_speedup": 2.2}], "not measured"),
    ([{"impl": "eager", "context": 2048, "prefill_speedup": 9.0}, {"impl": "eager", "context": 8192, "prefill_speedup": 9.0}],
     "not measured"),
])
def test_flash_attention_claim(speedups, expected):
    run = run_of(stage("hf-fp16"), stage("flash-attn", extra={"speedups": speedups}))
    assert verdict(run, "flash-attention") == expected


def curve(cont: float, static: float | None) -> list[dict]:
    n = {"requests": 32, "completed": 32}
    rows = [{"mode": "continuous", "concurrency": 16, "output_tok_s": cont, "ttft_p50_s": 0.1, "tpot_p50_s": 0.01, **n},
            {"mode": "continuous", "concurrency": 4, "output_tok_s": cont / 3, "ttft_p50_s": 0.05, "tpot_p50_s": 0.008, **n}]
    if static:
        rows.append({"mode": "static", "concurrency": 16, "output_tok_s": static, "ttft_p50_s": 1.0, "tpot_p50_s": 0.03, **n})
    return rows


@pytest.mark.parametrize("cont,static,expected", [(5000, 900, "held"), (1000, 900, "not held"), (3000, None, "held"),
                                                  (100, None, "not held")])
def test_continuous_batching_claim(cont, static, expected):
    # without a static row the comparison is with hf-fp16 one request at a time (500 tok/s here)
    run = run_of(stage("hf-fp16", tok_s=500), stage("continuous-batching", extra={"curve": curve(cont, static)}))
    assert verdict(run, "continuous-batching") == expected


def full_run() -> RunResult:
    quality = lambda rate, reg: QualityRecord(perplexity_meaningful=False, token_match_rate=rate,  # noqa: E731
                                              first_divergence_mean=12.0, kl_mean=0.01, reference="hf-fp16",
                                              quality_regression=reg, gate="token match >= 0.9")
    sweep = [{"impl": i, "effective_impl": i, "context": c, "batch": 1, "ttft_s": d(0.1 * c / 2048).model_dump(),
              "tpot_s": d(0.02).model_dump(), "peak_bytes": 14 * GB, "status": "ok"}
             for i in ("eager", "flash_attention_2") for c in (2048, 8192)]
    speedups = [{"impl": "flash_attention_2", "context": 2048, "prefill_speedup": 2.1, "decode_speedup": 1.2,
                 "prefill_spread": [2.0, 2.2], "decode_spread": [1.1, 1.3]},
                {"impl": "flash_attention_2", "context": 8192, "prefill_speedup": 3.0, "decode_speedup": 1.4,
                 "prefill_spread": [2.9, 3.1], "decode_spread": [1.3, 1.5]}]
    return run_of(
        stage("hf-fp16", tpot=31.5e-3, weights=13_480 * 10**6, quality=quality(1.0, False)),
        stage("bnb-int8", tpot=60e-3, weights=7_100 * 10**6, quality=quality(0.97, False)),
        stage("bnb-nf4", tpot=40e-3, weights=3_900 * 10**6, quality=quality(0.7, True)),
        stage("awq-int4", status="skipped"),
        stage("vllm", tpot=4.63e-3, weights=13_480 * 10**6, quality=quality(0.99, False), kv=58 * GB,
              extra={"kv_cache": {"num_blocks": 7000, "block_size": 16, "bytes": 58 * GB, "max_concurrency": 27.3}}),
        stage("flash-attn", tpot=25e-3, weights=13_480 * 10**6, extra={"sweep": sweep, "speedups": speedups}),
        stage("continuous-batching", tpot=9e-3, weights=13_480 * 10**6, tok_s=3000,
              extra={"curve": curve(3000, 600), "sweep": {"main_concurrency": 16}}, facts=StageFacts(decode_batch=16)))


def test_full_run_renders_every_extra_block_chart_and_conclusion(tmp_path):
    run = full_run()
    paths = write_outputs(run, tmp_path, ("md", "csv", "json"))
    names = {p.name for p in paths}
    for chart in ("latency_waterfall", "throughput", "memory", "distributions", "continuous-batching-curve",
                  "quality_speed", "roofline", "flash-attn-speedups"):
        assert f"{chart}.png" in names and non_blank(tmp_path / "charts" / f"{chart}.png"), chart
    text = (tmp_path / "report.md").read_text()
    assert "| awq-int4 | skipped | bitsandbytes not installed | pip install x |" in text
    assert "**quality regression**" in text and "KV cache: 7000 blocks of 16 tokens" in text
    assert "| flash_attention_2 | 2048 | 1 | 2.10x | 1.20x | 2.00-2.20x | 1.10-1.30x |" in text and "| continuous | 16 |" in text
    assert "![flash-attn: flash-attn-speedups](charts/flash-attn-speedups.png)" in text
    said = conclusions(run)
    assert "The fastest decode is vllm at 4.63 ms/token, 6.80x the baseline (hf-fp16)." in said
    assert any(c.startswith("Decode in vllm is memory-bound at 68.") for c in said)
    assert any(c.startswith("Decode in hf-fp16 is overhead-bound") for c in said)
    assert "bnb-nf4 fails its quality gate (token match >= 0.9)." in said
    verdicts = {c.key: c.verdict for c in collect_claims(run)}
    assert verdicts == {"overall": "not held", "int8-memory": "held", "awq-quality": "not measured",
                        "vllm-latency": "held", "flash-attention": "not held", "continuous-batching": "held"}
    row = md_row(text, "bnb-int8")
    assert close(row["TPOT p50 ms"], 60.0) and row["quality"].startswith("match 97.0%")


@pytest.mark.parametrize("awq_ppl,expected", [(19.0, "held"), (23.0, "not held"), (None, "not measured")])
def test_awq_quality_claim_compares_perplexity_rises(awq_ppl, expected):
    # the smollm2 figures measured on CPU: FP16 15.65, NF4 22.28, AWQ 19.00
    ppl = lambda v: QualityRecord(perplexity=v, perplexity_meaningful=v is not None)  # noqa: E731
    run = run_of(stage("hf-fp16", quality=ppl(15.65)), stage("bnb-nf4", quality=ppl(22.28)), stage("awq-int4", quality=ppl(awq_ppl)))
    c = next(c for c in collect_claims(run) if c.key == "awq-quality")
    assert c.verdict == expected
    if awq_ppl:
        assert c.measured == f"AWQ {(awq_ppl / 15.65 - 1) * 100:+.1f}%, NF4 +42.4%"


def test_pareto_front_keeps_only_undominated_points():
    from llmopt_bench.render.charts import pareto_front

    # (latency, quality): the second is dominated by the first, the rest trade off
    assert pareto_front([(1.0, 0.99), (2.0, 0.95), (0.5, 0.7), (3.0, 1.0)]) == [0, 2, 3]


def test_a_run_with_no_finished_stage_still_reports(tmp_path):
    run = run_of(StageResult(name="vllm", status="error", reason="boom"))
    paths = write_outputs(run, tmp_path, ("md",))
    assert paths == [tmp_path / "report.md"]  # no data, no charts
    text = paths[0].read_text()
    assert "| vllm | error | boom |" in text and "No stage finished." in text
    assert "1 stage(s) did not run to completion: vllm." in text
