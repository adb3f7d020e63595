"""Measuring a simulator on the user's card (issue 33), on a simulated device with a stand-in
simulator whose memory is known: what the measurement fits, stores, and the next plan uses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import memfit
from memfit.backends import SimulatedDevice
from memfit.core.simulator import SimCamera, SimulatorSpec, camera_bytes
from memfit.core.simulator_figures import SHARED
from memfit.core.workload import parse_workload
from memfit.errors import ConfigError
from memfit.integrations import isaaclab as mf
from memfit.runtime.sim_measure import (
    SimReading,
    camera_pixels,
    find_measurement,
    fit_readings,
    store_measurement,
    with_simulator_measurement,
)

CARD = "NVIDIA GeForce RTX 4090"
CONTEXT = 500 * 2**20  # what the stand-in app "has" as its CUDA context
APP = 2 * 2**30  # the simulator app at start
FIXED = 300 * 2**20  # what creating an env adds whatever its size (the render product's part)
PER_ENV = 150_000
PIXEL = 200.0  # bytes per planned camera pixel


class StandIn:
    """A simulator whose memory is known: creating an env allocates ``FIXED + PER_ENV x N +
    PIXEL x pixels`` on the device; stepping allocates nothing more; closing frees it."""

    def __init__(self, device: SimulatedDevice) -> None:
        self.device = device
        self.device.allocate(CONTEXT + APP)
        self.live: list[int] = []
        self.steps = 0

    def make_env(self, point: dict[str, Any]) -> Any:
        n = point["num_envs"]
        nbytes = FIXED + PER_ENV * n + round(PIXEL * camera_pixels(point.get("cameras"), n))
        self.device.allocate(nbytes)
        self.live.append(nbytes)
        stand_in = self

        class Env:
            num_envs = n

            def close(self) -> None:
                stand_in.device.release(nbytes)
                stand_in.live.remove(nbytes)

        return Env()

    def step(self, env: Any) -> None:
        self.steps += 1


def cams(size: int, count: int = 1) -> list[dict[str, Any]]:
    return [{"height": size, "width": size, "count": count}]


POINTS = [
    {"num_envs": 16, "cameras": cams(80)},
    {"num_envs": 64, "cameras": cams(80)},
    {"num_envs": 64, "cameras": cams(160)},
]


def test_the_measurement_recovers_the_stand_ins_memory(tmp_path: Path) -> None:
    device = SimulatedDevice("24GiB", name=CARD)
    sim = StandIn(device)
    m = memfit.measure_simulator(
        sim.make_env,
        POINTS,
        step=sim.step,
        steps=3,
        probe=device,
        context_bytes=CONTEXT,
        version="stand-in 1.0",
        directory=tmp_path,
    )
    assert sim.steps == 9 and sim.live == []  # stepped, then closed: nothing left
    assert m.gpu == CARD and m.version == "stand-in 1.0" and m.rendering
    assert m.base_bytes == APP + FIXED  # the app and the fixed part, the context out
    assert m.per_env_bytes == PER_ENV
    assert m.pixel_bytes == pytest.approx(PIXEL, abs=0.01)
    assert [r["num_envs"] for r in m.readings] == [16, 64, 64]
    stored = find_measurement("isaac_sim", CARD, "stand-in 1.0", tmp_path)
    assert stored is not None and stored[0] == m


def test_without_a_second_camera_size_the_cameras_join_the_per_env_figure() -> None:
    device = SimulatedDevice("24GiB", name=CARD)
    sim = StandIn(device)
    points = POINTS[:2]
    m = memfit.measure_simulator(
        sim.make_env, points, probe=device, context_bytes=CONTEXT, store=False
    )
    per_env_pixels = camera_pixels(cams(80), 64) - camera_pixels(cams(80), 16)
    assert m.pixel_bytes is None
    assert m.per_env_bytes == pytest.approx(PER_ENV + PIXEL * per_env_pixels / 48, rel=1e-6)
    assert any("counted in the per-env figure" in r.get("note", "") for r in m.readings)


def test_the_next_plan_uses_the_measurement_of_its_card(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMFIT_CACHE_DIR", str(tmp_path))
    device = SimulatedDevice("24GiB", name=CARD)
    sim = StandIn(device)
    m = mf.measure(sim.make_env, POINTS, step=sim.step, probe=device, context_bytes=CONTEXT)
    w = parse_workload(
        "family: custom\nterms: {policy: 1MiB}\n"
        "simulator: {preset: isaac_sim, cameras: [{height: 120, width: 120}]}\n"
        "knobs: {num_envs: {min: 1, max: 4096, powers_of_two: true}}\n"
    )
    plan = memfit.plan(w, gpu="RTX 4090", overrides={"num_envs": 256}, margin=0)
    assert any("simulator figures measured on " + CARD in n for n in plan.notes)
    f = SimulatorSpec(preset="isaac_sim", gpu=CARD, measured=m).figures()
    assert plan.breakdown["simulator_base"] == APP + FIXED
    assert plan.breakdown["simulator_envs"] == 256 * PER_ENV
    assert "renderer_base" not in plan.breakdown  # measured with the renderer on: in the base
    cam = SimCamera(height=120, width=120)
    assert plan.breakdown["renderer_cameras"] == camera_bytes([cam], {}, 256, f)
    # what the stand-in would hold at this setting, its context as memfit models it
    expected = APP + FIXED + 256 * PER_ENV + PIXEL * camera_pixels([cam.model_dump()], 256)
    assert plan.breakdown["renderer_cameras"] + plan.breakdown["simulator_envs"] + (
        plan.breakdown["simulator_base"]
    ) == pytest.approx(expected, rel=1e-6)
    # another card, or measure="recorded": the published figures
    other = memfit.plan(w, gpu="RTX 3090", overrides={"num_envs": 256}, margin=0)
    assert not any("measured on" in n for n in other.notes)
    recorded = memfit.plan(w, gpu="RTX 4090", overrides={"num_envs": 256}, measure="recorded")
    assert "renderer_base" in recorded.breakdown


def test_fit_and_store_by_hand(tmp_path: Path) -> None:
    readings = [SimReading({"num_envs": n}, n, 0, 3 * 2**30 + n * 2**20, 0) for n in (64, 128, 256)]
    m = fit_readings(readings, gpu=CARD, context_bytes=2**30, simulator="genesis")
    assert (m.base_bytes, m.per_env_bytes, m.pixel_bytes, m.rendering) == (
        2 * 2**30,
        2**20,
        None,
        False,
    )
    path = store_measurement(m, tmp_path)
    assert path.name.startswith("simulator-genesis-nvidia-geforce-rtx-4090")
    newer = m.model_copy(update={"version": "0.3", "taken": "2099-01-01T00:00:00Z"})
    store_measurement(newer, tmp_path)
    found = find_measurement("genesis", CARD, None, tmp_path)
    assert found is not None and found[0].version == "0.3"  # the most recent
    (tmp_path / "simulator-genesis-nvidia-geforce-rtx-4090-broken.json").write_text("{oops")
    assert find_measurement("genesis", CARD, "broken", tmp_path) is None
    w = parse_workload("family: custom\nterms: {a: 1}\nsimulator: {preset: genesis}\n")
    attached, notes = with_simulator_measurement(w, CARD, directory=tmp_path)
    assert attached.simulator.measured == newer and notes
    kept, none = with_simulator_measurement(w, CARD, "recorded", tmp_path)
    assert kept is w and none == []


def test_bad_measurements_are_config_errors() -> None:
    device = SimulatedDevice("8GiB", name=CARD)
    with pytest.raises(ConfigError, match="two or more numbers of environments"):
        memfit.measure_simulator(
            lambda p: None, [{"num_envs": 8}, {"num_envs": 8}], probe=device, store=False
        )
    with pytest.raises(ConfigError) as info:
        memfit.measure_simulator(lambda p: None, [{"envs": 8}], probe=device, store=False)
    assert info.value.key_path == "points[0].num_envs"
    with pytest.raises(ConfigError) as info:
        memfit.measure_simulator(lambda p: None, "num_envs=8", probe=device, store=False)  # type: ignore[arg-type]
    assert info.value.key_path == "points"
    with pytest.raises(ConfigError) as info:
        memfit.measure_simulator(lambda p: None, probe=object(), store=False)
    assert info.value.key_path == "probe"


def test_standard_cameras_and_further_types_count_as_the_plan_counts_them() -> None:
    std = [{"kind": "standard", "height": 10, "width": 10}]
    assert camera_pixels(std, 4) == round(4 * 100 * SHARED.standard_factor)
    both = [{"height": 10, "width": 10, "data_types": ["rgb", "depth"]}]
    assert camera_pixels(both, 4) == round(4 * 100 * (1 + SHARED.extra_type_fraction))
    assert camera_pixels(None, 4) == 0


#: A point's fields that cannot be real, and the key path each is refused at (issue 45:
#: ``cameras: 'rgb'`` was "dictionary update sequence ...", a height of -1 a raw pydantic
#: error, a height of 0 accepted).
BAD_POINTS = [
    ({"num_envs": 16, "cameras": "rgb"}, "points[0].cameras"),
    ({"num_envs": 16, "cameras": ["rgb"]}, "points[0].cameras[0]"),
    ({"num_envs": 16, "cameras": [{"height": -1, "width": 8}]}, "points[0].cameras[0].height"),
    ({"num_envs": 16, "cameras": [{"height": 0, "width": 8}]}, "points[0].cameras[0].height"),
    ({"num_envs": 16, "cameras": [{"height": 8, "width": 10**5}]}, "points[0].cameras[0].width"),
    ({"num_envs": 16, "cameras": [{"height": 8, "width": 8.5}]}, "points[0].cameras[0].width"),
    ({"num_envs": 16, "cameras": [{"height": "h", "width": 8}]}, "points[0].cameras[0].height"),
    ({"num_envs": 16, "cameras": [{"height": 8}]}, "points[0].cameras[0]"),
    (
        {"num_envs": 16, "cameras": [{"height": 8, "width": 8, "count": 0}]},
        "points[0].cameras[0].count",
    ),
    (
        {"num_envs": 16, "cameras": [{"height": 8, "width": 8, "kind": "fish"}]},
        "points[0].cameras[0].kind",
    ),
    (
        {"num_envs": 16, "cameras": [{"height": 8, "width": 8, "fov": 90}]},
        "points[0].cameras[0].fov",
    ),
    (
        {"num_envs": 16, "cameras": [{"height": 8, "width": 8, "data_types": ["x"]}]},
        "points[0].cameras[0].data_types",
    ),
    ({"num_envs": 10**30}, "points[0].num_envs"),
    ({"num_envs": 2**31}, "points[0].num_envs"),
    ({"num_envs": 1.5}, "points[0].num_envs"),
    ({"num_envs": True}, "points[0].num_envs"),
    ("num_envs=16", "points[0]"),
]


@pytest.mark.parametrize(("point", "where"), BAD_POINTS)
def test_a_point_that_cannot_be_real_is_refused_before_any_env_is_made(
    point: Any, where: str
) -> None:
    made: list[Any] = []
    with pytest.raises(ConfigError) as info:
        memfit.measure_simulator(
            made.append,
            [point, {"num_envs": 64}],
            probe=SimulatedDevice("8GiB", name=CARD),
            store=False,
        )
    assert info.value.key_path == where, str(info.value)
    assert "pydantic" not in str(info.value) and "Input should" not in str(info.value)
    assert made == []  # refused before the simulator ran


@pytest.mark.parametrize(
    ("section", "where"),
    [
        ("cameras: [{height: 99999999999999999999999, width: 8}]", "simulator.cameras[0].height"),
        ("cameras: [{height: 0, width: 8}]", "simulator.cameras[0].height"),
        ("scene: {joints: 99999999999999999999}", "simulator.scene.joints"),
        ("per_camera_pixel_bytes: .inf", "simulator.per_camera_pixel_bytes"),
        ("per_camera_pixel_bytes: .nan", "simulator.per_camera_pixel_bytes"),
        (
            "measured: {gpu: x, base_bytes: 1, per_env_bytes: 1, pixel_bytes: .inf}",
            "simulator.measured.pixel_bytes",
        ),
        (
            "ray_casters: [{kind: rays, rays: 99999999999999999999}]",
            "simulator.ray_casters[0].rays",
        ),
    ],
)
def test_a_simulator_section_refuses_numbers_that_cannot_be_real(section: str, where: str) -> None:
    """The simulator config (issue 45): every number of the section is finite and under
    2**63, as every other number of a workload is."""
    text = f"family: custom\nterms: {{a: 1}}\nsimulator: {{preset: isaac_sim, {section}}}\n"
    with pytest.raises(ConfigError) as info:
        parse_workload(text)
    assert (info.value.key_path or "").startswith(where), str(info.value)
