"""Length and duration distributions of the workload kinds, written as short strings that need
no quoting inside `--workload KIND:key=value,...` (no commas, no spaces):

    lengths (tokens)   N                          fixed
                       A..B                       uniform integers, both ends included
                       normal:MEAN:SD[:MIN:MAX]   rounded, clamped to [MIN, MAX] (default [1, inf))
                       lognormal:MEAN:SIGMA[:MIN:MAX]   MEAN is the mean (mu = ln MEAN - SIGMA^2/2)
                       hist:FILE                  an empirical histogram: one `value[,weight]` a line
    durations          0, 2s, 500ms               fixed (a unit is required: GuideLLM's delays are
                       A..B (e.g. 1s..3s)         seconds, AIPerf's milliseconds)
                       exp:2s                     exponential with that mean (a Poisson think time)
                       normal:2s:500ms            clamped at 0

Each parses to a frozen value with its canonical text (text()), its mean, and sample(rng): one
draw from a `random.Random` the caller seeds (workloads/plan.py seeds one per role and index,
so draws do not depend on the order they are made in)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path

LENGTH_FORMS = "N, A..B, normal:MEAN:SD[:MIN:MAX], lognormal:MEAN:SIGMA[:MIN:MAX] or hist:FILE"
DURATION_FORMS = "0, 2s, 500ms, 1s..3s, exp:2s or normal:2s:500ms"


def _int(text: str, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{what} {text!r} is not a whole number") from None
    return value


def _float(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{what} {text!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"{what} {text!r} is not a finite number")
    return value


@dataclass(frozen=True)
class LengthDist:
    """A distribution of token counts (see the module doc); every draw is an int in [lo, hi]."""

    shape: str  # fixed | uniform | normal | lognormal | hist
    a: float  # fixed: the value; uniform: low; normal/lognormal: the mean
    b: float = 0.0  # uniform: high; normal: SD; lognormal: sigma
    lo: int = 1
    hi: int | None = None
    file: str | None = None
    values: tuple[int, ...] = ()
    weights: tuple[float, ...] = ()

    def text(self) -> str:
        if self.shape == "fixed":
            return str(int(self.a))
        if self.shape == "uniform":
            return f"{int(self.a)}..{int(self.b)}"
        if self.shape == "hist":
            return f"hist:{self.file}"
        clamp = "" if self.lo == 1 and self.hi is None else f":{self.lo}:{'' if self.hi is None else self.hi}"
        return f"{self.shape}:{self.a:g}:{self.b:g}{clamp}"

    @property
    def mean(self) -> float:
        """The distribution's mean before clamping (a histogram's: exact)."""
        if self.shape == "uniform":
            return (self.a + self.b) / 2
        if self.shape == "hist":
            return sum(v * w for v, w in zip(self.values, self.weights)) / sum(self.weights)
        return self.a

    def sample(self, rng: random.Random) -> int:
        if self.shape == "fixed":
            return int(self.a)
        if self.shape == "uniform":
            return rng.randint(int(self.a), int(self.b))
        if self.shape == "hist":
            return rng.choices(self.values, weights=self.weights)[0]
        if self.shape == "normal":
            x = rng.gauss(self.a, self.b)
        else:  # lognormal with mean a: mu = ln a - sigma^2 / 2
            x = rng.lognormvariate(math.log(self.a) - self.b ** 2 / 2, self.b)
        return self.clamp(round(x))

    def clamp(self, n: int) -> int:
        n = max(self.lo, n)
        return n if self.hi is None else min(self.hi, n)

    @property
    def max(self) -> int | None:
        """The largest value a draw can take (None: unbounded)."""
        if self.shape == "fixed":
            return int(self.a)
        if self.shape == "uniform":
            return int(self.b)
        if self.shape == "hist":
            return max(self.values)
        return self.hi


def parse_length(text: str) -> LengthDist:
    """A length distribution from its text (module doc); a bad one raises ValueError saying why."""
    text = text.strip()
    if text.startswith("hist:"):
        return _histogram(text[5:])
    if ":" in text:
        return _parametric(text)
    if ".." in text:
        lo, _, hi = text.partition("..")
        a, b = _int(lo, "the low end"), _int(hi, "the high end")
        if a < 1 or b < a:
            raise ValueError(f"{text}: a range A..B needs 1 <= A <= B")
        return LengthDist("uniform", a, b) if a != b else LengthDist("fixed", a)
    n = _int(text, "the length")
    if n < 1:
        raise ValueError(f"{text}: a length is at least 1 token")
    return LengthDist("fixed", n)


def _parametric(text: str) -> LengthDist:
    shape, *args = text.split(":")
    if shape not in ("normal", "lognormal"):
        raise ValueError(f"{text}: unknown distribution {shape!r}; allowed {LENGTH_FORMS}")
    if len(args) not in (2, 4):
        raise ValueError(f"{text}: {shape} takes MEAN:SD or MEAN:SD:MIN:MAX")
    mean, spread = _float(args[0], "the mean"), _float(args[1], "the spread")
    lo, hi = (_int(args[2], "MIN"), _int(args[3], "MAX") if args[3] else None) if len(args) == 4 else (1, None)
    if mean <= 0 or spread < 0:
        raise ValueError(f"{text}: the mean must be above 0 and the spread 0 or more")
    if lo < 1 or (hi is not None and hi < lo):
        raise ValueError(f"{text}: the clamp needs 1 <= MIN <= MAX")
    return LengthDist(shape, mean, spread, lo, hi)


def _histogram(path: str) -> LengthDist:
    """hist:FILE: one `value[,weight]` a line (weight 1 when left out); # starts a comment."""
    if not path:
        raise ValueError("hist: names no file; write hist:lengths.txt")
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"hist:{path}: no such file")
    values, weights = [], []
    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), start=1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        value, _, weight = line.partition(",")
        v, w = _int(value.strip(), f"{path}:{n}: the value"), _float(weight.strip() or "1", f"{path}:{n}: the weight")
        if v < 1 or w < 0:
            raise ValueError(f"{path}:{n}: a value is at least 1 and a weight at least 0")
        values.append(v)
        weights.append(w)
    if not values or sum(weights) <= 0:
        raise ValueError(f"hist:{path}: no value with a positive weight")
    return LengthDist("hist", 0.0, file=path, values=tuple(values), weights=tuple(weights))


# --- durations ----------------------------------------------------------------------------

def _seconds(text: str) -> float:
    if text == "0":
        return 0.0
    for unit, scale in (("ms", 1e-3), ("s", 1.0)):
        if text.endswith(unit):
            value = _float(text[: -len(unit)], "the duration")
            if value < 0:
                raise ValueError(f"{text}: a duration is 0 or more")
            return value * scale
    raise ValueError(f"{text!r} has no unit: write 2s or 500ms")


def _dur(seconds: float) -> str:
    return "0" if seconds == 0 else (f"{seconds * 1000:g}ms" if seconds < 1 else f"{seconds:g}s")


@dataclass(frozen=True)
class DurationDist:
    """A distribution of seconds (the module doc): fixed, uniform, exponential or normal."""

    shape: str  # fixed | uniform | exp | normal
    a: float  # fixed: the value; uniform: low; exp/normal: the mean
    b: float = 0.0  # uniform: high; normal: SD

    def text(self) -> str:
        if self.shape == "fixed":
            return _dur(self.a)
        if self.shape == "uniform":
            return f"{_dur(self.a)}..{_dur(self.b)}"
        if self.shape == "exp":
            return f"exp:{_dur(self.a)}"
        return f"normal:{_dur(self.a)}:{_dur(self.b)}"

    @property
    def mean(self) -> float:
        return (self.a + self.b) / 2 if self.shape == "uniform" else self.a

    def sample(self, rng: random.Random) -> float:
        if self.shape == "fixed":
            return self.a
        if self.shape == "uniform":
            return rng.uniform(self.a, self.b)
        if self.shape == "exp":
            return rng.expovariate(1.0 / self.a) if self.a > 0 else 0.0
        return max(0.0, rng.gauss(self.a, self.b))


def parse_duration(text: str) -> DurationDist:
    text = text.strip()
    if text.startswith("exp:"):
        return DurationDist("exp", _seconds(text[4:]))
    if text.startswith("normal:"):
        parts = text[7:].split(":")
        if len(parts) != 2:
            raise ValueError(f"{text}: normal takes MEAN:SD, like normal:2s:500ms")
        return DurationDist("normal", _seconds(parts[0]), _seconds(parts[1]))
    if ".." in text:
        lo, _, hi = text.partition("..")
        a, b = _seconds(lo), _seconds(hi)
        if b < a:
            raise ValueError(f"{text}: a range A..B needs A <= B")
        return DurationDist("uniform", a, b) if a != b else DurationDist("fixed", a)
    if ":" in text:
        raise ValueError(f"{text}: unknown duration; allowed {DURATION_FORMS}")
    return DurationDist("fixed", _seconds(text))
