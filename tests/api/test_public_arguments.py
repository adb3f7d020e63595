"""Every public function and class of memfit checks its arguments (issue 21): a value of the
wrong type for any parameter is a ``ConfigError`` naming the parameter, never a
``TypeError``, ``AttributeError`` or a failure later, at the first step."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest

import memfit
from memfit.errors import ConfigError

torch = pytest.importorskip("torch", reason="the guards need torch")


class _Wrong:
    """A value of no type any memfit parameter accepts."""

    def __repr__(self) -> str:
        return "<wrong>"


WRONG = _Wrong()


def _optimizer() -> Any:
    return torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)


def _loss(batch: Any) -> Any:
    return batch.sum()


def _snapshot() -> Any:
    from memfit.allocator.snapshot_build import TraceBuilder

    builder = TraceBuilder()
    for _ in range(3):
        builder.malloc(8 * 2**20)
    return builder.snapshot()


def _device() -> Any:
    from memfit.backends import SimulatedDevice

    return SimulatedDevice("8GiB", name="NVIDIA GeForce RTX 4060 Ti")


# name -> (callable, the required arguments, valid)
CASES: dict[str, tuple[Callable[..., Any], dict[str, Any]]] = {
    "autoconfig": (memfit.autoconfig, {"workload": "act_dual_camera"}),
    "check": (memfit.check, {"workload": "act_dual_camera"}),
    "clip_grad_norm": (memfit.clip_grad_norm, {"max_norm": 1.0}),
    "configure": (memfit.configure, {"environ": {}}),
    "estimate_jax": (memfit.estimate_jax, {"fn": lambda x: x}),
    "estimate_torch": (
        memfit.estimate_torch,
        {
            "build": lambda: (None, None),
            "step": lambda m, o, b: None,
            "make_batch": lambda n: None,
            "batch_sizes": [1, 2, 4],
        },
    ),
    "fit": (memfit.fit, {"run": lambda n: None, "low": 1, "high": 8, "budget": "1GiB"}),
    "format_bytes": (memfit.format_bytes, {"n": 1}),
    "gpu": (memfit.gpu, {"name_or_size": "A100-80GB"}),
    "is_oom": (memfit.is_oom, {"exc": RuntimeError("x")}),
    "list_gpus": (memfit.list_gpus, {}),
    "load_workload": (memfit.load_workload, {"ref": "act_dual_camera"}),
    "parse_bytes": (memfit.parse_bytes, {"text": "1GiB"}),
    "plan": (memfit.plan, {"workload": "act_dual_camera", "gpu": "A100-80GB"}),
    "simulate_gpu": (memfit.simulate_gpu, {"budget": "1GiB"}),
    "measure_simulator": (
        memfit.measure_simulator,
        {"make_env": lambda point: None, "probe": _device(), "store": False},
    ),
    "TrainGuard": (memfit.TrainGuard, {"optimizer": _optimizer(), "loss_fn": _loss}),
    "RolloutGuard": (memfit.RolloutGuard, {"fn": lambda x: x}),
    "Recorder": (memfit.Recorder, {"log": False}),
    "cleanup.every": (memfit.cleanup.every, {"n": 10}),
    "cleanup.on_pressure": (memfit.cleanup.on_pressure, {}),
    "cleanup.full_reset": (memfit.cleanup.full_reset, {}),
    "cleanup.after_call": (memfit.cleanup.after_call, {}),
    "testing.inject_oom": (memfit.testing.inject_oom, {"rate": 0.0}),
    "explain": (memfit.explain, {"snapshot": _snapshot()}),
}

#: Parameters that take any object by design.
ANY = {("estimate_jax", "args"), ("estimate_jax", "kwargs"), ("fit", "prior")}


def _params() -> list[tuple[str, str]]:
    out = []
    for name, (fn, _) in CASES.items():
        for param in inspect.signature(fn).parameters.values():
            if (name, param.name) in ANY or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                continue
            out.append((name, param.name))
    return out


def test_every_public_callable_is_covered() -> None:
    names = {
        n
        for n in memfit.__all__
        if (callable(getattr(memfit, n)) and not inspect.isclass(getattr(memfit, n)))
        or n in ("TrainGuard", "RolloutGuard", "Recorder")
    }
    assert names <= set(CASES), names - set(CASES)


def _call(fn: Callable[..., Any], kwargs: dict[str, Any]) -> None:
    result = fn(**kwargs)
    if hasattr(result, "__enter__"):  # a context manager checks on entering
        with result:
            pass


@pytest.mark.parametrize(("name", "param"), _params())
def test_a_wrong_type_is_a_config_error_naming_the_argument(name: str, param: str) -> None:
    fn, required = CASES[name]
    kwargs = {**required, param: WRONG}
    with pytest.raises(ConfigError) as info:
        _call(fn, kwargs)
    assert param in (info.value.key_path or "") or param in str(info.value), str(info.value)


@pytest.mark.parametrize(
    ("call", "param"),
    [
        (lambda: memfit.plan("act_dual_camera", "A100-80GB", overrides=["k=5"]), "overrides"),
        (lambda: memfit.check("act_dual_camera", "k=5"), "overrides"),  # type: ignore[arg-type]
        (lambda: memfit.TrainGuard(_optimizer(), _loss, model="m"), "model"),  # type: ignore[arg-type]
        (lambda: memfit.TrainGuard(_optimizer(), _loss, scaler=5), "scaler"),  # type: ignore[arg-type]
        (lambda: memfit.Recorder(5), "path"),  # type: ignore[arg-type]
        (lambda: memfit.testing.inject_oom(0.0, at="abc").__enter__(), "at"),  # type: ignore[arg-type]
        (lambda: memfit.testing.inject_oom(0.0, limit=1.5).__enter__(), "limit"),  # type: ignore[arg-type]
    ],
)
def test_the_cases_of_the_issue(call: Callable[[], Any], param: str) -> None:
    with pytest.raises(ConfigError) as info:
        call()
    assert info.value.key_path == param


def test_a_count_fn_that_returns_a_negative_count_fails_at_the_first_step() -> None:
    model = torch.nn.Linear(2, 1)
    guard = memfit.TrainGuard(
        torch.optim.SGD(model.parameters(), lr=0.1),
        lambda b: model(b).mean(),
        count_fn=lambda b: -3.0,
    )
    with pytest.raises(ConfigError, match="count_fn"):
        guard(torch.ones(4, 2))
