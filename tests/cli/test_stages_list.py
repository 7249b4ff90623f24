"""`llmopt stages` and `llmopt doctor` with a registered stage whose entry point does not load (a
plugin removed or broken, a stale install): that stage is listed as unable to run, with why and
the fix; every other stage is listed as before, and the command exits 0."""

from __future__ import annotations

import json

from testkit import run_cli, write_plugin


def test_a_broken_entry_point_is_a_row_not_a_traceback(tmp_path):
    env = write_plugin(tmp_path, "brokenplug", {"t-broken": "brokenplug:Nope"}, "raise ImportError('a broken plugin')\n")
    r = run_cli("stages", "--json", env=env, timeout=120)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    rows = {row["name"]: row for row in json.loads(r.stdout)}
    broken = rows["t-broken"]
    assert not broken["available"] and "brokenplug:Nope does not load (ImportError: a broken plugin)" in broken["reason"]
    assert broken["fix"].startswith("reinstall the package that registers it")
    assert rows["hf-fp16"]["available"]  # the others as before
    text = run_cli("stages", env={**env, "COLUMNS": "80"}, timeout=120)
    assert text.returncode == 0 and "t-broken" in text.stdout and "Traceback" not in text.stderr
    doctor = run_cli("doctor", "--json", env=env, timeout=120)
    assert doctor.returncode == 0 and not {s["name"]: s for s in json.loads(doctor.stdout)["stages"]}["t-broken"]["available"]
