#!/usr/bin/env python3
"""Rewrite run.json files (run directories or bare run.json baselines) in the current schema.

    python scripts/maintainers/migrate-runs.py [--cache-was /tmp/llmopt-cache ...] results/h200 results/baselines/x.json

llmopt reads older schemas anyway (migrated in memory, numbers unchanged); this stores them
migrated, so that committed runs and baselines read as they are. Paths under this machine's
cache and home, and under every --cache-was (the cache of the machine that made the run), are
written in portable form ($LLMOPT_CACHE/..., ~/...)."""

from __future__ import annotations

import sys
from pathlib import Path

from llmopt_bench.core.models import portable_text
from llmopt_bench.core.results import load_run
from llmopt_bench.run.rundir import atomic_write


def main(argv: list[str]) -> int:
    caches, paths = [], []
    while argv:
        arg = argv.pop(0)
        if arg == "--cache-was":
            caches.append(argv.pop(0))
        else:
            paths.append(arg)
    for arg in paths:
        path = Path(arg) / "run.json" if Path(arg).is_dir() else Path(arg)
        before = path.read_text(encoding="utf-8")
        run = load_run(path)
        atomic_write(path, portable_text(run.model_dump_json(indent=1), tuple(caches)))
        print(f"{path}: schema {run.schema_version} ({len(before)} -> {path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
