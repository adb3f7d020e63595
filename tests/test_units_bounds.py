"""Sizes beyond any memory are refused, and huge numbers still format (issue 15)."""

from __future__ import annotations

import pytest

from memfit.errors import ConfigError
from memfit.units import MAX_BYTES, MiB, format_bytes, format_mib, parse_bytes


@pytest.mark.parametrize(
    "text", ["1e308GB", "17179869185GiB", "1e400", "1" + "0" * 5000, 2**64 + 1]
)
def test_sizes_beyond_16_eib_are_refused(text: str | int) -> None:
    with pytest.raises(ConfigError, match="larger than memfit accepts") as info:
        parse_bytes(text)
    assert len(info.value.message) < 150  # a pasted 5,000-digit number is shortened


def test_the_largest_size_is_accepted() -> None:
    assert parse_bytes(MAX_BYTES) == MAX_BYTES == parse_bytes("16777216TiB")


def test_huge_counts_format_without_overflow() -> None:
    assert format_bytes(10**400) == "more than 2**70 B"
    assert format_bytes(-(10**400)) == "-more than 2**70 B"
    assert format_bytes(2**64) == "16777216.00 TiB"
    assert format_mib(10**400).endswith("MiB")  # exact, no float on the way
    assert format_mib(3 * MiB + MiB // 2) == "4MiB" and format_mib(5 * MiB // 2) == "2MiB"
