"""Units: bytes <-> text (memfit.units)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memfit import ConfigError, MemfitError
from memfit.units import GiB, KiB, MiB, format_bytes, format_mib, parse_bytes, parse_fraction


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8GB", 8 * 10**9),
        ("8 GB", 8 * 10**9),
        ("8gb", 8 * 10**9),
        ("8GiB", 8 * GiB),
        ("8 GiB", 8 * GiB),
        ("8192MiB", 8 * GiB),
        ("1.5 GiB", 3 * GiB // 2),
        ("512", 512),
        ("512B", 512),
        ("4k", 4 * KiB),
        ("2M", 2 * MiB),
        ("24g", 24 * GiB),
        ("1TB", 10**12),
        ("  16 MiB  ", 16 * MiB),
        (".5GiB", GiB // 2),
        ("1e3", 1000),
        (1234, 1234),
        (0, 0),
    ],
)
def test_parse_bytes_examples(text: str | int, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize(
    "text",
    ["", "   ", "-5GB", "-1", "nan", "NaN GiB", "inf", "12XB", "abc", "1e400", "8 G B", "GiB"],
)
def test_parse_bytes_rejects_bad_text_naming_it(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_bytes(text)
    assert isinstance(info.value, MemfitError)
    assert info.value.hint
    if text.strip():
        assert text.strip() in info.value.message or repr(text) in info.value.message


@pytest.mark.parametrize("value", [-1, True, 1.5, None])
def test_parse_bytes_rejects_non_sizes(value: object) -> None:
    with pytest.raises(ConfigError):
        parse_bytes(value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.00 KiB"),
        (1536, "1.50 KiB"),
        (8 * GiB, "8.00 GiB"),
        (-3 * MiB, "-3.00 MiB"),
        (2**40, "1.00 TiB"),
    ],
)
def test_format_bytes_examples(n: int, text: str) -> None:
    assert format_bytes(n) == text


def test_format_mib_matches_nvidia_smi_style() -> None:
    assert format_mib(24564 * MiB) == "24564MiB"
    assert format_mib(GiB) == "1024MiB"


@given(st.integers(min_value=0, max_value=2**52))
def test_format_then_parse_round_trips_within_rounding(n: int) -> None:
    text = format_bytes(n)
    back = parse_bytes(text.replace(" ", ""))
    unit = next((u for u in (2**40, GiB, MiB, KiB) if n >= u), 1)
    # two decimals: at most half of 0.01 of the unit off (plus float slack)
    assert abs(back - n) <= 0.005 * unit + 1


@given(st.integers(min_value=0, max_value=2**50))
def test_format_mib_then_parse_round_trips_within_half_a_mib(n: int) -> None:
    assert abs(parse_bytes(format_mib(n)) - n) <= MiB // 2


@given(st.integers(min_value=0, max_value=2**50))
def test_parse_of_plain_integer_text_is_exact(n: int) -> None:
    assert parse_bytes(str(n)) == n


@pytest.mark.parametrize(
    ("text", "value"), [("10%", 0.1), ("0.25", 0.25), (0.05, 0.05), ("0", 0.0)]
)
def test_parse_fraction(text: str | float, value: float) -> None:
    assert parse_fraction(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["100%", "1", "-0.1", "nan", "abc", "5%%"])
def test_parse_fraction_rejects(text: str) -> None:
    with pytest.raises(ConfigError, match="fraction"):
        parse_fraction(text)
