"""The workload kinds and their parameters, each declared once (a field with its default, bounds
and help), parsed from the one option `--workload KIND[:key=value,...]` or a journey file's
`[workload]` table, and written back as a canonical string (every parameter spelled out) that
run.json keeps: `llmopt bench --workload "$(jq -r .workload.spec run.json)"` sends the same.

    fixed            the prompt file, --num-prompts, --input-len, --max-new-tokens (the default)
    mixed            the prompt file: a quarter long documents, the rest short questions
    random           prompt and output lengths drawn from distributions (workloads/dists.py)
    shared-prefix    G groups, each a common prefix plus a unique suffix per request
    multi-turn       conversations of T turns, each turn the history plus a new message
    trace            a trace file replayed on its own schedule (workloads/traces.py)

docs/workloads.md maps each to the peers' dataset options."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, ConfigDict, Field, ValidationError, model_validator

from llmopt_bench.core.errors import UsageError
from llmopt_bench.core.freeform import Table
from llmopt_bench.core.records import StrictModel
from llmopt_bench.workloads.dists import DURATION_FORMS, LENGTH_FORMS, parse_duration, parse_length

Length = Annotated[str, AfterValidator(lambda t: parse_length(t).text())]
Duration = Annotated[str, AfterValidator(lambda t: parse_duration(t).text())]
OUT_HELP = "output tokens per request, forced (EOS ignored)"


class KindParams(StrictModel):
    """A kind's parameters; the class says its name, what it is, and an example."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    KIND: ClassVar[str]
    ABOUT: ClassVar[str]
    EXAMPLE: ClassVar[str]

    def canonical(self) -> str:
        """KIND:key=value,... with every parameter set (None ones left out), in declared order."""
        values = self.model_dump(by_alias=True, exclude_none=True)
        pairs = ",".join(f"{k}={_text(v)}" for k, v in values.items())
        return f"{self.KIND}:{pairs}" if pairs else self.KIND

    @property
    def single_turn(self) -> bool:
        return True


def _text(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


class FixedKind(KindParams):
    KIND, EXAMPLE = "fixed", "fixed"
    ABOUT = "the prompt file's prompts (--prompts, --num-prompts, --input-len), --max-new-tokens forced"


class MixedKind(KindParams):
    KIND, EXAMPLE = "mixed", "mixed"
    ABOUT = "the prompt file: a quarter long documents, the rest short questions"


class RandomKind(KindParams):
    KIND, EXAMPLE = "random", "random:in=512..1536,out=128"
    ABOUT = "random token ids, prompt and output lengths drawn from distributions"
    in_: Length = Field("512", alias="in", description=f"prompt tokens per request ({LENGTH_FORMS})")
    out: Length = Field("128", description=OUT_HELP)
    prefix: int = Field(0, ge=0, description="tokens of one prefix every request starts with, before its own (vLLM --random-prefix-len)")


class SharedPrefixKind(KindParams):
    KIND, EXAMPLE = "shared-prefix", "shared-prefix:groups=8,per_group=16,prefix=1024,suffix=64,out=128"
    ABOUT = "groups of requests that share a prefix (a system prompt), each with a unique suffix"
    groups: int = Field(4, ge=1, description="prefix groups")
    per_group: int = Field(8, ge=1, description="requests per group in every window of groups x per_group requests")
    prefix: Length = Field("1024", description="tokens of each group's prefix, drawn once per group")
    suffix: Length = Field("64", description="unique tokens after the prefix, drawn per request")
    out: Length = Field("128", description=OUT_HELP)
    order: Literal["shuffled", "grouped"] = Field("shuffled", description="shuffled: the groups interleave (vLLM, SGLang); "
                                                  "grouped: a group's requests one after another")
    assign: Literal["exact", "random"] = Field("exact", description="exact: per_group requests of each group in every window "
                                               "(vLLM, SGLang); random: a group drawn for each request (GuideLLM, AIPerf)")


class MultiTurnKind(KindParams):
    KIND, EXAMPLE = "multi-turn", "multi-turn:turns=4,first=512,msg=64,out=128,think=exp:1s"
    ABOUT = "conversations: each turn sends the history (earlier prompts and the engine's own answers) plus a new message"
    turns: Length = Field("4", description="turns per conversation")
    first: Length = Field("512", description="new tokens of a conversation's first message")
    msg: Length = Field("64", description="new tokens of each later message")
    out: Length = Field("128", description=OUT_HELP)
    think: Duration = Field("0", description=f"the user's pause between an answer and its next message ({DURATION_FORMS})")
    prefix: int = Field(0, ge=0, description="tokens of a system prompt every conversation starts with")

    @property
    def single_turn(self) -> bool:
        return False


class TraceKind(KindParams):
    KIND, EXAMPLE = "trace", "trace:file=builtin:example-trace.jsonl,speedup=2"
    ABOUT = "a trace replayed on its own schedule: send times, lengths, prefix groups (docs/workloads.md: the columns)"
    file: str = Field(description="the trace: a .jsonl or .csv (llmopt's columns, Mooncake's or Azure's), or builtin:example-trace.jsonl")
    format: Literal["auto", "llmopt", "mooncake", "azure"] = Field("auto", description="the columns; auto: from the first row")
    speedup: float = Field(1.0, gt=0, le=1000, description="replay N times faster (0.5: twice as slow)")
    start: float = Field(0.0, ge=0, description="trace seconds skipped from its start")
    end: float | None = Field(None, gt=0, description="the trace second the replay stops at")
    limit: int | None = Field(None, ge=1, description="rows replayed at most")
    block: int = Field(512, ge=1, description="tokens per hash id (Mooncake: 512)")

    @model_validator(mode="after")
    def _window(self) -> TraceKind:
        if self.end is not None and self.end <= self.start:
            raise ValueError(f"end={self.end:g} is not after start={self.start:g}")
        return self


KINDS: dict[str, type[KindParams]] = {k.KIND: k for k in (FixedKind, MixedKind, RandomKind, SharedPrefixKind, MultiTurnKind,
                                                          TraceKind)}
PROMPT_FILE_KINDS = ("fixed", "mixed")  # the kinds built from the prompt file, the rest generate token ids


def _keys(cls: type[KindParams]) -> str:
    return ", ".join(f.alias or name for name, f in cls.model_fields.items()) or "none"


def _pairs(text: str, kind: str, rest: str) -> dict[str, str]:
    out: dict[str, str] = {}
    cls = KINDS[kind]
    for item in rest.split(",") if rest else []:
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise UsageError(f"--workload {text}: {item!r} is not key=value", f"write it like --workload {cls.EXAMPLE}")
        if key in out:
            raise UsageError(f"--workload {text}: {key} given twice", f"give each key once, like --workload {cls.EXAMPLE}")
        out[key] = value.strip()
    return out


def parse_spec(text: str) -> KindParams:
    """`KIND[:key=value,...]` -> the kind's parameters; anything wrong is one UsageError naming the
    spec, the key and what is allowed, with an example."""
    text = text.strip()
    kind, _, rest = text.partition(":")
    if kind not in KINDS:
        raise UsageError(f"--workload {text}: unknown kind {kind!r}, allowed {', '.join(KINDS)}",
                         "use for example --workload shared-prefix:groups=8,prefix=1024 (docs/workloads.md)")
    cls = KINDS[kind]
    pairs = _pairs(text, kind, rest)
    fields = {f.alias or name: name for name, f in cls.model_fields.items()}
    unknown = [k for k in pairs if k not in fields]
    if unknown:
        raise UsageError(f"--workload {text}: unknown key {unknown[0]!r}, allowed {_keys(cls)}",
                         f"write it like --workload {cls.EXAMPLE}")
    try:
        return cls.model_validate(pairs)
    except ValidationError as e:
        raise _usage(text, cls, e) from None


def _allowed(field: Any) -> str:
    """A numeric field's range in words, from its own bounds."""
    lo = next((("", m.ge) for m in field.metadata if getattr(m, "ge", None) is not None), None) or \
        next((("above ", m.gt) for m in field.metadata if getattr(m, "gt", None) is not None), None)
    hi = next((m.le for m in field.metadata if getattr(m, "le", None) is not None), None)
    if lo is None:
        return ""
    top = (f" and at most {_text(hi)}" if lo[0] else f" to {_text(hi)}") if hi is not None else ("" if lo[0] else " or more")
    words = f"{lo[0]}{_text(lo[1])}{top}"
    return f", allowed {words}"


def _usage(text: str, cls: type[KindParams], e: ValidationError) -> UsageError:
    err = e.errors()[0]
    key = str(err["loc"][0]) if err["loc"] else ""
    name = next((n for n, f in cls.model_fields.items() if (f.alias or n) == key), key)
    field = cls.model_fields.get(name)
    msg = str(err.get("ctx", {}).get("error") or err["msg"]).removeprefix("Value error, ")
    if field is None:  # a check across keys (the trace's window)
        return UsageError(f"--workload {text}: {msg}", f"write it like --workload {cls.EXAMPLE}")
    if err["type"] == "missing":
        return UsageError(f"--workload {text}: {key}= is required", f"{key} is {field.description}; e.g. --workload {cls.EXAMPLE}")
    if err["type"] in ("greater_than_equal", "greater_than", "less_than_equal"):
        msg = f"{err.get('input')} is out of range{_allowed(field)}"
    return UsageError(f"--workload {text}: {key}: {msg}", f"{key} is {field.description}; e.g. --workload {cls.EXAMPLE}")


def canonical_spec(text: str) -> str:
    return parse_spec(text).canonical()


def spec_of_table(table: Table, where: str) -> str:
    """A journey file's [workload] table (kind = "...", then the kind's keys) as a spec string."""
    values = dict(table)
    kind = values.pop("kind", None)
    if not isinstance(kind, str):
        raise UsageError(f"{where}: [workload] has no kind", 'add kind = "shared-prefix" (or fixed, mixed, random, multi-turn, trace)')
    pairs = ",".join(f"{k}={_text(v) if not isinstance(v, bool) else str(v).lower()}" for k, v in values.items())
    return canonical_spec(f"{kind}:{pairs}" if pairs else kind)


def kinds_help() -> str:
    """One line per kind and its keys with their defaults: `llmopt bench --help` shows it."""
    lines = []
    for cls in KINDS.values():
        keys = ", ".join(f"{f.alias or n}" + ("" if f.is_required() or f.default is None else f"={_text(f.default)}")
                         for n, f in cls.model_fields.items())
        lines.append(f"{cls.KIND}: {cls.ABOUT}" + (f" (keys: {keys})" if keys else ""))  # no [...]: rich markup
    return "; ".join(lines)
