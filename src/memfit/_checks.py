"""The one place where memfit's public functions check the types of their arguments.

Every public entry point calls :func:`require` (or the helpers below) on its arguments before
it does any work, so that a value of the wrong type is a :class:`~memfit.errors.ConfigError`
naming the argument, never a ``TypeError`` deep inside, or a failure at the first training
step. Ranges and meanings stay with each function (they know what a value means); this module
only answers "is this the kind of value the argument takes".
"""

from __future__ import annotations

import math
import operator
import os
import re
import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from memfit.errors import ConfigError

__all__ = [
    "INT_LIMIT",
    "MAX_INT_DIGITS",
    "check_int_size",
    "parse_int",
    "require",
    "require_byte_sizes",
    "require_bytes",
    "require_callable",
    "require_choice",
    "require_count",
    "require_instance",
    "require_int_list",
    "require_items",
    "require_iterable",
    "require_list",
    "require_mapping",
    "require_number_in",
    "require_object",
    "require_positive_int",
    "require_str_list",
    "too_large_int",
    "too_many_digits",
]


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _whole(v: object) -> object:
    """A numpy integer (anything with ``__index__`` but a bool) as the ``int`` it is."""
    if isinstance(v, (int, bool)) or not hasattr(type(v), "__index__"):
        return v
    return operator.index(v)  # type: ignore[arg-type]


def _is_number(v: object) -> bool:
    return (
        isinstance(v, (int, float))
        and not isinstance(v, bool)
        and (not isinstance(v, float) or math.isfinite(v))
    )


def _is_path(v: object) -> bool:
    return isinstance(v, (str, os.PathLike))


#: What each kind accepts, and how it is said in an error message.
KINDS: dict[str, tuple[Callable[[object], bool], str]] = {
    "int": (_is_int, "an integer"),  # of magnitude under 2**63 (no count or size is larger)
    "any_int": (_is_int, "an integer"),  # of any size (a random seed)
    "number": (_is_number, "a finite number"),
    "real": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a number"),
    "bool": (lambda v: isinstance(v, bool), "True or False"),
    "str": (lambda v: isinstance(v, str), "a string"),
    "path": (_is_path, "a path (str or os.PathLike)"),
    "size": (lambda v: _is_int(v) or isinstance(v, str), "a size (bytes as an int, or '8GiB')"),
    "callable": (callable, "callable"),
    "mapping": (lambda v: isinstance(v, Mapping), "a mapping (dict)"),
    "exception": (lambda v: isinstance(v, BaseException), "an exception"),
}


#: The largest size in bytes memfit reads (``memfit.units.MAX_BYTES``: 16 EiB).
SIZE_LIMIT = 2**64

#: Kinds whose ``int`` values are counts, sizes or amounts: each under 2**63 in magnitude.
_SIZED = frozenset({"int", "number"})


def require(
    name: str,
    value: object,
    *kinds: str,
    optional: bool = False,
    hint: str | None = None,
) -> None:
    """Check that ``value`` is of one of ``kinds`` (keys of :data:`KINDS`), or ``None`` when
    ``optional``. An ``int`` taken as a count, size or number is under 2**63 in magnitude
    (:func:`check_int_size`): no count or size memfit reads is larger, and a larger one
    would overflow a C size where it is used.

    Raises:
        ConfigError: Otherwise, with ``name`` as the key path.

    >>> require("margin", 0.05, "number", "str")
    >>> require("device", "0", "int")
    Traceback (most recent call last):
    ...
    memfit.errors.ConfigError: device: device must be an integer, not str ('0')
    """
    if value is None and optional:
        return
    for kind in kinds:
        if KINDS[kind][0](value):
            if kind in _SIZED and isinstance(value, int):
                check_int_size(name, value, hint=hint)  # no count or size is 2**63 or more
            elif kind == "size" and isinstance(value, int) and not 0 <= value <= SIZE_LIMIT:
                digits = value.bit_length() * 30103 // 100000 + 1
                shown = str(value) if digits <= 30 else f"a number of about {digits} digits"
                raise ConfigError(
                    f"{name} must be a size from 0 to 16 EiB (2**64 bytes), not {shown}",
                    key_path=name,
                    hint=hint or "give the size in bytes, or as text such as '8GiB'",
                )
            return
    what = " or ".join(KINDS[k][1] for k in kinds)
    if optional:
        what += " or None"
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    raise ConfigError(
        f"{name} must be {what}, not {type(value).__name__} ({shown})", key_path=name, hint=hint
    )


def require_choice(name: str, value: object, choices: Iterable[object]) -> None:
    """Check that ``value`` is one of ``choices`` (compared with ``==``, bools apart).

    Raises:
        ConfigError: Otherwise, with ``name`` as the key path.
    """
    options = list(choices)
    if not any(type(value) is type(c) and value == c for c in options):
        raise ConfigError(
            f"{name} must be one of {', '.join(map(repr, options))}, not {value!r}",
            key_path=name,
        )


def require_mapping(
    name: str,
    value: object,
    *,
    values: str | None = None,
    optional: bool = False,
    hint: str | None = None,
) -> None:
    """Check that ``value`` is a mapping with string keys (and values of kind ``values``).

    Raises:
        ConfigError: Otherwise, with ``name`` (or ``name.key``) as the key path.
    """
    if value is None and optional:
        return
    if hint is None and values == "int":
        hint = "pass a dict such as {'batch_size': 64}"
    require(name, value, "mapping", optional=optional, hint=hint)
    assert isinstance(value, Mapping)
    for key, item in value.items():
        if not isinstance(key, str):
            raise ConfigError(
                f"{name} must have string keys, not {type(key).__name__} ({key!r})",
                key_path=name,
            )
        if values is not None:
            require(f"{name}.{key}", item, values)


def require_int_list(name: str, value: object, *, optional: bool = False) -> list[int]:
    """Check that ``value`` is an iterable of integers (not a string); return it as a list.

    Raises:
        ConfigError: Otherwise, with ``name`` as the key path.
    """
    if value is None and optional:
        return []
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ConfigError(
            f"{name} must be a list of integers, not {type(value).__name__} ({value!r:.60})",
            key_path=name,
        )
    items: list[Any] = list(value)
    for item in items:
        if not _is_int(item):
            raise ConfigError(
                f"{name} must be a list of integers; {item!r:.40} is a {type(item).__name__}",
                key_path=name,
            )
    return items


def require_str_list(name: str, value: object) -> list[str]:
    """Check that ``value`` is an iterable of strings (not one string); return it as a list.

    Raises:
        ConfigError: Otherwise, with ``name`` as the key path.
    """
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ConfigError(
            f"{name} must be a list of strings, not {type(value).__name__} ({value!r:.60})",
            key_path=name,
        )
    items: list[Any] = list(value)
    for item in items:
        if not isinstance(item, str):
            raise ConfigError(
                f"{name} must be a list of strings; {item!r:.40} is a {type(item).__name__}",
                key_path=name,
            )
    return items


def require_iterable(name: str, value: object) -> list[Any]:
    """Check that ``value`` is an iterable (not a string); return its items as a list.

    Raises:
        ConfigError: Otherwise, with ``name`` as the key path.
    """
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ConfigError(
            f"{name} must be a list (or another iterable), not {type(value).__name__}",
            key_path=name,
        )
    return list(value)


def require_list(
    name: str,
    value: object,
    *,
    what: str,
    exclude: tuple[type, ...] = (),
    sequence: bool = False,
    nonempty: bool = False,
    key_path: str | None = None,
    hint: str | None = None,
) -> list[Any]:
    """Check that ``value`` is a list (an iterable; with ``sequence``, a sequence) that is
    not a string nor one of ``exclude`` (one item where a list of them is wanted), and with
    ``nonempty`` that it holds something; return its items. ``what`` says what the list
    holds (``"a list of settings"``).

    Raises:
        ConfigError: Otherwise, with ``key_path`` (default ``name``) as the key path.

    >>> require_list("points", ({"num_envs": 16},), what="a list of settings")
    [{'num_envs': 16}]
    >>> require_list("points", "16", what="a list of settings")
    Traceback (most recent call last):
    ...
    memfit.errors.ConfigError: points: points must be a list of settings, not str ('16')
    """
    kind = Sequence if sequence else Iterable
    if isinstance(value, (str, bytes, *exclude)) or not isinstance(value, kind):
        shown = f" ({value!r:.60})" if isinstance(value, (str, bytes)) else ""
        raise ConfigError(
            f"{name} must be {what}, not {type(value).__name__}{shown}",
            key_path=key_path or name,
            hint=hint,
        )
    items = list(value)
    if nonempty and not items:
        raise ConfigError(
            f"{name} must be {what}, not an empty {type(value).__name__}",
            key_path=key_path or name,
            hint=hint,
        )
    return items


def require_object(
    name: str,
    value: object,
    *,
    methods: tuple[str, ...] = (),
    attributes: tuple[str, ...] = (),
    what: str,
    hint: str | None = None,
    optional: bool = False,
    wrapped: bool = False,
) -> None:
    """Check that ``value`` is the kind of object a function needs (an Optuna trial, an
    skrl agent, an environment), by what it has: callable ``methods`` and ``attributes``;
    with ``wrapped``, also that it takes attributes of its own (memfit puts wrappers of its
    methods on the instance: an object whose class has ``__slots__`` cannot hold them).

    Raises:
        ConfigError: Otherwise, with ``name`` as the key path, saying what it lacks.
    """
    if value is None and optional:
        return
    lacks = [m for m in methods if not callable(getattr(value, m, None))]
    lacks += [a for a in attributes if not hasattr(value, a)]
    if lacks:
        raise ConfigError(
            f"{name} must be {what}, not {type(value).__name__} (it has no {', '.join(lacks)})",
            key_path=name,
            hint=hint,
        )
    if wrapped and not isinstance(getattr(value, "__dict__", None), dict):
        raise ConfigError(
            f"{name} must be {what} that takes attributes of its own; this "
            f"{type(value).__name__} has none (its class sets __slots__), so memfit cannot "
            f"wrap its {', '.join(methods)}",
            key_path=name,
            hint=hint,
        )


def require_items(name: str, value: object, *kinds: str, what: str | None = None) -> list[Any]:
    """Check that ``value`` is a list (or another iterable, not a string) whose items are of
    one of ``kinds``; return the items.

    Raises:
        ConfigError: Naming the argument (``name``) or the item (``name[i]``).
    """
    items = require_iterable(name, value)
    for i, item in enumerate(items):
        require(f"{name}[{i}]", item, *kinds, hint=what)
    return items


def _bytes_problem(value: object, lo: int) -> str | None:
    """What keeps ``value`` from being a whole number of bytes of at least ``lo`` (and under
    :data:`INT_LIMIT`), or ``None``."""
    if not _is_int(value):
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        kind = type(value).__name__
        return f"a whole number of bytes (an int of at least {lo}), not {kind} ({shown})"
    assert isinstance(value, int)
    if not -INT_LIMIT < value < INT_LIMIT:
        digits = value.bit_length() * 30103 // 100000 + 1
        return f"a number of bytes under 2**63, not a number of about {digits} digits"
    if value < lo:
        return f"a whole number of bytes of at least {lo}, not {value}"
    return None


def require_bytes(name: str, value: object, *, lo: int = 0, hint: str | None = None) -> int:
    """Return ``value`` when it is a whole number of bytes (an ``int``, not a ``bool``) of at
    least ``lo`` and under :data:`INT_LIMIT`: a size that can be real. A float (``1.5``,
    ``nan``), a negative size or one of 2**63 bytes or more is never rounded, clipped or
    dropped: it is refused.

    Raises:
        ConfigError: Otherwise, with ``name`` as the key path.

    >>> require_bytes("temp_bytes", 4096)
    4096
    >>> require_bytes("temp_bytes", -1)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    memfit.errors.ConfigError: temp_bytes: ... of at least 0, not -1
    """
    value = _whole(value)
    problem = _bytes_problem(value, lo)
    if problem is not None:
        raise ConfigError(f"{name} must be {problem}", key_path=name, hint=hint)
    assert isinstance(value, int)
    return value


def require_byte_sizes(name: str, value: object, *, hint: str | None = None) -> list[int]:
    """Check that ``value`` is a list (or a tuple, or another iterable that is not a string or
    a mapping) of sizes in bytes (:func:`require_bytes`); return them.

    Raises:
        ConfigError: Otherwise, with ``name`` as the key path (the message names the item).
    """
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise ConfigError(
            f"{name} must list sizes in bytes, not {type(value).__name__} ({value!r:.60})",
            key_path=name,
            hint=hint,
        )
    items: list[Any] = [_whole(item) for item in value]
    for i, item in enumerate(items):
        problem = _bytes_problem(item, 0)
        if problem is not None:
            raise ConfigError(f"{name}[{i}] must be {problem}", key_path=name, hint=hint)
    return items


def require_count(
    name: str,
    value: object,
    *,
    lo: int = 0,
    what: str = "a whole number",
    key_path: str | None = None,
    hint: str | None = None,
    optional: bool = False,
) -> int:
    """Return ``value`` when it is an ``int`` (not a ``bool``) of at least ``lo`` and under
    2**63: a count that can be real (steps, retries, events, splits); with ``optional``,
    ``None`` passes too (and is returned as ``lo``: callers test for ``None`` first).

    Raises:
        ConfigError: Otherwise, with ``key_path`` (default ``name``) as the key path.

    >>> require_count("history", 0)
    0
    >>> require_count("every", 10**40, lo=1)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    memfit.errors.ConfigError: every: every is a number of about 41 digits; ...
    """
    where = key_path or name
    if value is None and optional:
        return lo
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        what = f"{what} >= {lo}" + (" or None" if optional else "")
        raise ConfigError(f"{name} must be {what}, not {shown}", key_path=where, hint=hint)
    if not -INT_LIMIT < value < INT_LIMIT:
        check_int_size(where, value, hint=hint)
    return value


def require_instance(
    name: str,
    value: object,
    cls: type | tuple[type, ...],
    *,
    what: str,
    optional: bool = False,
    key_path: str | None = None,
    hint: str | None = None,
) -> None:
    """Check that ``value`` is an instance of ``cls`` (a class, or a tuple of classes), said
    to the user as ``what`` (``"a memfit Plan (what memfit.plan returns)"``); ``None`` passes
    when ``optional``. For the objects memfit itself makes (a plan, a workload, a step):
    what an object from elsewhere must have is :func:`require_object`'s check.

    Raises:
        ConfigError: Otherwise, with ``key_path`` (default ``name``) as the key path.

    >>> require_instance("plan", 3, str, what="a memfit Plan")
    Traceback (most recent call last):
    ...
    memfit.errors.ConfigError: plan: plan must be a memfit Plan, not int
    """
    if (value is None and optional) or isinstance(value, cls):
        return
    what = what + (" or None" if optional else "")
    raise ConfigError(
        f"{name} must be {what}, not {type(value).__name__}", key_path=key_path or name, hint=hint
    )


def require_number_in(
    name: str,
    value: object,
    *,
    low: float,
    high: float,
    low_open: bool = False,
    what: str,
    key_path: str | None = None,
    hint: str | None = None,
) -> float:
    """Return ``value`` when it is a finite number (an ``int`` or a ``float``, not a
    ``bool``) from ``low`` (excluded when ``low_open``) to ``high``: a fraction, a
    probability, a share. ``what`` says the range to the user (``"a probability in [0, 1]"``).

    Raises:
        ConfigError: Otherwise, with ``key_path`` (default ``name``) as the key path.

    >>> require_number_in("share", 0.5, low=0, high=1, low_open=True, what="a fraction in (0, 1]")
    0.5
    >>> require_number_in("rate", 2, low=0, high=1, what="a probability in [0, 1]")
    Traceback (most recent call last):
    ...
    memfit.errors.ConfigError: rate: rate must be a probability in [0, 1], not 2
    """
    ok = _is_number(value)
    if ok:
        assert isinstance(value, (int, float))
        ok = (low < value if low_open else low <= value) and value <= high
    if not ok:
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise ConfigError(
            f"{name} must be {what}, not {shown}", key_path=key_path or name, hint=hint
        )
    assert isinstance(value, (int, float))
    return value


def require_positive_int(name: str, value: object, *, hint: str | None = None) -> int:
    """Return ``value`` when it is an ``int`` of at least 1 (not a ``bool``).

    Raises:
        ConfigError: Otherwise, with ``name`` as the key path.

    >>> require_positive_int("max_splits", 64)
    64
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise ConfigError(
            f"{name} must be a positive integer, not {shown}", key_path=name, hint=hint
        )
    return check_int_size(name, value, hint=hint)


def require_callable(
    name: str, value: object, *, hint: str | None = None, optional: bool = False
) -> None:
    """Check that ``value`` can be called (or is ``None`` when ``optional``).

    Raises:
        ConfigError: Otherwise, with ``name`` as the key path.

    >>> require_callable("on_event", None, optional=True)
    >>> require_callable("loss_fn", 3)
    Traceback (most recent call last):
    ...
    memfit.errors.ConfigError: loss_fn: loss_fn must be callable, not int
    """
    if not callable(value) and not (optional and value is None):
        raise ConfigError(
            f"{name} must be callable, not {type(value).__name__}", key_path=name, hint=hint
        )


#: Most digits an integer from a user may have (``2**63`` has 19): longer text is refused
#: before it is converted (Python refuses past 4,300 digits, with an error of its own).
MAX_INT_DIGITS = 30

#: No count or size memfit reads is this large or larger (in magnitude): ``2**63``.
INT_LIMIT = 2**63


def too_large_int(value: object) -> int | None:
    """The digits of the first integer in ``value`` (an int, or a list or a mapping's values)
    that is 2**63 or more in magnitude, or ``None``: the check every schema model of a
    workload (its simulator section included) runs on each field."""
    items = value if isinstance(value, list) else (
        list(value.values()) if isinstance(value, dict) else [value]
    )  # fmt: skip
    for item in items:
        if (
            isinstance(item, int)
            and not isinstance(item, bool)
            and not -INT_LIMIT < item < INT_LIMIT
        ):
            return item.bit_length() * 30103 // 100000 + 1
    return None


def too_many_digits(digits: int) -> str:
    """What is wrong with an integer of ``digits`` digits (more than
    :data:`MAX_INT_DIGITS`), said once for every reader: the bound a user meets is 2**63
    (19 digits), whatever length the parser refuses to convert."""
    return (
        f"a number of {digits} digits; no count or size memfit reads is 2**63 or more (19 digits)"
    )


_INT_TEXT = re.compile(r"[+-]?[0-9]+(?:_[0-9]+)*", re.ASCII)


def _digit_count(text: str) -> int:
    return sum(1 for c in text if c.isdigit())


def check_int_size(name: str, value: int, *, hint: str | None = None) -> int:
    """Return ``value`` when its magnitude is under :data:`INT_LIMIT`.

    Raises:
        ConfigError: Otherwise, naming ``name`` (the value is not printed whole: a number
            of thousands of digits cannot be).
    """
    if -INT_LIMIT < value < INT_LIMIT:
        return value
    digits = value.bit_length() * 30103 // 100000 + 1  # log10(2) * bits, without str()
    raise ConfigError(
        f"{name} is a number of about {digits} digits; no count or size memfit reads is "
        "2**63 or more",
        key_path=name,
        hint=hint or "give the count or size itself (at most 19 digits)",
    )


def parse_int(
    name: str,
    text: str | int,
    *,
    lo: int | None = None,
    hi: int | None = None,
    hint: str | None = None,
) -> int:
    """The one parser of integers a user typed: ASCII digits (``_`` between digits allowed,
    as Python writes them), an optional sign, at most :data:`MAX_INT_DIGITS` digits, within
    ``lo`` and ``hi`` when given. An ``int`` is checked the same way.

    ``"²".isdigit()`` is true and ``int("²")`` fails; ``int("٣")`` is 3: neither is an
    integer here. A number of thousands of digits is refused before it is converted.

    Raises:
        ConfigError: When the text is not such an integer, or out of range; ``name`` is the
            key path.

    >>> parse_int("--at", " 1_024 ")
    1024
    >>> parse_int("n", "\u00b2")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    memfit.errors.ConfigError: n: '²' (SUPERSCRIPT TWO) is not a whole number ...
    """
    if isinstance(text, bool) or not isinstance(text, (str, int)):
        require(name, text, "int", "str")
    if isinstance(text, int):
        value = check_int_size(name, text, hint=hint)
    else:
        stripped = text.strip()
        if len(stripped) > 2 * MAX_INT_DIGITS or _digit_count(stripped) > MAX_INT_DIGITS:
            raise ConfigError(
                f"{name} is {too_many_digits(_digit_count(stripped))}",
                key_path=name,
                hint=hint or "give the count or size itself (at most 19 digits)",
            )
        if not _INT_TEXT.fullmatch(stripped):
            odd = next(
                (c for c in stripped if not (c in "+-_" or ("0" <= c <= "9"))),
                None,
            )
            what = repr(stripped[:40])
            if odd is not None and not odd.isascii():
                what += f" ({unicodedata.name(odd, f'U+{ord(odd):04X}')})"
            raise ConfigError(
                f"{what} is not a whole number written in the digits 0-9",
                key_path=name,
                hint=hint,
            )
        value = check_int_size(name, int(stripped), hint=hint)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        bounds = (
            f"from {lo} to {hi}"
            if lo is not None and hi is not None
            else (f"at least {lo}" if lo is not None else f"at most {hi}")
        )
        raise ConfigError(f"{name} must be {bounds}, not {value}", key_path=name, hint=hint)
    return value
