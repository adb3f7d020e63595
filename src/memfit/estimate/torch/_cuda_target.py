"""What a CUDA target is, for the kernels its ops run: the GPU and the software around it.

:class:`CudaTarget` gathers what the trace needs to follow a CUDA target's kernels: the GPU's
compute capability (:mod:`memfit.hardware.catalog`), the target's torch version (given in the
runtime, else the installed torch's), the cuDNN it bundles, and the cuBLAS workspace of its
architecture. It makes the per-trace objects that add the kernels' memory
(:class:`memfit.estimate.torch._cuda_blas.BlasWorkspaces`,
:class:`memfit.estimate.torch._cuda_kernels.CudaKernels`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

__all__ = ["CudaTarget", "parse_version"]

_VERSION_RE = re.compile(r"^\s*(\d+)\.(\d+)")


def parse_version(text: str | None) -> tuple[int, int] | None:
    """``"2.1.0.dev20230623+cu118"`` -> ``(2, 1)``; ``None`` for no version."""
    if not text:
        return None
    match = _VERSION_RE.match(text)
    return None if match is None else (int(match.group(1)), int(match.group(2)))


@dataclass(frozen=True)
class CudaTarget:
    """The CUDA target of a trace.

    Attributes:
        spec: The GPU (a :class:`memfit.hardware.catalog.GpuSpec`), or ``None`` when unknown.
        torch_version: The target's torch ``(major, minor)``, or ``None``.
        cuda_version: The target's CUDA runtime ``(major, minor)``, or ``None``.
        cublas_bytes: One cuBLAS workspace on this GPU.
        torch_text: The target's torch version as given (``"2.1.0.dev20230623+cu118"``).
        cudnn_text: The target's cuDNN version as given (``"9.19.0"``), or ``None``: the
            one its torch wheels bundle.
    """

    spec: Any
    torch_version: tuple[int, int] | None
    cuda_version: tuple[int, int] | None
    cublas_bytes: int
    torch_text: str | None = None
    cudnn_text: str | None = None

    @property
    def capability(self) -> tuple[int, int] | None:
        """The GPU's compute capability, or ``None``."""
        if self.spec is None:
            return None
        cc = self.spec.compute_capability
        return None if cc is None else (int(cc[0]), int(cc[1]))

    @property
    def cudnn_major(self) -> int:
        """The cuDNN major version the target's torch bundles."""
        from memfit.hardware.cuda import cudnn_major

        given = parse_version(self.cudnn_text)
        if given is not None:
            return given[0]
        return cudnn_major(self.torch_version, self.cuda_version)

    def blas_workspaces(self, device_type: str) -> Any:
        """The cuBLAS / cuBLASLt workspace model for one trace."""
        import os

        from memfit.estimate.torch._cuda_blas import BlasWorkspaces, cublaslt_policy

        mode, nbytes = cublaslt_policy(
            self.torch_version,
            self.cuda_version,
            environ=os.environ,
            cublas_bytes=self.cublas_bytes,
        )
        return BlasWorkspaces(self.cublas_bytes, mode, nbytes, device_type)

    def kernels(self, *, emulate: bool = True) -> Any:
        """The kernel model for one trace for this target (``emulate``: a CPU trace, which
        runs CUDA's choices itself; else a trace on fake CUDA tensors)."""
        from memfit.estimate.torch._cuda_kernels import CudaKernels
        from memfit.estimate.torch._cuda_reduce import sm_count

        kernels = CudaKernels(
            self.capability,
            self.torch_version,
            self.cudnn_major,
            self.torch_text,
            emulate=emulate,
        )
        sms, threads, _known = sm_count(self.spec)
        kernels.reduce_sms = (sms, threads)
        return kernels
