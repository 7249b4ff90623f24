"""Which configurations `llmopt tune` screens, and which of the screened it narrows (tune/tuner.py
runs them): a plan computed from the record alone, so a resumed run makes the same choices.

- **Neighbours**: every configuration that changes one knob from a base (vLLM's defaults in the
  first round, the round's winner after), in the space file's order.
- **Helpers**: the neighbours whose ceiling beat the base's by more than the screen's noise, each
  knob's helping values best first.
- **Combinations** of the helpers (two knobs or more, each at one of its helping values), most
  promising first: the product of their gains, the independence guess (two knobs that each add
  20% make 44% together), larger combinations first where that ties; a combination that cannot
  start or fails the quality gate leaves the next values of its knobs to try.
- **Successive halving, rung 0 = the ceiling**: of what a phase screened, at most the best 1/eta
  by ceiling are narrowed, and only those whose ceiling leaves room above the best held capacity
  (a capacity under the SLO never exceeds the ceiling: a rate the server does not complete cannot
  be sustained), so a configuration that cannot win is never searched."""

from __future__ import annotations

import json
import math
from itertools import combinations as subsets
from itertools import product

from llmopt_bench.tune.space import Config, Space


def key(config: Config) -> str:
    return json.dumps(config, sort_keys=True)


def neighbours(space: Space, base: Config) -> list[Config]:
    """Every configuration one knob away from base, in the space's order."""
    return [{**base, knob: v} for knob, values in space.knobs.items() for v in values if v != base.get(knob)]


def changed(config: Config, base: Config) -> dict[str, object]:
    """The knobs config sets otherwise than base."""
    return {k: v for k, v in config.items() if base.get(k) != v}


Helping = dict[str, list[tuple[object, float]]]  # knob -> its helping values and their gains, best first


def helpers(base: Config, base_rps: float, screened: list[tuple[Config, float]], noise: float) -> Helping:
    """The single-knob changes whose ceiling beat the base's by more than the noise, by knob."""
    out: Helping = {}
    for config, rps in screened:
        diff = changed(config, base)
        if len(diff) == 1 and beats(rps, base_rps, noise):
            (knob, value), = diff.items()
            out.setdefault(knob, []).append((value, rps / base_rps))
    return {k: sorted(v, key=lambda x: -x[1]) for k, v in out.items()}


def combinations(base: Config, helping: Helping, limit: int | None = None) -> list[Config]:
    """The combinations of two or more helping knobs, each at one of its helping values, most
    promising first (at most `limit`)."""
    knobs = sorted(helping)
    out: list[tuple[float, int, Config]] = []
    for n in range(2, len(knobs) + 1):
        for chosen in subsets(knobs, n):
            for values in product(*(helping[k] for k in chosen)):
                gain = math.prod(g for _, g in values)
                out.append((gain, n, {**base, **{k: v for k, (v, _) in zip(chosen, values)}}))
    out.sort(key=lambda x: (-x[0], -x[1]))
    return [config for _, _, config in out][:limit]


def beats(a: float | None, b: float | None, noise: float) -> bool:
    """a higher than b beyond the noise of one point."""
    return a is not None and (b is None or a > b * (1 + noise))


def can_win(ceiling_rps: float | None, best_held_rps: float | None, noise: float) -> bool:
    """Whether a configuration whose server completed ceiling_rps all at once could hold more than
    best_held_rps (its capacity cannot exceed its ceiling; one point's noise allowed for)."""
    return ceiling_rps is not None and (best_held_rps is None or ceiling_rps * (1 + noise) > best_held_rps)


def halving(screened: int, eta: int) -> int:
    """How many of `screened` configurations a phase may narrow: the best 1/eta, at least one."""
    return max(1, math.ceil(screened / eta))
