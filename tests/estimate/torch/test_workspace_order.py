"""A kernel's library workspace is taken after the op's outputs, in the order the H100
corpus shows (issue 48): ``addmm_out_cuda_impl`` allocates its result, then the cuBLAS call
gets the handle, which takes its workspace on first use (cuBLAS's, then cuBLASLt's kept
1 MiB); ``cudnn_convolution_backward`` allocates ``grad_input`` and runs its kernel with
its workspace, then ``grad_weight`` and its kernel's."""

from __future__ import annotations

from functools import cache
from typing import Any

import torch

from memfit.estimate.torch.trace import trace_requests


def _build() -> tuple[Any, Any]:
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3), torch.nn.Conv2d(8, 8, 3), torch.nn.Flatten(),
        torch.nn.Linear(8 * 4 * 4, 4),
    )  # fmt: skip
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def _step(model: Any, opt: Any, batch: Any) -> None:
    opt.zero_grad()
    model(batch).sum().backward()
    opt.step()


@cache
def _requests() -> list[Any]:
    return trace_requests(
        _build,
        _step,
        lambda n: torch.randn(n, 3, 8, 8),
        4,
        gpu="H100",
        steps=1,
        kernel_scratch=False,
    )


def test_the_cublas_workspaces_follow_the_first_matmuls_output() -> None:
    requests = _requests()
    first = next(i for i, r in enumerate(requests) if r.op == "aten.addmm.default")
    out, cublas, lt = requests[first : first + 3]
    assert out.target == "all" and out.nbytes == 4 * 4 * 4  # the result first
    assert cublas.target == "cuda" and not cublas.transient  # cuBLAS's, kept
    assert lt.target == "cuda" and lt.nbytes == 2**20  # cuBLASLt's own 1 MiB, kept


def test_a_convolution_backward_takes_each_kernels_workspace_after_its_output() -> None:
    requests = _requests()
    backward = [r for r in requests if r.op == "aten.convolution_backward.default"]
    # the second convolution's backward: grad_input (4 x 8 x 6 x 6 floats), its kernel's
    # workspace, grad_weight (8 x 8 x 3 x 3), its kernel's workspace, then grad_bias
    kinds = [("ws" if r.transient else r.nbytes) for r in backward[:5]]
    assert kinds == [4 * 8 * 6 * 6 * 4, "ws", 8 * 8 * 3 * 3 * 4, "ws", 8 * 4]
