"""Sliding-window perplexity accounting, shared by the transformers and vLLM quality code:
every token after the first is scored exactly once, with at most `window` tokens of context."""

from __future__ import annotations

import math

import pytest

from llmopt_bench.analysis.quality import perplexity_of, sliding_windows


@pytest.mark.parametrize("n,window,stride", [(2, 512, 256), (100, 512, 256), (512, 512, 256), (513, 512, 256),
                                             (2048, 512, 256), (1000, 64, 16), (777, 100, 100)])
def test_every_token_scored_once(n, window, stride):
    scored = []
    for begin, end, new in sliding_windows(n, window, stride):
        assert 0 <= begin < end <= n and end - begin <= window
        scored += list(range(end - new, end))
        assert new == 0 or end - new >= begin + 1  # a scored token has the window's tokens before it
    assert scored == list(range(1, n))


def test_perplexity_of_sums_the_new_tokens_nll_only():
    ids = list(range(1, 1001))
    # an "engine" whose NLL of a token is its id / 1000: each window returns NLLs for chunk[1:]
    nll = lambda chunks: [[t / 1000 for t in c[1:]] for c in chunks]  # noqa: E731
    got = perplexity_of(ids, nll, window=128, stride=32)
    assert got["tokens"] == 999
    assert got["perplexity"] == pytest.approx(math.exp(sum(t / 1000 for t in ids[1:]) / 999))
