"""Bytes <-> text: the only place that formats sizes for humans.

Convention (the one the hardware vendors and ``nvidia-smi`` use):

* ``B``, ``KB``, ``MB``, ``GB``, ``TB`` are **decimal**: ``"8GB"`` is ``8 * 10**9`` bytes, as
  on a box or a spec sheet.
* ``KiB``, ``MiB``, ``GiB``, ``TiB`` are **binary**: ``"8GiB"`` is ``8 * 2**30`` bytes, as
  ``nvidia-smi`` (``MiB``) and the CUDA allocator count.
* A single letter ``K``, ``M``, ``G``, ``T`` is binary too (as ``docker --memory=8g`` and
  ``ulimit`` read it).
* A plain integer is a count of bytes. Suffixes are case-insensitive; a space between the
  number and the suffix is allowed; decimals are allowed (``"1.5 GiB"``) and rounded to whole
  bytes.

Inside memfit every size is an ``int`` of bytes; text appears only at the edges.

>>> parse_bytes("8GB"), parse_bytes("8 GiB"), parse_bytes("8192MiB") == parse_bytes("8GiB")
(8000000000, 8589934592, True)
>>> format_bytes(8 * 2**30)
'8.00 GiB'
>>> format_mib(8 * 2**30)
'8192MiB'
"""

from __future__ import annotations

import math
import re

from memfit._checks import require
from memfit.errors import ConfigError

__all__ = [
    "MAX_BYTES",
    "GiB",
    "KiB",
    "MiB",
    "format_bytes",
    "format_mib",
    "parse_bytes",
    "parse_fraction",
    "require_size",
]

KiB = 1024
MiB = 1024**2
GiB = 1024**3

#: The largest size memfit accepts: 16 EiB (2**64 bytes), far above any memory there is.
#: A larger size is a typo (``1e308GB``), and refusing it keeps every sum and ratio finite.
MAX_BYTES = 2**64

_MULTIPLIERS: dict[str, int] = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "k": 2**10,
    "m": 2**20,
    "g": 2**30,
    "t": 2**40,
}

_SIZE_RE = re.compile(
    r"^\s*([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*([A-Za-z]*)\s*$", re.ASCII
)

_HINT = "write a size like 8GB (decimal), 8GiB or 8192MiB (binary), or a plain number of bytes"


def parse_bytes(text: str | int) -> int:
    """Parse a size such as ``"8GB"``, ``"8 GiB"``, ``"8192MiB"`` or ``"1024"`` into bytes.

    Args:
        text: The size. An ``int`` is taken as bytes as it is.

    Returns:
        The size in bytes.

    Raises:
        ConfigError: When the text is empty, negative, not a number, NaN or infinite, or has a
            suffix memfit does not know; the message names the text.

    >>> parse_bytes("1.5 GiB")
    1610612736
    >>> parse_bytes(512)
    512
    """
    require("text", text, "str", "any_int")  # parse_bytes bounds it (16 EiB)
    if isinstance(text, bool):
        raise ConfigError(f"not a size: {text!r}", hint=_HINT)
    if isinstance(text, int):
        if text < 0:
            raise ConfigError(f"a size cannot be negative: {text!r}", hint=_HINT)
        return _bounded(text, text)
    if not isinstance(text, str):
        raise ConfigError(f"not a size: {text!r}", hint=_HINT)
    if not text.strip():
        raise ConfigError("empty size text ''", hint=_HINT)
    match = _SIZE_RE.match(text)
    if match is None:
        raise ConfigError(f"not a size: {text!r}", hint=_HINT)
    number_text, suffix = match.groups()
    multiplier = _MULTIPLIERS.get(suffix.lower())
    if multiplier is None:
        raise ConfigError(f"unknown size suffix {suffix!r} in {text!r}", hint=_HINT)
    value = float(number_text)
    if math.isnan(value):
        raise ConfigError(f"not a finite size: {_shown(text)}", hint=_HINT)
    if value < 0:
        raise ConfigError(f"a size cannot be negative: {_shown(text)}", hint=_HINT)
    if value * multiplier > MAX_BYTES:  # also catches a number too long to be an int
        return _bounded(MAX_BYTES + 1, text)
    if "." not in number_text and "e" not in number_text.lower():
        return _bounded(int(number_text) * multiplier, text)
    return _bounded(round(value * multiplier), text)


def _shown(text: str | int) -> str:
    """``repr(text)``, shortened in the middle when long (a pasted 5,000-digit number)."""
    shown = repr(text)
    return shown if len(shown) <= 40 else f"{shown[:18]}...{shown[-18:]}"


def _bounded(nbytes: int, text: str | int) -> int:
    """``nbytes`` when it is at most :data:`MAX_BYTES`.

    Raises:
        ConfigError: When it is larger.
    """
    if nbytes > MAX_BYTES:
        raise ConfigError(
            f"size {_shown(text)} is larger than memfit accepts (16 EiB, 2**64 bytes)",
            hint="check the number and the unit: " + _HINT,
        )
    return nbytes


def format_bytes(n: int | float, *, precision: int = 2) -> str:
    """Format a byte count for humans in binary units (``"7.79 GiB"``, ``"512 B"``).

    Negative values (a shrinking term, a negative growth rate) keep their sign.

    >>> format_bytes(0), format_bytes(1536), format_bytes(-3 * 2**20)
    ('0 B', '1.50 KiB', '-3.00 MiB')
    """
    require("n", n, "real")
    require("precision", precision, "int")
    if not 0 <= precision <= 12:
        raise ConfigError(
            f"precision must be from 0 to 12 digits after the point, not {precision}",
            key_path="precision",
            hint="format_bytes(n, precision=2) gives '7.79 GiB'",
        )
    if isinstance(n, float) and (math.isnan(n) or math.isinf(n)):
        return str(n)
    sign = "-" if n < 0 else ""
    value = abs(n)
    if value < KiB:
        return f"{sign}{int(value)} B"
    if value > 2**70:  # beyond any memory: no float division that could overflow
        return f"{sign}more than 2**70 B"
    for unit, size in (("TiB", 2**40), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if value >= size:
            return f"{sign}{value / size:.{precision}f} {unit}"
    raise AssertionError("unreachable")  # pragma: no cover


def format_mib(n: int | float) -> str:
    """Format bytes as whole MiB, the way ``nvidia-smi`` shows memory (``"8192MiB"``).

    >>> format_mib(2**30)
    '1024MiB'
    """
    if isinstance(n, int):
        from fractions import Fraction  # here, not at the top: `memfit --help` does not need it

        return f"{round(Fraction(n, MiB))}MiB"  # exact for any size, no float on the way
    return f"{round(n / MiB)}MiB"


def parse_fraction(text: str | float, *, key_path: str | None = None) -> float:
    """Parse a fraction such as ``"10%"``, ``"0.1"`` or ``0.1`` into a float in ``[0, 1)``.

    Args:
        text: The fraction: a percentage (``"10%"``) or a number (``0.1``).
        key_path: Where it comes from (``"--margin"``), for the error.

    Raises:
        ConfigError: When it is not a number, NaN, negative or at least 100%.

    >>> parse_fraction("10%"), parse_fraction(0.05)
    (0.1, 0.05)
    """
    hint = "write a fraction like 10% or 0.1"
    if isinstance(text, bool):
        raise ConfigError(f"not a fraction: {text!r}", key_path=key_path, hint=hint)
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        raw = text.strip()
        try:
            value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
        except ValueError:
            raise ConfigError(f"not a fraction: {text!r}", key_path=key_path, hint=hint) from None
        if 1 <= value < 100 and not raw.endswith("%"):
            hint = f"did you mean {raw}%? A number without % is a fraction: 0.1 is 10%"
    if math.isnan(value) or value < 0 or value >= 1:
        raise ConfigError(
            f"fraction out of range [0, 100%): {text!r}", key_path=key_path, hint=hint
        )
    return value


def require_size(name: str, value: object, *, optional: bool = False) -> int | None:
    """A size argument as bytes: an ``int`` or a text size (``"16GiB"``), as
    :func:`parse_bytes` reads it, or ``None`` when ``optional``.

    Raises:
        ConfigError: When it is neither, or not a size; ``name`` is the key path.

    >>> require_size("host_memory_bytes", "16GiB")
    17179869184
    """
    if value is None and optional:
        return None
    require(name, value, "size", optional=optional)
    try:
        return parse_bytes(value)  # type: ignore[arg-type]
    except ConfigError as exc:
        raise ConfigError(exc.message, key_path=name, hint=exc.hint) from None
