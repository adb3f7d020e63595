"""The planner's frontier search gives exactly what plain enumeration gives (issue 23).

The search (``Space.search``) never enumerates the knob space: it bisects the memory frontier,
skips subtrees whose objective bound is below the answers kept so far, and subtrees where no
rule can hold. The reference is ``Space.enumerate_all``: every configuration, no pruning at
all. Every plan field (chosen knobs, alternatives, binding, notes, would_fit), every
``InfeasiblePlan`` and every ``ConfigError`` must be the same, on random small spaces whose
memory is monotone or not and whose objectives grow, fall or mix.
"""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memfit.core import plan as core_plan
from memfit.core._bounds import nondecreasing, upper_bound
from memfit.core.constraints import parse_expr
from memfit.core.plan import plan_many
from memfit.core.workload import Workload, load_workload, parse_workload
from memfit.errors import ConfigError, InfeasiblePlan
from memfit.hardware.catalog import GpuSpec, anonymous_gpu, gpu
from memfit.units import GiB, MiB

RULES = [
    "k0 * k1 % k2 == 0",
    "k0 <= 4 * k1",
    "k2 % 2 == 0 or k0 == 1",
    "k0 + k1 + k2 < 150",
    "k1 * k2 % k0 == 0",
    "k0 != k3",
]
OBJECTIVES = [
    "k0 * k1",
    "k0 + k2",
    "k0 * k1 * k2",
    "k1",
    "k2 * 3 + k0",
    "k0 - k1",  # falls in k1
    "k0 * k1 // k2",  # falls in k2
    "k0 * k1 / k3",
    "(k0 - 40) * (k1 - 40)",  # not monotone in either
    "k0 % 7 + k1",  # no interval bound: never pruned on
    "7",  # every configuration ties
]
TERMS = [
    "k0 * k1 * {c}",
    "k2 * {c}",
    "k0 * k1 * k2 * {c}",
    "k3 * k0 * {c}",
    "(200 - k1) * k0 * {c}",  # memory falls in k1: no memory pruning
    "(k0 // k2 + 1) * {c}",  # falls in k2
]


def _knob(draw: st.DrawFn, name: str) -> str:
    if draw(st.booleans()):
        low = draw(st.sampled_from([1, 2, 4]))
        high = low * 2 ** draw(st.integers(0, 5))
        spec = f"{{min: {low}, max: {high}, powers_of_two: true"
    elif draw(st.booleans()):
        low = draw(st.integers(1, 20))
        high = low + draw(st.integers(0, 60))
        spec = f"{{min: {low}, max: {high}, step: {draw(st.integers(1, 9))}"
    else:
        values = sorted(draw(st.sets(st.integers(1, 96), min_size=1, max_size=6)))
        spec = f"{{choices: {values}"
    return f"  {name}: {spec}, priority: {draw(st.integers(0, 3))}}}\n"


@st.composite
def workloads(draw: st.DrawFn) -> Workload:
    """Custom workloads of 3 or 4 knobs, their terms, rules and objective drawn."""
    count = draw(st.integers(3, 4))
    knobs = "".join(_knob(draw, f"k{i}") for i in range(count))
    usable = [t for t in TERMS if count == 4 or "k3" not in t]
    chosen = draw(st.lists(st.sampled_from(usable), min_size=1, max_size=3, unique=True))
    terms = {"base": draw(st.integers(0, GiB))}
    for i, text in enumerate(chosen):
        terms[f"t{i}"] = text.format(c=draw(st.integers(1, 64 * MiB)))  # type: ignore[assignment]
    rules = [r for r in RULES if count == 4 or "k3" not in r]
    objectives = [o for o in OBJECTIVES if count == 4 or "k3" not in o]
    extra = f"objective: '{draw(st.sampled_from(objectives))}'\n"
    picked = draw(st.lists(st.sampled_from(rules), max_size=3, unique=True))
    if picked:
        extra += "constraints:\n  rules:\n" + "".join(f"    - {{expr: '{r}'}}\n" for r in picked)
    body = ", ".join(f"{k}: '{v}'" if isinstance(v, str) else f"{k}: {v}" for k, v in terms.items())
    return parse_workload(f"family: custom\nterms: {{{body}}}\nknobs:\n{knobs}{extra}")


def outcome(
    w: Workload,
    spec: GpuSpec,
    *,
    margin: float = 0.05,
    overrides: dict[str, int] | None = None,
    alternatives: int = 3,
    exhaustive: bool,
) -> tuple[Any, ...]:
    """What planning gives, as comparable data: the plan, the InfeasiblePlan or the error."""
    try:
        space = core_plan.Space(
            w, overrides, None, None, device_is_host=spec.is_host, margin=margin
        )
        space.exhaustive = exhaustive
        budget = core_plan._budget(w, spec, margin, 0)
        found = core_plan._plan_on(space, spec, budget, alternatives)
        return ("plan", core_plan._with_context(found, budget).to_dict())
    except InfeasiblePlan as exc:
        return ("infeasible", exc.to_dict())
    except ConfigError as exc:
        return ("config", exc.message, exc.key_path, exc.hint)


GPU_SIZES = st.integers(1, 64).map(lambda g: anonymous_gpu(g * GiB))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    w=workloads(),
    spec=GPU_SIZES,
    margin=st.sampled_from([0.0, 0.05, 0.2]),
    alternatives=st.integers(0, 4),
)
def test_search_gives_what_enumeration_gives(
    w: Workload, spec: GpuSpec, margin: float, alternatives: int
) -> None:
    kw: dict[str, Any] = {"margin": margin, "alternatives": alternatives}
    assert outcome(w, spec, exhaustive=False, **kw) == outcome(w, spec, exhaustive=True, **kw)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=workloads(), spec=GPU_SIZES, data=st.data())
def test_search_with_pins_gives_what_enumeration_gives(
    w: Workload, spec: GpuSpec, data: st.DataObject
) -> None:
    name = data.draw(st.sampled_from(sorted(w.knobs)))
    pins = {name: data.draw(st.sampled_from(w.knobs[name].values()))}
    assert outcome(w, spec, overrides=pins, exhaustive=False) == outcome(
        w, spec, overrides=pins, exhaustive=True
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    micro=st.sampled_from(
        ["{min: 1, max: 64, powers_of_two: true", "{choices: [1, 2, 3, 4, 6, 8, 12]"]
    ),
    value=st.sampled_from([24, 48, 64]),
    size=st.integers(1, 16),
    objective=st.sampled_from(["micro * k1", "accum + k1", "k1 - micro", "micro * accum"]),
)
def test_effective_batch_search_gives_what_enumeration_gives(
    micro: str, value: int, size: int, objective: str
) -> None:
    w = parse_workload(
        "family: custom\n"
        "terms: {acts: 'micro * k1 * 16777216', grads: 'accum * 1048576'}\n"
        f"knobs:\n  micro: {micro}, priority: 2}}\n"
        "  accum: {min: 1, max: 64}\n"
        "  k1: {min: 1, max: 40, step: 3, priority: 1}\n"
        f"effective_batch: {{micro: micro, accumulation: accum, value: {value}}}\n"
        f"objective: '{objective}'\n"
        "constraints:\n  rules:\n    - {expr: 'accum * k1 % 2 == 0'}\n"
    )
    spec = anonymous_gpu(size * GiB)
    assert outcome(w, spec, exhaustive=False) == outcome(w, spec, exhaustive=True)


def _brax(num_envs: str, unroll: str) -> Workload:
    w = load_workload("brax_humanoid_ppo")
    data = w.model_dump(exclude_none=True)
    data["knobs"]["num_envs"] = {"priority": 3, **_spec(num_envs)}
    data["knobs"]["unroll_length"] = {"priority": 2, **_spec(unroll)}
    return Workload.model_validate(data)


def _spec(text: str) -> dict[str, int]:
    low, high, step = (int(p) for p in text.split(":"))
    return {"min": low, "max": high, "step": step}


def test_widened_brax_matches_enumeration_on_every_tier() -> None:
    """Brax PPO widened (16 x 12 x 8 x 7 = 10,752 configurations) on cards from 4 to 80 GB:
    every plan equal to plain enumeration's, JAX's pool and the brax_ppo rules included."""
    w = _brax("4096:65536:4096", "1:34:3")
    for name in ("GTX 1650", "RTX 3060", "RTX 4090", "A100 40GB", "H100"):
        spec = gpu(name)
        assert outcome(w, spec, exhaustive=False) == outcome(w, spec, exhaustive=True), name


def test_bundled_workloads_match_enumeration() -> None:
    names = [
        "act_dual_camera",
        "brax_humanoid_ppo",
        "brax_humanoid_ppo@quick",
        "dqn_fire_raster",
        "dqn_fire_raster@auto_replay",
        "dqn_fire_raster@device_replay",
    ]
    for name in names:
        w = load_workload(name)
        for size in (4, 12, 24, 80):
            spec = anonymous_gpu(size * GiB)
            assert outcome(w, spec, exhaustive=False) == outcome(w, spec, exhaustive=True), (
                name,
                size,
            )


def test_plan_many_shares_work_and_keeps_every_answer() -> None:
    """``plan_many`` seeds each GPU's search with the previous GPU's answer: the plans are
    still each GPU's own exhaustive answer, in any GPU order."""
    w = _brax("4096:65536:4096", "1:34:3")
    specs = [gpu("H100"), gpu("GTX 1650"), gpu("RTX 4090"), anonymous_gpu(2 * GiB), gpu("L4")]
    for result, spec in zip(plan_many(w, specs), specs, strict=True):
        expected = outcome(w, spec, exhaustive=True)
        got = (
            ("infeasible", result.to_dict())
            if isinstance(result, InfeasiblePlan)
            else ("plan", result.to_dict())
        )
        assert got == expected, spec.name


def test_million_configuration_space_is_searched_not_enumerated() -> None:
    """The 1.15-million-configuration Brax space of issue 23: the search visits a few dozen
    complete configurations and evaluates the memory of a few hundred, on any card."""
    w = _brax("256:65536:128", "1:40:1")
    assert len(w.knobs["num_envs"].values()) * 40 * 8 * 7 == 1_144_640
    for name in ("GTX 1650", "RTX 4070", "H100"):
        spec = gpu(name)
        space = core_plan.Space(w, None, None, None)
        budget = core_plan._budget(w, spec, 0.05, 0)
        p = core_plan._plan_on(space, spec, budget, 3)
        assert p.fits
        assert space.visited < 2_000, (name, space.visited)
        assert len(space._cache) < 5_000, (name, len(space._cache))


def test_non_monotone_memory_is_not_pruned_on() -> None:
    """A term that falls when a knob grows turns memory pruning off (the objective bound
    still prunes), and the answer is the one enumeration gives."""
    falling = parse_workload(
        "family: custom\nterms: {a: '(100 - k1) * k0 * 4194304'}\n"
        "knobs:\n  k0: {min: 1, max: 64, priority: 1}\n  k1: {min: 1, max: 90}\n"
        "objective: k0\n"
    )
    space = core_plan.Space(falling, None, None, None)
    assert not space.monotone
    spec = anonymous_gpu(2 * GiB)
    assert outcome(falling, spec, exhaustive=False) == outcome(falling, spec, exhaustive=True)
    rising = parse_workload(
        "family: custom\nterms: {a: 'k1 * k0 * 4194304 + 2 ** 20'}\n"
        "knobs:\n  k0: {min: 1, max: 64, priority: 1}\n  k1: {min: 1, max: 90}\n"
        "objective: k0\n"
    )
    assert core_plan.Space(rising, None, None, None).monotone


# ----------------------------------------------------------------------------------------------
# The bounds themselves

EXPRESSIONS = [
    "a * b",
    "a - b",
    "a / b",
    "a // b + 3",
    "(a - 5) * (b - 5)",
    "a ** 2 - b",
    "-a + 2 * b",
    "a * b * c / (c + 1)",
    "a % b",
]


@settings(max_examples=200, deadline=None)
@given(
    text=st.sampled_from(EXPRESSIONS),
    lows=st.tuples(*(st.integers(-10, 30) for _ in range(3))),
    widths=st.tuples(*(st.integers(0, 12) for _ in range(3))),
)
def test_upper_bound_holds_at_every_point(
    text: str, lows: tuple[int, int, int], widths: tuple[int, int, int]
) -> None:
    box = {n: (lo, lo + wd) for n, lo, wd in zip("abc", lows, widths, strict=True)}
    bound = upper_bound(text, box)
    ranges = [range(lo, hi + 1) for lo, hi in box.values()]
    for a, b, c in itertools.product(*ranges):
        try:
            value = parse_expr(text).evaluate({"a": a, "b": b, "c": c})
        except ConfigError:  # division by zero
            assert bound is None
            continue
        if bound is not None:
            assert value <= bound, (a, b, c)


@settings(max_examples=100, deadline=None)
@given(
    text=st.sampled_from(
        [
            "a * 4096 + b",
            "a * b // 3",
            "(a + b) ** 2",
            "a * (100 - b)",
            "a - b",
            "a // b",
            "s * a - 7",
            "a / s",
        ]
    ),
    a=st.integers(1, 60),
    b=st.integers(1, 60),
    s=st.integers(-3, 3),
)
def test_nondecreasing_is_never_wrong(text: str, a: int, b: int, s: int) -> None:
    if s == 0 and "/ s" in text:
        return
    if not nondecreasing(text, {"a", "b"}, {"s": s}):
        return
    expr = parse_expr(text)
    env = {"a": a, "b": b, "s": s}
    here = expr.evaluate(env)
    assert expr.evaluate({**env, "a": a + 1}) >= here
    assert expr.evaluate({**env, "b": b + 1}) >= here


def test_nondecreasing_verdicts() -> None:
    assert nondecreasing("a * 4096 + b", {"a", "b"}, {})
    assert not nondecreasing("a * (100 - b)", {"a", "b"}, {})
    assert not nondecreasing("a // b", {"a", "b"}, {})
    assert nondecreasing("s * a", {"a"}, {"s": 2})
    assert not nondecreasing("s * a", {"a"}, {"s": -2})
    assert not nondecreasing("s * a", {"a"}, {})  # s unknown: not shown
