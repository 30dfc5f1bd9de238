"""Sizes as every panel and command prints them: binary units, the sign of a change said in words."""

from __future__ import annotations

import pytest

from loomlab.core.units import format_bytes, format_count, format_size_change

MIB = 2 ** 20


@pytest.mark.parametrize(("n", "text"), [
    (0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (1536, "1.5 KiB"), (int(3.3 * MIB), "3.3 MiB"),
    (108 * MIB, "108.0 MiB"), (5 * 2 ** 30, "5.0 GiB"), (-2 * MIB, "-2.0 MiB"),
])
def test_bytes_are_in_binary_units(n, text):
    assert format_bytes(n) == text


def test_a_smaller_model_saved_and_a_larger_one_grew():
    before = 100 * MIB
    assert format_size_change(before, before - int(3.3 * MIB)) == "saved 3.3 MiB (-3.3%)"
    assert format_size_change(before, before + int(3.3 * MIB)) == "grew by 3.3 MiB (+3.3%)"
    assert format_size_change(before, before) == "unchanged"
    assert format_size_change(0, 10) == "grew by 10 B"  # no share of nothing


def test_counts_take_a_plural():
    assert (format_count(1, "cell"), format_count(0, "layer"), format_count(1024, "block")) == \
        ("1 cell", "0 layers", "1,024 blocks")
