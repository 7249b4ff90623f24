"""vLLM's client as llmopt runs and reads it (scenarios/peer/): its arguments for the same load,
the one driver program, and its saved per-request results judged by llmopt's own rules."""

from __future__ import annotations

import pytest
from simserver import vllm_client_run as vllm_run

from llmopt_bench.scenarios.peer import bench_serve as peer
from llmopt_bench.scenarios.peer import judge as J


def test_vllm_bench_serve_s_own_main_runs_in_one_driver_program():
    from llmopt_bench.scenarios.peer.bench_serve import DRIVER

    compile(DRIVER, "driver", "exec")  # it runs in vLLM's interpreter, which may lack llmopt: valid Python alone
    assert "import llmopt_bench" not in DRIVER
    args = peer.custom_args("http://h:1", "m", "d.jsonl", 10, 8, rate=2.0, concurrency=4)
    assert args[args.index("--request-rate") + 1] == "2" and args[args.index("--max-concurrency") + 1] == "4"
    assert args[args.index("--metric-percentiles") + 1] == "50,90,95,99"  # every percentile an SLO may name


def test_vllm_s_client_gets_llmopt_s_extra_fields():
    import json

    args = peer.custom_args("http://h:1", "m", "d.jsonl", 10, 8, extra_body={"return_token_ids": True, "min_tokens": 8})
    assert json.loads(args[args.index("--extra-body") + 1]) == {"min_tokens": 8, "return_token_ids": True}
    assert "--extra-body" not in peer.custom_args("http://h:1", "m", "d.jsonl", 10, 8)


def test_vllm_s_random_dataset_as_a_user_runs_it():
    args = peer.random_args("http://h:1", "m", 450, 100, 3000, tokenizer="/t", rate=49.5, seed=3)
    at = {k: args[args.index(k) + 1] for k in ("--dataset-name", "--random-input-len", "--random-output-len", "--num-prompts",
                                               "--request-rate", "--tokenizer", "--seed")}
    assert at == {"--dataset-name": "random", "--random-input-len": "450", "--random-output-len": "100", "--num-prompts": "3000",
                  "--request-rate": "49.5", "--tokenizer": "/t", "--seed": "3"}
    assert "--ignore-eos" in args and "--max-concurrency" not in args
    assert "--dataset-path" not in args and "--custom-output-len" not in args
    inf = peer.random_args("http://h:1", "m", 450, 100, 64, concurrency=1)
    assert inf[inf.index("--request-rate") + 1] == "inf" and inf[inf.index("--max-concurrency") + 1] == "1"


def test_vllm_s_per_request_results_are_judged_by_llmopt_s_slo_code():
    """`--save-detailed` keeps each request's start, TTFT, inter-token gaps and latency: as
    llmopt's requests they give the p99s vLLM's own summary gives (the same definitions: TPOT
    = (latency - TTFT) / (tokens - 1), numpy's linear percentile), and a failed one counts."""
    import random

    from llmopt_bench.analysis.slo import judge
    from llmopt_bench.core.slo import parse_slo

    rng = random.Random(4)
    n, out = 200, 10
    ttfts = [rng.uniform(0.02, 0.3) for _ in range(n)]
    itls = [[rng.uniform(0.005, 0.03) for _ in range(out - 1)] for _ in range(n)]
    result = {"start_times": [i * 0.05 for i in range(n)], "ttfts": ttfts, "itls": itls,
              "latencies": [t + sum(g) for t, g in zip(ttfts, itls)], "output_lens": [out] * n, "input_lens": [450] * n,
              "errors": [""] * (n - 1) + ["timeout"]}
    samples = J.vllm_samples(result)
    assert [s.ok for s in samples].count(False) == 1 and samples[-1].error == "timeout"
    s0 = samples[0]
    assert (s0.t_first - s0.t_submit, s0.t_done - s0.t_submit) == (ttfts[0], result["latencies"][0])
    assert len(s0.token_times) == out and s0.token_times[-1] == pytest.approx(s0.t_done)
    v = judge(parse_slo("ttft_p99=250ms,tpot_p99=20ms"), samples, max_failure_rate=0.01)
    want_ttft = sorted(ttfts[:-1])
    pos = (len(want_ttft) - 1) * 0.99
    p99 = want_ttft[int(pos)] + (want_ttft[int(pos) + 1] - want_ttft[int(pos)]) * (pos - int(pos))
    got = {t.target: t.value_s for t in v.targets}
    assert got["ttft_p99"] == pytest.approx(p99) and v.failed == 1 and v.requests == n
    assert v.ok == (p99 <= 0.25 and got["tpot_p99"] <= 0.02)


def test_vllm_s_run_at_a_rate_is_judged_steady_or_not_by_llmopt_s_rules():
    from llmopt_bench.core.slo import parse_slo
    from llmopt_bench.load.record import slo_verdict

    loose = parse_slo("ttft_p99=60s,tpot_p99=1s")
    keeps_up = J.vllm_point(vllm_run(20.0, 30.0, 25.0), 20.0, warmup_s=2.0)
    falls_behind = J.vllm_point(vllm_run(20.0, 30.0, 17.0), 20.0, warmup_s=2.0)
    assert keeps_up.steady.ok and slo_verdict(loose, keeps_up, 0.01).ok
    assert keeps_up.warmup_excluded == 40 and keeps_up.sent == 560 and keeps_up.achieved_rate == pytest.approx(20.0, rel=0.01)
    v = slo_verdict(loose, falls_behind, 0.01)  # every request met the loose SLO: the steady state says no
    assert falls_behind.steady.ok is False and not v.ok and v.reason.startswith("not steady: ")
    assert falls_behind.steady.completion_rps == pytest.approx(17.0, rel=0.05)


def test_a_slimmed_vllm_result_is_judged_as_the_full_one():
    """Committed copies drop the inter-token gaps (megabytes a run): TTFT, TPOT, E2E and the
    steady state come out the same."""
    from llmopt_bench.core.slo import parse_slo
    from llmopt_bench.load.record import slo_verdict

    full = vllm_run(20.0, 30.0, 17.0)
    slim = {k: v for k, v in full.items() if k != "itls"}
    slo = parse_slo("ttft_p99=3s,tpot_p99=20ms")
    a, b = (slo_verdict(slo, J.vllm_point(r, 20.0, warmup_s=2.0), 0.01) for r in (full, slim))
    assert (a.ok, a.reason, [t.value_s for t in a.targets]) == (b.ok, b.reason, [t.value_s for t in b.targets])
    assert a.reason and "ttft_p99" in a.reason


def test_a_result_without_latencies_as_vllm_0_26_writes_it_is_judged_as_one_with_them():
    """vLLM 0.26's `--save-detailed` keeps TTFTs and inter-token gaps but no `latencies` (0.32
    writes both): each request's end is its first token plus its gaps, so the verdict, the
    samples and the server-clock pairing come out the same as with the latencies written."""
    from llmopt_bench.core.slo import parse_slo
    from llmopt_bench.load.record import slo_verdict

    full = vllm_run(20.0, 30.0, 17.0)
    full["latencies"] = [t + sum(g) for t, g in zip(full["ttfts"], full["itls"])]
    old = {k: v for k, v in full.items() if k != "latencies"}
    slo = parse_slo("ttft_p99=3s,tpot_p99=20ms")
    a, b = (slo_verdict(slo, J.vllm_point(r, 20.0, warmup_s=2.0), 0.01) for r in (full, old))
    assert (a.ok, a.reason, [t.value_s for t in a.targets]) == (b.ok, b.reason, [t.value_s for t in b.targets])
    assert [s.t_done for s in J.vllm_samples(old)] == pytest.approx([s.t_done for s in J.vllm_samples(full)])
    assert [s.t_done for s in J.bench_samples(old)] == pytest.approx([s.t_done for s in J.bench_samples(full)])
