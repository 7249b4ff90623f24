"""Where the client sends its requests: an OpenAI-compatible server's address, the model it
answers to, the key's variable (never the key), the client's limits, and what each request asks
(vLLM's length-forcing extensions, the sampling, the clock each chunk is timed by)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from llmopt_bench.core.errors import UsageError
from llmopt_bench.core.workload import Sampling


@dataclass(frozen=True)
class Endpoint:
    """Where to send requests. base_url: "http://host:port" or ".../v1"."""

    base_url: str
    model: str
    api_key_env: str | None = None  # the NAME of the variable that holds the key, never the key
    request_timeout_s: float = 600.0  # one request, first byte to last
    connect_timeout_s: float = 10.0
    # vLLM's extensions: ignore_eos + min_tokens force the length, return_token_ids counts
    # tokens exactly; an endpoint that rejects unknown fields wants these off
    force_length: bool = True
    return_token_ids: bool = True
    sampling: Sampling = field(default_factory=Sampling)  # greedy unless the stage says otherwise
    # each chunk timed by the kernel's receive clock (client/rx_clock.py); False: the cheaper record,
    # each chunk timed when the client read it (~20% less of the client's CPU a request: docs/serving.md)
    kernel_clock: bool = True

    @property
    def api_root(self) -> str:
        root = self.base_url.rstrip("/")
        return root if root.endswith("/v1") else root + "/v1"

    def api_key(self) -> str | None:
        if not self.api_key_env:
            return None
        key = os.environ.get(self.api_key_env)
        if not key:
            raise UsageError(f"the API key variable {self.api_key_env} is not set",
                             f"export {self.api_key_env}=<the server's key>, or leave the key out for a server without one")
        return key
