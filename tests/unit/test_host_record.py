"""run.json's host record (core/host.py): one type for a GPU host and a CPU host, a key it does
not know kept, only the keys it was given written back, and every committed run's `env` read and
written back unchanged."""

from __future__ import annotations

import json
from pathlib import Path

from testkit import committed_runs

from llmopt_bench.core.host import Host
from llmopt_bench.core.results import load_run

ROOT = Path(__file__).resolve().parents[2]


def test_the_machine_is_the_gpu_else_the_cpu():
    gpu = Host.model_validate({"device": "cuda", "gpu": "NVIDIA H200", "cpu": "AMD EPYC",
                               "gpus": [{"name": "NVIDIA H200", "memory_bytes": 150_000_000_000}]})
    cpu = Host.model_validate({"device": "cpu", "gpu": None, "cpu": "AMD EPYC"})
    assert gpu.machine == "NVIDIA H200" and gpu.gpus and gpu.gpus[0].memory_bytes == 150_000_000_000
    assert cpu.machine == "AMD EPYC" and Host().machine is None


def test_unknown_keys_are_kept_and_no_key_is_added():
    raw = {"device": "cpu", "gpu": None, "from_a_newer_probe": {"x": 1},
           "ceilings": {"mem_bandwidth_bytes_s": 1e10, "also_new": "y"}}
    host = Host.model_validate(raw)
    assert host.ceilings and host.ceilings.roof() == (1e10, None)
    assert json.loads(host.model_dump_json()) == raw  # no nulls for what the probe did not write
    assert Host.model_validate(None).model_dump() == {}


def test_every_committed_runs_env_loads_typed_and_writes_back_the_same():
    paths = [p for p in committed_runs() if p.name == "run.json"]
    assert paths
    for path in paths:
        env = json.loads(path.read_text())["env"]
        host = load_run(path).env
        assert isinstance(host, Host) and host.machine == (env.get("gpu") or env.get("cpu"))
        assert json.loads(host.model_dump_json()) == env, path
