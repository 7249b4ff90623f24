"""A workload's plan: what a load sends, as conversations (a single-turn request is a
conversation of one turn), each a deterministic function of (spec, seed, token space,
max_model_len) and its index: conversation(i) is the same whether 10 or 10 000 are drawn and in
whatever order, because every draw comes from a `random.Random` seeded by a string naming the
seed, the role and the index (a str seed goes through SHA-512: the same in every process,
unlike Python's salted hash()). So points of different sizes share one plan without cycling,
and two runs with one digest sent the same requests.

The load machine (load/plans.py) turns a plan into the dispatcher of a load point; the stages
take single-turn requests from it (request(i)) where they need a list."""

from __future__ import annotations

import hashlib
import json
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from llmopt_bench.core.records import PlanRecord
from llmopt_bench.core.workload import Request

DIGEST_OF = 64  # conversations the digest and the summary cover (fewer when the plan is shorter)
SHARE_BLOCK = 16  # the prefix-cache block the shareable fraction is counted in (vLLM's GPU default)


@dataclass(frozen=True)
class Turn:
    new_ids: tuple[int, ...]  # tokens this turn adds (a single-turn request: its whole prompt)
    output_len: int  # forced: exactly this many tokens, EOS ignored
    think_s: float = 0.0  # the pause after the previous turn's answer before this one is sent


@dataclass(frozen=True)
class Conversation:
    id: str  # "r0007" single-turn, "c0007" multi-turn (turn k's request id: "c0007.t2")
    turns: tuple[Turn, ...]
    group: str | None = None  # a prefix group ("g3", a trace's prefix_group)
    at_s: float | None = None  # a trace row's send time, seconds from the trace's start, after the speed-up
    prompt_id: str | None = None  # the prompt file's id (fixed, mixed)

    def request_id(self, turn: int) -> str:
        return self.id if len(self.turns) == 1 else f"{self.id}.t{turn}"


@dataclass(frozen=True)
class TokenSpace:
    """The ids a generated prompt draws from: the model's vocabulary without its special tokens."""

    vocab_size: int
    special_ids: frozenset[int] = frozenset()

    @property
    def allowed(self) -> list[int]:
        return [i for i in range(self.vocab_size) if i not in self.special_ids]

    @classmethod
    def of(cls, tokenizer, vocab_size: int | None = None) -> TokenSpace:
        """A transformers tokenizer's: its ids (at most the model's vocab_size), all_special_ids left out."""
        n = min(len(tokenizer), vocab_size) if vocab_size else len(tokenizer)
        return cls(n, frozenset(int(i) for i in getattr(tokenizer, "all_special_ids", []) or []))


def rng(seed: int, *role: object) -> random.Random:
    """The generator of one role ("conv", 7), independent of every other draw."""
    return random.Random(":".join(str(x) for x in (seed, *role)))


@dataclass
class Plan:
    """A plan's common part; a kind implements conversation(i) (workloads/synth.py, traces.py)."""

    spec: str
    seed: int
    max_len: int | None = None  # the engine's max_model_len: every turn is cut to fit (notes count it)
    size: int | None = None  # conversations in the plan; None: endless (generated kinds)
    own_schedule: bool = False  # every conversation has its send time (trace replay)
    notes: list[str] = field(default_factory=list)
    cut: set[str] = field(default_factory=set)  # conversations cut to fit max_len

    @property
    def kind(self) -> str:
        return self.spec.split(":", 1)[0]

    @property
    def multi_turn(self) -> bool:
        return False

    @property
    def mean_turns(self) -> float:
        return 1.0

    def conversation(self, i: int) -> Conversation:
        raise NotImplementedError

    def filler(self, conv_id: str, turn: int, n: int) -> tuple[int, ...]:
        """Stand-in answer ids where the engine gives none back (a server without token ids)."""
        raise NotImplementedError

    def request(self, i: int, tag: str = "") -> Request:
        """The i-th request of a single-turn plan (a finite plan cycles, ".k" on the k-th return)."""
        n = i if self.size is None else i % self.size
        c, cycle = self.conversation(n), (0 if self.size is None else i // self.size)
        t = c.turns[0]
        rid = tag + c.id + (f".{cycle}" if cycle else "")
        return Request(rid, c.prompt_id or c.id, t.new_ids, t.output_len)

    def requests(self, n: int, start: int = 0, tag: str = "") -> list[Request]:
        return [self.request(start + i, tag) for i in range(n)]

    def fit(self, conv_id: str, ids: Sequence[int], output_len: int) -> tuple[int, ...]:
        """A prompt that leaves room for its output within max_len, its head kept (a shared prefix
        stays whole); cut ones are counted in the notes."""
        if self.max_len is None or len(ids) + output_len <= self.max_len:
            return tuple(ids)
        self.cut.add(conv_id)
        return tuple(ids[: max(1, self.max_len - output_len)])

    def fitting_notes(self) -> list[str]:
        if not self.cut:
            return list(self.notes)
        return self.notes + [f"{len(self.cut)} conversation(s) cut to fit max_model_len={self.max_len} with their outputs"]

    def summary_of(self, sent: int | None = None) -> int:
        return min(n for n in (DIGEST_OF, self.size, sent) if n is not None)

    def record(self, sent: int | None = None) -> PlanRecord:
        """What run.json keeps of the plan: its spec and seed, a digest of the first conversations
        (ids, lengths, think times, send times, token ids) and their shape; `sent`: a stage that
        sends only the first `sent` (the fixed workload's --num-prompts) has those summarized."""
        n = self.summary_of(sent)
        convs = [self.conversation(i) for i in range(n)]
        return PlanRecord(spec=self.spec, seed=self.seed, digest=digest(convs), digest_of=n, multi_turn=self.multi_turn,
                          **shape(convs, self), notes=self.fitting_notes())


def digest(convs: Sequence[Conversation]) -> str:
    h = hashlib.sha256()
    for c in convs:
        h.update(json.dumps([c.id, c.group, None if c.at_s is None else round(c.at_s, 6),
                             [[list(t.new_ids), t.output_len, round(t.think_s, 6)] for t in c.turns]]).encode())
    return "sha256:" + h.hexdigest()[:16]


def stats(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {}
    s = sorted(values)
    out = {"min": s[0], "p50": statistics.median(s), "mean": statistics.fmean(s), "p99": s[min(len(s) - 1, int(0.99 * len(s)))],
           "max": s[-1]}
    return {k: round(v, 4) for k, v in out.items()}


def shape(convs: Sequence[Conversation], plan: Plan) -> dict:
    """Turns, prompt and output lengths as sent (answers of the forced length), groups, think
    times, and the share of prompt tokens a prefix cache could serve."""
    prompts, outs, thinks, shareable = [], [], [], 0
    seen: set[int] = set()
    for c in convs:
        history: tuple[int, ...] = ()
        for k, t in enumerate(c.turns):
            prompt = history + t.new_ids
            shareable += _cached(prompt, seen)
            prompts.append(len(prompt))
            outs.append(t.output_len)
            if k:
                thinks.append(t.think_s)
            history = prompt + plan.filler(c.id, k, t.output_len) if plan.multi_turn else prompt
            _remember(history, seen)
    groups = {c.group for c in convs if c.group is not None}
    return {"conversations": len(convs), "requests": len(prompts), "groups": len(groups) or None,
            "turns": stats([len(c.turns) for c in convs]), "input_tokens": stats(prompts), "output_tokens": stats(outs),
            "think_s": stats(thinks) or None,
            "shareable_fraction": round(shareable / sum(prompts), 4) if prompts else None}


def _blocks(ids: Sequence[int]) -> list[int]:
    """The chained hash of each full block of ids (a prefix cache's keys)."""
    out, h = [], 0
    for b in range(len(ids) // SHARE_BLOCK):
        h = hash((h, tuple(ids[b * SHARE_BLOCK:(b + 1) * SHARE_BLOCK])))  # ints hash the same in every process
        out.append(h)
    return out


def _cached(prompt: Sequence[int], seen: set[int]) -> int:
    """Tokens of `prompt` a prefix cache holding `seen` would serve (full blocks, never the last token)."""
    n = 0
    for h in _blocks(prompt[:-1]):
        if h not in seen:
            break
        n += SHARE_BLOCK
    return n


def _remember(ids: Sequence[int], seen: set[int]) -> None:
    seen.update(_blocks(ids))
