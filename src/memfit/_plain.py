"""Plain JSON data: the one ``to_dict`` body memfit's records share, and one deep merge.

>>> from dataclasses import dataclass
>>> @dataclass(frozen=True)
... class Point:
...     step: int
...     tags: tuple[str, ...] = ()
>>> plain_fields(Point(3, ("a",)), tags=["a"])
{'step': 3, 'tags': ['a']}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


def plain_fields(record: DataclassInstance, /, **values: Any) -> dict[str, Any]:
    """A dataclass's fields in declaration order, as a dict.

    Args:
        record: The dataclass instance.
        **values: Values that replace a field's own (a list for a tuple, a copy of a dict) in
            its place, or keys added after the fields.
    """
    data = {f.name: getattr(record, f.name) for f in fields(record)}
    data.update(values)
    return data


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``over`` laid on top: mappings merge key by key, anything else replaces.

    >>> deep_merge({"ppo": {"lr": 1, "envs": 8}, "seed": 0}, {"ppo": {"envs": 16}})
    {'ppo': {'lr': 1, 'envs': 16}, 'seed': 0}
    """
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def plural(count: int, word: str, many: str | None = None) -> str:
    """``"1 micro-batch"``, ``"2 micro-batches"``: a count with its noun agreeing.

    >>> plural(1, "micro-batch"), plural(2, "micro-batch"), plural(3, "item")
    ('1 micro-batch', '2 micro-batches', '3 items')
    """
    if count == 1:
        return f"{count} {word}"
    if many is None:
        many = word + ("es" if word.endswith(("ch", "sh", "s", "x")) else "s")
    return f"{count} {many}"
