"""Custom family: the workload gives its memory terms directly, or an estimator measures them.

Each entry of ``terms:`` is a size (``512MiB``, ``1_000_000``) or an expression over knob and
setting names that evaluates to bytes (``"num_envs * 4096"``), parsed by the safe expression
walker of :mod:`memfit.core.constraints` (never ``eval``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping

from memfit.core._workload_schema import Workload
from memfit.core.constraints import Expr, parse_expr, require_known
from memfit.core.families.common import Term
from memfit.core.families.registry import Family, device_terms, register
from memfit.errors import ConfigError
from memfit.units import parse_bytes

__all__ = ["FAMILY", "compile_terms", "terms"]


#: A term written as a size: a number with a unit (``512MiB``, ``-1GiB``, ``1.5 GB``).
_SIZE_LIKE = re.compile(
    r"\s*[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?\s*[A-Za-z]+\s*", re.ASCII
)


def _size(text: str, key_path: str) -> int | None:
    """The bytes a term written as a size gives (``"512MiB"``), or ``None`` when the text is
    not a size (then it is an expression).

    Raises:
        ConfigError: When it is written as a size that is not one (``"-1GiB"``, ``"3 parsecs"``).
    """
    try:
        return parse_bytes(text)
    except ConfigError as exc:
        if _SIZE_LIKE.fullmatch(text):
            raise ConfigError(exc.message, key_path=key_path, hint=exc.hint) from None
        return None


@functools.lru_cache(maxsize=256)
def _parse(text: str, key_path: str) -> Expr:
    """Parse once per distinct text (the planner evaluates terms many times)."""
    return parse_expr(text, key_path=key_path)


def compile_terms(workload: Workload) -> dict[str, int | Expr]:
    """Parse the ``terms:`` section once: constant sizes as ints, the rest as expressions.

    Raises:
        ConfigError: When a term is neither a size nor a valid expression, or reads a name
            that is neither a knob nor a setting.
    """
    known = set(workload.knobs) | set(workload.settings) | {"device_count"}
    out: dict[str, int | Expr] = {}
    for name, spec in (workload.terms or {}).items():
        key_path = f"terms.{name}"
        if isinstance(spec, int):
            out[name] = spec
            continue
        constant = _size(spec, key_path)
        if constant is not None:
            out[name] = constant
            continue
        expr = _parse(spec, key_path)
        require_known(expr, known, what="term")
        out[name] = expr
    return out


def terms(workload: Workload, values: Mapping[str, int]) -> list[Term]:
    """The workload's own terms at these knob values, in bytes.

    Raises:
        ConfigError: When a term is malformed or evaluates to a negative or non-numeric value.
    """
    env = {"device_count": workload.device_count, **values}
    out: list[Term] = []
    for name, spec in compile_terms(workload).items():
        if isinstance(spec, int):
            out.append(Term(name, (spec,)))
            continue
        value = spec.evaluate(env)
        if isinstance(value, bool) or value < 0:
            raise ConfigError(
                f"term evaluates to {value!r} at "
                + ", ".join(f"{k}={v}" for k, v in sorted(values.items()) if k in spec.names)
                + ", not a number of bytes",
                key_path=f"terms.{name}",
                hint="a term must be a size or an expression that is never negative",
            )
        out.append(Term(name, (int(value),)))
    return out


def _needs_terms(workload: Workload) -> str | None:
    """A custom workload gives its terms, or an estimator that measures them: with
    ``estimator: torch`` or ``jax`` the traced step's parameters, gradients, optimizer state
    and activations are the terms, and ``terms:`` only adds what the step does not hold."""
    if workload.terms or workload.estimator != "analytic":
        return None
    return (
        "family custom needs a terms: section (name: bytes or expression), or estimator: "
        "torch/jax with a factory: that measures them"
    )


FAMILY = register(
    Family(
        name="custom",
        summary="terms given directly, as sizes or expressions over knobs",
        terms=device_terms(terms),
        section="terms",
        check=_needs_terms,
    )
)
