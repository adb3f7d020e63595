"""Isaac Lab 3's physics figures fitted on the calibration readings of
``tests/data/published_truth/simulators/isaaclab3/`` (and only on them):
``bench/simulator_lab3.py`` prints them with the held-out table; tests/core/
test_simulator_lab3.py checks memfit.core.simulator_figures.LAB3_PHYSICS against them."""

from __future__ import annotations

import simulator_readings as truth

DATA = truth.DATA / "isaaclab3"


def load_runs() -> list[truth.Run]:
    """Every Isaac Lab 3 run."""
    return truth.load_runs(DATA)


def _physics(run: truth.Run) -> str:
    return str(run.workload["simulator"].get("physics") or "physx")


def fit() -> dict[str, dict[str, float]]:
    """``{physics: {"base_bytes", "per_env_bytes"}}`` from the calibration runs (the
    reference scene's per-env figure; memfit scales it for other scenes)."""
    out: dict[str, dict[str, float]] = {}
    calibration = [r for r in load_runs() if r.role == "calibration"]
    for physics in sorted({_physics(r) for r in calibration}):
        runs = sorted(
            (r for r in calibration if _physics(r) == physics),
            key=lambda r: int(r.workload["settings"]["num_envs"]),
        )
        lo, hi = runs[0], runs[-1]
        n_lo = int(lo.workload["settings"]["num_envs"])
        n_hi = int(hi.workload["settings"]["num_envs"])
        r_lo = lo.measured_bytes - truth.plan_bytes(lo, truth.workload_of(lo, drop=True))
        r_hi = hi.measured_bytes - truth.plan_bytes(hi, truth.workload_of(hi, drop=True))
        per_env = (r_hi - r_lo) / (n_hi - n_lo)
        # a base below zero would say memfit's own CUDA context is larger than the process
        out[physics] = {"base_bytes": max(0.0, r_lo - n_lo * per_env), "per_env_bytes": per_env}
    return out
