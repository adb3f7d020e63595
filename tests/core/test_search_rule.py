"""The pure search rule of ``memfit fit`` against a fake device (no framework, no GPU)."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
from _search_drive import FakeDevice, drive

from memfit.core.search import (
    AffineModel,
    Prior,
    Probe,
    best_probe,
    ceiling_value,
    fit_model,
    next_probe,
)
from memfit.errors import ConfigError

MiB = 2**20
GiB = 2**30


def affine(intercept: int, slope: int) -> Callable[[int], int]:
    return lambda v: intercept + slope * v


def test_affine_with_exact_prior_takes_two_probes_and_reaches_the_max() -> None:
    device = FakeDevice(affine(GiB, 10 * MiB), budget=8 * GiB)
    prior = Prior(intercept_bytes=GiB, slope_bytes=10 * MiB)
    history = drive(device, low=1, high=100_000, margin=0.05, prior=prior)
    best = best_probe(history, budget=device.budget, margin=0.05)
    truth = device.true_max(low=1, high=100_000, margin=0.05)
    assert best is not None and truth is not None
    assert len(history) == 2
    assert truth * 0.99 <= best.value <= truth
    assert all(p.ok for p in history)


def test_first_probe_is_the_priors_value_derated() -> None:
    prior = Prior(intercept_bytes=0, slope_bytes=MiB, uncertainty=0.1)
    first = next_probe([], low=1, high=10_000, budget=1100 * MiB, margin=0.0, prior=prior)
    assert first == 1000  # 1100 MiB / 1.1 at 1 MiB per item


def test_no_prior_starts_at_low_and_extrapolates_conservatively() -> None:
    device = FakeDevice(affine(3 * GiB, 4 * MiB), budget=8 * GiB)
    history = drive(device, low=8, high=100_000, margin=0.0)
    assert history[0].value == 8
    # Proportional extrapolation from one point never overshoots an affine curve with a
    # non-negative intercept, and growth by 4 stays under the budget until the slope shows:
    # no probe runs out of memory on the way.
    assert all(p.ok for p in history)
    best = best_probe(history, budget=device.budget, margin=0.0)
    truth = device.true_max(low=8, high=100_000, margin=0.0)
    assert best is not None and truth is not None
    assert best.value >= 0.97 * truth and best.value <= truth
    assert len(history) <= 6


def test_oom_is_an_upper_bound_and_the_search_recovers_below_it() -> None:
    # The prior says half the real per-item memory: the first probe runs out of memory.
    device = FakeDevice(affine(GiB, 20 * MiB), budget=4 * GiB)
    prior = Prior(intercept_bytes=GiB, slope_bytes=10 * MiB)
    history = drive(device, low=1, high=10_000, margin=0.0, prior=prior)
    assert not history[0].ok
    assert all(p.value < history[0].value for p in history[1:])
    best = best_probe(history, budget=device.budget, margin=0.0)
    truth = device.true_max(low=1, high=10_000, margin=0.0)
    assert best is not None and truth is not None
    assert 0.97 * truth <= best.value <= truth


def test_a_probe_that_runs_but_breaks_the_margin_is_not_chosen() -> None:
    history = [Probe(100, 960, True)]
    assert best_probe(history, budget=1000, margin=0.05) is None
    assert ceiling_value(history, budget=1000, margin=0.05) == 100
    # ... and it is still a measurement: the model goes through it.
    model = fit_model(history, target=950.0, prior=Prior(slope_bytes=9.0))
    assert model is not None and model.peak_bytes(100) == pytest.approx(960)


def test_multiple_of_and_constraint_are_kept() -> None:
    device = FakeDevice(affine(100 * MiB, 3 * MiB), budget=2 * GiB)

    def even_hundreds(v: int) -> bool:
        return v % 100 != 0

    history = drive(device, low=8, high=4096, margin=0.05, multiple_of=8, constraint=even_hundreds)
    best = best_probe(history, budget=device.budget, margin=0.05)
    truth = device.true_max(
        low=8, high=4096, margin=0.05, valid=lambda v: v % 8 == 0 and even_hundreds(v)
    )
    assert best is not None and truth is not None
    assert best.value % 8 == 0 and even_hundreds(best.value)
    assert 0.97 * truth <= best.value <= truth


def test_high_bounds_the_search_when_everything_fits() -> None:
    device = FakeDevice(affine(MiB, MiB), budget=GiB)
    history = drive(device, low=1, high=64, prior=Prior(intercept_bytes=MiB, slope_bytes=MiB))
    assert [p.value for p in history] == [64]


def test_nothing_fits_stops_after_the_smallest_value() -> None:
    device = FakeDevice(affine(2 * GiB, MiB), budget=GiB)
    history = drive(device, low=4, high=1000, prior=Prior(slope_bytes=MiB))
    assert history[-1].value == 4 and not history[-1].ok
    assert best_probe(history, budget=device.budget, margin=0.05) is None
    assert next_probe(history, low=4, high=1000, budget=device.budget) is None


def test_without_measurements_it_doubles_then_bisects() -> None:
    device = FakeDevice(affine(0, MiB), budget=1000 * MiB, measures=False)
    history = drive(device, low=1, high=1_000_000, margin=0.0)
    values = [p.value for p in history]
    assert values[:4] == [1, 2, 4, 8]
    best = best_probe(history, budget=device.budget, margin=0.0)
    assert best is not None and 990 <= best.value <= 1000


def test_no_valid_value_gives_none() -> None:
    assert next_probe([], low=3, high=7, budget=GiB, multiple_of=8) is None


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"low": 0, "high": 10}, "low"),
        ({"low": 5, "high": 4}, "high"),
        ({"low": 1, "high": 4, "multiple_of": 0}, "multiple_of"),
        ({"low": 1, "high": 4, "margin": 1.0}, "margin"),
        ({"low": 1, "high": 4, "budget": 0}, "budget"),
        ({"low": 1, "high": 4, "tolerance": -0.1}, "tolerance"),
    ],
)
def test_bad_arguments_are_config_errors(kwargs: dict[str, float], key: str) -> None:
    args: dict[str, object] = {"budget": GiB, **kwargs}
    with pytest.raises(ConfigError) as info:
        next_probe([], **args)  # type: ignore[arg-type]
    assert info.value.key_path == key


@pytest.mark.parametrize(
    ("prior", "key"),
    [
        ({}, "prior"),
        ({"slope_bytes": -1.0}, "prior.slope_bytes"),
        ({"slope_bytes": math.inf}, "prior.slope_bytes"),
        ({"value": 0}, "prior.value"),
        ({"value": 10, "peak_bytes": 0}, "prior.peak_bytes"),
        ({"value": 10, "uncertainty": 1.5}, "prior.uncertainty"),
    ],
)
def test_bad_priors_are_config_errors(prior: dict[str, float], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        Prior(**prior)  # type: ignore[arg-type]
    assert info.value.key_path == key


def test_prior_models() -> None:
    assert Prior(slope_bytes=2.0, intercept_bytes=5.0).model() == AffineModel(5.0, 2.0)
    # A point and a slope: the line goes through the point.
    assert Prior(slope_bytes=2.0, value=10, peak_bytes=100.0).model() == AffineModel(80.0, 2.0)
    # A point alone: the proportional line (over-states the slope when there are fixed bytes).
    assert Prior(value=10, peak_bytes=100.0).model() == AffineModel(0.0, 10.0)
    assert Prior(value=10).model() is None


def test_secant_brackets_the_target_when_it_can() -> None:
    # Convex curve: the secant across the target, not the two largest points, is used.
    history = [Probe(10, 100, True), Probe(50, 600, True), Probe(60, 800, True)]
    model = fit_model(history, target=700.0, prior=None)
    assert model is not None
    assert model.slope_bytes == pytest.approx(20.0)
    assert model.peak_bytes(50) == pytest.approx(600)


def test_module_doctest_runs() -> None:
    import doctest

    import memfit.core.search as search

    result = doctest.testmod(search)
    assert result.attempted > 0 and result.failed == 0


def test_an_island_probe_follows_a_packing_failure_below_the_aim() -> None:
    """A failure with its allocated peak below the aim is the reserved peak's steps: one probe
    at the model's largest fitting value, de-rated, above it; none after a fit, a failure at
    or above the aim, or without the model's value."""
    from memfit.core.search import island_probe

    def valid(v: int) -> bool:
        return True

    failed = [Probe(3840, 85_000_000, False)]
    assert island_probe(failed, aim=90_000_000, value=4818, valid=valid) == 4577
    assert island_probe(failed, aim=90_000_000, value=4818, valid=valid, multiple_of=64) == 4544
    assert island_probe(failed, aim=80_000_000, value=4818, valid=valid) is None
    assert island_probe(failed, aim=90_000_000, value=None, valid=valid) is None
    assert island_probe(failed, aim=90_000_000, value=4000, valid=valid) is None  # not above
    fitted = [Probe(3840, 85_000_000, True)]
    assert island_probe(fitted, aim=90_000_000, value=4818, valid=valid) is None
    again = [*failed, Probe(4577, 88_000_000, False)]
    assert island_probe(again, aim=90_000_000, value=4818, valid=valid) is None  # probed
