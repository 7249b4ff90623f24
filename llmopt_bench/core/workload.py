"""The fixed prompt set, the workload knobs (WorkloadConfig: each option's default, range and
help) and the token-id requests they resolve to. Arrival schedules live in load/ (arrivals.py),
the generated workload kinds in workloads/.

A workload resolves to token-id requests with the model's own tokenizer, so that every stage
receives exactly the same tokens and token counts are exact."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, model_validator
from pydantic.config import JsonDict

from llmopt_bench.core.errors import UsageError
from llmopt_bench.core.freeform import Json
from llmopt_bench.core.records import StrictModel

DEFAULT_PROMPTS = "builtin:prompts.jsonl"
JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")  # any other file: plain text, one prompt a line
PROMPT_KEYS = ("text", "prompt")  # "prompt": vLLM's custom dataset and most peers
PROMPT_FILE_HELP = ('a JSONL file (.jsonl, .ndjson or .json), one {"id": ..., "text": ...} (or "prompt") per line, '
                    "or any other file as plain text, one prompt a line")


class Prompt(StrictModel):
    id: str
    text: str
    lang: str = "en"
    kind: str = "user"


PROMPT_FILE_KINDS = ("fixed", "mixed")  # built from the prompt file; the other kinds (workloads/) generate token ids


def option(cpu: int | None = None, name: str | None = None) -> JsonDict:
    """A WorkloadConfig field that is a `llmopt bench` option: its name when it is not the
    field's (--workload), and its default on a CPU where it is lighter than on a GPU."""
    return {"cli": name or True, **({"cpu_default": cpu} if cpu is not None else {})}


class WorkloadConfig(StrictModel):
    """The run's workload. Each field marked option() is a `llmopt bench` option, declared here
    once: its default, bounds, help (description) and CPU default; cli/workload_options.py builds
    the command line from these fields and validates each value against them, so the CLI and a
    journey agree on what is valid."""

    prompts: str = Field(DEFAULT_PROMPTS, description="the prompt file of the fixed and mixed kinds: " + PROMPT_FILE_HELP,
                         json_schema_extra=option())
    num_prompts: int = Field(8, ge=1, description="requests per repeat of the fixed-workload stages, the first of the workload's "
                                                  "plan (the prompt file's chosen with --seed)", json_schema_extra=option(cpu=4))
    max_new_tokens: int = Field(100, ge=1, description="output length of the fixed and mixed kinds, forced (EOS ignored) so every "
                                                       "stage does the same work", json_schema_extra=option(cpu=32))
    input_len: int | None = Field(None, ge=1, description="force every prompt of the fixed and mixed kinds to exactly N tokens "
                                                          "(truncate or repeat)", json_schema_extra=option())
    max_prompt_len: int = Field(2048, ge=1, description="longer prompts of the prompt file keep their last N tokens",
                                json_schema_extra=option())
    warmup: int = Field(2, ge=0, description="untimed requests before measuring (transformers stages: one generation "
                                             "of 16 tokens, their warmup_tokens param; 0: none)", json_schema_extra=option(cpu=1))
    repeats: int = Field(3, ge=1, description="times the workload is measured; the spread is reported", json_schema_extra=option(cpu=2))
    max_repeats: int | None = Field(None, ge=1, le=1000, description="go on past --repeats, one repeat at a time, until the "
                                    "gated figures' 95% intervals over the repeats (TPOT p50, E2E p50, output tok/s) are "
                                    "within --stop-within (default: --repeats, a fixed count)", json_schema_extra=option())
    stop_within: float = Field(2.0, ge=0.1, le=100, description="the stopping rule's target: each gated figure's 95% interval "
                                                                "half-width over the repeats, in % of the value", json_schema_extra=option())
    repeat_budget_s: float | None = Field(None, ge=1, le=86400, description="the stopping rule's time cap: no repeat past "
                                          "--repeats starts that would end after the stage's repeats have taken this many "
                                          "seconds (default: none)", json_schema_extra=option(name="--repeat-budget"))
    seed: int = Field(0, ge=0, le=2**32 - 1, description="seed for prompt choice, generated workloads and arrivals",
                      json_schema_extra=option())
    batch_size: int = Field(1, ge=1, description="requests generated together by one-shot stages", json_schema_extra=option())
    spec: str = Field("fixed", description="the workload, KIND[:key=value,...]: fixed (the prompt file), mixed (a quarter long "
                                           "documents), random, shared-prefix, multi-turn or trace (docs/workloads.md)",
                      json_schema_extra=option(name="--workload"))
    kind: str = Field("fixed", description="the spec's kind (set from spec)")
    # what the run learnt rather than what the user set: kept so run.json says how it was read
    prompt_key: str = Field("text", description='the key the prompts were read from: "text", "prompt", both '
                                                '("text+prompt"), or "line" for a plain text file')
    notes: list[str] = Field(default_factory=list, description="defaults chosen for this machine, and why")

    @model_validator(mode="before")
    @classmethod
    def _kind_of_spec(cls, data: Any) -> Any:
        """kind follows spec; a run.json written before spec existed had only kind (fixed or mixed)."""
        if isinstance(data, dict):
            data = dict(data)
            spec = data.get("spec") or data.get("kind") or "fixed"
            data.update(spec=spec, kind=str(spec).split(":", 1)[0])
        return data

    @property
    def from_prompt_file(self) -> bool:
        return self.kind in PROMPT_FILE_KINDS


@dataclass(frozen=True)
class Request:
    id: str
    prompt_id: str
    token_ids: tuple[int, ...]
    output_len: int | None = None  # forced output tokens; None: the stage's (--max-new-tokens)


class Sampling(StrictModel):
    """How a served request's tokens are chosen, stated in every request and given to the peer's
    client as the same fields (docs/serving.md, "Sampling": why greedy by default). A server
    left to its own default samples differently (vLLM's is the model's generation config, else
    temperature 1), and sampling costs time per token: two clients must send the same."""

    temperature: float = Field(0.0, ge=0, le=2, description="0: greedy (the most likely token), as the offline stages decode")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling's probability mass; 1: off")
    top_k: int = Field(-1, ge=-1, description="sample among the k most likely tokens; -1: off (not sent)")

    def body(self) -> Json:
        """The request's sampling fields (top_k, an extension of vLLM and SGLang, only when set)."""
        return {"temperature": self.temperature, "top_p": self.top_p, **({"top_k": self.top_k} if self.top_k > 0 else {})}

    def bench_serve_args(self) -> list[str]:
        """The same fields as `vllm bench serve` options (it sends exactly those it is given)."""
        return ["--temperature", f"{self.temperature:g}", "--top-p", f"{self.top_p:g}",
                *(["--top-k", str(self.top_k)] if self.top_k > 0 else [])]

    def describe(self) -> str:
        how = "greedy" if self.temperature == 0 else "sampled"
        return f"{how} (temperature {self.temperature:g}, top_p {self.top_p:g}, top_k {self.top_k if self.top_k > 0 else 'off'})"


# --- prompt files -------------------------------------------------------------------------



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


# --- the workload options of `llmopt bench`: the fields marked option(), checked against their own bounds

def option_fields() -> list[str]:
    """The WorkloadConfig fields that are `llmopt bench` options, in declared order."""
    return [f for f, info in WorkloadConfig.model_fields.items() if isinstance(info.json_schema_extra, dict)
            and info.json_schema_extra.get("cli")]


def _extra(field: str) -> Json:
    extra = WorkloadConfig.model_fields[field].json_schema_extra
    return extra if isinstance(extra, dict) else {}


# workload options: some of WorkloadConfig's fields (option_fields()) -> a value. Which fields is
# the user's choice (the options given) or the fields' metadata's (the CPU defaults), so no fixed
# keys; check_option checks each value against its field, WorkloadConfig the whole
WorkloadOptions = dict[str, object]


def option_name(field: str) -> str:
    cli = _extra(field).get("cli")
    return cli if isinstance(cli, str) else "--" + field.replace("_", "-")


def cpu_defaults() -> WorkloadOptions:
    """The options whose default on a CPU is lighter than on a GPU: on 2 cores the GPU defaults
    (8 prompts x 3 repeats + 2 warm-up, 100 tokens each) make the journey take tens of minutes."""
    return {f: _extra(f)["cpu_default"] for f in option_fields() if "cpu_default" in _extra(f)}


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
    cpu = cpu_defaults()
    if field in cpu:
        return f"{text} (default: {info.default}; on CPU {cpu[field]})"  # [...] would be read as rich markup
    return text + (f" (default: {info.default})" if info.default is not None else "")


def check_option(field: str, value: object) -> None:
    """One option's value against its field (type and bounds), or a one-line UsageError naming
    the option, the value and the range, with the default as an example."""
    info = WorkloadConfig.model_fields[field]
    try:
        WorkloadConfig.model_validate({field: value})  # every other field at its default: only this value is judged
    except ValidationError:
        lo, hi = allowed_range(field)
        span = f"{lo} to {hi}" if hi is not None else f"{lo} or more"
        cpu = cpu_defaults()
        example = "" if info.default is None else f" (the default is {info.default}" + (
            f", {cpu[field]} on CPU)" if field in cpu else ")")
        raise UsageError(f"{option_name(field)} {value}: out of range, allowed {span}",
                         f"pass {option_name(field)} with a value of {span}{example}") from None


NOT_FOR_GENERATED = ("prompts", "max_new_tokens", "input_len", "max_prompt_len")  # the prompt file's kinds' options


def resolve_workload(given: WorkloadOptions, previous: WorkloadConfig | None = None,
                     device: str = "cuda", preset: dict[str, object] | None = None) -> WorkloadConfig:
    """The run's workload: the resumed run's, else the defaults (lighter on a CPU, said in
    notes) under a preset's workload (`llmopt bench --preset`), with what the user gave on top
    (`given`: option field -> value, the options given only; the spec already canonical); the
    prompt file is read here, so a bad one fails before any stage starts."""
    values = {k: v for k, v in given.items() if v is not None}
    for field, value in values.items():
        if field != "spec":
            check_option(field, value)
    if previous is not None:
        base = previous.model_dump()
    else:
        base = {k: v for k, v in (preset or {}).items() if k not in values}
        chosen_elsewhere = {**base, **values}  # the CPU note names only the defaults it chose
        lighter = {k: v for k, v in cpu_defaults().items() if k not in chosen_elsewhere} if device != "cuda" else {}
        if lighter:
            chosen = ", ".join(f"{option_name(k)} {v}" for k, v in lighter.items())
            gpu = ", ".join(str(WorkloadConfig.model_fields[k].default) for k in lighter)
            note = f"lighter defaults on CPU: {chosen} (on a GPU: {gpu}); pass these options to choose others"
            base = {**base, **lighter, "notes": [note]}
    cfg = WorkloadConfig(**{**base, **values})
    if cfg.max_repeats is not None and cfg.max_repeats < cfg.repeats:
        raise UsageError(f"--max-repeats {cfg.max_repeats}: below --repeats {cfg.repeats}, the minimum it extends",
                         f"pass --max-repeats {cfg.repeats} or more, or leave it out for a fixed count")
    wrong = [f for f in NOT_FOR_GENERATED if f in values] if not cfg.from_prompt_file else []
    if wrong:
        raise UsageError(f"{option_name(wrong[0])} is an option of the fixed and mixed workloads, not of --workload {cfg.kind}",
                         f"set the {cfg.kind} workload's lengths inside --workload (docs/workloads.md), or drop {option_name(wrong[0])}")
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
