"""The SLO (core/slo.py, judged by analysis/slo.py): parsing with a fix for every bad input, the SLO
carried as a type through the records and written back as its text, the verdict on a load point's
requests, and goodput, on requests whose timings are built so the answers are known."""

from __future__ import annotations

import pytest

from llmopt_bench.analysis.slo import client_late, judge, meets
from llmopt_bench.core.distribution import percentile
from llmopt_bench.core.errors import UsageError
from llmopt_bench.core.records import RequestSample
from llmopt_bench.core.slo import DEFAULT_SLO, parse_slo


def sample(i: int, ttft: float, step: float, n: int = 5, ok: bool = True) -> RequestSample:
    t0 = 100.0 + i
    times = [t0 + ttft + k * step for k in range(n)]
    return RequestSample(request_id=f"r{i}", prompt_id="p", prompt_tokens=4, output_tokens=n if ok else 0,
                         t_submit=t0, t_first=times[0], t_done=times[-1], token_times=times if ok else [], ok=ok,
                         error=None if ok else "timeout: test")


def test_the_default_is_mlperfs_llama31_8b_server_limits():
    slo = parse_slo(DEFAULT_SLO)
    assert [(t.metric, t.percentile, t.limit_s) for t in slo.targets] == [("ttft", 99, 2.0), ("tpot", 99, 0.1)]
    assert str(slo) == "ttft_p99=2s,tpot_p99=100ms"


def test_units_percentiles_and_spaces():
    slo = parse_slo(" ttft_p50 = 250ms , e2e_p90=1.5s,itl_p95=20ms,tpot_p99=.05s ")
    assert [(t.name, t.limit_s) for t in slo.targets] == [("ttft_p50", 0.25), ("e2e_p90", 1.5), ("itl_p95", 0.02),
                                                          ("tpot_p99", 0.05)]
    assert parse_slo(str(slo)) == slo


@pytest.mark.parametrize("text,words", [
    ("", "empty"), ("ttft_p99", "no value"), ("ttft_p99=2", "no unit"), ("ttft_p99=2min", "not a duration"),
    ("latency_p99=2s", "unknown SLO target"), ("ttft_p98=2s", "percentile p98"), ("ttft_p99=0ms", "above zero"),
    ("ttft_p99=-1s", "not a duration"), ("ttft_p99=1s,ttft_p99=2s", "twice"), ("ttft=2s", "unknown SLO target"),
])
def test_bad_slos_say_what_is_wrong_and_how_to_write_it(text, words):
    with pytest.raises(UsageError) as e:
        parse_slo(text)
    assert words in e.value.message and e.value.fix


def test_the_verdict_uses_each_targets_percentile():
    # TTFT of request i is i ms (1..100): p50 = 50.5 ms, p99 = 99.01 ms
    samples = [sample(i, ttft=i / 1000, step=0.01) for i in range(1, 101)]
    held = judge(parse_slo("ttft_p50=60ms,ttft_p99=100ms,tpot_p99=11ms"), samples)
    assert held.ok and held.reason is None
    assert held.targets[0].value_s == pytest.approx(percentile([i / 1000 for i in range(1, 101)], 50))
    assert held.targets[1].value_s == pytest.approx(0.09901)
    missed = judge(parse_slo("ttft_p99=90ms"), samples)
    assert not missed.ok and "ttft_p99 99.0 ms > 90 ms" in missed.reason


def test_goodput_counts_requests_that_met_every_target_on_their_own():
    # 10 fast requests; 5 with a slow first token; 5 with slow decoding; 2 failed
    samples = ([sample(i, 0.05, 0.01) for i in range(10)] + [sample(10 + i, 3.0, 0.01) for i in range(5)]
               + [sample(20 + i, 0.05, 0.2) for i in range(5)] + [sample(30 + i, 0.05, 0.01, ok=False) for i in range(2)])
    slo = parse_slo(DEFAULT_SLO)
    v = judge(slo, samples)
    busy = max(s.t_done for s in samples if s.ok) - min(s.t_submit for s in samples if s.ok)  # first submit to last token
    assert v.good_requests == 10 and v.goodput_rps == pytest.approx(10 / busy)
    assert v.requests == 22 and v.failed == 2
    assert not v.ok  # p99 of both TTFT and TPOT is over, and 2/22 failed
    assert "2 of 22 requests failed" in v.reason
    assert meets(slo, samples[0]) and not meets(slo, samples[10]) and not meets(slo, samples[15])


def test_failures_alone_can_fail_the_slo():
    samples = [sample(i, 0.05, 0.01) for i in range(98)] + [sample(99 + i, 0.05, 0.01, ok=False) for i in range(2)]
    assert not judge(parse_slo(DEFAULT_SLO), samples).ok  # 2% failed
    assert judge(parse_slo(DEFAULT_SLO), samples, max_failure_rate=0.05).ok


def test_an_itl_target_is_the_points_over_every_gap_not_a_requests_own():
    # one request with gaps 10 ms except one 500 ms stall among 20: its own p99 gap is over 20 ms,
    # yet it is a good request (goodput's targets are TTFT, TPOT and E2E, as vllm bench serve's);
    # the point's ITL p99 over every gap of every request is what the ITL target judges
    times = [100.0 + 0.01 * k for k in range(10)] + [100.59 + 0.01 * k for k in range(11)]
    s = RequestSample(request_id="a", prompt_id="p", prompt_tokens=1, output_tokens=len(times), t_submit=99.9,
                      t_first=times[0], t_done=times[-1], token_times=times)
    assert meets(parse_slo("itl_p99=20ms"), s)
    assert not judge(parse_slo("itl_p99=20ms"), [s]).ok and judge(parse_slo("itl_p90=20ms"), [s]).ok


def test_the_client_fell_behind_when_over_5_percent_of_the_window_is_unsent_at_its_end():
    assert client_late(None, 100) is None and client_late(0, 100) is None and client_late(5, 100) is None
    why = client_late(6, 100)
    assert why and "6 of 100 requests" in why and "6% > 5%" in why
    assert client_late(3, 0) is None  # nothing measured: nothing to say


def test_a_records_slo_field_takes_the_text_and_writes_it_back():
    from llmopt_bench.core.records import StageFacts
    from llmopt_bench.scenarios.serving.record import ServingParams

    p = ServingParams(slo="ttft_p50=250ms, tpot_p99=0.1s")
    assert p.slo == parse_slo("ttft_p50=250ms,tpot_p99=100ms")  # parsed on the way in: a type, not text
    assert p.model_dump(mode="json")["slo"] == "ttft_p50=250ms,tpot_p99=100ms"  # one way to print it
    assert ServingParams().slo == parse_slo(DEFAULT_SLO)
    facts = StageFacts.model_validate_json(StageFacts(slo=p.slo).model_dump_json())
    assert facts.slo == p.slo and StageFacts().model_dump()["slo"] is None


def test_a_bad_slo_param_is_the_slos_own_usage_error_with_its_fix():
    from llmopt_bench.run.registry import load_stage, validate_params

    with pytest.raises(UsageError) as e:
        validate_params(load_stage("vllm-serve"), {"slo": "ttft_p99=2"})
    assert "no unit" in e.value.message and e.value.fix == "write ttft_p99=2s or ttft_p99=2ms"


def test_every_committed_runs_slo_loads_as_a_type_and_writes_back_the_same_text():
    import json

    from testkit import committed_runs

    from llmopt_bench.core.results import load_run

    seen = 0
    for path in (p for p in committed_runs() if p.name == "run.json"):
        raw = json.loads(path.read_text())
        dumped = json.loads(load_run(path).model_dump_json())
        for was, now in zip(raw.get("stages", []), dumped["stages"]):
            text = (was.get("facts") or {}).get("slo")
            seen += text is not None
            assert now["facts"]["slo"] == text, (path, was["name"])
    assert seen  # the committed serving runs carry an SLO
