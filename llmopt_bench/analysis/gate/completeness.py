"""Whether the new run is a complete comparison with the baseline (`llmopt compare`'s exit 6),
each gap with its kind, so that the fix can say what to do about it: a run that did not finish
resumes, a stage it never measured is added with `--resume DIR --stages`, a stage that failed
needs its cause fixed and `--resume DIR --rerun STAGE`, a stage measured with other params needs a baseline made
with the same ones, and any of them may be accepted by name with --allow-missing.

Stages whose params differ are not compared (docs/regression.md): their numbers measure other
settings, as `llmopt history show` says of the same pair ("not comparable")."""

from __future__ import annotations

import difflib
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from llmopt_bench.core.errors import UsageError
from llmopt_bench.core.results import RunResult, StageResult

ALLOW_ALL, ALLOW_RUN = "all", "run"  # --allow-missing names besides stages
RESUMED_AGAIN = ("interrupted", "killed")  # what `llmopt bench --resume` runs again (runner.RERUN)


@dataclass(frozen=True)
class Gap:
    stage: str | None  # None: the run itself
    kind: str  # unfinished | missing | rerun | failed | skipped | params
    text: str
    params: tuple[str, ...] = ()  # kind params: the params that differ


def parse_allowed(specs: Sequence[str] | None) -> set[str]:
    return {p.strip() for spec in specs or [] for p in spec.split(",") if p.strip()}


def check_allowed(allowed: Iterable[str], known: Collection[str]) -> None:
    """Refuse a name that is neither a stage of the runs (or a registered one) nor 'run'/'all':
    a typo would otherwise accept nothing, silently."""
    choices = sorted({*known, ALLOW_RUN, ALLOW_ALL})
    for name in sorted(allowed):
        if name not in choices:
            close = difflib.get_close_matches(name, choices, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]}? " if close else ""
            raise UsageError(f"--allow-missing {name!r}: no such stage in either run",
                             f"{hint}name stages of the runs ({', '.join(sorted(known)) or 'none'}), 'run' or 'all'")


def _value(v) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def params_differing(base: StageResult, new: StageResult) -> list[str]:
    """The names of the params the two results set differently."""
    b, n = base.params or {}, new.params or {}
    return [k for k in sorted(set(b) | set(n)) if b.get(k) != n.get(k)]


def params_diff(base: StageResult, new: StageResult) -> list[str]:
    """'concurrency [1, 16, 64] vs [1, 4, 16]' for each param the two results set differently."""
    b, n = base.params or {}, new.params or {}
    return [f"{k} {_value(b.get(k))} vs {_value(n.get(k))}" for k in params_differing(base, new)]


def params_note(diff: list[str], shown: int = 3) -> str:
    more = f", and {len(diff) - shown} more" if len(diff) > shown else ""
    return f"params differ ({'; '.join(diff[:shown])}{more})"


def _stage_gap(name: str, b: StageResult | None, n: StageResult | None) -> Gap | None:
    if n is None:
        return Gap(name, "missing", f"{name}: missing from the new run (ok in the baseline)") if b is not None and b.status == "ok" else None
    if n.status != "ok" and (n.status != "skipped" or (b is not None and b.status == "ok")):
        why = f" ({n.reason})" if n.reason else ""
        kind = "rerun" if n.status in RESUMED_AGAIN else "skipped" if n.status == "skipped" else "failed"
        return Gap(name, kind, f"{name}: {n.status} in the new run{why}" + (" (ok in the baseline)" if b and b.status == "ok" else ""))
    if b is not None and b.status == "ok" and n.status == "ok" and (diff := params_diff(b, n)):
        return Gap(name, "params", f"{name}: not comparable, {params_note(diff)}", tuple(params_differing(b, n)))
    return None


def gaps(base: RunResult, new: RunResult, allowed: Collection[str] = frozenset(),
         declared: Mapping[str, Collection[str]] | None = None) -> list[Gap]:
    """Why the new run is not a complete comparison with the baseline: a stage the baseline
    measured that the new run lacks or did not finish ok, a stage that crashed (error, oom,
    timeout, interrupted: never accepted silently, even when the baseline crashed too), a stage
    measured with other params, or a run that did not complete. `skipped` on both sides is the
    same outcome, not a gap; other params that the baseline's drift file declares for the stage
    (`declared`: stage -> params, analysis/gate/baseline_drift.py), and only those, are accepted."""
    every = ALLOW_ALL in allowed
    out = []
    if new.status != "complete" and not (every or ALLOW_RUN in allowed):
        out.append(Gap(None, "unfinished", f"the new run is {new.status}, not complete"))
    names = [s.name for s in base.stages] + [s.name for s in new.stages if base.stage(s.name) is None]
    for name in names:
        if not (every or name in allowed) and (gap := _stage_gap(name, base.stage(name), new.stage(name))):
            if not (gap.kind == "params" and set(gap.params) <= set((declared or {}).get(name, ()))):
                out.append(gap)
    return out


def incomplete(base: RunResult, new: RunResult, allowed: Collection[str] = frozenset()) -> list[str]:
    return [g.text for g in gaps(base, new, allowed)]


def gap_fix(found: Sequence[Gap], new_dir: str) -> str:
    """What to do about the gaps, by kind; never `--resume` on a complete run that it would not change."""
    def names(*kinds: str) -> str:
        return ",".join(g.stage for g in found if g.kind in kinds and g.stage)

    steps = []
    if any(g.kind == "unfinished" for g in found) or names("rerun"):
        steps.append(f"finish the run: llmopt bench --resume {new_dir}")
    if names("missing"):
        steps.append(f"measure the missing stages into it: llmopt bench --resume {new_dir} --stages {names('missing')}")
    if names("failed"):
        steps.append(f"{names('failed')} failed (its log under {new_dir}/logs says why): fix the cause, then measure it "
                     f"again in place: llmopt bench --resume {new_dir} --rerun {names('failed')}")
    if names("params"):
        steps.append(f"{names('params')} ran with other params: compare against a baseline made with the same params")
    accept = names("missing", "rerun", "failed", "skipped", "params")
    steps.append(f"or accept the gaps by name: --allow-missing {accept or 'STAGE'}"
                 + (" (and 'run' for an unfinished run)" if any(g.kind == "unfinished" for g in found) else ""))
    return "; ".join(steps)
