"""Which floating-point types each CUDA architecture runs natively, read from the rules table.

A dtype a GPU has no hardware for is not refused by PyTorch: a ``bfloat16`` tensor lives on a
T4 (sm_75) and its elementwise kernels convert each value to ``float`` in registers
(``c10/util/BFloat16.h``: the type is a ``uint16_t`` with float conversions), so no memory
differs; ``torch.cuda.is_bf16_supported()`` says ``True`` there unless
``including_emulation=False`` (``torch/cuda/__init__.py``: the fast path is CUDA 11 and
compute capability 8.0; below it, a bf16 tensor that can be made counts). What differs is
which *library kernel* exists: tensor-core matmuls, cuDNN engines and the fused attention
kernels gate on the architecture.

The rules are data: ``src/memfit/hardware/rules_cuda_arch.json`` (table ``cuda_arch`` of
:mod:`memfit.hardware.rules`), one rule per dtype (``dtype.bfloat16``), its rows from the
newest compute capability down, each with its source; a row's value says whether the
capability runs the dtype natively, what its matmuls, convolutions and attention do, and
``extra_bytes``, what that allocates beyond a newer GPU's tensors (0 for every row read so
far: cuBLAS runs a bf16 GEMM before Ampere itself, on CUDA cores, without a torch-side copy,
pytorch#50442). :data:`ARCH_DTYPES` lists, per dtype, the first capability with native
support; :func:`dtype_notes` says, for a trace's target and the dtypes it met, what the
figures assume; :func:`arch_table` is the guide's generated table. The attention backends'
own gates are in :mod:`memfit.estimate.torch._cuda_sdpa`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from memfit.hardware.rules import rows, rule

__all__ = ["ARCH_DTYPES", "DtypeRule", "arch_name", "arch_table", "dtype_notes", "dtype_rule"]

_Capability = tuple[int, int]

# One literal lookup per dtype (tests/hardware/test_rules.py checks that every rule of the
# table is asked for by name).
_LOOKUPS: dict[str, Callable[[_Capability | None], Any]] = {
    "float16": lambda c: rule("cuda_arch", "dtype.float16", capability=c),
    "bfloat16": lambda c: rule("cuda_arch", "dtype.bfloat16", capability=c),
    "tf32": lambda c: rule("cuda_arch", "dtype.tf32", capability=c),
    "float8_e4m3fn": lambda c: rule("cuda_arch", "dtype.float8_e4m3fn", capability=c),
    "float8_e5m2": lambda c: rule("cuda_arch", "dtype.float8_e5m2", capability=c),
    "float4_e2m1fn_x2": lambda c: rule("cuda_arch", "dtype.float4_e2m1fn_x2", capability=c),
}


def arch_name(capability: _Capability | None) -> str:
    """The architecture's name (``"Turing (T4, RTX 20)"``), or ``""``."""
    return str(rule("cuda_arch", "arch.name", capability=capability))


def dtype_rule(dtype: str, capability: _Capability | None) -> Mapping[str, Any] | None:
    """The table's value for ``dtype`` (``"bfloat16"``) on a GPU of this compute capability
    (``native``, ``matmul``, ``convolution``, ``attention``, ``extra_bytes``), or ``None``
    for a dtype the table does not list."""
    lookup = _LOOKUPS.get(dtype)
    if lookup is None:
        return None
    value: Mapping[str, Any] = lookup(capability)
    return value


def _lowest(text: str) -> _Capability:
    """The lowest capability a row's ``>=X.Y`` condition admits."""
    for clause in text.split(","):
        clause = clause.strip()
        if clause.startswith(">="):
            major, _, minor = clause[2:].strip().partition(".")
            return int(major), int(minor or 0)
    raise ValueError(f"not a lower bound: {text!r}")


@dataclass(frozen=True)
class DtypeRule:
    """One dtype's hardware support.

    Attributes:
        dtype: The torch dtype's name (``"bfloat16"``).
        tensor_cores_from: The first compute capability that runs it natively.
        below: What PyTorch does on the newest GPU below that, and what that allocates.
        source: Where the native row was read.
    """

    dtype: str
    tensor_cores_from: _Capability
    below: str
    source: str


def _dtype_rules() -> tuple[DtypeRule, ...]:
    out = []
    for dtype in _LOOKUPS:
        mine = [r for r in rows("cuda_arch") if r.rule == f"dtype.{dtype}"]
        native = next(r for r in mine if r.value["native"])
        first = _lowest(native.conditions["capability"])
        below = dtype_rule(dtype, (first[0], first[1] - 1) if first[1] else (first[0] - 1, 9))
        assert below is not None
        out.append(DtypeRule(dtype, first, str(below["matmul"]), native.source))
    return tuple(out)


#: Per dtype, the first compute capability that runs it natively (from the table).
ARCH_DTYPES: tuple[DtypeRule, ...] = _dtype_rules()


def _capabilities(text: str | None, above: _Capability | None) -> str:
    """The capabilities a row covers, given the lowest of the rule's row before it."""
    upper = f"below sm_{above[0]}{above[1]}" if above else "and newer"
    if text is None:
        return f"older or unknown ({upper})" if above else "any"
    low = _lowest(text)
    return f"sm_{low[0]}{low[1]} {'to ' + upper if above else upper}"


def arch_table() -> str:
    """The generated table of docs/guide.md: one line per row of the ``cuda_arch`` table's
    dtype rules."""
    lines = [
        "| dtype | compute capability | native | matmul | convolution | attention | "
        "extra bytes | source |",
        "|---|---|---|---|---|---|---:|---|",
    ]
    above: dict[str, _Capability] = {}
    for item in rows("cuda_arch"):
        if not item.rule.startswith("dtype."):
            continue
        value = item.value
        text = item.conditions.get("capability")
        where = _capabilities(text, above.get(item.rule))
        if text is not None:
            above[item.rule] = _lowest(text)
        lines.append(
            f"| {item.rule.removeprefix('dtype.')} | {where} | "
            f"{'yes' if value['native'] else 'no'} | {value['matmul']} | "
            f"{value['convolution']} | {value['attention']} | {value['extra_bytes']} | "
            f"{item.source} |"
        )
    return "\n".join(lines) + "\n"


def dtype_notes(capability: _Capability | None, dtypes: set[str]) -> list[str]:
    """What the figures assume for the dtypes a trace met (``"bfloat16"``, ``"float16"``)
    on a target of this compute capability (``None``: unknown, nothing said)."""
    if capability is None:
        return []
    out = []
    for item in ARCH_DTYPES:
        if item.dtype not in dtypes:
            continue
        value = dtype_rule(item.dtype, capability)
        if value is None or value["native"]:
            continue
        major, minor = item.tensor_cores_from
        name = arch_name(capability)
        out.append(
            f"{item.dtype} on sm_{capability[0]}{capability[1]}"
            + (f" ({name})" if name else "")
            + f", native from sm_{major}{minor}: matmul: {value['matmul']}; convolution: "
            f"{value['convolution']}; attention: {value['attention']}; what that allocates "
            f"beyond a newer GPU's tensors: {int(value['extra_bytes']):,} bytes "
            "(memfit/hardware/rules_cuda_arch.json)"
        )
    return out
