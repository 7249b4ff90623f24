"""The continuous-batching stage's typed record parts (scenarios/batching/record.py) are read
leniently: a record written in part (a run from before a key existed, a test's or a plugin's)
validates, and a key the type does not declare is kept, so the report's hooks never lose a
stage's charts and claims over a missing or a newer key."""

from __future__ import annotations

from llmopt_bench.scenarios.batching.record import BatchingExtra


def test_a_partial_record_validates_and_keeps_what_it_does_not_declare():
    raw = {"sweep": {"main_concurrency": 16, "from_a_newer_version": "x"}, "engine": {"max_model_len": 4096},
           "h200_reference": {"model": "Llama-2-7B"}, "mixed_setup": {"batch": 8}}
    extra = BatchingExtra.model_validate(raw)
    assert extra.sweep == {"main_concurrency": 16, "from_a_newer_version": "x"}
    dumped = extra.model_dump(exclude_unset=True, exclude_none=True)
    assert {k: dumped[k] for k in raw} == raw
