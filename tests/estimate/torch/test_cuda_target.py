"""A CPU trace for a CUDA target: the optimizer's CUDA default and the steady state."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import memfit
from memfit.allocator.model import round_size
from memfit.estimate.torch._cuda_defaults import cuda_optimizer_defaults

WIDTH = 512


def _build() -> tuple[Any, Any]:
    model = nn.Sequential(*(nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(6)))
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def _step(model: Any, opt: Any, batch: Any) -> None:
    model(batch).sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def _batch(n: int) -> Any:
    return torch.randn(n, WIDTH)


def test_adam_steps_with_foreach_for_a_cuda_target() -> None:
    cpu = memfit.estimate_torch(_build, _step, _batch, [1], device="cpu", kernel_scratch=False)
    cuda = memfit.estimate_torch(
        _build, _step, _batch, [1], device="cpu", gpu="V100", kernel_scratch=False
    )
    weight = round_size(WIDTH * WIDTH * 4)
    params = 6 * weight
    # At batch 1 the peak is Adam's step: parameters, gradients, two moments, and the step's
    # temporaries. The loop makes those for one parameter at a time; foreach makes sqrt(v)
    # for all six parameters at once: exactly one more parameter-sized buffer.
    for est in (cpu, cuda):
        parts = est.points[0].breakdown
        assert parts["parameters"] == parts["gradients"] == params
        assert parts["optimizer_state"] >= 2 * params
    assert cuda.points[0].breakdown["temporaries"] == params
    assert cpu.points[0].breakdown["temporaries"] <= params // 2
    assert any("foreach" in d for d in cuda.deviations)
    assert not any("foreach" in d for d in cpu.deviations)


def test_an_explicit_foreach_is_left_alone() -> None:
    def build() -> tuple[Any, Any]:
        model, _ = _build()
        return model, torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)

    loop = memfit.estimate_torch(build, _step, _batch, [1], gpu="V100", kernel_scratch=False)
    cpu = memfit.estimate_torch(_build, _step, _batch, [1], device="cpu", kernel_scratch=False)
    assert loop.points[0].tensor_peak == cpu.points[0].tensor_peak


def test_the_wrap_is_undone_and_nests() -> None:
    import torch.optim.adam as adam

    original = adam._default_to_fused_or_foreach
    with cuda_optimizer_defaults() as outer, cuda_optimizer_defaults() as inner:
        assert "torch.optim.adam" in outer and inner == []
        params = [torch.zeros(2)]
        assert adam._default_to_fused_or_foreach(params, False) == (False, True)
    assert adam._default_to_fused_or_foreach is original
    assert original([torch.zeros(2)], False) == (False, False)


def test_a_periodic_step_is_replayed_to_steady_state() -> None:
    est = memfit.estimate_torch(_build, _step, _batch, [4], gpu="V100", kernel_scratch=False)
    assert any("replayed on through the allocator model" in d for d in est.deviations)
    two = memfit.estimate_torch(
        _build, _step, _batch, [4], gpu="V100", kernel_scratch=False, steps=2
    )
    assert not any("replayed on" in d for d in two.deviations)
    assert est.points[0].allocated_peak == two.points[0].allocated_peak


def test_a_step_that_keeps_memory_is_named() -> None:
    kept: list[Any] = []

    def step(model: Any, opt: Any, batch: Any) -> None:
        out = model(batch)
        kept.append(out.detach())  # a history that grows by one output per step
        out.sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    est = memfit.estimate_torch(_build, step, _batch, [64], gpu="V100", kernel_scratch=False)
    note = next(d for d in est.deviations if "keeps" in d and "cuBLAS" not in d)
    assert "128.00 KiB" in note
    # The replay runs the leak on: more is reserved than three steps hold.
    three = 3 * round_size(64 * WIDTH * 4)
    assert est.points[0].reserved_peak > est.points[0].allocated_peak + three


@pytest.mark.parametrize("steps", [1, 2])
def test_fewer_than_three_steps_say_nothing_of_a_steady_state(steps: int) -> None:
    est = memfit.estimate_torch(
        _build, _step, _batch, [4], gpu="V100", kernel_scratch=False, steps=steps
    )
    assert not any("steady" in d for d in est.deviations)
