"""The compiled twin's decode agreement (engines/hf/compiled.compare_decode), on constructed
logits: a flip between two tokens the reference rates as a near tie is rounding's and counted
apart; a flip against a clear reference choice, or wrong logits, is a disagreement."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from llmopt_bench.engines.hf.compiled import TIE_NATS, compare_decode  # noqa: E402

VOCAB = 8


def reference(choices: list[int], margins: list[float]) -> tuple[object, list[int]]:
    """Reference logits whose argmax at step i is choices[i], ahead of the runner-up by margins[i];
    returned as the reference file holds them (fp16 log-probs) with its greedy continuation."""
    logits = torch.zeros(len(choices), VOCAB)
    for i, (c, m) in enumerate(zip(choices, margins)):
        logits[i] = torch.linspace(-3, 0, VOCAB)  # a spread of candidates below the top two
        logits[i, c] = 1.0
        logits[i, (c + 1) % VOCAB] = 1.0 - m
    return logits, choices


def as_file(logits):
    return torch.log_softmax(logits, dim=-1).half()


def test_a_near_tie_flip_is_counted_apart_not_as_a_disagreement():
    logits, cont = reference([1, 4, 2, 6], [0.5, 0.5, 0.001, 0.5])
    compiled = logits + 1e-4 * torch.randn(logits.shape, generator=torch.Generator().manual_seed(0))
    compiled[2, 3], compiled[2, 2] = 1.0, 1.0 - 0.001  # the near-tied pair, flipped by rounding
    agree = compare_decode([(as_file(logits), cont, compiled)])
    # what the old free-running comparison reported as a failure: 3 of 4 equal
    assert agree.match_rate == 0.75 and agree.tokens == 4
    assert agree.near_ties == 1 and agree.disagreements == 0 and agree.tie_nats == TIE_NATS
    assert agree.first_divergence_mean == 2
    assert agree.logprob_delta_max < TIE_NATS


def test_a_flip_against_a_clear_choice_is_a_disagreement():
    logits, cont = reference([1, 4, 2, 6], [0.5, 0.5, 0.001, 0.5])
    compiled = logits.clone()
    compiled[1, 0] = 2.0  # step 1: the decode picks token 0, which the reference rates 1.5+ nats below its own
    agree = compare_decode([(as_file(logits), cont, compiled)])
    assert agree.match_rate == 0.75 and agree.near_ties == 0 and agree.disagreements == 1


def test_wrong_logits_fail_on_every_clear_step():
    """A miscompile that returns another step's logits (a cache read at the wrong position)."""
    logits, cont = reference([1, 4, 2, 6, 0, 3], [0.5, 0.5, 0.001, 0.5, 0.4, 0.3])
    agree = compare_decode([(as_file(logits), cont, logits.roll(1, dims=0))])
    assert agree.disagreements >= 5 and agree.near_ties <= 1
    assert agree.logprob_delta_max > 1.0


def test_counts_add_up_over_prompts():
    a, ca = reference([1, 2], [0.5, 0.5])
    b, cb = reference([3, 5, 7], [0.01, 0.5, 0.5])
    flipped = b.clone()
    flipped[0, 4], flipped[0, 3] = 1.0, 0.99  # near tie at b's first step
    agree = compare_decode([(as_file(a), ca, a), (as_file(b), cb, flipped)])
    assert agree.tokens == 5 and agree.match_rate == pytest.approx(4 / 5)
    assert (agree.near_ties, agree.disagreements) == (1, 0)
    assert agree.first_divergence_mean == pytest.approx((2 + 0) / 2)
