"""What CUDA kernels allocate beyond their outputs, read from torch's CUDA sources.

A fake tensor's kernel makes an operator's outputs; the CUDA kernel may also take tensors of
its own from the caching allocator while it runs and give them back before it returns. They
count in ``max_memory_allocated`` at that moment. Each rule here names the source it was
read from and gives the blocks the kernel holds at once (each a separate allocation, rounded
by the allocator on its own); :class:`memfit.estimate.torch._cuda_kernels.CudaKernels` adds them to
the trace at the operator, for the CUDA target.

* ``native_group_norm_backward`` (``aten/src/ATen/native/cuda/group_norm_kernel.cu``,
  ``GroupNormBackwardKernelImplInternal``, torch 1.9 to 2.10): ``ds`` and ``db``, ``(N, C)``
  in the accumulation type (float32 for half, bfloat16 and float; float64 for double);
  with the input's gradient, ``c2`` and ``c3`` ``(N, G)`` and, with a weight, ``c1``
  ``(N, C)`` (a ``TensorIterator`` output resized from ``{0}`` to ``rstd * gamma``'s
  broadcast shape). With ``HxW == 1`` only ``ds`` and ``db`` are taken before
  ``GroupNorm1dBackward`` (whose own buffers are not read here: not counted).
* ``native_layer_norm_backward`` (``aten/src/ATen/native/cuda/layer_norm_kernel.cu``,
  ``layer_norm_backward_cuda`` and ``LayerNormBackwardKernelImpl``): the input is taken
  ``expect_contiguous()`` (a copy when it is not contiguous) and the kernel is called with
  ``dY.contiguous()``: a copy of the incoming gradient when it is not contiguous (the
  expanded gradient of ``y.sum()``), held while the kernel runs.
* ``_fused_rms_norm_backward`` (torch 2.8 and later): the fused RMS norm shares that file's
  backward path (the layer-norm kernels templated for RMS norm), so the same two copies are
  counted; the RMS entry point itself was not re-read in this session (an assumption, said
  so in :data:`ASSUMED`).
* ``embedding_dense_backward`` (``aten/src/ATen/native/cuda/Embedding.cu``,
  ``embedding_dense_backward_cuda``, and ``EmbeddingBackwardKernel.cu``,
  ``embedding_backward_cuda_kernel``; torch 2.x): the gradient (and the indices) made
  contiguous; up to 3072 indices without ``scale_grad_by_freq`` nothing else. Above that,
  held at once when the per-segment sums are made: ``sorted_indices`` and ``orig_indices``
  (the indices' size and type), ``count`` with ``scale_grad_by_freq``, ``segment_offsets``,
  ``partials_per_segment``, ``partials_per_segment_offset`` and ``partial_segment_offset``
  (the indices' size each), two 8-byte counters, and ``grad_weight_per_segment``
  ``(num_indices, embedding_dim)`` in the accumulation type (float32 for half and
  bfloat16).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["ASSUMED", "SCRATCH_RULES", "Scratch", "kernel_scratch"]


@dataclass(frozen=True)
class Scratch:
    """The blocks one CUDA kernel call holds at once besides its outputs.

    Attributes:
        kernel: The kernel, as its source names it.
        blocks: Bytes of each block (each its own allocation).
        source: The file the rule was read from.
    """

    kernel: str
    blocks: tuple[int, ...]
    source: str

    @property
    def nbytes(self) -> int:
        """All blocks together."""
        return sum(self.blocks)


def _acc_itemsize(dtype: torch.dtype) -> int:
    """``acc_type<T, true>`` on CUDA: float for half, bfloat16 and float; double for double."""
    return 8 if dtype == torch.float64 else 4


def _group_norm_backward(args: tuple[Any, ...]) -> Scratch | None:
    names = ("grad_out", "input", "mean", "rstd", "weight", "N", "C", "HxW", "group", "mask")
    bound = dict(zip(names, args, strict=False))
    x = bound.get("input")
    if not isinstance(x, torch.Tensor):
        return None
    n, c, hxw, g = (int(bound[k]) for k in ("N", "C", "HxW", "group"))
    if n == 0:
        return None
    acc = _acc_itemsize(x.dtype)
    blocks = [n * c * acc, n * c * acc]  # ds, db
    mask = bound.get("mask") or (True, True, True)
    if hxw != 1 and mask[0]:
        blocks += [n * g * acc, n * g * acc]  # c2, c3
        if isinstance(bound.get("weight"), torch.Tensor):
            blocks.append(n * c * acc)  # c1
    return Scratch(
        "GroupNormBackwardKernelImplInternal",
        tuple(blocks),
        "aten/src/ATen/native/cuda/group_norm_kernel.cu",
    )


def _contiguous_copies(grad: Any, x: Any, kernel: str, source: str) -> Scratch | None:
    blocks = tuple(
        t.numel() * t.dtype.itemsize
        for t in (x, grad)
        if isinstance(t, torch.Tensor) and not t.is_contiguous()
    )
    return Scratch(kernel, blocks, source) if blocks else None


def _layer_norm_backward(args: tuple[Any, ...]) -> Scratch | None:
    return _contiguous_copies(
        args[0] if args else None,
        args[1] if len(args) > 1 else None,
        "LayerNormBackwardKernelImpl (dY.contiguous(), X.expect_contiguous())",
        "aten/src/ATen/native/cuda/layer_norm_kernel.cu",
    )


def _rms_norm_backward(args: tuple[Any, ...]) -> Scratch | None:
    return _contiguous_copies(
        args[0] if args else None,
        args[1] if len(args) > 1 else None,
        "fused RMS norm backward (dY.contiguous(), X.expect_contiguous())",
        "aten/src/ATen/native/cuda/layer_norm_kernel.cu (layer norm's path, assumed)",
    )


def _embedding_backward(args: tuple[Any, ...]) -> Scratch | None:
    names = ("grad", "indices", "num_weights", "padding_idx", "scale_grad_by_freq")
    bound = dict(zip(names, args, strict=False))
    grad, indices = bound.get("grad"), bound.get("indices")
    if not isinstance(grad, torch.Tensor) or not isinstance(indices, torch.Tensor):
        return None
    blocks = [t.numel() * t.dtype.itemsize for t in (indices, grad) if not t.is_contiguous()]
    n = indices.numel()
    scale = bool(bound.get("scale_grad_by_freq", False))
    if n > 3072 or scale:
        idx = indices.dtype.itemsize
        blocks += [n * idx] * (6 + int(scale))  # sorted, orig, (count), segment buffers
        blocks += [8, 8]  # the segment counters
        dim = grad.shape[-1] if grad.dim() else 1
        blocks.append(n * dim * _acc_itemsize(grad.dtype))  # grad_weight_per_segment
    if not blocks:
        return None
    return Scratch(
        "embedding_backward_cuda_kernel (sorted indices, per-segment sums)",
        tuple(blocks),
        "aten/src/ATen/native/cuda/Embedding.cu, EmbeddingBackwardKernel.cu",
    )


#: Rules taken by analogy rather than read, with why.
ASSUMED: dict[str, str] = {
    "aten._fused_rms_norm_backward.default": "the layer-norm backward's copies, assumed for "
    "the RMS variant of the same kernels (its entry point not read in this session)",
}

#: The rules, by ATen operator.
SCRATCH_RULES: dict[str, Callable[[tuple[Any, ...]], Scratch | None]] = {
    "aten.native_group_norm_backward.default": _group_norm_backward,
    "aten.native_layer_norm_backward.default": _layer_norm_backward,
    "aten._fused_rms_norm_backward.default": _rms_norm_backward,
    "aten.embedding_dense_backward.default": _embedding_backward,
}


def kernel_scratch(name: str, args: tuple[Any, ...]) -> Scratch | None:
    """What the CUDA kernel of ``name`` takes inside for these arguments, or ``None``
    (no rule, or nothing taken)."""
    rule = SCRATCH_RULES.get(name)
    return None if rule is None else rule(args)
