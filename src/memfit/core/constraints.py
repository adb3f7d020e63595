"""Rules over knobs: framework presets, user rules, safe expressions, nearest valid fixes.

Presets encode what the frameworks assert (see shared REFERENCE.md):

* ``brax_ppo`` (``brax/training/agents/ppo/train.py``): ``batch_size * num_minibatches %
  num_envs == 0`` and ``num_envs % device_count == 0``;
* ``rl_games``: ``batch_size % minibatch_size == 0`` with ``batch_size = horizon_length *
  num_actors * num_agents`` (``num_agents`` is 1 unless set);
* ``cleanrl`` (``ppo*.py``: ``minibatch_size = batch_size // num_minibatches`` with
  ``batch_size = num_envs * num_steps``): ``num_envs * num_steps % num_minibatches == 0`` so every
  minibatch has the same size and no transition is dropped.

User rules are ``divisible_by``, ``min``, ``max``, ``choices`` on one knob, or an ``expr`` over
knob and setting names. Expressions are parsed with :mod:`ast` and evaluated by a walker that
allows only numbers, names, arithmetic (``+ - * / // % **``), comparisons and ``and`` / ``or``
/ ``not``; never with ``eval``.

>>> e = parse_expr("batch_size * num_minibatches % num_envs == 0")
>>> e.names, e.evaluate({"batch_size": 128, "num_minibatches": 2, "num_envs": 512})
(('batch_size', 'num_envs', 'num_minibatches'), False)
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from memfit._checks import parse_int, require_instance, require_mapping, require_positive_int
from memfit._plain import plain_fields
from memfit.core.workload import Rule as RuleSpec
from memfit.core.workload import Workload, load_workload, require_workload
from memfit.errors import ConfigError, did_you_mean

__all__ = [
    "LAYOUT_RULES",
    "PRESETS",
    "CompiledRule",
    "Expr",
    "Violation",
    "apply_overrides",
    "check",
    "compile_rules",
    "environment",
    "parse_expr",
    "parse_set",
    "range_violation",
    "require_known",
]

Number = int | float
Value = Number | bool

#: Preset name -> (rule text, ...). ``device_count`` comes from ``devices.count``.
PRESETS: dict[str, tuple[str, ...]] = {
    "brax_ppo": (
        "batch_size * num_minibatches % num_envs == 0",
        "num_envs % device_count == 0",
    ),
    "rl_games": ("horizon_length * num_actors * num_agents % minibatch_size == 0",),
    "cleanrl": ("num_envs * num_steps % num_minibatches == 0",),
}

#: Rules every PPO workload of a layout has, preset or not: a minibatch count (or size) that
#: leaves no transition in a minibatch cannot be real (the frameworks compute
#: ``batch // num_minibatches`` and train on empty minibatches, or fail).
LAYOUT_RULES: dict[str, tuple[str, str]] = {
    "cleanrl": ("num_minibatches <= num_envs * num_steps", "cleanrl"),
    "skrl": ("mini_batches <= rollouts * num_envs", "skrl"),
    "rsl_rl": ("num_mini_batches <= num_steps_per_env * num_envs", "rsl_rl"),
    "rl_games": ("minibatch_size <= horizon_length * num_actors * num_agents", "rl_games"),
}

_BINOPS: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_CMPOPS: dict[type[ast.cmpop], Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}
_MAX_EXPONENT = 64
#: Longest expression text parsed (a rule or an objective is a line).
MAX_EXPR_CHARS = 4096
#: Deepest expression tree compiled and evaluated (each level is a Python call).
MAX_EXPR_DEPTH = 200
#: Every value an expression computes (constants, intermediate results, the result) stays
#: within +-2**100 (about 1.3e30): far above any byte count or throughput proxy, and below
#: the float range, so no result is infinite, NaN, or too large to compare with a float.
_MAX_MAGNITUDE = 2**100

_Fn = Callable[[Mapping[str, Value]], Value]


class _OutOfRange(Exception):
    """An expression's value left the range memfit computes in (caught by Expr.evaluate)."""


def _in_range(value: Any) -> Value:
    """``value`` when it is a real number within :data:`_MAX_MAGNITUDE` (or a bool)."""
    if type(value) is int and -_MAX_MAGNITUDE <= value <= _MAX_MAGNITUDE:
        return value  # the common case first: the planner's innermost loop checks rules
    if isinstance(value, bool):
        return value
    if isinstance(value, complex):
        raise _OutOfRange("a complex number (a fractional power of a negative number)")
    if isinstance(value, float) and math.isnan(value):
        raise _OutOfRange("not a number (NaN)")
    if abs(value) > _MAX_MAGNITUDE:
        raise _OutOfRange("a value beyond 2**100 (about 1.3e30)")
    return value  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Expr:
    """A parsed, safe expression over knob and setting names.

    Attributes:
        text: The expression as written.
        names: The names it reads, sorted.
    """

    text: str
    names: tuple[str, ...]
    _fn: _Fn = field(repr=False, compare=False)
    key_path: str | None = field(default=None, compare=False)
    #: The checked syntax tree (what :mod:`memfit.core._bounds` reads; never re-parsed).
    tree: ast.expr | None = field(default=None, repr=False, compare=False)

    def evaluate(self, values: Mapping[str, Value]) -> Value:
        """Evaluate with ``values`` for the names.

        Raises:
            ConfigError: When a name has no value, or the arithmetic fails (division by zero,
                an exponent above 64, a value beyond 2**100 anywhere in the expression).
        """
        try:
            return self._fn(values)
        except _OutOfRange as exc:
            shown = ", ".join(f"{k}={v}" for k, v in sorted(values.items()) if k in self.names)
            raise ConfigError(
                f"{self.text!r} reaches {exc} at {shown or 'any values'}",
                key_path=self.key_path,
                hint="keep every part of the expression within 2**100; sizes are bytes and "
                "objectives a throughput proxy, both far smaller",
            ) from None
        except ConfigError as exc:
            if exc.key_path is None and self.key_path is not None:
                raise ConfigError(exc.message, key_path=self.key_path, hint=exc.hint) from None
            raise
        except KeyError:
            missing = [n for n in self.names if n not in values]
            if not missing:
                raise
            raise ConfigError(
                f"expression {self.text!r} reads {', '.join(missing)}, which has no value",
                key_path=self.key_path,
                hint="add it to knobs or settings, or pass --set NAME=VALUE",
            ) from None
        except ZeroDivisionError:
            shown = ", ".join(f"{k}={v}" for k, v in sorted(values.items()) if k in self.names)
            raise ConfigError(
                f"division by zero in {self.text!r} at {shown or 'any values'}",
                key_path=self.key_path,
                hint="divide only by knobs and settings (never 0), or by a constant other than 0",
            ) from None


def _depth(tree: ast.AST) -> int:
    """The depth of a syntax tree, walked without recursion."""
    deepest = 0
    todo: list[tuple[ast.AST, int]] = [(tree, 1)]
    while todo:
        node, depth = todo.pop()
        deepest = max(deepest, depth)
        if depth <= MAX_EXPR_DEPTH:
            todo.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return deepest


def _compile(node: ast.AST, text: str, names: set[str]) -> _Fn:
    """Turn an allowed AST node into a closure; reject everything else."""
    if isinstance(node, ast.Expression):
        return _compile(node.body, text, names)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, bool)):
        try:
            const: Value = _in_range(node.value)
        except _OutOfRange as exc:
            raise ConfigError(
                f"the number {(ast.get_source_segment(text.strip(), node) or '?')[:40]} in "
                f"{text!r} is {exc}",
                hint="numbers in expressions stay within 2**100 (about 1.3e30)",
            ) from None
        return lambda _v: const
    if isinstance(node, ast.Name):
        name = node.id
        names.add(name)
        return lambda v: v[name]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        op = _BINOPS[type(node.op)]
        left = _compile(node.left, text, names)
        right = _compile(node.right, text, names)
        if isinstance(node.op, ast.Pow):

            def power(v: Mapping[str, Value]) -> Value:
                exponent = right(v)
                if abs(exponent) > _MAX_EXPONENT:
                    raise ConfigError(
                        f"exponent {exponent} too large in {text!r}",
                        hint=f"keep exponents at most {_MAX_EXPONENT}",
                    )
                base = left(v)
                # Refused before it is computed: (x ** 64) ** 64 would take a while.
                if (
                    abs(base) > 1
                    and exponent > 0
                    and exponent * math.log2(abs(base)) > math.log2(_MAX_MAGNITUDE)
                ):
                    raise _OutOfRange("a value beyond 2**100 (about 1.3e30)")
                return _in_range(op(base, exponent))

            return power
        return lambda v: _in_range(op(left(v), right(v)))
    if isinstance(node, ast.UnaryOp):
        operand = _compile(node.operand, text, names)
        if isinstance(node.op, ast.USub):
            return lambda v: -operand(v)
        if isinstance(node.op, ast.UAdd):
            return lambda v: +operand(v)
        if isinstance(node.op, ast.Not):
            return lambda v: not operand(v)
    if isinstance(node, ast.BoolOp):
        parts = [_compile(p, text, names) for p in node.values]
        if isinstance(node.op, ast.And):
            return lambda v: all(p(v) for p in parts)
        return lambda v: any(p(v) for p in parts)
    if isinstance(node, ast.Compare) and all(type(o) in _CMPOPS for o in node.ops):
        first = _compile(node.left, text, names)
        rest = [_compile(c, text, names) for c in node.comparators]
        ops = [_CMPOPS[type(o)] for o in node.ops]
        if len(ops) == 1:  # the common case, without the chain's loop (the planner's hot path)
            cmp_op, right_fn = ops[0], rest[0]
            return lambda v: cmp_op(first(v), right_fn(v))

        def compare(v: Mapping[str, Value]) -> bool:
            left_value = first(v)
            for op_fn, right_fn in zip(ops, rest, strict=True):
                right_value = right_fn(v)
                if not op_fn(left_value, right_value):
                    return False
                left_value = right_value
            return True

        return compare
    shown = ast.unparse(node) if not isinstance(node, ast.Expression) else text
    raise ConfigError(
        f"{type(node).__name__} ({shown!r}) is not allowed in the expression {text!r}",
        hint="use numbers, knob and setting names, + - * / // % **, comparisons, and/or/not",
    )


def parse_expr(text: str, *, key_path: str | None = None) -> Expr:
    """Parse a rule or objective expression safely (an :mod:`ast` walker, never ``eval``).

    Args:
        text: The expression (``"batch_size <= num_envs"``, ``"num_envs * unroll_length"``).
        key_path: Where it came from, for error messages.

    Returns:
        The parsed expression.

    Raises:
        ConfigError: On a syntax error or a construct that is not allowed (calls, attributes,
            subscripts, lambdas, strings, ...).
    """
    require_instance(
        key_path or "expression",
        text,
        str,
        what="an expression written as text",
        hint="write it as Python arithmetic over knob names, e.g. batch_size % 8 == 0",
    )
    if len(text) > MAX_EXPR_CHARS:
        raise ConfigError(
            f"an expression of {len(text):,} characters; memfit reads at most {MAX_EXPR_CHARS:,}",
            key_path=key_path,
            hint="an expression over knob names is a line long",
        )
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        reason = exc.msg if isinstance(exc, SyntaxError) else type(exc).__name__
        raise ConfigError(
            f"cannot parse expression {text[:80]!r}: {reason}",
            key_path=key_path,
            hint="write it as Python arithmetic over knob names, e.g. batch_size % 8 == 0",
        ) from None
    if _depth(tree) > MAX_EXPR_DEPTH:
        raise ConfigError(
            f"the expression {text[:80]!r} is nested more than {MAX_EXPR_DEPTH} levels deep",
            key_path=key_path,
            hint="an expression over knob names is a few levels deep",
        )
    names: set[str] = set()
    try:
        fn = _compile(tree, text, names)
    except ConfigError as exc:
        raise ConfigError(exc.message, key_path=key_path, hint=exc.hint) from None
    return Expr(text=text, names=tuple(sorted(names)), _fn=fn, key_path=key_path, tree=tree.body)


@dataclass(frozen=True)
class CompiledRule:
    """One compiled rule: a name, the names it reads, and its test.

    Attributes:
        name: How reports name it (``"brax_ppo: num_envs % device_count == 0"``).
        names: The knob and setting names it reads.
        test: ``values -> bool``; true when the rule holds.
    """

    name: str
    names: tuple[str, ...]
    test: Callable[[Mapping[str, Value]], bool]

    def holds(self, values: Mapping[str, Value]) -> bool:
        """Whether the rule holds for ``values``."""
        return bool(self.test(values))


@dataclass(frozen=True)
class Violation:
    """A broken rule with the knobs it involves and the nearest settings that fix it.

    Attributes:
        rule: The rule's name.
        knobs: The knobs (and settings) it reads, with their current values (integers for
            knob rules; a framework's own argument rules, such as Brax's, may hold other
            values, ``None`` for an argument that is missing).
        message: One sentence for humans.
        suggestions: Nearest valid settings, each a dict of the knobs to change, the knob to
            shrink first (lowest priority) first.
        kind: ``"rule"``: a rule is broken (a framework preset's, such as Brax PPO's, or the
            workload's own); ``"range"``: the value is outside the range the workload
            declares for the knob (the workload's search space, not a framework rule).
        source: Whose rule: the preset (``"brax_ppo"``), ``"workload"`` for the workload's
            own rules and knob ranges, or the framework an integration checks for.
    """

    rule: str
    knobs: dict[str, Any]
    message: str
    suggestions: tuple[dict[str, Any], ...] = ()
    kind: str = "rule"
    source: str = "workload"

    def to_dict(self) -> dict[str, Any]:
        """Plain data for ``--json``."""
        return plain_fields(
            self, knobs=dict(self.knobs), suggestions=[dict(s) for s in self.suggestions]
        )


def environment(workload: Workload) -> dict[str, int]:
    """Names every rule may read besides the knobs: settings, ``device_count`` and the
    layout defaults (``num_agents = 1`` for rl_games)."""
    env: dict[str, int] = {"device_count": workload.device_count}
    if "rl_games" in workload.constraints.presets or workload.family_key == "ppo/rl_games":
        env["num_agents"] = 1
    env.update(workload.settings)
    return env


def require_known(expr: Expr, known: Iterable[str], *, what: str) -> None:
    """Check that ``expr`` reads only ``known`` names (knobs, settings, ``device_count``).

    Args:
        expr: A parsed expression; its ``key_path`` says where it came from.
        known: The names it may read.
        what: What the expression is, for the message (``"objective"``, ``"term"``).

    Raises:
        ConfigError: Naming the first unknown name, with a did-you-mean hint.
    """
    names = set(known)
    unknown = [n for n in expr.names if n not in names]
    if unknown:
        raise ConfigError(
            f"{what} reads {unknown[0]!r}, which is neither a knob nor a setting",
            key_path=expr.key_path,
            hint=did_you_mean(unknown[0], names, otherwise="add it to knobs or settings"),
        )


def _expr_rule(name: str, text: str, key_path: str, known: set[str]) -> CompiledRule:
    expr = parse_expr(text, key_path=key_path)
    require_known(expr, known, what=f"expression {text!r}")
    return CompiledRule(name=name, names=expr.names, test=lambda v: bool(expr.evaluate(v)))


def compile_rules(workload: Workload) -> list[CompiledRule]:
    """Every rule of the workload: presets, user rules and the effective-batch identity.

    Knob domains are not included (the planner enumerates only valid values; :func:`check`
    tests them separately).

    Raises:
        ConfigError: When a rule names an unknown knob or has a bad expression (the key path
            says which rule).
    """
    known = set(workload.knobs) | set(environment(workload))
    rules: list[CompiledRule] = []
    for preset in workload.constraints.presets:
        for i, text in enumerate(PRESETS[preset]):
            key_path = f"constraints.presets[{preset}]"
            missing = [n for n in parse_expr(text).names if n not in known]
            if missing:
                raise ConfigError(
                    f"preset {preset} needs {', '.join(missing)} as a knob or a setting",
                    key_path=key_path,
                    hint="name the knobs as the framework names its arguments",
                )
            label = text
            if preset == "rl_games" and i == 0:
                label = "batch_size % minibatch_size == 0 (batch_size = horizon_length * "
                label += "num_actors * num_agents)"
            rules.append(_expr_rule(f"{preset}: {label}", text, key_path, known))
    layout = LAYOUT_RULES.get(workload.family_key.removeprefix("ppo/"))
    if workload.family_key.startswith("ppo/") and layout is not None:
        text, name = layout
        if all(n in known for n in parse_expr(text).names):
            label = f"{name}: {text} (a minibatch holds at least one transition)"
            rules.append(_expr_rule(label, text, f"ppo.layout[{name}]", known))
    for i, rule in enumerate(workload.constraints.rules):
        key_path = f"constraints.rules[{i}]"
        if rule.expr is not None:
            rules.append(_expr_rule(rule.name or rule.expr, rule.expr, key_path, known))
            continue
        knob = rule.knob
        assert knob is not None  # the schema requires it for these kinds
        if knob not in known:
            raise ConfigError(
                f"rule names unknown knob {knob!r}",
                key_path=f"{key_path}.knob",
                hint=did_you_mean(knob, known, otherwise=f"known: {', '.join(sorted(known))}"),
            )
        rules.append(_simple_rule(rule.name, knob, rule))
    eb = workload.effective_batch
    if eb is not None:
        micro, acc, value = eb.micro, eb.accumulation, eb.value
        rules.append(
            CompiledRule(
                name=f"effective_batch: {micro} * {acc} == {value}",
                names=tuple(sorted((micro, acc))),
                test=lambda v: v[micro] * v[acc] == value,
            )
        )
    return rules


def _simple_rule(name: str | None, knob: str, rule: RuleSpec) -> CompiledRule:
    if rule.divisible_by is not None:
        d = int(rule.divisible_by)
        return CompiledRule(name or f"{knob} % {d} == 0", (knob,), lambda v: v[knob] % d == 0)
    if rule.min is not None:
        lo = int(rule.min)
        return CompiledRule(name or f"{knob} >= {lo}", (knob,), lambda v: v[knob] >= lo)
    if rule.max is not None:
        hi = int(rule.max)
        return CompiledRule(name or f"{knob} <= {hi}", (knob,), lambda v: v[knob] <= hi)
    allowed = frozenset(int(c) for c in rule.choices or ())
    shown = ", ".join(str(c) for c in sorted(allowed))
    return CompiledRule(name or f"{knob} in {{{shown}}}", (knob,), lambda v: v[knob] in allowed)


def parse_set(items: Iterable[str]) -> dict[str, int]:
    """Parse ``--set knob=value`` items into a dict of ints.

    Raises:
        ConfigError: When an item has no ``=``, or its value is not a positive integer.
    """
    out: dict[str, int] = {}
    for item in items:
        name, sep, text = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise ConfigError(
                f"--set needs NAME=VALUE, not {item!r}", hint="e.g. --set num_envs=2048"
            )
        value = parse_int(
            f"--set {name}",
            text,
            hint="knob and setting values are positive integers, e.g. --set num_envs=2048",
        )
        if value < 1:
            raise ConfigError(
                f"{value} must be at least 1",
                key_path=f"--set {name}",
                hint="knob and setting values are positive integers, e.g. --set num_envs=2048",
            )
        if out.get(name, value) != value:
            raise ConfigError(
                f"given twice, as {out[name]} and as {value}",
                key_path=f"--set {name}",
                hint=f"keep one --set {name}=VALUE",
            )
        out[name] = value
    return out


def apply_overrides(workload: Workload, overrides: Mapping[str, int] | None) -> dict[str, int]:
    """Check override names and return them as plain ints.

    Raises:
        ConfigError: When an override names neither a knob nor a setting (with a did-you-mean
            hint), or its value is not a positive integer.
    """
    known = sorted(set(workload.knobs) | set(workload.settings))
    out: dict[str, int] = {}
    for name, value in (overrides or {}).items():
        if name not in known:
            raise ConfigError(
                f"{name!r} is neither a knob nor a setting of {workload.name}",
                key_path=name,
                hint=did_you_mean(name, known, otherwise=f"known: {', '.join(known)}"),
            )
        out[name] = require_positive_int(name, value)
    return out


def range_violation(workload: Workload, name: str, value: int) -> Violation | None:
    """The one range rule of a knob: ``value`` must be one of the knob's values.

    :func:`check` reports it and the planner refuses a ``--set`` pin that breaks it, so the
    two never disagree.

    Args:
        workload: The workload.
        name: A knob of the workload.
        value: The value given for it.

    Returns:
        The violation, with the nearest allowed values below and above, or ``None`` when
        the value is allowed.
    """
    knob = workload.knobs[name]
    allowed = knob.values()
    if value in allowed:
        return None
    below = [v for v in allowed if v < value]
    above = [v for v in allowed if v > value]
    return Violation(
        rule=f"knobs.{name}: {knob.describe()}",
        knobs={name: value},
        message=f"{name} = {value} is outside its range ({knob.describe()})",
        suggestions=tuple({name: v} for v in (below[-1:] + above[:1])),
        kind="range",
        source="workload",
    )


def _distance(a: int, b: int) -> Fraction:
    """How far apart two positive values are, as an exact ratio >= 1."""
    return Fraction(max(a, b), min(a, b))


def _suggest(
    workload: Workload,
    rule: CompiledRule,
    values: Mapping[str, int],
    rules: list[CompiledRule],
) -> tuple[dict[str, int], ...]:
    """Nearest single-knob changes that make ``rule`` hold without breaking another rule."""
    broken_before = {r.name for r in rules if not r.holds(values)}
    eb = workload.effective_batch
    found: list[tuple[int, Fraction, str, dict[str, int]]] = []
    for name in rule.names:
        knob = workload.knobs.get(name)
        if knob is None:
            continue
        current = values[name]
        best: tuple[Fraction, int, dict[str, int]] | None = None
        for candidate in knob.values():
            if candidate == current:
                continue
            change = {name: candidate}
            if eb is not None and name == eb.micro:
                if eb.value % candidate:
                    continue
                change[eb.accumulation] = eb.value // candidate
            trial = {**values, **change}
            if not rule.holds(trial):
                continue
            if any(not r.holds(trial) for r in rules if r.name not in broken_before):
                continue
            key = (_distance(current, candidate), -candidate, change)
            if best is None or key[:2] < best[:2]:
                best = key
        if best is not None:
            found.append((knob.priority, best[0], name, best[2]))
    found.sort(key=lambda item: (item[0], item[1], item[2]))
    return tuple(item[3] for item in found)


def _describe(change: Mapping[str, int]) -> str:
    return " and ".join(f"{k} {v}" for k, v in change.items())


def check(
    workload: Workload | str | Path, overrides: Mapping[str, int] | None = None
) -> list[Violation]:
    """Test the knob values (defaults, then ``overrides``) against every rule.

    Args:
        workload: The workload, a path to a workload file, or a bundled name.
        overrides: Knob or setting values to use instead of the defaults.

    Returns:
        One :class:`Violation` per broken rule (knob domains first), each with the nearest
        valid settings; empty when every rule holds.

    Raises:
        ConfigError: When the workload cannot be loaded, an override names an unknown knob,
            a knob has neither a default nor
            an override, or a rule is malformed.

    >>> from memfit.core.workload import load_workload
    >>> w = load_workload("brax_humanoid_ppo")
    >>> v = check(w, {"num_envs": 512, "batch_size": 128, "num_minibatches": 2})
    >>> v[0].suggestions[:2]
    ({'num_minibatches': 4}, {'batch_size': 256})
    """
    require_workload("workload", workload)
    require_mapping("overrides", overrides, values="int", optional=True)
    workload = load_workload(workload)
    given = apply_overrides(workload, overrides)
    values: dict[str, int] = {**environment(workload), **workload.default_values(), **given}
    missing = [n for n in workload.knobs if n not in values]
    if missing:
        raise ConfigError(
            f"knob {missing[0]} has no default value to check",
            key_path=f"knobs.{missing[0]}.default",
            hint=f"add default: to the knob, or pass --set {missing[0]}=VALUE",
        )
    rules = compile_rules(workload)
    violations: list[Violation] = []
    for name in workload.knobs:
        outside = range_violation(workload, name, values[name])
        if outside is not None:
            violations.append(outside)
    for rule in rules:
        if rule.holds(values):
            continue
        involved = {n: values[n] for n in rule.names}
        suggestions = _suggest(workload, rule, values, rules)
        shown = ", ".join(f"{k}={v}" for k, v in involved.items())
        fix = (
            "; nearest fixes: " + ", or ".join(_describe(s) for s in suggestions)
            if suggestions
            else "; no single-knob change fixes it"
        )
        preset = rule.name.partition(":")[0]
        violations.append(
            Violation(
                rule=rule.name,
                knobs=involved,
                message=f"{rule.name} is broken with {shown}{fix}",
                suggestions=suggestions,
                kind="rule",
                source=preset if preset in PRESETS or preset in LAYOUT_RULES else "workload",
            )
        )
    return violations
