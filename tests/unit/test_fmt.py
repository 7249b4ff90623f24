"""Numbers as the report shows them; a tail percentile of few samples says it is the maximum."""

from llmopt_bench.core.fmt import change, gb_text, ms_text, num, pct, quantity, tail


def test_p99_of_fewer_than_100_samples_is_marked_as_the_maximum():
    assert tail(12.345, 24, 0.99) == "12.3 (~max)"
    assert tail(12.345, 3, 0.99) == "12.3 (~max)"
    assert tail(12.345, 100, 0.99) == 12.345  # one sample beyond it: a tail estimate
    assert tail(12.345, 24, 0.90) == 12.345  # 2.4 samples beyond p90
    assert tail(None, 24, 0.99) is None


def test_small_percentages_keep_their_digits():
    assert pct(0.0015) == "0.15%" and pct(0.25) == "25.0%" and pct(0) == "0.0%"
    assert num(0.01234) == "0.0123" and num(1234.5) == "1234" and num(None) == "-"


def test_a_share_and_a_change_are_two_functions():
    """pct is a share (no sign), change a relative change (always signed): one function each."""
    assert pct(0.034) == "3.4%" and change(0.034) == "+3.4%" and change(-0.1) == "-10.0%" and change(None) == "-"


def test_a_figure_prints_with_its_unit_and_the_digits_its_unit_takes():
    assert quantity(12.3456, "ms") == "12.35 ms" and quantity(1.23456, "s") == "1.235 s"
    assert quantity(13.4768, "GB") == "13.48 GB" and quantity(2.565, "req/s") == "2.56 req/s"  # 2.565 is 2.5649... in binary
    assert quantity(512.34, "tok/s") == "512.3 tok/s" and quantity(24, "") == "24" and quantity(None, "ms") == "-"
    assert ms_text(0.01234) == "12.3 ms" and gb_text(13_476_831_744) == "13.5 GB" and gb_text(0) == "-"
