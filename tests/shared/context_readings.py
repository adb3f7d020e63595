"""memfit's CUDA context for each reading of ``tests/data/published_truth/cuda_context/``
and its error: ``bench/context_truth.py`` writes the table, tests/hardware/test_context_truth.py
checks it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from memfit.hardware.catalog import gpu
from memfit.hardware.runtime import cuda_context, parse_runtime

MiB = 2**20
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
