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
from typing import Any, Callable, TypedDict

from llmopt_bench.core.freeform import Json

QUALITY_PROMPTS = 4  # requests used for agreement
PROMPT_CAP = 256  # prompt tokens kept per agreement request (bounds the cost on 7B models)
CONTINUATION = 32  # reference tokens per request
PPL_WINDOW, PPL_STRIDE, PPL_MAX_TOKENS = 512, 256, 2048
CORPORA = {"en": "corpus_en.txt", "zh": "corpus_zh.txt"}
REFERENCE_FILE = "quality_reference.pt"


class Perplexity(TypedDict):
    perplexity: float
    tokens: int  # scored


class CorpusPerplexity(TypedDict):
    perplexity_by_lang: dict[str, float]
    perplexity: float  # over both corpora: token-weighted geometric mean
    perplexity_tokens: int


class NoPerplexity(TypedDict):
    perplexity: None
    perplexity_note: str


class Agreement(TypedDict, total=False):
    """Agreement with the reference (teacher-forced), or only the note that says why there is none."""

    token_match_rate: float | None
    first_divergence_mean: float | None
    kl_mean: float | None
    kl_note: str  # why KL is missing (vLLM: top-k log-probs only)
    nll_delta_mean: float | None
    agreement_positions: int
    agreement_method: str
    agreement_note: str


class QualityFields(Agreement, total=False):
    """A stage's quality record as the engines build it: core.records.QualityRecord's fields."""

    reference: str | None
    engine: str
    perplexity_meaningful: bool
    perplexity: float | None
    perplexity_note: str
    perplexity_by_lang: dict[str, float]
    perplexity_tokens: int


NOT_MEANINGFUL: NoPerplexity = {"perplexity": None, "perplexity_note": "random weights: perplexity is not meaningful; agreement with FP16 only"}
NOT_SAME_WEIGHTS = ("load_format=dummy: the weights are random and not the FP16 reference's, so agreement "
                    "would compare two unrelated models: not measured (speed and memory only)")
NO_REFERENCE = ("no quality reference in this run: run the stage that provides it (the FP16 baseline) first, "
                "with the same --output, for agreement and KL")


class ReferenceRefused(Exception):
    """The reference file is not plain data (see load_reference)."""


def load_reference(path: Path) -> Json:
    """The FP16 reference file, read as data only: torch.load with weights_only=True unpickles
    tensors, lists, dicts and numbers, never code, so a run directory from someone else cannot
    run anything here. Raises ReferenceRefused when the file holds anything else."""
    import pickle

    import torch

    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as e:  # what weights_only raises for anything but plain data
        lines = [line.strip() for line in str(e).splitlines()]
        why = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("WeightsUnpickler error:")),
                   lines[0] if lines else type(e).__name__)
        raise ReferenceRefused(f"refused to load the FP16 reference {path}: it holds more than tensors and plain "
                               f"data ({why.split('. ')[0][:160]}); agreement not measured") from e


def reference_agreement(path: Path, measure: Callable[[Json], Agreement]) -> Agreement:
    """Agreement with the reference at path, or the note that says why there is none."""
    if not path.is_file():
        return {"agreement_note": NO_REFERENCE}
    try:
        ref = load_reference(path)
    except ReferenceRefused as e:
        return {"agreement_note": str(e)}
    return measure(ref)


def corpus(lang: str) -> str:
    return resources.files("llmopt_bench.data").joinpath(CORPORA[lang]).read_text(encoding="utf-8")


def _logits(model: Any, ids: list[int]) -> Any:
    import torch

    with torch.inference_mode():
        x = torch.tensor([ids], device=model.device)
        return model(input_ids=x).logits[0].float()


def sliding_windows(n: int, window: int = PPL_WINDOW, stride: int = PPL_STRIDE) -> list[tuple[int, int, int]]:
    """(begin, end, new) per window over n token ids: window [begin, end) scores its last `new`
    tokens, which no earlier window scored, with up to window - stride tokens of context."""
    out, prev_end = [], 0
    stride = min(stride, window - 1)  # windows must overlap by one: a window's first token has no context
    for begin in range(0, n - 1, stride):
        end = min(begin + window, n)
        out.append((begin, end, max(0, end - max(prev_end, begin + 1))))
        prev_end = end
        if end == n:
            break
    return out


def perplexity_of(ids: list[int], chunk_nlls: Callable[[list[list[int]]], list[list[float]]],
                  window: int = PPL_WINDOW, stride: int = PPL_STRIDE) -> Perplexity:
    """Sliding-window perplexity of ids. chunk_nlls maps chunks to the NLL of each chunk's
    tokens after the first (the engine's part: transformers logits, vLLM prompt log-probs)."""
    wins = sliding_windows(len(ids), window, stride)
    nlls = chunk_nlls([ids[b:e] for b, e, _ in wins])
    total = sum(sum(nll[-new:]) for nll, (_, _, new) in zip(nlls, wins) if new)
    counted = sum(new for _, _, new in wins)
    return {"perplexity": math.exp(total / counted), "tokens": counted}


def hf_chunk_nlls(model: Any) -> Callable[[list[list[int]]], list[list[float]]]:
    import torch

    def nlls(chunks: list[list[int]]) -> list[list[float]]:
        out = []
        for chunk in chunks:
            logp = torch.log_softmax(_logits(model, chunk)[:-1], dim=-1)
            targets = torch.tensor(chunk[1:], device=logp.device)
            out.append((-logp.gather(1, targets[:, None])[:, 0]).tolist())
        return out
    return nlls


def perplexity(model: Any, encode: Callable[[str], list[int]], text: str, window: int = PPL_WINDOW,
               stride: int = PPL_STRIDE, max_tokens: int = PPL_MAX_TOKENS) -> Perplexity:
    return perplexity_of(encode(text)[:max_tokens], hf_chunk_nlls(model), window, stride)


def corpus_perplexity(ppl_of_text: Callable[[str], Perplexity]) -> CorpusPerplexity:
    """Perplexity per shipped corpus and over both (token-weighted geometric mean)."""
    per_lang = {lang: ppl_of_text(corpus(lang)) for lang in CORPORA}
    total_tokens = sum(v["tokens"] for v in per_lang.values())
    return {"perplexity_by_lang": {k: v["perplexity"] for k, v in per_lang.items()},
            "perplexity": math.exp(sum(math.log(v["perplexity"]) * v["tokens"] for v in per_lang.values()) / total_tokens),
            "perplexity_tokens": total_tokens}


def make_reference(model: Any, requests: list[Any], greedy: Callable[[list[int], int], list[int]]) -> Json:
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


def agreement(model: Any, reference: Json) -> Agreement:
    import torch

    matches = positions = 0
    firsts, kls, deltas = [], [], []
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
        targets = torch.tensor(cont, device=logq.device)[:, None]
        deltas.append(float((logp.gather(1, targets) - logq.gather(1, targets)).mean()))
    return {"token_match_rate": matches / positions if positions else None,
            "first_divergence_mean": sum(firsts) / len(firsts) if firsts else None,
            "kl_mean": sum(kls) / len(kls) if kls else None, "nll_delta_mean": sum(deltas) / len(deltas) if deltas else None,
            "agreement_positions": positions,
            "agreement_method": f"teacher-forced on {len(firsts)} prompts x {CONTINUATION} reference tokens"}


def evaluate(model: Any, encode: Callable[[str], list[int]], requests: list[Any], reference_file: Path | None,
             reference_name: str | None, real_weights: bool, is_reference: bool,
             greedy: Callable[[list[int], int], list[int]], progress: Callable[..., None]) -> QualityFields:
    """The quality record of a transformers stage (stage.QualityRecord's fields). The stage that
    provides the run's reference writes it to reference_file; the others read it from there."""
    import torch

    out: QualityFields = {"reference": reference_name, "perplexity_meaningful": real_weights}
    if real_weights:
        progress("quality: perplexity on the shipped corpus", None, None)
        out = {**out, **corpus_perplexity(lambda text: perplexity(model, encode, text))}
    else:
        out = {**out, **NOT_MEANINGFUL}
    progress("quality: agreement with the FP16 reference", None, None)
    if is_reference and reference_file is not None:
        ref = make_reference(model, requests, greedy)
        reference_file.parent.mkdir(parents=True, exist_ok=True)
        torch.save(ref, reference_file)
        out.update(agreement(model, ref))
        return out
    if reference_file is None:
        out["agreement_note"] = NO_REFERENCE
        return out
    out.update(reference_agreement(reference_file, lambda ref: agreement(model, ref)))
    return out
