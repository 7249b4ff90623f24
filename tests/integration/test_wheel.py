"""A wheel install has its journeys: built from this checkout, installed into a fresh virtualenv
(its third-party dependencies borrowed from the test environment, llmopt itself from the wheel
alone), `--stages all` resolves to the shipped journey, far from any checkout."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from testkit import ROOT

pytestmark = pytest.mark.slow

RESOLVE = """
import json, llmopt_bench
from llmopt_bench.run.registry import JOURNEY_DIR, resolve_stages
plans, _ = resolve_stages("all")
print(json.dumps({"module": llmopt_bench.__file__, "journeys": str(JOURNEY_DIR), "plans": [p.name for p in plans]}))
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(ROOT)],
                   check=True, capture_output=True, text=True, timeout=600)
    (whl,) = out.glob("llmopt_bench-*.whl")
    return whl


def test_the_wheel_ships_the_journeys(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    for journey in ("journey", "batching-vllm-only", "tp-scaling"):
        assert f"llmopt_bench/journeys/{journey}.toml" in names


def test_stages_all_resolves_from_a_fresh_virtualenv(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = next((venv / "lib").glob("python3*/site-packages"))
    with zipfile.ZipFile(wheel) as z:  # a wheel is a zip laid out for site-packages
        z.extractall(site)
    # borrow the test environment's third-party packages, without its editable llmopt (.pth
    # lines add a directory; they do not run the .pth files in it)
    (site / "borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    python = venv / "bin" / "python"
    res = subprocess.run([str(python), "-c", RESOLVE], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                         env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout)
    assert got["module"].startswith(str(site)) and got["journeys"].startswith(str(site))
    shipped = [line.split('"')[1] for line in (ROOT / "journeys" / "journey.toml").read_text().splitlines()
               if line.startswith("name = ")]
    assert shipped[0] == "hf-fp16" and got["plans"] == shipped  # the journey as shipped, whatever its length


HELP = """
import sys
from importlib.metadata import entry_points
import llmopt_bench
print(llmopt_bench.__file__, file=sys.stderr)
(script,) = {e.value: e for e in entry_points(group="console_scripts") if e.name == "llmopt"}.values()
sys.exit(script.load()(sys.argv[1:]))
"""


@pytest.mark.parametrize("check,words", [("peer", "--rate"), ("capacity", "--rejudge")])
def test_the_checks_are_commands_of_the_installed_wheel(wheel, tmp_path, check, words):
    """`llmopt check peer` and `llmopt check capacity` ship in the wheel (they were scripts of the
    checkout): the `llmopt` entry point of a wheel install, far from any checkout, shows their help."""
    names = zipfile.ZipFile(wheel).namelist()
    assert "llmopt_bench/cli/check.py" in names and f"llmopt_bench/checks/{check}.py" in names
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = next((venv / "lib").glob("python3*/site-packages"))
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    (site / "borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    res = subprocess.run([str(venv / "bin" / "python"), "-c", HELP, "check", check, "--help"], capture_output=True, text=True,
                         cwd=tmp_path, timeout=300, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stderr.startswith(str(site))  # llmopt from the wheel, not the checkout
    assert words in res.stdout and "vllm bench serve" in res.stdout, res.stdout
