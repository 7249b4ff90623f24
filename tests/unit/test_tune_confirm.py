"""tune's confirmation judges vLLM's client by llmopt's own rule (the SLO and the steady state,
load/record.slo_verdict), not by vLLM's p99s: a winner whose queue grows under vLLM's client is
"missed" even where its p99s stay within the SLO. vLLM's client is stood in for by a package of
the same shape (vllm.benchmarks.serve: add_cli_args, main) that saves what `vllm bench serve
--save-detailed` saves for a server answering a fixed rate (tests/simserver.vllm_client_run);
the runner, the saved result's reading and the verdict are the real ones."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from llmopt_bench.core.workload import WorkloadConfig
from llmopt_bench.scenarios.serving.record import ServingParams
from llmopt_bench.tune.confirm import confirm

TESTS = Path(__file__).resolve().parents[1]

FAKE_SERVE = '''
import json, os, pathlib
from simserver import vllm_client_run

def add_cli_args(p):
    for flag in ("--result-dir", "--request-rate", "--num-prompts"):
        p.add_argument(flag)

def main(args):
    rate = float(args.request_rate)
    run = vllm_client_run(rate, int(args.num_prompts) / rate, float(os.environ["FAKE_SERVED_RPS"]), latencies=False)
    pathlib.Path(args.result_dir, "openai-fake.json").write_text(json.dumps(run))
'''
FAKE_PARSER = '''
import argparse

class FlexibleArgumentParser(argparse.ArgumentParser):
    def parse_args(self, args=None, namespace=None):
        return self.parse_known_args(args, namespace)[0]
'''


@pytest.fixture
def fake_vllm(tmp_path, monkeypatch):
    root = tmp_path / "fake"
    for pkg in ("vllm", "vllm/benchmarks", "vllm/utils"):
        (root / pkg).mkdir(parents=True)
        (root / pkg / "__init__.py").write_text("")
    (root / "vllm/benchmarks/serve.py").write_text(FAKE_SERVE)
    (root / "vllm/utils/argparse_utils.py").write_text(FAKE_PARSER)
    monkeypatch.setenv("PYTHONPATH", f"{root}:{TESTS}:{Path(__file__).resolve().parents[2]}")
    monkeypatch.setenv("LLMOPT_VLLM_PYTHON", sys.executable)
    return root


def confirmed(tmp_path, monkeypatch, served_rps: float):
    monkeypatch.setenv("FAKE_SERVED_RPS", str(served_rps))
    server = SimpleNamespace(base_url="http://127.0.0.1:9", served_model_name="m", name="m")
    shared = SimpleNamespace(run_dir=tmp_path, hold_s=30.0, model=SimpleNamespace(path=str(tmp_path)),
                             workload=WorkloadConfig(max_new_tokens=10, seed=0),
                             load=ServingParams(slo="ttft_p99=60s,tpot_p99=1s", warmup_s=2.0))
    return confirm(server, shared, 20.0, Path("trials/001"), (450, 10))


def test_a_winner_whose_completions_fall_behind_its_arrivals_is_missed(fake_vllm, tmp_path, monkeypatch):
    # 20 req/s arriving for 30 s at a server that answers 17 a second: the queue grows by 3 a
    # second, TTFT with it, yet its p99 (about 5 s) stays far under the 60-s limit
    c = confirmed(tmp_path, monkeypatch, 17.0)
    assert c.verdict == "missed", c.why
    assert c.why.startswith("not steady") and c.figures["steady"] is False
    assert c.figures["completion_rps"] < 0.9 * 20.0 and c.figures["ttft_p99_ms"] < 60e3


def test_a_winner_that_keeps_up_is_held(fake_vllm, tmp_path, monkeypatch):
    c = confirmed(tmp_path, monkeypatch, 25.0)
    assert c.verdict == "held", c.why
    assert c.num_prompts == 600


def test_a_target_vllm_does_not_report_is_judged_all_the_same(fake_vllm, tmp_path, monkeypatch):
    # vLLM's result names p99s only where asked; llmopt's verdict reads every request instead
    monkeypatch.setenv("FAKE_SERVED_RPS", "25")
    server = SimpleNamespace(base_url="http://127.0.0.1:9", served_model_name="m", name="m")
    shared = SimpleNamespace(run_dir=tmp_path, hold_s=30.0, model=SimpleNamespace(path=str(tmp_path)),
                             workload=WorkloadConfig(max_new_tokens=10, seed=0),
                             load=ServingParams(slo="e2e_p95=400ms", warmup_s=2.0))
    c = confirm(server, shared, 20.0, Path("trials/001"), (450, 10))
    assert c.verdict == "missed" and c.why.startswith("e2e_p95 500.0 ms > 400 ms"), c.why
