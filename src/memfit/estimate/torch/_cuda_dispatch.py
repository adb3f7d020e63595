"""How CUDA dispatches each ATen operator, read from the installed torch.

A trace on the CPU for a CUDA target must run each operator as CUDA would: whole where CUDA
has a kernel of its own, decomposed where CUDA decomposes it. The two differ for operators
registered both ways: ``silu_backward`` has a ``CompositeImplicitAutograd`` formula (five
intermediate tensors of its input's size) and a fused CUDA kernel (none); CUDA's dispatcher
takes the kernel, because an autograd key uses a ``CompositeImplicitAutograd`` kernel only
where the backend has no kernel of its own (``computeDispatchTableEntryWithDebug`` in
``aten/src/ATen/core/dispatch/OperatorEntry.cpp``). ``_fused_rms_norm`` has a CUDA kernel and
no CPU kernel: the CPU decomposes it where CUDA keeps one kernel and a float32 ``rstd``.

Where each operator's kernels are registered is read from two places of the installed torch:

* its dispatcher registry (``torch._C._dispatch_has_kernel_for_dispatch_key``), which knows
  every kernel this build links: a CPU-only build has no CUDA kernel in it;
* ``native_functions.yaml``, which the torch wheel ships under ``torchgen/packaged/`` and from
  which every build's registrations are generated: which backends each operator has kernels
  for (``dispatch:``, a ``structured_delegate``'s kernels, ``ufunc_inner_loop``'s generated
  CPU and CUDA kernels), and which operators have no ``dispatch:`` section (those get a
  ``CompositeImplicitAutograd`` kernel).

:func:`classify` gives one operator's class for a CUDA target; :func:`cuda_kernel_composites`
the operators with both a CUDA kernel and a ``CompositeImplicitAutograd`` kernel, which
:class:`memfit.estimate.torch._cuda_kernels.CudaKernels` keeps whole.
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass

import torch

__all__ = [
    "KINDS",
    "MAY_DECOMPOSE",
    "OpDispatch",
    "classify",
    "cuda_kernel_composites",
    "dispatch_source",
    "yaml_keys",
]

#: The classes :func:`classify` gives, with what each means for a CUDA target.
KINDS: dict[str, str] = {
    "cuda_kernel": "CUDA runs a kernel of its own (whole)",
    "generic_kernel": "one kernel for every backend (CompositeExplicitAutograd): whole",
    "composite": "decomposed above autograd into other operators (CompositeImplicitAutograd)",
    "none": "no CUDA kernel (another backend's operator, or registered by hand)",
}

#: Operators with a CUDA kernel and a composite that a CPU trace may still decompose, with why.
#: Empty in torch 2.13: every such operator is kept whole
#: (``tests/estimate/torch/test_cuda_dispatch.py`` walks them all).
MAY_DECOMPOSE: dict[str, str] = {}

_BACKEND_ALIASES = ("CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional")
_FUNC = re.compile(r"^- func: ([A-Za-z0-9_.]+)\(")
_LOCK = threading.Lock()
_KEYS: dict[str, frozenset[str]] | None = None
_TAGS: dict[str, frozenset[str]] = {}
_SOURCE: str | None = None


def _yaml_path() -> str | None:
    import importlib.util

    spec = importlib.util.find_spec("torchgen")
    if spec is None or not spec.submodule_search_locations:  # the registry alone
        return None
    root = next(iter(spec.submodule_search_locations))
    path = os.path.join(root, "packaged", "ATen", "native", "native_functions.yaml")
    return path if os.path.exists(path) else None


def _parse(text: str, tags: dict[str, frozenset[str]] | None = None) -> dict[str, frozenset[str]]:
    """Each operator's dispatch keys from ``native_functions.yaml`` (a reader of its few
    fields: fast, where a YAML load of the file takes seconds); ``tags`` gets each operator's
    tags (``pointwise``, ``core``, ...)."""
    raw: dict[str, set[str]] = {}
    delegate: dict[str, str] = {}
    current: str | None = None
    in_dispatch = False
    declared = False
    manual = False

    def close() -> None:
        if current is not None and not declared and current not in delegate and not manual:
            raw[current].add("CompositeImplicitAutograd")  # torchgen's default

    for line in text.splitlines():
        match = _FUNC.match(line)
        if match:
            close()
            current = match.group(1)
            raw.setdefault(current, set())
            in_dispatch = declared = manual = False
            continue
        if current is None or not line.strip() or line.lstrip().startswith("#"):
            continue
        if line.startswith("    ") and in_dispatch:
            declared_keys = line.strip().split(":", 1)[0]
            raw[current].update(k.strip() for k in declared_keys.split(",") if k.strip())
            continue
        in_dispatch = False
        if line.startswith("  dispatch:"):
            in_dispatch = declared = True
        elif line.startswith("  structured_delegate:"):
            delegate[current] = line.split(":", 1)[1].strip()
        elif line.startswith("  manual_kernel_registration:"):
            manual = line.split(":", 1)[1].strip() == "True"
        elif line.startswith("  tags:") and tags is not None:
            value = line.split(":", 1)[1].strip().strip("[]")
            tags[current] = frozenset(t.strip() for t in value.split(",") if t.strip())
        elif line.startswith("  ufunc_inner_loop:"):
            raw[current].update(("CPU", "CUDA"))  # the generated CPU and CUDA kernels
        elif line.startswith("  autogen:"):
            for name in line.split(":", 1)[1].split(","):
                raw.setdefault(name.strip(), set()).add("CompositeExplicitAutograd")
    close()
    out: dict[str, frozenset[str]] = {}
    for name, keys in raw.items():
        target = delegate.get(name)
        if target is not None:  # a structured op runs its out= variant's kernels
            keys = keys | {k for k in raw.get(target, set()) if k != "CompositeImplicitAutograd"}
        out[name] = frozenset(keys)
    return out


def yaml_keys() -> dict[str, frozenset[str]]:
    """Each operator's dispatch keys in the installed torch's ``native_functions.yaml``
    (``{}`` where the wheel does not ship it), read once per process."""
    global _KEYS, _SOURCE
    with _LOCK:
        if _KEYS is None:
            path = _yaml_path()
            if path is None:
                _KEYS, _SOURCE = {}, "the dispatcher registry"
            else:
                with open(path, encoding="utf-8") as handle:
                    _KEYS = _parse(handle.read(), _TAGS)
                _SOURCE = f"native_functions.yaml of torch {torch.__version__} and its registry"
        return _KEYS


def dispatch_source() -> str:
    """Where :func:`classify` read the registrations (for reports)."""
    yaml_keys()
    assert _SOURCE is not None
    return _SOURCE


def _has(name: str, key: str) -> bool:
    return bool(torch._C._dispatch_has_kernel_for_dispatch_key(name, key))


@dataclass(frozen=True)
class OpDispatch:
    """One operator's registrations, as far as a CUDA target's trace needs them.

    Attributes:
        name: The operator (``"aten::silu_backward"``).
        kind: How CUDA dispatches it (a key of :data:`KINDS`).
        composite: It has a ``CompositeImplicitAutograd`` kernel.
        cpu_kernel: This build runs it whole on the CPU (a CPU or generic kernel).
        autograd_kernel: It has a kernel on the ``Autograd`` key (a derivative formula).
    """

    name: str
    kind: str
    composite: bool
    cpu_kernel: bool
    autograd_kernel: bool

    @property
    def cuda_whole(self) -> bool:
        """CUDA runs it as one operator."""
        return self.kind in ("cuda_kernel", "generic_kernel")


def classify(name: str) -> OpDispatch:
    """How CUDA dispatches ``name`` (``"aten::op.overload"`` or ``"aten::op"``)."""
    keys = yaml_keys().get(name.removeprefix("aten::"), frozenset())
    composite = _has(name, "CompositeImplicitAutograd") or "CompositeImplicitAutograd" in keys
    if _has(name, "CUDA") or "CUDA" in keys:
        kind = "cuda_kernel"
    elif any(_has(name, k) or k in keys for k in _BACKEND_ALIASES):
        kind = "generic_kernel"
    elif composite:
        kind = "composite"
    else:
        kind = "none"
    cpu = _has(name, "CPU") or any(_has(name, k) for k in _BACKEND_ALIASES)
    return OpDispatch(name, kind, composite, cpu, _has(name, "Autograd"))


def cuda_kernel_composites(names: tuple[str, ...]) -> tuple[OpDispatch, ...]:
    """Those of ``names`` (operators with a ``CompositeImplicitAutograd`` kernel) that CUDA
    runs whole all the same."""
    return tuple(d for d in (classify(n) for n in names) if d.cuda_whole)


# --- what is known of each operator's CUDA kernel ------------------------------------------

#: Operators whose CUDA kernel (or library path) the trace models from its source, besides
#: the scratch rules of :mod:`memfit.estimate.torch._cuda_scratch`.
MODELLED: dict[str, str] = {
    "aten.convolution.default": (
        "cuDNN's workspace for the target (memfit.estimate.torch._cuda_conv)"
    ),
    "aten.convolution_backward.default": "cuDNN's workspace for the target",
    "aten.native_dropout.default": "CUDA's fused dropout: a 1-byte mask (dropout runs it)",
    "aten._scaled_dot_product_flash_attention.default": "FlashAttention: a float32 LSE",
    "aten._scaled_dot_product_flash_attention_backward.default": "its dq accumulator",
    "aten._scaled_dot_product_efficient_attention.default": "memory-efficient attention",
    "aten._scaled_dot_product_efficient_attention_backward.default": "its accumulators",
    "aten._scaled_dot_product_cudnn_attention_backward.default": "a float32 dQ (a bound)",
    "aten.mm.default": "cuBLAS's workspace per handle (memfit.estimate.torch._cuda_blas)",
    "aten.addmm.default": "cuBLASLt's workspace per handle",
    "aten.bmm.default": "cuBLAS's workspace per handle",
    "aten.baddbmm.default": "cuBLAS's workspace per handle",
}


def known(name: str, func: object = None) -> tuple[bool, str]:
    """``(followed from CUDA's source, what is known)`` of one operator's CUDA kernel, named
    as the trace names it (``"aten.mul.Tensor"``)."""
    from memfit.estimate.torch._cuda_scratch import ASSUMED, SCRATCH_RULES, no_scratch

    if name in ASSUMED:
        return False, "assumed: " + ASSUMED[name]
    source = no_scratch(name)
    if source is not None:
        return True, "nothing beyond its outputs (" + source + ")"
    if name in SCRATCH_RULES:
        return True, "scratch beyond its outputs (memfit.estimate.torch._cuda_scratch)"
    if name in MODELLED:
        return True, MODELLED[name]
    from memfit.estimate.torch._cuda_reduce import REDUCE_OPS

    if name in REDUCE_OPS:
        return True, "gpu_reduce_kernel's staging buffer (memfit.estimate.torch._cuda_reduce)"
    op = name.removeprefix("aten.").removesuffix(".default")
    yaml_keys()
    if "pointwise" in _TAGS.get(op, frozenset()):
        return True, "pointwise (TensorIterator): nothing beyond its outputs"
    if getattr(func, "is_view", False):
        return True, "a view: no memory of its own"
    return False, "assumed: its outputs only"


def coverage(met: dict[str, int], funcs: dict[str, object] | None = None) -> tuple[int, int]:
    """``(followed, assumed)``: how many of the distinct operators ``met`` are followed
    from CUDA's source and how many are assumed to take their outputs only."""
    followed = sum(1 for n in met if known(n, (funcs or {}).get(n))[0])
    return followed, len(met) - followed


def op_table() -> str:
    """The generated table of docs/guide.md: each class of operator the installed torch
    registers, how many, and what a CUDA target's trace knows of its kernels' memory."""
    names = [n for n in torch._C._dispatch_get_all_op_names() if n.startswith("aten::")]
    found = [classify(n) for n in names]
    counts = {kind: sum(1 for d in found if d.kind == kind) for kind in KINDS}
    whole = sorted(d.name for d in found if d.composite and d.cuda_whole)
    yaml_keys()
    pointwise = sum(1 for n in names if "pointwise" in _TAGS.get(n.removeprefix("aten::"), ()))
    rows = [
        f"Operators of torch {torch.__version__} ({dispatch_source()}): {len(names):,}.",
        "",
        "| operators | how CUDA dispatches them | what the trace knows of the memory |",
        "|---|---|---|",
    ]
    knows = {
        "cuda_kernel": "its outputs, and what the rows below add",
        "generic_kernel": "its outputs",
        "composite": "its decomposition, traced (CUDA's branch where the probe finds one)",
        "none": "not run for a CUDA target",
    }
    for kind, text in KINDS.items():
        rows.append(f"| {counts[kind]:,} | {text} | {knows[kind]} |")
    rows += [
        f"| {len(whole)}: {', '.join(n.removeprefix('aten::') for n in whole)} | a CUDA "
        "kernel and a composite formula | run whole, as CUDA does |",
        f"| {pointwise:,} tagged pointwise | TensorIterator kernels | nothing beyond their "
        "outputs |",
    ]
    from memfit.estimate.torch._cuda_scratch import NO_SCRATCH, SCRATCH_RULES

    for prefix, source in NO_SCRATCH:
        rows.append(f"| {prefix.removeprefix('aten.')}* | CUDA kernel | nothing beyond its "
                    f"outputs: {source} |")  # fmt: skip
    for name in sorted({*SCRATCH_RULES, *MODELLED}):
        followed, text = known(name)
        if followed and name in SCRATCH_RULES:
            text = "scratch read from torch's CUDA source (memfit.estimate.torch._cuda_scratch)"
        rows.append(
            f"| {name.removeprefix('aten.').removesuffix('.default')} | CUDA kernel | {text} |"
        )
    rows.append("| every other operator | | assumed: its outputs only |")
    return "\n".join(rows) + "\n"
