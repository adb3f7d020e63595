"""``memfit.fit`` under ``memfit.simulate_gpu`` on the CPU, with real PyTorch models."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from memfit.core.measured import MeasuredTerms
from memfit.core.search import Prior
from memfit.errors import BackendUnavailable, ConfigError, InfeasiblePlan
from memfit.estimate.torch.trace import estimate_torch
from memfit.runtime.fit import FitResult, fit, prior_from
from memfit.runtime.simulate import simulate_gpu

MiB = 2**20


def _mlp() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU())
    model.append(nn.Linear(256, 10))
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def _cnn() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 10),
    )
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def _step(model: nn.Module, optimizer: torch.optim.Optimizer | None, batch: Any) -> None:
    x, y = batch
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    if optimizer is not None:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def _mlp_batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, 64), torch.randint(0, 10, (n,))


def _cnn_batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, 3, 8, 8), torch.randint(0, 10, (n,))


def _runner(model: nn.Module, optimizer: Any, make_batch: Callable[[int], Any]) -> Any:
    def run(value: int) -> None:
        for _ in range(2):
            _step(model, optimizer, make_batch(value))

    return run


def _peak_of(run: Callable[[int], None], value: int, gpu: Any) -> int | None:
    """Peak of one run at ``value``, or ``None`` when it runs out of memory."""
    gpu.reset_peak()
    try:
        run(value)
    except torch.OutOfMemoryError:
        return None
    return int(gpu.peak_allocated_bytes)


@pytest.mark.parametrize(
    ("build", "make_batch", "budget", "traced"),
    [
        # The MLP's peak is the optimizer step up to a few hundred items and the activations
        # after that, so the trace is taken where the answer lies.
        (_mlp, _mlp_batch, 4 * MiB, [384, 768]),
        (_cnn, _cnn_batch, 8 * MiB, [128, 384]),
    ],
    ids=["mlp-adam", "cnn-bn-sgd"],
)
def test_fit_with_a_traced_prior_finds_97_percent_in_three_probes(
    build: Callable[[], tuple[nn.Module, Any]],
    make_batch: Callable[[int], Any],
    budget: int,
    traced: list[int],
) -> None:
    estimate = estimate_torch(build, _step, make_batch, traced, device="cpu")
    with simulate_gpu(budget) as gpu:
        model, optimizer = build()
        run = _runner(model, optimizer, make_batch)
        result = fit(run, low=1, high=100_000, prior=estimate)
        assert len(result.probes) <= 3
        target = budget * (1 - result.margin)
        # The value really fits, leaving the margin, when run again.
        peak = _peak_of(run, result.value, gpu)
        assert peak is not None and peak <= target
        # ... and 3% more does not (so the value is at least 97% of the true maximum).
        over = _peak_of(run, math.ceil(result.value / 0.97) + 1, gpu)
        assert over is None or over > target
    assert result.oom_count == 0
    assert result.device == "simulated"
    assert result.predicted_peak is not None


def test_fit_without_a_prior_still_finds_the_max() -> None:
    with simulate_gpu(8 * MiB) as gpu:
        model, optimizer = _cnn()
        run = _runner(model, optimizer, _cnn_batch)
        result = fit(run, low=1, high=100_000, margin=0.0)
        peak = _peak_of(run, result.value, gpu)
        assert peak is not None and peak <= 8 * MiB
        assert _peak_of(run, math.ceil(result.value / 0.97) + 1, gpu) is None
    assert result.probes[0].value == 1
    assert len(result.probes) <= 6


@pytest.mark.slow  # tens of seconds of CPU: the slow suite runs it (issue 32)
def test_an_oom_probe_is_caught_and_its_memory_comes_back() -> None:
    # A prior that says half the real memory per item (about 21 KB): the first probe runs out.
    with simulate_gpu(4 * MiB) as gpu:
        model, optimizer = _cnn()
        run = _runner(model, optimizer, _cnn_batch)
        run(1)  # optimizer state exists from here on
        baseline = gpu.allocated_bytes
        result = fit(run, low=1, high=100_000, margin=0.0, prior=Prior(slope_bytes=10_000.0))
        assert not result.probes[0].ok
        assert result.oom_count >= 1
        assert all(p.value < result.probes[0].value for p in result.probes[1:])
        # Nothing of the failed probes (or of any probe) is left on the simulated GPU.
        assert gpu.allocated_bytes == baseline
        assert _peak_of(run, result.value, gpu) is not None
        assert _peak_of(run, math.ceil(result.value / 0.97) + 1, gpu) is None


def test_a_probe_error_that_is_not_oom_propagates() -> None:
    def run(value: int) -> None:
        raise ValueError(f"bad batch {value}")

    with simulate_gpu(MiB), pytest.raises(ValueError, match="bad batch"):
        fit(run, low=1, high=10)


def test_nothing_fits_is_infeasible() -> None:
    def run(value: int) -> None:
        torch.zeros(value * 1024 + 10 * MiB // 4)

    with simulate_gpu(8 * MiB), pytest.raises(InfeasiblePlan) as info:
        fit(run, low=4, high=1000)
    assert info.value.budget_bytes == 8 * MiB


def test_budget_below_the_simulated_gpu_is_the_cap() -> None:
    def run(value: int) -> None:
        (torch.ones(value, 1024) * 2).sum()

    with simulate_gpu(4 * MiB):
        result = fit(run, low=1, high=10_000, budget="1MiB", margin=0.0)
    assert result.budget_bytes == MiB
    assert all(p.peak_bytes is not None and p.peak_bytes <= MiB for p in result.probes if p.ok)
    # ones() and its double live together (8 KiB per item); ones() is freed before sum().
    assert result.value == 128


def test_multiple_of_and_constraint_under_simulation() -> None:
    def run(value: int) -> None:
        (torch.ones(value, 1024) * 2).sum()

    with simulate_gpu(MiB):
        result = fit(
            run,
            low=8,
            high=10_000,
            margin=0.0,
            multiple_of=8,
            constraint=lambda v: v != 128,
        )
    assert result.value == 120


def test_cpu_without_a_simulated_gpu_is_unavailable() -> None:
    with pytest.raises(BackendUnavailable, match="simulate_gpu"):
        fit(lambda v: None, low=1, high=10, device="cpu")


def test_budget_over_the_simulated_gpu_is_a_config_error() -> None:
    with simulate_gpu(MiB), pytest.raises(ConfigError) as info:
        fit(lambda v: None, low=1, high=10, budget="2MiB")
    assert info.value.key_path == "budget"


def test_no_valid_value_is_a_config_error() -> None:
    with simulate_gpu(MiB), pytest.raises(ConfigError) as info:
        fit(lambda v: None, low=3, high=7, multiple_of=8)
    assert info.value.key_path == "constraint"


def test_result_to_dict() -> None:
    def run(value: int) -> None:
        torch.zeros(value * 256)

    with simulate_gpu(MiB):
        result = fit(run, low=1, high=100, margin=0.0)
    data = result.to_dict()
    assert data["value"] == 100
    assert data["probes"][-1] == {"value": 100, "peak_bytes": 102400, "ok": True}
    assert data["budget_bytes"] == MiB and data["oom_count"] == 0
    assert isinstance(result, FitResult) and result.peak_bytes == 102400


def test_prior_from_the_kinds_memfit_predicts() -> None:
    terms = MeasuredTerms(knob="batch_size", fixed_bytes={"params": 1000}, per_item_bytes=10.0)
    assert prior_from(terms) == Prior(slope_bytes=10.0, intercept_bytes=1000.0)
    assert prior_from(64) == Prior(value=64)
    assert prior_from(None) is None

    class FakePlan:  # the planner's Plan fields that matter
        knobs: dict[str, int | str] = {"batch_size": 256, "replay_placement": "gpu"}  # noqa: RUF012
        predicted_bytes = 5 * 2**30

    assert prior_from(FakePlan()) == Prior(value=256, peak_bytes=5 * 2**30)
    with pytest.raises(ConfigError, match="say which one"):
        prior_from(FakePlan(), knob="num_envs")
    with pytest.raises(ConfigError, match="cannot read a prior"):
        prior_from("lots")


def test_prior_from_a_torch_estimate_reads_its_fit() -> None:
    estimate = estimate_torch(_cnn, _step, _cnn_batch, [4, 8], device="cpu")
    assert estimate.fit is not None
    prior = prior_from(estimate)
    assert prior is not None
    assert prior.slope_bytes == pytest.approx(estimate.fit.slope)
    assert prior.intercept_bytes == pytest.approx(estimate.fit.intercept)
