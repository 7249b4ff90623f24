"""The generated kinds' plans (random, shared-prefix, multi-turn) and the prompt file's (fixed,
mixed: a list of requests, cycled). Token ids are drawn uniformly from the token space (the
vocabulary without special tokens) and sent as ids, so lengths are exact."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

from llmopt_bench.core.workload import Request
from llmopt_bench.workloads.dists import LengthDist, parse_duration, parse_length
from llmopt_bench.workloads.plan import Conversation, Plan, TokenSpace, Turn, rng
from llmopt_bench.workloads.spec import MultiTurnKind, RandomKind, SharedPrefixKind


@dataclass
class RequestsPlan(Plan):
    """A finite list of requests (the prompt file's kinds), cycled by request(i)."""

    items: Sequence[Request] = ()
    output_len: int = 1

    def __post_init__(self) -> None:
        self.size = len(self.items)

    def conversation(self, i: int) -> Conversation:
        r = self.items[i]
        return Conversation(r.id, (Turn(r.token_ids, r.output_len or self.output_len),), prompt_id=r.prompt_id)

    def filler(self, conv_id: str, turn: int, n: int) -> tuple[int, ...]:
        return ()


@dataclass
class GeneratedPlan(Plan):
    space: TokenSpace = field(default_factory=lambda: TokenSpace(2))

    @cached_property
    def ids(self) -> list[int]:
        return self.space.allowed

    def draw(self, n: int, *role: object) -> tuple[int, ...]:
        return tuple(rng(self.seed, self.kind, *role).choices(self.ids, k=n))

    def filler(self, conv_id: str, turn: int, n: int) -> tuple[int, ...]:
        return self.draw(n, "answer", conv_id, turn)


@dataclass
class RandomPlan(GeneratedPlan):
    """Independent requests: a prompt of `in` tokens (after an optional shared prefix), `out` forced."""

    params: RandomKind = field(default_factory=RandomKind)

    @cached_property
    def dists(self) -> tuple[LengthDist, LengthDist]:
        return parse_length(self.params.in_), parse_length(self.params.out)

    def conversation(self, i: int) -> Conversation:
        in_dist, out_dist = self.dists
        r = rng(self.seed, self.kind, "lengths", i)
        n_in, n_out = in_dist.sample(r), out_dist.sample(r)
        cid = f"r{i:04d}"
        prefix = self.draw(self.params.prefix, "prefix")
        ids = self.fit(cid, prefix + self.draw(n_in, "prompt", i), n_out)
        return Conversation(cid, (Turn(ids, n_out),), group="all" if prefix else None)


@dataclass
class SharedPrefixPlan(GeneratedPlan):
    """groups x per_group requests a window, a group's requests sharing its prefix."""

    params: SharedPrefixKind = field(default_factory=SharedPrefixKind)

    @cached_property
    def dists(self) -> tuple[LengthDist, LengthDist, LengthDist]:
        p = self.params
        return parse_length(p.prefix), parse_length(p.suffix), parse_length(p.out)

    cache: dict[tuple[str, int], tuple[int, ...]] = field(default_factory=dict)  # group prefixes and windows, drawn once

    def prefix(self, g: int) -> tuple[int, ...]:
        if ("prefix", g) not in self.cache:
            n = self.dists[0].sample(rng(self.seed, self.kind, "prefix-len", g))
            self.cache["prefix", g] = self.draw(n, "prefix", g)
        return self.cache["prefix", g]

    def window(self, w: int) -> tuple[int, ...]:
        """Window w's groups in order: each group per_group times, shuffled by the seed (order=shuffled)."""
        if ("window", w) not in self.cache:
            p = self.params
            order = [g for g in range(p.groups) for _ in range(p.per_group)]
            if p.order == "shuffled":
                rng(self.seed, self.kind, "window", w).shuffle(order)
            self.cache["window", w] = tuple(order)
        return self.cache["window", w]

    def group_of(self, i: int) -> int:
        p = self.params
        if p.assign == "random":
            return rng(self.seed, self.kind, "group", i).randrange(p.groups)
        n = p.groups * p.per_group
        return self.window(i // n)[i % n]

    def conversation(self, i: int) -> Conversation:
        _, suffix, out = self.dists
        g, r = self.group_of(i), rng(self.seed, self.kind, "lengths", i)
        n_suffix, n_out = suffix.sample(r), out.sample(r)
        cid = f"r{i:04d}"
        ids = self.fit(cid, self.prefix(g) + self.draw(n_suffix, "suffix", i), n_out)
        return Conversation(cid, (Turn(ids, n_out),), group=f"g{g}")


@dataclass
class MultiTurnPlan(GeneratedPlan):
    """Conversations: turn k sends the history (every earlier prompt and answer) and a new
    message; a conversation whose next turn would not fit max_len ends before it."""

    params: MultiTurnKind = field(default_factory=MultiTurnKind)

    @property
    def multi_turn(self) -> bool:
        return True

    @cached_property
    def dists(self) -> dict:
        p = self.params
        return {"turns": parse_length(p.turns), "first": parse_length(p.first), "msg": parse_length(p.msg),
                "out": parse_length(p.out), "think": parse_duration(p.think)}

    @property
    def mean_turns(self) -> float:
        return self.dists["turns"].mean

    def conversation(self, i: int) -> Conversation:
        d, cid = self.dists, f"c{i:04d}"
        r = rng(self.seed, self.kind, "lengths", i)
        turns, context = [], 0
        for k in range(d["turns"].sample(r)):
            n_new = (d["first"] if k == 0 else d["msg"]).sample(r)
            n_out, think = d["out"].sample(r), (d["think"].sample(r) if k else 0.0)
            new = (self.draw(self.params.prefix, "prefix") if k == 0 else ()) + self.draw(n_new, "message", i, k)
            if self.max_len is not None and context + len(new) + n_out > self.max_len:
                if k == 0:  # even the first turn is too long: its message is cut
                    turns.append(Turn(self.fit(cid, new, n_out), n_out))
                else:
                    self.cut.add(cid)
                break
            turns.append(Turn(new, n_out, think))
            context += len(new) + n_out
        return Conversation(cid, tuple(turns))

    def think_mean_s(self) -> float:
        return self.dists["think"].mean
