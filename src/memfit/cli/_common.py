"""What every CLI command shares: consoles, JSON output, errors.

Rules (DESIGN.md): with ``--json`` a command prints exactly one JSON document on stdout and
nothing else there; human output goes through Rich; problems are raised as
:class:`memfit.MemfitError` and printed by :func:`memfit.cli.main.main` as ``Error:`` /
``Hint:`` on stderr with exit status 1.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

__all__ = [
    "JSON_OPTION",
    "err_console",
    "out_console",
    "print_json",
    "to_jsonable",
]

#: Rich console for human output on stdout.
out_console = Console(highlight=False, soft_wrap=False)
#: Rich console for notes and problems on stderr.
err_console = Console(stderr=True, highlight=False, soft_wrap=True)

#: The ``--json`` option every command takes.
JSON_OPTION: bool = typer.Option(
    False, "--json", help="Print machine-readable JSON on stdout and nothing else there."
)


def to_jsonable(obj: Any) -> Any:
    """Turn dataclasses, pydantic models, enums, paths and tuples into plain JSON data.

    Non-finite floats become ``None`` (JSON has no NaN), so unknown stays explicit.
    """
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, enum.Enum):
        return to_jsonable(obj.value)
    if isinstance(obj, Path):
        return str(obj)
    to_dict = getattr(obj, "to_dict", None)
    if callable(to_dict):
        return to_jsonable(to_dict())
    model_dump = getattr(obj, "model_dump", None)
    if callable(model_dump):
        return to_jsonable(model_dump(mode="json"))
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in obj]
    raise TypeError(f"cannot turn {type(obj).__name__} into JSON")


def print_json(obj: Any) -> None:
    """Print one JSON document on stdout (indented, keys in their given order)."""
    sys.stdout.write(json.dumps(to_jsonable(obj), indent=2) + "\n")
    sys.stdout.flush()
