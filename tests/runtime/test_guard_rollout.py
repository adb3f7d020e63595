"""RolloutGuard, inject_oom, and the memory a failed step leaves behind."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
from torch import nn

import memfit
from memfit.allocator.model import round_size
from memfit.errors import ConfigError, OutOfMemory
from memfit.runtime.guard import RolloutGuard, TrainGuard
from memfit.runtime.simulate import simulate_gpu
from memfit.testing import inject_oom


def _policy() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 128), nn.Tanh(), nn.Linear(128, 2))


def test_rollout_runs_in_chunks_when_all_envs_do_not_fit() -> None:
    policy = _policy()
    obs = torch.randn(256, 8)
    with torch.no_grad():
        expected = policy(obs)

    def act(o: torch.Tensor, scale: float = 1.0) -> dict[str, torch.Tensor]:
        with torch.no_grad():
            return {"action": policy(o) * scale, "value": policy(o).sum(-1)}

    guard = memfit.RolloutGuard(act)
    with simulate_gpu("100KiB"):
        out = guard(obs, scale=1.0)
    assert guard.splits > 1
    torch.testing.assert_close(out["action"], expected)
    torch.testing.assert_close(out["value"], expected.sum(-1))
    assert [e.kind for e in guard.events][:2] == ["oom", "retry"]


def test_rollout_numpy_env_step_along_dim_1() -> None:
    calls: list[int] = []

    def env_step(actions: np.ndarray, horizon: int) -> tuple[np.ndarray, float, str]:
        calls.append(actions.shape[1])
        if actions.shape[1] > 4:
            raise RuntimeError("CUDA error: out of memory")
        return actions * 2, 1.0, "ok"

    guard = RolloutGuard(env_step, split_dim=1)
    actions = np.arange(24.0).reshape(2, 12)
    obs, reward, status = guard(actions, horizon=5)
    np.testing.assert_array_equal(obs, actions * 2)
    assert reward == 1.0 and status == "ok"
    assert calls == [12, 12, 6, 3, 3, 3, 3] and guard.splits == 4


def test_rollout_gives_up_and_passes_other_errors() -> None:
    def always(x: torch.Tensor) -> torch.Tensor:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")

    guard = RolloutGuard(always, max_splits=2)
    with pytest.raises(OutOfMemory, match="retry x1, split x2") as info:
        guard(torch.zeros(4, 3))
    assert info.value.tried == ["retry x1", "split x2"]

    def broken(x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("shape mismatch")

    with pytest.raises(RuntimeError, match="shape mismatch"):
        RolloutGuard(broken)(torch.zeros(2))
    with pytest.raises(ConfigError, match="max_splits"):
        RolloutGuard(broken, max_splits=0)


def test_rollout_grows_back_after_clean_calls() -> None:
    budget = {"max": 4}

    def fn(x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > budget["max"]:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB")
        return x + 1

    guard = RolloutGuard(fn, grow_back_after=3)
    x = torch.zeros(16)
    guard(x)
    assert guard.splits == 4
    budget["max"] = 16  # the other process left
    for _ in range(3):
        guard(x)
    assert guard.splits == 2 and guard.events[-1].kind == "grow_back"


def test_memory_of_a_failed_attempt_comes_back_before_the_retry() -> None:
    """At the "oom" event (sent after the except block) the failed forward's bytes are gone."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(32, 128), nn.Tanh(), nn.Linear(128, 128), nn.Tanh(), nn.Linear(128, 1)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = (torch.randn(128, 32), torch.randn(128, 1))
    live_at_event: list[int] = []
    grad_bytes = sum(round_size(p.numel() * 4) for p in model.parameters())
    with simulate_gpu("200KiB") as gpu:

        def record(event: memfit.runtime.events.MemoryEvent) -> None:
            if event.kind == "oom":
                live_at_event.append(gpu.allocated_bytes)

        guard = TrainGuard(
            opt, lambda b: nn.functional.mse_loss(model(b[0]), b[1]), on_event=record
        )
        guard(batch)
        after = gpu.allocated_bytes
    assert guard.splits > 1
    # First failure: nothing succeeded yet, and nothing of the failed attempt is pinned.
    assert live_at_event[0] == 0
    # Later ones: only the gradients of the micro-batches that succeeded are live.
    assert all(b <= grad_bytes for b in live_at_event)
    assert after == 0  # grads set to None; SGD without momentum keeps no state


def test_inject_oom_is_seeded_and_phase_aware() -> None:
    model = _policy()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def counts(seed: int) -> dict[str, int]:
        with inject_oom(0.2, seed=seed) as chaos:
            for _ in range(20):
                try:
                    opt.zero_grad()
                    model(torch.randn(4, 8)).sum().backward()
                    opt.step()
                except torch.OutOfMemoryError:
                    pass
        return dict(chaos.raised)

    first, again = counts(4), counts(4)
    assert first == again
    assert all(first[p] > 0 for p in ("forward", "backward", "optimizer"))
    with inject_oom(1.0, where=("backward",)) as chaos:
        y = model(torch.randn(2, 8)).sum()  # forward runs untouched
        with pytest.raises(torch.OutOfMemoryError, match="in backward"):
            y.backward()
    assert chaos.raised == {"forward": 0, "backward": 1, "optimizer": 0}


def test_inject_oom_limit_and_bad_arguments() -> None:
    with inject_oom(1.0, limit=2) as chaos:
        for _ in range(5):
            with contextlib.suppress(torch.OutOfMemoryError):
                torch.ones(2) + 1
    assert chaos.total_raised == 2
    with pytest.raises(ConfigError, match="rate"), inject_oom(1.5):
        pass
    with pytest.raises(ConfigError, match="phase"), inject_oom(0.1, where=("compile",)):
        pass
