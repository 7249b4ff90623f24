#!/usr/bin/env python3
"""Make a baseline's gate file (llmopt_bench/analysis/gate/gate_file.py has the rule;
docs/regression.md, "A gate that can pass"): each stage's noisy gated figures gated at the
threshold their measured noise supports, or watched, with the arithmetic, from the baseline's
repeats pooled with other runs of the same device, model, workload and stage params.

    scripts/gate/gate-file.py results/baselines/nvidia-h200-synthetic-llama2-7b.json \\
        --runs results/h200-20261204/run/run.json --runs results/h200/20261203-batching-vllm-only/run.json

writes results/baselines/nvidia-h200-synthetic-llama2-7b.gate.toml (--output FILE elsewhere; --check
only says whether the committed file is what the runs give: exit 1 when it is not). The nightly's
repeats of a fixed-workload stage are what the standard preset's stopping rule takes (--preset)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from llmopt_bench.analysis.gate import gate_file  # noqa: E402
from llmopt_bench.core.results import load_run  # noqa: E402
from llmopt_bench.run.registry import resolve_preset  # noqa: E402


def text_for(baseline: Path, runs: list[Path], preset: str, name: str | None = None) -> str:
    run = load_run(baseline)
    rule = resolve_preset(preset, cuda=not str(run.env.device or "").startswith("cpu"))[1]
    entries = gate_file.derive(run, [load_run(p) for p in runs], rule)
    names = [str(p.resolve().relative_to(ROOT)) if p.resolve().is_relative_to(ROOT) else str(p) for p in (baseline, *runs)]
    said = (f"the {preset} preset's stopping rule ({rule['repeats']} to {rule['max_repeats']}, within "
            f"+-{rule['stop_within']}%, {rule['repeat_budget_s']} s)")
    return gate_file.to_toml(name or baseline.name, entries, names, said)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("baseline", type=Path, help="the baseline file (results/baselines/<gpu>-<model>.json)")
    ap.add_argument("--runs", type=Path, action="append", default=[], help="another run of the same device, model and "
                    "workload whose repeats join the spread (repeatable; a run of other stage params adds nothing)")
    ap.add_argument("--preset", default="standard", help="the nightly's preset (its stopping rule; default standard)")
    ap.add_argument("--output", type=Path, help="default: beside the baseline, <name>.gate.toml")
    ap.add_argument("--name", help="the baseline file's name the gate file belongs to (default: BASELINE's own; a run's "
                    "run.json that will be committed as results/baselines/<gpu>-<model>.json: that name)")
    ap.add_argument("--check", action="store_true", help="exit 1 when the file differs from what the runs give")
    args = ap.parse_args()
    out = args.output or args.baseline.with_name(args.baseline.stem + gate_file.SUFFIX)
    text = text_for(args.baseline, args.runs, args.preset, args.name)
    if args.check:
        same = out.is_file() and out.read_text() == text
        print(f"{out}: {'as the runs give it' if same else 'differs from what the runs give: regenerate it'}")
        return 0 if same else 1
    out.write_text(text)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
