"""A simulator and its renderer on the job's GPU: memory the framework's allocator never sees.

Isaac Lab runs Isaac Sim (PhysX and the RTX renderer) in the training process. None of its
memory comes from PyTorch's caching allocator (an out-of-memory error can report 22 MiB
reserved by torch while the renderer holds the card, isaac-sim/IsaacLab#173), so a plan that
models only the framework's tensors promises too much. A workload's ``simulator:`` section
adds these terms, each outside the allocator (no allocator slack, outside JAX's pool):

* ``simulator_base``: the simulator at start with rendering off;
* ``renderer_base``: what turning the renderer on adds before any pixel (any camera, or a
  GUI), and ``viewport``: the GUI's viewport when the run is not headless;
* ``simulator_envs``: ``num_envs x`` per-env bytes (physics, Isaac Lab's per-env buffers;
  with rendering on, the env's share of the render scene): a measured figure for a known
  robot (``scene: {robot: cartpole}``), else by the scene's size (``scene: {joints: 37}``);
* ``renderer_cameras``: the cameras. A tiled camera renders every env into one render
  product (a square of ``ceil(sqrt(N))`` tiles a side): ``pixel_bytes`` per product pixel for its
  first data type, a fraction of that for each further one; the renderer's scratch for the
  largest product comes once (``shared_pixel_bytes``). A standard camera is its own render
  product per env, at ``standard_factor`` times a tiled camera's bytes per pixel;
* ``ray_casters``: Isaac Lab's ray casters (height scanners, ray-cast cameras): float32
  buffers per ray, counted from its source.

The figures (:mod:`memfit.core.simulator_figures`) are fitted on published readings, per
card where the readings show the card matters; a card without readings gets the largest
figure of each (the conservative choice) and the plan says so. Figures given in the
section, or measured on the user's card (``measured:``, written by
:func:`memfit.measure_simulator`), take precedence.

>>> spec = SimulatorSpec(preset="isaac_nurec")
>>> [(n, round(b / 10**9, 1)) for n, b in simulator_terms(spec, {"num_envs": 4}, None)]
[('simulator_base', 9.0), ('simulator_envs', 5.2), ('renderer_cameras', 0.0)]
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from memfit.core.simulator_figures import (
    DATA_TYPES_MEASURED,
    GENESIS,
    RAY_BYTES,
    ROBOT_PER_ENV,
    SCENE_RULE,
    SHARED,
    card_figures,
    viewport_on,
)
from memfit.units import format_bytes, parse_bytes

__all__ = [
    "PRESETS",
    "MeasuredSimulator",
    "RayCasterSpec",
    "SceneSpec",
    "SimCamera",
    "SimFigures",
    "SimulatorSpec",
    "simulator_notes",
    "simulator_terms",
    "tiled_grid",
]

DataType = Literal[
    "rgb",
    "rgba",
    "depth",
    "distance_to_image_plane",
    "distance_to_camera",
    "normals",
    "motion_vectors",
    "semantic_segmentation",
    "instance_segmentation",
    "instance_id_segmentation",
]
RayDataType = Literal["distance_to_image_plane", "distance_to_camera", "normals"]
_RGB: tuple[DataType, ...] = ("rgb",)
_DEPTH: tuple[RayDataType, ...] = ("distance_to_image_plane",)

#: Presets: what each one's figures are (the per-card Isaac Sim figures live in
#: :mod:`memfit.core.simulator_figures`).
PRESETS: dict[str, str] = {
    "isaac_sim": "Isaac Sim + RTX renderer (Isaac Lab): per-card figures fitted on published "
    "readings (memfit.core.simulator_figures)",
    "isaac_nurec": "Isaac Lab PR #5793: VRAM ~ 9 GB + 1.3 GB x num_envs for a NuRec-rendered "
    "camera setup (RTX A6000), learner included, with ~15% headroom advised",
    "genesis": "Genesis (rigid solver, no camera), from its Go2 locomotion example: "
    "Genesis-Embodied-AI/genesis-world#1740 (nvidia-smi at 4096, 10000 and 20000 envs)",
    "custom": "the workload's own figures",
}

#: NuRec's figures (PR #5793, learner included): at start and per env.
_NUREC = (9 * 10**9, 13 * 10**8)


def _size(value: Any) -> Any:
    if isinstance(value, str):
        return parse_bytes(value)
    return value


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class SimCamera(_Model):
    """Cameras the renderer renders, ``count`` per environment.

    ``height``, ``width`` and ``count`` may name a knob or setting instead of a number.
    """

    kind: Literal["tiled", "standard"] = "tiled"
    data_types: list[DataType] = Field(default_factory=lambda: list(_RGB), min_length=1)
    height: int | str
    width: int | str
    count: int | str = 1

    @field_validator("height", "width", "count")
    @classmethod
    def _positive(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 1:
            raise ValueError("must be at least 1 (or name a knob or setting)")
        return value

    @field_validator("data_types")
    @classmethod
    def _unique(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("a data type is listed twice")
        return value


class RayCasterSpec(_Model):
    """Isaac Lab ray casters, ``count`` per environment: ``kind: rays`` (``RayCaster``:
    height scanners, lidars; ``rays`` per sensor) or ``kind: camera`` (``RayCasterCamera``:
    ``height x width`` rays and one image per data type)."""

    kind: Literal["rays", "camera"] = "rays"
    rays: int | str | None = None
    height: int | str | None = None
    width: int | str | None = None
    data_types: list[RayDataType] = Field(default_factory=lambda: list(_DEPTH))
    count: int | str = 1

    @model_validator(mode="after")
    def _shape(self) -> RayCasterSpec:
        if self.kind == "rays":
            if self.rays is None:
                raise ValueError("a ray caster of kind rays needs rays: (rays per sensor)")
            if self.height is not None or self.width is not None:
                raise ValueError("height and width are for kind camera; give rays:")
        else:
            if self.height is None or self.width is None:
                raise ValueError("a ray caster of kind camera needs height and width")
            if self.rays is not None:
                raise ValueError("a ray-cast camera has height x width rays; drop rays:")
        for name in ("rays", "height", "width", "count"):
            value = getattr(self, name)
            if isinstance(value, int) and value < 1:
                raise ValueError(f"{name} must be at least 1 (or name a knob or setting)")
        return self


class SceneSpec(_Model):
    """What each environment simulates: a robot with readings (``cartpole``, ``franka``) or
    the scene's joint count (``env.scene["robot"].num_joints``, summed over articulations)."""

    robot: Literal["cartpole", "franka"] | None = None
    joints: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _one(self) -> SceneSpec:
        if self.robot is None and self.joints is None:
            raise ValueError("give robot: (cartpole, franka) or joints: N")
        if self.robot is not None and self.joints is not None:
            raise ValueError("give either robot or joints, not both")
        return self


class MeasuredSimulator(_Model):
    """Figures measured on one card by :func:`memfit.measure_simulator`.

    Attributes:
        gpu: The card's name, as the driver reports it.
        simulator: What was measured (``isaac_sim``, ``genesis``, the user's name).
        version: The simulator's version, as the measurement recorded it.
        rendering: Whether the renderer ran (a camera was on) when measured.
        base_bytes: The simulator at zero envs, its CUDA context not included.
        per_env_bytes: Bytes per environment.
        pixel_bytes: Bytes per camera pixel (``None`` when no camera varied).
        context_bytes: The CUDA context memfit took out of the readings.
        readings: The settings and device readings the fit used.
        taken: When (ISO 8601, UTC).
    """

    gpu: str
    simulator: str | None = None
    version: str | None = None
    rendering: bool = False
    base_bytes: int = Field(ge=0)
    per_env_bytes: int = Field(ge=0)
    pixel_bytes: float | None = Field(default=None, ge=0)
    context_bytes: int = Field(default=0, ge=0)
    readings: list[dict[str, Any]] = Field(default_factory=list)
    taken: str | None = None


@dataclass(frozen=True)
class SimFigures:
    """The figures a plan uses, resolved for one card, with where each comes from."""

    base_bytes: int
    render_base_bytes: int
    viewport_bytes: int
    per_env_bytes: int
    pixel_bytes: float
    shared_pixel_bytes: float
    extra_type_fraction: float
    standard_factor: float
    notes: tuple[str, ...] = field(default_factory=tuple)


class SimulatorSpec(_Model):
    """A simulator (and renderer) on the job's GPU, outside the framework's allocator.

    Attributes:
        preset: ``isaac_sim``, ``isaac_nurec``, ``genesis`` or ``custom``: where the figures
            not given here come from.
        name: What it is, for reports.
        version: The simulator's version (which measurement of the user's card applies).
        gpu: The card whose figures to use; the planner sets it to the GPU it plans for.
        headless: Whether the run has no GUI (``--headless``); without it a viewport is
            rendered too.
        rendering: Whether the renderer runs; default: when a camera is on or not headless.
        cameras: The cameras the renderer renders; default: ``observations.cameras`` as
            tiled cameras.
        ray_casters: Isaac Lab ray casters (height scanners, lidars, ray-cast cameras).
        scene: What each environment simulates (sizes the per-env figure).
        base_bytes: The simulator at start with rendering off.
        render_base_bytes: What the renderer adds before any pixel.
        per_env_bytes: Bytes per environment.
        per_camera_pixel_bytes: Bytes per pixel of a tiled camera's render product, first
            data type, scratch included.
        measured: Figures measured on a card (:func:`memfit.measure_simulator`); used when
            the plan's card is that card.
        in_process: Whether it runs in the job's process (Isaac Lab: yes). Then
            ``memfit.autoconfig`` reads the device after it started and plans the rest.
        source: Where the figures come from (the preset's source when not given).
    """

    preset: Literal["isaac_sim", "isaac_nurec", "genesis", "custom"] = "custom"
    name: str | None = None
    version: str | None = None
    gpu: str | None = None
    headless: bool = True
    rendering: bool | None = None
    cameras: list[SimCamera] | None = None
    ray_casters: list[RayCasterSpec] = Field(default_factory=list)
    scene: SceneSpec | None = None
    base_bytes: int | None = Field(default=None, ge=0)
    render_base_bytes: int | None = Field(default=None, ge=0)
    per_env_bytes: int | None = Field(default=None, ge=0)
    per_camera_pixel_bytes: int | float | None = Field(default=None, ge=0)
    measured: MeasuredSimulator | None = None
    in_process: bool = True
    source: str | None = None

    _sizes = field_validator("base_bytes", "render_base_bytes", "per_env_bytes", mode="before")(
        _size
    )

    def names(self) -> list[tuple[str, str]]:
        """``(key path, name)`` of every knob or setting a camera or ray caster names."""
        out: list[tuple[str, str]] = []
        for i, cam in enumerate(self.cameras or []):
            for attr in ("height", "width", "count"):
                value = getattr(cam, attr)
                if isinstance(value, str):
                    out.append((f"simulator.cameras[{i}].{attr}", value))
        for i, ray in enumerate(self.ray_casters):
            for attr in ("rays", "height", "width", "count"):
                value = getattr(ray, attr)
                if isinstance(value, str):
                    out.append((f"simulator.ray_casters[{i}].{attr}", value))
        return out

    def figures(self) -> SimFigures:
        """The figures for :attr:`gpu`, with the section's own and measured ones first."""
        notes: list[str] = []
        shared = SHARED
        if self.preset == "isaac_sim":
            card = card_figures(self.gpu)
            base, render = card.base_bytes, card.render_base_bytes
            pixel, scratch = card.pixel_bytes, card.shared_pixel_bytes
            if card.card is None:
                notes.append(
                    f"no reading of Isaac Sim on {self.gpu or 'this card'}: the conservative "
                    f"figures ({card.source}); measure yours with memfit.measure_simulator"
                )
            viewport, _basis = viewport_on(self.gpu)
        elif self.preset == "isaac_nurec":
            base, render, pixel, scratch, viewport = _NUREC[0], 0, 0.0, 0.0, 0
        elif self.preset == "genesis":
            base, render, pixel, scratch, viewport = GENESIS[0], 0, 0.0, 0.0, 0
        else:
            base, render, pixel, scratch, viewport = 0, 0, 0.0, 0.0, 0
        per_env = self._per_env(notes)
        m = self.measured
        if m is not None and self.gpu is not None and m.gpu == self.gpu:
            base = m.base_bytes
            render = 0 if m.rendering else render
            per_env = m.per_env_bytes
            if m.pixel_bytes is not None:
                pixel, scratch = m.pixel_bytes, 0.0
            notes.append(f"measured on {m.gpu}" + (f" ({m.version})" if m.version else ""))
        elif m is not None:
            notes.append(
                f"the measurement of {m.gpu} is not used for {self.gpu or 'an unnamed card'}"
            )
        if self.base_bytes is not None:
            base = self.base_bytes
        if self.render_base_bytes is not None:
            render = self.render_base_bytes
        if self.per_env_bytes is not None:
            per_env = self.per_env_bytes
        if self.per_camera_pixel_bytes is not None:
            pixel, scratch = float(self.per_camera_pixel_bytes), 0.0
        return SimFigures(
            base_bytes=base,
            render_base_bytes=render,
            viewport_bytes=viewport,
            per_env_bytes=per_env,
            pixel_bytes=pixel,
            shared_pixel_bytes=scratch,
            extra_type_fraction=shared.extra_type_fraction,
            standard_factor=shared.standard_factor,
            notes=tuple(notes),
        )

    def _per_env(self, notes: list[str]) -> int:
        if self.preset == "isaac_nurec":
            return _NUREC[1]
        if self.preset == "genesis":
            return GENESIS[1]
        if self.preset == "custom":
            return 0
        if self.scene is not None and self.scene.robot is not None:
            return ROBOT_PER_ENV[self.scene.robot]
        if self.scene is not None and self.scene.joints is not None:
            return SCENE_RULE.per_env(self.scene.joints)
        if self.per_env_bytes is None and (self.measured is None or self.measured.gpu != self.gpu):
            notes.append(
                "per-env memory of an undescribed scene: the largest measured "
                f"({format_bytes(SHARED.default_per_env_bytes)}, a Franka arm with rendering on);"
                " give scene: {joints: N} or per_env_bytes"
            )
        return SHARED.default_per_env_bytes

    def resolved(self) -> tuple[int, int, float, str]:
        """``(base, per_env, per_camera_pixel, source)`` with the preset's figures filled in
        (base with the renderer's, per pixel with the scratch: one camera's all-in figure)."""
        f = self.figures()
        return (
            f.base_bytes + f.render_base_bytes,
            f.per_env_bytes,
            f.pixel_bytes + f.shared_pixel_bytes,
            self.source or PRESETS[self.preset],
        )


def tiled_grid(num_envs: int) -> tuple[int, int]:
    """The tile grid a tiled camera's render product takes for ``num_envs`` environments:
    ``(columns, rows)``, a square of ``ceil(sqrt(N))`` tiles a side.

    Isaac Lab lays its output out in ``ceil(sqrt(N))`` columns and as many rows as needed
    (``TiledCamera._tiling_grid_shape``), but the readings say the render product costs a
    full square: 128 environments read as 144 tiles (the RTX 4090 readings at 32, 128 and
    512 environments are 3-7% above the row-trimmed grid and within 1.4% of the square).
    """
    cols = max(1, math.ceil(math.sqrt(num_envs)))
    return cols, cols


def _value(value: int | str | None, values: Mapping[str, int]) -> int:
    if value is None:
        return 0
    return values[value] if isinstance(value, str) else value


def _observed(observed: Any) -> list[SimCamera]:
    """The observation cameras as tiled cameras (1 channel: depth; 4: rgba; else rgb)."""
    if observed is None:
        return []
    channels = int(observed.channels)
    kind: DataType = "depth" if channels == 1 else "rgba" if channels == 4 else "rgb"
    return [
        SimCamera(
            kind="tiled",
            data_types=[kind],
            height=observed.height,
            width=observed.width,
            count=observed.count,
        )
    ]


def _type_bytes(types: list[str], pixel: float, extra: float) -> float:
    """Bytes per pixel of a camera with these data types."""
    measured = [t for t in types if t in DATA_TYPES_MEASURED]
    unmeasured = len(types) - len(measured)
    total = unmeasured * pixel
    if measured:
        total += pixel + (len(measured) - 1) * extra * pixel
    return total


def camera_bytes(
    cameras: list[SimCamera], values: Mapping[str, int], num_envs: int, figures: SimFigures
) -> int:
    """Bytes of the renderer's cameras for ``num_envs`` environments."""
    total = 0.0
    largest = 0
    cols, rows = tiled_grid(num_envs)
    for cam in cameras:
        h, w, count = (_value(v, values) for v in (cam.height, cam.width, cam.count))
        per_px = _type_bytes(list(cam.data_types), figures.pixel_bytes, figures.extra_type_fraction)
        if cam.kind == "tiled":
            product = cols * rows * h * w
            total += count * product * per_px
        else:
            product = h * w
            total += count * num_envs * product * per_px * figures.standard_factor
        if count:
            largest = max(largest, product)
    total += largest * figures.shared_pixel_bytes
    return round(total)


def ray_caster_bytes(sensors: list[RayCasterSpec], values: Mapping[str, int], num_envs: int) -> int:
    """Bytes of Isaac Lab's ray casters: every sensor's buffers, plus the largest update's
    temporaries (sensors update one after another)."""
    persistent = 0
    transient = 0
    for ray in sensors:
        count = _value(ray.count, values)
        if ray.kind == "rays":
            rays = _value(ray.rays, values)
            outputs = 0
        else:
            rays = _value(ray.height, values) * _value(ray.width, values)
            outputs = sum(12 if t == "normals" else 4 for t in ray.data_types)
        keep, temp = RAY_BYTES[ray.kind]
        persistent += num_envs * count * rays * (keep + outputs)
        transient = max(transient, num_envs * rays * temp)
    return persistent + transient


def simulator_terms(
    spec: SimulatorSpec, values: Mapping[str, int], observed: Any
) -> list[tuple[str, int]]:
    """The simulator's terms at these knob values.

    Args:
        spec: The workload's simulator section.
        values: Knob and setting values (``num_envs``; camera sizes and counts when they
            are knobs).
        observed: ``observations.cameras`` (rendered when the section lists no cameras).

    Returns:
        ``(name, bytes)`` pairs: ``simulator_base``, ``simulator_envs`` and
        ``renderer_cameras`` always; ``renderer_base``, ``viewport`` and ``ray_casters``
        when they apply.
    """
    f = spec.figures()
    envs = values.get("num_envs", 1)
    cameras = spec.cameras if spec.cameras is not None else _observed(observed)
    rendering = spec.rendering if spec.rendering is not None else bool(cameras) or not spec.headless
    out = [
        ("simulator_base", f.base_bytes),
        ("simulator_envs", envs * f.per_env_bytes),
        ("renderer_cameras", camera_bytes(cameras, values, envs, f) if rendering else 0),
    ]
    if rendering and f.render_base_bytes:
        out.insert(1, ("renderer_base", f.render_base_bytes))
    if not spec.headless and f.viewport_bytes:
        out.append(("viewport", f.viewport_bytes))
    if spec.ray_casters:
        out.append(("ray_casters", ray_caster_bytes(spec.ray_casters, values, envs)))
    return out


def simulator_notes(spec: SimulatorSpec) -> list[str]:
    """What a plan with this simulator says about its figures."""
    f = spec.figures()
    name = spec.name or spec.preset
    parts = [f"{format_bytes(f.base_bytes)} at start"]
    if f.render_base_bytes:
        parts.append(f"{format_bytes(f.render_base_bytes)} more with rendering on")
    parts.append(f"{format_bytes(f.per_env_bytes)} per env")
    if f.pixel_bytes:
        parts.append(
            f"{f.pixel_bytes + f.shared_pixel_bytes:,.0f} B per tiled camera pixel "
            f"(x{f.standard_factor:g} for a standard camera)"
        )
    source = spec.source or PRESETS[spec.preset]
    note = f"simulator {name}" + (f" on {spec.gpu}" if spec.gpu else "") + ": "
    note += ", ".join(parts) + f" ({source}); outside the framework's allocator"
    return [note, *(f"simulator: {n}" for n in [*f.notes, *_unmeasured(spec)])]


def _unmeasured(spec: SimulatorSpec) -> list[str]:
    """What the plan counts without a reading behind it (the conservative figure)."""
    if spec.preset != "isaac_sim":
        return []
    out = []
    cams = spec.cameras or []
    kinds = sorted({t for c in cams for t in c.data_types if t not in DATA_TYPES_MEASURED})
    if kinds:
        out.append(
            f"no reading of {', '.join(kinds)}: each counted as a whole first data type "
            "(the conservative figure)"
        )
    if any(c.kind == "standard" for c in cams):
        out.append(
            "standard cameras: one reading sizes them (a 640x480 camera lift task, about 21 GB)"
        )
    if spec.ray_casters:
        out.append(
            "ray casters: counted from Isaac Lab's source (float32 buffers per ray), no reading"
        )
    if not spec.headless:
        out.append(f"the GUI's viewport: {viewport_on(spec.gpu)[1]}")
    return out
