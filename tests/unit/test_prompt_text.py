"""Text prompts of the asked length (workloads/text.py), on real tokenizers: synthetic:tiny's
byte-level BPE, SmolLM2's, a SentencePiece-style one that adds a BOS, and a tokenizer without
offsets. Random token ids decoded to text do not re-tokenize to their own count (issue 38: 450
became 523 on an H100's llama2 tokenizer); the texts made here must, at every length, and a
shared prefix of ids must stay a shared prefix of text."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from llmopt_bench.workloads.text import BLOCK, PromptTexts

LENGTHS = (1, 2, 7, 128, 450, 2000)


def _allowed(tok) -> list[int]:
    special = set(getattr(tok, "all_special_ids", []) or [])
    return [i for i in range(len(tok)) if i not in special]


def _prompts(tok, n: int, k: int, seed: int = 0) -> list[list[int]]:
    ids = _allowed(tok)
    return [random.Random(f"{seed}:{n}:{i}").choices(ids, k=n) for i in range(k)]


@pytest.fixture(scope="module")
def tiny_tok(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model.path)


@pytest.fixture(scope="module")
def smollm2_tok(llmopt_cache):
    """SmolLM2-135M's tokenizer as the stages load it (the bundled model prepared once a session)."""
    from transformers import AutoTokenizer

    from llmopt_bench.checkpoints.prepare import prepare
    from llmopt_bench.core.models import parse_model

    return AutoTokenizer.from_pretrained(prepare(parse_model("bundled:smollm2-135m")).path)


def _check_exact(tok, count_with):
    texts = PromptTexts(tok, seed=7)
    for n in LENGTHS:
        prompts = _prompts(tok, n, 12 if n >= 2000 else 24)
        naive = [count_with(tok.decode(p)) for p in prompts]  # what decoding alone sends
        texts.prepare(prompts)
        for p in prompts:
            text = texts.text(p)
            assert count_with(text) == n, (n, p[:8])
            assert texts.count(text) == n
        if n >= 128:  # the failure this module removes: decoded random ids re-tokenize to another length
            assert any(c != n for c in naive)
    assert texts.inexact == 0


def test_synthetic_tokenizer_texts_have_the_asked_length(tiny_tok):
    _check_exact(tiny_tok, lambda t: len(tiny_tok(t)["input_ids"]))


def test_smollm2_texts_have_the_asked_length(smollm2_tok):
    _check_exact(smollm2_tok, lambda t: len(smollm2_tok(t)["input_ids"]))


def test_a_tokenizer_that_adds_a_bos_counts_it_as_the_server_does(tmp_path):
    """A SentencePiece-style BPE (Metaspace, byte fallback) whose template adds <s>: the server
    counts the BOS in usage.prompt_tokens, so the text holds one token less."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    from llmopt_bench.checkpoints.tokenizer import shipped_text

    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Sequence([decoders.Metaspace(), decoders.ByteFallback(), decoders.Fuse()])
    specials = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    tok.train_from_iterator(shipped_text(), trainers.BpeTrainer(vocab_size=1500, special_tokens=specials, show_progress=False))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    texts = PromptTexts(tok, seed=1)
    assert texts.specials == 1
    ids = list(range(len(specials), tok.get_vocab_size()))
    for n in (2, 7, 128, 450):
        prompt = random.Random(n).choices(ids, k=n)
        text = texts.text(prompt)
        assert len(tok.encode(text).ids) == n  # BOS included
        assert tok.encode(text).ids[0] == 1


class _NoOffsets:
    """A tokenizer that only encodes and decodes (no offsets, no batch calls): the bisection path."""

    def __init__(self, tok):
        self.tok = tok

    def encode(self, text, add_special_tokens=True):
        return self.tok(text, add_special_tokens=add_special_tokens)["input_ids"]

    def decode(self, ids):
        return self.tok.decode(ids)

    def __len__(self):
        return len(self.tok)


def test_a_tokenizer_without_offsets_is_cut_by_bisection(tiny_tok):
    slow = _NoOffsets(tiny_tok)
    texts = PromptTexts(slow, seed=2)
    assert not texts.codec.fast
    for n in (1, 7, 128):
        for p in _prompts(tiny_tok, n, 4):
            assert len(tiny_tok(texts.text(p))["input_ids"]) == n


def test_the_same_ids_and_seed_make_the_same_text_in_a_fresh_maker(tiny_tok):
    prompts = _prompts(tiny_tok, 300, 6)
    first = [PromptTexts(tiny_tok, seed=3).text(p) for p in prompts]
    again = PromptTexts(tiny_tok, seed=3)
    again.prepare(prompts)
    assert [again.ready(p) for p in prompts] == first
    assert again.ready(_prompts(tiny_tok, 300, 1, seed=9)[0]) is None  # not made: no work done


def test_a_shared_prefix_of_ids_is_a_shared_prefix_of_text(tiny_tok):
    """shared-prefix's requests: one group's prefix (1024 ids), each its own suffix. Their texts
    share the prefix's blocks' text, so the server tokenizes the same prefix for each (its prefix
    cache hits) up to the block that straddles the prefix's end."""
    ids = _allowed(tiny_tok)
    prefix = random.Random("prefix").choices(ids, k=1024)
    prompts = [prefix + random.Random(f"suffix{i}").choices(ids, k=32) for i in range(4)]
    texts = PromptTexts(tiny_tok, seed=0)
    made = [texts.text(p) for p in prompts]
    common = os.path.commonprefix(made)
    shared = len(tiny_tok(common)["input_ids"])
    assert shared >= 1024 - 2 * BLOCK
    assert all(len(tiny_tok(t)["input_ids"]) == 1056 for t in made)
    # decoding alone would not have kept the proportions: the prefix's own text is longer than 1024 tokens
    assert len(tiny_tok(tiny_tok.decode(prefix))["input_ids"]) != 1024


def test_a_conversation_s_next_turn_starts_with_its_previous_turn_s_text(tiny_tok):
    ids = _allowed(tiny_tok)
    turn0 = random.Random("t0").choices(ids, k=300)
    turn1 = turn0 + random.Random("answer").choices(ids, k=100) + random.Random("msg").choices(ids, k=32)
    texts = PromptTexts(tiny_tok, seed=0)
    a, b = texts.text(turn0), texts.text(turn1)
    full_blocks = 300 // BLOCK * BLOCK
    common = os.path.commonprefix([a, b])
    assert len(tiny_tok(common)["input_ids"]) >= full_blocks - BLOCK
    assert len(tiny_tok(b)["input_ids"]) == 432


def test_the_made_texts_are_what_the_stage_sends(tiny_tok, tmp_path):
    """Texts survive a round trip through a file as JSON (what `llmopt check peer` exports for vLLM's client)."""
    import json

    p = _prompts(tiny_tok, 128, 1)[0]
    text = PromptTexts(tiny_tok, seed=0).text(p)
    path = Path(tmp_path) / "x.jsonl"
    path.write_text(json.dumps({"prompt": text}, ensure_ascii=False) + "\n", encoding="utf-8")
    back = json.loads(path.read_text(encoding="utf-8"))["prompt"]
    assert len(tiny_tok(back)["input_ids"]) == 128
