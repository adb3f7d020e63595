"""Dataclass records as plain JSON data: the one ``to_dict`` body memfit's records share.

>>> from dataclasses import dataclass
>>> @dataclass(frozen=True)
... class Point:
...     step: int
...     tags: tuple[str, ...] = ()
>>> plain_fields(Point(3, ("a",)), tags=["a"])
{'step': 3, 'tags': ['a']}
"""

from __future__ import annotations

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
