"""Names for the places that hold free-form data: dicts whose keys are set by someone else (a
server, a file on disk, a library's keyword arguments, the user's TOML) or checked later by a
pydantic model. Each name says why the dict is free-form where it is used; where a structure is
known, a model, a TypedDict or a dataclass says so instead."""

from __future__ import annotations

from typing import Any

# free-form: JSON as read from disk, sent by a server, passed between processes as a file, or
# written out as it is (an export, a command's --json); its keys are the writer's (vLLM, a run.json
# of any schema version, a probe's answer)
Json = dict[str, Any]

# NOT truly free-form: a part of a record (a stage's extra or params, a row, a trial's figures) on
# its way into the pydantic model that stores it, which checks the keys it names there, once, and
# keeps its open parts (what NVML, an engine or a probe could say) as they came. Each use is a
# place still to type (issue 36): a model of its own for the part, checked against every committed
# run.json, instead of keyword bundles built by hand.
Fields = dict[str, Any]

# free-form: keyword arguments handed through as they are to a library (transformers' from_pretrained,
# a model config, vLLM's engine arguments); the library checks them
Kwargs = dict[str, Any]

# free-form: a TOML table as the user wrote it (a journey, a workload spec); its reader checks
# each key and says which one is wrong
Table = dict[str, Any]
