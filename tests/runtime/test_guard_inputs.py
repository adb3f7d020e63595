"""Misuse of the guards, fit and cleanup gives memfit errors that say what to do."""

from __future__ import annotations

from collections import OrderedDict, UserDict, defaultdict
from typing import Any

import pytest
import torch
from torch import nn

import memfit
from memfit.errors import ConfigError, OutOfMemory
from memfit.runtime.guard import RolloutGuard, TrainGuard, split_batch


def _setup() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Linear(8, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def _params(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _unchanged(model: nn.Module, before: list[torch.Tensor]) -> bool:
    return all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_trainguard_rejects_a_non_optimizer_and_a_non_callable_loss() -> None:
    _model, optimizer = _setup()
    with pytest.raises(ConfigError, match=r"optimizer must be a torch.optim.Optimizer") as info:
        TrainGuard("sgd", lambda b: b)  # type: ignore[arg-type]
    assert info.value.key_path == "optimizer"
    with pytest.raises(ConfigError, match=r"loss_fn must be callable") as info:
        TrainGuard(optimizer, 3)  # type: ignore[arg-type]
    assert info.value.key_path == "loss_fn"
    with pytest.raises(ConfigError, match=r"count_fn must be callable"):
        TrainGuard(optimizer, lambda b: b, count_fn="tokens")  # type: ignore[arg-type]


def test_mismatched_batch_is_refused_before_the_step_not_at_the_first_oom() -> None:
    model, optimizer = _setup()
    before = _params(model)
    guard = TrainGuard(optimizer, lambda b: ((model(b[0]) - b[1][:1]) ** 2).mean())
    with pytest.raises(ConfigError, match=r"has 5 items along dim 0 but batch\[0\] has 16") as inf:
        guard((torch.randn(16, 8), torch.randn(5, 2)))
    assert inf.value.key_path == "batch[1]"
    assert _unchanged(model, before)


@pytest.mark.parametrize("batch", [(torch.randn(0, 8), torch.randn(0, 2)), None, {"k": 1}])
def test_empty_or_tensorless_batch_is_a_config_error(batch: Any) -> None:
    model, optimizer = _setup()
    before = _params(model)
    guard = TrainGuard(optimizer, lambda b: ((model(b[0]) - b[1]) ** 2).mean())
    with pytest.raises(ConfigError, match=r"0 items|no tensor") as info:
        guard(batch)
    assert info.value.key_path == "batch"
    assert _unchanged(model, before)
    assert guard.steps == 0


def test_loss_without_grad_and_non_scalar_loss_say_what_is_wrong() -> None:
    model, optimizer = _setup()
    x, y = torch.randn(4, 8), torch.randn(4, 2)
    with pytest.raises(ConfigError, match=r"does not require grad"):
        TrainGuard(optimizer, lambda b: ((model(b[0]) - b[1]) ** 2).mean().detach())((x, y))
    with pytest.raises(ConfigError, match=r"got a tensor of shape \(4, 2\)"):
        TrainGuard(optimizer, lambda b: (model(b[0]) - b[1]) ** 2)((x, y))
    with pytest.raises(ConfigError, match=r"got a float"):
        TrainGuard(optimizer, lambda b: 1.0)((x, y))  # type: ignore[arg-type,return-value]


def test_a_non_oom_error_propagates_and_leaves_no_partial_gradient() -> None:
    model, optimizer = _setup()
    before = _params(model)
    calls = {"n": 0}

    def loss_fn(b: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        calls["n"] += 1
        if calls["n"] <= 2:  # the whole batch and its retry
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        if calls["n"] == 4:  # the second micro-batch after the split
            raise ValueError("a bug in the user's loss")
        return ((model(b[0]) - b[1]) ** 2).mean()

    guard = TrainGuard(optimizer, loss_fn)
    with pytest.raises(ValueError, match=r"a bug in the user's loss"):
        guard((torch.randn(8, 8), torch.randn(8, 2)))
    assert all(p.grad is None for p in model.parameters())
    assert _unchanged(model, before)


def test_give_up_carries_peak_budget_tried_and_hint() -> None:
    _model, optimizer = _setup()

    def loss_fn(b: Any) -> torch.Tensor:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    with memfit.simulate_gpu("1MiB"):
        guard = TrainGuard(optimizer, loss_fn, max_splits=4)
        with pytest.raises(OutOfMemory) as info:
            guard((torch.randn(16, 8), torch.randn(16, 2)))
    err = info.value
    assert err.budget_bytes == 2**20
    assert err.peak_bytes is not None
    assert err.tried == ["retry x1", "split x2", "split x4"]
    assert err.hint is not None and "max_splits" in err.hint


@pytest.mark.parametrize("kind", [UserDict, OrderedDict, "defaultdict", "batch_encoding"])
def test_mapping_batches_split_like_dicts(kind: Any) -> None:
    x, y = torch.randn(16, 8), torch.randn(16, 2)
    if kind == "defaultdict":
        batch: Any = defaultdict(list, {"x": x, "y": y})
    elif kind == "batch_encoding":
        transformers = pytest.importorskip("transformers")
        batch = transformers.BatchEncoding({"x": x, "y": y})
    else:
        batch = kind({"x": x, "y": y})
    part = split_batch(batch, 4, 8)
    assert type(part) is type(batch)
    assert torch.equal(part["x"], x[4:8]) and torch.equal(part["y"], y[4:8])

    # The guard splits them after an out-of-memory and ends with the full-batch update.
    model, optimizer = _setup()
    ref_model, ref_opt = _setup()
    ((ref_model(x) - y) ** 2).mean().backward()
    ref_opt.step()
    calls = {"n": 0}

    def loss_fn(b: Any) -> torch.Tensor:
        calls["n"] += 1
        if calls["n"] <= 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return ((model(b["x"]) - b["y"]) ** 2).mean()

    guard = TrainGuard(optimizer, loss_fn)
    guard(batch)
    assert guard.splits == 2
    for a, b in zip(model.parameters(), ref_model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_rolloutguard_validates_fn_and_split_dim_and_keeps_mapping_types() -> None:
    with pytest.raises(ConfigError, match=r"fn must be callable"):
        RolloutGuard(3)  # type: ignore[arg-type]
    for bad in (-1, "a", True):
        with pytest.raises(ConfigError, match=r"split_dim must be an integer >= 0"):
            RolloutGuard(lambda x: x, split_dim=bad)  # type: ignore[arg-type]
    calls = {"n": 0}

    def step(x: torch.Tensor) -> UserDict[str, torch.Tensor]:
        calls["n"] += 1
        if calls["n"] <= 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return UserDict({"obs": x * 2})

    x = torch.arange(8.0)
    out = RolloutGuard(step)(x)
    assert isinstance(out, UserDict)
    assert torch.equal(out["obs"], x * 2)


def test_after_call_refuses_a_non_callable() -> None:
    with pytest.raises(ConfigError, match=r"after_call decorates a function"):
        memfit.cleanup.after_call(3)  # type: ignore[arg-type]


def test_fit_refuses_a_non_callable_run_fractional_bounds_and_a_text_max_probes() -> None:
    def run(value: int) -> None:
        torch.ones(value, 1024).sum()

    with memfit.simulate_gpu("1MiB"):
        with pytest.raises(ConfigError, match=r"run must be callable") as info:
            memfit.fit(3, low=1, high=10)  # type: ignore[arg-type]
        assert info.value.key_path == "run"
        with pytest.raises(ConfigError, match=r"must be a whole number, got 1.5") as info:
            memfit.fit(run, low=1.5, high=10)  # type: ignore[arg-type]
        assert info.value.key_path == "low"
        with pytest.raises(ConfigError, match=r"whole number") as info:
            memfit.fit(run, low=1, high=10.0)  # type: ignore[arg-type]
        assert info.value.key_path == "high"
        with pytest.raises(
            ConfigError, match=r"max_probes must be a positive integer, not '3'"
        ) as info:
            memfit.fit(run, low=1, high=10, max_probes="3")  # type: ignore[arg-type]
        assert info.value.key_path == "max_probes"


def test_jax_guard_misuse_gives_config_errors() -> None:
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    from memfit.jax import TrainGuard as JaxTrainGuard

    def update(p: Any, s: Any, g: Any) -> tuple[Any, Any]:
        return jax.tree_util.tree_map(lambda a, b: a - 0.1 * b, p, g), s

    params = {"w": jnp.ones((4, 2))}
    with pytest.raises(ConfigError, match=r"loss_fn must be callable"):
        JaxTrainGuard(3, update)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"update_fn must be callable"):
        JaxTrainGuard(lambda p, b: 0.0, None)  # type: ignore[arg-type]
    guard = JaxTrainGuard(lambda p, b: jnp.mean((b["x"] @ p["w"] - b["y"]) ** 2), update)
    with pytest.raises(ConfigError, match=r"0 items") as info:
        guard(params, None, {"x": jnp.ones((0, 4)), "y": jnp.zeros((0, 2))})
    assert info.value.key_path == "batch"
    per_item = JaxTrainGuard(lambda p, b: (b["x"] @ p["w"] - b["y"]) ** 2, update)
    with pytest.raises(ConfigError, match=r"mean loss as a scalar") as info:
        per_item(params, None, {"x": jnp.ones((8, 4)), "y": jnp.zeros((8, 2))})
    assert info.value.key_path == "loss_fn"


def test_stateless_optimizer_is_journaled_not_snapshotted() -> None:
    import torch

    import memfit

    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # no momentum: never any state
    batch = {"x": torch.randn(8, 4), "y": torch.randn(8, 1)}
    guard = memfit.TrainGuard(opt, lambda b: torch.nn.functional.mse_loss(model(b["x"]), b["y"]))
    seen = []
    for _ in range(3):
        guard(batch)
        seen.append((guard.last_step_journaled, guard.last_step_snapshotted))
    assert seen == [(True, False)] * 3
