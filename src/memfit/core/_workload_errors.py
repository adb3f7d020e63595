"""Pydantic validation errors as ConfigErrors with the key path, the line and a hint."""

from __future__ import annotations

import types
import typing
from collections.abc import Sequence
from typing import Any, Union

import yaml
from pydantic import BaseModel, ValidationError

from memfit.core._workload_schema import Workload
from memfit.errors import ConfigError, did_you_mean


def _loc_text(loc: Sequence[int | str]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + item)
    return "".join(parts)


def _as_model(annotation: Any) -> type[BaseModel] | None:
    """The model class of ``X`` or ``X | None``; ``None`` for anything else."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (Union, types.UnionType):
        for arg in typing.get_args(annotation):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                return arg
    return None


def _container_value(annotation: Any) -> Any:
    """For ``dict[str, X]`` / ``list[X]`` (possibly optional) the ``X``; else ``None``."""
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        for arg in typing.get_args(annotation):
            inner = _container_value(arg)
            if inner is not None:
                return inner
        return None
    if origin is dict:
        return typing.get_args(annotation)[1]
    if origin is list:
        return typing.get_args(annotation)[0]
    return None


def _fields_at(loc: Sequence[int | str]) -> list[str]:
    """Known keys of the model that holds the key at ``loc`` (for did-you-mean)."""
    annotation: Any = Workload
    for item in loc[:-1]:
        model = _as_model(annotation)
        if model is not None:
            field = model.model_fields.get(str(item))
            if field is None:
                return []
            annotation = field.annotation
            continue
        inner = _container_value(annotation)
        if inner is None:
            return []
        annotation = inner
    model = _as_model(annotation)
    return sorted(model.model_fields) if model is not None else []


def _line_of(text: str, loc: Sequence[int | str]) -> tuple[int, int] | None:
    """1-based line and column of the key or item at ``loc`` in the YAML text, if found."""
    try:  # libyaml's composer when there is one: the same nodes and marks, ten times faster
        node: Any = yaml.compose(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError:
        return None
    mark = None
    for item in loc:
        if isinstance(node, yaml.MappingNode) and isinstance(item, str):
            for key_node, value_node in node.value:
                if key_node.value == item:
                    mark, node = key_node.start_mark, value_node
                    break
            else:
                return (mark.line + 1, mark.column + 1) if mark else None
        elif isinstance(node, yaml.SequenceNode) and isinstance(item, int):
            if item >= len(node.value):
                break
            node = node.value[item]
            mark = node.start_mark
        else:
            break
    return (mark.line + 1, mark.column + 1) if mark else None


def _exact_line(text: str, loc: Sequence[int | str]) -> tuple[int, int] | None:
    """Like :func:`_line_of`, but only where the whole of ``loc`` is in the text."""
    try:
        node: Any = yaml.compose(text)
    except yaml.YAMLError:
        return None
    mark = None
    for item in loc:
        if isinstance(node, yaml.MappingNode) and isinstance(item, str):
            for key_node, value_node in node.value:
                if key_node.value == item:
                    mark, node = key_node.start_mark, value_node
                    break
            else:
                return None
        elif (
            isinstance(node, yaml.SequenceNode) and isinstance(item, int) and item < len(node.value)
        ):
            node = node.value[item]
            mark = node.start_mark
        else:
            return None
    return (mark.line + 1, mark.column + 1) if mark else None


def translate_validation_error(
    exc: ValidationError, text: str, source: str, variant: str | None = None
) -> ConfigError:
    """The first validation problem as a ConfigError with key path, place and hint.

    With ``variant``, a key the variant sets is placed at its line inside ``variants:``
    (the value that failed is the variant's, not the base's).
    """
    errors = exc.errors(include_url=False)
    # an unknown key first: a misspelt key also makes the key it stands for look missing
    errors.sort(key=lambda e: e["type"] != "extra_forbidden")
    err = errors[0]
    loc = [p for p in err["loc"] if isinstance(p, (int, str))]
    if loc and isinstance(loc[-1], str) and loc[-1].startswith("function-after"):
        loc = loc[:-1]
    # pydantic puts union branch names in the path ("int", "str"); drop them
    loc = [p for p in loc if p not in ("int", "str", "list[int]", "constrained-int")]
    if not loc and err["type"] == "value_error":
        # a whole-file check names its key first ("factory must be module:function, ...")
        first = str(err["msg"]).removeprefix("Value error, ").split(" ", 1)[0]
        if first.split(".", 1)[0] in Workload.model_fields:
            parts: list[int | str] = list(first.split("."))
            loc = parts
    key_path = _loc_text(loc) or "(top level)"
    place = _exact_line(text, ["variants", variant, *loc]) if variant else None
    in_variant = f", in variant {variant!r}" if place else ""
    if place is None:
        place = _line_of(text, loc)
    where = f" ({source}:{place[0]}:{place[1]}{in_variant})" if place else f" ({source})"
    more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
    kind = err["type"]
    if kind == "extra_forbidden":
        known = _fields_at(loc)
        unknown = str(loc[-1]) if loc else ""
        hint = did_you_mean(
            unknown,
            known,
            otherwise=f"known keys here: {', '.join(known)}" if known else None,
            cutoff=0.5,
        )
        return ConfigError(f"unknown key{where}{more}", key_path=key_path, hint=hint)
    if kind == "missing":
        return ConfigError(
            f"required key missing{where}{more}",
            key_path=key_path,
            hint="see docs/workload.md for the keys each family needs",
        )
    message = err["msg"]
    if message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    got = err.get("input")
    got_text = f" (got {got!r})" if got is not None and not isinstance(got, (dict, list)) else ""
    allowed = None
    ctx = err.get("ctx") or {}
    if "expected" in ctx:
        allowed = f"allowed: {ctx['expected']}"
    return ConfigError(
        f"{message}{got_text}{where}{more}",
        key_path=key_path,
        hint=allowed or "see docs/workload.md for what each key allows",
    )
