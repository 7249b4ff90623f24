"""The one parser of every --*-cpus option (cli/check.cpus): lists and ranges, in the order
written (a client's worker k goes on the k-th core), each core once; a bad one is a UsageError
naming the option. `llmopt check client` parsed its two options with a copy that took no range."""

from __future__ import annotations

import os

import pytest

from llmopt_bench.cli.check import cpus
from llmopt_bench.core.errors import UsageError

HAVE = sorted(os.sched_getaffinity(0))


def test_a_range_and_a_list_keep_the_order_written():
    a, b = HAVE[0], HAVE[-1]
    assert cpus(f"{a}-{b}") == tuple(range(a, b + 1))
    assert cpus(f"{b},{a}") == ((b, a) if a != b else (a,))
    assert cpus(f"{a},{a}-{a}") == (a,)
    assert cpus(None) is None and cpus(" ") is None


@pytest.mark.parametrize("text,says", [
    ("zero", "not a list of CPUs"), ("3-1", "not a list of CPUs"), ("0-", "not a list of CPUs"),
    ("99999", "CPUs [99999] are not this process's to use"),
])
def test_a_bad_list_names_its_option_and_the_fix(text, says):
    with pytest.raises(UsageError) as e:
        cpus(text, "--server-cpus")
    assert f"--server-cpus {text}" in str(e.value) or f"--server-cpus {text!r}" in str(e.value)
    assert says in str(e.value) and e.value.fix


def test_check_client_takes_a_range(capfd):
    from testkit import cli_in_process as main

    # a range it accepts gets past the parser to the next check (an --endpoint it cannot reach)
    code = main(["check", "client", "--client-cpus", f"{HAVE[0]}-{HAVE[0]}", "--endpoint", "localhost:1"])
    err = capfd.readouterr().err
    assert code == 2 and "not an http(s) URL" in err and "--client-cpus" not in err, err
