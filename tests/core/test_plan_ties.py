"""Issue 22: at equal objective a plan keeps the user's hyperparameters and needs less memory."""

from __future__ import annotations

from memfit.core.plan import plan_for_gpu
from memfit.core.workload import load_workload, parse_workload
from memfit.hardware.catalog import anonymous_gpu, gpu
from memfit.units import GiB, MiB

# n drives the objective; m does not (a learning hyperparameter such as num_minibatches)
TERMS = "{a: 'n * 16777216', b: 'm * 16777216'}"


def _workload(m_default: str = "") -> object:
    return parse_workload(
        f"family: custom\nterms: {TERMS}\nknobs:\n"
        "  n: {min: 1, max: 8, priority: 1}\n"
        f"  m: {{choices: [1, 2, 4, 8], priority: 0{m_default}}}\n"
        "objective: n\n"
    )


def test_equal_objective_takes_less_memory() -> None:
    p = plan_for_gpu(_workload(), anonymous_gpu(8 * GiB))  # type: ignore[arg-type]
    assert p.knobs == {"n": 8, "m": 1}
    # every alternative with the chosen objective needs at least as much memory
    same = [a for a in p.alternatives if a["objective"] == 8]
    assert all(a["used_bytes"] >= p.used_bytes for a in same)


def test_equal_objective_keeps_the_declared_value() -> None:
    p = plan_for_gpu(_workload(", default: 4"), anonymous_gpu(8 * GiB))  # type: ignore[arg-type]
    assert p.knobs == {"n": 8, "m": 4}  # the user's value, though m=1 needs less
    # the objective still comes first: where m=4 would cost objective, it gives way, and
    # of the rest the smaller footprint wins (room for 10 blocks: m=2 would fit too)
    base = plan_for_gpu(_workload(), anonymous_gpu(8 * GiB), margin=0)  # type: ignore[arg-type]
    overhead = base.predicted_bytes - 9 * 16 * MiB - base.breakdown["allocator_slack"]
    tight = plan_for_gpu(
        _workload(", default: 4"),  # type: ignore[arg-type]
        anonymous_gpu(overhead + 10 * 16 * MiB),
        margin=0,
    )
    assert tight.knobs == {"n": 8, "m": 1}
    assert any(a["knobs"] == {"n": 8, "m": 2} for a in tight.alternatives)


def test_brax_plan_keeps_a_default_and_takes_the_smaller_footprint() -> None:
    """The humanoid on a 24 GB card: num_envs and unroll_length at their top; of the
    (batch_size, num_minibatches) pairs Brax allows there, one that keeps a declared value,
    and of those the one that needs less memory."""
    w = load_workload("brax_humanoid_ppo")
    p = plan_for_gpu(w, gpu("RTX 4090"))
    defaults = {"batch_size": 1024, "num_minibatches": 32}
    assert sum(p.knobs[k] == v for k, v in defaults.items()) == 1
    same = [
        a for a in p.alternatives
        if a["objective"] == p.knobs["num_envs"] * p.knobs["unroll_length"]  # type: ignore[operator]
        and sum(a["knobs"][k] == v for k, v in defaults.items()) == 1
    ]  # fmt: skip
    assert same and all(a["used_bytes"] >= p.used_bytes for a in same)
