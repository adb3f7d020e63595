"""The version and capability rules are data: each table row cites its source, each rule ends
in a default, and the code asks the tables instead of branching on a version."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from memfit.errors import ConfigError
from memfit.hardware.rules import TABLES, rows, rule

SRC = Path(__file__).resolve().parents[2] / "src" / "memfit"


@pytest.mark.parametrize("table", TABLES)
def test_every_rule_ends_in_a_default_and_cites_its_source(table: str) -> None:
    by_name: dict[str, list[dict[str, str]]] = {}
    for row in rows(table):
        assert len(row.source) > 20, row
        by_name.setdefault(row.rule, []).append(dict(row.conditions))
    for name, conditions in by_name.items():
        assert conditions[-1] == {}, f"{name}: the last row must be the default"
        assert all(c for c in conditions[:-1]), f"{name}: a default row before the last"


def test_every_rule_the_code_asks_for_exists() -> None:
    asked: set[tuple[str, str]] = set()
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", "") == "rule"
                and len(node.args) >= 2
                and all(isinstance(a, ast.Constant) for a in node.args[:2])
            ):
                asked.add((node.args[0].value, node.args[1].value))  # type: ignore[attr-defined]
    assert len(asked) >= 15
    known = {(t, r.rule) for t in TABLES for r in rows(t)}
    assert asked - known == set()
    assert known - asked == set(), "a rule nothing asks for"


@pytest.mark.parametrize(
    ("facts", "expected"),
    [
        ({"torch": (2, 5), "capability": (9, 0)}, True),
        ({"torch": (2, 5), "capability": (8, 9)}, False),
        ({"torch": (2, 9), "capability": (10, 0)}, True),
        ({"torch": (2, 10), "capability": (9, 0)}, False),
        ({"torch": (2, 11), "capability": (10, 3)}, True),
        ({"torch": (2, 11), "capability": (10, 1)}, False),
        ({"torch": (2, 13), "capability": (9, 0)}, True),
        ({"torch": None, "capability": (9, 0)}, False),
    ],
)
def test_conditions_read_versions_by_their_leading_parts(
    facts: dict[str, tuple[int, int] | None], expected: bool
) -> None:
    assert rule("torch", "sdpa.cudnn_first", **facts) is expected


@pytest.mark.parametrize(
    ("torch_version", "cuda", "expected"),
    [
        ((1, 7), (10, 2), 7),
        ((1, 12), (11, 3), 8),
        ((2, 6), None, 9),
        ((1, 7), None, 7),
        ((1, 7), (11, 0), 8),
        ((2, 0), None, 8),
        (None, (12, 4), 9),
        (None, (10, 1), 7),
    ],
)
def test_the_bundled_cudnn_follows_the_wheels(
    torch_version: tuple[int, int] | None, cuda: tuple[int, int] | None, expected: int
) -> None:
    assert rule("torch", "cudnn.major", torch=torch_version, cuda=cuda) == expected


def test_jaxlib_versions_have_three_parts() -> None:
    assert rule("jaxlib", "autotune.single_pass", jaxlib=(0, 9, 1)) is False
    assert rule("jaxlib", "autotune.single_pass", jaxlib=(0, 9, 2)) is True
    assert rule("jaxlib", "autotune.overlap", jaxlib=(0, 5, 0)) is True
    assert rule("jaxlib", "autotune.overlap", jaxlib=(0, 7, 2)) is False


def test_an_unknown_rule_table_or_fact_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="no rule"):
        rule("torch", "no.such.rule", torch=(2, 1))
    with pytest.raises(ConfigError, match="no rules table"):
        rule("tensorflow", "x")
    with pytest.raises(ConfigError, match="unknown facts"):
        rule("torch", "sdpa.flash.max_head_dim", pytorch=(2, 1))


VERSIONED = ("estimate", "hardware")


def version_gates(tree: ast.AST) -> list[int]:
    """Lines comparing something named ``*version*`` with a tuple of numbers: a version rule
    written as a branch."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        named = any("version" in ast.unparse(s) for s in sides)
        literal = any(
            isinstance(s, ast.Tuple) and all(isinstance(e, ast.Constant) for e in s.elts)
            for s in sides
        )
        if named and literal:
            found.append(node.lineno)
    return found


def test_no_version_rule_is_written_as_a_branch() -> None:
    gates = {}
    for package in VERSIONED:
        for path in sorted((SRC / package).rglob("*.py")):
            lines = version_gates(ast.parse(path.read_text(encoding="utf-8")))
            if lines:
                gates[str(path.relative_to(SRC))] = lines
    assert gates == {}, "put the rule in hardware/rules_<backend>.json with its source"


def test_the_gate_finder_sees_a_gate() -> None:
    code = "if torch_version < (2, 2):\n    pass\nx = capability >= (8, 0)\n"
    assert version_gates(ast.parse(code)) == [1]
