"""Output quality measured through vLLM's OpenAI-compatible server: the same perplexity windows
and teacher-forced agreement as the offline vLLM stages (engines/vllm/quality.py), with the
prompt log-probabilities asked of the server (`prompt_logprobs`, a vLLM extension of
/v1/completions) instead of the engine. A served stage whose perplexity and agreement match the
offline `vllm` stage's at the same config shows that the server runs the same weights.

The requests are not timed and run after the load points: they cost a few seconds."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from llmopt_bench.analysis.quality import QualityFields
from llmopt_bench.client.errors import RequestFailed, classify_status
from llmopt_bench.client.openai_http import Endpoint
from llmopt_bench.core.freeform import Json
from llmopt_bench.engines.vllm.quality import PromptLogprobs

BATCH = 16  # prompts a request: one answer holds every position's log-probs of each


def _position(entry: Json | None) -> dict[int, Any] | None:
    if entry is None:
        return None
    return {int(tok): SimpleNamespace(logprob=float(v["logprob"]), rank=v.get("rank")) for tok, v in entry.items()}


def server_logprobs(endpoint: Endpoint, timeout_s: float = 600.0) -> PromptLogprobs:
    """prompt_logprobs(prompts, k) answered by the server: one non-streaming completion of one
    token per batch of prompts, whose choices carry each prompt position's log-probs."""
    import httpx

    key = endpoint.api_key()
    headers = {"Authorization": f"Bearer {key}"} if key else {}

    def fetch(prompts: list[list[int]], k: int) -> list[list[Any]]:
        out: list[list[Any]] = []
        with httpx.Client(headers=headers, timeout=timeout_s) as http:
            for i in range(0, len(prompts), BATCH):
                batch = prompts[i:i + BATCH]
                body = {"model": endpoint.model, "prompt": batch, "max_tokens": 1, "temperature": 0.0,
                        "prompt_logprobs": k}
                r = http.post(endpoint.api_root + "/completions", json=body)
                if r.status_code != 200:
                    raise classify_status(r.status_code, r.text, endpoint.model)
                choices = sorted(r.json()["choices"], key=lambda c: c["index"])
                if len(choices) != len(batch) or any(c.get("prompt_logprobs") is None for c in choices):
                    raise RequestFailed("protocol", "the server returned no prompt_logprobs (a vLLM extension)")
                out += [[_position(pos) for pos in c["prompt_logprobs"]] for c in choices]
        return out

    return fetch


def served_quality(endpoint: Endpoint, encode: Callable[[str], list[int]], reference_file: Any, reference_name: str | None,
                   real_weights: bool, progress: Callable[..., None], dummy: bool = False) -> QualityFields:
    """stage.QualityRecord's fields for a vLLM server, measured through it."""
    from llmopt_bench.engines.vllm import quality as vllm_quality

    return vllm_quality.evaluate(server_logprobs(endpoint), encode, reference_file, reference_name, real_weights, progress,
                                 dummy=dummy, engine="vllm serve (prompt log-probs over HTTP)")
