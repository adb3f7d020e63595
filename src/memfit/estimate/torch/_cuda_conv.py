"""The workspace cuDNN takes inside a convolution on a CUDA target.

PyTorch runs a CUDA convolution through cuDNN: for each of the forward, backward-data and
backward-filter kernels it asks cuDNN for an engine, allocates that engine's workspace
through the caching allocator, runs it and frees the workspace: a transient inside the op,
on top of everything live. What torch does, read from its source
(``aten/src/ATen/native/cudnn/Conv_v8.cpp``, the cuDNN 8/9 frontend path that torch 2.x
takes by default; ``Conv_v7.cpp``, the legacy path, under ``TORCH_CUDNN_V8_API_DISABLED``
or with cuDNN 7):

* **``benchmark=False``** (the default): ``get_configs_from_heuristics`` asks cuDNN's
  heuristics (``CUDNN_HEUR_MODE_INSTANT``; ``CUDNN_HEUR_MODE_B`` under
  ``TORCH_CUDNN_USE_HEURISTIC_MODE_B``) for an ordered list of engine configs, filtered
  (``filterEngineConfigs``): ``deterministic=True`` drops engines with the
  non-deterministic note, and a float32 convolution with TF32 off
  (``torch.backends.cudnn.allow_tf32=False``) drops the tensor-core and down-converting
  ones. ``try_configs`` runs them in that order; ``run_conv_plan`` allocates each plan's
  ``getWorkspaceSize()`` from the caching allocator and **catches
  ``c10::OutOfMemoryError``, moving on to the next config** (then to cuDNN's fallback
  list). The plan that ran is cached per shape (``benchmark_cache``), and a cached plan
  whose workspace later fails to allocate is searched for again.
* **``benchmark=True``**: ``get_plans_from_find`` keeps the plans whose workspace is at most
  the largest free block the caching allocator holds (``get_available_workspace``:
  ``cacheInfo``), allocates the largest of them, **halving the size on each
  ``OutOfMemoryError``** and dropping the plans above what it got, times them, then empties
  the cache (``_cudnn_get_conv_benchmark_empty_cache``, on by default).
* **``Conv_v7.cpp``**: the same shape with cuDNN's algorithm lists (``getWorkspaceSize``,
  ``chooseAlgorithm``): an algorithm whose workspace fails to allocate is skipped
  (``cudnn_convolution_*`` retries with the next; benchmark mode caps at
  ``getMaxWorkspaceSize``, the largest free block).

**So the workspace is elastic**: what the first engine asks for is what a card with room
gives it (the H100 corpus); on a card where it cannot be allocated torch runs the next
engine instead, which takes less (or none) and runs slower, rather than failing. The
figures here are the first engine's, as on a card with room: on a small card they are an
upper bound, and the estimate says so (:data:`ELASTIC_NOTE`).

Which engine cuDNN's heuristics choose, and its workspace, is inside the closed library.
What is modelled, with its basis:

* **cuDNN 8 and 9 (torch's frontend path), tensor-core engines** (half precision on sm70+;
  float32 on sm80+ while TF32 is allowed, torch's default for cuDNN): **fitted** on the
  project's H100 corpus (torch 2.11.0+cu130, cuDNN 9.19; ``bench/cudnn_workspace_fit.py``).
  Every one of the 1,704 convolution kernels captured there took either no workspace or a
  workspace of the size of NHWC copies of its operands: the median is exactly
  ``x + y + w`` bytes (the kernel's input, output and filter, in their dtypes), the layout
  transforms of the NCHW tensors. Each kernel's workspace is that sum times a factor
  fitted on the corpus's calibration half (:data:`FITTED`: its 75th percentile, with the
  band its 5th to 95th), the validation half reported on its own in docs/benchmarks.md.
* **cuDNN 7, half precision, NCHW, sm70+**: pytorch#50990 (torch 1.7.1, CUDA 10.2, cuDNN
  7.6.5, V100) measured a float16 ``Conv2d(32, 32, 3)`` on a ``512x32x84x84`` input at
  671,933,440 B of workspace: the NHWC input plus the output in float32, to within 60 kB
  (**analytic**, from that measurement). The backward kernels are taken to do the same.
* **Float32 without TF32, float64, channels-last tensors, or GPUs without tensor cores**:
  cuDNN's implicit-GEMM engines, which take no workspace or a small one (pytorch#50990's
  float32 run: about 1 MiB above its tensors); counted as none (**assumed**: the corpus
  holds no such convolution).

Depthwise convolutions (``groups == channels``) run PyTorch's own CUDA kernels and take no
workspace.

The version and capability gates and the fitted factors are rows of
``memfit/hardware/rules_torch.json`` with their sources (``cudnn.conv.workspace``,
``cudnn.conv.fitted``, ``cudnn.conv.tensor_core_dtypes``; read through
:mod:`memfit.hardware.rules`), so a new cuDNN release is a new row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from memfit.hardware.cuda import (
    CUDNN_FITTED,
    CUDNN_FITTED_SOURCE,
    cudnn_conv_workspace,
    cudnn_tensor_core_dtypes,
)

__all__ = [
    "CONV_FITTED_NOTE",
    "ELASTIC_NOTE",
    "FITTED",
    "ConvWorkspace",
    "conv_note",
    "conv_workspace",
    "workspace_base",
]

_HALF = (torch.float16, torch.bfloat16)

#: cuDNN 8/9 tensor-core engines' fitted factors (:data:`memfit.hardware.cuda.CUDNN_FITTED`).
FITTED = CUDNN_FITTED

#: What the plan assumes about the elastic workspace (see the module docstring).
ELASTIC_NOTE = (
    "cuDNN's convolution workspace is elastic (Conv_v8.cpp: an engine whose workspace cannot "
    "be allocated is skipped for the next one, which takes less): the figure is the first "
    "engine's, as on a card with room; on a card without it torch runs a slower engine "
    "with a smaller workspace, so the figure is an upper bound there"
)


@dataclass(frozen=True)
class ConvWorkspace:
    """cuDNN's workspace for one convolution op (the largest of its kernels).

    Attributes:
        nbytes: Bytes taken inside the op (the largest of its kernels' workspaces).
        kernel: What was assumed (``"cuDNN 7 NHWC transform (fp32 accumulation)"``).
        bound: ``True`` where the figure is a bound rather than a sourced size.
        basis: How the figure was obtained: ``"fitted"``, ``"analytic"`` or ``"assumed"``.
        low, high: The band of the figure in bytes (equal to ``nbytes`` where it is exact).
        kernels: Each kernel's workspace, in the order the op runs them (``forward``;
            ``backward_data`` then ``backward_filter``).
    """

    nbytes: int
    kernel: str
    bound: bool
    basis: str = "assumed"
    low: int = 0
    high: int = 0
    kernels: tuple[tuple[str, int], ...] = ()


#: The estimate's note when a convolution's workspace was fitted.
CONV_FITTED_NOTE = (
    f"cuDNN convolution workspaces (basis: fitted): {CUDNN_FITTED_SOURCE}; which engine "
    "cuDNN's heuristics choose is inside the closed library. " + ELASTIC_NOTE
)


def conv_note(found: ConvWorkspace) -> str:
    """The basis and band of a convolution's workspace, for the estimate's kernels."""
    from memfit.units import format_bytes

    if found.basis == "fitted":
        return (
            f"basis: fitted (band {format_bytes(found.low)} to {format_bytes(found.high)} "
            "per call); the first engine's workspace, as on a card with room"
        )
    return f"basis: {found.basis}"


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
    """cuDNN 7's workspace for one kernel reading ``src`` and writing ``dst_elems``
    elements: the NHWC input and the output accumulated in float32 (pytorch#50990)."""
    return _nbytes(src) + dst_elems * 4 + _nbytes(weight)


def workspace_base(kind: str, inp: Any, weight: Any, out_or_grad: Any) -> int:
    """``x + y + w`` bytes of one kernel: its input, output and filter in their dtypes (the
    NHWC copies a tensor-core engine works on).

    Args:
        kind: ``"forward"``, ``"backward_data"`` or ``"backward_filter"``.
        inp: The convolution's input (``x``; ``grad_input`` has its size).
        weight: The filter.
        out_or_grad: The output (forward) or the output's gradient (backward).
    """
    if kind not in FITTED:
        raise ValueError(f"unknown kernel {kind!r}")
    return _nbytes(inp) + _nbytes(out_or_grad) + _nbytes(weight)


def _tensor_cores(dtype: Any, capability: tuple[int, int] | None, allow_tf32: bool) -> bool:
    """Whether cuDNN's tensor-core engines may run the kernel (``filterEngineConfigs``; the
    ``cudnn.conv.tensor_core_dtypes`` rule of ``rules_torch.json``)."""
    if capability is None:
        return True  # unknown GPU: the larger figure
    if dtype == torch.float32 and not allow_tf32:
        return False
    return str(dtype).removeprefix("torch.") in cudnn_tensor_core_dtypes(capability)


def conv_workspace(
    name: str,
    args: tuple[Any, ...],
    out: Any,
    *,
    capability: tuple[int, int] | None,
    cudnn_major: int,
    allow_tf32: bool | None = None,
) -> ConvWorkspace | None:
    """The workspace cuDNN takes inside ``aten.convolution`` or ``convolution_backward``.

    Args:
        name: The ATen op (``"aten.convolution.default"``).
        args: Its arguments (the traced tensors).
        out: Its output(s).
        capability: The GPU's compute capability (``None``: assumed to have tensor cores,
            the larger figure).
        cudnn_major: The target's cuDNN major version.
        allow_tf32: ``torch.backends.cudnn.allow_tf32`` on the target (``None``: the value
            in force where the trace runs; torch's default is ``True``).

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
    if allow_tf32 is None:
        allow_tf32 = bool(torch.backends.cudnn.allow_tf32)
    nchw = not _channels_last(inp)
    if not nchw or not _tensor_cores(inp.dtype, capability, allow_tf32):
        return ConvWorkspace(0, "cuDNN implicit GEMM (no workspace)", bound=False)
    output = out[0] if isinstance(out, (tuple, list)) else out
    if cudnn_conv_workspace((cudnn_major,)) == "nhwc_fp32":
        if inp.dtype not in _HALF:
            return ConvWorkspace(0, "cuDNN implicit GEMM (no workspace)", bound=False)
        itemsize = inp.element_size()
        kernels: list[tuple[str, int]] = []
        if grad_out is None:
            kernels.append(
                ("forward", _one_kernel(inp, int(output.numel()), itemsize, weight, cudnn_major))
            )
        else:
            mask = args[10]
            if mask[0]:
                size = _one_kernel(grad_out, int(inp.numel()), itemsize, weight, cudnn_major)
                kernels.append(("backward_data", size))
            if mask[1]:
                size = _nbytes(inp) + _nbytes(grad_out) + int(weight.numel()) * 4
                kernels.append(("backward_filter", size))
        size = max((n for _, n in kernels), default=0)
        return ConvWorkspace(
            size,
            "cuDNN 7 NHWC transform (float32 accumulation)",
            bound=False,
            basis="analytic",
            low=size,
            high=size,
            kernels=tuple(kernels),
        )
    if grad_out is None:
        wanted = [("forward", workspace_base("forward", inp, weight, output))]
    else:
        mask = args[10]
        wanted = []
        if mask[0]:
            wanted.append(("backward_data", workspace_base("backward_data", inp, weight, grad_out)))
        if mask[1]:
            base = workspace_base("backward_filter", inp, weight, grad_out)
            wanted.append(("backward_filter", base))
    fitted = tuple((kind, int(base * FITTED[kind][0])) for kind, base in wanted)
    low = max((int(base * FITTED[kind][1]) for kind, base in wanted), default=0)
    high = max((int(base * FITTED[kind][2]) for kind, base in wanted), default=0)
    size = max((n for _, n in fitted), default=0)
    return ConvWorkspace(
        size,
        f"cuDNN {cudnn_major} engine (workspace fitted: factor x (x + y + w))",
        bound=False,
        basis="fitted",
        low=low,
        high=high,
        kernels=fitted,
    )
