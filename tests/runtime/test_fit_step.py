"""``memfit.runtime.fit_step.fit_step``: what ``memfit fit`` does, callable from Python."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch
from _user_module import user_module
from torch import nn

from memfit.errors import BackendUnavailable, ConfigError, InfeasiblePlan
from memfit.estimate import JaxStep, TorchStep
from memfit.runtime.fit_step import DEFAULT_HIGH, FitStepResult, fit_step

BUILT: list[tuple[nn.Module, torch.optim.Optimizer]] = []


def build() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    BUILT.append((model, optimizer))
    return model, optimizer


def step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: torch.Tensor) -> None:
    model(batch).pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def make_batch(n: int) -> torch.Tensor:
    return torch.randn(n, 32)


TORCH_STEP = TorchStep(build=build, step=step, make_batch=make_batch, batch_knob="batch_size")


def test_fit_step_finds_a_batch_and_restores_the_state() -> None:
    BUILT.clear()
    found = fit_step(TORCH_STEP, device="cpu", budget="2MiB", high=8192, prior=False, steps=2)
    assert isinstance(found, FitStepResult)
    result = found.result
    assert found.knob == "batch_size" and result.device == "simulated"
    assert result.peak_bytes is not None and result.peak_bytes <= 0.95 * 2 * 2**20
    assert 1 <= result.value < 8192
    model, optimizer = BUILT[-1]
    fresh, _ = build()
    for a, b in zip(model.parameters(), fresh.parameters(), strict=True):
        assert torch.equal(a, b) and a.grad is None
    assert optimizer.state_dict()["state"] == {}
    data = found.to_dict()
    assert data["state_restored"] is True and data["steps_per_probe"] == 2
    assert data["knob"] == "batch_size" and data["prior"] is None
    assert data["value"] == result.value


def test_fit_step_with_a_prior_from_the_trace() -> None:
    found = fit_step(TORCH_STEP, device="cpu", budget="2MiB", high=8192)
    assert found.prior is not None and found.prior.fit is not None
    assert found.to_dict()["prior"]["slope_bytes"] > 0
    assert len(found.result.probes) <= 4


def test_fit_step_takes_a_factory_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    name = user_module(
        tmp_path,
        monkeypatch,
        "fitstep_",
        textwrap.dedent(
            """
            import torch
            from memfit.estimate import TorchStep

            def build():
                model = torch.nn.Linear(8, 8)
                return model, torch.optim.SGD(model.parameters(), lr=0.1)

            def step(model, optimizer, batch):
                model(batch).sum().backward()
                optimizer.step()

            def factory():
                return TorchStep(build=build, step=step, make_batch=lambda n: torch.ones(n, 8),
                                 batch_knob="rollouts")
            """
        ),
    )
    found = fit_step(f"{name}:factory", device="cpu", budget="256KiB", high=4096, prior=False)
    assert found.knob == "rollouts" and found.result.value >= 1


def test_the_bounds_and_rules_are_kept() -> None:
    found = fit_step(
        TORCH_STEP,
        device="cpu",
        budget="2MiB",
        low=8,
        high=4096,
        multiple_of=8,
        constraint=lambda v: v % 3 == 0,
        prior=False,
    )
    assert found.result.value % 24 == 0
    assert all(p.value % 24 == 0 for p in found.result.probes)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"device": "cpu"}, ConfigError, "needs a budget"),
        ({"device": "tpu", "budget": "1GiB"}, ConfigError, "unknown device"),
        ({"device": "cpu", "budget": 0}, ConfigError, "must be positive"),
        ({"device": "cpu", "budget": "1e308GB"}, ConfigError, "larger than memfit accepts"),
        ({"device": "cpu", "budget": "1GiB", "steps": 0}, ConfigError, "steps"),
        ({"device": "cpu", "budget": "1GiB", "low": 10, "high": 5}, ConfigError, "high"),
        ({"device": "cpu", "budget": "100"}, InfeasiblePlan, "alone do not fit in 100 B"),
    ],
)
def test_mistakes_are_memfit_errors(
    kwargs: dict[str, object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        fit_step(TORCH_STEP, prior=False, **kwargs)  # type: ignore[arg-type]


def test_cuda_without_a_gpu_is_unavailable() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(BackendUnavailable, match="no CUDA device"):
        fit_step(TORCH_STEP, device="cuda:0", prior=False)


def test_a_jax_step_is_refused() -> None:
    jax_step = JaxStep(fn=lambda x: x, make_args=lambda n: (n,))
    with pytest.raises(ConfigError, match="PyTorch steps"):
        fit_step(jax_step, device="cpu", budget="1GiB")  # type: ignore[arg-type]


def test_a_failing_user_step_is_blamed_on_the_factory() -> None:
    def broken(model: nn.Module, optimizer: torch.optim.Optimizer, batch: torch.Tensor) -> None:
        raise ValueError("step broke")

    bad = TorchStep(build=build, step=broken, make_batch=make_batch)
    with pytest.raises(ConfigError, match="step broke") as info:
        fit_step(bad, device="cpu", budget="1MiB", prior=False)
    assert info.value.key_path == "factory"
    assert isinstance(info.value.__cause__, ValueError)


def test_the_cli_searches_the_same_default_range() -> None:
    from memfit.cli import fit as fit_cli

    assert fit_cli.DEFAULT_HIGH == DEFAULT_HIGH


def test_fit_step_reports_the_trace_and_each_probe() -> None:
    """Issue 22: fit's long work is visible (a status line's updater hears each stage)."""
    heard: list[str] = []
    found = fit_step(TORCH_STEP, device="cpu", budget="2MiB", high=8192, progress=heard.append)
    assert heard[0].startswith("tracing ") and "first guess" in heard[0]
    probes = [h for h in heard if h.startswith("probe ")]
    assert len(probes) == len(found.result.probes)
    assert probes[0].startswith("probe 1: ") and probes[-1].endswith(" on cpu")
