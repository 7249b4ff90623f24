"""Synthetic Llama checkpoints: deterministic random weights written once as safetensors,
so that every stage reads the same files from disk and its load time is real."""

from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from llmopt_bench.core.freeform import Kwargs

SHARD_BYTES = 2 * 1024**3
INIT_STD = 0.02  # Llama's initializer_range: keeps activations finite through 32 layers in fp16


def _seed(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little") & (2**63 - 1)


def ensure_synthetic(preset: str, shape: Kwargs, out: Path) -> Path:
    if (out / "config.json").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two runs sharing a cache write it once
        if not (out / "config.json").is_file():
            tmp = out.with_name(out.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            _write(preset, shape, tmp)
            tmp.rename(out)
    return out


def _write(preset: str, shape: Kwargs, out: Path) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    from llmopt_bench.checkpoints.tokenizer import train_tokenizer

    config = LlamaConfig(**shape, bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False,
                         initializer_range=INIT_STD, dtype="float16", architectures=["LlamaForCausalLM"])
    with torch.device("meta"):
        skeleton = LlamaForCausalLM(config)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    shards: list[dict[str, Any]] = [{}]  # tensor name -> torch tensor (torch is imported inside)
    size = 0
    for name, param in skeleton.state_dict().items():
        gen = torch.Generator(device=device).manual_seed(_seed(f"{preset}/{name}"))
        if name.endswith("norm.weight"):
            t = torch.ones(param.shape, dtype=torch.float16)
        else:
            t = (torch.randn(param.shape, generator=gen, device=device, dtype=torch.float32) * INIT_STD).half().cpu()
        nbytes = t.numel() * 2
        if size and size + nbytes > SHARD_BYTES:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = "model.safetensors" if len(shards) == 1 else f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / fname), metadata={"format": "pt"})
        weight_map.update({k: fname for k in shard})
    if len(shards) > 1:
        total = sum(t.numel() * 2 for s in shards for t in s.values())
        (out / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    config.save_pretrained(str(out))
    GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0, do_sample=False).save_pretrained(str(out))
    train_tokenizer(min(shape["vocab_size"], 32000), out)
