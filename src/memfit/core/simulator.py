"""A simulator and its renderer on the job's GPU: memory the framework's allocator never sees.

Isaac Lab runs Isaac Sim (PhysX and the RTX renderer) in the training process: the simulator
takes GPU memory at start, more per environment, and its cameras keep per-pixel render
buffers. None of it comes from PyTorch's caching allocator (an out-of-memory error can report
22 MiB reserved by torch while the renderer holds the card, isaac-sim/IsaacLab#173), so a plan
that models only the framework's tensors promises too much. A workload's ``simulator:``
section adds three terms, each outside the allocator (no allocator slack, and outside JAX's
pool):

* ``simulator_base``: the simulator and renderer at start (``base_bytes``);
* ``simulator_envs``: ``num_envs x per_env_bytes`` (physics state, per-env scene copies);
* ``renderer_cameras``: ``num_envs x cameras x height x width x per_camera_pixel_bytes``
  (render targets and annotator buffers per camera pixel), the cameras being those of
  ``observations.cameras``.

Presets give documented defaults, each overridable field by field:

* ``isaac_sim``: 3.5 GiB at start (3-4 GB of Isaac Sim and its renderer on the seed user's
  8 GB card, memfit issue 13), no per-env default (a simple scene's physics is small; give
  yours), and 1,800 bytes per camera pixel, all included: isaac-sim/IsaacLab#3917 puts 4096
  environments with one 64 x 64 depth camera each over a 32 GB RTX 5090, that is more than
  (32 GB - 3.5 GiB) / (4096 x 64 x 64) = 1.8 KB per pixel if the cameras take the rest
  (isaac-sim/IsaacLab#173 shows the same order: two cameras per environment stopped at 8
  environments on a 12 GB RTX 3060). A rough figure from one report: measure yours with
  ``memfit devices`` after the simulator starts, or let ``memfit.autoconfig`` read the device
  in the script.
* ``isaac_nurec``: Isaac Lab's own fit for a camera setup rendered with NuRec (PR #5793,
  measured on an RTX A6000): about 9 GB fixed + 1.3 GB x num_envs.

>>> spec = SimulatorSpec(preset="isaac_nurec")
>>> [(name, round(nbytes / 10**9, 1)) for name, nbytes in simulator_terms(spec, 4, None)]
[('simulator_base', 9.0), ('simulator_envs', 5.2), ('renderer_cameras', 0.0)]
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from memfit.units import GiB, parse_bytes

__all__ = ["PRESETS", "SimulatorSpec", "simulator_terms"]

#: Preset name -> (base_bytes, per_env_bytes, per_camera_pixel_bytes, source).
PRESETS: dict[str, tuple[int, int, int, str]] = {
    "isaac_sim": (
        round(3.5 * GiB),
        0,
        1800,
        "Isaac Sim + RTX renderer: 3.5 GiB at start (3-4 GB on an 8 GB card, memfit issue 13); "
        "~1,800 B per camera pixel, all included (isaac-sim/IsaacLab#3917: 4096 envs with a "
        "64x64 depth camera exceed 32 GB)",
    ),
    "isaac_nurec": (
        9 * 10**9,
        13 * 10**8,
        0,
        "Isaac Lab PR #5793: VRAM ~ 9 GB + 1.3 GB x num_envs for a NuRec-rendered camera "
        "setup (RTX A6000), with ~15% headroom advised",
    ),
    "custom": (0, 0, 0, "the workload's own figures"),
}


def _size(value: Any) -> Any:
    if isinstance(value, str):
        return parse_bytes(value)
    return value


class SimulatorSpec(BaseModel):
    """A simulator (and renderer) on the job's GPU, outside the framework's allocator.

    Attributes:
        preset: ``isaac_sim``, ``isaac_nurec`` or ``custom``: the defaults of the fields below.
        name: What it is, for reports.
        base_bytes: Device memory at start, before any environment.
        per_env_bytes: Device memory per environment.
        per_camera_pixel_bytes: Device memory per pixel of each camera of each environment.
        in_process: Whether it runs in the job's process (Isaac Lab: yes). Then
            ``memfit.autoconfig`` reads the device after it started and plans the rest.
        source: Where the figures come from (the preset's source when not given).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    preset: Literal["isaac_sim", "isaac_nurec", "custom"] = "custom"
    name: str | None = None
    base_bytes: int | None = Field(default=None, ge=0)
    per_env_bytes: int | None = Field(default=None, ge=0)
    per_camera_pixel_bytes: int | None = Field(default=None, ge=0)
    in_process: bool = True
    source: str | None = None

    _sizes = field_validator(
        "base_bytes", "per_env_bytes", "per_camera_pixel_bytes", mode="before"
    )(_size)

    def resolved(self) -> tuple[int, int, int, str]:
        """``(base, per_env, per_camera_pixel, source)`` with the preset's defaults filled in."""
        base, per_env, per_pixel, source = PRESETS[self.preset]
        return (
            base if self.base_bytes is None else self.base_bytes,
            per_env if self.per_env_bytes is None else self.per_env_bytes,
            per_pixel if self.per_camera_pixel_bytes is None else self.per_camera_pixel_bytes,
            self.source or source,
        )


def simulator_terms(
    spec: SimulatorSpec, num_envs: int, camera_pixels: int | None
) -> list[tuple[str, int]]:
    """The simulator's terms for ``num_envs`` environments whose cameras have
    ``camera_pixels`` pixels in all per environment (``None``: no cameras).

    Returns:
        ``[("simulator_base", b), ("simulator_envs", b), ("renderer_cameras", b)]``.
    """
    base, per_env, per_pixel, _source = spec.resolved()
    pixels = camera_pixels or 0
    return [
        ("simulator_base", base),
        ("simulator_envs", num_envs * per_env),
        ("renderer_cameras", num_envs * pixels * per_pixel),
    ]
