"""The simulator block: Isaac Sim and its renderer as terms outside the allocator."""

from __future__ import annotations

import pytest

from memfit.core.families import evaluate
from memfit.core.plan import plan_for_gpu
from memfit.core.simulator import (
    PRESETS,
    MeasuredSimulator,
    SimulatorSpec,
    camera_bytes,
    ray_caster_bytes,
    simulator_terms,
    tiled_grid,
)
from memfit.core.simulator_figures import CARD_FIGURES, ROBOT_PER_ENV, SCENE_RULE, SHARED
from memfit.core.workload import load_workload, parse_workload
from memfit.errors import ConfigError, InfeasiblePlan
from memfit.hardware.catalog import gpu
from memfit.units import GiB, MiB

RTX4090 = "NVIDIA GeForce RTX 4090"
LAPTOP = "NVIDIA GeForce RTX 3080 Laptop GPU"


def test_presets_and_overrides() -> None:
    assert set(PRESETS) == {"isaac_sim", "isaac_nurec", "genesis", "custom"}
    sim = SimulatorSpec(preset="isaac_sim", gpu=RTX4090, scene={"robot": "cartpole"})
    f = sim.figures()
    card = CARD_FIGURES[RTX4090]
    assert (f.base_bytes, f.render_base_bytes) == (card.base_bytes, card.render_base_bytes)
    assert f.per_env_bytes == ROBOT_PER_ENV["cartpole"]
    assert f.notes == ()
    nurec = SimulatorSpec(preset="isaac_nurec", base_bytes="10GB")
    assert nurec.resolved()[:2] == (10 * 10**9, 13 * 10**8)
    assert "#5793" in nurec.resolved()[3]
    assert SimulatorSpec(per_env_bytes="1MiB").resolved()[:3] == (0, MiB, 0)
    assert SimulatorSpec(preset="isaac_sim", scene={"joints": 10}).figures().per_env_bytes == (
        SCENE_RULE.per_env(10)
    )


def test_a_card_without_readings_gets_the_largest_figures_and_says_so() -> None:
    unknown = SimulatorSpec(preset="isaac_sim", gpu="NVIDIA GeForce RTX 4060 Ti").figures()
    cards = [CARD_FIGURES[RTX4090], CARD_FIGURES[LAPTOP]]
    assert unknown.base_bytes == max(c.base_bytes for c in cards)
    assert unknown.render_base_bytes == max(c.render_base_bytes for c in cards)
    assert unknown.pixel_bytes + unknown.shared_pixel_bytes == max(
        c.pixel_bytes + c.shared_pixel_bytes for c in cards
    )
    assert any("no reading of Isaac Sim on NVIDIA GeForce RTX 4060 Ti" in n for n in unknown.notes)
    assert any("undescribed scene" in n for n in unknown.notes)
    assert unknown.per_env_bytes == SHARED.default_per_env_bytes


def test_tiles_make_a_square() -> None:
    assert tiled_grid(1) == (1, 1)
    assert tiled_grid(128) == (12, 12)
    assert tiled_grid(256) == (16, 16)


def test_camera_bytes_by_hand() -> None:
    f = SimulatorSpec(preset="isaac_sim", gpu=RTX4090, scene={"robot": "cartpole"}).figures()
    from memfit.core.simulator import SimCamera

    rgb = SimCamera(height=64, width=32, count=2)
    # 9 envs: a 3x3 grid; two render products of 9 x 64 x 32 pixels each
    product = 9 * 64 * 32
    expected = 2 * product * f.pixel_bytes + product * f.shared_pixel_bytes
    assert camera_bytes([rgb], {}, 9, f) == round(expected)
    both = SimCamera(height=64, width=32, data_types=["rgb", "depth"])
    per_px = f.pixel_bytes * (1 + f.extra_type_fraction)
    assert camera_bytes([both], {}, 9, f) == round(product * (per_px + f.shared_pixel_bytes))
    seg = SimCamera(height=64, width=32, data_types=["rgb", "semantic_segmentation"])
    # a type without readings costs a whole first type (the conservative figure)
    assert camera_bytes([seg], {}, 9, f) == round(
        product * (2 * f.pixel_bytes + f.shared_pixel_bytes)
    )
    std = SimCamera(kind="standard", height=64, width=32)
    assert camera_bytes([std], {}, 9, f) == round(
        9 * 64 * 32 * f.pixel_bytes * f.standard_factor + 64 * 32 * f.shared_pixel_bytes
    )
    knob = SimCamera(height="res", width="res", count="cams")
    assert camera_bytes([knob], {"res": 64, "cams": 2}, 9, f) == camera_bytes(
        [SimCamera(height=64, width=64, count=2)], {}, 9, f
    )


def test_ray_casters_by_hand() -> None:
    from memfit.core.simulator import RayCasterSpec

    scan = RayCasterSpec(kind="rays", rays=187)
    assert ray_caster_bytes([scan], {}, 10) == 10 * 187 * 40 + 10 * 187 * 60
    depth = RayCasterSpec(kind="camera", height=8, width=8)
    assert ray_caster_bytes([depth], {}, 10) == 10 * 64 * (36 + 4) + 10 * 64 * 100
    # the largest update's temporaries only: sensors update one after another
    assert ray_caster_bytes([scan, depth], {}, 10) == (
        10 * 187 * 40 + 10 * 64 * 40 + max(10 * 187 * 60, 10 * 64 * 100)
    )


def test_terms_follow_rendering_and_the_gui() -> None:
    sim = SimulatorSpec(preset="isaac_sim", gpu=RTX4090, scene={"robot": "cartpole"})
    names = [n for n, _ in simulator_terms(sim, {"num_envs": 4}, None)]
    assert names == ["simulator_base", "simulator_envs", "renderer_cameras"]  # no camera: off
    gui = sim.model_copy(update={"headless": False})
    terms = dict(simulator_terms(gui, {"num_envs": 4}, None))
    assert terms["renderer_base"] == CARD_FIGURES[RTX4090].render_base_bytes
    assert terms["viewport"] == SHARED.viewport_bytes
    off = sim.model_copy(update={"rendering": False, "cameras": [{"height": 8, "width": 8}]})
    assert dict(simulator_terms(off, {"num_envs": 4}, None))["renderer_cameras"] == 0


def test_measured_figures_are_used_on_their_card_only() -> None:
    m = MeasuredSimulator(
        gpu=RTX4090, base_bytes=10**9, per_env_bytes=1000, pixel_bytes=100.0, rendering=True
    )
    on = SimulatorSpec(preset="isaac_sim", gpu=RTX4090, measured=m).figures()
    assert (on.base_bytes, on.render_base_bytes, on.per_env_bytes) == (10**9, 0, 1000)
    assert (on.pixel_bytes, on.shared_pixel_bytes) == (100.0, 0.0)
    assert any("measured on" in n for n in on.notes)
    off = SimulatorSpec(preset="isaac_sim", gpu=LAPTOP, measured=m).figures()
    assert off.base_bytes == CARD_FIGURES[LAPTOP].base_bytes
    assert any("is not used" in n for n in off.notes)
    # the section's own figures win over both
    mine = SimulatorSpec(preset="isaac_sim", gpu=RTX4090, measured=m, per_env_bytes=7).figures()
    assert mine.per_env_bytes == 7


def test_renderer_terms_follow_the_cameras_and_take_no_allocator_slack() -> None:
    w = load_workload("act_dual_camera")
    ev = evaluate(w, {**w.default_values(), "num_envs": 2})
    sim_terms = [n for n in ev.terms if n.startswith(("simulator_", "renderer_"))]
    assert ev.outside_bytes == sum(ev.terms[n] for n in sim_terms)
    assert ev.terms["renderer_cameras"] > 0
    bare = load_workload("act_dual_camera@no_sim")
    ev_bare = evaluate(bare, {**bare.default_values(), "num_envs": 2})
    assert ev.slack_bytes == ev_bare.slack_bytes  # the simulator adds no allocator slack
    assert ev.framework_reserved_bytes == ev_bare.reserved_bytes


def test_the_plan_takes_the_figures_of_its_card() -> None:
    w = load_workload("act_dual_camera")
    p4090 = plan_for_gpu(w, gpu("RTX 4090"), overrides={"num_envs": 8})
    plaptop = plan_for_gpu(w, gpu("RTX 3080 Laptop"), overrides={"num_envs": 8})
    assert p4090.breakdown["renderer_base"] == CARD_FIGURES[RTX4090].render_base_bytes
    assert plaptop.breakdown["renderer_cameras"] > p4090.breakdown["renderer_cameras"]
    assert any(RTX4090 in n for n in p4090.notes)


def test_bad_simulator_blocks_name_their_key() -> None:
    base = "family: custom\nterms: {a: 1}\nsimulator: "
    with pytest.raises(ConfigError, match=r"simulator\.preset"):
        parse_workload(base + "{preset: gazebo}\n")
    with pytest.raises(ConfigError, match=r"simulator\.per_env_bytes"):
        parse_workload(base + "{per_env_bytes: -1}\n")
    with pytest.raises(ConfigError, match="unknown key") as info:
        parse_workload(base + "{base: 1GB}\n")
    assert info.value.hint == "did you mean 'base_bytes'?"
    with pytest.raises(ConfigError, match=r"simulator\.cameras\[0\]\.data_types\[0\]"):
        parse_workload(base + "{cameras: [{height: 8, width: 8, data_types: [thermal]}]}\n")
    with pytest.raises(ConfigError, match=r"simulator\.cameras\[0\]\.count names 'cams'"):
        parse_workload(base + "{cameras: [{height: 8, width: 8, count: cams}]}\n")
    with pytest.raises(ConfigError, match="needs rays"):
        parse_workload(base + "{ray_casters: [{kind: rays}]}\n")
    with pytest.raises(ConfigError, match="robot or joints"):
        parse_workload(base + "{scene: {robot: cartpole, joints: 3}}\n")


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
    assert info.value.binding_term in ("simulator_base", "renderer_base", "renderer_cameras")


def test_the_camera_count_is_a_knob() -> None:
    """Cameras per env as a knob: the observation, the policy and the renderer follow it."""
    text = """\
family: vision_inference
optimizer: none
observations: {cameras: {count: cameras, height: 64, width: 64}}
action_dim: 2
networks: {policy: {params: 1000}}
vision: {backbone: [{out_channels: 4, kernel: 4, stride: 4}]}
simulator:
  preset: isaac_sim
  scene: {joints: 2}
  cameras: [{height: 64, width: 64, count: cameras}]
knobs:
  num_envs: {min: 1, max: 64, powers_of_two: true}
  cameras: {choices: [1, 2, 3]}
"""
    w = parse_workload(text)
    one = evaluate(w, {"num_envs": 16, "cameras": 1}).terms
    three = evaluate(w, {"num_envs": 16, "cameras": 3}).terms
    assert three["camera_frames"] == 3 * one["camera_frames"]
    assert three["backbone_features"] == 3 * one["backbone_features"]
    assert three["renderer_cameras"] > 2 * one["renderer_cameras"]
    with pytest.raises(ConfigError, match=r"observations\.cameras\.count names 'cams'"):
        parse_workload(text.replace("count: cameras, height", "count: cams, height"))


def test_the_plan_says_what_no_reading_sizes() -> None:
    from memfit.core.simulator import simulator_notes

    spec = SimulatorSpec(
        preset="isaac_sim",
        gpu=RTX4090,
        scene={"joints": 3},
        headless=False,
        cameras=[
            {
                "kind": "standard",
                "height": 8,
                "width": 8,
                "data_types": ["rgb", "semantic_segmentation"],
            }
        ],
        ray_casters=[{"rays": 10}],
    )
    notes = " ".join(simulator_notes(spec))
    for words in (
        "no reading of semantic_segmentation",
        "standard cameras: one reading",
        "ray casters: counted from Isaac Lab's source",
        "viewport: one reading on another card",
    ):
        assert words in notes
    measured = SimulatorSpec(preset="isaac_sim", gpu=RTX4090, scene={"robot": "cartpole"})
    assert len(simulator_notes(measured)) == 1  # a measured card and scene: nothing to add
