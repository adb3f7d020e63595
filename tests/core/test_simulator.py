"""The simulator block: Isaac Sim and its renderer as terms outside the allocator."""

from __future__ import annotations

import pytest

from memfit.core.families import evaluate
from memfit.core.plan import plan_for_gpu
from memfit.core.simulator import PRESETS, SimulatorSpec, simulator_terms
from memfit.core.workload import load_workload, parse_workload
from memfit.errors import ConfigError, InfeasiblePlan
from memfit.hardware.catalog import gpu
from memfit.units import GiB, MiB


def test_presets_and_overrides() -> None:
    sim = SimulatorSpec(preset="isaac_sim")
    base, per_env, per_pixel, source = sim.resolved()
    assert (base, per_env, per_pixel) == (round(3.5 * GiB), 0, 1800)
    assert "#3917" in source
    nurec = SimulatorSpec(preset="isaac_nurec", base_bytes="10GB")
    assert nurec.resolved()[:3] == (10 * 10**9, 13 * 10**8, 0)
    assert "#5793" in nurec.resolved()[3]
    assert SimulatorSpec(per_env_bytes="1MiB").resolved()[:3] == (0, MiB, 0)
    assert set(PRESETS) == {"isaac_sim", "isaac_nurec", "custom"}


def test_terms_by_hand() -> None:
    sim = SimulatorSpec(base_bytes=1000, per_env_bytes=10, per_camera_pixel_bytes=2)
    # 4 envs, 2 cameras of 8 x 8 each: 128 pixels per env
    assert simulator_terms(sim, 4, 2 * 8 * 8) == [
        ("simulator_base", 1000),
        ("simulator_envs", 40),
        ("renderer_cameras", 4 * 128 * 2),
    ]
    assert simulator_terms(sim, 4, None)[2] == ("renderer_cameras", 0)


def test_renderer_terms_follow_the_cameras_and_take_no_allocator_slack() -> None:
    w = load_workload("act_dual_camera")
    ev = evaluate(w, {**w.default_values(), "num_envs": 2})
    assert ev.terms["renderer_cameras"] == 2 * 2 * 512 * 512 * 1800
    assert ev.outside_bytes == sum(
        ev.terms[n] for n in ("simulator_base", "simulator_envs", "renderer_cameras")
    )
    bare = load_workload("act_dual_camera@no_sim")
    ev_bare = evaluate(bare, {**bare.default_values(), "num_envs": 2})
    assert ev.slack_bytes == ev_bare.slack_bytes  # the simulator adds no allocator slack
    assert ev.framework_reserved_bytes == ev_bare.reserved_bytes


def test_bad_simulator_blocks_name_their_key() -> None:
    base = "family: custom\nterms: {a: 1}\nsimulator: "
    with pytest.raises(ConfigError, match=r"simulator\.preset"):
        parse_workload(base + "{preset: gazebo}\n")
    with pytest.raises(ConfigError, match=r"simulator\.per_env_bytes"):
        parse_workload(base + "{per_env_bytes: -1}\n")
    with pytest.raises(ConfigError, match="unknown key") as info:
        parse_workload(base + "{base: 1GB}\n")
    assert info.value.hint == "did you mean 'base_bytes'?"


SIM_JAX = """\
family: custom
framework: jax
terms: {buffers: "num_envs * 1048576"}
simulator: {base_bytes: 2GiB, per_env_bytes: 64MiB}
knobs:
  num_envs: {min: 1, max: 4096, powers_of_two: true}
objective: num_envs
"""


def test_outside_the_pool_with_jax() -> None:
    """With a JAX pool the simulator's memory lives beside the pool, not inside it."""
    w = parse_workload(SIM_JAX + "jax: {mem_fraction: 0.5}\n")
    p = plan_for_gpu(w, gpu("RTX 4090"))
    total = gpu("RTX 4090").total_bytes
    pool = int(total * 0.5)
    outside = p.budget_bytes - p.breakdown["cuda_context"] - pool
    envs = int(p.knobs["num_envs"])
    assert p.breakdown["simulator_base"] + p.breakdown["simulator_envs"] <= outside
    assert 2 * GiB + 2 * envs * 64 * MiB > outside  # the next power of two does not fit
    assert p.breakdown["buffers"] == envs * MiB  # far inside the pool: not what limits it
    assert p.binding == "simulator_envs"
    outside_terms = ("simulator_base", "simulator_envs", "renderer_cameras")
    assert p.predicted_bytes == p.breakdown["cuda_context"] + pool + sum(
        p.breakdown[n] for n in outside_terms
    )


def test_with_a_simulator_memfit_recommends_no_preallocation() -> None:
    p = plan_for_gpu(parse_workload(SIM_JAX), gpu("RTX 4090"))
    assert p.pool_bytes is None
    assert p.environment == {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    assert any("XLA_PYTHON_CLIENT_PREALLOCATE=false: the simulator" in n for n in p.notes)
    # simulator and buffers then share the budget
    limit = p.budget_bytes - p.breakdown["cuda_context"] - p.breakdown["cublas_workspace"]
    assert (
        p.predicted_bytes - p.breakdown["cuda_context"] - p.breakdown["cublas_workspace"] <= limit
    )


def test_the_simulator_alone_can_leave_no_room() -> None:
    with pytest.raises(InfeasiblePlan) as info:
        plan_for_gpu(load_workload("act_dual_camera"), gpu("GTX 1650"))
    assert info.value.binding_term in ("simulator_base", "renderer_cameras")
