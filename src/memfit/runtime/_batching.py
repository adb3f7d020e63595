"""Batches as trees of tensors: their size, their micro-batches, and joining results.

A batch is tensors (or NumPy arrays) in dicts, mappings, lists, tuples, namedtuples and
dataclasses; every array leaf shares the batch dimension. The guards cut a batch into
micro-batches (views) and join per-chunk results back together.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import sys
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from typing import Any

from memfit.errors import ConfigError

__all__ = ["batch_size", "chunk_bounds", "concat", "is_array", "map_arrays", "split_batch", "walk"]


# ---------------------------------------------------------------------------------------------
def is_array(x: Any) -> bool:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return True
    np = sys.modules.get("numpy")
    return np is not None and isinstance(x, np.ndarray)


def walk(tree: Any, path: str = "batch") -> Iterator[tuple[str, Any]]:
    if is_array(tree):
        yield path, tree
    elif isinstance(tree, Mapping):  # dict, OrderedDict, UserDict, transformers' BatchEncoding
        for key, value in tree.items():
            yield from walk(value, f"{path}[{key!r}]")
    elif isinstance(tree, (list, tuple)):
        for i, value in enumerate(tree):
            yield from walk(value, f"{path}[{i}]")
    elif dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        for f in dataclasses.fields(tree):
            yield from walk(getattr(tree, f.name), f"{path}.{f.name}")


def map_arrays(tree: Any, fn: Callable[[Any], Any]) -> Any:
    if is_array(tree):
        return fn(tree)
    if isinstance(tree, Mapping):
        mapped = {k: map_arrays(v, fn) for k, v in tree.items()}
        if type(tree) is dict:
            return mapped
        if isinstance(tree, MutableMapping):
            # A copy keeps the type and its extra state (defaultdict's factory, a
            # BatchEncoding's encodings) that a constructor call would not get.
            copied = copy.copy(tree)
            for k, v in mapped.items():
                copied[k] = v
            return copied
        try:
            return type(tree)(mapped)  # type: ignore[call-arg]
        except TypeError:
            return mapped
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):  # namedtuple
        return type(tree)(*(map_arrays(v, fn) for v in tree))
    if isinstance(tree, (list, tuple)):
        return type(tree)(map_arrays(v, fn) for v in tree)
    if dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        new = copy.copy(tree)
        for f in dataclasses.fields(tree):
            object.__setattr__(new, f.name, map_arrays(getattr(tree, f.name), fn))
        return new
    return tree


def _flat_batch_size(batch: Any, dim: int) -> int | None:
    """:func:`batch_size` of a tensor, or a plain tuple, list or dict of tensors that agree.

    ``None`` for anything else (nested containers, other leaves, sizes that disagree, no
    dimension ``dim``): the general walk then answers, with its error messages. This is the
    shape of most batches, checked every step, so it skips the walk's per-leaf paths.
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    tensor = torch.Tensor
    kind = type(batch)
    if isinstance(batch, tensor):
        leaves: Any = (batch,)
    elif kind is tuple or kind is list:
        leaves = batch
    elif kind is dict:
        leaves = batch.values()
    else:
        return None
    size: int | None = None
    for leaf in leaves:
        if not isinstance(leaf, tensor):
            return None
        if leaf.ndim <= dim:
            continue
        n = int(leaf.shape[dim])
        if size is None:
            size = n
        elif n != size:
            return None
    return size


def batch_size(batch: Any, dim: int = 0) -> int:
    """Size of the batch along ``dim``: the common size of every array leaf.

    Args:
        batch: Tensors (or arrays) in dicts, lists, tuples, namedtuples and dataclasses.
        dim: The dimension to split along.

    Returns:
        The batch size.

    Raises:
        ConfigError: When the batch has no array with that dimension, or two arrays
            disagree on its size (the message names both paths).
    """
    size = _flat_batch_size(batch, dim)
    if size is not None:
        return size
    first = ""
    for path, leaf in walk(batch):
        if leaf.ndim <= dim:
            continue
        n = int(leaf.shape[dim])
        if size is None:
            size, first = n, path
        elif n != size:
            raise ConfigError(
                f"{path} has {n} items along dim {dim} but {first} has {size}",
                key_path=path,
                hint="every tensor in a batch must share its batch dimension",
            )
    if size is None:
        raise ConfigError(
            f"the batch holds no tensor with a dimension {dim} to split",
            key_path="batch",
            hint="pass tensors (in dicts, lists, tuples or dataclasses) with a batch dimension",
        )
    return size


def split_batch(batch: Any, start: int, stop: int, dim: int = 0) -> Any:
    """Items ``start:stop`` of every array leaf along ``dim`` (views; other leaves as they are).

    >>> import torch
    >>> part = split_batch({"x": torch.arange(6), "k": 3}, 2, 4)
    >>> part["x"].tolist(), part["k"]
    ([2, 3], 3)
    """
    index = (slice(None),) * dim + (slice(start, stop),)

    def cut(leaf: Any) -> Any:
        return leaf[index] if leaf.ndim > dim else leaf

    return map_arrays(batch, cut)


def chunk_bounds(total: int, done: int, splits: int) -> tuple[int, int]:
    """The next chunk ``[done, stop)`` when ``total`` items are cut into ``splits`` parts.

    >>> chunk_bounds(10, 0, 4), chunk_bounds(10, 9, 4)
    ((0, 3), (9, 10))
    """
    size = math.ceil(total / splits)
    return done, min(total, done + size)


def concat(parts: Sequence[Any], dim: int) -> Any:
    """Join the per-chunk results: arrays along ``dim``, containers leaf by leaf."""
    first = parts[0]
    if is_array(first):
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(first, torch.Tensor):
            if first.ndim <= dim:
                return torch.stack(list(parts)) if first.ndim == 0 else first
            return torch.cat(list(parts), dim=dim)
        import numpy as np

        if first.ndim <= dim:
            return np.stack(list(parts))
        return np.concatenate(list(parts), axis=dim)
    if isinstance(first, Mapping):
        joined = {k: concat([p[k] for p in parts], dim) for k in first}
        if type(first) is dict or not isinstance(first, MutableMapping):
            return joined
        new = copy.copy(first)
        for k, v in joined.items():
            new[k] = v
        return new
    if isinstance(first, tuple) and hasattr(first, "_fields"):
        return type(first)(*(concat([p[i] for p in parts], dim) for i in range(len(first))))
    if isinstance(first, (list, tuple)) and all(len(p) == len(first) for p in parts):
        return type(first)(concat([p[i] for p in parts], dim) for i in range(len(first)))
    if all(p == first for p in parts):
        return first
    return list(parts)
