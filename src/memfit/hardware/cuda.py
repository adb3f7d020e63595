"""CUDA's own device memory, before and beside the job's tensors: the context and cuBLAS's
workspaces, with their sources.

The memory a CUDA context takes before the job allocates anything (:func:`cuda_context_bytes`,
from the one context model :func:`memfit.hardware.runtime.cuda_context`) and the cuBLAS
workspace PyTorch allocates per handle and stream (:func:`cublas_workspace_bytes`). Both are
estimates with their sources given below; a figure measured on the user's machine
(``memfit devices`` right after the framework initialised CUDA) is better, and the planner
prefers it where it has one.

>>> from memfit.hardware.catalog import gpu
>>> cublas_workspace_bytes(gpu("H100")) == 32 * 2**20
True
>>> cublas_workspace_bytes(gpu("4090")) == 8 * 2**20 + 128 * 2**10
True
>>> cuda_context_bytes(gpu("T4")) < cuda_context_bytes(gpu("H100"))
True
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from memfit._checks import parse_int
from memfit.errors import ConfigError
from memfit.hardware.catalog import GpuSpec
from memfit.hardware.rules import rule
from memfit.hardware.runtime import Runtime, cuda_context, runtime_from_versions
from memfit.units import KiB

__all__ = [
    "CUBLASLT_WORKSPACE_BYTES",
    "CUBLAS_DEFAULT_CONFIG",
    "CUBLAS_HOPPER_CONFIG",
    "CUBLAS_SOURCE",
    "CUDNN_FITTED",
    "CUDNN_FITTED_SOURCE",
    "cublas_workspace_bytes",
    "cublaslt_workspace",
    "cuda_context_bytes",
    "cudnn_conv_workspace",
    "cudnn_major",
    "cudnn_tensor_core_dtypes",
    "parse_cublas_workspace_config",
]

#: Where the cuBLAS figures come from.
CUBLAS_SOURCE = (
    "PyTorch's default CUBLAS_WORKSPACE_CONFIG ':4096:2:16:8' = 2 x 4 MiB + 8 x 16 KiB = "
    "8.125 MiB per cuBLAS handle and stream; ':4096:8' = 32 MiB on sm90 and newer (shared "
    "REFERENCE.md; cuBLAS docs on cublasSetWorkspace recommend 32 MiB for Hopper). The "
    "workspace comes from the caching allocator, so it counts as allocated."
)

#: PyTorch's default workspace configuration before Hopper.
CUBLAS_DEFAULT_CONFIG = ":4096:2:16:8"
#: PyTorch's default workspace configuration on sm90 and newer.
CUBLAS_HOPPER_CONFIG = ":4096:8"

_CUBLAS_CONFIG_RE = re.compile(r"^(?::\d+:\d+)+$", re.ASCII)


def parse_cublas_workspace_config(config: str) -> int:
    """Bytes a ``CUBLAS_WORKSPACE_CONFIG`` value reserves per handle and stream.

    The value is a sequence of ``:SIZE_KIB:COUNT`` pairs; the workspace is the sum of
    ``SIZE_KIB * COUNT`` KiB.

    Raises:
        ConfigError: When the text is not of that form.

    >>> parse_cublas_workspace_config(":4096:2:16:8") == 8 * 2**20 + 128 * 2**10
    True
    >>> parse_cublas_workspace_config(":4096:8") == 32 * 2**20
    True
    """
    text = config.strip()
    if not _CUBLAS_CONFIG_RE.match(text):
        raise ConfigError(
            f"not a cuBLAS workspace configuration: {config!r}",
            key_path="CUBLAS_WORKSPACE_CONFIG",
            hint="write pairs of :SIZE_KIB:COUNT, such as :4096:8 or :4096:2:16:8",
        )
    numbers = [
        parse_int("CUBLAS_WORKSPACE_CONFIG", n, lo=0, hint="write pairs of :SIZE_KIB:COUNT")
        for n in text.strip(":").split(":")
    ]
    return sum(size * count for size, count in zip(numbers[::2], numbers[1::2], strict=True)) * KiB


def _is_sm90_or_newer(spec: GpuSpec | None) -> bool | None:
    if spec is None:
        return None
    if spec.compute_capability is not None:
        return spec.compute_capability >= (9, 0)
    if spec.arch in ("hopper", "blackwell"):
        return True
    if spec.arch in ("pascal", "volta", "turing", "ampere", "ada"):
        return False
    return None


def cuda_context_bytes(
    spec: GpuSpec | None, *, lazy_loading: bool = True, runtime: Runtime | None = None
) -> int:
    """Estimated device memory a CUDA context takes before the job allocates anything.

    The figure comes from the one context model, :func:`memfit.hardware.runtime.cuda_context`,
    which names its sources.

    Args:
        spec: The GPU, or ``None`` when unknown.
        lazy_loading: ``False`` for eager module loading; ignored when ``runtime`` is given.
        runtime: The target's runtime (its versions decide the loading mode).

    Returns:
        Bytes, per process and device.

    >>> from memfit.hardware.runtime import EAGER_CONTEXT_BYTES, LAZY_CONTEXT_UNKNOWN_BYTES
    >>> from memfit.hardware.runtime import LAZY_KERNEL_IMAGES_BYTES
    >>> cuda_context_bytes(None) == LAZY_CONTEXT_UNKNOWN_BYTES + LAZY_KERNEL_IMAGES_BYTES
    True
    >>> cuda_context_bytes(None, lazy_loading=False) == EAGER_CONTEXT_BYTES
    True
    """
    if runtime is None:
        runtime = runtime_from_versions(module_loading="lazy" if lazy_loading else "eager")
    return cuda_context(spec, runtime).bytes


def cublas_workspace_bytes(
    spec: GpuSpec | None, *, config: str | None = None, handles: int = 1
) -> int:
    """cuBLAS workspace PyTorch allocates per handle and stream (counted as allocated).

    Args:
        spec: The GPU, or ``None`` when unknown.
        config: The ``CUBLAS_WORKSPACE_CONFIG`` in force, if the user set one; it overrides
            the architecture's default.
        handles: Number of (handle, stream) pairs that run matmuls (one per stream used).

    Returns:
        Bytes: 8.125 MiB per handle before sm90, 32 MiB on sm90 and newer, and 32 MiB when
        the architecture is unknown (the larger figure, so a plan errs on the safe side).

    Raises:
        ConfigError: When ``config`` is malformed or ``handles`` is negative.

    >>> cublas_workspace_bytes(None) == 32 * 2**20
    True
    >>> cublas_workspace_bytes(None, config=":4096:2", handles=2) == 16 * 2**20
    True
    """
    if handles < 0:
        raise ConfigError(f"handles must be >= 0, not {handles}", key_path="handles")
    if spec is not None and spec.arch == "cpu":
        return 0  # no cuBLAS on the host
    if config is not None:
        per_handle = parse_cublas_workspace_config(config)
    else:
        newer = _is_sm90_or_newer(spec)
        chosen = CUBLAS_DEFAULT_CONFIG if newer is False else CUBLAS_HOPPER_CONFIG
        per_handle = parse_cublas_workspace_config(chosen)
    return per_handle * handles


#: cuBLASLt's default workspace in PyTorch (``CUBLASLT_WORKSPACE_SIZE``, 1024 KiB; pytorch#73439).
CUBLASLT_WORKSPACE_BYTES = 1024 * KiB


def cublaslt_workspace(
    torch_version: tuple[int, int],
    cuda_version: tuple[int, int] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    cublas_bytes: int | None = None,
) -> tuple[str, int]:
    """How a torch version gives cuBLASLt (``addmm`` with a bias) its workspace.

    Args:
        torch_version: The target's torch ``(major, minor)``.
        cuda_version: Its CUDA runtime, or ``None``.
        environ: The job's environment (``CUBLASLT_WORKSPACE_SIZE`` in KiB,
            ``TORCH_CUBLASLT_UNIFIED_WORKSPACE``); ``None``: none set.
        cublas_bytes: The cuBLAS workspace, which caps cuBLASLt's from torch 2.9 on
            unless ``TORCH_CUBLASLT_UNIFIED_WORKSPACE`` is set false (``None``: no cap).

    Returns:
        ``("none", 0)``: ``addmm`` does not call cuBLASLt (before torch 1.12, or CUDA before
        11.4); ``("transient", bytes)``: each call allocates the workspace from the caching
        allocator and frees it after the kernel (torch 1.12 to 2.8; pytorch#73439; the
        4 MiB of #120925 did not stay); ``("persistent", bytes)``: one per (handle,
        stream), kept (torch 2.9 on; pytorch#156495); ``("unified", 0)``: cuBLASLt uses
        the cuBLAS workspace of its handle and stream, only when
        ``TORCH_CUBLASLT_UNIFIED_WORKSPACE`` is set true. ``CublasHandlePool.cpp``'s
        ``getCUDABlasLtWorkspace`` shares the workspace only when that variable is
        explicitly true (``check_env(...) == true``), while ``getCUDABlasLtWorkspaceSize``
        treats an unset variable as unified for the size cap: an unset variable gives a
        separate workspace of ``min(CUBLASLT_WORKSPACE_SIZE, cuBLAS workspace)``, 1 MiB by
        default; the H100 corpus (torch 2.11.0+cu130) shows that 1 MiB, kept, in the first
        ``addmm``.

    Raises:
        ConfigError: When ``CUBLASLT_WORKSPACE_SIZE`` is not a whole number of KiB.

    >>> cublaslt_workspace((2, 6))
    ('transient', 1048576)
    >>> cublaslt_workspace((2, 6), (11, 2))
    ('none', 0)
    >>> cublaslt_workspace((2, 11))
    ('persistent', 1048576)
    >>> cublaslt_workspace((2, 11), environ={"TORCH_CUBLASLT_UNIFIED_WORKSPACE": "1"})
    ('unified', 0)
    """
    env = {} if environ is None else environ
    mode = str(rule("torch", "cublaslt.workspace", torch=torch_version, cuda=cuda_version))
    if mode == "none":
        return "none", 0
    size = CUBLASLT_WORKSPACE_BYTES
    text = env.get("CUBLASLT_WORKSPACE_SIZE")
    if text is not None and text.strip():
        size = (
            parse_int(
                "CUBLASLT_WORKSPACE_SIZE", text.strip(), lo=0, hint="a size in KiB, e.g. 1024"
            )
            * KiB
        )
    if mode == "transient":
        return "transient", size
    unified_text = env.get("TORCH_CUBLASLT_UNIFIED_WORKSPACE")
    flag = None if unified_text is None else unified_text.strip().lower()
    if flag in ("1", "true", "on", "yes"):
        return "unified", 0
    if flag not in ("0", "false", "off", "no") and cublas_bytes is not None:
        size = min(size, cublas_bytes)  # the size cap treats unset as unified
    return "persistent", size


def _cudnn_fitted() -> tuple[dict[str, tuple[float, float, float]], str]:
    """The ``cudnn.conv.fitted`` row of the torch rules table: the factors and their source."""
    from memfit.hardware.rules import rows

    value = rule("torch", "cudnn.conv.fitted")
    source = next(r.source for r in rows("torch") if r.rule == "cudnn.conv.fitted")
    factors = {str(k): (float(v[0]), float(v[1]), float(v[2])) for k, v in value.items()}
    return factors, source


#: cuDNN 8/9 tensor-core convolution engines (half precision on sm70+, float32 with TF32 on
#: sm80+): per kernel, ``(factor, band low, band high)`` on ``x + y + w`` bytes (the kernel's
#: input, output and filter). The ``cudnn.conv.fitted`` row of ``rules_torch.json``, fitted on
#: the calibration half of the project's H100 corpus (torch 2.11.0+cu130, cuDNN 9.19) by
#: ``bench/cudnn_workspace_fit.py``: the factor is the calibration kernels' 75th percentile,
#: the band their 5th and 95th (docs/benchmarks.md has the run and the validation half).
#: Torch-free, so that the planner's families use it too. ``CUDNN_FITTED_SOURCE``: where it
#: comes from, in one line (the row's source).
CUDNN_FITTED, CUDNN_FITTED_SOURCE = _cudnn_fitted()


def cudnn_conv_workspace(cudnn_version: tuple[int, ...]) -> str:
    """How cuDNN's convolution workspace is modelled for a cuDNN version (the
    ``cudnn.conv.workspace`` rule): ``"nhwc_fp32"`` (cuDNN 7's algorithms, analytic from
    pytorch#50990) or ``"fitted"`` (cuDNN 8/9's frontend engines, :data:`CUDNN_FITTED`).

    >>> cudnn_conv_workspace((7,)), cudnn_conv_workspace((9, 19))
    ('nhwc_fp32', 'fitted')
    """
    return str(rule("torch", "cudnn.conv.workspace", cudnn=cudnn_version))


def cudnn_tensor_core_dtypes(capability: tuple[int, int]) -> tuple[str, ...]:
    """The dtypes cuDNN runs on tensor-core engines on a GPU of this compute capability
    (the ``cudnn.conv.tensor_core_dtypes`` rule; float32 only while TF32 is allowed).

    >>> cudnn_tensor_core_dtypes((9, 0)), cudnn_tensor_core_dtypes((6, 1))
    (('float16', 'bfloat16', 'float32'), ())
    """
    return tuple(rule("torch", "cudnn.conv.tensor_core_dtypes", capability=capability))


def cudnn_major(torch_version: tuple[int, int] | None, cuda_version: tuple[int, int] | None) -> int:
    """The cuDNN major version PyTorch's wheels bundle for a torch and CUDA version.

    CUDA 10.x builds link cuDNN 7 (7.6.5 up to torch 1.12's cu102 wheels); CUDA 11 builds
    cuDNN 8; torch 2.4 and later cuDNN 9 (the ``nvidia-cudnn-cu12`` 9.x pins of its wheels).
    Without a CUDA version, torch before 1.8 is taken to be a CUDA 10 build; without either,
    the newest (9).

    >>> cudnn_major((1, 7), (10, 2)), cudnn_major((1, 12), (11, 3)), cudnn_major((2, 6), None)
    (7, 8, 9)
    """
    return int(rule("torch", "cudnn.major", torch=torch_version, cuda=cuda_version))
