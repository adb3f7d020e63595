"""``memfit.fit`` on a real CUDA device (skipped where torch has no CUDA)."""

from __future__ import annotations

import pytest
import torch

from memfit.runtime.fit import fit

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

MiB = 2**20


def test_fit_caps_the_allocator_and_restores_the_fraction() -> None:
    index = torch.cuda.current_device()
    before = torch.cuda.get_per_process_memory_fraction(index)

    def run(value: int) -> None:
        x = torch.ones(value, MiB // 4, device="cuda")  # 1 MiB per item
        (x * 2).sum().item()

    result = fit(run, low=1, high=100_000, budget="512MiB", margin=0.0, device="cuda")
    # Two live 1 MiB-per-item tensors: a little under 256 items fit in 512 MiB reserved.
    assert 200 <= result.value <= 256
    assert all(p.peak_bytes is not None and p.peak_bytes <= 512 * MiB for p in result.probes)
    assert torch.cuda.get_per_process_memory_fraction(index) == before


def test_an_oom_probe_on_cuda_is_caught() -> None:
    def run(value: int) -> None:
        torch.empty(value, MiB, dtype=torch.uint8, device="cuda").fill_(1)

    result = fit(run, low=1, high=100_000, budget="256MiB", margin=0.0, device="cuda", prior=4096)
    assert not result.probes[0].ok
    assert result.oom_count >= 1
    assert result.value <= 256


def test_fit_inside_a_capped_allocator_takes_the_cap_as_its_budget() -> None:
    from memfit.runtime.simulate import simulate_gpu

    def run(value: int) -> None:
        torch.empty(value, MiB, dtype=torch.uint8, device="cuda").fill_(1)

    with simulate_gpu("256MiB", device="cuda"):
        result = fit(run, low=1, high=100_000, margin=0.0, device="cuda", prior=64)
    assert result.budget_bytes == 256 * MiB
    assert result.value <= 256
