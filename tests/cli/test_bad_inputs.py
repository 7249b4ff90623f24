"""Every command and subcommand, each kind of bad input a newcomer gives it: a missing file, bad
JSON, an empty JSON object, an output it cannot write, a directory where a file goes (or a file
where a directory goes), a bad option value. Each is refused the same way: exit 2, one error line
naming what was wrong, one fix line, no traceback (docs/architecture.md, one exit path).

Run in-process through the CLI's own entry point (llmopt_bench.cli.main, what the `llmopt`
script calls): the same exit path as a subprocess, without a process start per case. A kind
that a command has no input for is left out of its rows (doctor and stages read no file)."""

from __future__ import annotations

from pathlib import Path

import pytest
from testkit import cli_in_process as main

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "results" / "cpu" / "gate-calibration" / "run01"  # a small committed run
OTHER = ROOT / "results" / "cpu" / "gate-calibration" / "run02"
UNWRITABLE = "/proc/llmopt-nowhere"  # no one, root included, can create anything under /proc
# compare's -o goes through cli/paths.py in the compare change (cli/compare.py is not this change's)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    """The inputs: a missing path, bad JSON, {} (each as a file and as a run directory), a plain
    file, a directory, a valid history, a file that is not a history, a bad prompt file."""
    tmp = tmp_path_factory.mktemp("bad-inputs")
    out = {"missing": str(tmp / "nothing-here"), "dir": str(tmp / "a-directory"), "file": str(tmp / "notes.txt")}
    Path(out["dir"]).mkdir()
    Path(out["file"]).write_text("mine\n")
    for kind, text in (("badjson", '{"schema_version": 2,'), ("emptyjson", "{}")):
        (tmp / f"{kind}.json").write_text(text)
        (tmp / f"{kind}-run").mkdir()
        (tmp / f"{kind}-run" / "run.json").write_text(text)
        out[kind], out[f"{kind}-run"] = str(tmp / f"{kind}.json"), str(tmp / f"{kind}-run")
    (tmp / "prompts.jsonl").write_text('{"id": "a", "text": "fine"}\n{"id": "b", "text": \n')
    (tmp / "empty.jsonl").write_text("")
    out["badprompts"], out["emptyprompts"] = str(tmp / "prompts.jsonl"), str(tmp / "empty.jsonl")
    out["db"] = str(tmp / "history.sqlite")
    assert main(["history", "add", str(RUN), "--db", out["db"]]) == 0
    out["run"], out["other"] = str(RUN), str(OTHER)
    return out


BENCH = ("bench", "--stages", "hf-fp16", "--model", "synthetic:tiny")
# (id, argv with {placeholders} from `files`, what the error line must name)
CASES = [
    # bench: everything is checked before the probe, any stage or the run directory
    ("bench/missing --resume", ["bench", "--resume", "{missing}"], "no run.json"),
    ("bench/missing --prompts", [*BENCH, "--prompts", "{missing}", "-o", "{dir}/r1"], "{missing}"),
    ("bench/bad JSON --resume", ["bench", "--resume", "{badjson-run}"], "not valid JSON"),
    ("bench/bad JSON --prompts", [*BENCH, "--prompts", "{badprompts}", "-o", "{dir}/r2"], "prompts.jsonl:2"),
    ("bench/empty JSON --resume", ["bench", "--resume", "{emptyjson-run}"], "not a run.json"),
    ("bench/empty prompt file", [*BENCH, "--prompts", "{emptyprompts}", "-o", "{dir}/r3"], "empty.jsonl"),
    ("bench/unwritable -o", [*BENCH, "-o", UNWRITABLE + "/run"], "--output"),
    ("bench/file for -o", [*BENCH, "-o", "{file}"], "a file, not a directory"),
    ("bench/directory for --prompts", [*BENCH, "--prompts", "{dir}", "-o", "{dir}/r4"], "{dir}"),
    ("bench/bad value", [*BENCH, "--num-prompts", "0"], "--num-prompts 0"),
    ("bench/empty --stages", ["bench", "--stages", "", "-o", "{dir}/r5"], "--stages ''"),
    ("bench/blank --name", [*BENCH, "--name", " ", "-o", "{dir}/r6"], "--name ' '"),
    ("bench/--name with @", [*BENCH, "--name", "a@b", "-o", "{dir}/r7"], "--name 'a@b'"),
    ("bench/misspelt stage", ["bench", "--stages", "hf_fp16", "-o", "{dir}/r6"], "unknown stage 'hf_fp16'"),
    # report
    ("report/missing", ["report", "{missing}"], "no run directory"),
    ("report/bad JSON", ["report", "{badjson}"], "not valid JSON"),
    ("report/empty JSON", ["report", "{emptyjson-run}"], "not a run.json"),
    ("report/unwritable -o", ["report", "{run}", "-o", UNWRITABLE], "--output"),
    ("report/device for -o", ["report", "{run}", "-o", "/dev/null"], "not a directory"),
    ("report/file for -o", ["report", "{run}", "-o", "{file}"], "not a directory"),
    ("report/bad value", ["report", "{run}", "--format", "pdf"], "--format pdf"),
    # recommend
    ("recommend/missing", ["recommend", "{missing}"], "no run directory"),
    ("recommend/bad JSON", ["recommend", "{badjson-run}"], "not valid JSON"),
    ("recommend/empty JSON", ["recommend", "{emptyjson}"], "not a run.json"),
    ("recommend/directory without a run", ["recommend", "{dir}"], "no run.json"),
    ("recommend/bad value", ["recommend", "{run}", "--priority", "speed"], "--priority 'speed'"),
    ("recommend/bad SLO", ["recommend", "{run}", "--slo", "ttft_p99=fast"], "ttft_p99"),
    # compare
    ("compare/missing", ["compare", "{missing}", "{run}", "--no-history"], "no run.json"),
    ("compare/bad JSON", ["compare", "{run}", "{badjson}", "--no-history"], "not valid JSON"),
    ("compare/empty JSON", ["compare", "{emptyjson}", "{run}", "--no-history"], "not a run.json"),
    ("compare/unwritable -o", ["compare", "{run}", "{other}", "--no-history", "-o", UNWRITABLE + "/c.md"], "--output"),
    ("compare/directory for -o", ["compare", "{run}", "{other}", "--no-history", "-o", "{dir}"], "--output"),
    ("compare/bad value", ["compare", "{run}", "{other}", "--format", "xml"], "--format 'xml'"),
    # history add
    ("history add/missing", ["history", "add", "{missing}", "--db", "{dir}/h1.sqlite"], "no run.json"),
    ("history add/bad JSON", ["history", "add", "{badjson}", "--db", "{dir}/h2.sqlite"], "not valid JSON"),
    ("history add/empty JSON", ["history", "add", "{emptyjson-run}", "--db", "{dir}/h3.sqlite"], "not a run.json"),
    ("history add/unwritable --db", ["history", "add", "{run}", "--db", UNWRITABLE + "/h.sqlite"], "--db"),
    ("history add/directory for --db", ["history", "add", "{run}", "--db", "{dir}"], "a directory, not a file"),
    ("history add/not a history", ["history", "add", "{run}", "--db", "{badjson}"], "not a history"),
    # history show
    ("history show/missing --db", ["history", "show", "--db", "{missing}"], "no history database"),
    ("history show/not a history", ["history", "show", "--db", "{badjson}"], "not a history"),
    ("history show/directory for --db", ["history", "show", "--db", "{dir}"], "a directory"),
    ("history show/unwritable --chart", ["history", "show", "--db", "{db}", "--chart", UNWRITABLE + "/c.png"], "--chart"),
    ("history show/directory for --chart", ["history", "show", "--db", "{db}", "--chart", "{dir}"], "a directory"),
    ("history show/bad value", ["history", "show", "--db", "{db}", "--metric", "nosuch"], "'nosuch'"),
    ("history show/bad threshold", ["history", "show", "--db", "{db}", "--max-regression", "lots"], "lots"),
    # history check
    ("history check/missing --db", ["history", "check", "--db", "{missing}"], "no history database"),
    ("history check/not a history", ["history", "check", "--db", "{emptyjson}"], "not a history"),
    ("history check/bad value", ["history", "check", "--db", "{db}", "--window", "2"], "--window"),
    ("history check/unknown --since", ["history", "check", "--db", "{db}", "--since", "nosuch"], "--since 'nosuch'"),
    # the commands that read no file: a bad option
    ("stages/bad option", ["stages", "--json=yes"], "--json"),
    ("doctor/bad option", ["doctor", "--verbose"], "--verbose"),
    ("history/unknown subcommand", ["history", "remove"], "remove"),
]


@pytest.mark.parametrize("name,argv,says", [
    pytest.param(*c, id=c[0]) for c in CASES])
def test_bad_input_is_one_line_with_a_fix_and_exit_2(files, capfd, monkeypatch, name, argv, says):
    monkeypatch.delenv("LLMOPT_HISTORY_DB", raising=False)
    args = [a.format(**files) for a in argv]
    code = main(args)
    out, err = capfd.readouterr()
    lines = err.strip().splitlines()
    assert "Traceback" not in err and "internal error" not in err, err
    assert code == 2, (code, err)
    assert len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith("  fix: "), err
    assert says.format(**files) in lines[0], (says, lines[0])
    assert len(lines[1]) > len("  fix: ") + 10  # a fix, not a placeholder


def test_nothing_was_written_by_a_refused_bench(files):
    """bench refuses before its run directory: the cases above left none under the directory."""
    assert not any(Path(files["dir"]).glob("r*/run.json"))
