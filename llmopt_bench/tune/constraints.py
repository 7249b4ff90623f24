"""What vLLM is known to need or refuse in a configuration, so that `llmopt tune` starts no server
it knows will fail (issue 43). Three kinds, each with its reason in words:

- **paired**: a setting a configuration brings with it. An FP8 KV cache on CUDA takes a bf16 model:
  vLLM's FlashAttention-3 path refuses a float16 model with it ("For FP16/BF16 input, output must
  have the same dtype as inputs. For FP8 input, output must have dtype BF16", seen on an H100), so
  such a configuration runs with dtype bfloat16, and says so.
- **known**: a combination vLLM's own config checks refuse before anything loads (vLLM 0.32's
  SchedulerConfig.verify_max_model_len): chunked prefill off with fewer tokens a step than
  max_model_len; fewer tokens a step than sequences.
- **learned**: a configuration that sets every knob value a configuration of this run could not
  start with, or every value two configurations that failed for the same root cause share, would
  fail the same way: it is not started, and the reason names the trial whose log says why.

Everything here reads plain settings (the vLLM settings a configuration passes: [fixed] and its
knobs, vLLM's own defaults left out), so the space and the tuner both use it without a cycle."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MAX_MODEL_LEN = 4096  # VLLMEngineParams' default, where [fixed] does not set it


def paired(settings: dict[str, Any], device: str | None) -> dict[str, tuple[Any, str]]:  # vLLM settings, any of its params
    """The settings a configuration brings with it: name -> (value, why)."""
    out: dict[str, tuple[Any, str]] = {}
    kv = settings.get("kv_cache_dtype")
    if device == "cuda" and isinstance(kv, str) and kv.startswith("fp8") and settings.get("dtype", "auto") in ("auto", "float16"):
        out["dtype"] = ("bfloat16", "an FP8 KV cache on CUDA takes a bf16 model (vLLM's FlashAttention-3 path: \"For FP8 "
                                    "input, output must have dtype BF16\"); the defaults keep the model's dtype")
    return out


def known_refusal(settings: dict[str, Any], model_max_len: int | None = None) -> str | None:  # vLLM settings, free-form
    """Why vLLM refuses these settings at its start (its config checks), None when it is not known to."""
    tokens, seqs = settings.get("max_num_batched_tokens"), settings.get("max_num_seqs")
    max_len = settings.get("max_model_len") or MAX_MODEL_LEN
    if model_max_len:
        max_len = min(max_len, model_max_len)
    if settings.get("enable_chunked_prefill") is False and tokens is not None and tokens < max_len:
        return (f"vLLM refuses chunked prefill off with max_num_batched_tokens ({tokens}) below max_model_len ({max_len}): "
                "a prompt of max_model_len tokens could never be scheduled")
    if tokens is not None and seqs is not None and tokens < seqs:
        return f"vLLM refuses max_num_batched_tokens ({tokens}) below max_num_seqs ({seqs}): a step must hold one token of each"
    return None


@dataclass(frozen=True)
class Refusal:
    """Knob values a server of this run could not start with, and the root cause its log gave."""

    items: frozenset[tuple[str, str]]  # (knob, value as JSON text)
    cause: str
    trials: tuple[int, ...]


def items_of(config: dict[str, Any], default: str) -> frozenset[tuple[str, str]]:  # a configuration: knob -> any value
    import json

    return frozenset((k, json.dumps(v)) for k, v in config.items() if v != default)


def learned(failed: list[tuple[int, frozenset[tuple[str, str]], str]]) -> list[Refusal]:
    """What the failed starts teach: each one's knob values, and the values that failed starts of
    the same root cause share (when they share any)."""
    out = [Refusal(items, cause, (n,)) for n, items, cause in failed if items]
    by_cause: dict[str, list[tuple[int, frozenset[tuple[str, str]]]]] = {}
    for n, items, cause in failed:
        by_cause.setdefault(cause, []).append((n, items))
    for cause, seen in by_cause.items():
        if len(seen) > 1:
            shared = frozenset.intersection(*(items for _, items in seen))
            if shared:
                out.append(Refusal(shared, cause, tuple(n for n, _ in seen)))
    return out


def learned_refusal(items: frozenset[tuple[str, str]], refusals: list[Refusal]) -> str | None:
    """Why a configuration with these knob values would fail as an earlier one did (None: no such)."""
    import json

    for r in sorted(refusals, key=lambda r: len(r.items)):
        if r.items and r.items <= items:
            knobs = ", ".join(f"{k}={json.loads(v)}" for k, v in sorted(r.items))
            trials = " and ".join(str(n) for n in r.trials)
            return f"sets {knobs}, which trial {trials} could not start with: {r.cause}"
    return None
