"""What CUDA kernels take beyond their outputs, from torch's CUDA sources (issue 42)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

import memfit
from memfit.estimate.torch._cuda_scratch import kernel_scratch

B200 = "B200"


def test_group_norm_backward_takes_float32_per_sample_and_channel_scratch() -> None:
    x = torch.empty(128, 64, 512, dtype=torch.bfloat16)
    w = torch.empty(64, dtype=torch.bfloat16)
    stats = torch.empty(128, 16)
    args = (x, x, stats, stats, w, 128, 64, 512, 16, [True, True, True])
    found = kernel_scratch("aten.native_group_norm_backward.default", args)
    assert found is not None
    # ds, db and c1 (N, C); c2, c3 (N, G); float32 for a bfloat16 input
    assert found.blocks == (128 * 64 * 4, 128 * 64 * 4, 128 * 16 * 4, 128 * 16 * 4, 128 * 64 * 4)
    no_dx = kernel_scratch(
        "aten.native_group_norm_backward.default", (*args[:9], [False, True, True])
    )
    assert no_dx is not None and no_dx.blocks == (128 * 64 * 4, 128 * 64 * 4)
    assert kernel_scratch("aten.mm.default", (x, x)) is None


def _group_norm(channels: int) -> Any:
    def build() -> Any:
        return nn.GroupNorm(channels // 4, channels), None

    def make_batch(n: int) -> Any:
        return torch.randn(n, channels, 512, requires_grad=True)

    def step(model: Any, _opt: Any, x: Any) -> None:
        model(x).sum().backward()

    return build, step, make_batch


def test_a_cuda_target_counts_group_norm_backward_scratch_and_reports_it() -> None:
    b200 = memfit.estimate_torch(*_group_norm(1024), [128], gpu=B200, steps=1)
    uses = b200.kernels["aten.native_group_norm_backward"]
    assert uses[0].workspace_bytes == int(3.5 * 128 * 1024 * 4)


def test_layer_norm_backward_copies_a_gradient_that_is_not_contiguous() -> None:
    x = torch.empty(4096, 1024, dtype=torch.bfloat16)
    expanded = torch.empty((), dtype=torch.bfloat16).expand(4096, 1024)
    stats = torch.empty(4096, 1)
    names = ("aten.native_layer_norm_backward.default", "aten._fused_rms_norm_backward.default")
    for name in names:
        found = kernel_scratch(name, (expanded, x, [1024], stats, stats))
        assert found is not None and found.blocks == (4096 * 1024 * 2,)  # dY.contiguous()
        assert kernel_scratch(name, (x, x, [1024], stats, stats)) is None  # nothing to copy


def test_embedding_backward_sorts_above_3072_indices() -> None:
    name = "aten.embedding_dense_backward.default"
    grad = torch.empty(8, 1024, 768, dtype=torch.bfloat16)
    many = torch.empty(8, 1024, dtype=torch.long)
    found = kernel_scratch(name, (grad, many, 50257, -1, False))
    assert found is not None
    n = 8 * 1024
    # six index-sized buffers, two counters, float32 per-segment sums
    assert found.blocks == (*[n * 8] * 6, 8, 8, n * 768 * 4)
    few = torch.empty(4, 512, dtype=torch.long)
    assert kernel_scratch(name, (torch.empty(4, 512, 768), few, 30522, -1, False)) is None
