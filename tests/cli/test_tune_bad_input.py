"""`llmopt tune`'s bad input, each refused before anything starts (no reference, no server, no
run directory written): exit 2, one error line naming what was wrong, one fix line. In-process
through the CLI's own entry point (tests/testkit.cli_in_process). Also the space files it ships:
each reads, and on its device keeps vLLM's defaults first."""

from __future__ import annotations

from pathlib import Path

import pytest
from testkit import cli_in_process as main

from llmopt_bench.cli.tune import parse_budget
from llmopt_bench.core.errors import UsageError
from llmopt_bench.run.registry import JOURNEY_DIR
from llmopt_bench.tune.space import DEFAULT, engine_params, read_space

UNWRITABLE = "/proc/llmopt-nowhere"
GOOD = '[fixed]\nmax_model_len = 512\n\n[space]\nmax_num_seqs = [4, 8]\n'


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("tune-bad")
    texts = {"good": GOOD, "badtoml": "[space\nmax_num_seqs = [4]\n", "noknob": "[fixed]\nmax_model_len = 512\n",
             "unknownknob": "[space]\nmax_num_sequences = [4]\n", "badvalue": '[space]\nmax_num_seqs = ["many"]\n',
             "notalist": "[space]\nmax_num_seqs = 4\n", "both": "[fixed]\nmax_num_seqs = 4\n[space]\nmax_num_seqs = [8]\n",
             "badtable": GOOD + "[server]\nport = 1\n", "badload": GOOD + "[load]\nrequests_per_point = 0\n",
             "ownload": GOOD + '[load]\nslo = "ttft_p99=1s"\n', "badsearch": GOOD + "[search]\nshort_precision = 2\n",
             "badfixed": '[fixed]\ndtype = "int3"\n[space]\nmax_num_seqs = [4]\n'}
    out = {k: str(tmp / f"{k}.toml") for k in texts}
    for k, text in texts.items():
        Path(out[k]).write_text(text)
    out["missing"], out["file"] = str(tmp / "nothing.toml"), str(tmp / "notes.txt")
    Path(out["file"]).write_text("mine\n")
    out["dir"] = str(tmp / "d")
    Path(out["dir"]).mkdir()
    (tmp / "taken").mkdir()
    (tmp / "taken" / "run.json").write_text("{}")
    out["taken"] = str(tmp / "taken")
    return out


TUNE = ("tune", "--model", "synthetic:tiny")
CASES = [
    ("missing space", [*TUNE, "--space", "{missing}"], "--space {missing}: no such file"),
    ("space not TOML", [*TUNE, "--space", "{badtoml}"], "not valid TOML"),
    ("space without a knob", [*TUNE, "--space", "{noknob}"], "no knob to search"),
    ("unknown knob", [*TUNE, "--space", "{unknownknob}"], "max_num_sequences"),
    ("bad knob value", [*TUNE, "--space", "{badvalue}"], "max_num_seqs = 'many'"),
    ("knob not a list", [*TUNE, "--space", "{notalist}"], "not a non-empty list"),
    ("knob fixed and searched", [*TUNE, "--space", "{both}"], "also in [fixed]"),
    ("unknown table", [*TUNE, "--space", "{badtable}"], "unknown table(s) server"),
    ("bad load", [*TUNE, "--space", "{badload}"], "[load]"),
    ("load tune sets itself", [*TUNE, "--space", "{ownload}"], "[load] slo"),
    ("bad search", [*TUNE, "--space", "{badsearch}"], "[search]"),
    ("bad fixed", [*TUNE, "--space", "{badfixed}"], "[fixed]"),
    ("budget without unit", [*TUNE, "--space", "{good}", "--budget", "30"], "--budget '30'"),
    ("budget too short", [*TUNE, "--space", "{good}", "--budget", "10s"], "out of range"),
    ("budget too long", [*TUNE, "--space", "{good}", "--budget", "49h"], "out of range"),
    ("hold zero", [*TUNE, "--space", "{good}", "--hold", "0"], "--hold 0"),
    ("max trials zero", [*TUNE, "--space", "{good}", "--max-trials", "0"], "--max-trials 0"),
    ("bad SLO", [*TUNE, "--space", "{good}", "--slo", "ttft_p99=soon"], "ttft_p99"),
    ("bad workload value", [*TUNE, "--space", "{good}", "--max-new-tokens", "0"], "--max-new-tokens 0"),
    ("unwritable output", [*TUNE, "--space", "{good}", "-o", UNWRITABLE + "/t"], "--output"),
    ("file for output", [*TUNE, "--space", "{good}", "-o", "{file}"], "not a directory"),
    ("output holds a run", [*TUNE, "--space", "{good}", "-o", "{taken}"], "already holds a run"),
    ("resume without a tune run", ["tune", "--resume", "{dir}"], "no tune.json"),
    ("resume with another model", ["tune", "--resume", "{dir}", "--model", "synthetic:tiny"], "--model"),
]


@pytest.mark.parametrize("name,argv,says", [pytest.param(*c, id=c[0]) for c in CASES])
def test_bad_input_is_one_line_with_a_fix_and_exit_2(files, capfd, name, argv, says):
    code = main([a.format(**files) for a in argv])
    _, err = capfd.readouterr()
    lines = err.strip().splitlines()
    assert "Traceback" not in err and code == 2, (code, err)
    assert len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith("  fix: "), err
    assert says.format(**files) in lines[0], (says, lines[0])


def test_nothing_was_written_by_a_refused_tune(files):
    assert not any(Path(files["dir"]).rglob("*.json"))
    assert sorted(p.name for p in Path(files["taken"]).iterdir()) == ["run.json"]


@pytest.mark.parametrize("text,seconds", [("30m", 1800), ("1h30m", 5400), ("1.5h", 5400), ("90s", 90), ("2m30s", 150)])
def test_budget_units(text, seconds):
    assert parse_budget(text) == seconds


@pytest.mark.parametrize("text", ["", "m", "30", "thirty minutes", "30x", "-5m"])
def test_budget_refused(text):
    with pytest.raises(UsageError):
        parse_budget(text)


@pytest.mark.parametrize("name", ["tune", "tune-cpu"])
def test_the_shipped_spaces_read_and_start_from_vllm_s_defaults(name):
    space = read_space(JOURNEY_DIR / f"{name}.toml")
    assert space.knobs and all(values[0] == DEFAULT and len(values) > 1 for values in space.knobs.values())
    params, awq = engine_params(space, space.defaults())
    # the defaults pass none of the searched knobs to vLLM: its own values
    assert not awq and params.max_num_seqs is None and params.max_num_batched_tokens is None
    assert params.enable_chunked_prefill is None and params.kv_cache_dtype is None


def test_a_configuration_becomes_vllm_serve_flags():
    from llmopt_bench.engines.vllm.params import engine_config
    from llmopt_bench.engines.vllm.server import engine_args

    space = read_space(JOURNEY_DIR / "tune.toml")
    config = {**space.defaults(), "max_num_seqs": 512, "enable_chunked_prefill": False, "kv_cache_dtype": "fp8",
              "quantization": "awq"}
    params, awq = engine_params(space, config)
    args = engine_args(engine_config(params, "cuda", None))
    assert awq and "--quantization" not in args  # AWQ weights come as a checkpoint (engines/awq/weights.py)
    assert args[args.index("--max-num-seqs") + 1] == "512" and "--no-enable-chunked-prefill" in args
    assert args[args.index("--kv-cache-dtype") + 1] == "fp8" and "--max-num-batched-tokens" not in args
    defaults = engine_args(engine_config(engine_params(space, space.defaults())[0], "cuda", None))
    assert not {"--max-num-seqs", "--max-num-batched-tokens", "--kv-cache-dtype", "--quantization"} & set(defaults)
    assert not any("chunked-prefill" in a for a in defaults)


def test_tune_offers_only_the_workload_options_it_reads(capfd):
    """tune measures served load points, not the fixed workload's repeats: --repeats, the stopping
    rule's options and --batch-size are neither in its --help nor accepted (issue 46)."""
    assert main(["tune", "--help"]) == 0
    shown = capfd.readouterr().out
    for used in ("--workload", "--seed", "--max-new-tokens", "--num-prompts", "--budget"):
        assert used in shown, used
    for ignored in ("--repeats", "--max-repeats", "--stop-within", "--repeat-budget", "--batch-size"):
        assert ignored not in shown, ignored
        assert main([*TUNE, ignored, "2"]) == 2
        assert f"No such option: {ignored}" in capfd.readouterr().err
