"""The fixed prompt set, the workload knobs, and arrival processes.

A workload resolves to token-id requests with the model's own tokenizer, so that every stage
receives exactly the same tokens and token counts are exact."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import Field

from llmopt_bench.errors import UsageError
from llmopt_bench.stage import StrictModel

DEFAULT_PROMPTS = "builtin:prompts.jsonl"


class Prompt(StrictModel):
    id: str
    text: str
    lang: str = "en"
    kind: str = "user"


class WorkloadConfig(StrictModel):
    prompts: str = DEFAULT_PROMPTS
    num_prompts: int = Field(8, ge=1)
    max_new_tokens: int = Field(100, ge=1)
    input_len: int | None = Field(None, ge=1, description="force every prompt to exactly N tokens")
    max_prompt_len: int = Field(2048, ge=1, description="longer prompts keep their last N tokens")
    warmup: int = Field(2, ge=0)
    repeats: int = Field(3, ge=1)
    seed: int = 0
    batch_size: int = Field(1, ge=1)
    kind: Literal["fixed", "mixed"] = "fixed"


@dataclass(frozen=True)
class Request:
    id: str
    prompt_id: str
    token_ids: tuple[int, ...]


def _read_prompt_text(source: str) -> tuple[str, str]:
    if source.startswith("builtin:"):
        name = source.split(":", 1)[1]
        return resources.files("llmopt_bench.data").joinpath(name).read_text(encoding="utf-8"), name
    path = Path(source)
    if not path.is_file():
        raise UsageError(f"prompt file not found: {source}", "pass --prompts with a JSONL file, one {\"id\", \"text\"} per line")
    try:
        return path.read_text(encoding="utf-8"), str(path)
    except UnicodeDecodeError as e:
        raise UsageError(f"{source}: not UTF-8 text ({e.reason} at byte {e.start})", "save the file as UTF-8") from None


def load_prompts(source: str = DEFAULT_PROMPTS) -> list[Prompt]:
    """Parse a JSONL prompt file; any malformed line is an error that names the line."""
    text, name = _read_prompt_text(source)
    prompts, seen = [], set()
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise UsageError(f"{name}:{lineno}: not valid JSON ({e.msg})", 'each line must be an object like {"id": "q1", "text": "..."}') from None
        if not isinstance(obj, dict) or not isinstance(obj.get("text"), str) or not obj["text"].strip():
            raise UsageError(f"{name}:{lineno}: missing a non-empty \"text\" string", 'each line must be an object like {"id": "q1", "text": "..."}')
        obj.setdefault("id", f"line-{lineno}")
        try:
            prompt = Prompt(**{k: str(v) for k, v in obj.items() if k in Prompt.model_fields})
        except ValueError as e:
            raise UsageError(f"{name}:{lineno}: {e}") from None
        if prompt.id in seen:
            raise UsageError(f"{name}:{lineno}: duplicate id {prompt.id!r}", "give every prompt a unique id")
        seen.add(prompt.id)
        prompts.append(prompt)
    if not prompts:
        raise UsageError(f"{name}: no prompts in the file", 'add lines like {"id": "q1", "text": "..."}')
    return prompts


def select_prompts(prompts: list[Prompt], cfg: WorkloadConfig) -> list[Prompt]:
    """A seeded choice of num_prompts prompts. `mixed` takes a quarter long documents, the rest
    short questions: the mix whose static batching ran out of memory in the story."""
    rng = random.Random(cfg.seed)
    if cfg.kind == "mixed":
        long = [p for p in prompts if p.kind == "long"] or sorted(prompts, key=lambda p: -len(p.text))[:4]
        short = [p for p in prompts if p.kind == "short"] or sorted(prompts, key=lambda p: len(p.text))[:16]
        n_long = max(1, cfg.num_prompts // 4)
        picked = [rng.choice(long) for _ in range(n_long)] + [rng.choice(short) for _ in range(cfg.num_prompts - n_long)]
        rng.shuffle(picked)
        return picked
    pool = list(prompts)
    rng.shuffle(pool)
    return [pool[i % len(pool)] for i in range(cfg.num_prompts)]


def fit_length(ids: list[int], n: int) -> list[int]:
    """Exactly n tokens: truncate, or repeat the prompt's own tokens."""
    if not ids:
        raise UsageError("a prompt tokenized to zero tokens")
    return (ids * (n // len(ids) + 1))[:n]


def build_requests(cfg: WorkloadConfig, encode, count: int | None = None, tag: str = "r") -> list[Request]:
    """Token-id requests for this workload; `encode(text) -> list[int]`."""
    picked = select_prompts(load_prompts(cfg.prompts), cfg)
    if count is not None:
        picked = [picked[i % len(picked)] for i in range(count)]
    out = []
    for i, p in enumerate(picked):
        ids = list(encode(p.text))
        if cfg.input_len:
            ids = fit_length(ids, cfg.input_len)
        elif len(ids) > cfg.max_prompt_len:
            ids = ids[-cfg.max_prompt_len:]  # keep the instruction, which ends the long documents
        out.append(Request(id=f"{tag}{i:04d}", prompt_id=p.id, token_ids=tuple(ids)))
    return out


def poisson_arrivals(rate: float, n: int, seed: int = 0) -> list[float]:
    """Arrival offsets in seconds of n requests of a Poisson process at `rate` requests/s."""
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out
