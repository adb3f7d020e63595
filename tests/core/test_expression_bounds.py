"""Every expression memfit evaluates is bounded in the size of the numbers it builds, by the
evaluator and by the planner's interval bounds alike (issue 34): ``((x ** 64) ** 64) ** 64``
over a knob of a million values once took minutes in the bounds, and a size written as a
term (``"-1GiB"``) reached the parser as Python. Random expressions are generated here."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from memfit.core._bounds import nondecreasing, upper_bound
from memfit.core.constraints import MAX_EXPR_DEPTH, parse_expr
from memfit.errors import ConfigError

LIMIT = 2**100

_leaf = st.one_of(
    st.sampled_from(["n", "m"]),
    st.integers(min_value=0, max_value=10**40).map(str),
    st.sampled_from(["1e308", "0.5", "64", "-3"]),
)


def _combine(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    ops = st.sampled_from(["+", "-", "*", "/", "//", "%", "**"])
    return st.tuples(children, ops, children).map(lambda t: f"({t[0]} {t[1]} {t[2]})")


EXPRESSIONS = st.recursive(_leaf, _combine, max_leaves=12)


@settings(max_examples=400, deadline=None)
@given(text=EXPRESSIONS, n=st.integers(1, 10**6), m=st.integers(1, 10**6))
def test_any_expression_evaluates_within_the_bound_or_is_refused(text: str, n: int, m: int) -> None:
    try:
        expr = parse_expr(text, key_path="objective")
    except ConfigError as exc:
        assert exc.key_path == "objective"
        return
    try:
        value = expr.evaluate({"n": n, "m": m})
    except ConfigError as exc:
        assert exc.key_path == "objective"
    else:
        assert isinstance(value, bool) or abs(value) <= LIMIT
    bound = upper_bound(expr, {"n": (1, 10**6), "m": (1, 10**6)})
    assert bound is None or abs(bound) <= LIMIT
    nondecreasing(expr, {"n", "m"}, {})


def test_a_tower_of_powers_is_refused_at_once() -> None:
    expr = parse_expr("((buffer_size ** 64) ** 64) ** 64")
    assert upper_bound(expr, {"buffer_size": (10_000, 1_000_000)}) is None
    assert upper_bound(expr.text, {"buffer_size": (1, 1)}) == 1


def test_text_the_parser_refuses_is_a_config_error_in_the_bounds_too() -> None:
    for text in ("-1GiB", "n +", "__import__('os')", "n" * 5000):
        try:
            upper_bound(text, {"n": (1, 2)})
        except ConfigError:
            continue
        raise AssertionError(text)


def test_expressions_are_bounded_in_depth_and_length() -> None:
    deep = "(" * (MAX_EXPR_DEPTH + 5) + "n" + ")" * (MAX_EXPR_DEPTH + 5)
    for text in (deep, "-" * 10_000 + "n", "n+" * 3000 + "n"):
        try:
            parse_expr(text)
        except ConfigError:
            continue
        raise AssertionError(text[:40])
