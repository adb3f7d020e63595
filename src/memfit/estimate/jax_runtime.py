"""The JAX runtime around a compiled step on a GPU: what ``memory_stats()`` and ``nvidia-smi``
show besides XLA's buffer assignment.

Two figures, each a sum of named terms with their sources:

* ``peak_bytes_in_use`` (``jax.Device.memory_stats()["peak_bytes_in_use"]``, the BFC
  allocator's peak): the larger of the step's buffers (arguments + outputs - donated +
  temporaries) and what the first call's GEMM autotuning holds besides the arguments, plus the
  allocator's rounding of each buffer to 256 bytes. XLA's autotuner allocates, through the
  same allocator, every operand and result of the GEMM (or cuDNN call) it tunes, each with
  ``xla_gpu_redzone_padding_bytes`` (8 MiB by default) of guard zone on both sides
  (``xla/service/gpu/autotuning/redzone_buffers.cc``, ``stream_executor/gpu/
  redzone_allocator.cc``, ``xla/debug_options_flags.cc``), and cuBLAS's workspace as one of
  the results (4 MiB, 32 MiB on Hopper and later: ``GemmConfig`` in XLA's
  ``matmul_utils.h``). This is the "runtime floor" a small program shows.
* ``device_used_bytes`` (``nvidia-smi``): the CUDA context, plus JAX's preallocated pool
  (``fraction x`` the memory CUDA reports, ``xla/pjrt/gpu/gpu_helpers.cc``), or, with
  preallocation off, the regions the BFC allocator grew to (each region twice the last,
  from 2 MiB: ``tsl/framework/bfc_allocator.cc``, ``Extend``), or with the platform allocator
  the peak itself.

Not modelled, said in notes: cuDNN's autotuning of convolutions beyond its buffers, several
GPUs (device 0 holds more; collectives keep buffers in XLA's ``CollectiveBFCAllocator``),
a BFC chunk handed out whole when splitting it would leave less than the request.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from memfit.units import MiB

__all__ = [
    "BFC_FIRST_REGION",
    "BFC_MIN_ALLOCATION",
    "REDZONE_BYTES",
    "RuntimeTerm",
    "autotune_bytes",
    "bfc_growth_bytes",
    "cublas_workspace",
    "xla_flag",
]

#: ``xla_gpu_redzone_padding_bytes``'s default (``xla/debug_options_flags.cc``).
REDZONE_BYTES = 8 * MiB
#: The BFC allocator rounds every request up to a multiple of this (``kMinAllocationSize``).
BFC_MIN_ALLOCATION = 256
#: The BFC allocator's first region when it grows (``curr_region_allocation_bytes_``).
BFC_FIRST_REGION = 2 * MiB


@dataclass(frozen=True)
class RuntimeTerm:
    """One term of a device-level figure.

    Attributes:
        name: What it is.
        bytes: How much.
        source: Where the figure or rule comes from.
    """

    name: str
    bytes: int
    source: str

    def to_list(self) -> list[object]:
        """``[name, bytes, source]``."""
        return [self.name, self.bytes, self.source]


def xla_flag(environ: Mapping[str, str], name: str) -> str | None:
    """The value of ``--name=value`` in ``XLA_FLAGS``, or ``None``.

    >>> xla_flag({"XLA_FLAGS": "--xla_gpu_autotune_level=0 --x=1"}, "xla_gpu_autotune_level")
    '0'
    """
    flags = environ.get("XLA_FLAGS", "")
    found = re.findall(rf"--{re.escape(name)}=(\S+)", flags)
    return found[-1] if found else None


def cublas_workspace(compute_capability: tuple[int, int]) -> int:
    """cuBLAS's workspace XLA gives a GEMM: 32 MiB on Hopper and later, else 4 MiB.

    >>> cublas_workspace((9, 0)) // MiB, cublas_workspace((8, 9)) // MiB
    (32, 4)
    """
    return 32 * MiB if compute_capability >= (9, 0) else 4 * MiB


def autotune_bytes(
    gemm_buffers: Sequence[Sequence[int]],
    compute_capability: tuple[int, int],
    environ: Mapping[str, str],
) -> int:
    """The most the first call's autotuning holds at once: for the GEMM whose buffers are
    largest, each operand and result with a guard zone on both sides, and cuBLAS's workspace
    where the compile chose a Triton kernel (the autotuner also tries cuBLAS).

    ``XLA_FLAGS=--xla_gpu_autotune_level=0`` turns autotuning off (0 bytes);
    ``--xla_gpu_redzone_padding_bytes`` sets the guard zone.

    >>> autotune_bytes([[MiB, MiB, MiB]], (8, 9), {}) // MiB
    71
    """
    if xla_flag(environ, "xla_gpu_autotune_level") == "0" or not gemm_buffers:
        return 0
    padding = xla_flag(environ, "xla_gpu_redzone_padding_bytes")
    redzone = int(padding) if padding is not None and padding.isdigit() else REDZONE_BYTES
    most = 0
    for buffers in gemm_buffers:
        sizes = list(buffers)
        if len(sizes) <= 3:  # a Triton fusion: result and operands, no workspace
            sizes.append(cublas_workspace(compute_capability))
        most = max(most, sum(size + 2 * redzone for size in sizes))
    return most


def round_up(size: int, unit: int = BFC_MIN_ALLOCATION) -> int:
    """``size`` rounded up to a multiple of ``unit``."""
    return -(-size // unit) * unit


def bfc_growth_bytes(allocations: Sequence[int], limit: int | None = None) -> int:
    """What a growing BFC allocator holds after ``allocations`` (all live at once): it takes
    a new region when no region has room, the first of 2 MiB, each next twice the last (or
    doubled until the request fits), never past ``limit``.

    >>> bfc_growth_bytes([MiB]) // MiB, bfc_growth_bytes([MiB, 2 * MiB]) // MiB
    (2, 6)
    """
    regions: list[int] = []  # free bytes per region
    held = 0
    next_region = BFC_FIRST_REGION
    for size in allocations:
        need = round_up(size)
        for index, free in enumerate(regions):
            if free >= need:
                regions[index] -= need
                break
        else:
            grown = False
            while need > next_region:
                next_region *= 2
                grown = True
            region = next_region if limit is None else min(next_region, max(limit - held, need))
            regions.append(region - need)
            held += region
            if not grown:
                next_region *= 2
    return held
