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
* ``sort`` (``aten/src/ATen/native/cuda/Sort.cpp``, ``sort_cuda_kernel``; ``SortStable.cu``,
  ``launch_stable_sort_kernel``; ``aten/src/ATen/cuda/cub.cuh`` and CUB's
  ``dispatch_radix_sort.cuh``): up to 4096 elements along the sorted dimension the
  key-value pairs are sorted in place in shared memory (``should_use_small_sort``, torch 2.1
  and later): nothing. Above it CUB's radix sort runs: the input copied with the sorted
  dimension innermost when it is not already (and the outputs sorted into temporaries when
  their strides differ), then by the number of segments (rows): one segment, or 10^6
  elements or more per row, ``segmented_sort_large_segments`` (an index row of ``nsort``
  int64 and each row's CUB temporary storage); under 128 rows
  ``segmented_sort_pairs_by_full_sort`` (two ``(n,)`` int2 buffers, a keys output CUB
  sorts into and the CUB temporary storage); otherwise ``segmented_sort_pairs`` (an
  ``(n,)`` int64 index and CUB's segmented temporary storage). CUB's temporary storage for
  ``DeviceRadixSort::SortPairs`` into separate outputs is an alternate keys and values
  buffer (``num_items * sizeof``, when more than one digit pass) plus bins, lookback and
  counters (``allocation_sizes`` of ``InvokeOnesweep``), counted here as a bound of 256 x 8
  bytes per pass and 1 KiB per 2,048 items; ``DeviceSegmentedRadixSort``'s is the third keys
  and values buffer alone (``DispatchSegmentedRadixSort::InvokePasses``).
* ``index_put`` with ``accumulate=True`` (``aten/src/ATen/native/cuda/Indexing.cu``,
  ``index_put_with_sort_kernel``; the backward of advanced indexing, ``x[idx]``): the
  linear index (int64, one per indexed position), ``sorted_indices``, ``orig_indices`` and
  the ``arange`` it sorts (int64 each), CUB's ``radix_sort_pairs`` temporary storage
  (int64 keys and values), the values expanded and made contiguous when they are not
  already, and copies of ``self`` when it is not contiguous or the indexed dimensions are
  not adjacent (the transposed source made contiguous). Without ``accumulate`` (and without
  deterministic algorithms) CUDA's ``index_put`` is a TensorIterator kernel: nothing.
* ``native_batch_norm`` in training on a channels-last input
  (``aten/src/ATen/native/cuda/Normalization.cuh``,
  ``batch_norm_stats_channels_last_cuda_template`` and ``flexible_launch_configs``):
  when the reduction is split over 8 or more block rows, a staging buffer of
  ``4 * C * grid.y`` values of the accumulation type and ``grid.x`` int32 semaphores.
  The contiguous (NCHW) kernels keep their sums in shared memory: nothing. cuDNN's batch
  norm (float and half with cuDNN on) takes a workspace cuDNN sizes itself: not published,
  so :data:`ASSUMED` says so.
* ``native_batch_norm_backward`` in training on a channels-last input
  (``batch_norm_backward_reduce_cuda_channels_last_template``, ``Normalization.cuh``):
  ``sumn_dy`` and ``sum_dy_xmu`` (``C`` each, accumulation type) and, split over 8 or more
  block rows, ``2 * C * grid.y`` staging values and ``grid.x`` semaphores. The contiguous
  backward kernel reduces in shared memory: nothing.
* ``cumsum`` and ``cumprod`` (``aten/src/ATen/native/ReduceOps.cpp``, ``impl_func_cum_ops``;
  ``aten/src/ATen/native/cuda/ScanUtils.cuh``, ``scan_dim``): the input converted to the
  result's type when it differs (``self.to(result.scalar_type())``: a bool or integer mask
  summed into int64), made contiguous when it is not, and, when the tensor is one row, CUB's
  ``inclusive_scan`` temporary storage (its tile states, bounded here).
* ``topk`` (``aten/src/ATen/native/cuda/TensorTopK.cpp``): at most 10 rows of 100,000 or
  more, the whole input sorted (its values, int64 indices and the sort's own buffers);
  otherwise, with ``sorted`` and ``k`` above 4096, the selected values sorted into new
  tensors with the sort's buffers. The multi-block radix select's own buffers were not read
  (:data:`ASSUMED`).
* Inputs a kernel takes ``.contiguous()``: ``_softmax``/``_log_softmax`` (``SoftMax.cu``,
  ``host_softmax``), ``nll_loss_forward`` and ``nll_loss_backward`` (``Loss.cu``: input,
  target, weight and the incoming gradient): a copy of each that is not contiguous. Their
  reductions run in shared memory: nothing else. (``cross_entropy`` is ``log_softmax`` and
  ``nll_loss``; ``kl_div`` is a composite of pointwise ops and a sum; ``mse_loss`` and the
  other reduced losses build the unreduced loss in device-generic code,
  :mod:`memfit.estimate.torch._measured_scratch`.)
* ``_foreach_*`` and the fused optimizers (``_fused_adam_``, ``_fused_adamw_``,
  ``_fused_sgd_``, ``_fused_adagrad_``): ``aten/src/ATen/native/cuda/MultiTensorApply.cuh``
  hands each launch its tensor list (``TensorListMetadata``: addresses, sizes, the block
  to tensor and chunk maps) by value as the kernel's argument, in chunks of 65,536
  elements per block: no device memory beyond the outputs (:data:`NO_SCRATCH`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["ASSUMED", "NO_SCRATCH", "SCRATCH_RULES", "Scratch", "kernel_scratch", "no_scratch"]


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


#: A rule: the op's positional and keyword arguments -> what its kernel takes, or ``None``.
_Rule = Callable[[tuple[Any, ...], dict[str, Any]], Scratch | None]


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


# --- sorts (CUB radix sort) ---------------------------------------------------------------

#: ``should_use_small_sort`` (``aten/src/ATen/native/cuda/SortStable.h``, torch 2.1 on):
#: rows this long or shorter are sorted in place in shared memory.
SMALL_SORT = 4096
#: ``segmented_sort_large_segments`` above this many elements per row (``SortStable.cu``).
LARGE_SEGMENT = 1_000_000
#: ``segmented_sort_pairs_by_full_sort`` below this many rows (``SortStable.cu``).
FULL_SORT_SEGMENTS = 128


def cub_sort_pairs_temp(
    n: int, key_bytes: int, value_bytes: int, key_bits: int | None = None
) -> int:
    """Bytes of CUB's temporary storage for ``DeviceRadixSort::SortPairs`` of ``n`` pairs into
    separate outputs (CUB's ``dispatch_radix_sort.cuh``, ``InvokeOnesweep``'s
    ``allocation_sizes``): the alternate keys and values buffers when more than one 8-bit
    digit pass runs, and a bound on the bins, lookback and counters."""
    if n <= 0:
        return 0
    bits = key_bytes * 8 if key_bits is None else max(1, key_bits)
    passes = -(-bits // 8)
    alternates = n * (key_bytes + value_bytes) if passes > 1 else 0
    small = passes * 256 * 8 + -(-n // 2048) * 1024 + passes * 8
    return alternates + small


def cub_segmented_sort_pairs_temp(n: int, key_bytes: int, value_bytes: int) -> int:
    """Bytes of CUB's temporary storage for ``DeviceSegmentedRadixSort::SortPairs`` into
    separate outputs (``DispatchSegmentedRadixSort::InvokePasses``: a third keys and values
    buffer, nothing else)."""
    return max(0, n) * (key_bytes + value_bytes)


def _dim(x: torch.Tensor, dim: Any) -> int:
    d = int(dim) if isinstance(dim, int) else -1
    return d + x.dim() if d < 0 else d


def _sort(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Scratch | None:
    x = args[0] if args else None
    if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.numel() == 0:
        return None
    dim = _dim(x, kwargs.get("dim", args[1] if len(args) > 1 else -1))
    nsort = int(x.shape[dim])
    if nsort <= SMALL_SORT:
        return None
    n, isz = x.numel(), x.dtype.itemsize
    blocks: list[int] = []
    if not (_dense(x) and x.stride(dim) == 1):
        # self_ with the sorted dimension innermost; the outputs keep self's (dense)
        # strides, so the sort goes into temporaries copied back after
        blocks += [n * isz, n * isz, n * 8]
    nsegments = n // nsort
    if nsegments == 1 or nsort >= LARGE_SEGMENT:
        blocks += [nsort * 8, cub_sort_pairs_temp(nsort, isz, 8)]
        kernel = "segmented_sort_large_segments (CUB radix sort per row)"
    elif nsegments < FULL_SORT_SEGMENTS:
        # indices_and_segment, indices_and_segment2 (int2), the keys output, CUB's storage
        blocks += [n * 8, n * 8, n * isz, cub_sort_pairs_temp(n, isz, 8)]
        kernel = "segmented_sort_pairs_by_full_sort (CUB radix sort)"
    else:
        blocks += [n * 8, cub_segmented_sort_pairs_temp(n, isz, 8)]
        kernel = "segmented_sort_pairs (CUB segmented radix sort)"
    return Scratch(
        kernel,
        tuple(blocks),
        "aten/src/ATen/native/cuda/Sort.cpp, SortStable.cu; aten/src/ATen/cuda/cub.cuh; "
        "CUB dispatch_radix_sort.cuh",
    )


def _dense(x: torch.Tensor) -> bool:
    """``is_non_overlapping_and_dense``: some permutation of the dimensions is contiguous."""
    expected = 1
    for size, stride in sorted(zip(x.shape, x.stride(), strict=True), key=lambda p: p[1]):
        if size == 1:
            continue
        if stride != expected:
            return False
        expected *= size
    return True


# --- index_put with accumulate (sort-based) ------------------------------------------------


def _index_put(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Scratch | None:
    names = ("self", "indices", "values", "accumulate", "unsafe")
    bound = {**dict(zip(names, args, strict=False)), **kwargs}
    x, indices, values = bound.get("self"), bound.get("indices"), bound.get("values")
    if not bound.get("accumulate", False) or not isinstance(x, torch.Tensor):
        return None
    if not isinstance(values, torch.Tensor) or not isinstance(indices, list | tuple):
        return None
    used = [(i, t) for i, t in enumerate(indices) if isinstance(t, torch.Tensor)]
    if not used or x.numel() == 0:
        return None
    shapes = []
    indexed = 0
    for _, t in used:
        if t.dtype == torch.bool:  # a mask: nonzero's count is data-dependent; its size bounds it
            shapes.append(torch.Size([t.numel()]))
            indexed += t.dim()
        else:
            shapes.append(t.shape)
            indexed += 1
    try:
        num_indices = torch.broadcast_shapes(*shapes).numel()  # type: ignore[no-untyped-call]
    except RuntimeError:
        return None
    if num_indices == 0:
        return None
    rest = 1
    for d in range(indexed, x.dim()):
        rest *= int(x.shape[d])
    isz = x.dtype.itemsize
    blocks: list[int] = []
    if not x.is_contiguous():
        blocks.append(x.numel() * isz)  # self.contiguous()
    positions = [i for i, _ in used]
    if positions != list(range(positions[0], positions[0] + len(positions))):
        blocks.append(x.numel() * isz)  # the transposed source made contiguous
    vals = num_indices * rest
    if values.numel() != vals or not values.is_contiguous():
        blocks.append(vals * values.dtype.itemsize)  # expandedValue.contiguous()
    # linearIndex, sorted_indices, orig_indices, the arange; CUB's storage (int64 pairs)
    blocks += [num_indices * 8] * 4
    blocks.append(cub_sort_pairs_temp(num_indices, 8, 8))
    return Scratch(
        "index_put_with_sort_kernel (CUB radix sort of the linear index)",
        tuple(blocks),
        "aten/src/ATen/native/cuda/Indexing.cu (index_put_with_sort_kernel)",
    )


# --- batch norm -----------------------------------------------------------------------------


def _last_pow2(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def _channels_last(x: torch.Tensor) -> bool:
    """``batch_norm_use_channels_last_kernels`` (``Normalization.cu``)."""
    return (
        (x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last))
        or (x.dim() == 5 and x.is_contiguous(memory_format=torch.channels_last_3d))
        or (x.is_contiguous() and x.stride(1) == 1)
    )


def _flexible_grid(reduction: int, stride: int) -> tuple[int, int]:
    """``(grid.x, grid.y)`` of ``flexible_launch_configs(reduction, stride, coop_flag=true)``
    (``Normalization.cuh``: 512 threads, 16 elements per thread, at most 128 block rows, no
    grid reduction under 8)."""
    block_x = min(_last_pow2(stride), 32)
    block_y = min(_last_pow2(-(-reduction // 16)), 512 // block_x)
    if block_x * block_y != 512:
        block_x = min(_last_pow2(stride), 512 // block_y)
    grid_y = min(-(-reduction // (block_y * 16)), 128)
    return -(-stride // block_x), (1 if grid_y < 8 else grid_y)


def _batch_norm_stats(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Scratch | None:
    names = ("input", "weight", "bias", "running_mean", "running_var", "training")
    bound = {**dict(zip(names, args, strict=False)), **kwargs}
    x = bound.get("input")
    if not isinstance(x, torch.Tensor) or not bound.get("training") or x.dim() < 2:
        return None
    if not _channels_last(x) or x.numel() == 0:
        return None
    stride = int(x.shape[1])
    grid_x, grid_y = _flexible_grid(x.numel() // stride, stride)
    if grid_y == 1:
        return None
    acc = _acc_itemsize(x.dtype)
    return Scratch(
        "batch_norm_stats_channels_last_cuda_template (staging data, semaphores)",
        (4 * stride * grid_y * acc, grid_x * 4),
        "aten/src/ATen/native/cuda/Normalization.cuh",
    )


def _batch_norm_backward(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Scratch | None:
    names = ("grad_out", "input", "weight", "running_mean", "running_var", "save_mean",
             "save_invstd", "train")  # fmt: skip
    bound = {**dict(zip(names, args, strict=False)), **kwargs}
    x = bound.get("input")
    if not isinstance(x, torch.Tensor) or not bound.get("train") or x.dim() < 2:
        return None
    if not _channels_last(x) or x.numel() == 0:
        return None
    stride = int(x.shape[1])
    grid_x, grid_y = _flexible_grid(x.numel() // stride, stride)
    acc = _acc_itemsize(x.dtype)
    blocks = [stride * acc, stride * acc]  # sumn_dy, sum_dy_xmu
    if grid_y > 1:
        blocks += [2 * stride * grid_y * acc, grid_x * 4]  # staging data, semaphores
    return Scratch(
        "batch_norm_backward_reduce_cuda_channels_last_template (sums, staging data)",
        tuple(blocks),
        "aten/src/ATen/native/cuda/Normalization.cuh",
    )


# --- inputs made contiguous inside the kernel ----------------------------------------------


def _contiguous_inputs(positions: tuple[int, ...], kernel: str, source: str) -> _Rule:
    """A rule for a kernel that takes the tensors at ``positions`` ``.contiguous()`` (or
    ``expect_contiguous()``): a copy of each one that is not, held while it runs."""

    def rule(args: tuple[Any, ...], _kwargs: dict[str, Any]) -> Scratch | None:
        blocks = tuple(
            t.numel() * t.dtype.itemsize
            for t in (args[i] for i in positions if i < len(args))
            if isinstance(t, torch.Tensor) and not t.is_contiguous()
        )
        return Scratch(kernel, blocks, source) if blocks else None

    return rule


# --- scans ---------------------------------------------------------------------------------


def cub_scan_temp(n: int, itemsize: int) -> int:
    """A bound on CUB's temporary storage for ``DeviceScan::InclusiveScan`` of ``n`` items:
    the tile states (``ScanTileState``: a status and the partial and inclusive values per
    tile, 32 tiles of padding), counted with at least 512 items per tile."""
    return (-(-n // 512) + 32) * (2 * max(itemsize, 4) + 8) if n > 0 else 0


def _cumulative(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Scratch | None:
    x = args[0] if args else None
    if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.numel() == 0:
        return None
    dim = _dim(x, kwargs.get("dim", args[1] if len(args) > 1 else 0))
    dtype = kwargs.get("dtype", args[2] if len(args) > 2 else None)
    if not isinstance(dtype, torch.dtype):
        integral = not (x.dtype.is_floating_point or x.dtype.is_complex)
        dtype = torch.int64 if integral else x.dtype
    n, size = x.numel(), dtype.itemsize
    blocks = []
    if dtype != x.dtype:
        blocks.append(n * size)  # self.to(result.scalar_type()) (ReduceOps.cpp)
    if not x.is_contiguous():
        blocks.append(n * size)  # self.expect_contiguous() (ScanUtils.cuh, scan_dim)
    if n == int(x.shape[dim]):
        blocks.append(cub_scan_temp(n, size))  # one row: cub::inclusive_scan
    if not blocks:
        return None
    return Scratch(
        "scan_dim (CUB inclusive scan for one row; the input converted and made contiguous)",
        tuple(blocks),
        "aten/src/ATen/native/ReduceOps.cpp (impl_func_cum_ops); "
        "aten/src/ATen/native/cuda/ScanUtils.cuh (scan_dim), ScanKernels.cpp",
    )


# --- topk ----------------------------------------------------------------------------------


def _topk(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Scratch | None:
    names = ("self", "k", "dim", "largest", "sorted")
    bound = {**dict(zip(names, args, strict=False)), **kwargs}
    x = bound.get("self")
    if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.numel() == 0:
        return None
    dim = _dim(x, bound.get("dim", -1))
    k, size = int(bound.get("k", 1)), int(x.shape[dim])
    slices = x.numel() // size if size else 0
    isz = x.dtype.itemsize
    source = "aten/src/ATen/native/cuda/TensorTopK.cpp (should_use_sort, topk_out_cuda)"
    if x.dtype != torch.bool and slices <= 10 and size >= 100_000:
        # topk_out_with_sort: the whole input sorted, its values and indices, then narrowed
        inner = _sort((x, dim), {}) if size > SMALL_SORT else None
        blocks = (x.numel() * isz, x.numel() * 8, *(inner.blocks if inner else ()))
        return Scratch("topk_out_with_sort (a full sort)", blocks, source)
    m = k * slices
    if bound.get("sorted", True) and m > 1 and k > SMALL_SORT:
        # the selection's values sorted into new tensors, then gathered back
        values = torch.empty((slices, k), dtype=x.dtype, device="meta")
        inner = _sort((values, 1), {})
        blocks = (m * 8, m * isz, *(inner.blocks if inner else ()))
        return Scratch("topk: sort of the selected values (sort_outf)", blocks, source)
    return None


#: Classes of operators whose CUDA kernels take nothing beyond their outputs, by name
#: prefix, with the source read.
NO_SCRATCH: tuple[tuple[str, str], ...] = (
    (
        "aten._foreach_",
        "aten/src/ATen/native/cuda/MultiTensorApply.cuh: the tensor lists go to each launch "
        "by value (TensorListMetadata as the kernel argument), 65,536 elements per block",
    ),
    ("aten._fused_adam", "MultiTensorApply.cuh via fused_adam_impl.cu: no device memory"),
    ("aten._fused_adamw", "MultiTensorApply.cuh via fused_adamw_impl.cu: no device memory"),
    ("aten._fused_sgd", "MultiTensorApply.cuh via FusedSgdKernel.cu: no device memory"),
    ("aten._fused_adagrad", "MultiTensorApply.cuh via FusedAdagradKernel.cu: no device memory"),
)


def no_scratch(name: str) -> str | None:
    """The source saying that ``name``'s CUDA kernel takes nothing beyond its outputs, or
    ``None``."""
    for prefix, source in NO_SCRATCH:
        if name.startswith(prefix):
            return source
    return None


#: Rules taken by analogy rather than read, with why.
ASSUMED: dict[str, str] = {
    "aten._fused_rms_norm_backward.default": "the layer-norm backward's copies, assumed for "
    "the RMS variant of the same kernels (its entry point not read in this session)",
    "aten.native_batch_norm.default": "the native kernels' staging buffer (channels-last "
    "training) is read from Normalization.cuh; where torch runs cuDNN's batch norm instead "
    "(float or half, cuDNN on) cuDNN sizes its own workspace, which is not published",
    "aten.native_batch_norm_backward.default": "the native kernels' sums and staging "
    "buffer are read from Normalization.cuh; cuDNN's backward workspace (where torch runs "
    "cuDNN's batch norm) is not published",
    "aten.topk.default": "the sort paths are read from TensorTopK.cpp; the multi-block radix "
    "select's own buffers (TensorTopK.cu) were not read: not counted",
}


#: The rules, by ATen operator.
def _positional(rule: Callable[[tuple[Any, ...]], Scratch | None]) -> _Rule:
    return lambda args, _kwargs: rule(args)


SCRATCH_RULES: dict[str, _Rule] = {
    "aten.native_group_norm_backward.default": _positional(_group_norm_backward),
    "aten.native_layer_norm_backward.default": _positional(_layer_norm_backward),
    "aten._fused_rms_norm_backward.default": _positional(_rms_norm_backward),
    "aten.embedding_dense_backward.default": _positional(_embedding_backward),
    "aten.sort.default": _sort,
    "aten.sort.stable": _sort,
    "aten.index_put.default": _index_put,
    "aten.index_put_.default": _index_put,
    "aten._index_put_impl_.default": _index_put,
    "aten.native_batch_norm.default": _batch_norm_stats,
    "aten.native_batch_norm_backward.default": _batch_norm_backward,
    "aten.cumsum.default": _cumulative,
    "aten.cumprod.default": _cumulative,
    "aten.topk.default": _topk,
    "aten._softmax.default": _contiguous_inputs(
        (0,), "host_softmax (input.contiguous())", "aten/src/ATen/native/cuda/SoftMax.cu"
    ),
    "aten._log_softmax.default": _contiguous_inputs(
        (0,), "host_softmax (input.contiguous())", "aten/src/ATen/native/cuda/SoftMax.cu"
    ),
    "aten.nll_loss_forward.default": _contiguous_inputs(
        (0, 1, 2),
        "nll_loss_forward_out_cuda_template (input, target, weight made contiguous)",
        "aten/src/ATen/native/cuda/Loss.cu",
    ),
    "aten.nll_loss_backward.default": _contiguous_inputs(
        (0, 1, 2, 3),
        "nll_loss_backward_out_cuda_template (grad_output, input, target, weight made contiguous)",
        "aten/src/ATen/native/cuda/Loss.cu",
    ),
}


def kernel_scratch(
    name: str, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None
) -> Scratch | None:
    """What the CUDA kernel of ``name`` takes inside for these arguments, or ``None``
    (no rule, or nothing taken)."""
    rule = SCRATCH_RULES.get(name)
    return None if rule is None else rule(args, kwargs or {})
