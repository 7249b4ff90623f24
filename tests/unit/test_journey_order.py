"""A run resumed call by call, a few stages each, still lists its stages in journey order."""

from llmopt_bench.core.results import RunResult, StageResult
from llmopt_bench.core.workload import WorkloadConfig
from llmopt_bench.run.registry import StagePlan, journey_order, journey_path, parse_journey


def _run(names, journey=()):
    run = RunResult(run_id="r", created_at="2026-12-03T00:00:00+00:00", command="llmopt bench", workload=WorkloadConfig(),
                    journey=[StagePlan(n).as_dict() for n in journey])
    for n in names:
        run.put(StageResult(name=n, status="ok"))
    return run


def test_resumed_stages_take_their_journey_places():
    journey = [p.name for p in parse_journey(journey_path())]
    run = _run(["hf-fp16", "vllm", "awq-int4", "vllm-fp8", "bnb-int8", "bnb-nf4"])
    run.stages.sort(key=journey_order(run, [StagePlan("bnb-int8"), StagePlan("bnb-nf4")]))
    names = [s.name for s in run.stages]
    assert names == [n for n in journey if n in names]
    assert names.index("bnb-int8") < names.index("awq-int4")


def test_stages_outside_the_journey_keep_their_order_after_it():
    run = _run(["t-slow", "hf-fp16", "t-good"], journey=["t-slow", "hf-fp16"])
    run.stages.sort(key=journey_order(run, [StagePlan("t-good")]))
    assert [s.name for s in run.stages] == ["hf-fp16", "t-slow", "t-good"]
