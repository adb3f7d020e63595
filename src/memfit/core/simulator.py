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

Isaac Lab 3 (Isaac Sim 6) names its physics backend and renderer: ``physics: physx | newton``
and ``renderer: rtx | newton_warp | ovrtx | none`` pick their own figure sets
(:data:`memfit.core.simulator_figures.LAB3_PHYSICS`, ``LAB3_RENDERERS``), as does a
``version`` naming Isaac Lab 3 or Isaac Sim 6; a section naming neither plans with the Isaac
Lab 1.x-2.x figures as before. Every figure carries its basis (fitted, measured, analytic,
assumed, given), band and source (:attr:`SimFigures.basis`, :func:`simulator_basis`), and a
camera job that does not fit with the RTX renderer is offered the Newton Warp renderer
(:func:`simulator_fallbacks`, planned by :mod:`memfit.core.plan`).

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
from pydantic_core import PydanticCustomError

from memfit._checks import too_large_int
from memfit.core.simulator_figures import (
    DATA_TYPES_MEASURED,
    GENESIS,
    LAB3_PHYSICS,
    LAB3_RENDERERS,
    LEGACY_BASIS,
    MEASURE_HINT,
    RAY_BYTES,
    ROBOT_PER_ENV,
    SCENE_RULE,
    SHARED,
    Basis,
    PhysicsFigures,
    card_figures,
    isaac_generation,
    viewport_on,
)
from memfit.units import format_bytes, parse_bytes

__all__ = [
    "PHYSICS",
    "PRESETS",
    "RENDERERS",
    "MeasuredSimulator",
    "RayCasterSpec",
    "SceneSpec",
    "SimCamera",
    "SimFigures",
    "SimulatorSpec",
    "simulator_basis",
    "simulator_fallbacks",
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

#: Isaac Lab 3's physics backends and renderers (``simulator.physics``, ``simulator.renderer``).
PHYSICS: dict[str, str] = {
    "physx": "PhysX through Isaac Sim (Kit): Isaac Lab's physics=isaacsim_physx",
    "newton": "Newton (MuJoCo-Warp), kit-less: Isaac Lab's physics=newton_mjwarp",
}
RENDERERS: dict[str, str] = {
    "rtx": "Isaac RTX inside Isaac Sim: renderer=isaacsim_rtx",
    "newton_warp": "Newton's Warp ray tracer, Newton physics only: renderer=newton_renderer",
    "ovrtx": "OVRTX, kit-less RTX: renderer=ovrtx",
    "none": "no renderer (no camera, headless)",
}
PhysicsName = Literal["physx", "newton"]
RendererName = Literal["rtx", "newton_warp", "ovrtx", "none"]

#: NuRec's figures (PR #5793, learner included): at start and per env.
_NUREC = (9 * 10**9, 13 * 10**8)


def _size(value: Any) -> Any:
    if isinstance(value, str):
        return parse_bytes(value)
    return value


class _Model(BaseModel):
    """Frozen, strict; no number is NaN or infinite and no integer 2**63 or more (as every
    workload model: a 23-digit camera height is an error here, not a plan)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _bounded_ints(cls, value: Any) -> Any:
        digits = too_large_int(value)
        if digits is not None:
            raise PydanticCustomError(
                "int_too_large",
                "a number of about {digits} digits; no count or size is 2**63 or more",
                {"digits": digits},
            )
        return value


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
        physics: The physics backend that ran (Isaac Lab 3: ``physx``, ``newton``).
        renderer: The renderer that ran (``rtx``, ``newton_warp``, ``ovrtx``, ``none``).
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
    physics: PhysicsName | None = None
    renderer: RendererName | None = None
    rendering: bool = False
    base_bytes: int = Field(ge=0)
    per_env_bytes: int = Field(ge=0)
    pixel_bytes: float | None = Field(default=None, ge=0)
    context_bytes: int = Field(default=0, ge=0)
    readings: list[dict[str, Any]] = Field(default_factory=list)
    taken: str | None = None


@dataclass(frozen=True)
class SimFigures:
    """The figures a plan uses, resolved for one card, with where each comes from.

    ``basis`` maps each term (``simulator_base``, ``renderer_base``, ``simulator_envs``,
    ``renderer_cameras``, ``viewport``) to how its figure was obtained
    (:class:`memfit.core.simulator_figures.Basis`); ``physics`` and ``renderer`` are the
    Isaac Lab 3 backend and renderer the figures are of (``None``: Isaac Lab 1.x-2.x).
    ``render_per_env_bytes`` is each env's share of the render scene (with rendering on);
    ``square_tiles`` whether a tiled camera's output is a square grid of tiles."""

    base_bytes: int
    render_base_bytes: int
    viewport_bytes: int
    per_env_bytes: int
    pixel_bytes: float
    shared_pixel_bytes: float
    extra_type_fraction: float
    standard_factor: float
    notes: tuple[str, ...] = field(default_factory=tuple)
    render_per_env_bytes: int = 0
    square_tiles: bool = True
    basis: Mapping[str, Basis] = field(default_factory=dict)
    physics: str | None = None
    renderer: str | None = None


class SimulatorSpec(_Model):
    """A simulator (and renderer) on the job's GPU, outside the framework's allocator.

    Attributes:
        preset: ``isaac_sim``, ``isaac_nurec``, ``genesis`` or ``custom``: where the figures
            not given here come from.
        name: What it is, for reports.
        version: The simulator's version (which measurement of the user's card applies;
            one naming Isaac Lab 3 or Isaac Sim 6 plans with Isaac Lab 3's figures).
        physics: Isaac Lab 3's physics backend: ``physx`` or ``newton``.
        renderer: Isaac Lab 3's renderer: ``rtx`` (Isaac RTX), ``newton_warp``, ``ovrtx``
            or ``none``. With neither (and no Isaac Lab 3 version) the Isaac Lab 1.x-2.x
            figures (PhysX and Isaac RTX) apply, as before.
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
    physics: PhysicsName | None = None
    renderer: RendererName | None = None
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

    @model_validator(mode="after")
    def _backends(self) -> SimulatorSpec:
        if self.physics is None and self.renderer is None:
            return self
        if self.preset != "isaac_sim":
            raise ValueError(
                "physics and renderer are Isaac Lab 3's choices: use them with preset isaac_sim"
            )
        if self.renderer == "newton_warp" and self.physics == "physx":
            raise ValueError(
                "the Newton Warp renderer needs Newton physics (physics: newton; Isaac Lab: "
                "physics=newton_mjwarp renderer=newton_renderer)"
            )
        if self.renderer == "none" and (self.cameras or self.rendering):
            raise ValueError(
                "renderer none renders no camera: drop cameras and rendering, or name a "
                "renderer (rtx, newton_warp, ovrtx)"
            )
        return self

    def lab3(self) -> bool:
        """Whether Isaac Lab 3's figures apply: ``physics`` or ``renderer`` named, or a
        version of Isaac Lab 3 / Isaac Sim 6; an Isaac Lab 1.x-2.x version with PhysX and
        Isaac RTX keeps the figures of those releases."""
        if self.preset != "isaac_sim":
            return False
        generation = isaac_generation(self.version)
        if generation == 2 and self.physics in (None, "physx") and self.renderer in (None, "rtx"):
            return False
        return generation == 3 or self.physics is not None or self.renderer is not None

    def backend(self) -> tuple[str, str]:
        """``(physics, renderer)`` the figures are of (unnamed: PhysX and Isaac RTX)."""
        return self.physics or "physx", self.renderer or "rtx"

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
        if self.lab3():
            return self._lab3_figures()
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
        basis = _preset_basis(self.preset)
        figs = _Figs(base, render, per_env, pixel, scratch)
        self._apply_measured(figs, basis, notes)
        self._apply_given(figs, basis)
        return SimFigures(
            base_bytes=figs.base,
            render_base_bytes=figs.render,
            viewport_bytes=viewport,
            per_env_bytes=figs.per_env,
            pixel_bytes=figs.pixel,
            shared_pixel_bytes=figs.scratch,
            extra_type_fraction=shared.extra_type_fraction,
            standard_factor=shared.standard_factor,
            notes=tuple(notes),
            basis=basis,
        )

    def _apply_measured(self, figs: _Figs, basis: dict[str, Basis], notes: list[str]) -> None:
        """The measurement of this card (and, for Isaac Lab 3, this backend), when there is
        one: it replaces the figures it measured."""
        m = self.measured
        if m is None:
            return
        if self.gpu is None or m.gpu != self.gpu:
            notes.append(
                f"the measurement of {m.gpu} is not used for {self.gpu or 'an unnamed card'}"
            )
            return
        physics, renderer = self.backend()
        if (m.physics or "physx") != physics or (m.rendering and (m.renderer or "rtx") != renderer):
            notes.append(
                f"the measurement of {m.physics or 'physx'} with {m.renderer or 'rtx'} is not "
                f"used for {physics} with {renderer}"
            )
            return
        figs.base = m.base_bytes
        figs.render = 0 if m.rendering else figs.render
        figs.per_env = m.per_env_bytes
        where = f"measured on {m.gpu}" + (f" ({m.version})" if m.version else "")
        mine = Basis("measured", (-0.1, 0.1), where)
        basis.update(simulator_base=mine, simulator_envs=mine)
        if m.rendering:
            basis["renderer_base"] = mine
        if m.pixel_bytes is not None:
            figs.pixel, figs.scratch = m.pixel_bytes, 0.0
            basis["renderer_cameras"] = mine
        notes.append(where)

    def _apply_given(self, figs: _Figs, basis: dict[str, Basis]) -> None:
        """The section's own figures, over every other."""
        given = Basis("given", (0.0, 0.0), "the workload's simulator section")
        if self.base_bytes is not None:
            figs.base = self.base_bytes
            basis["simulator_base"] = given
        if self.render_base_bytes is not None:
            figs.render = self.render_base_bytes
            basis["renderer_base"] = given
        if self.per_env_bytes is not None:
            figs.per_env = self.per_env_bytes
            basis["simulator_envs"] = given
        if self.per_camera_pixel_bytes is not None:
            figs.pixel, figs.scratch = float(self.per_camera_pixel_bytes), 0.0
            basis["renderer_cameras"] = given

    def _lab3_figures(self) -> SimFigures:
        """Isaac Lab 3's figures for this backend, renderer and card."""
        notes: list[str] = []
        physics, renderer = self.backend()
        generation = isaac_generation(self.version)
        if generation is None:
            notes.append(
                "version not given: Isaac Lab 3.0's figures (the release with physics and "
                "renderer choices)"
            )
        elif generation == 2:
            notes.append(
                f"{self.version} has no {physics} physics with {renderer}: Isaac Lab 3.0's figures"
            )
        phys = LAB3_PHYSICS[physics]
        rend = LAB3_RENDERERS[renderer]
        card = card_figures(self.gpu)
        render = (
            card.render_base_bytes if rend.render_base_bytes is None else rend.render_base_bytes
        )
        pixel = card.pixel_bytes if rend.pixel_bytes is None else rend.pixel_bytes
        scratch = (
            card.shared_pixel_bytes if rend.shared_pixel_bytes is None else rend.shared_pixel_bytes
        )
        basis: dict[str, Basis] = {
            "simulator_base": phys.basis,
            "simulator_envs": phys.basis,
            "renderer_base": rend.basis,
            "renderer_cameras": rend.basis,
            "viewport": _VIEWPORT_BASIS,
        }
        if renderer == "rtx" and physics == "newton":
            kit = LAB3_PHYSICS["physx"].base_bytes
            render += kit
            notes.append(
                f"Isaac RTX with Newton physics runs Isaac Sim (Kit): {format_bytes(kit)} of "
                "the PhysX arm's base counted for Kit (the readings do not split Kit from "
                "PhysX's buffers)"
            )
        if renderer in ("rtx", "ovrtx") and card.card is None and self._renders():
            notes.append(
                f"no reading of the RTX renderer on {self.gpu or 'this card'}: the "
                f"conservative figures ({card.source})"
            )
        if renderer in ("ovrtx", "newton_warp") and self._renders():
            notes.append(f"{renderer}: {rend.basis.source}; {MEASURE_HINT}")
        if self.renderer is None and self._renders():
            notes.append(
                "renderer not named: Isaac RTX counted; name simulator.renderer (rtx, "
                "newton_warp, ovrtx)"
            )
        figs = _Figs(phys.base_bytes, render, self._lab3_per_env(phys, notes), pixel, scratch)
        self._apply_measured(figs, basis, notes)
        self._apply_given(figs, basis)
        return SimFigures(
            base_bytes=figs.base,
            render_base_bytes=figs.render,
            viewport_bytes=SHARED.viewport_bytes,
            per_env_bytes=figs.per_env,
            pixel_bytes=figs.pixel,
            shared_pixel_bytes=figs.scratch,
            extra_type_fraction=(
                SHARED.extra_type_fraction
                if rend.extra_type_fraction is None
                else rend.extra_type_fraction
            ),
            standard_factor=(
                SHARED.standard_factor if rend.standard_factor is None else rend.standard_factor
            ),
            notes=tuple(notes),
            render_per_env_bytes=rend.per_env_bytes,
            square_tiles=rend.square_tiles,
            basis=basis,
            physics=physics,
            renderer=renderer,
        )

    def _renders(self) -> bool:
        """Whether this section alone says the renderer runs (its cameras, a GUI, or
        ``rendering: true``); observation cameras are known to :func:`simulator_terms`."""
        if self.renderer == "none" or self.rendering is False:
            return False
        return bool(self.cameras) or not self.headless or bool(self.rendering)

    def _lab3_per_env(self, phys: PhysicsFigures, notes: list[str]) -> int:
        """The backend's per-env figure for this scene: the reference scene's (the Go2),
        scaled by the Isaac Lab 1.x scene rule's ratio of this scene to it."""
        reference = SCENE_RULE.per_env(phys.reference_joints)
        if self.scene is not None and self.scene.robot is not None:
            scene = ROBOT_PER_ENV[self.scene.robot]
        elif self.scene is not None and self.scene.joints is not None:
            scene = SCENE_RULE.per_env(self.scene.joints)
        else:
            scene = SHARED.default_per_env_bytes
            if self.per_env_bytes is None:
                notes.append(
                    "per-env memory of an undescribed scene: the largest measured scene's "
                    "ratio to the Go2; give scene: {joints: N} or per_env_bytes"
                )
        return round(phys.per_env_bytes * scene / reference)

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


@dataclass
class _Figs:
    """The figures being resolved (mutable while measured and given ones replace them)."""

    base: int
    render: int
    per_env: int
    pixel: float
    scratch: float


#: The GUI viewport's figure: one rough reading.
_VIEWPORT_BASIS = Basis(
    "fitted",
    (-0.5, 0.5),
    "one rough reading: unitree_rl_lab #22 (one env with the GUI, about 9 GB)",
    MEASURE_HINT,
)


def _preset_basis(preset: str) -> dict[str, Basis]:
    """How the figures of a preset (Isaac Lab 1.x-2.x for ``isaac_sim``) were obtained."""
    if preset == "isaac_sim":
        basis = LEGACY_BASIS
    elif preset == "isaac_nurec":
        basis = Basis(
            "fitted",
            (-0.15, 0.15),
            PRESETS["isaac_nurec"],
            MEASURE_HINT,
        )
    elif preset == "genesis":
        basis = Basis("fitted", (-0.25, 0.25), PRESETS["genesis"], MEASURE_HINT)
    else:
        basis = Basis("given", (0.0, 0.0), "the workload's simulator section")
    out = {
        name: basis
        for name in ("simulator_base", "renderer_base", "simulator_envs", "renderer_cameras")
    }
    out["viewport"] = _VIEWPORT_BASIS
    return out


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
    cols, rows = tiled_grid(num_envs) if figures.square_tiles else (num_envs, 1)
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
    if spec.renderer == "none":
        rendering = False
    drawn = (
        camera_bytes(cameras, values, envs, f) + envs * f.render_per_env_bytes if rendering else 0
    )
    out = [
        ("simulator_base", f.base_bytes),
        ("simulator_envs", envs * f.per_env_bytes),
        ("renderer_cameras", drawn),
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
    if f.physics is not None:
        name += f", {f.physics} physics, {f.renderer} renderer"
        source = spec.source or _lab3_source(f)
    note = f"simulator {name}" + (f" on {spec.gpu}" if spec.gpu else "") + ": "
    note += ", ".join(parts) + f" ({source}); outside the framework's allocator"
    return [note, *(f"simulator: {n}" for n in [*f.notes, *_unmeasured(spec)])]


def _lab3_source(f: SimFigures) -> str:
    """Where Isaac Lab 3's figures come from, by basis."""
    kinds = {b.kind for b in f.basis.values() if b.kind != "analytic"}
    what = "Isaac Lab 3.0 figures"
    if kinds:
        what += ": " + ", ".join(sorted(kinds))
    return what + "; see memfit simulator --gpu NAME --physics P --renderer R"


def simulator_basis(spec: SimulatorSpec) -> dict[str, Basis]:
    """How each simulator term's figure was obtained: ``{term: Basis}`` for
    ``simulator_base``, ``renderer_base``, ``simulator_envs``, ``renderer_cameras``,
    ``viewport`` (and ``ray_casters``, counted from Isaac Lab's source)."""
    out = dict(spec.figures().basis)
    out["ray_casters"] = Basis(
        "analytic", (0.0, 0.5), "Isaac Lab's ray casters: float32 buffers per ray, from its source"
    )
    return out


def simulator_fallbacks(spec: SimulatorSpec, observed: Any) -> list[tuple[str, dict[str, Any]]]:
    """What may make a camera job fit when it does not with the RTX renderer: the Newton
    Warp renderer (with Newton physics, which it needs), said with its basis. ``(label,
    changes)`` pairs, the changes a nested mapping over the workload."""
    if spec.preset != "isaac_sim" or spec.rendering is False:
        return []
    cameras = spec.cameras if spec.cameras is not None else _observed(observed)
    if not cameras or (spec.renderer or "rtx") not in ("rtx", "ovrtx"):
        return []
    basis = LAB3_RENDERERS["newton_warp"].basis
    label = (
        "Newton physics with the Newton Warp renderer (simulator.physics: newton, "
        f"simulator.renderer: newton_warp; Isaac Lab 3; its figures {basis.kind}, not measured:"
        " measure yours with memfit.integrations.isaaclab.measure)"
    )
    return [(label, {"simulator": {"physics": "newton", "renderer": "newton_warp"}})]


def _unmeasured(spec: SimulatorSpec) -> list[str]:
    """What the plan counts without a reading behind it (the conservative figure)."""
    if spec.preset != "isaac_sim":
        return []
    out = []
    rtx = spec.backend()[1] in ("rtx", "ovrtx")
    cams = (spec.cameras or []) if rtx else []
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
