"""Declared drift: where a committed baseline was measured with other stage params than the
journey runs today, said in one reviewed file (results/baselines/drift.toml), each entry with
its reason and the device command that refreshes the baseline. tests/unit/test_baseline_params.py
fails on any difference it does not declare, and on a declaration that no longer differs, so the
next params change comes with its new baseline or says why not; `llmopt compare --drift FILE`
accepts exactly the declared params of the declared stages (those stages are still not compared:
their numbers measure other settings), never a crash or another param of theirs.

    [[drift]]
    baseline = "nvidia-h200-synthetic-llama2-7b.json"   # a file in results/baselines
    stage = "a-stage"
    params = ["max_num_batched_tokens", "max_num_seqs"]
    reason = "..."
    refresh = "..."                                     # the device command"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import tomllib

from llmopt_bench.core.errors import UsageError

FIELDS = ("baseline", "stage", "params", "reason", "refresh")


@dataclass(frozen=True)
class Drift:
    baseline: str
    stage: str
    params: tuple[str, ...]
    reason: str
    refresh: str


def load_drift(path: Path) -> list[Drift]:
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"drift file not found: {path}", "pass results/baselines/drift.toml, or drop --drift") from None
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{path}: not valid TOML ({e})") from None
    out = []
    for i, entry in enumerate(data.get("drift", [])):
        missing = [f for f in FIELDS if not entry.get(f)]
        if missing or set(entry) - set(FIELDS):
            raise UsageError(f"{path}: [[drift]] #{i + 1} needs exactly {', '.join(FIELDS)}"
                             + (f" (missing {', '.join(missing)})" if missing else ""),
                             "every declared drift says which baseline, stage and params, why, and how to refresh it")
        out.append(Drift(entry["baseline"], entry["stage"], tuple(entry["params"]), entry["reason"], entry["refresh"]))
    return out


def declared_for(drifts: list[Drift], baseline: Path) -> dict[str, Drift]:
    """The entries of one baseline file (by its name), by stage."""
    return {d.stage: d for d in drifts if d.baseline == Path(baseline).name}
