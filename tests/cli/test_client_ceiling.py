"""`llmopt check client` (cli/check_client.py): bad input refused before anything starts (exit
2, one line and its fix), and one short real run against a test server it starts: the ceiling
table on stdout (one process and two workers), progress on stderr, every point in --json."""

from __future__ import annotations

import json

import pytest
from testkit import cli_in_process as main
from testkit import run_cli

from llmopt_bench.engines.vllm.server import free_port

UNWRITABLE = "/proc/llmopt-nowhere"


@pytest.mark.parametrize("argv,says", [
    (["--point-s", "2", "--warmup-s", "2"], "--warmup-s 2 leaves nothing"),
    (["--start-rps", "500", "--max-rps", "100"], "--start-rps 500 is above --max-rps 100"),
    (["--client-cpus", "0,99999"], "--client-cpus 0,99999"),
    (["--client-cpus", "zero"], "--client-cpus 'zero'"),
    (["--endpoint", "localhost:8100"], "not an http(s) URL"),
    (["--endpoint", "http://127.0.0.1:{port}"], "no llmopt test server answers there"),
    (["--endpoint", "http://127.0.0.1:{port}", "--server-cpus", "0"], "--server-cpus is for the test server started here"),
    (["--json", UNWRITABLE + "/c.json"], "--json"),
    (["--tokens", "0"], "--tokens"),
])
def test_bad_input_is_refused_with_a_fix(capfd, argv, says):
    port = free_port()
    code = main(["check", "client", *[a.format(port=port) for a in argv]])
    err = capfd.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and "Traceback" not in err, err
    assert len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith("  fix: "), err
    assert says.format(port=port) in lines[0]


def test_a_short_ceiling_run_prints_the_table(tmp_path):
    out = tmp_path / "ceiling.json"
    proc = run_cli("check", "client", "--no-vllm", "--workers", "2", "--interval-ms", "5", "--tokens", "10",
                   "--point-s", "1.5", "--warmup-s", "0.3", "--start-rps", "20", "--max-rps", "30",
                   "--send-delay-ms", "1000", "--read-delay-ms", "1000", "--json", str(out), timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("| client | req/s held | events/s | send delay p99 |")
    assert lines[2].startswith("| 1 process | ") and lines[3].startswith("| 2 worker processes | ")
    assert "test server at http://127.0.0.1:" in proc.stderr and "Traceback" not in proc.stderr
    data = json.loads(out.read_text())
    assert [c["config"] for c in data["ceilings"]] == ["1 process", "2 worker processes"]
    for c in data["ceilings"]:  # 20 req/s held (bounds of a second: a busy host's delays aside), then 30, the highest asked
        assert [p["rate"] for p in c["points"]] == [20.0, 30.0] and c["best"]["rate"] == 30.0
        assert all(p["failed"] == 0 and p["events_per_s"] > 0 for p in c["points"])
    assert [p["workers"] for p in data["ceilings"][1]["points"]] == [2, 2]
