"""memfit's simulator figures fitted on the calibration readings of
``tests/data/published_truth/simulators/`` (and only on them): ``bench/simulator_fit.py``
prints them (its docstring says how each is obtained); tests/core/test_simulator_truth.py
checks that memfit.core.simulator_figures holds them."""

from __future__ import annotations

from typing import Any

import numpy as np
import simulator_readings as truth


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
