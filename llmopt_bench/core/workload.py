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

from llmopt_bench.core.errors import UsageError
from llmopt_bench.core.records import StrictModel

DEFAULT_PROMPTS = "builtin:prompts.jsonl"
JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")  # any other file: plain text, one prompt a line
PROMPT_KEYS = ("text", "prompt")  # "prompt": vLLM's custom dataset and most peers


class Prompt(StrictModel):
    id: str
    text: str
    lang: str = "en"
    kind: str = "user"


class WorkloadConfig(StrictModel):
    """The workload every fixed-workload stage runs. Each constraint here is also the range the
    command line enforces (resolve_workload), so the CLI and a journey agree on what is valid."""

    prompts: str = Field(DEFAULT_PROMPTS, description="the prompt file")
    num_prompts: int = Field(8, ge=1, description="requests per repeat, chosen from the prompt set with --seed")
    max_new_tokens: int = Field(100, ge=1, description="output length, forced (EOS ignored) so every stage does the same work")
    input_len: int | None = Field(None, ge=1, description="force every prompt to exactly N tokens (truncate or repeat)")
    max_prompt_len: int = Field(2048, ge=1, description="longer prompts keep their last N tokens")
    warmup: int = Field(2, ge=0, description="untimed requests before measuring (transformers stages: one generation "
                                             "of 16 tokens, their warmup_tokens param; 0: none)")
    repeats: int = Field(3, ge=1, description="times the workload is measured; the spread is reported")
    max_repeats: int | None = Field(None, ge=1, le=1000, description="go on past --repeats, one repeat at a time, until the "
                                    "headline figure's 95% interval over the repeats is within --stop-within (default: "
                                    "--repeats, a fixed count)")
    stop_within: float = Field(2.0, ge=0.1, le=100, description="the stopping rule's target: TPOT p50's 95% interval "
                                                                "half-width over the repeats, in % of the value")
    seed: int = Field(0, ge=0, le=2**32 - 1, description="seed for prompt choice and arrivals")
    batch_size: int = Field(1, ge=1, description="requests generated together by one-shot stages")
    kind: Literal["fixed", "mixed"] = Field("fixed", description="the prompt mix: fixed, or mixed (a quarter long documents, "
                                                                 "the rest short questions)")
    # what the run learnt rather than what the user set: kept so run.json says how it was read
    prompt_key: str = Field("text", description='the key the prompts were read from: "text", "prompt", both '
                                                '("text+prompt"), or "line" for a plain text file')
    notes: list[str] = Field(default_factory=list, description="defaults chosen for this machine, and why")


@dataclass(frozen=True)
class Request:
    id: str
    prompt_id: str
    token_ids: tuple[int, ...]


# --- prompt files -------------------------------------------------------------------------

PROMPT_FILE_HELP = ('a JSONL file (.jsonl, .ndjson or .json), one {"id": ..., "text": ...} (or "prompt") per line, '
                    "or any other file as plain text, one prompt a line")


def _read_prompt_text(source: str) -> tuple[str, str]:
    if source.startswith("builtin:"):
        name = source.split(":", 1)[1]
        return resources.files("llmopt_bench.data").joinpath(name).read_text(encoding="utf-8"), name
    path = Path(source)
    if not path.is_file():
        what = "a directory, not a prompt file" if path.is_dir() else "prompt file not found"
        raise UsageError(f"{what}: {source}", f"pass --prompts {PROMPT_FILE_HELP}")
    try:
        return path.read_text(encoding="utf-8"), str(path)
    except UnicodeDecodeError as e:
        raise UsageError(f"{source}: not UTF-8 text ({e.reason} at byte {e.start})", "save the file as UTF-8") from None


def is_jsonl(source: str) -> bool:
    """The rule: the file's name decides. .jsonl, .ndjson and .json are JSON lines; anything
    else (.txt, no suffix) is plain text, one prompt a line."""
    return source.startswith("builtin:") or Path(source).suffix.lower() in JSONL_SUFFIXES


def _jsonl_prompt(name: str, lineno: int, line: str) -> tuple[dict, str]:
    """One JSONL line -> (fields, the key its text was read from)."""
    shape = 'each line must be an object like {"id": "q1", "text": "..."} ("prompt" instead of "text" works too)'
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise UsageError(f"{name}:{lineno}: not valid JSON ({e.msg})", shape) from None
    keys = [k for k in PROMPT_KEYS if isinstance(obj, dict) and k in obj]
    if len(keys) > 1:
        raise UsageError(f'{name}:{lineno}: both "text" and "prompt": which one is the prompt?', "keep one of the two keys")
    if not keys or not isinstance(obj[keys[0]], str) or not obj[keys[0]].strip():
        raise UsageError(f'{name}:{lineno}: missing a non-empty "text" (or "prompt") string', shape)
    key = keys[0]
    fields = {k: str(v) for k, v in obj.items() if k in Prompt.model_fields and k != "text"}
    return {**fields, "text": obj[key], "id": str(obj.get("id", f"line-{lineno}"))}, key


def _text_lines(name: str, text: str) -> list[tuple[int, dict]]:
    rows = [(n, line.strip()) for n, line in enumerate(text.splitlines(), start=1) if line.strip()]
    if rows and rows[0][1].startswith("{"):
        try:
            looks_json = isinstance(json.loads(rows[0][1]), dict)
        except json.JSONDecodeError:
            looks_json = False
        if looks_json:  # a JSONL file under another name: its JSON would become the prompt
            raise UsageError(f"{name}: read as plain text (one prompt a line), but line {rows[0][0]} is a JSON object",
                             f"rename it to {Path(name).stem}.jsonl to read it as JSONL")
    return [(n, {"id": f"line-{n}", "text": line}) for n, line in rows]


def load_prompt_set(source: str = DEFAULT_PROMPTS) -> tuple[list[Prompt], str]:
    """Parse a prompt file -> (prompts, how they were read: "text", "prompt", "text+prompt" or
    "line"); any malformed line is an error that names the line."""
    text, name = _read_prompt_text(source)
    if is_jsonl(source):
        rows, keys = [], set()
        for lineno, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                fields, key = _jsonl_prompt(name, lineno, line)
                rows.append((lineno, fields))
                keys.add(key)
        read_as = "+".join(k for k in PROMPT_KEYS if k in keys)
    else:
        rows, read_as = _text_lines(name, text), "line"
    prompts, seen = [], set()
    for lineno, fields in rows:
        try:
            prompt = Prompt(**fields)
        except ValueError as e:
            raise UsageError(f"{name}:{lineno}: {e}") from None
        if prompt.id in seen:
            raise UsageError(f"{name}:{lineno}: duplicate id {prompt.id!r}", "give every prompt a unique id")
        seen.add(prompt.id)
        prompts.append(prompt)
    if not prompts:
        raise UsageError(f"{name}: no prompts in the file", f"pass --prompts {PROMPT_FILE_HELP}")
    return prompts, read_as


def load_prompts(source: str = DEFAULT_PROMPTS) -> list[Prompt]:
    return load_prompt_set(source)[0]


# --- the workload options of `llmopt bench`: validated here, before anything starts ---------

OPTION_FIELDS = ("prompts", "num_prompts", "max_new_tokens", "input_len", "max_prompt_len", "warmup", "repeats",
                 "max_repeats", "stop_within", "seed", "batch_size", "kind")
OPTION_NAMES = {"kind": "--workload"}  # the command-line name, where it is not the field's
# On a CPU the GPU defaults (8 prompts x 3 repeats + 2 warm-up, 100 tokens each) make the journey
# take tens of minutes on 2 cores; the lighter set keeps `make bench` within 10.
CPU_DEFAULTS = {"num_prompts": 4, "max_new_tokens": 32, "warmup": 1, "repeats": 2}


def option_name(field: str) -> str:
    return OPTION_NAMES.get(field, "--" + field.replace("_", "-"))


def allowed_range(field: str) -> tuple[int | None, int | None]:
    """(lowest, highest) allowed, from WorkloadConfig's own constraints."""
    lo = hi = None
    for m in WorkloadConfig.model_fields[field].metadata:
        lo, hi = getattr(m, "ge", lo), getattr(m, "le", hi)
    return lo, hi


def option_help(field: str) -> str:
    """A bench option's help: the field's description and its default (and the CPU one)."""
    info = WorkloadConfig.model_fields[field]
    desc = info.description or field
    text = desc[0].upper() + desc[1:] + "."
    if field in CPU_DEFAULTS:
        return f"{text} (default: {info.default}; on CPU {CPU_DEFAULTS[field]})"  # [...] would be read as rich markup
    return text + (f" (default: {info.default})" if info.default is not None else "")


@dataclass(frozen=True)
class WorkloadOptions:
    """The workload options as given on the command line; None: not given."""

    prompts: str | None = None
    num_prompts: int | None = None
    max_new_tokens: int | None = None
    input_len: int | None = None
    max_prompt_len: int | None = None
    warmup: int | None = None
    repeats: int | None = None
    max_repeats: int | None = None
    stop_within: float | None = None
    seed: int | None = None
    batch_size: int | None = None
    kind: str | None = None

    def given(self) -> dict[str, object]:
        return {f: getattr(self, f) for f in OPTION_FIELDS if getattr(self, f) is not None}

    def check(self) -> None:
        """Each value in its allowed range, or a one-line UsageError naming option, value and range."""
        for field, value in self.given().items():
            if field == "kind":
                if value not in ("fixed", "mixed"):
                    raise UsageError(f"--workload {value!r}: unknown, allowed fixed or mixed", "use --workload fixed or --workload mixed")
                continue
            if field == "prompts":
                continue
            lo, hi = allowed_range(field)
            assert isinstance(value, (int, float))
            if (lo is not None and value < lo) or (hi is not None and value > hi):
                span = f"{lo} to {hi}" if hi is not None else f"{lo} or more"
                default = WorkloadConfig.model_fields[field].default
                example = "" if default is None else f" (the default is {default}" + (
                    f", {CPU_DEFAULTS[field]} on CPU)" if field in CPU_DEFAULTS else ")")
                raise UsageError(f"{option_name(field)} {value}: out of range, allowed {span}",
                                 f"pass {option_name(field)} with a value of {span}{example}")


def resolve_workload(given: WorkloadOptions, previous: WorkloadConfig | None = None,
                     device: str = "cuda", preset: dict[str, object] | None = None) -> WorkloadConfig:
    """The run's workload: the resumed run's, else the defaults (lighter on a CPU, said in
    notes) under a preset's workload (`llmopt bench --preset`), with what the user gave on top;
    the prompt file is read here, so a bad one fails before any stage starts."""
    given.check()
    values = given.given()
    if previous is not None:
        base = previous.model_dump()
    else:
        base = {k: v for k, v in (preset or {}).items() if k not in values}
        chosen_elsewhere = {**base, **values}  # the CPU note names only the defaults it chose
        lighter = {k: v for k, v in CPU_DEFAULTS.items() if k not in chosen_elsewhere} if device != "cuda" else {}
        if lighter:
            chosen = ", ".join(f"{option_name(k)} {v}" for k, v in lighter.items())
            gpu = ", ".join(str(WorkloadConfig.model_fields[k].default) for k in lighter)
            note = f"lighter defaults on CPU: {chosen} (on a GPU: {gpu}); pass these options to choose others"
            base = {**base, **lighter, "notes": [note]}
    cfg = WorkloadConfig(**{**base, **values})
    if cfg.max_repeats is not None and cfg.max_repeats < cfg.repeats:
        raise UsageError(f"--max-repeats {cfg.max_repeats}: below --repeats {cfg.repeats}, the minimum it extends",
                         f"pass --max-repeats {cfg.repeats} or more, or leave it out for a fixed count")
    _, read_as = load_prompt_set(cfg.prompts)
    return cfg.model_copy(update={"prompt_key": read_as})


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
