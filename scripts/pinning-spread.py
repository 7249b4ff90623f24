#!/usr/bin/env python3
"""Does `--pin-cpu` narrow the spread between repeats? (docs/regression.md, "The host").

One model load, then blocks of R timed repeats of the fixed workload through the scenario's own
loop (scenarios/fixed.measure, the code `llmopt bench` runs), alternately unpinned and pinned
(LLMOPT_PIN_CPU: the main thread on one core, warmed before each repeat), so that both see the
same hour of a shared host. Per block: the CV of the repeats' TPOT p50 (the between-repeat noise
the gate sees) and the host's load; the medians over blocks, each side.

    scripts/pinning-spread.py                                   # synthetic:tiny on this machine
    scripts/pinning-spread.py --model synthetic:llama2-7b --blocks 4 --repeats 5 --num-prompts 4 --max-new-tokens 100
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def block(engine, workload, ctx, pinned: bool) -> dict:
    from llmopt_bench.measure import pinning
    from llmopt_bench.scenarios.fixed.run import measure, stopping_rule

    os.environ[pinning.ENV] = "1" if pinned else "0"
    rule, conditions = stopping_rule(workload), []
    measure(engine, workload, ctx, rule, conditions)
    per = [v for v in rule.record.per_repeat if v]
    cv = statistics.stdev(per) / statistics.mean(per) if len(per) > 1 else None
    return {"pinned": pinned, "tpot_ms": [round(v * 1e3, 3) for v in per], "cv": cv,
            "load1": [c.load1 for c in conditions], "host_kops": [c.host_kops for c in conditions],
            "pinned_cpu": conditions[0].pinned_cpu if conditions else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="synthetic:tiny")
    ap.add_argument("--blocks", type=int, default=6, help="blocks per side (default 6)")
    ap.add_argument("--repeats", type=int, default=5, help="repeats per block (default 5)")
    ap.add_argument("--num-prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    import torch

    from llmopt_bench.checkpoints.prepare import prepare
    from llmopt_bench.core.contract import StageContext
    from llmopt_bench.core.models import parse_model
    from llmopt_bench.core.workload import WorkloadConfig
    from llmopt_bench.engines.hf.engine import HFEngineParams, TransformersEngine
    from llmopt_bench.measure.energy import TimedMeter
    from llmopt_bench.scenarios.fixed.run import warmup

    device = "cuda" if torch.cuda.is_available() else "cpu"
    tmp = Path(tempfile.mkdtemp())
    ctx = StageContext(run_dir=tmp, stage_dir=tmp, device=device, meter=TimedMeter())
    info = prepare(parse_model(args.model))
    engine, _ = TransformersEngine.start(info, HFEngineParams(measure_overhead=False), ctx)
    workload = WorkloadConfig(num_prompts=args.num_prompts, max_new_tokens=args.max_new_tokens, repeats=args.repeats, warmup=1)
    warmup(engine, workload, ctx)
    rows = []
    for i in range(args.blocks):
        for pinned in ((False, True) if i % 2 == 0 else (True, False)):  # alternate which goes first
            rows.append(block(engine, workload, ctx, pinned))
            print(json.dumps(rows[-1]), flush=True)
    for pinned in (False, True):
        cvs = [r["cv"] for r in rows if r["pinned"] == pinned and r["cv"] is not None]
        loads = [x for r in rows if r["pinned"] == pinned for x in r["load1"]]
        print(f"{'pinned  ' if pinned else 'unpinned'}: between-repeat CV of TPOT p50, median over {len(cvs)} blocks "
              f"{statistics.median(cvs) * 100:.1f}% (blocks: {', '.join(f'{c * 100:.0f}%' for c in cvs)}); "
              f"host load {min(loads):.1f}-{max(loads):.1f}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
