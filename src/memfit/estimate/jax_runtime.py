"""The JAX runtime around a compiled step on a GPU: what ``memory_stats()`` and ``nvidia-smi``
show besides XLA's buffer assignment.

Two figures, each a sum of named terms with their sources:

* ``peak_bytes_in_use`` (``jax.Device.memory_stats()["peak_bytes_in_use"]``, the BFC
  allocator's peak): the larger of the step's buffers (arguments + outputs - donated +
  temporaries) and what the first call's GEMM autotuning holds besides the arguments, plus the
  allocator's rounding of each buffer to 256 bytes. XLA's autotuner allocates through the same
  allocator, one GEMM at a time, the buffers it runs each candidate on, with
  ``xla_gpu_redzone_padding_bytes`` (8 MiB by default) of guard zone on both sides of each
  guarded one (``xla/service/gpu/autotuning/redzone_buffers.cc``,
  ``stream_executor/gpu/redzone_allocator.cc``, ``xla/debug_options_flags.cc``): for a GEMM
  fusion its inputs (``gemm_fusion_autotuner.cc``, ``backends/gpu/autotuner/gpu_profiler.cc``),
  for a cuBLAS call every operand and result, its workspace among them, and a reference copy
  (``gemm_algorithm_picker.cc``). This is the "runtime floor" a small program shows: 32 MiB
  plus the operands for a GEMM fusion of two inputs (:func:`gemm_autotune_bytes`).
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
from typing import Any

from memfit.units import MiB

__all__ = [
    "BFC_FIRST_REGION",
    "BFC_MIN_ALLOCATION",
    "REDZONE_BYTES",
    "GemmBuffers",
    "RuntimeTerm",
    "autotune_bytes",
    "bfc_growth_bytes",
    "gemm_autotune_bytes",
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


@dataclass(frozen=True)
class GemmBuffers:
    """One GEMM of a compiled step as XLA's autotuner sees it.

    Attributes:
        kind: ``"fusion"`` (a Triton or cuDNN GEMM fusion, tuned by ``GemmFusionAutotuner``),
            ``"cublas"`` (a cuBLAS custom call, tuned by ``GemmAlgorithmPicker``) or
            ``"cudnn"`` (a cuDNN custom call, tuned by ``ConvAlgorithmPicker``).
        results: Bytes of each result (a cuBLAS call's last result is its workspace).
        operands: Bytes of each operand.
    """

    kind: str
    results: tuple[int, ...]
    operands: tuple[int, ...]

    @classmethod
    def from_plain(cls, data: Mapping[str, Any]) -> GemmBuffers:
        """From the compile child's JSON."""
        return cls(
            str(data["kind"]),
            tuple(int(n) for n in data["results"]),
            tuple(int(n) for n in data["operands"]),
        )


def _guarded(size: int, redzone: int) -> int:
    return size + 2 * redzone


def gemm_autotune_bytes(gemm: GemmBuffers, redzone: int, *, check: bool = True) -> int:
    """What tuning one GEMM holds at once on the device.

    * A cuBLAS or cuDNN custom call (``GemmAlgorithmPicker``, ``ConvAlgorithmPicker``):
      every operand and result, the workspace included, in its own guarded buffer
      (``RedzoneBuffers::kAllInputsAllOutputs``), and a guarded reference copy of the result
      (``RedzoneAllocator::AllocateBytes`` in ``GetBestAlgorithm``).
    * A GEMM fusion (``GemmFusionAutotuner``, ``GpuProfiler``): the inputs in guarded
      buffers (``RedzoneBuffers::kAllInputs``), the candidate's output and the reference
      output kept from the first candidate (both unguarded). XLA guards every input of the
      fusion; the published jaxlib 0.7.2 peaks of PPO's MLP steps show two guarded inputs per
      GEMM (KluvaDa/benchback-rl: 32 MiB plus the operands), so the two largest are counted:
      the dot's operands, where the compile also fused a bias or merged two dots into one
      fusion (not measured for such fusions).

    >>> gemm_autotune_bytes(GemmBuffers("fusion", (MiB,), (MiB, MiB, 256)), 8 * MiB) // MiB
    36
    >>> gemm_autotune_bytes(GemmBuffers("cublas", (MiB, 4 * MiB), (MiB, MiB)), 8 * MiB) // MiB
    88
    """
    copies = 2 if check else 1
    if gemm.kind == "fusion":
        inputs = sorted(gemm.operands)[-2:]
        return sum(_guarded(n, redzone) for n in inputs) + copies * sum(gemm.results)
    held = sum(_guarded(n, redzone) for n in (*gemm.operands, *gemm.results))
    reference = gemm.results[0] if gemm.results and check else 0
    return held + (_guarded(reference, redzone) if check else 0)


def autotune_bytes(gemms: Sequence[GemmBuffers], environ: Mapping[str, str]) -> int:
    """The most the first call's autotuning holds at once: the GEMM whose tuning holds most
    (:func:`gemm_autotune_bytes`; XLA tunes one GEMM at a time and frees its buffers).

    ``XLA_FLAGS=--xla_gpu_autotune_level=0`` turns autotuning off (0 bytes); levels below 4
    skip the correctness check and its guard zones (``should_check_correctness``);
    ``--xla_gpu_redzone_padding_bytes`` sets the guard zone.

    >>> autotune_bytes([GemmBuffers("fusion", (MiB,), (MiB, MiB))], {}) // MiB
    36
    >>> autotune_bytes([GemmBuffers("fusion", (MiB,), (MiB, MiB))],
    ...                {"XLA_FLAGS": "--xla_gpu_autotune_level=3"}) // MiB
    3
    """
    level = xla_flag(environ, "xla_gpu_autotune_level")
    if level == "0" or not gemms:
        return 0
    padding = xla_flag(environ, "xla_gpu_redzone_padding_bytes")
    redzone = int(padding) if padding is not None and padding.isdigit() else REDZONE_BYTES
    check = not (level is not None and level.isdigit() and int(level) < 4)
    if not check:
        redzone = 0  # no correctness check: the buffers carry no guard zones
    return max(gemm_autotune_bytes(gemm, redzone, check=check) for gemm in gemms)


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
