"""The global buffer a CUDA reduction kernel takes when it splits one output over blocks.

PyTorch's reductions on CUDA (``sum``, ``mean``, ``amax``, ``amin`` ...) run
``gpu_reduce_kernel`` (``aten/src/ATen/native/cuda/Reduce.cuh``). ``setReduceConfig`` lays
the reduction out over thread blocks; when a single output needs more than one block
(``ctas_per_output > 1``, a long reduction with few outputs), ``launch_reduce_kernel``
allocates a staging buffer of ``ReduceConfig::global_memory_size()`` bytes and a small
semaphore array through the caching allocator, and frees both when the kernel is queued:
a transient inside the op, after its output. On the project's H100 corpus it is the
1,024 MiB of ``aten.sum.dim_IntList`` in ``ppo_mlp_large@16384`` (eight 128 MiB buffers
over a step: the bias gradients of ``nn.Linear`` summed over a 16,384-row batch).

This module ports the part of ``setReduceConfig`` that decides the buffer's size:

* the iterator's dimensions: reduced dimensions first, each kind ordered by the input's
  strides, adjacent dimensions coalesced (``TensorIterator::reorder_dimensions`` and
  ``coalesce_dimensions``);
* ``reduction_on_fastest_striding_dimension``, input vectorisation (``dim0 > 128``, one
  reduced dimension) or output vectorisation (``get_output_vec_size``: up to 4 outputs
  per thread);
* ``set_block_dimension`` (512 threads at most, divided by the output vector size; 32 wide);
* the split of inputs over block rows (``values_per_thread() >= block_height * 16`` or
  ``>= 256``) and over blocks: ``ctas_per_output = max(min(div_up(target_grid, grid),
  div_up(values_per_thread, 16)), div_up(values_per_thread, 256))`` with
  ``target_grid = multiProcessorCount * (maxThreadsPerMultiProcessor / num_threads)``;
* ``global_memory_size = sizeof(arg_t) * num_outputs * ctas_per_output``, times
  ``block.x * output_vec_size`` when the block does not reduce along x.

The number of streaming multiprocessors comes from NVIDIA's specifications per GPU
(:data:`SM_COUNTS`); for an unknown GPU the H100 SXM's 132 is assumed and said.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["DEFAULT_SMS", "REDUCE_KERNEL", "REDUCE_OPS", "SM_COUNTS", "reduce_buffer", "sm_count"]

#: ATen ops that run ``gpu_reduce_kernel`` with an accumulator of the input's float type
#: (``float`` for half and bfloat16): name -> where their ``dim`` argument is.
REDUCE_OPS: dict[str, int | None] = {
    "aten.sum.dim_IntList": 1,
    "aten.sum.default": None,
    "aten.mean.dim": 1,
    "aten.mean.default": None,
    "aten.amax.default": 1,
    "aten.amin.default": 1,
}

#: How the kernel is named in the estimate's kernels.
REDUCE_KERNEL = "gpu_reduce_kernel (global staging buffer, Reduce.cuh)"

#: Streaming multiprocessors per GPU (NVIDIA's data sheets and whitepapers), matched on
#: words of the catalog's name.
SM_COUNTS: tuple[tuple[str, int], ...] = (
    ("H100 PCIe", 114),
    ("H100 NVL", 132),
    ("H100", 132),
    ("H200", 132),
    ("GH200", 132),
    ("B200", 148),
    ("A100", 108),
    ("A30", 56),
    ("A10G", 80),
    ("A10", 72),
    ("L40S", 142),
    ("L40", 142),
    ("L4", 58),
    ("V100", 80),
    ("T4", 40),
    ("RTX 4090", 128),
    ("RTX 4080", 76),
    ("RTX 4070", 46),
    ("RTX 3090", 82),
    ("RTX 3080", 68),
    ("RTX 3070", 46),
    ("RTX 3060", 28),
)

#: The assumption for a GPU not in :data:`SM_COUNTS`.
DEFAULT_SMS = 132

_MAX_THREADS = 512  # max_reduce_threads for every type but complex double
_THREADS_PER_SM = 2048  # maxThreadsPerMultiProcessor from sm_50 to sm_90 but sm_86/89
_THREADS_PER_SM_CONSUMER = 1536  # sm_86 and sm_89 (GeForce Ampere and Ada, A10, L4, L40)


def sm_count(spec: Any) -> tuple[int, int, bool]:
    """``(multiprocessors, max threads per multiprocessor, known)`` for a catalog GPU."""
    name = str(getattr(spec, "name", "") or "")
    cc = getattr(spec, "compute_capability", None)
    threads = _THREADS_PER_SM_CONSUMER if cc in ((8, 6), (8, 9)) else _THREADS_PER_SM
    for key, count in SM_COUNTS:
        if key.lower() in name.lower():
            return count, threads, True
    return DEFAULT_SMS, threads, False


def _last_pow2(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def _div_up(a: int, b: int) -> int:
    return -(-a // b)


def _iterator_dims(
    shape: tuple[int, ...], strides: tuple[int, ...], reduced: set[int]
) -> list[tuple[int, int, bool]]:
    """``(size, input stride in elements, reduced)`` per dimension, fastest first, the
    reduced ones before the kept ones, coalesced."""
    dims = [(shape[d], strides[d], d in reduced) for d in range(len(shape)) if shape[d] != 1]
    dims.sort(key=lambda t: (not t[2], t[1]))
    out: list[tuple[int, int, bool]] = []
    for size, stride, red in dims:
        if out and out[-1][2] == red and out[-1][1] * out[-1][0] == stride:
            prev = out[-1]
            out[-1] = (prev[0] * size, prev[1], red)
        else:
            out.append((size, stride, red))
    return out


def reduce_buffer(
    name: str, args: tuple[Any, ...], *, sms: int = DEFAULT_SMS, threads_per_sm: int = 2048
) -> int:
    """Bytes of the staging buffer ``gpu_reduce_kernel`` allocates for one call (0: none).

    Args:
        name: The ATen op (``"aten.sum.dim_IntList"``).
        args: Its arguments (the traced input first).
        sms: The GPU's multiprocessor count.
        threads_per_sm: Its ``maxThreadsPerMultiProcessor``.
    """
    if name not in REDUCE_OPS or not args or not isinstance(args[0], torch.Tensor):
        return 0
    x = args[0]
    if not x.is_floating_point() or x.numel() == 0 or x.dim() == 0:
        return 0
    where = REDUCE_OPS[name]
    dims_arg = args[where] if where is not None and len(args) > where else None
    if dims_arg is None or (isinstance(dims_arg, (list, tuple)) and len(dims_arg) == 0):
        reduced = set(range(x.dim()))
    else:
        items = [dims_arg] if isinstance(dims_arg, int) else list(dims_arg)
        reduced = {int(d) % x.dim() for d in items}
    dims = _iterator_dims(tuple(x.shape), tuple(x.stride()), reduced)
    if not any(red for _, _, red in dims):
        return 0
    arg_size = 8 if x.dtype == torch.float64 else 4
    num_reduce = sum(1 for _, _, red in dims if red)
    num_outputs = 1
    for size, _, red in dims:
        if not red:
            num_outputs *= size
    inputs_per_output = x.numel() // num_outputs
    fastest = num_reduce == len(dims) or dims[0][1] < dims[num_reduce][1]
    if fastest:
        dim0, dim1 = inputs_per_output, num_outputs
        fastest_stride = dims[0][1]
    else:
        dim0, dim1 = num_outputs, inputs_per_output
        fastest_stride = dims[num_reduce][1]
    output_vec = 1
    if fastest_stride == 1:
        if fastest and dim0 > 128 and num_reduce == 1:
            dim0 //= 4  # vectorize_input, input_vec_size = vt0 = 4
        elif not fastest:
            output_vec = 4
            for i, (size, stride, _) in enumerate(dims):
                n = size if i == num_reduce else stride
                while n % output_vec:
                    output_vec //= 2
            dim0 //= output_vec
    max_threads = _MAX_THREADS // output_vec
    dim0_pow2 = _last_pow2(dim0) if dim0 < max_threads else max_threads
    dim1_pow2 = _last_pow2(dim1) if dim1 < max_threads else max_threads
    block_width = min(dim0_pow2, 32)
    block_height = min(dim1_pow2, max_threads // block_width)
    block_width = min(dim0_pow2, max_threads // block_height)
    num_threads = block_width * block_height
    step_input, step_output = 1, 1
    block_x_reduce = False
    if fastest:
        step_input *= block_width
        block_x_reduce = True
    else:
        step_output *= block_width
    values = _div_up(inputs_per_output, step_input)
    split_rows = values >= block_height * 16 or values >= 256
    if split_rows:
        step_input *= block_height
    else:
        step_output *= block_height
    values = _div_up(inputs_per_output, step_input)
    grid = _div_up(num_outputs // output_vec, step_output)
    target = sms * (threads_per_sm // num_threads)
    ctas = 1
    if split_rows and values >= 256 and grid <= target:
        ctas = max(min(_div_up(target, grid), _div_up(values, 16)), _div_up(values, 256))
    if ctas <= 1:
        return 0
    size = arg_size * num_outputs * ctas
    if not block_x_reduce:
        size *= block_width * output_vec
    return size
