"""Output quality for stages that run in vLLM (vllm, vllm-fp8, awq-int4), measured the same way
as for transformers (analysis/quality.py) through vLLM's prompt log-probabilities:

- perplexity: the same sliding windows over the shipped corpus, each window a prompt whose
  tokens' log-probs vLLM returns (prompt_logprobs=0), all windows in one batch;
- agreement: the FP16 reference's prompt + continuation as one prompt (prompt_logprobs=1: each
  position's top token and the reference token's log-prob), teacher-forced as in transformers.

vLLM returns the top-k log-probs only, not whole distributions, so KL is not computed here;
nll_delta_mean (the stage's NLL of the reference's tokens minus the reference's own) stands in,
and transformers stages report it too.

The same measures run against vLLM's server (engines/vllm/served_quality.py): everything below takes
a `prompt_logprobs(prompts, k)` function, the offline engine's or the server's."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from llmopt_bench.analysis import quality as Q
from llmopt_bench.core.freeform import Json

# prompts (token ids), k -> per prompt, per position: {token id: an object with .logprob and
# .rank} (None at position 0), as vLLM's RequestOutput.prompt_logprobs
PromptLogprobs = Callable[[list[list[int]], int], list[list[Any]]]


def _prompt_logprobs(llm: Any, prompts: list[list[int]], k: int) -> list[list[dict]]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=k, detokenize=False)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    return [o.prompt_logprobs for o in outs]


def offline(llm: Any) -> PromptLogprobs:
    return lambda prompts, k: _prompt_logprobs(llm, prompts, k)


def chunk_nlls(logprobs: PromptLogprobs) -> Callable[[list[list[int]]], list[list[float]]]:
    def nlls(chunks: list[list[int]]) -> list[list[float]]:
        return [[-lp[tok].logprob for tok, lp in zip(chunk[1:], per[1:])]
                for chunk, per in zip(chunks, logprobs(chunks, 0))]
    return nlls


def agreement(logprobs: PromptLogprobs, reference: Json) -> Q.Agreement:
    import torch

    items = reference["items"]
    # prompt + the whole continuation: vLLM scores every prompt token given those before it,
    # so position len(prompt) + k holds the log-probs that predict continuation[k]
    per_item = logprobs([list(it["prompt"]) + list(it["continuation"]) for it in items], 1)
    matches = positions = 0
    firsts, deltas = [], []
    for item, per in zip(items, per_item):
        prompt, cont = list(item["prompt"]), list(item["continuation"])
        logp = torch.log_softmax(item["logprobs"].float(), dim=-1)  # stored in fp16: renormalise
        same, delta = [], []
        for k, tok in enumerate(cont):
            lp = per[len(prompt) + k]
            same.append(min(lp.items(), key=lambda kv: kv[1].rank)[0] == tok)
            delta.append(float(logp[k, tok]) - lp[tok].logprob)
        matches += sum(same)
        positions += len(same)
        firsts.append(same.index(False) if False in same else len(cont))
        deltas.append(sum(delta) / len(delta))
    return {"token_match_rate": matches / positions if positions else None,
            "first_divergence_mean": sum(firsts) / len(firsts) if firsts else None,
            "kl_mean": None, "kl_note": "vLLM returns top-k log-probs only: KL not computed; see nll_delta_mean",
            "nll_delta_mean": sum(deltas) / len(deltas) if deltas else None, "agreement_positions": positions,
            "agreement_method": f"teacher-forced on {len(firsts)} prompts x {Q.CONTINUATION} reference tokens (vLLM prompt log-probs)"}


def evaluate(llm: Any, encode: Callable[[str], list[int]], reference_file: Path | None, reference_name: str | None,
             real_weights: bool, progress: Callable[..., None], dummy: bool = False, engine: str = "vllm") -> Q.QualityFields:
    """The quality record of a vLLM stage (stage.QualityRecord's fields). dummy: the engine made
    up its own random weights (load_format=dummy), so nothing compares with the reference.
    llm: the offline engine, or a PromptLogprobs function (the server's)."""
    logprobs = llm if callable(llm) else offline(llm)
    out: Q.QualityFields = {"reference": reference_name, "perplexity_meaningful": real_weights, "engine": engine}
    if dummy:
        return {**out, **Q.NOT_MEANINGFUL, "agreement_note": Q.NOT_SAME_WEIGHTS}
    if real_weights:
        progress("quality: perplexity on the shipped corpus", None, None)
        out = {**out, **Q.corpus_perplexity(lambda text: Q.perplexity_of(encode(text)[:Q.PPL_MAX_TOKENS], chunk_nlls(logprobs)))}
    else:
        out = {**out, **Q.NOT_MEANINGFUL}
    progress("quality: agreement with the FP16 reference", None, None)
    if reference_file is None:
        out["agreement_note"] = Q.NO_REFERENCE
        return out
    out.update(Q.reference_agreement(reference_file, lambda ref: agreement(logprobs, ref)))
    return out
