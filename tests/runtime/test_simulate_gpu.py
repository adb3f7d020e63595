"""memfit.simulate_gpu: a smaller GPU for real PyTorch code on the CPU."""

from __future__ import annotations

import gc

import pytest
import torch
from torch import nn

import memfit
from memfit.allocator.model import round_size
from memfit.errors import BackendUnavailable, ConfigError
from memfit.runtime.simulate import active, simulate_gpu


def test_counts_live_bytes_rounded_like_the_caching_allocator() -> None:
    with simulate_gpu("1MiB") as gpu:
        a = torch.zeros(1000)  # 4000 bytes -> 4096
        b = torch.zeros(10)  # 40 bytes -> 512
        assert gpu.allocated_bytes == round_size(4000) + round_size(40) == 4608
        assert gpu.live_storages == 2
        del a
        assert gpu.allocated_bytes == 512
        assert gpu.peak_allocated_bytes == 4608
        gpu.reset_peak()
        assert gpu.peak_allocated_bytes == 512
        del b
    assert gpu.allocated_bytes == 0


def test_views_and_in_place_ops_allocate_nothing() -> None:
    x = torch.zeros(256, 256)
    with simulate_gpu("1MiB") as gpu:
        x.t()
        x[:10].view(-1)
        x.add_(1)
        assert gpu.allocated_bytes == 0
        y = x + 1
        assert gpu.allocated_bytes == round_size(256 * 256 * 4)
        del y


def test_allocation_over_budget_raises_torch_oom_and_allocates_nothing() -> None:
    with simulate_gpu("64KiB") as gpu:
        keep = torch.zeros(8000)  # 32000 bytes
        with pytest.raises(
            torch.OutOfMemoryError,
            match=r"CUDA out of memory\. Tried to allocate .* on memfit's simulated GPU",
        ):
            torch.zeros(9000)
        assert gpu.allocated_bytes == round_size(32000)
        assert gpu.oom_count == 1
        del keep


def test_storage_freed_after_the_context_is_given_back() -> None:
    with simulate_gpu("1MiB") as gpu:
        kept = torch.ones(100)
    assert gpu.allocated_bytes == 512
    del kept
    assert gpu.allocated_bytes == 0


def test_backward_and_optimizer_allocations_are_counted() -> None:
    model = nn.Linear(32, 32)
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(16, 32)
    with simulate_gpu("1MiB") as gpu:
        model(x).sum().backward()
        grads = gpu.allocated_bytes
        assert grads >= round_size(32 * 32 * 4) + round_size(32 * 4)
        opt.step()
        assert gpu.allocated_bytes > grads  # Adam's moments


def test_the_bytes_come_back_only_once_the_traceback_is_cleared() -> None:
    """Why memfit frees memory after the except block, with the frames cleared."""
    model = nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh())
    x = torch.randn(128, 64)
    with simulate_gpu("300KiB") as gpu:
        before = gpu.allocated_bytes
        caught: BaseException | None = None
        try:
            model(x).sum()
        except torch.OutOfMemoryError as exc:
            caught = exc
        assert caught is not None
        pinned = gpu.allocated_bytes
        assert pinned > before  # the failed forward's activations are held by the frames
        memfit.runtime.oom.forget_exception(caught)
        del caught
        gc.collect(1)
        assert gpu.allocated_bytes == before


def test_active_and_paused() -> None:
    assert active() is None
    with simulate_gpu("1MiB") as outer:
        assert active() is outer
        with simulate_gpu("2MiB") as inner:
            assert active() is inner
        assert active() is outer
        with outer.paused():
            host = torch.zeros(1000)
        assert outer.allocated_bytes == 0
        del host
    assert active() is None


def test_bad_budget_and_device() -> None:
    with pytest.raises(ConfigError, match="positive budget"), simulate_gpu(0):
        pass
    with pytest.raises(ConfigError, match="not a size"), simulate_gpu("lots"):
        pass
    with pytest.raises(ConfigError, match="unknown device"), simulate_gpu("1GiB", device="tpu"):
        pass


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path")
def test_cuda_mode_needs_cuda() -> None:
    with pytest.raises(BackendUnavailable, match="CUDA"), simulate_gpu("1GiB", device="cuda"):
        pass
