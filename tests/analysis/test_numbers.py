"""Sizes in the unit that shows them (issue 25, point 4): a small trace never reads "0.0 MB"."""

from lightning_perf.analysis.numbers import size_text


def test_sizes_below_one_mb_are_shown_in_kb_and_larger_ones_in_mb_or_gb():
    assert size_text(0.0032) == "3.2 kB"
    assert size_text(0.001) == "1 kB"  # max_trace_mb=0.001
    assert size_text(12.345) == "12.3 MB"
    assert size_text(1234.5) == "1.23 GB"
    assert size_text(0.0001) == "100 B"


def test_a_size_that_rounds_up_to_the_next_unit_is_shown_in_it():
    assert size_text(0.9997) == "1 MB"  # not "1e+03 kB"
    assert size_text(999.7) == "1 GB"


def test_an_absent_size_is_not_a_number():
    assert size_text(None) == "n/a" and size_text(float("nan")) == "n/a"
