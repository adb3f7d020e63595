"""memfit's CUDA context for each reading of ``tests/data/published_truth/cuda_context/``
and its error: ``bench/context_truth.py`` writes the table, tests/hardware/test_context_truth.py
checks it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from memfit.hardware.catalog import gpu
from memfit.hardware.runtime import (
    cuda_context,
    lazy_started_context,
    parse_runtime,
    resident_threads,
)

MiB = 2**20
#: The grain the fitted bytes per resident thread is rounded to.
PER_THREAD_GRAIN = 256
DATA = (
    Path(__file__).resolve().parents[1]
    / "data"
    / "published_truth"
    / "cuda_context"
    / "readings.yaml"
)


def load() -> dict[str, list[dict[str, Any]]]:
    """The readings, by part."""
    data: dict[str, list[dict[str, Any]]] = yaml.safe_load(DATA.read_text(encoding="utf-8"))
    return data


def predict(reading: dict[str, Any]) -> int | None:
    """memfit's context for the reading's card, runtime and state, in bytes (``None``: the
    source does not name the card)."""
    setup = reading["setup"]
    if setup.get("gpu") is None:
        return None
    runtime = parse_runtime(setup["runtime"]) if setup.get("runtime") else None
    kernels = reading["state"] == "step"
    return cuda_context(
        gpu(setup["gpu"]), runtime, kernels=kernels, framework=framework(reading)
    ).bytes


def framework(reading: dict[str, Any]) -> str:
    """The reading's process's framework (``torch`` when the setup names none)."""
    return str(reading["setup"].get("framework", "torch"))


def rows(part: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each reading with its prediction and error (``None`` where not compared)."""
    out = []
    for reading in part:
        real = round(float(reading["value"]) * int(reading["unit_bytes"]))
        pred = predict(reading)
        source = reading["source"]
        out.append(
            {
                "id": reading["id"],
                "framework": framework(reading),
                "state": reading["state"],
                "gpu": reading["setup"].get("gpu"),
                "measured_mib": real / MiB,
                "predicted_mib": None if pred is None else pred / MiB,
                "error": None if pred is None else (pred - real) / real,
                "source": source.get("url") or source["quoted"].split(":")[0],
            }
        )
    return out


def _bytes(reading: dict[str, Any]) -> int:
    return round(float(reading["value"]) * int(reading["unit_bytes"]))


def started_points(part: list[dict[str, Any]]) -> list[tuple[str, int, int]]:
    """``(id, resident threads, bytes)`` of each reading of a started context (``init``) on a
    named card whose SM count memfit knows, JAX processes left out (a JAX backend holds a
    context on every visible card, with peer access between them)."""
    out = []
    for reading in part:
        setup = reading["setup"]
        if reading["state"] != "init" or setup.get("gpu") is None or framework(reading) == "jax":
            continue
        threads = resident_threads(gpu(setup["gpu"]))
        if threads is not None:
            out.append((str(reading["id"]), threads, _bytes(reading)))
    return out


def fit_started_context(part: list[dict[str, Any]]) -> dict[str, Any]:
    """The started context's rule fitted on ``part`` (the calibration part, only):
    ``bytes = base + resident threads x per_thread``.

    ``per_thread`` is the least-squares slope of the readings' bytes against their cards'
    resident threads, rounded to :data:`PER_THREAD_GRAIN`; ``base`` the largest residual
    left over it, rounded up to a MiB, so that no calibration reading is under-predicted.
    """
    points = started_points(part)
    if len(points) < 2:
        raise ValueError("fitting the started context needs two readings on named cards")
    n = len(points)
    mx = sum(x for _, x, _ in points) / n
    my = sum(y for _, _, y in points) / n
    sxx = sum((x - mx) ** 2 for _, x, _ in points)
    sxy = sum((x - mx) * (y - my) for _, x, y in points)
    slope = sxy / sxx
    per_thread = round(slope / PER_THREAD_GRAIN) * PER_THREAD_GRAIN
    residual = max(y - x * per_thread for _, x, y in points)
    base = max(0, -(-residual // MiB)) * MiB
    return {
        "points": points,
        "slope_bytes_per_thread": slope,
        "intercept_bytes": my - slope * mx,
        "per_thread": per_thread,
        "base": base,
    }


def fit_kernel_images(part: list[dict[str, Any]]) -> int:
    """torch's kernel images fitted on ``part``'s step readings (the H100 capture): the
    largest step's context less the card's context once started (memfit's, with the fitted
    rule), rounded up to a MiB."""
    gaps = [
        _bytes(r) - lazy_started_context(gpu(r["setup"]["gpu"]))
        for r in part
        if r["state"] == "step" and r["setup"].get("gpu") and framework(r) == "torch"
    ]
    return -(-max(gaps) // MiB) * MiB
