"""Every check of an argument's type goes through ``src/memfit/_checks.py``: one wording of
"``name`` must be ..., not ...", one key path, one set of kinds (a bool is no integer, a
numpy integer is one). A hand-written ``if not isinstance(arg, ...): raise ConfigError(...)``
in a function of memfit fails here: call the ``_checks`` helper for that kind of value (add
one to ``_checks`` when none fits).
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "memfit"

#: Functions whose ``isinstance`` tests of a parameter are not argument checks, each with its
#: reason: ``module::function``. An entry that no longer applies must be taken off.
ALLOWED: dict[str, str] = {
    "hardware/catalog.py::gpu": "reads a GPU name or a size: the type picks the reader "
    "(an int is a size, a str a name), a bool is refused before the int branch takes it",
    "hardware/xla_target.py::_check_cc": "the shape of a compute capability (a pair of "
    "small ints), checked in the one place that writes XLA's target from it",
    "integrations/prometheus.py::parse_address": "parses a port or 'host:port': the type "
    "picks the parse, and the port's range is the value's meaning, not its kind",
    "runtime/_train_guard.py::__init__": "refuses one optimizer class (LBFGS calls its "
    "closure many times a step): a rule about the value, not a check of its kind",
    "runtime/fit.py::prior_from": "converts each kind of prior it accepts into a Prior: the "
    "type picks the conversion, a bool is refused before the int branch takes it",
    "units.py::parse_bytes": "the size parser itself (require's 'size' kind is its caller): "
    "the type picks the reading, an int as bytes and a str as text",
    "units.py::parse_fraction": "the fraction parser itself: the type picks the reading",
}


def _isinstance_of(test: ast.expr, params: set[str]) -> set[str]:
    """The parameters whose type ``test`` asks with ``isinstance``."""
    return {
        node.args[0].id
        for node in ast.walk(test)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "isinstance"
        and node.args
        and isinstance(node.args[0], ast.Name)
        and node.args[0].id in params
    }


def _raises_config_error(body: list[ast.stmt]) -> bool:
    """``body`` is a short block that ends by raising ConfigError (what a check is)."""
    last = body[-1]
    if len(body) > 2 or not isinstance(last, ast.Raise) or last.exc is None:
        return False
    exc = last.exc.func if isinstance(last.exc, ast.Call) else last.exc
    name = exc.id if isinstance(exc, ast.Name) else getattr(exc, "attr", "")
    return name == "ConfigError"


def hand_written_checks(source: str) -> list[tuple[str, int]]:
    """``(function, line)`` of each ``if`` that tests a parameter with ``isinstance`` and
    raises ConfigError: a hand-written argument check."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, function: str, params: set[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = child.args
                names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
                visit(child, child.name, set(names))
                continue
            if (
                isinstance(child, ast.If)
                and _isinstance_of(child.test, params)
                and _raises_config_error(child.body)
            ):
                found.append((function, child.lineno))
            visit(child, function, params)

    visit(ast.parse(source), "<module>", set())
    return found


def test_argument_checks_go_through_checks() -> None:
    seen: set[str] = set()
    offenders: list[str] = []
    for path in sorted(SRC.rglob("*.py")):
        if path.name == "_checks.py":
            continue
        rel = path.relative_to(SRC).as_posix()
        for function, line in hand_written_checks(path.read_text(encoding="utf-8")):
            key = f"{rel}::{function}"
            if key in ALLOWED:
                seen.add(key)
            else:
                offenders.append(f"{rel}:{line} in {function}()")
    assert offenders == [], (
        "check arguments with memfit._checks (require, require_instance, require_count, "
        f"require_list, require_choice, ...), not by hand: {offenders}"
    )
    assert sorted(set(ALLOWED) - seen) == [], "these no longer apply: take them off ALLOWED"


def test_the_check_finder_sees_what_it_must() -> None:
    caught = """
def f(x, *, level=None):
    if isinstance(x, bool) or not isinstance(x, int):
        raise ConfigError("x must be an int")
    if level is not None and not isinstance(level, str):
        raise errors.ConfigError("level")
"""
    assert [line for _, line in hand_written_checks(caught)] == [3, 5]
    passed = """
def g(x):
    if isinstance(x, str):  # a dispatch: the type picks what to do
        x = parse(x)
        y = x + 1
        raise ConfigError("too many statements for a check")
    local = make()
    if not isinstance(local, int):  # not a parameter
        raise ConfigError("local")
    if not isinstance(x, int):
        raise TypeError("not a ConfigError")
"""
    assert hand_written_checks(passed) == []
