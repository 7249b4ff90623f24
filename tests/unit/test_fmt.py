"""Numbers as the report shows them; a tail percentile of few samples says it is the maximum."""

from llmopt_bench.core.fmt import num, pct, tail


def test_p99_of_fewer_than_100_samples_is_marked_as_the_maximum():
    assert tail(12.345, 24, 0.99) == "12.3 (~max)"
    assert tail(12.345, 3, 0.99) == "12.3 (~max)"
    assert tail(12.345, 100, 0.99) == 12.345  # one sample beyond it: a tail estimate
    assert tail(12.345, 24, 0.90) == 12.345  # 2.4 samples beyond p90
    assert tail(None, 24, 0.99) is None


def test_small_percentages_keep_their_digits():
    assert pct(0.0015) == "0.15%" and pct(0.25) == "25.0%" and pct(0) == "0.0%"
    assert num(0.01234) == "0.0123" and num(1234.5) == "1234" and num(None) == "-"
