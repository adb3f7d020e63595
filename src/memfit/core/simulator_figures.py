"""The simulator figures memfit plans with, each from the readings it was fitted on.

Every figure here comes from published device-memory readings transcribed with their source
into ``tests/data/published_truth/simulators/`` (role ``calibration``), fitted by
``bench/simulator_fit.py``; ``tests/core/test_simulator_truth.py`` checks that the figures
below are what that fit gives, and plans every other reading (role ``held_out``) against
its measured figure. The readings:

* ManiSkill3's benchmark of Isaac Lab 1.2.0 on an RTX 4090 (haosulab/ManiSkill,
  ``benchmarking_results/rtx_4090/isaac_lab.csv``): TiledCamera cartpole and Franka scenes,
  RGB, depth or both, 1-3 cameras per env, 80x80 to 640x480, 4 to 1024 envs;
* the same benchmark on an RTX 3080 Laptop GPU (16 GB; ``rtx_3080/isaac_lab.csv``): RGB
  cameras 80x80 to 512x512 and no camera at all, 4 to 8192 envs;
* Isaac Lab's cartpole without cameras on an RTX 4090, 4 to 16384 envs
  (google-deepmind/mujoco_playground, ``madrona_benchmarking/data/maniskill3``);
* Isaac Lab's performance benchmarks (RL Games and RSL-RL training runs);
* a camera lift task with a standard (non-tiled) 640x480 camera and a frozen ResNet-18
  (MuammerBay/isaac_so_arm101 PR #84);
* Genesis's Go2 locomotion example (Genesis-Embodied-AI/genesis-world #1740, #1914).

Isaac Lab 3 (Isaac Sim 6) names its physics backend (PhysX, Newton) and its renderer (Isaac
RTX, Newton Warp, OVRTX); :data:`LAB3_PHYSICS` and :data:`LAB3_RENDERERS` hold a figure set
for each, every figure with its :class:`Basis` (fitted, analytic, assumed), from the readings
in ``tests/data/published_truth/simulators/isaaclab3/`` (fitted by ``bench/simulator_lab3.py``
on the calibration readings; the held-out ones are planned against their reading) and, where
nothing is published, from Isaac Lab's source or an assumption with a wide band.

The device figures are *after* the CUDA context and cuBLAS workspace memfit models itself:
a reading of ``total - free`` less those is what the simulator holds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "CARD_FIGURES",
    "DATA_TYPES_MEASURED",
    "GENESIS",
    "LAB3_PHYSICS",
    "LAB3_RENDERERS",
    "LEGACY_BASIS",
    "RAY_BYTES",
    "ROBOT_PER_ENV",
    "SCENE_RULE",
    "SHARED",
    "VIEWPORT_CARD_BYTES",
    "Basis",
    "CardFigures",
    "PhysicsFigures",
    "RendererFigures",
    "SceneRule",
    "SharedFigures",
    "card_figures",
    "isaac_generation",
    "viewport_on",
]


BasisKind = Literal["fitted", "measured", "analytic", "assumed", "given"]


@dataclass(frozen=True)
class Basis:
    """How one figure was obtained, how far it may be off, and where it comes from.

    Attributes:
        kind: ``fitted`` (from published readings), ``measured`` (on the user's card),
            ``analytic`` (counted from the source code), ``assumed`` (nothing to fit or
            count), ``given`` (the workload's own number).
        band: ``(low, high)``, relative: the real figure is expected between
            ``value x (1 + low)`` and ``value x (1 + high)``.
        source: The readings, code or reason behind it.
        measure: How the user measures theirs (``None`` when the figure is theirs).
    """

    kind: BasisKind
    band: tuple[float, float]
    source: str
    measure: str | None = None


#: How to measure a simulator's figures on your card (said with every figure not measured).
MEASURE_HINT = (
    "measure yours: memfit.integrations.isaaclab.measure(make_env, points) in the script "
    "(or memfit.measure_simulator), or memfit simulator --gpu NAME --physics P --renderer R "
    "--reading num_envs=N[,camera=HxW]:USED ..."
)


@dataclass(frozen=True)
class PhysicsFigures:
    """What an Isaac Lab 3 physics backend holds (headless, no camera), its CUDA context not
    included.

    Attributes:
        physics: ``physx`` (Isaac Sim's PhysX through Kit) or ``newton`` (Warp, kit-less).
        versions: The versions the readings were taken with.
        base_bytes: At start, before any environment.
        per_env_bytes: Per environment of the reference scene.
        reference_joints: The reference scene's joints (other scenes scale by the Isaac
            Lab 1.x scene rule's ratio).
        basis: How the figures were obtained.
    """

    physics: str
    versions: str
    base_bytes: int
    per_env_bytes: int
    reference_joints: int
    basis: Basis


@dataclass(frozen=True)
class RendererFigures:
    """What an Isaac Lab 3 renderer adds: ``None`` figures are the card's Isaac RTX figures
    (:data:`CARD_FIGURES`).

    Attributes:
        renderer: ``rtx``, ``newton_warp``, ``ovrtx`` or ``none``.
        render_base_bytes: Before any pixel.
        pixel_bytes: Per pixel of every camera's output, first data type.
        shared_pixel_bytes: Per pixel of the largest render product, once.
        extra_type_fraction: Each further data type, as a fraction of ``pixel_bytes``.
        standard_factor: A standard camera's bytes per pixel over a tiled camera's.
        per_env_bytes: The env's share of the render scene.
        square_tiles: Whether the output is a square grid of tiles (Isaac RTX's render
            product) rather than exactly one image per env.
        basis: How the figures were obtained.
    """

    renderer: str
    render_base_bytes: int | None
    pixel_bytes: float | None
    shared_pixel_bytes: float | None
    extra_type_fraction: float | None
    standard_factor: float | None
    per_env_bytes: int
    square_tiles: bool
    basis: Basis


@dataclass(frozen=True)
class CardFigures:
    """What Isaac Sim holds on one card (or, ``card=None``, on a card without readings).

    Attributes:
        card: The catalog name of the card the readings were taken on; ``None`` for the
            conservative envelope over every card with readings.
        base_bytes: The simulator at start with rendering off (PhysX, Kit, Isaac Lab's
            buffers), its CUDA context not included.
        render_base_bytes: What turning the renderer on adds before any pixel (RTX
            renderer, its scene, the first render product's fixed part).
        pixel_bytes: Bytes per pixel of each tiled camera's render product, for its first
            data type (render targets, annotator buffers, Isaac Lab's output tensors and
            the observation's copy).
        shared_pixel_bytes: Bytes per pixel of the largest render product only: scratch
            the renderer sizes for the biggest product and shares between products.
        versions: The simulator versions the readings were taken with.
        source: The readings.
    """

    card: str | None
    base_bytes: int
    render_base_bytes: int
    pixel_bytes: float
    shared_pixel_bytes: float
    versions: str
    source: str


@dataclass(frozen=True)
class SceneRule:
    """Per-env physics bytes by scene size: ``fixed + per_joint x joints``.

    Fitted through the cartpole (2 joints, the state-only readings) and the Shadow Hand
    (24 joints, what Isaac Lab's RL Games benchmark leaves after memfit's own model of the
    rest of the run); checked on the G1 humanoid (37 joints) of the same table.
    """

    fixed_bytes: int
    per_joint_bytes: int
    source: str

    def per_env(self, joints: int) -> int:
        """Per-env bytes of a scene with ``joints`` joints."""
        return self.fixed_bytes + self.per_joint_bytes * joints


@dataclass(frozen=True)
class SharedFigures:
    """Figures that no reading shows to depend on the card.

    Attributes:
        extra_type_fraction: What each further measured data type of a camera adds, as a
            fraction of ``pixel_bytes`` (RGB and depth together on the RTX 4090).
        standard_factor: A standard camera's bytes per pixel as a multiple of a tiled
            camera's (each standard camera is its own render product with its own
            annotators), from the camera lift reading.
        viewport_bytes: The GUI viewport of a run that is not headless.
        default_per_env_bytes: Per-env bytes of a scene nobody described: the largest
            per-env figure measured (the Franka arm with rendering on).
    """

    extra_type_fraction: float
    standard_factor: float
    viewport_bytes: int
    default_per_env_bytes: int
    source: str


#: Data types with readings: the first of a camera costs ``pixel_bytes``, each further one
#: ``extra_type_fraction`` of it. Other types (segmentation, normals, motion vectors) have no
#: reading and are counted at a whole ``pixel_bytes`` each, the conservative figure.
DATA_TYPES_MEASURED = frozenset(
    {"rgb", "rgba", "depth", "distance_to_image_plane", "distance_to_camera"}
)

#: Bytes per ray of Isaac Lab's ray casters, counted from its source (no reading):
#: ``(persistent, transient)``. ``RayCaster`` keeps ray starts, directions and hits (float32
#: xyz each) and the hit distances; an update builds the repeated orientation (xyzw), the
#: world-frame starts and directions and the mesh query's hits and distances.
#: ``RayCasterCamera`` keeps starts, directions and hits; its update adds the image-plane
#: depth's temporaries; each output data type is its own (N, H, W, C) float32 tensor.
RAY_BYTES: dict[str, tuple[int, int]] = {"rays": (40, 60), "camera": (36, 100)}

# --- fitted by bench/simulator_fit.py from the calibration readings (do not edit by hand) ---

#: Per-env bytes of the scenes with readings.
ROBOT_PER_ENV: dict[str, int] = {
    "cartpole": 135_713,  # the state-only readings' slope (the larger card's)
    "franka": 676_914,  # with rendering on: the arm's render scene included
}

CARD_FIGURES: dict[str | None, CardFigures] = {
    "NVIDIA GeForce RTX 4090": CardFigures(
        card="NVIDIA GeForce RTX 4090",
        base_bytes=2_075_036_000,
        render_base_bytes=2_886_614_000,
        pixel_bytes=175.73,
        shared_pixel_bytes=47.58,
        versions="Isaac Lab 1.2.0 (Isaac Sim 4.2.0) with cameras; Isaac Lab 1.x without",
        source="ManiSkill3's benchmark on an RTX 4090 (haosulab/ManiSkill "
        "benchmarking_results/rtx_4090/isaac_lab.csv); MuJoCo Playground's state-only "
        "readings (madrona_benchmarking/data/maniskill3/isaac_lab_state.csv)",
    ),
    "NVIDIA GeForce RTX 3080 Laptop GPU": CardFigures(
        card="NVIDIA GeForce RTX 3080 Laptop GPU",
        base_bytes=2_188_556_000,
        render_base_bytes=1_808_008_000,
        pixel_bytes=300.15,
        shared_pixel_bytes=81.27,
        versions="Isaac Lab 1.x (not stated; before 1.2.0)",
        source="ManiSkill3's benchmark on an RTX 3080 Laptop GPU, 16 GB (haosulab/ManiSkill "
        "benchmarking_results/rtx_3080/isaac_lab.csv)",
    ),
}

#: Per-env bytes by joint count, through the cartpole and the Shadow Hand.
SCENE_RULE = SceneRule(
    fixed_bytes=114_672,
    per_joint_bytes=10_521,
    source="the cartpole (2 joints, state-only readings) and the Shadow Hand (24 joints, "
    "Isaac Lab's RL Games benchmark, 8192 envs, 6.4 GB)",
)

SHARED = SharedFigures(
    extra_type_fraction=0.163,
    standard_factor=3.25,
    viewport_bytes=3_437_918_000,
    default_per_env_bytes=676_914,
    source="a further data type: RGB+depth on the RTX 4090 (ManiSkill3); the standard "
    "camera: isaac_so_arm101 PR #84 (70 envs, one 640x480 camera, about 21 GB); the "
    "viewport: unitree_rl_lab #22 (one env with the GUI, about 9 GB on an RTX 3080)",
)

#: The card the viewport's one reading was taken on (an RTX 3080, 10 GB: 10240 MiB).
VIEWPORT_CARD_BYTES = 10240 * 2**20


def _card_total(card: str | None) -> int | None:
    """A card's memory from its catalog name, or from an anonymous card's name (``GPU with
    8192MiB``); ``None`` when neither says."""
    if card is None:
        return None
    import re

    from memfit.errors import ConfigError
    from memfit.hardware.catalog import gpu

    try:
        return gpu(card).total_bytes
    except ConfigError:
        found = re.fullmatch(r"GPU with (\d+)MiB", card.strip())
        return int(found.group(1)) * 2**20 if found else None


def viewport_on(card: str | None) -> tuple[int, str]:
    """The GUI viewport's bytes on ``card``, and what the figure rests on.

    One reading sizes it (:data:`SHARED`: one env with the GUI on an RTX 3080, 10 GB). On a
    card as large or larger the reading is used as it is. On a smaller card it is not a
    fixed cost: the RTX renderer sizes its caches to the memory there is (the reading
    filled nine tenths of its card), and NVIDIA lists an 8 GB RTX 3070 as Isaac Sim 4.x's
    minimum card, GUI included; the figure is taken in proportion to the card's memory, an
    assumption no reading on a smaller card checks.
    """
    total = _card_total(card)
    reading = SHARED.viewport_bytes
    basis = (
        f"one reading on a larger card (unitree_rl_lab #22: one env with the GUI, about 9 GB "
        f"in use on an RTX 3080, 10 GB): {reading / 2**30:.2f} GiB there"
    )
    if total is None or total >= VIEWPORT_CARD_BYTES:
        if total is None:
            return reading, basis
        return reading, basis.replace("on a larger card", "on another card")
    scaled = round(reading * total / VIEWPORT_CARD_BYTES)
    return scaled, (
        f"{basis}; taken in proportion to this card's memory ({scaled / 2**30:.2f} GiB), as "
        "the renderer sizes its caches to the card (an assumption: no reading on a card this "
        "small; NVIDIA lists the 8 GB RTX 3070 as Isaac Sim 4.x's minimum); measure yours "
        "with memfit.measure_simulator, GUI on"
    )


#: Genesis (Go2 locomotion example, RSL-RL): base after the CUDA context, and per env.
GENESIS = (1_578_999_000, 308_230)


def _envelope() -> CardFigures:
    """The conservative figures for a card without readings: the largest of each figure."""
    cards = [f for f in CARD_FIGURES.values() if f.card is not None]
    by_total = max(cards, key=lambda f: f.pixel_bytes + f.shared_pixel_bytes)
    return CardFigures(
        card=None,
        base_bytes=max(f.base_bytes for f in cards),
        render_base_bytes=max(f.render_base_bytes for f in cards),
        pixel_bytes=by_total.pixel_bytes,
        shared_pixel_bytes=by_total.shared_pixel_bytes,
        versions="; ".join(f"{f.card}: {f.versions}" for f in cards),
        source="the largest figure of the cards with readings ("
        + ", ".join(str(f.card) for f in cards)
        + ")",
    )


def card_figures(card: str | None) -> CardFigures:
    """The figures of ``card`` (a catalog name), or the conservative envelope when no
    reading was taken on it."""
    found = CARD_FIGURES.get(card) if card is not None else None
    return found if found is not None else _envelope()


#: The bands of the Isaac Lab 1.x-2.x figures: the held-out readings of
#: ``bench/simulator_truth.py`` meet a worst |error| of 25% (the goal; docs/benchmarks.md).
LEGACY_BASIS = Basis(
    kind="fitted",
    band=(-0.25, 0.25),
    source="published readings of Isaac Lab 1.x-2.x (Isaac Sim 4.x), fitted by "
    "bench/simulator_fit.py; held-out worst |error| 25%",
    measure=MEASURE_HINT,
)

# --- Isaac Lab 3: fitted by bench/simulator_lab3.py from the calibration readings ---

_LAB3_VERSIONS = "Isaac Lab 3.0.0, Isaac Sim 6.0.0, Newton 1.0.0 (torch 2.10, CUDA 12.8)"
_GO2 = (
    "newton-physics/newton discussion #3331 (yusufdxb/physx-newton-bench): Go2 flat "
    "velocity task, per-process VRAM at 256 and 4096 envs (calibration), a consumer "
    "Blackwell card"
)

LAB3_PHYSICS: dict[str, PhysicsFigures] = {
    "physx": PhysicsFigures(
        physics="physx",
        versions=_LAB3_VERSIONS,
        base_bytes=1_679_329_000,
        per_env_bytes=300_919,
        reference_joints=12,
        # the source: single probes are noisy at the +-10% level
        basis=Basis("fitted", (-0.1, 0.1), _GO2 + "; PhysX's stock GPU buffers", MEASURE_HINT),
    ),
    "newton": PhysicsFigures(
        physics="newton",
        versions=_LAB3_VERSIONS,
        base_bytes=0,  # the process is smaller than the CUDA context memfit models
        per_env_bytes=71_543,
        reference_joints=12,
        basis=Basis(
            "fitted",
            (-0.1, 0.1),
            _GO2 + "; MJWarp's stock njmax=65, nconmax=35 per env",
            MEASURE_HINT,
        ),
    ),
}

#: Isaac Lab 3's renderers. Isaac RTX has no Isaac Sim 6 reading: the card's Isaac Sim 4.2
#: figures, carried over. OVRTX has none either: Isaac Lab's docs say it "uses more VRAM
#: than Newton Warp"; the card's Isaac RTX figures are assumed. Newton Warp writes straight
#: into Isaac Lab's camera outputs (isaaclab_newton/renderers/newton_warp_renderer.py): 4 B
#: per RGBA pixel, 4 B per depth pixel, and the observation term's float32 copy (12 B for
#: RGB, 4 B for depth), one image per env (no square render product); its BVH and scene
#: have no reading and are assumed.
LAB3_RENDERERS: dict[str, RendererFigures] = {
    "rtx": RendererFigures(
        renderer="rtx",
        render_base_bytes=None,
        pixel_bytes=None,
        shared_pixel_bytes=None,
        extra_type_fraction=None,
        standard_factor=None,
        per_env_bytes=0,
        square_tiles=True,
        basis=Basis(
            "fitted",
            (-0.25, 0.5),
            "Isaac RTX's figures of the card, fitted on Isaac Sim 4.2 readings (ManiSkill3's "
            "benchmark); no Isaac Sim 6 reading: carried over, the band widened",
            MEASURE_HINT,
        ),
    ),
    "ovrtx": RendererFigures(
        renderer="ovrtx",
        render_base_bytes=None,
        pixel_bytes=None,
        shared_pixel_bytes=None,
        extra_type_fraction=None,
        standard_factor=None,
        per_env_bytes=0,
        square_tiles=True,
        basis=Basis(
            "assumed",
            (-0.5, 1.0),
            "no reading of OVRTX: Isaac RTX's figures of the card assumed (Isaac Lab 3's "
            "docs: OVRTX uses more VRAM than Newton Warp)",
            MEASURE_HINT,
        ),
    ),
    "newton_warp": RendererFigures(
        renderer="newton_warp",
        render_base_bytes=512 * 2**20,
        pixel_bytes=16.0,
        shared_pixel_bytes=0.0,
        extra_type_fraction=0.5,
        standard_factor=1.0,
        per_env_bytes=64 * 2**10,
        square_tiles=False,
        basis=Basis(
            "assumed",
            (-0.75, 1.0),
            "Newton Warp: per pixel counted from Isaac Lab's source (4 B RGBA output and "
            "the observation's 12 B float32 copy; depth 4 + 4 B); its BVH and scene (512 MiB "
            "and 64 KiB per env) assumed, no reading",
            MEASURE_HINT,
        ),
    ),
    "none": RendererFigures(
        renderer="none",
        render_base_bytes=0,
        pixel_bytes=0.0,
        shared_pixel_bytes=0.0,
        extra_type_fraction=0.0,
        standard_factor=1.0,
        per_env_bytes=0,
        square_tiles=False,
        basis=Basis("analytic", (0.0, 0.0), "no renderer: nothing rendered"),
    ),
}


def isaac_generation(version: str | None) -> int | None:
    """3 for a version naming Isaac Lab 3+ or Isaac Sim 6+, 2 for an earlier one, ``None``
    when the text names neither (``"isaaclab 2.3.0"`` -> 2, ``"isaacsim 6.0"`` -> 3)."""
    if not version:
        return None
    text = version.lower()
    lab = re.search(r"isaac[\s_-]?lab\D{0,3}?(\d+)", text)
    if lab is not None:
        return 3 if int(lab.group(1)) >= 3 else 2
    sim = re.search(r"isaac[\s_-]?sim\D{0,3}?(\d+)", text)
    if sim is not None:
        major = int(sim.group(1))
        return 3 if 6 <= major < 2000 else 2
    return None
