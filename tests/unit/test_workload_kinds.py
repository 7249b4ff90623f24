"""The workload kinds (workloads/): each kind's lengths, groups, turns and times exact and
repeatable from the seed, the spec's canonical form, the distributions' shapes, and the digest
the same in every process. No engine: the plans are pure functions of (spec, seed, token space)."""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from llmopt_bench.core.errors import UsageError
from llmopt_bench.core.workload import WorkloadConfig
from llmopt_bench.workloads.build import make_plan
from llmopt_bench.workloads.dists import parse_duration, parse_length
from llmopt_bench.workloads.plan import TokenSpace
from llmopt_bench.workloads.spec import parse_spec, spec_of_table

SPACE = TokenSpace(1024, frozenset({0, 1, 2}))
ROOT = Path(__file__).resolve().parents[2]


def plan(spec: str, seed: int = 0, max_len: int | None = 100_000):
    return make_plan(WorkloadConfig(spec=spec, seed=seed), SPACE, max_len, encode=lambda t: [3] * len(t))


# --- the spec -----------------------------------------------------------------------------

@pytest.mark.parametrize("text,canonical", [
    ("fixed", "fixed"),
    ("random:in=512..1536,out=128", "random:in=512..1536,out=128,prefix=0"),
    ("random:in=normal:1024:200:64:4096,out=lognormal:200:0.8,prefix=256",
     "random:in=normal:1024:200:64:4096,out=lognormal:200:0.8,prefix=256"),
    ("shared-prefix:groups=8,per_group=32,prefix=1024,suffix=64,out=128",
     "shared-prefix:groups=8,per_group=32,prefix=1024,suffix=64,out=128,order=shuffled,assign=exact"),
    ("multi-turn:turns=3..6,first=1024,msg=128,out=128,think=exp:2000ms,prefix=512",
     "multi-turn:turns=3..6,first=1024,msg=128,out=128,think=exp:2s,prefix=512"),
    ("random:in=7..7", "random:in=7,out=128,prefix=0"),  # a range of one value is that value
])
def test_a_spec_is_written_back_canonical_and_reads_back_the_same(text, canonical):
    assert parse_spec(text).canonical() == canonical
    assert parse_spec(canonical).canonical() == canonical


def test_a_journey_table_is_the_same_spec():
    table = {"kind": "shared-prefix", "groups": 8, "per_group": 32, "prefix": 1024, "suffix": 64, "out": 128}
    assert spec_of_table(table, "j.toml") == parse_spec("shared-prefix:groups=8,per_group=32,prefix=1024,suffix=64,out=128").canonical()
    with pytest.raises(UsageError, match="has no kind"):
        spec_of_table({"groups": 2}, "j.toml")


@pytest.mark.parametrize("text,needle", [
    ("odd", "unknown kind 'odd'"), ("random:in", "is not key=value"), ("random:in=4,in=5", "in given twice"),
    ("random:in=0", "at least 1 token"), ("random:in=5..3", "1 <= A <= B"), ("random:out=normal:100", "MEAN:SD"),
    ("random:out=normal:100:-1", "spread 0 or more"), ("multi-turn:think=2", "has no unit"),
    ("shared-prefix:groups=0", "allowed 1 or more"), ("shared-prefix:assign=zipf", "'exact' or 'random'"),
    ("trace:speedup=2", "file= is required"), ("random:in=hist:/no/such/file", "no such file"),
])
def test_a_bad_spec_is_one_usage_error_naming_it(text, needle):
    with pytest.raises(UsageError) as e:
        parse_spec(text)
    assert needle in e.value.message and e.value.message.startswith(f"--workload {text}")
    assert "--workload" in e.value.fix


# --- distributions ------------------------------------------------------------------------

def draws(text: str, n: int = 10_000) -> list[int]:
    d, r = parse_length(text), random.Random(7)
    return [d.sample(r) for _ in range(n)]


def test_a_fixed_length_is_that_length_and_a_range_is_uniform_over_it():
    assert set(draws("128", 100)) == {128}
    got = Counter(draws("1..4"))
    assert set(got) == {1, 2, 3, 4} and all(abs(c / 10_000 - 0.25) < 0.0125 for c in got.values())  # within 5% of a quarter


def test_normal_is_clamped_and_has_the_asked_mean_and_spread():
    values = draws("normal:1000:100:900:1100")
    assert min(values) >= 900 and max(values) <= 1100
    free = draws("normal:1000:100")
    assert abs(statistics.fmean(free) - 1000) < 20 and abs(statistics.stdev(free) - 100) < 2


def test_lognormal_takes_its_mean_as_the_mean():
    assert abs(statistics.fmean(draws("lognormal:200:0.8")) / 200 - 1) < 0.03


def test_a_histogram_draws_only_its_values_at_their_weights(tmp_path):
    f = tmp_path / "h.txt"
    f.write_text("# lengths\n100,3\n400,1\n")
    got = Counter(draws(f"hist:{f}"))
    assert set(got) == {100, 400} and abs(got[100] / 10_000 - 0.75) < 4 * (0.75 * 0.25 / 10_000) ** 0.5
    assert parse_length(f"hist:{f}").mean == 175


def test_durations_need_a_unit_and_exp_has_its_mean():
    assert parse_duration("500ms").a == 0.5 and parse_duration("0").a == 0
    d, r = parse_duration("exp:2s"), random.Random(1)
    assert abs(statistics.fmean(d.sample(r) for _ in range(20_000)) / 2 - 1) < 0.03


# --- determinism --------------------------------------------------------------------------

SPECS = ["random:in=10..200,out=1..16,prefix=8", "shared-prefix:groups=3,per_group=4,prefix=40..60,suffix=5..9,out=4",
         "multi-turn:turns=1..4,first=20..40,msg=3..9,out=2..6,think=exp:1s,prefix=8",
         "trace:file=builtin:example-trace.jsonl"]


@pytest.mark.parametrize("spec", SPECS)
def test_a_conversation_is_the_same_whatever_was_drawn_before(spec):
    a, b = plan(spec), plan(spec)
    forwards = [a.conversation(i) for i in range(12)]
    backwards = [b.conversation(i) for i in reversed(range(12))][::-1]
    assert forwards == backwards
    assert a.record().digest == b.record().digest


@pytest.mark.parametrize("spec,changed", zip(SPECS[:3], ["random:in=10..200,out=1..17,prefix=8",
                                                         "shared-prefix:groups=3,per_group=4,prefix=40..60,suffix=5..9,out=5",
                                                         "multi-turn:turns=1..4,first=20..40,msg=3..9,out=2..6,think=exp:2s,prefix=8"]))
def test_another_seed_or_parameter_is_another_digest(spec, changed):
    d = plan(spec).record().digest
    assert plan(spec, seed=1).record().digest != d
    assert plan(changed).record().digest != d


@pytest.mark.parametrize("spec", SPECS)
def test_another_seed_sends_other_token_ids_at_the_same_lengths(spec):
    """The seed reaches the token ids themselves, not only the lengths and the order: the same
    shape under another seed is another prompt (a fixed-length spec, so lengths cannot differ)."""
    fixed = {"random": "random:in=50,out=4,prefix=8", "shared-prefix": "shared-prefix:groups=2,per_group=2,prefix=40,suffix=6,out=4",
             "multi-turn": "multi-turn:turns=2,first=30,msg=5,out=3,prefix=8", "trace": spec}[spec.split(":")[0]]
    a, b = plan(fixed, seed=0).conversation(0), plan(fixed, seed=1).conversation(0)
    assert [len(t.new_ids) for t in a.turns] == [len(t.new_ids) for t in b.turns]
    assert a.turns[0].new_ids != b.turns[0].new_ids


def test_the_digest_is_the_same_in_another_process_with_another_hash_seed():
    """vLLM's timed_trace seeds its token draws with hash(str), salted per process: two runs then
    send different tokens. The plan's digest must not move with PYTHONHASHSEED."""
    code = ("from llmopt_bench.core.workload import WorkloadConfig; from llmopt_bench.workloads.build import make_plan; "
            "from llmopt_bench.workloads.plan import TokenSpace; import sys; "
            "print(make_plan(WorkloadConfig(spec=sys.argv[1]), TokenSpace(1024, frozenset({0,1,2})), 100000, None).record().digest)")
    for spec in SPECS:
        got = {subprocess.run([sys.executable, "-c", code, spec], capture_output=True, text=True, check=True, cwd=ROOT,
                              env={**os.environ, "PYTHONHASHSEED": str(h), "PYTHONPATH": str(ROOT)}).stdout.strip()
               for h in (1, 2)}
        assert got == {plan(spec).record().digest}, spec


# --- each kind's shape --------------------------------------------------------------------

def test_random_lengths_are_the_seeded_draws_and_ids_avoid_special_tokens():
    p = plan("random:in=10..200,out=1..16,prefix=8", seed=3)
    prefix = p.conversation(0).turns[0].new_ids[:8]
    for i in range(50):
        r = random.Random(f"3:random:lengths:{i}")
        n_in, n_out = r.randint(10, 200), r.randint(1, 16)
        t = p.conversation(i).turns[0]
        assert (len(t.new_ids), t.output_len) == (8 + n_in, n_out)
        assert t.new_ids[:8] == prefix and not set(t.new_ids) & {0, 1, 2} and max(t.new_ids) < 1024


def test_shared_prefix_groups_share_exactly_their_prefix_and_each_window_holds_per_group_of_each():
    p = plan("shared-prefix:groups=3,per_group=4,prefix=40,suffix=6,out=4")
    convs = [p.conversation(i) for i in range(24)]
    prefixes = {c.group: c.turns[0].new_ids[:40] for c in convs}
    assert len(prefixes) == 3 and len(set(prefixes.values())) == 3
    assert len({v[:16] for v in prefixes.values()}) == 3  # groups differ from their first tokens
    for c in convs:
        assert c.turns[0].new_ids[:40] == prefixes[c.group] and len(c.turns[0].new_ids) == 46
    for w in range(2):
        assert Counter(c.group for c in convs[w * 12:(w + 1) * 12]) == {"g0": 4, "g1": 4, "g2": 4}
    assert len({c.turns[0].new_ids[40:] for c in convs}) == 24  # every suffix its own
    grouped = plan("shared-prefix:groups=3,per_group=4,prefix=40,suffix=6,out=4,order=grouped")
    assert [grouped.conversation(i).group for i in range(12)] == ["g0"] * 4 + ["g1"] * 4 + ["g2"] * 4
    assert [c.group for c in convs[:12]] != ["g0"] * 4 + ["g1"] * 4 + ["g2"] * 4  # shuffled
    # the record covers the first 64: each group's first request misses, the others hit the prefix's full 16-token blocks
    assert p.record().shareable_fraction == round((64 - 3) * 32 / (64 * 46), 4)


def test_multi_turn_turns_lengths_and_think_times_are_the_seeded_draws():
    p = plan("multi-turn:turns=2..4,first=30,msg=5,out=3,think=2s,prefix=8")
    first = p.conversation(0).turns[0].new_ids[:8]
    for i in range(20):
        c = p.conversation(i)
        r = random.Random(f"0:multi-turn:lengths:{i}")
        assert len(c.turns) == r.randint(2, 4) and c.id == f"c{i:04d}"
        assert [len(t.new_ids) for t in c.turns] == [38] + [5] * (len(c.turns) - 1)
        assert [t.think_s for t in c.turns] == [0.0] + [2.0] * (len(c.turns) - 1)
        assert c.turns[0].new_ids[:8] == first and {t.output_len for t in c.turns} == {3}


def test_a_conversation_ends_before_the_turn_that_would_not_fit():
    p = plan("multi-turn:turns=5,first=40,msg=10,out=10", max_len=100)
    c = p.conversation(0)  # contexts: 40+10=50, +10+10=70, +10+10=90, the 4th would need 110
    assert len(c.turns) == 3
    assert "64 conversation(s) cut to fit max_model_len=100" in " ".join(p.record().notes)  # the record's 64, all of 5 turns


def test_a_single_turn_prompt_too_long_keeps_its_head():
    p = plan("shared-prefix:groups=1,per_group=2,prefix=90,suffix=20,out=10", max_len=100)
    t = p.conversation(0).turns[0]
    assert len(t.new_ids) == 90 and t.new_ids == p.prefix(0)


# --- traces ---------------------------------------------------------------------------------

def write(tmp_path: Path, name: str, rows: list[dict] | str) -> str:
    f = tmp_path / name
    f.write_text(rows if isinstance(rows, str) else "".join(json.dumps(r) + "\n" for r in rows))
    return str(f)


def test_an_llmopt_trace_replays_at_its_times_over_the_speedup(tmp_path):
    rows = [{"time_s": 10.0 + 0.05 * k, "input_len": 20 + k, "output_len": 4} for k in range(20)][::-1]  # unsorted
    f = write(tmp_path, "t.jsonl", rows)
    p = plan(f"trace:file={f},speedup=2")
    assert [round(p.conversation(i).at_s, 9) for i in range(20)] == [round(0.025 * k, 9) for k in range(20)]
    assert [len(p.conversation(i).turns[0].new_ids) for i in range(20)] == [20 + k for k in range(20)]
    assert p.rate_rps == pytest.approx(19 / 0.475)
    window = plan(f"trace:file={f},start=0.2,end=0.5,limit=4")
    assert window.size == 4 and window.conversation(0).at_s == 0 and len(window.conversation(0).turns[0].new_ids) == 24


def test_a_csv_trace_and_its_prefix_groups(tmp_path):
    f = write(tmp_path, "t.csv", "time_s,input_len,output_len,prefix_group,prefix_len\n0,50,4,a,32\n1,60,4,a,40\n2,30,4,,0\n")
    p = plan(f"trace:file={f}")
    a, b = (p.conversation(i).turns[0].new_ids for i in range(2))
    assert len(a) == 50 and len(b) == 60 and a[:32] == b[:32] and a[32] != b[32]  # the common part of the group's stream


def test_a_mooncake_trace_shares_its_hash_id_blocks(tmp_path):
    rows = [{"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [7, 8, 9]},
            {"timestamp": 500, "input_length": 1200, "output_length": 5, "hash_ids": [7, 8, 10]}]
    p = plan(f"trace:file={write(tmp_path, 'm.jsonl', rows)}")
    a, b = (p.conversation(i).turns[0].new_ids for i in range(2))
    assert p.format == "mooncake" and p.conversation(1).at_s == 0.5  # milliseconds
    assert len(a) == 1100 and len(b) == 1200 and a[:1024] == b[:1024] and a[1024:1100] != b[1024:1100]


def test_an_azure_trace_reads_its_seven_digit_timestamps(tmp_path):
    text = ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
            "2023-11-16 18:15:50.9951700,396,0\n")
    p = plan(f"trace:file={write(tmp_path, 'a.csv', text)}")
    assert p.format == "azure" and p.conversation(1).at_s == pytest.approx(4.31458)
    assert p.conversation(1).turns[0].output_len == 1  # an answer of 0 tokens is sent as 1


def test_a_bad_trace_row_names_its_file_and_line(tmp_path):
    f = write(tmp_path, "t.jsonl", [{"time_s": 0, "input_len": 5, "output_len": 1}, {"time_s": 1, "input_len": 0, "output_len": 1}])
    with pytest.raises(UsageError, match=r"t.jsonl:2: a bad row"):
        plan(f"trace:file={f}")
