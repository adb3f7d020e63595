"""Reading Isaac Lab 3's physics backend and renderer from a running app (issue 47), with
stand-ins shaped like Isaac Lab's objects (isaaclab does not install here)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from memfit.backends import SimulatedDevice
from memfit.integrations import isaaclab as mf
from memfit.runtime.sim_measure import find_measurement

CARD = "NVIDIA GeForce RTX 4090"


class NewtonCfg:  # isaaclab_newton.physics.NewtonCfg
    pass


class PhysxCfg:  # isaaclab_physx.physics.PhysxCfg
    pass


class NewtonWarpRendererCfg:  # isaaclab_newton.renderers.NewtonWarpRendererCfg
    renderer_type = "newton_warp"


class OVRTXRendererCfg:
    renderer_type = "ovrtx"


class IsaacRtxRendererCfg:
    pass


def _env(physics: Any, renderer: Any | None, *, lab3: bool = True, n: int = 16) -> Any:
    sim = SimpleNamespace(physics=physics) if lab3 else SimpleNamespace(dt=0.005)
    sensors = {}
    if renderer is not None:
        sensors["tiled_camera"] = SimpleNamespace(cfg=SimpleNamespace(renderer_cfg=renderer))
    sensors["contact_forces"] = SimpleNamespace(cfg=SimpleNamespace())
    return SimpleNamespace(
        cfg=SimpleNamespace(sim=sim), scene=SimpleNamespace(sensors=sensors), num_envs=n,
        device="cuda:0", close=lambda: None,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("physics", "renderer", "expected"),
    [
        (NewtonCfg(), NewtonWarpRendererCfg(), ("newton", "newton_warp")),
        (PhysxCfg(), IsaacRtxRendererCfg(), ("physx", "rtx")),
        (None, OVRTXRendererCfg(), ("physx", "ovrtx")),  # Isaac Lab 3's default physics
        (NewtonCfg(), None, ("newton", "none")),
    ],
)
def test_backends_are_read_from_the_app(physics: Any, renderer: Any, expected: tuple) -> None:
    env = _env(physics, renderer)
    assert mf.backends(env) == expected
    assert mf.backends(SimpleNamespace(unwrapped=env)) == expected


def test_an_isaac_lab_2_app_names_no_backend() -> None:
    assert mf.backends(_env(None, None, lab3=False)) == (None, None)
    assert mf.backends(SimpleNamespace()) == (None, None)


def test_measure_records_the_backend_and_the_plan_finds_it(tmp_path: Path) -> None:
    device = SimulatedDevice("24GiB", name=CARD)
    device.allocate(2**30)
    live: list[int] = []

    def make_env(point: dict[str, Any]) -> Any:
        nbytes = 10**8 + 50_000 * point["num_envs"]
        device.allocate(nbytes)
        live.append(nbytes)
        env = _env(NewtonCfg(), NewtonWarpRendererCfg(), n=point["num_envs"])
        env.close = lambda: device.release(live.pop())
        return env

    m = mf.measure(make_env, step=None, probe=device, directory=tmp_path, version="isaaclab 3.0")
    assert (m.physics, m.renderer) == ("newton", "newton_warp")
    assert m.per_env_bytes == 50_000
    found = find_measurement("isaac_sim-newton-newton_warp", CARD, "isaaclab 3.0", tmp_path)
    assert found is not None and found[0].per_env_bytes == 50_000
    assert find_measurement("isaac_sim", CARD, "isaaclab 3.0", tmp_path) is None


def test_autoconfig_plans_with_the_backend_that_runs() -> None:
    device = SimulatedDevice("8GiB", name="NVIDIA GeForce RTX 4060")
    env = _env(NewtonCfg(), None, n=4096)
    cfg = mf.autoconfig(env, "isaaclab3_go2_locomotion", probe=device, already_running=())
    assert cfg.plan.breakdown["simulator_base"] == 0  # Newton's figures, not PhysX's
    assert any("runs newton physics and the none renderer" in n for n in cfg.notes)
