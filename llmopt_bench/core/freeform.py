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

# free-form: keyword arguments handed through as they are to a library (transformers' from_pretrained,
# a model config, vLLM's engine arguments); the library checks them
Kwargs = dict[str, Any]

# free-form: a TOML table as the user wrote it (a journey, a workload spec); its reader checks
# each key and says which one is wrong
Table = dict[str, Any]
