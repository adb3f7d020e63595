"""The workspace cuDNN takes inside a convolution on a CUDA target.

PyTorch runs a CUDA convolution through cuDNN (``aten/src/ATen/native/cudnn/Conv_v7.cpp``,
``Conv_v8.cpp``): for each of the forward, backward-data and backward-filter kernels it asks
cuDNN for an algorithm (its heuristics under ``torch.backends.cudnn.benchmark=False``, a
timed search under ``True``), allocates that algorithm's workspace through the caching
allocator, runs it and frees the workspace: a transient inside the op, on top of everything
live. How large depends on the algorithm cuDNN's heuristics pick for the GPU, the cuDNN
version, the dtype, the memory format and the shapes, and cuDNN does not publish its
heuristics. What is modelled, with its source:

* **Half precision, NCHW, tensor-core GPUs (sm70+), cuDNN 7**: the tensor-core kernels run
  in NHWC; cuDNN transposes the input into its workspace and accumulates the output in
  float32 there before writing it back. pytorch#50990 (torch 1.7.1, CUDA 10.2, cuDNN
  7.6.5, V100) measured a float16 ``Conv2d(32, 32, 3)`` on a ``512x32x84x84`` input at
  1,123,495,936 B allocated against 451,562,496 B of tensors: 671,933,440 B of workspace,
  the input (231,211,008 B) plus the output in float32 (440,664,064 B) to within 60 kB.
  The backward kernels are taken to do the same with their own input and output.
* **Half precision, NCHW, sm70+, cuDNN 8 and 9**: no public figure was found. The same
  layout change is bounded by the NHWC copies of the kernel's input and output (and
  weight) in their own dtype; the estimate says it is a bound (the real heuristic may take
  less, pytorch#50990's author saw the spike go with CUDA 11).
* **Float32, channels-last tensors, or GPUs without tensor cores**: cuDNN's implicit-GEMM
  engines, which take no workspace or a small one (pytorch#50990's float32 run: about
  1 MiB above its tensors); counted as none.
* ``cudnn.benchmark=True``: the timed search may try workspaces up to the largest block the
  allocator has free at that moment (Conv_v7.cpp ``getMaxWorkspaceSize``); a bound that
  depends on the allocator's state, so the heuristic figure is kept and the estimate says
  the first step's search may take more.

Depthwise convolutions (``groups == channels``) run PyTorch's own CUDA kernels in float32 and
take no workspace.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["ConvWorkspace", "conv_workspace"]

_HALF = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class ConvWorkspace:
    """cuDNN's workspace for one convolution op (the largest of its kernels).

    Attributes:
        nbytes: Bytes taken inside the op.
        kernel: What was assumed (``"cuDNN 7 NHWC transform (fp32 accumulation)"``).
        bound: ``True`` where the figure is a bound rather than a sourced size.
    """

    nbytes: int
    kernel: str
    bound: bool


def _nbytes(t: Any) -> int:
    return int(t.numel()) * int(t.element_size())


def _uses_cudnn(inp: Any, weight: Any, transposed: bool, groups: int) -> bool:
    if not torch.backends.cudnn.enabled:
        return False
    if inp.dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        return False
    channels = inp.shape[1] if inp.dim() > 1 else 0
    depthwise = not transposed and groups > 1 and groups == channels and inp.dim() in (4, 5)
    return not depthwise


def _channels_last(t: Any) -> bool:
    if t.dim() == 4:
        return bool(t.is_contiguous(memory_format=torch.channels_last)) and not bool(
            t.is_contiguous()
        )
    if t.dim() == 5:
        return bool(t.is_contiguous(memory_format=torch.channels_last_3d)) and not bool(
            t.is_contiguous()
        )
    return False


def _one_kernel(src: Any, dst_elems: int, dst_itemsize: int, weight: Any, cudnn_major: int) -> int:
    """Workspace of one kernel reading ``src`` and writing ``dst_elems`` elements."""
    if cudnn_major < 8:
        return _nbytes(src) + dst_elems * 4 + _nbytes(weight)
    return _nbytes(src) + dst_elems * dst_itemsize + _nbytes(weight)


def conv_workspace(
    name: str,
    args: tuple[Any, ...],
    out: Any,
    *,
    capability: tuple[int, int] | None,
    cudnn_major: int,
) -> ConvWorkspace | None:
    """The workspace cuDNN takes inside ``aten.convolution`` or ``convolution_backward``.

    Args:
        name: The ATen op (``"aten.convolution.default"``).
        args: Its arguments (the traced tensors).
        out: Its output(s).
        capability: The GPU's compute capability (``None``: assumed to have tensor cores,
            the larger figure).
        cudnn_major: The target's cuDNN major version.

    Returns:
        ``None`` when the op does not run through cuDNN on the target.
    """
    if name == "aten.convolution.default":
        inp, weight = args[0], args[1]
        transposed, groups = bool(args[6]), int(args[8])
        grad_out = None
    elif name == "aten.convolution_backward.default":
        grad_out, inp, weight = args[0], args[1], args[2]
        transposed, groups = bool(args[7]), int(args[9])
    else:
        return None
    if not _uses_cudnn(inp, weight, transposed, groups):
        return None
    tensor_cores = capability is None or capability >= (7, 0)
    nchw = not _channels_last(inp)
    if inp.dtype not in _HALF or not tensor_cores or not nchw:
        return ConvWorkspace(0, "cuDNN implicit GEMM (no workspace)", bound=False)
    itemsize = inp.element_size()
    if grad_out is None:
        output = out[0] if isinstance(out, (tuple, list)) else out
        size = _one_kernel(inp, int(output.numel()), itemsize, weight, cudnn_major)
    else:
        mask = args[10]
        size = 0
        if mask[0]:  # backward data: reads grad_output, writes grad_input
            size = max(size, _one_kernel(grad_out, int(inp.numel()), itemsize, weight, cudnn_major))
        if mask[1]:  # backward filter: reads input and grad_output, writes grad_weight
            filt = _nbytes(inp) + _nbytes(grad_out)
            filt += int(weight.numel()) * (4 if cudnn_major < 8 else itemsize)
            size = max(size, filt)
    if cudnn_major < 8:
        return ConvWorkspace(size, "cuDNN 7 NHWC transform (float32 accumulation)", bound=False)
    return ConvWorkspace(size, f"cuDNN {cudnn_major} NHWC transform (bound)", bound=True)
