"""Which floating-point types each CUDA architecture runs natively, as data with sources.

A dtype a GPU has no hardware for is not refused by PyTorch: a ``bfloat16`` tensor lives on a
T4 (sm_75) and its elementwise kernels convert each value to ``float`` in registers
(``c10/util/BFloat16.h``: the type is a ``uint16_t`` with float conversions), so no memory
differs; ``torch.cuda.is_bf16_supported()`` says ``True`` there unless
``including_emulation=False`` (``torch/cuda/__init__.py``: the fast path is CUDA 11 and
compute capability 8.0; below it, a bf16 tensor that can be made counts). What differs is
which *library kernel* exists: tensor-core matmuls, cuDNN engines and the fused attention
kernels gate on the architecture. :data:`ARCH_DTYPES` lists, per dtype, the first compute
capability with tensor-core support and what happens below it, with the source of each row;
:func:`dtype_notes` says, for a trace's target and the dtypes it met, what the figures assume.
The attention backends' own gates are in :mod:`memfit.estimate.torch._cuda_sdpa`.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ARCHITECTURES", "ARCH_DTYPES", "DtypeRule", "arch_table", "dtype_notes"]

#: Compute capabilities from Volta to Blackwell, with their architecture names.
ARCHITECTURES: dict[tuple[int, int], str] = {
    (7, 0): "Volta (V100)",
    (7, 5): "Turing (T4, RTX 20)",
    (8, 0): "Ampere (A100)",
    (8, 6): "Ampere (A10, RTX 30)",
    (8, 9): "Ada (L4, L40S, RTX 40)",
    (9, 0): "Hopper (H100, H200)",
    (10, 0): "Blackwell (B200)",
    (12, 0): "Blackwell (RTX 50)",
}


@dataclass(frozen=True)
class DtypeRule:
    """One dtype's hardware support.

    Attributes:
        dtype: The torch dtype's name (``"bfloat16"``).
        tensor_cores_from: The first compute capability whose tensor cores run it.
        below: What PyTorch does on an older GPU, and what that allocates.
        source: Where the row was read.
    """

    dtype: str
    tensor_cores_from: tuple[int, int]
    below: str
    source: str


ARCH_DTYPES: tuple[DtypeRule, ...] = (
    DtypeRule(
        "float16",
        (7, 0),
        "CUDA cores only (no tensor-core GEMM): the same tensors, no extra memory",
        "PTX ISA, mma/wmma .f16 shapes: sm_70 and later; NVIDIA Volta architecture whitepaper",
    ),
    DtypeRule(
        "bfloat16",
        (8, 0),
        "emulated: kernels convert to float32 in registers (c10/util/BFloat16.h), no extra "
        "tensor; cuBLAS runs bf16 GEMMs without tensor cores; cuDNN has no bf16 convolution "
        "engine (a bf16 conv fails on the GPU)",
        "PTX ISA, mma .bf16: sm_80 and later; torch.cuda.is_bf16_supported (including_"
        "emulation); huggingface/diffusers#14129 (no cuDNN bf16 conv engines below sm_80)",
    ),
    DtypeRule(
        "tf32 (float32 matmuls)",
        (8, 0),
        "float32 GEMMs on CUDA cores: the same tensors",
        "PTX ISA, mma .tf32: sm_80 and later",
    ),
    DtypeRule(
        "float8_e4m3fn / float8_e5m2",
        (8, 9),
        "torch._scaled_mm refuses the call (no fallback)",
        "PTX ISA, mma .e4m3/.e5m2: sm_89 and later; aten/src/ATen/native/cuda/Blas.cpp "
        "(_scaled_mm checks compute capability 8.9 or 9.0+)",
    ),
    DtypeRule(
        "float4_e2m1fn_x2 (MX/NV FP4)",
        (10, 0),
        "no kernel",
        "PTX ISA, mma .kind::mxf4 / tcgen05: sm_100 and later",
    ),
)


def arch_table() -> str:
    """The generated table of docs/guide.md (one row per dtype)."""
    rows = [
        "| dtype | tensor cores from | below that | source |",
        "|---|---|---|---|",
    ]
    for rule in ARCH_DTYPES:
        major, minor = rule.tensor_cores_from
        name = ARCHITECTURES.get(rule.tensor_cores_from, "")
        rows.append(f"| {rule.dtype} | sm_{major}{minor} ({name}) | {rule.below} | {rule.source} |")
    return "\n".join(rows) + "\n"


def dtype_notes(capability: tuple[int, int] | None, dtypes: set[str]) -> list[str]:
    """What the figures assume for the dtypes a trace met (``"bfloat16"``, ``"float16"``)
    on a target of this compute capability (``None``: unknown, nothing said)."""
    if capability is None:
        return []
    out = []
    for rule in ARCH_DTYPES:
        if rule.dtype in dtypes and capability < rule.tensor_cores_from:
            major, minor = rule.tensor_cores_from
            out.append(
                f"{rule.dtype} on sm_{capability[0]}{capability[1]} (tensor cores from "
                f"sm_{major}{minor}): {rule.below}; the figures count the same tensors as on "
                "a newer GPU"
            )
    return out
