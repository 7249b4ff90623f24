"""The checkout's journeys folder (issue 36): `journeys/` at the root is the shipped journeys
(package data), and `stages/`, its old name, still reads the same files for one release."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmopt_bench.run.registry import JOURNEY_DIR, resolve_stages

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("folder", ["journeys", "stages"])
def test_the_root_folder_is_the_shipped_journeys(folder):
    assert (ROOT / folder).resolve() == JOURNEY_DIR.resolve()


def test_the_old_path_reads_the_same_journey(monkeypatch):
    monkeypatch.chdir(ROOT)
    new, _ = resolve_stages("journeys/quick.toml")
    old, _ = resolve_stages("stages/quick.toml")
    assert [(p.name, p.params) for p in new] == [(p.name, p.params) for p in old] != []
