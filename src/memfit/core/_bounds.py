"""Bounds over boxes of knob values, for the planner's pruning (pure).

Two questions the planner asks of an expression (an objective, a custom memory term) without
enumerating the values it may take:

* :func:`upper_bound`: an upper bound of the expression over a box (each name ranging over a
  closed interval), by interval arithmetic over the expression's syntax tree; ``None`` when an
  operation has no safe bound here (a divisor interval that holds zero, ``%``, a comparison),
  so the caller does not prune on it.
* :func:`nondecreasing`: whether the expression can only grow when any knob grows (knob
  values are positive), decided from its syntax (``+``, ``*``, ``/`` and ``//`` by a positive
  constant, ``**`` by a constant, ``-`` of a constant); ``False`` when that cannot be shown.

Both read the tree :func:`memfit.core.constraints.parse_expr` checked (the one safe parser;
a text is parsed by it first, so a text it refuses is a ``ConfigError`` here too), and bound
the size of every number they compute as the evaluator does (+-2**100).
"""

from __future__ import annotations

import ast
import functools
import math
from collections.abc import Callable, Mapping

from memfit.core.constraints import Expr, parse_expr

__all__ = ["Interval", "nondecreasing", "upper_bound"]

#: A closed interval ``(low, high)``.
Interval = tuple[float, float]

#: Exponents above this are not bounded (``parse_expr`` refuses them anyway).
_MAX_EXPONENT = 64
#: No bound is computed past this magnitude (as the evaluator refuses values past it): an
#: endpoint beyond it makes the bound ``None``, so ``((x ** 64) ** 64) ** 64`` costs nothing.
_MAX_MAGNITUDE = 2**100
_LOG2_MAX = 100.0


@functools.lru_cache(maxsize=512)
def _parsed(text: str) -> ast.expr:
    tree = parse_expr(text).tree
    assert tree is not None
    return tree


def _tree(expr: Expr | str) -> ast.expr:
    """The checked syntax tree of an expression (parsed by the one safe parser; a text it
    refuses is a :class:`~memfit.errors.ConfigError`, never a ``SyntaxError``)."""
    if isinstance(expr, Expr) and expr.tree is not None:
        return expr.tree
    return _parsed(expr.text if isinstance(expr, Expr) else expr)


def upper_bound(expr: Expr | str, box: Mapping[str, Interval]) -> float | None:
    """An upper bound of ``expr`` over ``box``, or ``None`` when none is safe.

    Args:
        expr: An expression (or its text) ``parse_expr`` accepts.
        box: Every name the expression reads -> its ``(low, high)`` (a setting: ``(v, v)``).

    Raises:
        ConfigError: When the text is not an expression ``parse_expr`` accepts.

    >>> upper_bound("num_envs * unroll_length", {"num_envs": (256, 512), "unroll_length": (5, 20)})
    10240
    >>> upper_bound("a / b", {"a": (1, 4), "b": (-1, 2)}) is None
    True
    >>> upper_bound("((n ** 64) ** 64) ** 64", {"n": (10, 1000)}) is None
    True
    """
    found = _interval(_tree(expr), box)
    return None if found is None else found[1]


def _bounded(found: Interval | None) -> Interval | None:
    """``found`` when both ends are within :data:`_MAX_MAGNITUDE`, else ``None``."""
    if found is None or not (
        -_MAX_MAGNITUDE <= found[0] <= _MAX_MAGNITUDE
        and -_MAX_MAGNITUDE <= found[1] <= _MAX_MAGNITUDE
    ):
        return None
    return found


def _corners(
    op: Callable[[float, float], float], left: Interval, right: Interval
) -> Interval | None:
    try:
        values = [op(a, b) for a in left for b in right]
    except (OverflowError, ZeroDivisionError):
        return None
    if any(isinstance(v, float) and math.isnan(v) for v in values):
        return None
    return min(values), max(values)


def _interval(node: ast.expr, box: Mapping[str, Interval]) -> Interval | None:
    """The interval ``node`` takes over ``box`` (a superset), or ``None``; ``None`` too when
    any part of it leaves +-2**100 (checked before a power is computed)."""
    return _bounded(_raw_interval(node, box))


def _raw_interval(node: ast.expr, box: Mapping[str, Interval]) -> Interval | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value, node.value
    if isinstance(node, ast.Name):
        return box.get(node.id)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = _interval(node.operand, box)
        if inner is None:
            return None
        return (-inner[1], -inner[0]) if isinstance(node.op, ast.USub) else inner
    if not isinstance(node, ast.BinOp):
        return None
    left = _interval(node.left, box)
    right = _interval(node.right, box)
    if left is None or right is None:
        return None
    if isinstance(node.op, ast.Add):
        return left[0] + right[0], left[1] + right[1]
    if isinstance(node.op, ast.Sub):
        return left[0] - right[1], left[1] - right[0]
    if isinstance(node.op, ast.Mult):
        return _corners(lambda a, b: a * b, left, right)
    if isinstance(node.op, (ast.Div, ast.FloorDiv)):
        if right[0] <= 0 <= right[1]:
            return None
        # a / b and a // b are monotone in a and in b on each side of zero: the corners bound it
        if isinstance(node.op, ast.Div):
            return _corners(lambda a, b: a / b, left, right)
        return _corners(lambda a, b: a // b, left, right)
    if isinstance(node.op, ast.Pow):
        if right[0] != right[1] or left[0] < 0:
            return None
        exponent = right[0]
        if not 0 <= exponent <= _MAX_EXPONENT:
            return None
        largest = max(abs(left[0]), abs(left[1]))
        if largest > 1 and exponent * math.log2(largest) > _LOG2_MAX:
            return None  # past 2**100: not computed (it could take minutes)
        return _corners(lambda a, b: a**b, left, (exponent, exponent))
    return None


def nondecreasing(
    expr: Expr | str, knobs: frozenset[str] | set[str], constants: Mapping[str, int]
) -> bool:
    """Whether ``expr`` never falls when a knob grows (knob values positive).

    Args:
        expr: An expression (or its text) ``parse_expr`` accepts.
        knobs: The names that vary (knobs); every one is positive.
        constants: The other names' values (settings).

    >>> nondecreasing("num_envs * 4096 + 2 ** 20", {"num_envs"}, {})
    True
    >>> nondecreasing("(100 - num_envs) * 4096", {"num_envs"}, {})
    False
    """
    return _monotone(_tree(expr), frozenset(knobs), constants)[0]


def _constant(node: ast.expr, constants: Mapping[str, int]) -> float | None:
    """The value of a node that reads no knob, or ``None`` where it cannot be computed."""
    found = _interval(node, {k: (v, v) for k, v in constants.items()})
    if found is None or found[0] != found[1]:
        return None
    return found[0]


def _reads_knob(node: ast.expr, knobs: frozenset[str]) -> bool:
    return any(isinstance(n, ast.Name) and n.id in knobs for n in ast.walk(node))


def _monotone(
    node: ast.expr, knobs: frozenset[str], constants: Mapping[str, int]
) -> tuple[bool, bool]:
    """``(nondecreasing, never negative)`` for ``node``, conservatively (``False`` when not
    shown)."""
    if not _reads_knob(node, knobs):
        value = _constant(node, constants)
        return value is not None, value is not None and value >= 0
    if isinstance(node, ast.Name):
        return True, True  # a knob: positive
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd):
        return _monotone(node.operand, knobs, constants)
    if not isinstance(node, ast.BinOp):
        return False, False
    up_left, pos_left = _monotone(node.left, knobs, constants)
    if isinstance(node.op, ast.Add):
        up_right, pos_right = _monotone(node.right, knobs, constants)
        return up_left and up_right, pos_left and pos_right
    if isinstance(node.op, ast.Mult):
        up_right, pos_right = _monotone(node.right, knobs, constants)
        both = pos_left and pos_right
        return up_left and up_right and both, both
    if _reads_knob(node.right, knobs):
        return False, False  # a knob subtracted, divided by, or in an exponent
    right = _constant(node.right, constants)
    if right is None:
        return False, False
    if isinstance(node.op, ast.Sub):
        return up_left, False
    if isinstance(node.op, (ast.Div, ast.FloorDiv)) and right > 0:
        return up_left and pos_left, pos_left
    if isinstance(node.op, ast.Pow) and right >= 0:
        return up_left and pos_left, pos_left
    return False, False
