"""The one runner of vLLM's client (scenarios/peer/bench_serve.BenchServe) says the CPU seconds
its process spent inside vLLM's benchmark() alone (`llmopt check client` sets them beside
llmopt's own CPU time over its load): not its start-up, not the prompts it makes before the load.
vLLM's client is stood in for by a package of the same shape (vllm.benchmarks.serve: add_cli_args,
a main that makes its prompts and then awaits the module's benchmark()); the runner is the real one."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from llmopt_bench.scenarios.peer.bench_serve import BenchServe

FAKE_SERVE = '''
import asyncio, json, pathlib, time

def add_cli_args(p):
    for flag in ("--result-dir", "--load-s", "--prep-s"):
        p.add_argument(flag)

def burn(s):
    t = time.process_time()
    while time.process_time() - t < s:
        pass

async def benchmark(load_s):
    burn(load_s)
    return {"completed": 1}

async def main_async(args):
    burn(float(args.prep_s))  # the prompts, made before the load: not the load's CPU
    return await benchmark(float(args.load_s))

def main(args):
    out = asyncio.run(main_async(args))
    pathlib.Path(args.result_dir, "openai-fake.json").write_text(json.dumps(out))
'''
FAKE_PARSER = '''
import argparse

class FlexibleArgumentParser(argparse.ArgumentParser):
    def parse_args(self, args=None, namespace=None):
        return self.parse_known_args(args, namespace)[0]
'''


def fake_vllm(root: Path) -> None:
    for pkg in ("vllm", "vllm/benchmarks", "vllm/utils"):
        (root / pkg).mkdir(parents=True)
        (root / pkg / "__init__.py").write_text("")
    (root / "vllm/benchmarks/serve.py").write_text(FAKE_SERVE)
    (root / "vllm/utils/argparse_utils.py").write_text(FAKE_PARSER)


def test_the_cpu_seconds_are_the_loads_alone(tmp_path, monkeypatch):
    fake_vllm(tmp_path / "fake")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "fake"))
    with BenchServe(tmp_path / "bench.log", python=sys.executable) as bench:
        t0 = time.monotonic()
        runs = [bench.run(["--load-s", f"{load:g}", "--prep-s", "0.6"], tmp_path / f"run{i}", timeout_s=60)
                for i, load in enumerate((0.3, 0.05))]
    assert time.monotonic() - t0 > 1.2  # the prompts' CPU was spent, twice
    assert [r.error for r in runs] == [None, None] and runs[0].result == {"completed": 1}
    # each run's own load: 0.3 s then 0.05 s, neither the 0.6 s of prompts nor the first run's
    assert 0.25 < runs[0].cpu_s < 0.5, runs[0].cpu_s
    assert 0.04 < runs[1].cpu_s < 0.2, runs[1].cpu_s
