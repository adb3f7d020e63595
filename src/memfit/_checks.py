"""The one place where memfit's public functions check the types of their arguments.

Every public entry point calls :func:`require` (or the helpers below) on its arguments before
it does any work, so that a value of the wrong type is a :class:`~memfit.errors.ConfigError`
naming the argument, never a ``TypeError`` deep inside, or a failure at the first training
step. Ranges and meanings stay with each function (they know what a value means); this module
only answers "is this the kind of value the argument takes".
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from memfit.errors import ConfigError

__all__ = [
    "require",
    "require_callable",
    "require_choice",
    "require_int_list",
    "require_iterable",
    "require_mapping",
    "require_positive_int",
    "require_str_list",
]


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


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
    "int": (_is_int, "an integer"),
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


def require(
    name: str,
    value: object,
    *kinds: str,
    optional: bool = False,
    hint: str | None = None,
) -> None:
    """Check that ``value`` is of one of ``kinds`` (keys of :data:`KINDS`), or ``None`` when
    ``optional``.

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
    name: str, value: object, *, values: str | None = None, optional: bool = False
) -> None:
    """Check that ``value`` is a mapping with string keys (and values of kind ``values``).

    Raises:
        ConfigError: Otherwise, with ``name`` (or ``name.key``) as the key path.
    """
    if value is None and optional:
        return
    hint = "pass a dict such as {'batch_size': 64}" if values == "int" else None
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


def require_positive_int(name: str, value: object, *, hint: str | None = None) -> int:
    """Return ``value`` when it is an ``int`` of at least 1 (not a ``bool``).

    Raises:
        ConfigError: Otherwise, with ``name`` as the key path.

    >>> require_positive_int("max_splits", 64)
    64
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(
            f"{name} must be a positive integer, not {value!r}", key_path=name, hint=hint
        )
    return value


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
