"""workload.py: the shipped prompt set, malformed prompt files (each error names its line),
"text" or "prompt" keys and plain text files, the workload options (ranges, lighter defaults on
CPU), seeded prompt choice, exact input lengths, the mixed workload and Poisson arrivals."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from llmopt_bench.core.errors import ExitCode, UsageError
from llmopt_bench.core.workload import (
    WorkloadConfig,
    build_requests,
    fit_length,
    load_prompt_set,
    load_prompts,
    option_name,
    resolve_workload,
    select_prompts,
)


def write_lines(path: Path, lines: list[str]) -> str:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def good(i: int, **kw) -> str:
    return json.dumps({"id": f"q{i}", "text": f"question number {i}?", **kw}, ensure_ascii=False)


# --- the shipped set ----------------------------------------------------------------------

def test_shipped_prompt_set_loads():
    prompts = load_prompts()
    assert len(prompts) >= 64
    assert {"en", "zh"} <= {p.lang for p in prompts}
    ids = [p.id for p in prompts]
    assert len(set(ids)) == len(ids)
    assert all(p.text.strip() for p in prompts)
    zh = [p for p in prompts if p.lang == "zh"]
    assert any("\u4e00" <= ch <= "\u9fff" for p in zh for ch in p.text), "zh prompts hold no CJK characters"


def test_shipped_set_has_long_and_short_prompts():
    kinds = {p.kind for p in load_prompts()}
    assert {"long", "short"} <= kinds


# --- a user's prompt file -----------------------------------------------------------------

def test_user_file_loads_with_defaults(tmp_path):
    src = write_lines(tmp_path / "p.jsonl", [good(1), "", "   ", json.dumps({"text": "no id here"}),
                                             good(2, lang="zh", kind="long")])
    prompts = load_prompts(src)
    assert [p.id for p in prompts] == ["q1", "line-4", "q2"]  # blank lines skipped; missing id -> line number
    assert prompts[0].lang == "en" and prompts[2].lang == "zh" and prompts[2].kind == "long"


def usage_error(tmp_path, content: bytes | str | None, name: str = "p.jsonl") -> UsageError:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, str):
        path.write_text(content, encoding="utf-8")
    with pytest.raises(UsageError) as info:
        load_prompts(str(path))
    assert info.value.code == ExitCode.USAGE
    return info.value


def test_bad_json_names_the_line(tmp_path):
    e = usage_error(tmp_path, good(1) + "\n" + good(2) + "\n" + '{"id": "q3", "text": "unterminated\n' + good(4) + "\n")
    assert f"{tmp_path / 'p.jsonl'}:3:" in e.message
    assert "not valid JSON" in e.message
    assert e.fix


@pytest.mark.parametrize("line", ['{"id": "q2"}', '{"id": "q2", "text": ""}', '{"id": "q2", "text": "   "}',
                                  '{"id": "q2", "text": 5}', '["not", "an", "object"]', '"just a string"'])
def test_missing_text_names_the_line(tmp_path, line):
    e = usage_error(tmp_path, good(1) + "\n" + line + "\n" + good(3) + "\n")
    assert ":2:" in e.message and '"text"' in e.message


def test_duplicate_id_names_the_line_and_the_id(tmp_path):
    e = usage_error(tmp_path, "\n".join([good(1), good(2), good(3), good(2)]) + "\n")
    assert ":4:" in e.message and "duplicate" in e.message and "'q2'" in e.message


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_empty_file(tmp_path, content):
    e = usage_error(tmp_path, content)
    assert "no prompts" in e.message


def test_not_utf8(tmp_path):
    e = usage_error(tmp_path, good(1).encode() + b'\n{"id": "q2", "text": "caf\xe9"}\n')
    assert "not UTF-8" in e.message and "p.jsonl" in e.message
    assert e.fix and "UTF-8" in e.fix


def test_missing_file(tmp_path):
    with pytest.raises(UsageError) as info:
        load_prompts(str(tmp_path / "nowhere.jsonl"))
    assert "not found" in info.value.message and "nowhere.jsonl" in info.value.message
    assert info.value.fix and "--prompts" in info.value.fix


def test_a_directory_is_not_a_prompt_file(tmp_path):
    with pytest.raises(UsageError):
        load_prompts(str(tmp_path))


# --- choosing prompts ---------------------------------------------------------------------

def test_select_prompts_is_deterministic_with_seed():
    prompts = load_prompts()
    cfg = WorkloadConfig(num_prompts=8, seed=0)
    first = [p.id for p in select_prompts(prompts, cfg)]
    again = [p.id for p in select_prompts(prompts, cfg)]
    other = [p.id for p in select_prompts(prompts, cfg.model_copy(update={"seed": 1}))]
    assert first == again
    assert len(first) == 8 and len(set(first)) == 8  # fewer than the set: no repeats
    assert first != other


def test_select_prompts_cycles_when_asking_for_more_than_the_set(tmp_path):
    prompts = load_prompts(write_lines(tmp_path / "p.jsonl", [good(i) for i in range(3)]))
    picked = select_prompts(prompts, WorkloadConfig(num_prompts=7, seed=5))
    assert len(picked) == 7
    assert {p.id for p in picked} == {"q0", "q1", "q2"}
    assert [p.id for p in picked[:3]] == [p.id for p in picked[3:6]]


def test_mixed_workload_has_long_and_short():
    prompts = load_prompts()
    picked = select_prompts(prompts, WorkloadConfig(num_prompts=16, seed=0, kind="mixed"))
    kinds = [p.kind for p in picked]
    assert len(picked) == 16
    assert kinds.count("long") == 4 and kinds.count("short") == 12
    assert picked == select_prompts(prompts, WorkloadConfig(num_prompts=16, seed=0, kind="mixed"))


def test_mixed_workload_without_kinds_uses_lengths(tmp_path):
    lines = [json.dumps({"id": f"s{i}", "text": f"short {i}"}) for i in range(20)]
    lines += [json.dumps({"id": f"l{i}", "text": "a long document. " * 200}) for i in range(4)]
    picked = select_prompts(load_prompts(write_lines(tmp_path / "p.jsonl", lines)),
                            WorkloadConfig(num_prompts=8, seed=3, kind="mixed"))
    assert sum(p.id.startswith("l") for p in picked) == 2
    assert sum(p.id.startswith("s") for p in picked) == 6


# --- exact lengths and token requests -----------------------------------------------------

@pytest.mark.parametrize("n", [1, 2, 4, 5, 7, 12, 100])
def test_fit_length_is_exact(n):
    ids = [11, 12, 13, 14, 15]
    out = fit_length(ids, n)
    assert len(out) == n
    assert out == [ids[i % len(ids)] for i in range(n)]  # truncate, or repeat the prompt's own tokens


def test_fit_length_of_nothing():
    with pytest.raises(UsageError):
        fit_length([], 4)


def test_build_requests_with_input_len(tmp_path):
    src = write_lines(tmp_path / "p.jsonl", [json.dumps({"id": "tiny", "text": "ab"}),
                                             json.dumps({"id": "big", "text": "x" * 300})])
    encode = lambda text: [ord(c) for c in text]  # noqa: E731 - a stand-in tokenizer, one id per character
    cfg = WorkloadConfig(prompts=src, num_prompts=4, input_len=16, seed=0)
    reqs = build_requests(cfg, encode)
    assert [r.id for r in reqs] == ["r0000", "r0001", "r0002", "r0003"]
    assert all(len(r.token_ids) == 16 for r in reqs)
    tiny = next(r for r in reqs if r.prompt_id == "tiny")
    assert tiny.token_ids == tuple([97, 98] * 8)
    assert build_requests(cfg, encode) == reqs
    warm = build_requests(cfg, encode, count=3, tag="w")
    assert [r.id for r in warm] == ["w0000", "w0001", "w0002"]
    free = build_requests(cfg.model_copy(update={"input_len": None}), encode)
    assert sorted({len(r.token_ids) for r in free}) == [2, 300]


# --- arrivals (the one generator: load/arrivals.py) ------------------------------------------

def poisson_arrivals(rate: float, n: int, seed: int = 0) -> list[float]:
    from llmopt_bench.load.arrivals import arrival_offsets

    return arrival_offsets(rate, n, 1.0, seed)


def test_poisson_arrivals_mean_rate():
    rate, n = 5.0, 20000
    t = poisson_arrivals(rate, n, seed=1)
    assert len(t) == n and t[0] == 0.0
    gaps = [b - a for a, b in zip(t, t[1:])]
    assert all(g >= 0 for g in gaps)
    assert statistics.fmean(gaps) == pytest.approx(1 / rate, rel=0.03)
    # exponential gaps: the std equals the mean
    assert statistics.pstdev(gaps) == pytest.approx(1 / rate, rel=0.05)
    assert (n - 1) / t[-1] == pytest.approx(rate, rel=0.03)


def test_poisson_arrivals_is_seeded():
    assert poisson_arrivals(2.0, 50, seed=4) == poisson_arrivals(2.0, 50, seed=4)
    assert poisson_arrivals(2.0, 50, seed=4) != poisson_arrivals(2.0, 50, seed=5)


# --- "prompt" as well as "text"; plain text files -----------------------------------------

def test_prompt_key_accepted_and_said(tmp_path):
    src = write_lines(tmp_path / "p.jsonl", [json.dumps({"id": "a", "prompt": "first question?"}),
                                             json.dumps({"id": "b", "prompt": "second one", "lang": "zh"})])
    prompts, key = load_prompt_set(src)
    assert [(p.id, p.text, p.lang) for p in prompts] == [("a", "first question?", "en"), ("b", "second one", "zh")]
    assert key == "prompt"
    assert load_prompt_set()[1] == "text"  # the shipped set


def test_a_file_mixing_the_keys_says_both(tmp_path):
    src = write_lines(tmp_path / "p.jsonl", [json.dumps({"text": "one"}), json.dumps({"prompt": "two"})])
    prompts, key = load_prompt_set(src)
    assert [p.text for p in prompts] == ["one", "two"] and key == "text+prompt"


def test_both_keys_on_one_line_is_ambiguous(tmp_path):
    e = usage_error(tmp_path, json.dumps({"id": "q", "text": "a", "prompt": "b"}) + "\n")
    assert ":1:" in e.message and "both" in e.message


@pytest.mark.parametrize("name", ["p.txt", "prompts", "p.md"])
def test_plain_text_one_prompt_a_line(tmp_path, name):
    src = write_lines(tmp_path / name, ["What is PagedAttention?", "", "   ", "  Explain AWQ in one line.  ",
                                        '{"not": "an object on line one"} is just text here'])
    prompts, key = load_prompt_set(src)
    assert key == "line"
    assert [(p.id, p.text) for p in prompts] == [("line-1", "What is PagedAttention?"), ("line-4", "Explain AWQ in one line."),
                                                 ("line-5", '{"not": "an object on line one"} is just text here')]


def test_jsonl_under_a_text_name_is_refused_with_the_rename(tmp_path):
    e = usage_error(tmp_path, good(1) + "\n" + good(2) + "\n", name="p.txt")
    assert "plain text" in e.message and "JSON object" in e.message
    assert "p.jsonl" in e.fix


@pytest.mark.parametrize("content", ["", "\n \n"])
def test_empty_text_file(tmp_path, content):
    assert "no prompts" in usage_error(tmp_path, content, name="p.txt").message


# --- the workload options: validated in one place, lighter defaults on CPU ---------------

@pytest.mark.parametrize("field,value,allowed", [("num_prompts", 0, "1 or more"), ("max_new_tokens", -5, "1 or more"),
                                                 ("warmup", -1, "0 or more"), ("seed", 2**32, "0 to 4294967295"),
                                                 ("batch_size", 0, "1 or more"), ("input_len", 0, "1 or more")])
def test_each_option_checked_against_the_configs_own_range(field, value, allowed):
    with pytest.raises(UsageError) as info:
        resolve_workload({field: value})
    flag = option_name(field)
    assert info.value.message == f"{flag} {value}: out of range, allowed {allowed}"
    assert flag in info.value.fix and info.value.code == ExitCode.USAGE


def test_cpu_gets_lighter_defaults_and_says_so():
    cfg = resolve_workload({}, device="cpu")
    assert (cfg.num_prompts, cfg.max_new_tokens, cfg.warmup, cfg.repeats) == (4, 32, 1, 2)
    assert cfg.max_prompt_len == 2048 and cfg.batch_size == 1  # the rest as on a GPU
    assert len(cfg.notes) == 1 and cfg.notes[0].startswith("lighter defaults on CPU: --num-prompts 4, --max-new-tokens 32, "
                                                           "--warmup 1, --repeats 2")
    assert cfg.prompt_key == "text"


def test_cuda_keeps_the_defaults():
    assert resolve_workload({}, device="cuda") == WorkloadConfig()


def test_what_the_user_set_is_kept_and_not_named():
    cfg = resolve_workload(dict(max_new_tokens=100, repeats=3), device="cpu")
    assert (cfg.num_prompts, cfg.max_new_tokens, cfg.warmup, cfg.repeats) == (4, 100, 1, 3)
    assert "--max-new-tokens" not in cfg.notes[0] and "--repeats" not in cfg.notes[0]
    everything = dict(num_prompts=8, max_new_tokens=100, warmup=2, repeats=3)
    assert resolve_workload(everything, device="cpu").notes == []


def test_a_resumed_run_keeps_its_workload():
    before = resolve_workload(dict(seed=7), device="cpu")
    assert resolve_workload({}, previous=before, device="cuda") == before


def test_the_prompt_files_key_is_recorded(tmp_path):
    src = write_lines(tmp_path / "p.txt", ["one", "two"])
    cfg = resolve_workload(dict(prompts=src), device="cuda")
    assert cfg.prompts == src and cfg.prompt_key == "line"
