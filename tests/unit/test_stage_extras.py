"""Every stage's Extra reads back what the stage stored. Stages keep their extra with
model_dump(exclude_none=True), so a field that may be None must also default to None: a required
None is dropped on the way out and the record no longer validates (the vllm-serve stage once
ended in error on a capacity search that held at every rate)."""

from __future__ import annotations

import typing

from pydantic import BaseModel

from llmopt_bench.run.registry import load_stage, stage_names


def _models(annotation) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]


def _required_nullable(model: type[BaseModel], seen: set) -> list[str]:
    if model in seen:
        return []
    seen.add(model)
    found = []
    for name, field in model.model_fields.items():
        if field.is_required() and type(None) in typing.get_args(field.annotation):
            found.append(f"{model.__name__}.{name}")
        for sub in _models(field.annotation):
            found += _required_nullable(sub, seen)
    return found


def test_no_stage_extra_has_a_required_field_that_may_be_none():
    seen: set = set()
    names = stage_names()
    assert "vllm-serve" in names and "openai-endpoint" in names
    found = [f for name in names for f in _required_nullable(load_stage(name).Extra, seen)]
    assert len(seen) > 10  # the walk reached the nested models
    assert found == []
