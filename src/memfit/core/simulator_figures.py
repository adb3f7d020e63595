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

The device figures are *after* the CUDA context and cuBLAS workspace memfit models itself:
a reading of ``total - free`` less those is what the simulator holds.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "CARD_FIGURES",
    "DATA_TYPES_MEASURED",
    "GENESIS",
    "RAY_BYTES",
    "ROBOT_PER_ENV",
    "SCENE_RULE",
    "SHARED",
    "VIEWPORT_CARD_BYTES",
    "CardFigures",
    "SceneRule",
    "SharedFigures",
    "card_figures",
    "viewport_on",
]


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
        base_bytes=2_270_071_000,
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
        base_bytes=2_131_933_000,
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
    viewport_bytes=3_362_695_000,
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
GENESIS = (1_585_291_000, 308_230)


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
