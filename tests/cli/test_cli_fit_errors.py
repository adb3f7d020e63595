"""`memfit fit` and user mistakes: errors with hints, not crashes."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from _user_module import user_module

from memfit.cli.main import main

FACTORY = textwrap.dedent(
    """
    import torch
    from torch import nn

    from memfit.estimate import TorchStep

    def build():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
        return model, torch.optim.Adam(model.parameters())

    def step(model, optimizer, batch):
        x, y = batch
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()

    def make_batch(n):
        return torch.randn(n, 64), torch.randint(0, 10, (n,))

    def factory():
        return TorchStep(build=build, step=step, make_batch=make_batch, batch_knob="batch_size")

    def broken_step():
        def step(model, optimizer, batch):
            raise ValueError("step broke")
        return TorchStep(build=build, step=step, make_batch=make_batch, batch_knob="batch_size")

    def broken_build():
        def build():
            raise ValueError("build broke")
        return TorchStep(build=build, step=step, make_batch=make_batch, batch_knob="batch_size")
    """
)


@pytest.fixture
def module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh importable module (unique name) with the factories, in the cwd."""
    return user_module(tmp_path, monkeypatch, "fitqa_", FACTORY)


def _error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[dict[str, object], str]:
    code = main([*argv, "--json"])
    captured = capsys.readouterr()
    assert code == 1, captured.err
    assert "Traceback" not in captured.err
    data = json.loads(captured.out)
    assert isinstance(data, dict)
    assert "Error:" in captured.err
    return data, captured.err


def test_a_budget_the_model_cannot_fit_in_is_infeasible_not_internal(
    module: str, capsys: pytest.CaptureFixture[str]
) -> None:
    data, err = _error(capsys, ["fit", f"{module}:factory", "--device", "cpu", "--budget", "100"])
    assert data["error"] == "InfeasiblePlan"
    assert "alone do not fit in 100 B" in str(data["message"])
    assert "Hint: raise the budget (--budget)" in err


def test_an_unknown_knob_is_refused(module: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["fit", f"{module}:factory", "--device", "cpu", "--budget", "4MiB", "--knob", "nope"]
    data, _ = _error(capsys, argv)
    assert data["error"] == "ConfigError" and data["key_path"] == "--knob"


def test_bounds_and_budget_are_checked_before_the_trace(
    module: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["fit", f"{module}:factory", "--device", "cpu", "--budget", "4MiB"]
    data, err = _error(capsys, [*argv, "--low", "100", "--high", "10"])
    assert data["key_path"] == "high" and "tracing" not in err
    argv = ["fit", f"{module}:factory", "--device", "cpu", "--budget", "0"]
    data, err = _error(capsys, argv)
    assert data["key_path"] == "--budget" and "tracing" not in err


@pytest.mark.parametrize(("factory", "what"), [("broken_step", "step"), ("broken_build", "build")])
def test_a_failing_user_step_is_blamed_on_the_factory_not_on_memfit(
    module: str, capsys: pytest.CaptureFixture[str], factory: str, what: str
) -> None:
    argv = ["fit", f"{module}:{factory}", "--device", "cpu", "--budget", "4MiB", "--no-prior"]
    data, _ = _error(capsys, argv)
    assert data["error"] == "ConfigError" and data["key_path"] == "factory"
    assert f"{what} broke" in str(data["message"])
