"""Every command's output read at COLUMNS=80, as a newcomer's terminal shows it: no line longer
than 80 but a single word that is longer (a path) or an error or fix line (kept whole so that its
command copies as one line: the terminal soft-wraps it); no word cut by an ellipsis or a fold;
hyphenated names and bracketed words whole in the help; tables that fit whole, and where they do
not, columns left out and named, then one block per row.

In-process through the CLI's entry point (llmopt_bench.cli.main), with $COLUMNS set: what
rich's consoles and click's help formatter read. bench's own output is its end-of-run table
(render/table.py, read at 80 and narrower in tests/cli/test_table.py) and progress lines."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from testkit import cli_in_process as main

ROOT = Path(__file__).resolve().parents[2]
RUNS = ROOT / "results"
WIDTH = 80
KEPT_WHOLE = ("error: ", "fix: ")


def too_long(lines: list[str], width: int = WIDTH) -> list[str]:
    """Lines over the width that are not one unbreakable word, an error or a fix line."""
    return [line for line in lines if len(line.rstrip()) > width and len(line.split()) > 1
            and not line.lstrip().startswith(KEPT_WHOLE)]


def cut_words(lines: list[str]) -> list[str]:
    """Lines with a word cut short by an ellipsis (rich's overflow), "hf-fp…"."""
    return [line for line in lines if re.search(r"\w…", line)]


@pytest.fixture
def read(capfd, monkeypatch):
    def run(*argv: str, width: int = WIDTH, code: int = 0) -> list[str]:
        monkeypatch.setenv("COLUMNS", str(width))
        got = main(list(argv))
        out, err = capfd.readouterr()
        assert got == code, (argv, got, err[-2000:])
        lines = (out + err).splitlines()
        assert not too_long(lines, width), too_long(lines, width)
        assert not cut_words(lines), cut_words(lines)
        return lines
    return run


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> str:
    """A history of two committed runs of one stage, device, model and workload."""
    path = tmp_path_factory.mktemp("columns") / "history.sqlite"
    for run in ("run01", "run02", "run03"):
        assert main(["history", "add", str(RUNS / "cpu" / "gate-calibration" / run), "--db", str(path)]) == 0
    return str(path)


HELP = [(), ("bench",), ("report",), ("recommend",), ("compare",), ("stages",), ("doctor",), ("history",),
        ("history", "add"), ("history", "show"), ("history", "check"), ("check",), ("check", "peer"), ("check", "capacity")]


@pytest.mark.parametrize("command", HELP, ids=lambda c: " ".join(c) or "llmopt")
def test_help_at_80_columns(read, command):
    lines = read(*command, "-h")
    assert lines[0].startswith(f"Usage: llmopt {' '.join(command)}".rstrip())


def test_help_keeps_bracketed_words_and_hyphenated_names(read):
    text = " ".join(line.strip() for line in read("history", "show", "--help"))
    assert "pip install 'llmopt-bench[charts]'" in text and "[default: every stage]" in text
    check = " ".join(line.strip() for line in read("history", "check", "--help"))
    assert "[default: tpot_p50, ttft_p50, output_tok_s]" in check
    bench = " ".join(line.strip() for line in read("bench", "--help"))
    assert "a comma list (hf-fp16,vllm)" in bench and "--max-new-tokens" in bench
    assert "(default: 100; on CPU 32)" in bench  # bench's defaults whole, none cut at the edge
    assert "<bool>" not in bench  # a flag takes no value


def test_two_commands_named_check_each_have_their_own_summary(read):
    """`llmopt check` (llmopt's measurement checked: beside vLLM's client, the client's own ceiling)
    and `llmopt history check` (sustained shifts): the command lists give each its own line."""
    top, history = " ".join(read("-h")), " ".join(read("history", "-h"))
    assert "check llmopt's measurement checked: beside vllm bench serve" in " ".join(top.split())
    assert "check Sustained shifts" in " ".join(history.split()) and "vLLM" not in history


def test_version_and_short_help(read):
    from llmopt_bench import __version__

    assert read("--version") == [f"llmopt {__version__}"]
    assert read("-h")[0].startswith("Usage: llmopt")


def test_stages(read):
    from llmopt_bench.run.registry import stage_names

    lines = read("stages")
    body = "\n".join(lines)
    for name in stage_names():
        assert re.search(rf"^{re.escape(name)}\s", body, re.M), name  # each stage whole, in the first column
    fixes = [line for line in lines if line.lstrip().startswith("fix: ")]
    assert len(fixes) == len(set(fixes))  # a fix shared by several stages is printed once


def test_doctor(read):
    assert any(line.startswith("Stages: ") for line in read("doctor"))


def test_report_prints_its_paths(read, tmp_path):
    lines = read("report", str(RUNS / "cpu" / "gate-calibration" / "run01"), "-o", str(tmp_path / "r"), "-f", "csv,json")
    assert [Path(line).name for line in lines] == ["stages.csv", "report.json"]


@pytest.mark.parametrize("args", [("h200-20261204/run", "--slo", "ttft_p99=1s,tpot_p99=50ms"), ("h200", "--priority", "memory"),
                                  ("cpu/gate-calibration/run01",)], ids=lambda a: " ".join(a))
def test_recommend(read, args, monkeypatch):
    monkeypatch.delenv("LLMOPT_CACHE", raising=False)
    lines = read("recommend", str(RUNS / args[0]), *args[1:])
    assert not any("**" in line for line in lines)  # no markdown on a terminal
    serve = [i for i, line in enumerate(lines) if line.lstrip().startswith("vllm serve")]
    if serve:  # the command continued with backslashes: still one command when copied
        block = lines[serve[0]:]
        end = next(i for i, line in enumerate(block) if not line.endswith(" \\"))
        assert end >= 1 and "$LLMOPT_CACHE" not in " ".join(block[:end + 1])


def test_history_show_fits_then_leaves_out_then_stacks(read, db):
    wide = read("history", "show", "--db", db, width=200)
    assert "method" in wide[1] and not any("left out" in line for line in wide)
    at80 = read("history", "show", "--db", db)
    assert sum("hf-fp16" in line for line in at80) == 3  # one row per run, nothing folded
    joined = " ".join(at80)
    assert "left out at this width: " in joined and "--json has every field" in joined
    narrow = read("history", "show", "--db", db, width=30)
    assert sum(line.startswith("stage hf-fp16") for line in narrow) == 3  # one block per run


def test_history_check(read, db):
    lines = read("history", "check", "--db", db)
    assert sum("too few" in line.lower() for line in lines) == 1  # one line for every short series


def test_compare(read):
    base = RUNS / "cpu" / "gate-calibration"
    lines = read("compare", str(base / "run01"), str(base / "run02"), "--no-history", code=9)  # unsettled at 2 repeats
    assert any(line.startswith("hf-fp16") for line in lines)
    assert any("left out at this width" in line for line in lines)  # 10 columns do not fit 80


def test_bench_end_of_run_table(capfd, monkeypatch):
    from llmopt_bench.core.results import load_run
    from llmopt_bench.render.table import print_summary

    monkeypatch.setenv("COLUMNS", str(WIDTH))
    print_summary(load_run(RUNS / "h200"))  # its own console: $COLUMNS decides
    lines = capfd.readouterr().out.splitlines()
    assert not too_long(lines) and not cut_words(lines) and any(line.startswith("hf-fp16") for line in lines)
