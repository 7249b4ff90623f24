"""Output quality, measured next to speed: perplexity on the shipped corpus (real weights
only) and agreement with the FP16 reference on the fixed prompt set.

Agreement is teacher-forced: the reference stage stores, for a few prompts, its greedy
continuation and its next-token log-probabilities; every other stage runs the same token
sequences and reports how often its argmax matches the reference token, the position of the
first mismatch, and the mean KL(P_ref || P_stage) of the next-token distributions."""

from __future__ import annotations

import math
from importlib import resources
from pathlib import Path
from typing import Any, Callable

QUALITY_PROMPTS = 4  # requests used for agreement
PROMPT_CAP = 256  # prompt tokens kept per agreement request (bounds the cost on 7B models)
CONTINUATION = 32  # reference tokens per request
PPL_WINDOW, PPL_STRIDE, PPL_MAX_TOKENS = 512, 256, 2048
CORPORA = {"en": "corpus_en.txt", "zh": "corpus_zh.txt"}
REFERENCE_FILE = "quality_reference.pt"


def reference_path(run_dir: Path, stage: str = "hf-fp16") -> Path:
    return run_dir / "stages" / stage / REFERENCE_FILE


def corpus(lang: str) -> str:
    return resources.files("llmopt_bench.data").joinpath(CORPORA[lang]).read_text(encoding="utf-8")


def _logits(model: Any, ids: list[int]) -> Any:
    import torch

    with torch.inference_mode():
        x = torch.tensor([ids], device=model.device)
        return model(input_ids=x).logits[0].float()


def perplexity(model: Any, encode: Callable[[str], list[int]], text: str, window: int = PPL_WINDOW,
               stride: int = PPL_STRIDE, max_tokens: int = PPL_MAX_TOKENS) -> dict[str, float]:
    """Sliding-window perplexity: each window scores only the tokens no earlier window scored,
    with up to window - stride tokens of context before them."""
    import torch

    ids = encode(text)[:max_tokens]
    nll, counted, prev_end = 0.0, 0, 0
    for begin in range(0, len(ids) - 1, stride):
        end = min(begin + window, len(ids))
        chunk = ids[begin:end]
        logits = _logits(model, chunk)
        logp = torch.log_softmax(logits[:-1], dim=-1)
        targets = torch.tensor(chunk[1:], device=logp.device)
        token_nll = -logp.gather(1, targets[:, None])[:, 0]
        new = end - max(prev_end, begin + 1)  # tokens [max(prev_end, begin+1), end) are new
        nll += float(token_nll[-new:].sum()) if new > 0 else 0.0
        counted += max(new, 0)
        prev_end = end
        if end == len(ids):
            break
    return {"perplexity": math.exp(nll / counted), "tokens": counted}


def make_reference(model: Any, requests: list[Any], greedy: Callable[[list[int], int], list[int]]) -> dict[str, Any]:
    """Greedy continuations and the teacher-forced log-probs that produced them."""
    import torch

    items = []
    for r in requests:
        prompt = list(r.token_ids)[:PROMPT_CAP]
        cont = greedy(prompt, CONTINUATION)
        logits = _logits(model, prompt + cont[:-1])[len(prompt) - 1:]
        items.append({"id": r.id, "prompt": prompt, "continuation": cont,
                      "logprobs": torch.log_softmax(logits, dim=-1).half().cpu()})
    return {"items": items}


def agreement(model: Any, reference: dict[str, Any]) -> dict[str, Any]:
    import torch

    matches = positions = 0
    firsts, kls = [], []
    for item in reference["items"]:
        prompt, cont = item["prompt"], item["continuation"]
        logits = _logits(model, prompt + cont[:-1])[len(prompt) - 1:]
        logq = torch.log_softmax(logits, dim=-1)
        # stored in fp16 to keep the file small: renormalise, or rounding alone makes KL negative
        logp = torch.log_softmax(item["logprobs"].to(logq.device).float(), dim=-1)
        pred = logq.argmax(dim=-1).tolist()
        same = [a == b for a, b in zip(pred, cont)]
        matches += sum(same)
        positions += len(cont)
        firsts.append(same.index(False) if False in same else len(cont))
        kls.append(float((logp.exp() * (logp - logq)).sum(dim=-1).mean()))
    return {"token_match_rate": matches / positions if positions else None,
            "first_divergence_mean": sum(firsts) / len(firsts) if firsts else None,
            "kl_mean": sum(kls) / len(kls) if kls else None, "agreement_positions": positions,
            "agreement_method": f"teacher-forced on {len(firsts)} prompts x {CONTINUATION} reference tokens"}


def evaluate(model: Any, encode: Callable[[str], list[int]], requests: list[Any], run_dir: Path, stage_dir: Path,
             real_weights: bool, is_reference: bool, greedy: Callable[[list[int], int], list[int]],
             progress: Callable[..., None]) -> dict[str, Any]:
    """The quality block every stage reports under extra["quality"]."""
    import torch

    out: dict[str, Any] = {"reference": "hf-fp16", "perplexity_meaningful": real_weights}
    if real_weights:
        progress("quality: perplexity on the shipped corpus", None, None)
        per_lang = {lang: perplexity(model, encode, corpus(lang)) for lang in CORPORA}
        out["perplexity_by_lang"] = {k: v["perplexity"] for k, v in per_lang.items()}
        total_tokens = sum(v["tokens"] for v in per_lang.values())
        out["perplexity"] = math.exp(sum(math.log(v["perplexity"]) * v["tokens"] for v in per_lang.values()) / total_tokens)
        out["perplexity_tokens"] = total_tokens
    else:
        out["perplexity"] = None
        out["perplexity_note"] = "random weights: perplexity is not meaningful; agreement with FP16 only"
    progress("quality: agreement with the FP16 reference", None, None)
    if is_reference:
        ref = make_reference(model, requests, greedy)
        stage_dir.mkdir(parents=True, exist_ok=True)
        torch.save(ref, stage_dir / REFERENCE_FILE)
        out.update(agreement(model, ref))
        return out
    path = reference_path(run_dir)
    if not path.is_file():
        out["agreement_note"] = "no FP16 reference in this run: run hf-fp16 first (same --output) for agreement and KL"
        return out
    out.update(agreement(model, torch.load(path, weights_only=False)))
    return out
