"""The continuous-batching stage's transformers probes through one worker process
(engines/hf/model_worker.ModelWorker), for real on CPU with synthetic:tiny: the model is loaded
once for many probes, the answers are those of a fresh process per probe (run_isolated), a real
allocation failure is an OOM the worker recovers from, and what it cannot recover from (an
error, SIGKILL, a timeout) ends that probe only. Loads are counted from the worker's own record."""

from __future__ import annotations

import os
import resource
import signal
import threading

import pytest

from llmopt_bench.core.workload import Request
from llmopt_bench.engines.hf.model_worker import ModelWorker
from llmopt_bench.engines.hf.static_batching import PEAK_SINCE_RESET, run_isolated
from llmopt_bench.load.point import LoadPoint
from llmopt_bench.scenarios.batching.curve import CurveParams, CurvePoint
from llmopt_bench.scenarios.batching.kv_capacity import hf_capacity
from llmopt_bench.scenarios.batching.mixed import static_probes

SLOW = {"batch": 16, "context": 2048}  # ~20 s on 2 cores: killed long before its end


@pytest.fixture
def worker(tmp_path):
    w = ModelWorker(tmp_path / "probes")
    yield w
    w.close()


def capacity_job(tiny_model, batch: int, context: int) -> dict:
    return {"model_path": tiny_model.path, "device": "cpu", "dtype": "float32", "attn_implementation": "eager",
            "batch": batch, "context": context, "decode_steps": 4}


def mixed_point() -> CurvePoint:
    lengths = [300, 20, 24, 31, 18, 260, 40, 22]
    reqs = [Request(f"r{i}", f"p{i}", tuple((5 + 7 * i + 3 * j) % 1000 + 1 for j in range(n))) for i, n in enumerate(lengths)]
    return CurvePoint(load=LoadPoint(concurrency=4, num_requests=len(reqs)), requests=reqs, new=4, static_batch=4, name="mixed")


def all_probes(tiny_model, tmp_path, probe):
    """The stage's two callers, mixed lengths then capacity, through one probe function."""
    p = CurveParams(mixed_batch=4, cap_context=64, mixed_attn_implementation="eager")
    rows = static_probes(p, mixed_point(), tiny_model.path, "cpu", "float32", tmp_path, probe=probe)
    cap_rows, cap_probes = hf_capacity(tiny_model.path, "cpu", "float32", "eager", [256], 64, 4, 300.0, tmp_path,
                                       probe=probe)
    return rows, cap_rows, cap_probes


def test_many_probes_one_load_same_answers_as_a_process_each(tiny_model, tmp_path, worker):
    rows, cap_rows, cap_probes = all_probes(tiny_model, tmp_path, worker)
    assert worker.stats()["probe_loads"] == 1 and worker.stats()["probe_workers"] == 1
    assert worker.stats()["probe_count"] == 5  # 3 mixed configurations, batch 1 and 2
    answers = [r.model_dump() for r in rows] + cap_probes
    assert {a["worker"]["pid"] for a in answers} == {answers[0]["worker"]["pid"]}
    assert [a["worker"]["loads"] for a in answers] == [1] * 5  # the worker's own count
    assert "load_s" in answers[0]["worker"] and not any("load_s" in a["worker"] for a in answers[1:])
    assert all(a["peak_rss_method"] == PEAK_SINCE_RESET and a["peak_bytes"] > 0 for a in answers)

    iso_rows, iso_cap_rows, iso_cap_probes = all_probes(tiny_model, tmp_path, run_isolated)
    same = ("config", "status", "requests", "batches", "batch_sizes", "max_padded_len", "prompt_tokens",
            "padded_prompt_tokens", "output_tokens", "all_tokens_produced")
    for got, want in zip(rows, iso_rows):
        assert [getattr(got, k) for k in same] == [getattr(want, k) for k in same]
    assert [r.status for r in rows] == ["ok"] * 3
    assert [(p["status"], p["batch"], p["output_tokens"]) for p in cap_probes] == \
        [(p["status"], p["batch"], p["output_tokens"]) for p in iso_cap_probes] == [("ok", 1, 4), ("ok", 2, 4)]
    drop = ("peak_bytes",)
    assert [{k: v for k, v in r.items() if k not in drop} for r in cap_rows] == \
        [{k: v for k, v in r.items() if k not in drop} for r in iso_cap_rows]


def vm_size(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(x for x in f if x.startswith("VmSize:")).split()[1]) * 1024


def test_a_real_allocation_failure_is_an_oom_and_the_same_load_answers_the_next(tiny_model, worker):
    first = worker("capacity", capacity_job(tiny_model, 1, 256), 300.0)
    assert first["status"] == "ok"
    pid = worker.proc.pid
    # 1 GiB of address space above what the loaded worker maps: eager attention of 64 x 2048
    # tokens needs 4 GiB at once (64 x 4 heads x 2048^2 x 4 bytes), so the allocation fails
    resource.prlimit(pid, resource.RLIMIT_AS, (vm_size(pid) + (1 << 30), resource.RLIM_INFINITY))
    big = worker("capacity", capacity_job(tiny_model, 64, 2048), 300.0)
    assert big["status"] == "oom", big
    assert "can't allocate memory" in big["reason"] and big["tried_to_allocate_bytes"] > 0
    assert big["memory_at_oom_bytes"] > 0 and big["worker"]["went_on"] and big["worker"]["after_probe"] == {"ok": True}
    after = worker("capacity", capacity_job(tiny_model, 2, 256), 300.0)
    assert after["status"] == "ok" and after["output_tokens"] == 4
    assert after["worker"]["pid"] == pid and after["worker"]["loads"] == 1 and worker.stats()["probe_loads"] == 1
    assert big["exit_code"] is None and after["exit_code"] is None  # the worker went on


def test_an_error_ends_that_probe_only_and_is_recorded_as_in_a_process_of_its_own(tiny_model, tmp_path, worker):
    p = CurveParams(mixed_batch=4, cap_context=64)
    job = {"model_path": tiny_model.path, "device": "cpu", "dtype": "float32", "attn_implementation": "eager",
           "requests": [[1, 2, 3]], "max_new_tokens": 2, "batch_size": p.mixed_batch, "cap_context": p.cap_context,
           "bucket_token_budget": 256, "config": "no-such-configuration"}
    broken = worker("mixed", job, 300.0)
    isolated = run_isolated("mixed", job, 300.0, tmp_path)
    assert broken["status"] == isolated["status"] == "error"
    assert broken["reason"] == isolated["reason"] == "ValueError: unknown configuration 'no-such-configuration'"
    assert broken["worker"]["went_on"] is False and broken["exit_code"] == 0
    nxt = worker("capacity", capacity_job(tiny_model, 1, 256), 300.0)
    assert nxt["status"] == "ok" and nxt["worker"]["pid"] != broken["worker"]["pid"]
    assert worker.stats()["probe_loads"] == 2 and worker.stats()["probe_workers"] == 2


def test_a_worker_killed_mid_probe_ends_that_probe_only(tiny_model, worker):
    assert worker("capacity", capacity_job(tiny_model, 1, 256), 300.0)["status"] == "ok"
    pid = worker.proc.pid
    killer = threading.Timer(1.0, os.kill, (pid, signal.SIGKILL))
    killer.start()
    killed = worker("capacity", capacity_job(tiny_model, **SLOW), 300.0)
    killer.join()
    assert killed["status"] == "killed" and killed["exit_code"] == -signal.SIGKILL
    assert killed["reason"].startswith("probe killed by signal 9")
    nxt = worker("capacity", capacity_job(tiny_model, 2, 256), 300.0)
    assert nxt["status"] == "ok" and nxt["worker"]["pid"] != pid and worker.stats()["probe_loads"] == 2


def test_a_probe_past_its_timeout_ends_that_probe_only(tiny_model, worker):
    assert worker("capacity", capacity_job(tiny_model, 1, 256), 300.0)["status"] == "ok"
    pid = worker.proc.pid
    slow = worker("capacity", capacity_job(tiny_model, **SLOW), 2.0)
    assert slow["status"] == "timeout" and slow["reason"] == "probe exceeded 2 s"
    assert not os.path.exists(f"/proc/{pid}")  # killed and reaped at its timeout, not left to finish
    nxt = worker("capacity", capacity_job(tiny_model, 2, 256), 300.0)
    assert nxt["status"] == "ok" and nxt["worker"]["pid"] != pid
    assert worker.stats() | {"probe_wall_s": None} == {"probe_loads": 2, "probe_workers": 2, "probe_count": 3,
                                                     "probe_wall_s": None}


def test_peak_memory_is_each_probes_own(tiny_model, worker):
    """A small probe after a large one in the same worker reports its own peak, not the
    process's lifetime peak (which the large probe set)."""
    big = worker("capacity", capacity_job(tiny_model, 8, 1024), 300.0)
    small = worker("capacity", capacity_job(tiny_model, 1, 256), 300.0)
    assert big["status"] == small["status"] == "ok" and small["worker"]["loads"] == 1
    assert small["peak_bytes"] < big["peak_bytes"], (small["peak_bytes"], big["peak_bytes"])
