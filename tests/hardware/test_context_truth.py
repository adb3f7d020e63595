"""The CUDA context readings: well formed, split, and memfit's context never under on the
project's own H100 capture nor far from the calibration readings."""

from __future__ import annotations

from typing import Any

import pytest
from context_readings import (
    fit_kernel_images,
    fit_started_context,
    framework,
    load,
    predict,
    rows,
    started_points,
)

from memfit.hardware import runtime
from memfit.hardware.catalog import gpu
from memfit.hardware.runtime import (
    CONTEXT_BASE_BYTES,
    FRAMEWORKS,
    LAZY_KERNEL_IMAGES_BYTES,
    LOCAL_BYTES_PER_THREAD,
    cuda_context,
    lazy_started_context,
    parse_runtime,
)

DOC = load()


def test_two_parts_and_every_reading_sourced() -> None:
    assert set(DOC) == {"calibration", "validation"}
    ids = [r["id"] for part in DOC.values() for r in part]
    assert len(ids) == len(set(ids))
    for part in DOC.values():
        for reading in part:
            assert reading["source"]["quoted"].strip()
            assert reading["source"].get("url") or reading["source"].get("located") is not None
            assert reading["state"] in ("init", "step") and reading["unit_bytes"] > 0


@pytest.mark.parametrize("reading", DOC["calibration"], ids=lambda r: r["id"])
def test_calibration_readings_within_three_percent_and_not_under(reading: dict[str, Any]) -> None:
    [row] = rows([reading])
    if row["error"] is None:
        pytest.skip("the source names no card")
    assert 0.0 <= row["error"] <= 0.03, row


@pytest.mark.parametrize(
    "reading", [r for r in DOC["validation"] if r["state"] == "step"], ids=lambda r: r["id"]
)
def test_h100_validation_steps_not_under(reading: dict[str, Any]) -> None:
    """The step's context on the H100 validation workloads (ACT at 384 and 512, ResNet-18):
    an under-predicted context is an OOM on a full card."""
    [row] = rows([reading])
    assert 0.0 <= row["error"] <= 0.03, row


def test_every_reading_names_a_known_framework_and_jax_readings_are_validation() -> None:
    """The split of the JAX readings was decided before comparing, by role: nothing about a
    JAX process is fitted from them, so they are all validation."""
    for part in DOC.values():
        for reading in part:
            assert framework(reading) in FRAMEWORKS
    assert not [r for r in DOC["calibration"] if framework(r) == "jax"]
    assert [r for r in DOC["validation"] if framework(r) == "jax"]


def test_kernel_images_are_fitted_only_where_calibration_steps_of_that_framework_exist() -> None:
    """A framework's kernel images are ``fitted`` on an architecture exactly when the
    calibration part holds a step of a process of that framework on a card of it."""
    steps = {
        (framework(r), gpu(r["setup"]["gpu"]).arch)
        for r in DOC["calibration"]
        if r["state"] == "step" and r["setup"].get("gpu")
    }
    fitted = {(fw, arch) for fw, archs in runtime._IMAGES_FITTED_ON.items() for arch in archs}
    assert fitted == steps
    assert set(runtime._IMAGES_FITTED_ON) == set(FRAMEWORKS)


@pytest.mark.parametrize(
    "reading",
    [r for part in DOC.values() for r in part if framework(r) == "jax"],
    ids=lambda r: r["id"],
)
def test_jax_readings_are_predicted_as_a_jax_process(reading: dict[str, Any]) -> None:
    setup = reading["setup"]
    expected = cuda_context(
        gpu(setup["gpu"]),
        parse_runtime(setup["runtime"]),
        kernels=reading["state"] == "step",
        framework="jax",
    )
    assert predict(reading) == expected.bytes
    [row] = rows([reading])
    assert row["framework"] == "jax" and row["error"] is not None


def test_started_context_rule_is_the_fit_on_the_calibration_part() -> None:
    """The fixed part, the bytes per resident thread and torch's kernel images are what
    ``fit_started_context`` / ``fit_kernel_images`` derive from the calibration part alone."""
    fit = fit_started_context(DOC["calibration"])
    assert len(fit["points"]) >= 3
    assert (fit["per_thread"], fit["base"]) == (LOCAL_BYTES_PER_THREAD, CONTEXT_BASE_BYTES)
    assert fit_kernel_images(DOC["calibration"]) == LAZY_KERNEL_IMAGES_BYTES


def test_started_context_fit_ignores_the_validation_part() -> None:
    """Adding the validation readings to the fit's input would move it: the constants are the
    calibration part's fit, not the whole corpus's."""
    assert started_points(DOC["validation"])
    both = fit_started_context(DOC["calibration"] + DOC["validation"])
    alone = fit_started_context(DOC["calibration"])
    assert both["slope_bytes_per_thread"] != alone["slope_bytes_per_thread"]


def test_started_context_grows_with_resident_threads_not_a_flat_fixed_part() -> None:
    """The calibration cards span 34 to 170 SMs: the started context is nearly proportional to
    the resident threads (a fixed part under 2% of the largest card's context)."""
    fit = fit_started_context(DOC["calibration"])
    largest = max(y for _, _, y in fit["points"])
    assert 0 <= fit["base"] < 0.02 * largest
    small, big = gpu("RTX 4060 Ti 8GB"), gpu("RTX 5090")
    assert lazy_started_context(big) > 4 * lazy_started_context(small)
