"""The workspaces cuBLAS and cuBLASLt take from the caching allocator, per torch version.

* **cuBLAS**: PyTorch gives each cuBLAS handle a workspace per (handle, stream) from the
  caching allocator the first time a matmul runs on it, and keeps it
  (``CUBLAS_WORKSPACE_CONFIG``, default ``:4096:2:16:8`` = 8.125 MiB before Hopper and 32
  MiB on sm90; :func:`memfit.hardware.cuda.cublas_workspace_bytes`). Handles come from
  per-thread pools, so the autograd engine's device thread, which runs the backward pass on
  CUDA, has its own: two workspaces in a training step.
* **cuBLASLt** (``addmm`` with a 1-D bias, as ``nn.Linear`` calls it, and
  ``_addmm_activation``; CUDA 11.4 and later): its workspace changed with torch's versions
  (:func:`memfit.hardware.cuda.cublaslt_workspace`, with the sources): a 1 MiB transient per
  call from torch 1.12, one kept per (handle, stream) from torch 2.9, shared with cuBLAS's
  only under ``TORCH_CUBLASLT_UNIFIED_WORKSPACE=1``.

On a CPU trace for a CUDA target everything runs on the calling thread, but the target runs
the backward pass on the autograd device thread: there the pass (backward or not) tells the
handle, and the workspaces count for the CUDA target only (``target="cuda"``).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["CUBLAS_OPS", "BlasWorkspaces", "cublaslt_policy"]

#: ATen ops that run through cuBLAS on a CUDA device, so that the thread's handle allocates
#: its workspace from the caching allocator on first use.
CUBLAS_OPS = frozenset(
    {
        "mm",
        "addmm",
        "bmm",
        "baddbmm",
        "addbmm",
        "mv",
        "addmv",
        "dot",
        "vdot",
        "_addmm_activation",
        "_scaled_mm",
        "_int_mm",
    }
)

_LT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def cublaslt_policy(
    torch_version: tuple[int, int] | None,
    cuda_version: tuple[int, int] | None = None,
    *,
    environ: Any = None,
    cublas_bytes: int | None = None,
) -> tuple[str, int]:
    """:func:`memfit.hardware.cuda.cublaslt_workspace` for the target's torch, the
    installed torch's rule when its version is unknown."""
    from memfit.hardware.cuda import cublaslt_workspace

    version = torch_version
    if version is None:
        parts = torch.__version__.split("+")[0].split(".")
        version = (int(parts[0]), int(parts[1]))
    return cublaslt_workspace(version, cuda_version, environ=environ, cublas_bytes=cublas_bytes)


def _is_lt_call(name: str, args: tuple[Any, ...]) -> bool:
    """``addmm_out_cuda_impl``'s ``useLtInterface``: a 1-D contiguous bias of the result's
    width, beta 1, float types, matrices with more than one row and column."""
    if name == "_addmm_activation":
        return True
    if name != "addmm" or len(args) < 3:
        return False
    bias, mat1, mat2 = args[0], args[1], args[2]
    if not all(isinstance(t, torch.Tensor) for t in (bias, mat1, mat2)):
        return False
    return bool(
        bias.dim() == 1
        and mat2.dim() == 2
        and bias.shape[0] == mat2.shape[1]
        and bias.is_contiguous()
        and bias.dtype in _LT_DTYPES
        and mat2.shape[0] > 1
        and mat2.shape[1] > 1
        and mat1.dim() == 2
        and mat1.shape[0] > 1
        and mat1.shape[1] > 1
    )


class BlasWorkspaces:
    """Adds the cuBLAS / cuBLASLt workspaces to a trace as the target takes them.

    Args:
        cublas_bytes: One cuBLAS workspace (0: none modelled).
        lt_mode, lt_bytes: :func:`cublaslt_policy`.
        device_type: The traced device.
    """

    def __init__(self, cublas_bytes: int, lt_mode: str, lt_bytes: int, device_type: str) -> None:
        self.cublas_bytes = cublas_bytes
        self.lt_mode = lt_mode
        self.lt_bytes = lt_bytes
        self.device_type = device_type
        self.handles: set[object] = set()
        self.lt_handles: set[object] = set()
        self.lt_calls = 0

    def _key(self, trace: Any) -> tuple[object, str]:
        if self.device_type == "cuda":
            import threading

            return threading.get_ident(), "all"
        return ("backward" if trace.in_backward() else "forward"), "cuda"

    def on_op(self, trace: Any, func: Any, args: tuple[Any, ...]) -> None:
        name = func.overloadpacket.__name__
        if name not in CUBLAS_OPS:
            return
        key, target = self._key(trace)
        if self.cublas_bytes and key not in self.handles:
            self.handles.add(key)
            trace.add(self.cublas_bytes, "cublas_workspace", None, target)
        if self.lt_mode == "persistent" and _is_lt_call(name, args) and key not in self.lt_handles:
            self.lt_handles.add(key)
            trace.add(self.lt_bytes, "cublas_workspace", None, target)

    def after_op(self, trace: Any, func: Any, args: tuple[Any, ...]) -> None:
        """Called after the op's outputs are recorded: a workspace the kernel takes for the
        call alone (``addmm_out_cuda_impl`` allocates its result first), alive with them."""
        if self.lt_mode != "transient":
            return
        name = func.overloadpacket.__name__
        if name in CUBLAS_OPS and _is_lt_call(name, args):
            self.lt_calls += 1
            trace.add_transient(self.lt_bytes, "kernel_workspace", self._key(trace)[1])

    def describe(self) -> str:
        """One sentence for the estimate's deviations."""
        from memfit.units import format_bytes

        text = (
            f"cuBLAS workspace: {format_bytes(self.cublas_bytes)} per cuBLAS handle that runs "
            "a matmul (one for the calling thread, one for the autograd engine's device "
            "thread that runs the backward pass on CUDA), counted in allocated_peak"
        )
        if self.lt_mode == "transient":
            text += (
                f"; cuBLASLt (addmm with a bias) takes {format_bytes(self.lt_bytes)} per call "
                "and frees it (the target's torch, before 2.9)"
            )
        elif self.lt_mode == "persistent":
            text += (
                f"; cuBLASLt keeps {format_bytes(self.lt_bytes)} more per handle (torch 2.9 "
                "and later, TORCH_CUBLASLT_UNIFIED_WORKSPACE unset)"
            )
        elif self.lt_mode == "unified":
            text += "; cuBLASLt shares it (TORCH_CUBLASLT_UNIFIED_WORKSPACE=1)"
        else:
            text += "; addmm does not use cuBLASLt before torch 1.12"
        return text
