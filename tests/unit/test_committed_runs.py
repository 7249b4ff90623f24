"""The runs committed under results/ were measured on real GPUs: the report must render them,
from run.json alone, with their own numbers, and keep sweep stages out of the comparisons."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmopt_bench.analysis.narrative.conclusions import conclusions as _conclusions
from llmopt_bench.analysis.selectors import speedup_rows
from llmopt_bench.core.fmt import num
from llmopt_bench.core.results import load_run
from llmopt_bench.render.hooks import collect_claims
from llmopt_bench.render.report import render_markdown
from llmopt_bench.run.registry import journey_path, parse_journey


def conclusions(run):
    return _conclusions(run, collect_claims(run))


def claim(run, key):
    return next(c for c in collect_claims(run) if c.key == key)

ROOT = Path(__file__).resolve().parents[2]
H200_TRANSFORMERS = ROOT / "results" / "h200" / "20261203-transformers"


@pytest.fixture(scope="module")
def h200():
    return load_run(H200_TRANSFORMERS)


def test_h200_run_is_the_measured_one(h200):
    assert h200.env.gpu == "NVIDIA H200" and h200.model.source == "synthetic:llama2-7b"
    status = {s.name: s.status for s in h200.stages}
    assert status == {"hf-fp16": "ok", "flash-attn": "ok", "bnb-nf4": "ok", "bnb-int8": "interrupted"}


def test_sweep_stage_stays_out_of_the_speedups_and_the_overall_claim(h200):
    assert h200.stage("flash-attn").own_workload and not h200.stage("hf-fp16").own_workload
    assert [r.stage for r in speedup_rows(h200)] == ["hf-fp16", "bnb-nf4"]
    overall = claim(h200, "overall")
    assert "flash-attn" not in overall.detail and "bnb-nf4" in overall.detail
    said = conclusions(h200)
    assert not any(c.startswith("The fastest decode is flash-attn") for c in said)


def test_flash_attention_claims_follow_the_sweep(h200):
    sp = {(r["impl"], r["context"]): r for r in h200.stage("flash-attn").extra["speedups"]}
    flash = claim(h200, "flash-attention")
    best_2k = max(sp[(i, 2048)]["prefill_speedup"] for i in ("sdpa-flash", "flash_attention_2"))
    assert f"2K: {best_2k:.2f}x (prefill" in flash.measured
    assert flash.verdict == ("held" if best_2k >= 1.6 and sp[("sdpa-flash", 8192)]["prefill_speedup"] >= 3.2 else "not held")


def test_markdown_shows_the_spreads_and_the_own_workload_note(h200):
    text = render_markdown(h200, charts={})
    r = h200.stage("flash-attn").extra["speedups"][0]
    lo, hi = r["prefill_spread"]
    assert f"| {r['impl']} | {r['context']} | 1 | {r['prefill_speedup']:.2f}x | {r['decode_speedup']:.2f}x | {lo:.2f}-{hi:.2f}x |" in text
    assert "flash-attn measure their own workload" in text


def test_conclusions_say_when_no_stage_beats_the_baseline(h200):
    base, nf4 = h200.stage("hf-fp16").metrics.tpot_s.p50, h200.stage("bnb-nf4").metrics.tpot_s.p50
    said = conclusions(h200)
    lead = "The fastest decode is bnb-nf4" if nf4 < base else "No stage decodes faster than the baseline (hf-fp16); the fastest other is bnb-nf4"
    assert any(c.startswith(lead) for c in said), said


def test_compare_of_the_h200_run_with_itself_settles_all_but_the_sweeps_eager_decode():
    import json

    from testkit import run_cli

    # the run was interrupted in bnb-int8 (a device session ended): compared as it is, by name
    args = ("compare", str(H200_TRANSFORMERS), str(H200_TRANSFORMERS), "--format", "json", "--allow-missing", "run,bnb-int8")
    res = run_cli(*args)
    assert res.returncode == 9, res.stderr  # flash-attn's eager decode: its own 3 repeats spread by 30%
    out = json.loads(res.stdout)
    assert {tuple(x) for x in out["inconclusive"]} == {("flash-attn", m) for m in ("tpot_p50", "e2e_p50", "output_tok_s")}
    assert {st["stage"] for st in out["stages"] if st["state"] == "compared"} == {"hf-fp16", "flash-attn", "bnb-nf4"}
    res = run_cli(*args, "--watch", "flash-attn:tpot,flash-attn:e2e,flash-attn:tok_s")
    assert res.returncode == 0, res.stderr
    gated = [m for st in json.loads(res.stdout)["stages"] for m in st["metrics"] if m["gated"]]
    assert gated and all(m["verdict"] == "unchanged" for m in gated) and not out["regressions"]


# --- the default-workload journey on the H200 (results/h200, resumed over two device sessions) ---

H200_JOURNEY = ROOT / "results" / "h200"
H200_BATCHING = ROOT / "results" / "h200" / "20261203-batching-vllm-only"
BASELINE = ROOT / "results" / "baselines" / "nvidia-h200-synthetic-llama2-7b.json"


@pytest.fixture(scope="module")
def journey():
    return load_run(H200_JOURNEY)


def test_journey_run_is_the_default_workload(journey):
    from llmopt_bench.core.workload import WorkloadConfig

    assert journey.env.gpu == "NVIDIA H200" and journey.model.source == "synthetic:llama2-7b"
    assert journey.workload == WorkloadConfig()  # what `llmopt bench` runs with no workload options
    statuses = {s.name: s.status for s in journey.stages}
    # journey order; the journey has grown since the run (vllm-serve, issue 16): the run is its prefix
    shipped = [p.name for p in parse_journey(journey_path())]
    assert [s.name for s in journey.stages] == shipped[:len(journey.stages)] and len(journey.stages) >= 9
    assert set(statuses.values()) == {"ok"} and journey.status == "complete"


def test_quantized_stages_ran_quantized_layers_at_their_sizes(journey):
    """Issue 3 on the H200: every decoder linear quantized (the LM head stays 16-bit), INT8
    about half of FP16's bytes, NF4 about a quarter."""
    fp16 = journey.stage("hf-fp16").load.weights_bytes
    int8, nf4 = journey.stage("bnb-int8").load, journey.stage("bnb-nf4").load
    assert int8.implementation["linear_layers"] == {"bitsandbytes.nn.modules.Linear8bitLt": 224, "torch.nn.modules.linear.Linear": 1}
    assert nf4.implementation["linear_layers"] == {"bitsandbytes.nn.modules.Linear4bit": 224, "torch.nn.modules.linear.Linear": 1}
    assert 0.5 < int8.weights_bytes / fp16 < 0.55 and 0.25 < nf4.weights_bytes / fp16 < 0.3
    # random weights: agreement only, and INT8 stays closer to FP16 than NF4
    q8, q4 = journey.stage("bnb-int8").quality, journey.stage("bnb-nf4").quality
    assert q8.perplexity is None and q4.perplexity is None
    assert q8.kl_mean < q4.kl_mean and q8.token_match_rate > q4.token_match_rate


def test_roofline_puts_vllm_near_the_memory_floor_and_transformers_far_from_it(journey):
    from llmopt_bench.analysis.roofline import roofline

    decode = {r.stage: r for r in roofline(journey) if r.phase == "decode"}
    assert decode["vllm"].bound == "memory-bound" and 0.6 <= decode["vllm"].achieved <= 0.85
    assert decode["hf-fp16"].bound == "overhead-bound" and decode["hf-fp16"].achieved < 0.2
    text = render_markdown(journey, charts={})
    v = decode["vllm"]
    assert f"{v.achieved:.1%} of the measured memory ceiling" in text


def test_dummy_awq_weights_report_no_agreement(journey):
    """Schema 1 measured agreement on weights vLLM made up; reading the run drops those figures."""
    import json

    raw = json.loads((H200_JOURNEY / "run.json").read_text())
    awq_raw = next(s for s in raw["stages"] if s["name"] == "awq-int4")
    measured = (awq_raw.get("quality") or awq_raw["extra"].get("quality"))["token_match_rate"]
    awq = journey.stage("awq-int4")
    assert awq.load.implementation["load_format"] == "dummy"
    assert awq.quality.token_match_rate is None and "random" in awq.quality.agreement_note
    assert raw["schema_version"] > 1 or measured is not None  # schema 1 holds the figure, migration hides it
    row = next(line for line in render_markdown(journey, charts={}).splitlines() if line.startswith("| awq-int4 | ok"))
    assert "match" not in row and "n/a" in row
    assert journey.stage("vllm").quality.token_match_rate is not None


def test_baseline_is_the_committed_journey_and_passes_against_it_by_its_gate_file():
    """The baseline against the run it was copied from: nothing changed. By the baseline's gate file
    (issue 46) every figure its noise lets a pair gate is settled, the GPU-bound stages' at 5%,
    and the host-bound ones it cannot (hf-fp16, bnb-int8, bnb-nf4, flash-attn's eager decode) are watched:
    exit 0. At the default thresholds, without the file, those cannot settle at 3 repeats: exit 9."""
    import json

    from testkit import run_cli

    base, now = json.loads(BASELINE.read_text()), json.loads((H200_JOURNEY / "run.json").read_text())
    kept = {s["name"]: s for s in now["stages"]}
    assert [s["name"] for s in base["stages"]] == list(kept) and all(s == kept[s["name"]] for s in base["stages"])
    res = run_cli("compare", str(BASELINE), str(H200_JOURNEY), "--format", "json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert {st["stage"] for st in out["stages"] if st["state"] == "compared"} == set(kept)  # sweeps included
    assert not out["regressions"] and not out["inconclusive"] and out["gate_file"].endswith(".gate.toml")
    verdicts = {(st["stage"], m["metric"]): m for st in out["stages"] for m in st["metrics"]}
    for s in ("vllm", "vllm-fp8", "vllm-attn", "continuous-batching"):
        assert verdicts[(s, "tpot_p50")]["verdict"] == "unchanged" and verdicts[(s, "tpot_p50")]["threshold"] == 0.05
    assert not verdicts[("hf-fp16", "tpot_p50")]["gated"] and verdicts[("awq-int4", "tpot_p50")]["gated"]
    res = run_cli("compare", str(BASELINE), str(H200_JOURNEY), "--format", "json", "--no-gate-file")
    assert res.returncode == 9, res.stderr
    assert {s for s, _ in json.loads(res.stdout)["inconclusive"]} == {"hf-fp16", "bnb-int8", "bnb-nf4", "flash-attn"}


def test_vllm_attn_measured_the_longest_context_within_the_positions(journey):
    """The first try asked vLLM for 8192 + 33 positions and failed; the stage now shortens the
    prompt at the limit, says so once, and every backend measured every context."""
    st = journey.stage("vllm-attn")
    room = journey.model.max_position_embeddings - (st.params["decode_tokens"] + 1)
    assert st.load.implementation["contexts"] == [512, 2048, room]
    sweep = st.extra["sweep"]
    assert {(r["impl"], r["context"]) for r in sweep if r["status"] == "ok"} == {
        (b, c) for b in st.params["backends"] for c in (512, 2048, room)}
    text = render_markdown(journey, charts={})
    assert text.count(f"context 8192 measured with {room} prompt tokens") == 1


def test_continuous_batching_finished_every_part(journey):
    x = journey.stage("continuous-batching").extra
    for mode in ("continuous", "static"):
        rows = [r for r in x["curve"] if r["mode"] == mode and r.get("concurrency") in (1, 4, 16, 32, 64)]
        assert sorted(r["concurrency"] for r in rows) == [1, 4, 16, 32, 64], mode
        assert all(r["completed"] == r["requests"] * r["repeats"] and not r["failed"] for r in rows), mode
    mixed = {m["config"]: m["status"] for m in x["mixed"]}
    assert mixed["static-mixed"] == "oom" and {mixed[k] for k in ("cap-context", "bucketed", "continuous")} == {"ok"}
    # the capacity search did not probe at 4096 a batch that ran out at 2048
    hf = {r["context"]: r for r in x["capacity"] if r["engine"] == "transformers"}
    assert hf[4096]["ruled_out"]["batches"] == [hf[2048]["oom_at"]] and hf[4096]["max_batch"] < hf[2048]["max_batch"]
    claim_ = claim(journey, "continuous-batching")
    tok_s = {(r["mode"], r["concurrency"]): r["output_tok_s"] for r in x["curve"]}
    best = max((tok_s[("continuous", c)] / tok_s[("static", c)], c) for c in (1, 4, 16, 32, 64))
    assert claim_.value == pytest.approx(best[0]) and f"concurrency {best[1]}" in claim_.detail
    assert claim_.verdict == ("held" if best[0] >= 4 else "not held")


# --- the quantization stages on a real model on the H200, against the same run on CPU ---

H200_SMOLLM2 = ROOT / "results" / "h200" / "20261203-smollm2-quantization"
CPU_SMOLLM2 = ROOT / "results" / "cpu" / "20261203-smollm2-quantization"


def test_smollm2_quality_agrees_across_devices():
    """Same weights (the AWQ checkpoint travelled), same workload: the perplexities measured on
    the H200 are the CPU run's, and AWQ's INT4 keeps more of FP16's quality than NF4."""
    gpu, cpu = load_run(H200_SMOLLM2), load_run(CPU_SMOLLM2)
    assert gpu.env.gpu == "NVIDIA H200" and gpu.workload == cpu.workload and gpu.model.source == cpu.model.source
    ppl = {s.name: (s.quality.perplexity, cpu.stage(s.name).quality.perplexity) for s in gpu.stages}
    assert set(ppl) == {"hf-fp16", "bnb-int8", "bnb-nf4", "awq-int4"} and all(s.status == "ok" for s in gpu.stages)
    assert all(abs(g / c - 1) < 0.01 for g, c in ppl.values()), ppl
    assert ppl["hf-fp16"][0] < ppl["bnb-int8"][0] < ppl["awq-int4"][0] < ppl["bnb-nf4"][0]
    assert claim(gpu, "awq-quality").verdict == "held"
    assert any("Machete" in k for k in gpu.stage("awq-int4").load.implementation["linear_kernels"])


def test_batching_run_throughput_point(journey):
    run = load_run(H200_BATCHING)
    tp = run.stage("continuous-batching").extra["throughput_point"]["continuous"]
    assert tp["requests"] == tp["completed"] == 256 and tp["failed"] == 0
    curve = [r for r in run.stage("continuous-batching").extra["curve"] if r["mode"] == "continuous"]
    tok_s = [r["output_tok_s"] for r in sorted(curve, key=lambda r: r["concurrency"])]
    assert tok_s == sorted(tok_s)  # more in flight, more tokens a second, on this card up to 64


def test_batching_report_shows_throughput_point_and_capacity():
    run = load_run(H200_BATCHING)
    x = run.stage("continuous-batching").extra
    text = render_markdown(run, charts={})
    tp = x["throughput_point"]["continuous"]
    assert f"| continuous | 256 | 128 | 128 | {tp['output_tok_s']:.0f} |" in text
    for row in x["capacity"]:
        assert f"| vllm | {row['context']} | {row['max_batch']} |" in text
    assert "its curve has no static replay" in text  # the claim says why it is not measured


def test_a_stage_without_reference_keeps_its_perplexity_line():
    """Only the engine's made-up weights replace the quality line by a note; a real model
    without an FP16 reference in the run still shows its perplexity."""
    from llmopt_bench.analysis.quality import NO_REFERENCE

    run = load_run(ROOT / "results" / "cpu" / "20261203-smollm2-quantization")
    q = run.stage("awq-int4").quality
    q.token_match_rate = q.first_divergence_mean = q.kl_mean = q.nll_delta_mean = None
    q.agreement_note = NO_REFERENCE
    text = render_markdown(run, charts={})
    line = next(x for x in text[text.index("### awq-int4"):].splitlines() if x.startswith("Quality"))
    assert f"perplexity {num(q.perplexity)}" in line


def test_the_stage_table_shows_n_and_marks_a_p99_of_few_requests(journey):
    """Issue 15 §6: 24 requests a stage; their p99 is the largest one or two, and says so."""
    text = render_markdown(journey, charts={})
    row = next(line for line in text.splitlines() if line.startswith("| vllm | ok |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2] == "24" and cells[5].endswith("(~max)") and not cells[4].endswith("(~max)")
    assert "rests on fewer than 100 requests" in text
