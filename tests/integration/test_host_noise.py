"""A real noisy neighbour, and a real run's slower copy, through `llmopt compare` (issues 25, 33).

hf-fp16 on synthetic:tiny (8 prompts x 32 tokens, 3 repeats) is run twice: alone, then beside
busy Python loops this test starts (one a CPU: two on the 2-core host) (`while True: pass`, at nice 0, each in a session of its
own: with autogroup scheduling the kernel shares CPU between sessions first) and kills.

- The neighbour: the second run's repeats record it (the stage's CPU share falls, its main thread
  is preempted more), and `llmopt compare` says the host moved and which signal: exit 8,
  "inconclusive (host)", never a regression of the build and never a pass. Before issue 33 it
  read the slowdown as regressions (exit 5) wherever the host-speed index happened not to move.
- The copy: the quiet run with every time x1.2 and every rate /1.2 (tests/gatekit.py), its
  recorded conditions as they were. This is issue 33's defect reproduced, not a calibration:
  the gate read every timing "inconclusive" and printed "No regression." (exit 0). Now a 20%
  slowdown either regresses (exit 5) or is inconclusive (exit 9): never green."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from gatekit import load, repeats_run, write
from testkit import run_cli

pytestmark = pytest.mark.slow

BENCH = ("bench", "--stages", "hf-fp16", "--model", "synthetic:tiny", "--num-prompts", "8", "--max-new-tokens", "32",
         "--repeats", "3", "--warmup", "1")


def at_nice_0() -> None:
    try:
        os.setpriority(os.PRIO_PROCESS, 0, 0)
    except OSError:  # without the privilege, the test's own niceness
        pass


def conditions(run_dir) -> list[dict]:
    return json.loads((run_dir / "run.json").read_text())["stages"][0]["extra"]["conditions"]


QUIET_SHARE = 0.75  # of this process's CPUs: the stage had its cores, the premise of "quiet"
QUIET_TRIES = 3


def is_quiet(run_dir) -> bool:
    shares = sorted(c["cpu_share"] for c in conditions(run_dir))
    return shares[len(shares) // 2] >= QUIET_SHARE * len(os.sched_getaffinity(0))


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("host-noise")
    r = run_cli(*BENCH, "-o", str(tmp / "quiet0"), timeout=1200)
    assert r.returncode == 0, r.stderr
    return tmp, tmp / "quiet0"


@pytest.fixture(scope="module")
def runs(first):
    """A quiet run (the machine is shared: under the heavy lock, other sessions' light work still
    runs; a run whose stage did not get its cores is made again, at most QUIET_TRIES times in
    all), then the same run beside two busy loops."""
    tmp, quiet = first
    for attempt in range(1, QUIET_TRIES):
        if is_quiet(quiet):
            break
        quiet = tmp / f"quiet{attempt}"
        r = run_cli(*BENCH, "-o", str(quiet), timeout=1200)
        assert r.returncode == 0, r.stderr
    if not is_quiet(quiet):
        pytest.skip(f"the host was busy through {QUIET_TRIES} quiet runs (CPU share below {QUIET_SHARE:.0%} of its CPUs): "
                    "no quiet run to set a neighbour against")
    noisy = tmp / "noisy"
    # one busy loop a CPU: the two on the 2-core host, as many on a bigger one
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=at_nice_0, start_new_session=True)
            for _ in range(len(os.sched_getaffinity(0)))]
    try:
        r = run_cli(*BENCH, "-o", str(noisy), timeout=1800)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    assert r.returncode == 0, r.stderr
    return tmp, quiet, noisy


def test_a_busy_neighbour_is_the_hosts_and_compare_names_the_signal(runs):
    tmp, quiet, noisy = runs
    before, after = conditions(quiet), conditions(noisy)
    assert len(before) == len(after) == 3
    assert sorted(c["cpu_share"] for c in after)[1] < 0.8 * min(c["cpu_share"] for c in before), (before, after)
    report = (noisy / "report.md").read_text()
    assert "host speed " in report and " kop/s (cpu)" in report  # beside the repeats, in hf-fp16's details
    assert "hf-fp16: GPU busy not measured (a CPU run: the host is the device)" in report
    r = run_cli("compare", "--format", "md", str(quiet), str(noisy), env={"LLMOPT_HISTORY_DB": str(tmp / "none.sqlite")})
    assert r.returncode == 8, (r.stdout, r.stderr)
    assert "Host of hf-fp16 moved: CPU share " in r.stdout and "(the new run's host busier)" in r.stdout
    row = next(line for line in r.stdout.splitlines() if line.startswith("| hf-fp16 | TPOT p50 |"))
    assert "**inconclusive (host)**" in row, row
    assert "inconclusive (host): hf-fp16 " in r.stderr and "CPU share" in r.stderr and "REGRESSED" not in r.stdout
    assert "No regression." not in r.stdout


def test_a_real_run_20_percent_slower_is_never_green(first):
    tmp, quiet = first
    slower = write(tmp / "slower", repeats_run(load(quiet), [0, 1, 2], factor=1.2))
    r = run_cli("compare", "--format", "md", str(quiet), str(slower), env={"LLMOPT_HISTORY_DB": str(tmp / "none.sqlite")})
    assert r.returncode in (5, 9), (r.stdout, r.stderr)
    assert "No regression" not in r.stdout and "Host of hf-fp16 moved" not in r.stdout
    row = next(line for line in r.stdout.splitlines() if line.startswith("| hf-fp16 | TPOT p50 |"))
    assert "+20.0%" in row and ("**REGRESSED**" in row or "**inconclusive**: " in row), row
