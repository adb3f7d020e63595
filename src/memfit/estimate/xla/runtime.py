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

The autotuner changed with XLA, so the floor follows the target's jaxlib
(:func:`autotune_rules`): up to jaxlib 0.7.1 ``GemmAlgorithmPicker`` tuned cuBLAS GEMMs (every
pure matmul in 0.4.x, the cuBLAS fallback of every GEMM fusion later) with every buffer and a
reference copy guarded, five guard-zoned buffers for a tiny GEMM, 80 MiB; from 0.5.0 to 0.7.1
one autotuner served a whole module and built the next GEMM's buffers before it freed the
last one's, and parallel nested compiles could overlap too: memfit counts the next GEMM's
operands and result with the last one's five, eight guarded buffers, the floor published jax
0.5 runs show (about 129 MiB); 0.7.2 replaced it with an autotuner that guards the inputs
only.

The BFC allocator itself is :mod:`memfit.allocator.bfc`: with preallocation off a fresh
region under twice a request is handed out whole (:func:`bfc_in_use_bytes`); in a loop of
several jitted calls, so is a chunk an earlier call freed (:mod:`memfit.estimate.xla.program`).

A cuDNN convolution's tuning (:func:`conv_workspace_bytes`, :func:`_replay_conv`) holds its
operands and results guarded, the largest candidate's workspace guarded and a guarded reference
copy; a sort XLA gives to CUB on a device adds CUB's scratch (:func:`cub_sort_scratch_bytes`).

Not modelled, said in notes: several GPUs (device 0 holds more; collectives keep buffers in
XLA's ``CollectiveBFCAllocator``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from memfit.allocator.bfc import (
    BFC_FIRST_REGION,
    BFC_MAX_FRAGMENTATION,
    BFC_MIN_ALLOCATION,
    BfcAllocator,
)
from memfit.errors import OutOfMemory
from memfit.hardware.rules import rule
from memfit.units import MiB

__all__ = [
    "BFC_FIRST_REGION",
    "BFC_MAX_FRAGMENTATION",
    "BFC_MIN_ALLOCATION",
    "REDZONE_BYTES",
    "AutotuneRules",
    "GemmBuffers",
    "RuntimeTerm",
    "autotune_bytes",
    "autotune_rules",
    "bfc_chunk",
    "bfc_growth_bytes",
    "bfc_in_use_bytes",
    "conv_workspace_bytes",
    "cub_sort_scratch_bytes",
    "cublas_replay_bytes",
    "gemm_autotune_bytes",
    "handed_to_cublas_bytes",
    "parse_jaxlib_version",
    "replay_cublas_tuning",
    "step_in_use_bytes",
    "tuning_family",
    "whole_chunk_bytes",
    "xla_flag",
]

#: ``xla_gpu_redzone_padding_bytes``'s default (``xla/debug_options_flags.cc``).
REDZONE_BYTES = 8 * MiB
#: cuBLAS's workspace as XLA sizes it (``kHopperWorkspace``, ``kDefaultWorkspace`` in
#: ``xla/service/gpu/matmul_utils.h``); a legacy cuBLAS call's is capped at its operands' bytes
#: (``GemmWorkspaceRewriteVisitor`` in ``transforms/gemm_rewriter.cc``).
HOPPER_WORKSPACE = 32 * MiB
DEFAULT_WORKSPACE = 4 * MiB
#: A cuBLASLt candidate's temporary beyond its workspace (measured on an H100, jaxlib 0.11.2:
#: the device compile's temporaries are 32 MiB and 1 KiB above the deviceless one's).
LT_WORKSPACE_EXTRA = 1024
#: The limit of the guarded scratch allocator each cuDNN candidate's workspace comes from
#: (``xla_gpu_redzone_scratch_max_megabytes``, 4,096 by default, ``debug_options_flags.cc``;
#: ``conv_algorithm_picker.cc``): a candidate needing more fails and is skipped.
PICKER_WORKSPACE_LIMIT = 4096 * MiB


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
    workspace: int = 0

    @classmethod
    def from_plain(cls, data: Mapping[str, Any]) -> GemmBuffers:
        """From the compile child's JSON (a cuDNN convolution's ``conv`` entry gives its
        :attr:`workspace`, :func:`conv_workspace_bytes`)."""
        conv = data.get("conv")
        return cls(
            str(data["kind"]),
            tuple(int(n) for n in data["results"]),
            tuple(int(n) for n in data["operands"]),
            conv_workspace_bytes(conv) if isinstance(conv, Mapping) else 0,
        )


#: Bytes of each element type XLA's HLO names (the compile child's table).
_ITEMSIZE = {
    "pred": 1, "s4": 1, "u4": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
    "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
    "f8e4m3fn": 1, "f8e5m2": 1, "f8e4m3fnuz": 1, "f8e5m2fnuz": 1,
}  # fmt: skip


def _elements(dims: Iterable[int]) -> int:
    n = 1
    for d in dims:
        n *= int(d)
    return n


def conv_workspace_bytes(conv: Mapping[str, Any]) -> int:
    """The workspace memfit counts for one cuDNN convolution custom call: an explicit-GEMM
    engine's, the largest of cuDNN's classic algorithms, on the forward convolution's terms
    (input ``x``, filter ``w``, output ``y``; a backward call's operands and result are these
    in another order): the unfolded input matrix, ``N x prod(output spatial) x C_in x
    prod(window)`` elements (``CUDNN_CONVOLUTION_FWD_ALGO_GEMM`` "explicitly forms the matrix
    that holds the input tensor data"; the backward passes multiply the same matrix), plus a
    copy of ``y`` in the engine's layout (the NHWC-to-internal transform of the input and
    output that cuDNN 7 took as workspace, pytorch#50990). Half-precision tensors are counted
    at 4 bytes an element (the float32 transforms of pytorch#50990). XLA lists every engine
    cuDNN offers (``GetConvolveRunners`` with no scratch allocator) and runs each with its
    workspace from a guarded allocator that allows up to 4 GiB
    (``xla_gpu_redzone_scratch_max_megabytes``; a candidate that cannot allocate is skipped,
    so on a full card the tuning takes what is free): this stands for the largest candidate.

    Which engines cuDNN offers and their workspaces are inside the closed library: the
    formula is a bound by the algorithm's structure, checked on one measured convolution
    (an H100, jaxlib 0.11.2: the 64x3x84x84 weight gradient's largest candidate took a whole
    512 MiB chunk, a request above 384 MiB; this gives 385.9 MiB).

    >>> conv = {"kind": "backward_filter", "dim_labels": "b01f_o01i->b01f", "groups": 1,
    ...         "shapes": [["f32", [64, 85, 85, 3]], ["f32", [64, 84, 84, 32]],
    ...                    ["f32", [32, 8, 8, 3]]]}
    >>> round(conv_workspace_bytes(conv) / MiB, 1)
    385.9
    """
    kind = str(conv.get("kind", ""))
    shapes = conv.get("shapes") or []
    labels = str(conv.get("dim_labels", ""))
    parts = re.match(r"^(\w+)_(\w+)->(\w+)$", labels)
    if len(shapes) != 3 or parts is None:
        return 0
    order = {
        "forward": (0, 1, 2),  # x, w -> y
        "backward_input": (2, 1, 0),  # dy, w -> dx
        "backward_filter": (0, 2, 1),  # x, dy -> dw
    }.get(kind)
    if order is None:
        return 0
    x, w, y = (shapes[i] for i in order)
    x_labels, w_labels, y_labels = parts.group(1), parts.group(2), parts.group(3)
    try:
        x_dims, w_dims, y_dims = (list(map(int, s[1])) for s in (x, w, y))
        channels = x_dims[x_labels.index("f")]
        window = _elements(d for d, c in zip(w_dims, w_labels, strict=True) if c.isdigit())
        out_features = y_dims[y_labels.index("f")]
    except (ValueError, IndexError, TypeError):
        return 0
    itemsize = max(_ITEMSIZE.get(str(y[0]), 4), 4)
    rows = _elements(y_dims) // max(out_features, 1)  # N x prod(output spatial)
    return (rows * channels * window + _elements(y_dims)) * itemsize


#: CUB's radix sort: bits per digit (``RADIX_BITS``) of its onesweep policy and the digits.
CUB_RADIX_BITS = 8
CUB_RADIX_DIGITS = 1 << CUB_RADIX_BITS
#: CUB's temporary-storage alignment (``AliasTemporaries``, 256 B per allocation).
CUB_ALIGN = 256
#: XLA's rewrite of a sort to CUB (``SortRewriter``): the size above which it rewrites when
#: no device heuristic decides (``ShouldRewriteCompatibleSort``, ``> 16384`` elements).
CUB_SORT_MIN_ELEMENTS = 16385


def cub_sort_scratch_bytes(sort: Mapping[str, Any]) -> int:
    """The device buffers a sort adds when XLA rewrites it to a CUB radix sort
    (``SortRewriter``, ``backends/gpu/transforms/sort_rewriter.cc``): the scratch CUB sizes
    for ``DeviceRadixSort::SortPairs``/``SortKeys`` with separate input and output (CUB's
    ``DispatchRadixSort``: an alternate key buffer and an alternate value buffer of the
    items' size whenever it takes more than one pass, the per-pass digit histograms with
    8-byte offsets, each allocation aligned to 256 B), and, for a float sort in NumPy order
    (jnp.sort, jnp.argsort: NaNs last), the synthetic unsigned keys XLA materializes
    (``AddNumpySortKey``; an argsort packs key and index into one 32- or 64-bit value,
    ``PackNumpySortPairs``). 0 for a sort XLA leaves to its own kernel: more than two
    operands, not along the minor dimension, or ``CUB_SORT_MIN_ELEMENTS`` elements or fewer
    (the default of ``ShouldRewriteCompatibleSort``; on A100, H100 and B200 a table of
    sizes decides, which this over-counts at worst). The deviceless compile cannot size
    it (``Missing deviceless CUB scratch size data for sort``: it keeps XLA's own sort).

    Measured on an H100 (jaxlib 0.11.2, ``bench/xla_deviceless.py``): ``random.permutation``
    of 1,048,576 rows (a u32-key, s32-value sort) compiled to 8 MiB and 224 B more
    temporaries on the card than deviceless; this gives 8 MiB and 8.25 KiB.

    >>> cub_sort_scratch_bytes({"shapes": [["u32", [1048576]], ["s32", [1048576]]],
    ...                         "dimension": 0})
    8397055
    >>> cub_sort_scratch_bytes({"shapes": [["f32", [100]]], "dimension": 0})
    0
    """
    shapes = sort.get("shapes") or []
    if not 1 <= len(shapes) <= 2:
        return 0
    try:
        dims = [int(d) for d in shapes[0][1]]
        types = [str(s[0]) for s in shapes]
    except (TypeError, ValueError, IndexError):
        return 0
    if not dims or int(sort.get("dimension", -1)) != len(dims) - 1:
        return 0
    items = _elements(dims)
    if items < CUB_SORT_MIN_ELEMENTS:
        return 0
    key = _ITEMSIZE.get(types[0], 4)
    value = _ITEMSIZE.get(types[1], 4) if len(types) == 2 else 0
    extra = 0
    if types[0].startswith(("f", "bf")):  # NumPy order: synthetic keys, the input as values
        if value:
            packed = 4 if key + value <= 4 else 8
            extra = items * (key + packed)  # synthetic keys and packed values
            value = packed
        else:
            extra = items * key  # synthetic keys; the floats travel as values
            value = key
    passes = -(-key * 8 // CUB_RADIX_BITS)
    buffers = [items * key, items * value] if passes > 1 else []
    buffers.append(passes * CUB_RADIX_DIGITS * 8)
    scratch = sum(round_up(n, CUB_ALIGN) for n in buffers if n) + CUB_ALIGN - 1
    return scratch + extra


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
    if gemm.kind == "cudnn" and gemm.workspace:
        # the candidate's scratch from a guarded allocator capped at 4 GiB
        # (xla_gpu_redzone_scratch_max_megabytes; conv_algorithm_picker.cc)
        held += _guarded(min(gemm.workspace, PICKER_WORKSPACE_LIMIT), redzone)
    return held + (_guarded(reference, redzone) if check else 0)


@dataclass(frozen=True)
class AutotuneRules:
    """How the target's XLA tunes GEMMs at the first call, by its jaxlib version.

    Attributes:
        jaxlib: The version the rules are for (``"0.7.2"``).
        picker: ``GemmAlgorithmPicker`` tunes a cuBLAS call for every GEMM (jaxlib < 0.7.2):
            its operands, its result, its workspace and a reference copy of the result, all
            guarded (``RedzoneBuffers::kAllInputsAllOutputs`` and ``AllocateBytes`` in
            ``gemm_algorithm_picker.cc``). In 0.4.x a pure matmul stayed a cuBLAS call
            (``xla_gpu_triton_gemm_any`` was off) and the main module's cuBLAS calls were tuned;
            from 0.5.0 on Ampere and later the picker runs on each GEMM fusion's cuBLAS
            fallback, compiled as a nested module (``nvptx_compiler.cc``).
        overlap: The next GEMM's buffers are allocated before the last GEMM's five are
            freed (0.5.0-0.7.1: one ``GemmAutotuner`` for the module since openxla/xla#16520,
            its buffers replaced by move-assignment; on Ampere and later parallel nested
            compiles can overlap the same way, the next one allocating under the GPU mutex
            as soon as the last releases it). Counted: its operands and result, the three it
            allocates first; eight guarded buffers with the last GEMM's five, the floor of
            the published jax 0.5 runs (about 129 MiB; the issue's held-out set).
        hopper: The card is sm90 or newer (cuBLAS's workspace is 32 MiB, not 4).
        all_inputs: Every input of a GEMM fusion is guarded (``kAllInputs``), counted when
            the compile is the target's own (the installed jaxlib): another version fuses
            differently, and the two largest inputs, the dot's operands, stand for its
            fusion (the published jaxlib 0.7.2 floors show two).
        lt_workspace: cuBLASLt is on by default (``xla_gpu_enable_cublaslt``, jaxlib 0.9.2
            on): its candidate runs with a full workspace, 4 MiB or 32 MiB, unguarded.
        whole_chunks: Each of the autotuner's buffers is counted as the BFC chunk it takes
            (:func:`bfc_chunk`): jaxlib 0.9.2 on, whose single-pass autotuner allocates each
            buffer anew per candidate run into regions that double (measured on an H100
            with jaxlib 0.11.2: a tiny MLP step's compile adds 144 MiB, its largest
            allocation a whole 64 MiB chunk for the 32 MiB workspace).
    """

    jaxlib: str
    picker: bool
    overlap: bool
    hopper: bool = False
    all_inputs: bool = False
    lt_workspace: bool = False
    whole_chunks: bool = False

    def describe(self) -> str:
        """The term's name in the breakdown."""
        if not self.picker:
            inputs = "every input" if self.all_inputs else "its two largest inputs"
            lt = ", a cuBLASLt candidate's workspace" if self.lt_workspace else ""
            chunks = ", each the BFC chunk it takes" if self.whole_chunks else ""
            return (
                f"first-call autotuning above the arguments (jaxlib {self.jaxlib}: one GEMM's "
                f"{inputs} with 8 MiB guard zones each side, its output{lt} and the "
                f"reference output{chunks})"
            )
        text = (
            f"first-call autotuning above the arguments (jaxlib {self.jaxlib}: a cuBLAS GEMM's "
            "operands, result, workspace and reference copy, each with 8 MiB guard zones "
            "each side"
        )
        if self.overlap:
            text += (
                "; the next GEMM's operands and result allocated before the last GEMM's "
                "five are freed"
            )
        return text + ")"


def parse_jaxlib_version(text: str) -> tuple[int, int, int] | None:
    """``"0.7.2.dev20251017"`` -> ``(0, 7, 2)``; ``None`` when ``text`` is not a version.

    >>> parse_jaxlib_version("0.4.33"), parse_jaxlib_version("banana")
    ((0, 4, 33), None)
    """
    # ASCII digits, at most 9 a part: "٠.٤" is no version, and a part of thousands of digits
    # is no version either (not an int() past Python's 4,300-digit limit)
    found = re.match(
        r"([0-9]{1,9})\.([0-9]{1,9})(?:\.([0-9]{1,9}))?(?![0-9])(?!\.[0-9])", text.strip()
    )
    if found is None:
        return None
    return int(found.group(1)), int(found.group(2)), int(found.group(3) or 0)


def autotune_rules(
    jaxlib: str, capability: tuple[int, int] | None, installed: str | None = None
) -> AutotuneRules:
    """The autotuner of ``jaxlib``'s XLA for a card of ``capability`` (see the module
    docstring; XLA commits pinned by jax-v0.4.33, v0.5.0, v0.7.2, v0.9.2 and v0.10.2 in
    ``third_party/xla``); ``installed``: the jaxlib that compiles the step here.

    An unreadable version is taken for the newest.

    >>> autotune_rules("0.4.33", (8, 0)).picker, autotune_rules("0.4.33", (8, 0)).overlap
    (True, False)
    >>> autotune_rules("0.5.1", (9, 0)).overlap, autotune_rules("0.7.2", (9, 0)).picker
    (True, False)
    >>> rules = autotune_rules("0.10.2", (8, 9), installed="0.10.2")
    >>> rules.all_inputs, rules.lt_workspace
    (True, True)
    """
    version = parse_jaxlib_version(jaxlib) or (99, 0, 0)
    hopper = bool(rule("jaxlib", "gemm.hopper_workspace", capability=capability))
    picker = bool(rule("jaxlib", "autotune.picker", jaxlib=version))
    overlap = bool(rule("jaxlib", "autotune.overlap", jaxlib=version))
    single_pass = bool(rule("jaxlib", "autotune.single_pass", jaxlib=version))
    found = parse_jaxlib_version(installed) if installed is not None else None
    # the installed compiler fuses as the target's does: the same version, or both of the
    # single-pass autotuner's generation (hardware/rules_jaxlib.json)
    same = found is not None and (
        found == version
        or (single_pass and bool(rule("jaxlib", "autotune.single_pass", jaxlib=found)))
    )
    lt_workspace = not picker and single_pass
    return AutotuneRules(
        jaxlib, picker, overlap, hopper, same and not picker, lt_workspace, lt_workspace
    )


def _picker_buffers(gemm: GemmBuffers, redzone: int, hopper: bool) -> tuple[int, int, int]:
    """What ``GemmAlgorithmPicker`` holds for one GEMM, in the order it allocates them
    (``RedzoneBuffers::FromInstruction``: inputs, then outputs, the workspace last; then the
    reference): the dot's two operands and the result, guarded; the workspace capped at the
    operands' bytes, guarded; the guarded reference copy of the result. Their bytes."""
    dot = sorted(gemm.operands)[-2:]
    result = gemm.results[0] if gemm.results else 0
    workspace = min(HOPPER_WORKSPACE if hopper else DEFAULT_WORKSPACE, sum(dot))
    three = sum(_guarded(n, redzone) for n in (*dot, result))
    return three, _guarded(workspace, redzone), _guarded(result, redzone)


def _candidate_outputs(gemm: GemmBuffers, rules: AutotuneRules) -> tuple[int, ...]:
    """What one run of a candidate of ``gemm`` allocates as its output: the results, a cuBLAS
    call's workspace (its last result) at the device's size under cuBLASLt on Hopper (32 MiB
    and 1 KiB; the deviceless compile gives 4 MiB)."""
    results = gemm.results
    if rules.lt_workspace and rules.hopper and gemm.kind == "cublas" and len(results) > 1:
        results = (*results[:-1], HOPPER_WORKSPACE + LT_WORKSPACE_EXTRA)
    return results


def _profiler_bytes(gemm: GemmBuffers, redzone: int, check: bool, rules: AutotuneRules) -> int:
    """What the autotuner of jaxlib 0.7.2 and later holds for one GEMM (``GpuProfiler``,
    ``backends/gpu/autotuner/gpu_profiler.cc``: ``RedzoneBuffers::kAllInputs``): its inputs
    guarded, the candidate's outputs (a cuBLAS call's workspace among them) and the reference
    output unguarded; with cuBLASLt on, a cuBLASLt candidate's full workspace. The reference
    is the reference candidate's whole output (``Autotuner::GetReferenceOutput``): for a cuBLAS
    call of the single-pass autotuner its result and its workspace (see
    :func:`cublas_replay_bytes`)."""
    if gemm.kind == "cudnn":  # the convolution picker's buffers (:func:`_replay_conv`)
        return gemm_autotune_bytes(gemm, redzone, check=check)
    inputs = gemm.operands if rules.all_inputs else tuple(sorted(gemm.operands)[-2:])
    result = gemm.results[0] if gemm.results else 0
    results = _candidate_outputs(gemm, rules)
    chunk = bfc_chunk if rules.whole_chunks else (lambda n: n)
    total = sum(chunk(_guarded(n, redzone)) for n in inputs) + sum(chunk(n) for n in results)
    if check:
        whole = rules.lt_workspace and gemm.kind == "cublas"
        total += sum(chunk(n) for n in results) if whole else chunk(result)
    if rules.lt_workspace and gemm.kind == "fusion":
        workspace = HOPPER_WORKSPACE if rules.hopper else DEFAULT_WORKSPACE
        total += chunk(workspace + LT_WORKSPACE_EXTRA)
    return total


def cublas_replay_bytes(
    gemms: Sequence[GemmBuffers],
    arguments: Sequence[int],
    redzone: int,
    check: bool,
    rules: AutotuneRules,
) -> int:
    """The most the single-pass autotuner holds above ``arguments`` while it tunes the cuBLAS
    calls among ``gemms``, replayed through a growing BFC allocator (preallocation off) that
    already holds the arguments: where each buffer lands depends on the regions the earlier
    ones grew, so the chunks are placed, not counted each as a fresh one (:func:`bfc_chunk`).

    For each call, in the compile's order (``Autotuner::ProfileAll``,
    ``backends/autotuner/autotuner.cc``; ``GpuProfiler``, ``backends/gpu/autotuner/
    gpu_profiler.cc``): its inputs, each guarded (``RedzoneBuffers::kAllInputs``); the
    reference candidate run twice, a warm-up whose output is freed and a run whose output is
    kept as the reference (``GetReferenceOutput``); then each candidate's warm-up and timed
    run, each output freed after the comparison; at the end the reference and the inputs. A
    candidate is the call alone in a module (``ExtractInstructionIntoNewModule``), its output
    the call's whole result, the workspace its last element (``CublasLtBackend::ApplyConfig``
    sizes it to the autotuning workspace, 32 MiB and 1 KiB on Hopper): the reference holds a
    workspace besides the one each candidate allocates. Without the correctness check
    (``xla_gpu_autotune_level`` below 4) there is no reference.

    Measured on an H100 with jaxlib 0.11.2 (``bench/xla_floor_probe.py``, every GEMM through
    cuBLAS with ``xla_gpu_enable_triton_gemm=false``): the 65536:512:3 MLP step's compile peaks
    at 836 MiB and its allocator grows to 1,158 MiB, as this replay gives (counting each
    buffer as a fresh chunk gave 739 MiB); the 16384:512:3 step's 292 MiB and 294 MiB likewise.

    >>> lt = autotune_rules("0.11.2", (9, 0))
    >>> x, w = 128 * MiB, MiB
    >>> gemm = GemmBuffers("cublas", (x, 4 * MiB), (x, w))
    >>> cublas_replay_bytes([gemm], [w, w, w, x], 8 * MiB, True, lt) // MiB
    704
    >>> cublas_replay_bytes([], [x], 8 * MiB, True, lt)
    0
    """
    pool = replay_cublas_tuning(gemms, arguments, redzone, check, rules)
    return pool.peak_bytes_in_use - pool.bytes_in_use  # every tuning buffer is freed again


def replay_cublas_tuning(
    gemms: Sequence[GemmBuffers],
    arguments: Sequence[int],
    redzone: int,
    check: bool,
    rules: AutotuneRules,
) -> BfcAllocator:
    """The growing BFC allocator after the autotuner tuned the cuBLAS calls among ``gemms``
    with ``arguments`` in use (:func:`cublas_replay_bytes`): its peak and the regions it grew
    (``pool_bytes``)."""
    pool = BfcAllocator(1 << 62, preallocate=False)
    for size in arguments:
        pool.allocate(size)
    for gemm in gemms:
        if gemm.kind == "cudnn":
            _replay_conv(pool, gemm, redzone, check)
            continue
        if gemm.kind != "cublas":
            continue
        outputs = _candidate_outputs(gemm, rules)
        inputs = [pool.allocate(_guarded(n, redzone)) for n in gemm.operands]
        # the reference candidate's warm-up, its kept run, a candidate's warm-up and timed run
        reference: list[int] = []
        for run in ("warm-up", "reference", "warm-up", "timed"):
            held = [pool.allocate(n) for n in outputs if n]
            if run == "reference" and check:
                reference = held
                continue
            for ident in held:
                pool.free(ident)
        for ident in (*reference, *inputs):
            pool.free(ident)
    return pool


def _replay_conv(pool: BfcAllocator, conv: GemmBuffers, redzone: int, check: bool) -> None:
    """One cuDNN convolution's tuning through ``pool``, as XLA's convolution algorithm picker
    holds it (``conv_algorithm_picker.cc``): every operand and every result of the call in its
    own guarded buffer (``RedzoneBuffers::kAllInputsAllOutputs``; the zero-byte scratch result
    is its two guard zones), each candidate run into those output buffers with its workspace
    from a guarded scratch allocator (freed after the run; every candidate counted with the
    largest workspace, :attr:`GemmBuffers.workspace`), and a guarded copy of the first
    result kept as the reference. All freed at the end.

    Measured on an H100 with jaxlib 0.11.2 (``bench/xla_floor_probe.py``, a 64x3x84x84
    convolution's weight gradient): the compile's peak 720.0 MiB above the arguments (this:
    720.04); with ``xla_gpu_redzone_padding_bytes=0`` 584.02 MiB (this: 24 KiB more); the
    regions the card grew are 32 MiB more than this replay's (the order of the allocations
    is not pinned down)."""
    guard = redzone if check else 0
    held = [pool.allocate(_guarded(n, guard)) for n in (*conv.operands, *conv.results)]
    results = [n for n in conv.results if n]
    workspace = min(conv.workspace, PICKER_WORKSPACE_LIMIT)
    for run in range(2):
        if workspace:
            pool.free(pool.allocate(_guarded(workspace, guard)))
        if run == 0 and check:
            held.extend(pool.allocate(_guarded(n, guard)) for n in results[:1])
    for ident in held:
        pool.free(ident)


def bfc_chunk(size: int) -> int:
    """The chunk a growing BFC allocator hands out for a fresh request of ``size``: the region
    it grows for it (twice the last, a power of two from 2 MiB) is split only when at least
    twice the request, or when the rest is ``kMaxInternalFragmentation`` (128 MiB) or more
    (``tsl/framework/bfc_allocator.cc``, ``AllocateRawInternal`` / ``SplitChunk``); otherwise
    the whole chunk is in use.

    >>> bfc_chunk(32 * MiB + 1024) // MiB, bfc_chunk(129 * MiB) // MiB, bfc_chunk(300 * MiB) // MiB
    (64, 256, 300)
    """
    need = round_up(max(size, 1))
    if need <= BFC_FIRST_REGION:
        return need
    region = 1 << (need - 1).bit_length()
    if region >= 2 * need or region - need >= BFC_MAX_FRAGMENTATION:
        return need
    return region


def autotune_bytes(
    gemms: Sequence[GemmBuffers],
    environ: Mapping[str, str],
    rules: AutotuneRules | None = None,
    arguments: Sequence[int] | None = None,
) -> int:
    """The most the first call's autotuning holds at once: the GEMM whose tuning holds most
    (:func:`gemm_autotune_bytes`; XLA tunes one GEMM at a time and frees its buffers).

    ``XLA_FLAGS=--xla_gpu_autotune_level=0`` turns autotuning off (0 bytes); levels below 4
    skip the correctness check and its guard zones (``should_check_correctness``);
    ``--xla_gpu_redzone_padding_bytes`` sets the guard zone. With ``arguments`` (the step's
    argument buffers, in order) and a growing pool (``rules.whole_chunks``), the cuBLAS calls
    of the single-pass autotuner are placed by the allocator after them
    (:func:`cublas_replay_bytes`).

    >>> autotune_bytes([GemmBuffers("fusion", (MiB,), (MiB, MiB))], {}) // MiB
    36
    >>> autotune_bytes([GemmBuffers("fusion", (MiB,), (MiB, MiB))],
    ...                {"XLA_FLAGS": "--xla_gpu_autotune_level=3"}) // MiB
    3

    With ``rules`` for a jaxlib before 0.7.2 (:func:`autotune_rules`), every GEMM is tuned as
    a cuBLAS call: five guarded buffers, 80 MiB for a tiny GEMM; with the overlap of 0.5.0 to
    0.7.1 the largest GEMM's five and the next largest GEMM's operands and result, eight
    guarded buffers, as the published jax 0.5 floors show (about 129 MiB):

    >>> tiny = GemmBuffers("fusion", (4096,), (4096, 4096))
    >>> autotune_bytes([tiny, tiny], {}, autotune_rules("0.4.33", (8, 9))) // MiB
    80
    >>> autotune_bytes([tiny, tiny], {}, autotune_rules("0.5.3", (8, 9))) // MiB
    128
    """
    level = xla_flag(environ, "xla_gpu_autotune_level")
    if level == "0" or not gemms:
        return 0
    padding = xla_flag(environ, "xla_gpu_redzone_padding_bytes")
    redzone = int(padding) if padding is not None and padding.isdigit() else REDZONE_BYTES
    check = not (level is not None and level.isdigit() and int(level) < 4)
    if not check:
        redzone = 0  # no correctness check: the buffers carry no guard zones
    if rules is None:
        return max(gemm_autotune_bytes(gemm, redzone, check=check) for gemm in gemms)
    if not rules.picker:
        if rules.whole_chunks and rules.lt_workspace and arguments is not None:
            # cuBLAS calls placed by the allocator after the arguments; fusions as before
            others = [g for g in gemms if g.kind not in ("cublas", "cudnn")]
            replayed = cublas_replay_bytes(gemms, arguments, redzone, check, rules)
            counted = [_profiler_bytes(gemm, redzone, check, rules) for gemm in others]
            return max([replayed, *counted])
        return max(_profiler_bytes(gemm, redzone, check, rules) for gemm in gemms)
    convs = [gemm_autotune_bytes(g, redzone, check=check) for g in gemms if g.kind == "cudnn"]
    held = sorted((_picker_buffers(gemm, redzone, rules.hopper) for gemm in gemms), key=sum)
    three, workspace, reference = held[-1]
    total = three + workspace + (reference if check else 0)
    if rules.overlap and len(held) > 1:
        total += held[-2][0]
    return max([total, *convs])


def handed_to_cublas_bytes(
    calls: Sequence[GemmBuffers],
    environ: Mapping[str, str],
    rules: AutotuneRules,
    arguments: Sequence[int] | None = None,
) -> int:
    """What the single-pass autotuner holds above the arguments when it tunes, as cuBLAS
    calls, the GEMM fusions it handed to cuBLAS: ``calls`` are the cuBLAS calls of the step
    compiled with every GEMM on cuBLAS (``xla_gpu_enable_triton_gemm=false``), what each
    fusion becomes when a cuBLAS candidate wins it; 0 for an older autotuner or none.

    A GEMM fusion is tuned once as a fusion (``Autotuner::ProfileAll``; its reference is the
    first candidate that cannot give wrong results, ``GetReferenceOutput``, a cuBLAS fission
    whose output is the fusion's result alone: Triton's backend says it can give wrong
    results). When the cuBLAS fission wins, ``FissionBackend::ApplyConfig`` inlines the
    rewritten computation, a cuBLAS custom call, into the module; the compiler's later
    autotuning of cuBLAS custom calls (the GEMM rewriter runs after the fusion autotuner,
    ``gpu_compiler.cc``) tunes that call as it tunes the calls of a cuBLAS-only compile,
    its reference holding the call's result and workspace (:func:`cublas_replay_bytes`).
    Which candidate wins is timed on the device; memfit counts the larger of the two.

    Only calls with an operand at least the size of cuBLAS's workspace are counted: for them
    the replay gives what the card measured (the 16384:512:3 and 65536:512:3 cuBLAS-only
    compiles); for smaller calls the cuBLAS-only compiles peaked one workspace below the
    replay (not explained from the source, see :func:`cublas_replay_bytes`), and the
    fusions' own counted tuning already reaches what the card showed.

    Measured on an H100 with jaxlib 0.11.2 (``bench/xla_floor_probe.py``): the 65536:512:3
    MLP step with ``--xla_gpu_force_compilation_parallelism=1`` (Triton on) compiled to the
    cuBLAS program (its allocator after the step: 2,182 MiB, as with
    ``xla_gpu_enable_triton_gemm=false``; 2,054 MiB with default flags, where Triton won)
    and its compile peaked at 836 MiB with 1,158 MiB of regions, as the cuBLAS-only compile.

    >>> lt = autotune_rules("0.11.2", (9, 0))
    >>> x, w = 128 * MiB, MiB
    >>> calls = [GemmBuffers("cublas", (x, 4 * MiB), (x, w))]
    >>> handed_to_cublas_bytes(calls, {}, lt, [w, w, w, x]) // MiB
    704
    >>> handed_to_cublas_bytes(calls, {}, autotune_rules("0.4.33", (9, 0)), [w, x])
    0
    """
    if rules.picker or not rules.lt_workspace:
        return 0
    workspace = HOPPER_WORKSPACE if rules.hopper else DEFAULT_WORKSPACE
    large = [g for g in calls if g.kind == "cublas" and max(g.operands, default=0) >= workspace]
    return autotune_bytes(large, environ, rules, arguments)


def round_up(size: int, unit: int = BFC_MIN_ALLOCATION) -> int:
    """``size`` rounded up to a multiple of ``unit``."""
    return -(-size // unit) * unit


def bfc_in_use_bytes(allocations: Sequence[int]) -> int:
    """What a growing BFC allocator counts in use after ``allocations`` (in order, all live
    at once): each request takes the smallest free chunk it fits in, or a new region (the
    first of 2 MiB, each next twice the last, or doubled until the request fits); the chunk is
    split only when at least twice the request or when 128 MiB or more would be left over,
    and otherwise counts whole (``tsl/framework/bfc_allocator.cc``: ``Extend``,
    ``FindChunkPtr``; measured on an H100 with jaxlib 0.11.2, bench/xla_floor_probe.py: a
    step of 35 MiB of arguments and 161 MiB of temporaries peaks at 292 MiB, the temporaries a
    whole 256 MiB region).

    >>> bfc_in_use_bytes([MiB, MiB, MiB, 32 * MiB, 161 * MiB]) // MiB
    291
    >>> bfc_in_use_bytes([200 * MiB, 161 * MiB]) // MiB  # two whole 256 MiB regions
    512
    """
    pool = BfcAllocator(1 << 62, preallocate=False)
    for size in allocations:
        pool.allocate(size)
    return pool.bytes_in_use


def whole_chunk_bytes(allocations: Sequence[int]) -> int:
    """What a growing BFC allocator counts in use for ``allocations`` (in order, all live)
    beyond their own bytes rounded: the chunks it hands out whole (:func:`bfc_in_use_bytes`).

    >>> whole_chunk_bytes([MiB, 3 * MiB]) // MiB  # the second takes a whole 4 MiB region
    1
    """
    return bfc_in_use_bytes(allocations) - sum(round_up(max(n, 1)) for n in allocations)


def step_in_use_bytes(
    leaves: Sequence[int], buffers: int, temp: int, tuning: int, growing: bool
) -> tuple[int, int, int]:
    """``(whole, rounding, in_use)`` of one step in a fresh process: the chunks a growing
    pool hands out whole for the arguments (``leaves``) and then the temporaries (``temp``,
    one allocation; the outputs, one buffer per leaf of sizes the compile does not give, are
    counted exactly), the allocator's rounding to 256 B, and ``peak_bytes_in_use``, the
    larger of the step's ``buffers`` and the first call's ``tuning`` (arguments included),
    plus the rounding.

    >>> step_in_use_bytes([MiB], 2 * MiB, MiB, 0, False)
    (0, 0, 2097152)
    """
    whole = whole_chunk_bytes([*leaves, temp]) if growing else 0
    rounding = sum(round_up(n) - n for n in leaves) + round_up(temp) - temp
    return whole, rounding, max(buffers + whole, tuning) + rounding


def tuning_family(gemms: Sequence[GemmBuffers], hopper: bool, tuning_sets_peak: bool) -> str:
    """The family of a compiled step's band around its alternatives
    (``compiled/alternatives/<family>``, :mod:`memfit.core.bands`): ``"small_tuning"`` when
    the first call's tuning sets ``peak_bytes_in_use`` and every GEMM's operands are below
    cuBLAS's workspace (32 MiB on Hopper, else 4 MiB: the autotuner's guarded inputs and
    workspace chunks, placed whole by the allocator, are the figure, and on an H100 the card
    peaked up to a workspace below memfit's replay of them), else ``"other"``.

    >>> tiny = GemmBuffers("fusion", (4096,), (4096, 4096))
    >>> tuning_family([tiny], True, True), tuning_family([tiny], True, False)
    ('small_tuning', 'other')
    """
    workspace = HOPPER_WORKSPACE if hopper else DEFAULT_WORKSPACE
    gemms = [g for g in gemms if g.kind != "cudnn"]
    small = bool(gemms) and all(max(g.operands, default=0) < workspace for g in gemms)
    return "small_tuning" if small and tuning_sets_peak else "other"


def bfc_growth_bytes(allocations: Sequence[int], limit: int | None = None) -> int:
    """What a growing BFC allocator holds after ``allocations`` (all live at once): its
    regions (:class:`memfit.allocator.bfc.BfcAllocator` with preallocation off: the first of
    2 MiB, each next twice the last, or doubled until the request fits), never past
    ``limit`` (the requests that would need more do not fit: the limit).

    >>> bfc_growth_bytes([MiB]) // MiB, bfc_growth_bytes([MiB, 2 * MiB]) // MiB
    (2, 6)
    >>> bfc_growth_bytes([9 * MiB], 10 * MiB) // MiB, bfc_growth_bytes([20 * MiB], 10 * MiB) // MiB
    (10, 10)
    """
    pool = BfcAllocator(limit if limit is not None else 1 << 62, preallocate=False)
    try:
        for size in allocations:
            pool.allocate(size)
    except OutOfMemory:
        return pool.limit_bytes
    return pool.pool_bytes
