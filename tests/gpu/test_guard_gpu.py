"""TrainGuard, RolloutGuard, simulate_gpu(device="cuda") and is_oom against a real CUDA GPU.

Auto-marked ``gpu`` (tests/conftest.py); skipped where torch sees no CUDA device.
"""

from __future__ import annotations

import gc

import pytest
import torch
from torch import nn

import memfit
from memfit.runtime.guard import RolloutGuard, TrainGuard
from memfit.runtime.simulate import simulate_gpu

MiB = 1024 * 1024


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)).cuda()


def test_a_real_cuda_oom_is_recognised_and_its_memory_comes_back() -> None:
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    total = torch.cuda.get_device_properties(0).total_memory

    def grab() -> None:
        keep = torch.empty(total // 2, dtype=torch.uint8, device="cuda")
        more = torch.empty(total, dtype=torch.uint8, device="cuda")  # cannot fit
        del keep, more

    caught = None
    try:
        grab()
    except Exception as exc:  # the real allocator's error
        caught = exc
    assert caught is not None and memfit.is_oom(caught)
    assert isinstance(caught, torch.OutOfMemoryError)
    assert torch.cuda.memory_allocated() > before  # grab's frame still pins `keep`
    memfit.runtime.oom.forget_exception(caught)
    del caught
    gc.collect(1)
    assert torch.cuda.memory_allocated() == before


def test_guard_under_a_capped_allocator_matches_the_uncapped_run() -> None:
    gen = torch.Generator(device="cuda").manual_seed(1)
    data = [
        (
            torch.randn(8192, 1024, device="cuda", generator=gen),
            torch.randn(8192, 1024, device="cuda", generator=gen),
        )
        for _ in range(6)
    ]

    def run(budget: int | None) -> tuple[list[torch.Tensor], TrainGuard]:
        model = _model()
        opt = torch.optim.Adam(model.parameters(), lr=1e-4)
        guard = TrainGuard(opt, lambda b: nn.functional.mse_loss(model(b[0]), b[1]))
        if budget is None:
            for b in data:
                guard(b)
        else:
            with simulate_gpu(budget, device="cuda"):
                for b in data:
                    guard(b)
        return [p.detach().clone() for p in model.parameters()], guard

    torch.cuda.synchronize()
    baseline = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    reference, _ = run(None)
    need = torch.cuda.max_memory_reserved() - baseline
    torch.cuda.empty_cache()
    baseline = torch.cuda.memory_allocated()  # now with the reference's parameters
    # The full batch's activations (8192 x 4096 floats, twice, and their gradients) dominate
    # the step: 70% of what the uncapped run reserved leaves room for the weights, gradients,
    # Adam's state and its step, but not for the whole batch at once.
    params, guard = run(baseline + int(0.7 * need))
    assert any(e.kind == "split" for e in guard.events)
    for p, q in zip(params, reference, strict=True):
        assert float((p - q).norm() / q.norm()) <= 1e-5


def test_rollout_guard_on_cuda() -> None:
    policy = _model()
    obs = torch.randn(8192, 1024, device="cuda")
    with torch.no_grad():
        expected = policy(obs[:16])

    def act(o: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return policy(o)

    guard = RolloutGuard(act)
    baseline = torch.cuda.memory_allocated()
    with simulate_gpu(baseline + 100 * MiB, device="cuda"):
        out = guard(obs)
    assert guard.splits > 1
    torch.testing.assert_close(out[:16], expected)


def test_simulate_gpu_cuda_restores_the_fraction() -> None:
    before = torch.cuda.get_per_process_memory_fraction(0)
    with simulate_gpu("1GiB", device="cuda") as gpu:
        assert gpu.budget_bytes == 2**30
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda")
    assert torch.cuda.get_per_process_memory_fraction(0) == before
