"""Rules over knobs: presets, user rules, the safe expression walker, nearest valid fixes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memfit.core.constraints import (
    apply_overrides,
    check,
    compile_rules,
    parse_expr,
    parse_set,
)
from memfit.core.workload import load_workload, parse_workload
from memfit.errors import ConfigError

BRAX = """\
family: custom
terms: {a: 1}
devices: {count: DEVICES, strategy: pmap}
knobs:
  num_envs: {min: 64, max: 8192, powers_of_two: true, default: 2048, priority: 3}
  batch_size: {min: 32, max: 4096, powers_of_two: true, default: 1024, priority: 1}
  num_minibatches: {min: 1, max: 64, powers_of_two: true, default: 32, priority: 0}
  unroll_length: {choices: [5, 10, 20], default: 20, priority: 2}
constraints: {presets: [brax_ppo]}
"""


def brax(devices: int = 1) -> str:
    text = BRAX.replace("DEVICES", str(devices))
    if devices == 1:
        text = text.replace(", strategy: pmap", "")
    return text


def test_issue_example_512_envs_batch_128_two_minibatches() -> None:
    w = parse_workload(brax())
    violations = check(w, {"num_envs": 512, "batch_size": 128, "num_minibatches": 2})
    assert len(violations) == 1
    v = violations[0]
    assert v.rule == "brax_ppo: batch_size * num_minibatches % num_envs == 0"
    assert v.knobs == {"batch_size": 128, "num_envs": 512, "num_minibatches": 2}
    # lowest priority knob first: 4 minibatches, then batch 256, then (last) fewer envs
    assert v.suggestions == ({"num_minibatches": 4}, {"batch_size": 256}, {"num_envs": 256})
    assert "nearest fixes: num_minibatches 4, or batch_size 256" in v.message


def test_bundled_brax_workload_reproduces_the_example() -> None:
    w = load_workload("brax_humanoid_ppo")
    assert check(w) == []
    v = check(w, {"num_envs": 512, "batch_size": 128, "num_minibatches": 2})
    assert [s for s in v[0].suggestions][:2] == [{"num_minibatches": 4}, {"batch_size": 256}]


def test_device_count_rule_under_pmap() -> None:
    w = parse_workload(brax(devices=3))
    violations = check(w, {"num_envs": 512, "batch_size": 512, "num_minibatches": 3})
    rules = [v.rule for v in violations]
    assert "brax_ppo: num_envs % device_count == 0" in rules
    # num_minibatches 3 is also outside its powers-of-two domain
    assert "knobs.num_minibatches: powers of two 1..64" in rules


def test_domain_violation_suggests_the_neighbours() -> None:
    w = parse_workload(brax())
    v = check(w, {"num_envs": 3000})
    assert v[0].rule == "knobs.num_envs: powers of two 64..8192"
    assert v[0].suggestions == ({"num_envs": 2048}, {"num_envs": 4096})


def test_rl_games_and_cleanrl_presets() -> None:
    rl_games = parse_workload(
        """\
family: custom
terms: {a: 1}
knobs:
  num_actors: {min: 1, max: 4096, default: 100}
  horizon_length: {choices: [16, 32], default: 16}
  minibatch_size: {min: 64, max: 32768, powers_of_two: true, default: 1024}
constraints: {presets: [rl_games]}
"""
    )
    (v,) = check(rl_games)  # 16 * 100 = 1600, not a multiple of 1024
    assert v.rule.startswith("rl_games: batch_size % minibatch_size == 0")
    assert check(rl_games, {"num_actors": 128}) == []
    cleanrl = parse_workload(
        """\
family: custom
terms: {a: 1}
knobs:
  num_envs: {min: 1, max: 64, default: 6}
  num_steps: {choices: [128], default: 128}
  num_minibatches: {min: 1, max: 64, default: 4}
constraints: {presets: [cleanrl]}
"""
    )
    assert check(cleanrl) == []
    (v,) = check(cleanrl, {"num_minibatches": 5})
    assert v.rule == "cleanrl: num_envs * num_steps % num_minibatches == 0"


def test_user_rules() -> None:
    w = parse_workload(
        """\
family: custom
terms: {a: 1}
settings: {gpus: 2}
knobs:
  x: {min: 1, max: 100, default: 12}
  y: {min: 1, max: 100, default: 7}
constraints:
  rules:
    - {knob: x, divisible_by: 8}
    - {knob: y, min: 2}
    - {knob: y, max: 50}
    - {knob: y, choices: [7, 9, 11]}
    - {expr: "x * y <= 100 * gpus", name: "x*y budget"}
"""
    )
    names = [v.rule for v in check(w)]
    assert names == ["x % 8 == 0"]
    assert check(w, {"x": 16}) == []  # 16 * 7 = 112 <= 100 * 2
    assert check(w, {"x": 16, "y": 9}) == []
    broken = {v.rule for v in check(w, {"x": 32, "y": 1})}
    assert broken == {"y >= 2", "y in {7, 9, 11}"}
    assert {v.rule for v in check(w, {"x": 32, "y": 60})} == {
        "y <= 50",
        "y in {7, 9, 11}",
        "x*y budget",  # 32 * 60 > 200
    }
    assert [v.rule for v in check(w, {"x": 40, "y": 11})] == ["x*y budget"]


def test_effective_batch_suggestion_moves_accumulation_too() -> None:
    w = parse_workload(
        """\
family: custom
terms: {a: 1}
knobs:
  micro: {min: 1, max: 256, powers_of_two: true, default: 64}
  accum: {min: 1, max: 256, powers_of_two: true, default: 2}
effective_batch: {micro: micro, accumulation: accum, value: 256}
"""
    )
    (v,) = check(w)
    assert v.rule == "effective_batch: micro * accum == 256"
    # equally near (x2): keep micro 64 and accumulate 4 times, or micro 128 with 2 steps
    assert v.suggestions == ({"accum": 4}, {"micro": 128, "accum": 2})


def test_unknown_override_suggests_a_knob() -> None:
    w = parse_workload(brax())
    with pytest.raises(ConfigError, match="neither a knob nor a setting") as info:
        apply_overrides(w, {"num_env": 8})
    assert info.value.hint == "did you mean 'num_envs'?"


def test_parse_set() -> None:
    assert parse_set(["num_envs=2048", " batch_size = 64"]) == {"num_envs": 2048, "batch_size": 64}
    with pytest.raises(ConfigError, match="NAME=VALUE"):
        parse_set(["num_envs"])
    with pytest.raises(ConfigError, match="not a whole number"):
        parse_set(["num_envs=lots"])
    with pytest.raises(ConfigError, match="at least 1"):
        parse_set(["num_envs=0"])


def test_missing_default_asks_for_a_value() -> None:
    w = parse_workload("family: custom\nterms: {a: 1}\nknobs:\n  x: {min: 1, max: 4}\n")
    with pytest.raises(ConfigError, match="no default") as info:
        check(w)
    assert info.value.hint is not None and "--set x=VALUE" in info.value.hint
    assert check(w, {"x": 2}) == []


@pytest.mark.parametrize(
    ("text", "values", "expected"),
    [
        ("a + b * 2", {"a": 1, "b": 3}, 7),
        ("a // b", {"a": 7, "b": 2}, 3),
        ("a / b", {"a": 7, "b": 2}, 3.5),
        ("a ** 2 - -b", {"a": 3, "b": 1}, 10),
        ("a % b == 0 and not a > 10", {"a": 8, "b": 4}, True),
        ("1 < a <= 4 or b == 9", {"a": 5, "b": 9}, True),
        ("1 < a <= 4", {"a": 5}, False),
        ("a != b", {"a": 2, "b": 2}, False),
    ],
)
def test_expressions(text: str, values: dict[str, int], expected: object) -> None:
    assert parse_expr(text).evaluate(values) == expected


@pytest.mark.parametrize(
    "text",
    [
        "__import__('os').system('echo pwned')",
        "().__class__.__bases__",
        "a[0]",
        "(lambda: 1)()",
        "'text'",
        "[a for a in b]",
        "a if b else c",
        "max(a, b)",
        "a := 3",
    ],
)
def test_expressions_refuse_everything_but_arithmetic(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_expr(text)


def test_expression_errors() -> None:
    with pytest.raises(ConfigError, match="cannot parse"):
        parse_expr("a +")
    with pytest.raises(ConfigError, match="division by zero"):
        parse_expr("a % b").evaluate({"a": 1, "b": 0})
    with pytest.raises(ConfigError, match="exponent"):
        parse_expr("2 ** a").evaluate({"a": 1000})
    with pytest.raises(ConfigError, match="has no value"):
        parse_expr("a + b").evaluate({"a": 1})


def test_rule_reading_an_unknown_name_is_refused() -> None:
    w = parse_workload(
        "family: custom\nterms: {a: 1}\nknobs:\n  num_envs: {min: 1, max: 4}\n"
        "constraints:\n  rules:\n    - {expr: 'num_env > 1'}\n"
    )
    with pytest.raises(ConfigError, match="neither a knob nor a setting") as info:
        compile_rules(w)
    assert info.value.key_path == "constraints.rules[0]"
    assert info.value.hint == "did you mean 'num_envs'?"


@settings(max_examples=60, deadline=None)
@given(
    envs=st.sampled_from([64, 128, 256, 512, 1024, 2048, 4096, 8192]),
    batch=st.sampled_from([32, 64, 128, 256, 512, 1024, 2048, 4096]),
    minibatches=st.sampled_from([1, 2, 4, 8, 16, 32, 64]),
    devices=st.sampled_from([1, 2, 4]),
)
def test_check_agrees_with_brax_assertions(
    envs: int, batch: int, minibatches: int, devices: int
) -> None:
    w = parse_workload(brax(devices))
    violations = check(w, {"num_envs": envs, "batch_size": batch, "num_minibatches": minibatches})
    brax_ok = batch * minibatches % envs == 0 and envs % devices == 0
    assert (violations == []) == brax_ok
    for v in violations:
        for fix in v.suggestions:
            fixed = {"num_envs": envs, "batch_size": batch, "num_minibatches": minibatches, **fix}
            assert v.rule not in {x.rule for x in check(w, fixed)}


LAYOUTS = {
    "rsl_rl": ("num_envs: 4096, num_steps_per_env: 24", "num_mini_batches"),
    "skrl": ("num_envs: 4096, rollouts: 16", "mini_batches"),
    "cleanrl": ("num_envs: 8, num_steps: 128", "num_minibatches"),
    "rl_games": ("num_actors: 8, horizon_length: 16", "minibatch_size"),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("count", [10**12, 2**62])
def test_a_minibatch_of_no_transition_is_refused_in_every_layout(layout: str, count: int) -> None:
    """Issue 45: ``num_mini_batches: 10**12`` in an RSL-RL layout planned as "fits" (a
    minibatch of ceil(98304 / 10**12) = 1 transition); the frameworks take ``batch //
    num_mini_batches`` = 0. Every PPO layout has the rule, preset or not."""
    from memfit.planning import plan

    settings, name = LAYOUTS[layout]
    text = (
        f"name: t\nfamily: ppo\nppo: {{layout: {layout}}}\nobservations: {{vector: 8}}\n"
        f"action_dim: 2\nnetworks:\n  policy: {{layers: [8, 16, 2]}}\n"
        f"settings: {{{settings}, {name}: {count}}}\n"
    )
    w = parse_workload(text)
    (violation,) = check(w, {})
    assert violation.rule.startswith(f"{layout}: {name} <=") and violation.source == layout
    with pytest.raises(ConfigError, match="a minibatch holds at least one transition"):
        plan(w, gpu="RTX 4090")
    fine = parse_workload(text.replace(str(count), "4"))
    assert check(fine, {}) == []
