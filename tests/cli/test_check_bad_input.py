"""`llmopt check peer` and `llmopt check capacity`: bad input is refused before anything starts
(no server, no model prepared, nothing written): exit 2, one error line naming what was wrong,
one fix line. In-process through the CLI's own entry point (tests/testkit.cli_in_process)."""

from __future__ import annotations

import socket

import pytest
from testkit import cli_in_process as main

UNWRITABLE = "/proc/llmopt-nowhere"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CASES = [
    (["capacity", "--precision", "2"], "--precision: input should be less than 1"),
    (["capacity", "--above", "0.9"], "--above: input should be greater than 1"),
    (["capacity", "--slo", "ttft_p99=2"], "SLO target ttft_p99=2: no unit"),
    (["capacity", "--vllm-runs", "capacity,nope"], "--vllm-runs: input should be 'capacity', 'batch1' or 'inf'"),
    (["capacity", "--concurrency", "1,x"], "--concurrency '1,x': not a list of concurrencies"),
    (["capacity", "--client-cpus", "4096"], "--client-cpus 4096: CPUs [4096] are not this process's to use"),
    (["capacity", "--temperature", "-1"], "--temperature -1.0: input should be greater than or equal to 0"),
    (["capacity", "--dtype", "int3"], "--dtype: input should be 'auto', 'float16', 'bfloat16' or 'float32'"),
    (["capacity", "--hold", "-1"], "--hold: input should be greater than or equal to 0"),
    (["capacity", "--prompt-format", "ids"], "--prompt-format: input should be 'text' or 'tokens'"),
    (["capacity", "--out", UNWRITABLE], "--out"),
    (["capacity", "--rejudge", "--out", "/nonexistent-llmopt"], "--rejudge reads a finished check's --out"),
    (["peer", "--rate", "0", "--concurrency", "4"], "--rate '0': not a request rate"),
    (["peer", "--rate", "fast", "--concurrency", "4"], "--rate 'fast': not a request rate"),
    (["peer", "--rate", "8", "--concurrency", "0"], "--concurrency: input should be greater than or equal to 1"),
    (["peer", "--rate", "8", "--concurrency", "4", "--tolerance", "1.5"], "--tolerance: input should be less than 1"),
    (["peer", "--rate", "8", "--concurrency", "4", "--blocks", "3", "--num-prompts", "2"], "--blocks 3: more blocks than"),
    (["peer", "--rate", "8", "--concurrency", "4", "--api-key-env", "LLMOPT_NO_SUCH_KEY"], "the variable is not set"),
    (["peer", "--rate", "8", "--concurrency", "4", "--server-session", "other"], "--server-session: input should be 'same' or 'own'"),
]


@pytest.mark.parametrize("args,words", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_bad_input_is_one_line_and_its_fix_exit_2(args, words, capfd, tmp_path, monkeypatch):
    monkeypatch.delenv("LLMOPT_NO_SUCH_KEY", raising=False)
    monkeypatch.chdir(tmp_path)
    assert main(["check", *args]) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 2 and err[0].startswith("error: ") and words in err[0], err
    assert err[1].startswith("  fix: ")
    assert not list(tmp_path.iterdir())  # nothing written, nothing started


def test_a_url_no_server_answers_is_refused_before_anything_starts(capfd, tmp_path):
    url = f"http://127.0.0.1:{closed_port()}"
    assert main(["check", "peer", "--rate", "8", "--concurrency", "4", "--url", url, "--out", str(tmp_path / "o")]) == 2
    err = capfd.readouterr().err
    assert f"--url {url}: no server answers there" in err and "drop --url" in err and not (tmp_path / "o").exists()
