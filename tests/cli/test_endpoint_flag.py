"""`llmopt bench --endpoint URL --model NAME`: the openai-endpoint stage on a server the user
runs, from one flag. A real closed port (nothing listens on it) is refused cleanly: the stage is
skipped with the reason and the fix, the command exits 3 as for any stage named on the command
line, and no traceback; missing --model is a usage error."""

from __future__ import annotations

import socket

from testkit import read_run, run_cli


def closed_port() -> int:
    with socket.socket() as s:  # bound then closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_endpoint_that_refuses_connections_is_skipped_with_the_fix(tmp_path, tiny_model):
    url = f"http://127.0.0.1:{closed_port()}"
    res = run_cli("bench", "--endpoint", url, "--model", "served-name", "--api-key-env", "MY_KEY",
                  "--no-report", "--output", str(tmp_path / "run"), env={"MY_KEY": "sk-secret-123"})
    assert res.returncode == 3, res.stderr[-2000:]
    assert "Traceback" not in res.stderr and "connection refused" in res.stderr and "fix:" in res.stderr
    run = read_run(tmp_path / "run")
    (stage,) = run["stages"]
    assert stage["name"] == "openai-endpoint" and stage["status"] == "skipped"
    assert stage["params"]["endpoint"] == url and stage["params"]["model"] == "served-name"
    assert run["model"]["source"] == "endpoint:served-name"
    assert "sk-secret-123" not in (tmp_path / "run" / "run.json").read_text()


def test_endpoint_without_a_model_name_is_a_usage_error(tmp_path):
    res = run_cli("bench", "--endpoint", "http://127.0.0.1:9", "--output", str(tmp_path / "run"))
    assert res.returncode == 2 and "--model" in res.stderr and "Traceback" not in res.stderr
