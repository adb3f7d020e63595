"""Fit memfit's simulator figures on the calibration readings (and only on them).

Every ``role: calibration`` run of ``tests/data/published_truth/simulators/`` is planned
without its simulator (the CUDA context, the learner, everything memfit models itself); what
the reading has beyond that is the simulator's. The figures follow in order, each from the
readings that isolate it:

1. per env of the cartpole: the slope of the state-only readings (the larger of the two
   cards'), and each card's base with rendering off: its smallest state-only reading less
   its environments;
2. each card's renderer base and bytes per pixel: the camera readings of one data type,
   least squares over ``render + pixel x (pixels of every render product) + shared x
   (pixels of the largest product)``, each product a square grid of tiles; a card with
   one camera per reading only takes the RTX 4090's split between the two;
3. what a further data type adds: the RGB+depth reading;
4. per env of the Franka arm: how its two readings differ from the cartpole's at the same
   settings (the same cameras, so only the scene differs);
5. the scene rule ``fixed + per_joint x joints``: through the cartpole (2 joints) and the
   Shadow Hand training run (24 joints);
6. the standard camera's factor: the camera lift reading;
7. the GUI viewport: the GUI reading;
8. Genesis: base and per env from its two calibration readings.

    python bench/simulator_fit.py       # prints the figures; memfit.core.simulator_figures
                                        # holds them (tests/core/test_simulator_truth.py
                                        # checks they agree)
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import simulator_truth as truth


def _residual(run: truth.Run) -> float:
    """What the reading holds beyond everything memfit models besides the simulator."""
    return run.measured_bytes - truth.plan_bytes(run, truth.workload_of(run, drop=True))


def _card(run: truth.Run) -> str:
    return str(truth.gpu_of(run).name)


def _products(run: truth.Run) -> tuple[float, float, int, int]:
    """``(sum of product pixels x type count, largest product, envs, measured types)`` of a
    run's tiled cameras, each product tiled as Isaac Lab tiles it."""
    from memfit.core.simulator import tiled_grid

    sim = run.workload["simulator"]
    envs = int(run.workload["settings"]["num_envs"])
    cols, rows = tiled_grid(envs)
    total = 0.0
    largest = 0
    types = 1
    for cam in sim.get("cameras") or []:
        product = cols * rows * int(cam["height"]) * int(cam["width"])
        total += int(cam.get("count", 1)) * product
        largest = max(largest, product)
        types = max(types, len(cam.get("data_types", ["rgb"])))
    return total, largest, envs, types


def fit() -> dict[str, Any]:
    """The figures, from the calibration readings."""
    runs = [r for r in truth.load_runs() if r.role == "calibration"]
    isaac = [r for r in runs if (r.workload.get("simulator") or {}).get("preset") == "isaac_sim"]
    state = [
        r for r in isaac if not r.workload["simulator"].get("cameras") and "cartpole" in r.name
    ]
    cards: dict[str, Any] = {}
    slopes = []
    by_card: dict[str, list[truth.Run]] = {}
    for r in state:
        by_card.setdefault(_card(r), []).append(r)
    for rs in by_card.values():
        rs.sort(key=lambda r: r.workload["settings"]["num_envs"])
        lo, hi = rs[0], rs[-1]
        n_lo, n_hi = lo.workload["settings"]["num_envs"], hi.workload["settings"]["num_envs"]
        slopes.append((_residual(hi) - _residual(lo)) / (n_hi - n_lo))
    cartpole = max(slopes)
    for card, rs in by_card.items():
        n = rs[0].workload["settings"]["num_envs"]
        cards[card] = {"base_bytes": _residual(rs[0]) - n * cartpole}
    # 2. renderer base and bytes per pixel, per card
    cams = [r for r in isaac if r.workload["simulator"].get("cameras") and "cartpole" in r.name]
    split = None
    for card in sorted(cards, key=lambda c: "4090" not in c):  # the RTX 4090 first
        rows, ys = [], []
        for r in cams:
            total, largest, envs, types = _products(r)
            if _card(r) != card or types != 1:
                continue
            rows.append([1.0, total, largest])
            ys.append(_residual(r) - cards[card]["base_bytes"] - envs * cartpole)
        a, y = np.array(rows), np.array(ys)
        if split is None:
            (render, pixel, shared), *_ = np.linalg.lstsq(a, y, rcond=None)
            split = shared / (pixel + shared)
        else:
            (render, both), *_ = np.linalg.lstsq(a[:, :2], y, rcond=None)
            pixel, shared = both * (1 - split), both * split
        cards[card].update(render_base_bytes=render, pixel_bytes=pixel, shared_pixel_bytes=shared)
    # 3. a further data type
    two = next(r for r in cams if _products(r)[3] == 2)
    f = cards[_card(two)]
    total, largest, envs, _ = _products(two)
    rest = _residual(two) - f["base_bytes"] - f["render_base_bytes"] - envs * cartpole
    rest -= f["shared_pixel_bytes"] * largest
    extra = (rest / total - f["pixel_bytes"]) / f["pixel_bytes"]
    # 4. the Franka arm
    franka = sorted(
        (r for r in isaac if "franka" in r.name), key=lambda r: r.workload["settings"]["num_envs"]
    )
    twins = [
        next(r for r in cams if r.name == f.name.replace("franka", "cartpole")) for f in franka
    ]
    n0, n1 = (r.workload["settings"]["num_envs"] for r in (franka[0], franka[-1]))
    gap0 = _residual(franka[0]) - _residual(twins[0])
    gap1 = _residual(franka[-1]) - _residual(twins[-1])
    franka_env = cartpole + (gap1 - gap0) / (n1 - n0)
    # 5. the scene rule, through the cartpole and the Shadow Hand
    shadow = next(r for r in isaac if "Shadow" in r.name)
    f = cards[_card(shadow)]
    n = shadow.workload["settings"]["num_envs"]
    shadow_env = (_residual(shadow) - f["base_bytes"]) / n
    joints = shadow.workload["simulator"]["scene"]["joints"]
    per_joint = (shadow_env - cartpole) / (joints - 2)
    fixed = cartpole - 2 * per_joint
    # 6. the standard camera
    lift = next(r for r in isaac if "camera lift" in r.name)
    f = cards[_card(lift)]
    cam = lift.workload["simulator"]["cameras"][0]
    n = lift.workload["settings"]["num_envs"]
    px = int(cam["height"]) * int(cam["width"])
    scene_env = fixed + per_joint * lift.workload["simulator"]["scene"]["joints"]
    rest = _residual(lift) - f["base_bytes"] - f["render_base_bytes"] - n * scene_env
    standard = (rest - f["shared_pixel_bytes"] * px) / (n * px * f["pixel_bytes"])
    # 7. the viewport, on a card without readings: the envelope's figures
    gui = next(r for r in isaac if r.workload["simulator"].get("headless") is False)
    base = max(c["base_bytes"] for c in cards.values())
    render = max(c["render_base_bytes"] for c in cards.values())
    scene_env = fixed + per_joint * gui.workload["simulator"]["scene"]["joints"]
    viewport = _residual(gui) - base - render - scene_env
    # 8. Genesis
    gen = sorted(
        (r for r in runs if (r.workload.get("simulator") or {}).get("preset") == "genesis"),
        key=lambda r: r.workload["settings"]["num_envs"],
    )
    g0, g1 = gen[0], gen[-1]
    n0, n1 = g0.workload["settings"]["num_envs"], g1.workload["settings"]["num_envs"]
    genesis_env = (_residual(g1) - _residual(g0)) / (n1 - n0)
    genesis_base = _residual(g0) - n0 * genesis_env
    return {
        "cards": cards,
        "robot_per_env": {"cartpole": cartpole, "franka": franka_env},
        "scene_rule": {"fixed_bytes": fixed, "per_joint_bytes": per_joint},
        "extra_type_fraction": extra,
        "standard_factor": standard,
        "viewport_bytes": viewport,
        "genesis": {"base_bytes": genesis_base, "per_env_bytes": genesis_env},
    }


def main() -> int:
    figures = fit()
    for card, f in figures["cards"].items():
        print(card)
        for k, v in f.items():
            print(f"    {k} = {v:,.2f}")
    for key in ("robot_per_env", "scene_rule", "genesis"):
        print(key, {k: f"{v:,.0f}" for k, v in figures[key].items()})
    for key in ("extra_type_fraction", "standard_factor", "viewport_bytes"):
        print(key, f"{figures[key]:,.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
