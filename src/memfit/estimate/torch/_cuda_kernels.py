"""The kernels a CUDA target runs, on a trace that runs on the CPU.

Where CUDA runs a different kernel than the CPU, the memory differs: what the op returns,
what autograd keeps for backward, what the kernel takes inside. :class:`CudaKernels` makes
a CPU trace follow CUDA's kernels for a CUDA target:

* **Composite operators** (decomposed above autograd; :mod:`memfit.estimate.torch._cuda_probe`):
  while the trace runs, each one gets a Python kernel on the ``AutogradCPU`` key (and the
  trace's dispatch mode sees the same operators under ``inference_mode``, where autograd is
  off). The kernel reads, once per call pattern, whether the installed torch decomposes the
  call differently on CUDA; where CUDA runs a single operator instead (``dropout`` ->
  ``native_dropout``, whose backward keeps a 1-byte mask, not a noise tensor of the input's
  dtype), that operator runs on the traced tensors. Elsewhere the call decomposes as
  before.
* **scaled_dot_product_attention**: the backend CUDA would choose for the target
  (:mod:`memfit.estimate.torch._cuda_sdpa`), run as CUDA's branch of the composite runs it.
* **What kernels take inside** (added to the trace as transients at the op, for the CUDA
  target): cuDNN's convolution workspace (:mod:`memfit.estimate.torch._cuda_conv`) and the
  attention backward kernels' scratch.
* **What an older torch's backward kept** (:mod:`memfit.estimate.torch._older_formulas`): the
  installed torch's derivative formulas, corrected where the target's torch kept more.

Every choice is recorded (:meth:`CudaKernels.uses`, the estimate's ``kernels``) with its
bytes, and :meth:`CudaKernels.notes` says what was assumed and what stays unknown.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
from torch.utils._pytree import tree_flatten

from memfit._plain import plain_fields
from memfit.estimate.torch._cuda_arch import dtype_notes
from memfit.estimate.torch._cuda_conv import CONV_FITTED_NOTE, conv_note, conv_workspace
from memfit.estimate.torch._cuda_dispatch import (
    OpDispatch,
    coverage,
    cuda_kernel_composites,
    known,
)
from memfit.estimate.torch._cuda_probe import (
    apply_rule,
    composite_op_names,
    decompose,
    in_cpu_probe,
    is_probing,
    rule_for,
)
from memfit.estimate.torch._cuda_reduce import DEFAULT_SMS, REDUCE_KERNEL, REDUCE_OPS, reduce_buffer
from memfit.estimate.torch._cuda_scratch import kernel_scratch
from memfit.estimate.torch._cuda_sdpa import backward_scratch, choose, run
from memfit.estimate.torch._fake_compat import op_name
from memfit.estimate.torch._older_formulas import OlderFormulas
from memfit.hardware.rules import rule
from memfit.units import format_bytes

__all__ = ["CudaKernels", "KernelUse"]

_SDPA = "aten.scaled_dot_product_attention.default"
_ATTENTION_BACKWARD = (
    "aten._scaled_dot_product_flash_attention_backward.default",
    "aten._scaled_dot_product_efficient_attention_backward.default",
    "aten._scaled_dot_product_cudnn_attention_backward.default",
)
_CONV = ("aten.convolution.default", "aten.convolution_backward.default")
# Composite operators whose CUDA path a torch built without CUDA cannot show (it links no
# cuDNN), named in the notes when the trace meets them.
_CUDA_LIBRARY_PATHS = {
    "aten.lstm.input": "cuDNN's RNN (a reserve buffer for backward)",
    "aten.lstm.data": "cuDNN's RNN (a reserve buffer for backward)",
    "aten.gru.input": "cuDNN's RNN (a reserve buffer for backward)",
    "aten.gru.data": "cuDNN's RNN (a reserve buffer for backward)",
    "aten.rnn_tanh.input": "cuDNN's RNN (a reserve buffer for backward)",
    "aten.rnn_relu.input": "cuDNN's RNN (a reserve buffer for backward)",
    "aten.batch_norm.default": "cuDNN's batch norm (a small reserve buffer)",
    "aten.ctc_loss.IntList": "cuDNN's CTC loss",
    "aten.ctc_loss.Tensor": "cuDNN's CTC loss",
}


@dataclass(frozen=True)
class KernelUse:
    """One kernel a CUDA target runs for an op, as the trace assumed it.

    Attributes:
        kernel: The kernel or backend (``"flash_attention"``, ``"native_dropout"``,
            ``"cuDNN 7 NHWC transform (float32 accumulation)"``).
        calls: Calls in the trace of the largest batch size.
        saved_bytes: The most bytes one call keeps besides its result (a dropout mask, an
            attention log-sum-exp and RNG state): what backward holds on to.
        workspace_bytes: The most bytes one call takes inside the kernel and gives back.
        cpu_kernel: What a trace for a CPU target runs instead, or ``None``.
        bound: ``True`` where ``workspace_bytes`` is a bound, not a sourced size.
        note: Why this kernel (the gates that ruled out the others), or ``""``.
    """

    kernel: str
    calls: int
    saved_bytes: int
    workspace_bytes: int
    cpu_kernel: str | None = None
    bound: bool = False
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The use as plain data."""
        return plain_fields(self)


def _short(name: str) -> str:
    return name.removeprefix("aten.").removesuffix(".default")


def _summary(ops: tuple[str, ...]) -> str | None:
    """The CPU's decomposition in a few words (``"empty_like, bernoulli_, div_, mul"``)."""
    names = list(dict.fromkeys(_short(n) for n in ops))
    if not names:
        return None
    return ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")


def _conv_outputs(trace: Any, name: str, out: Any) -> dict[str, Any]:
    """The trace records of a convolution's outputs, by the kernel that writes them:
    ``forward`` its output, ``backward_data`` ``grad_input``, ``backward_filter``
    ``grad_weight`` (a kernel's workspace is taken after its output is allocated)."""
    items = list(out) if isinstance(out, (tuple, list)) else [out]
    kinds = ("forward",) if name == _CONV[0] else ("backward_data", "backward_filter")
    found: dict[str, Any] = {}
    for kind, item in zip(kinds, items, strict=False):
        if isinstance(item, torch.Tensor):
            found[kind] = trace.live.get(id(item.untyped_storage()))
    return found


def _overload(name: str) -> Any:
    base, _, overload = name.removeprefix("aten::").partition(".")
    packet = getattr(torch.ops.aten, base, None)
    return None if packet is None else getattr(packet, overload or "default", None)


class CudaKernels:
    """Trace the kernels a CUDA target runs (see the module docstring).

    Args:
        capability: The target GPU's compute capability, or ``None`` (unknown).
        torch_version: The target's torch ``(major, minor)``, or ``None``.
        cudnn_major: The target's cuDNN major version.
        version_text: The target's torch version as given (``"2.1.0.dev20230623"``).
        emulate: Run CUDA's composite decompositions and attention backend on a CPU trace;
            ``False`` on a trace on fake CUDA tensors, where torch chooses them itself and
            only what kernels take inside (and older torch's formulas) is added.
    """

    def __init__(
        self,
        capability: tuple[int, int] | None,
        torch_version: tuple[int, int] | None,
        cudnn_major: int,
        version_text: str | None = None,
        *,
        emulate: bool = True,
    ) -> None:
        self.capability = capability
        self.torch_version = torch_version
        # torch 2.0 and 2.1 run FlashAttention 1 (packed layout); 2.2 brought FlashAttention 2
        self.legacy_flash = bool(rule("torch", "sdpa.flash.v1", torch=torch_version))
        self.cudnn_major = cudnn_major
        self._uses: dict[tuple[str, str], list[Any]] = {}
        self.differs: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}
        self.unread: set[str] = set()
        self.library_paths: set[str] = set()
        self.assumed: set[str] = set()
        self.refused: set[str] = set()
        self.benchmark_seen = False
        self._thread: int | None = None
        self._lib: Any = None
        self.emulate = emulate
        self.trace: Any = None  # the trace this object serves (_tracer.TracedRun)
        # the composites CUDA decomposes, and those it runs whole (its own kernel)
        whole = cuda_kernel_composites(composite_op_names()) if emulate else ()
        self._whole = {d.name: d for d in whole}
        self._names = (
            frozenset(composite_op_names()) - frozenset(self._whole) if emulate else frozenset()
        )
        self.kept_whole: dict[str, int] = {}
        self.met: dict[str, int] = {}  # every operator the trace met, with its calls
        self._funcs: dict[str, Any] = {}
        self.dtypes: set[str] = set()  # the floating dtypes the trace's outputs had
        self._dtypes_met: set[torch.dtype] = set()  # every dtype of the outputs, floating or not
        self.older = OlderFormulas(torch_version, version_text)
        #: (multiprocessors, threads per multiprocessor) for reductions' staging buffers
        self.reduce_sms: tuple[int, int] = (DEFAULT_SMS, 2048)

    # --- entering and leaving -------------------------------------------------------------

    def __enter__(self) -> CudaKernels:
        self._thread = threading.get_ident()
        if not self.emulate:
            return self
        library: Any = torch.library.Library  # untyped in torch's stubs
        lib = library("aten", "IMPL")
        try:
            for name in self._names:
                op = _overload(name)
                if op is not None:
                    lib.impl(name.removeprefix("aten::"), self._kernel(op), "AutogradCPU")
            for name, found in self._whole.items():
                op = _overload(name)
                if op is None:
                    continue
                keys = [] if found.cpu_kernel else ["AutogradCPU"]
                if torch.version.cuda is None:  # a CPU build: no CUDA kernel for the probes
                    keys.append("AutogradCUDA")
                for key in keys:
                    lib.impl(name.removeprefix("aten::"), self._whole_kernel(op, found), key)
        except BaseException:
            lib._destroy()
            raise
        self._lib = lib
        return self

    def __exit__(self, *exc: object) -> None:
        if self._lib is not None:
            self._lib._destroy()
            self._lib = None

    def is_composite(self, func: Any) -> bool:
        """Whether ``func`` is one of the composite operators this object runs."""
        return func.name() in self._names

    def _kernel(self, op: Any) -> Callable[..., Any]:
        def kernel(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() != self._thread:
                return decompose(op, *args, **kwargs)
            if is_probing():  # the CPU side of a probe follows the rules; the CUDA side not
                if not in_cpu_probe() or str(op) == _SDPA:
                    return decompose(op, *args, **kwargs)
                return apply_rule(op, rule_for(op, args, kwargs), args, kwargs)[0]
            if not _get_current_dispatch_mode_stack():  # another probe (autocast's)
                return decompose(op, *args, **kwargs)
            return self.composite(op, args, kwargs)

        return kernel

    def _whole_kernel(self, op: Any, found: OpDispatch) -> Callable[..., Any]:
        """Run ``op`` as one operator, as CUDA's dispatcher does for an operator with a
        kernel of its own: its derivative formula (the ``Autograd`` kernel) above, the
        operator itself below, where the trace's mode sees it."""
        name = str(op)

        def kernel(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() == self._thread and not is_probing():
                self.kept_whole[name] = self.kept_whole.get(name, 0) + 1
            if found.autograd_kernel:
                return op._op_dk(torch._C.DispatchKey.Autograd, *args, **kwargs)
            with torch._C._AutoDispatchBelowAutograd():
                return op(*args, **kwargs)

        return kernel

    # --- composite operators --------------------------------------------------------------

    def composite(self, op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run a composite call as the CUDA target would (see the module docstring)."""
        name = op_name(op)
        if name == _SDPA:
            return self._attention(args, kwargs)
        if name in _CUDA_LIBRARY_PATHS:
            self.library_paths.add(name)
        rule = rule_for(op, args, kwargs)
        if rule.kind == "differs":
            self.differs.setdefault(name, (rule.cuda_ops, rule.cpu_ops))
        elif rule.kind == "unread":
            self.unread.add(name)
        if rule.kind != "direct":
            return apply_rule(op, rule, args, kwargs)[0]
        start = self._records()
        result = apply_rule(op, rule, args, kwargs)[0]
        saved = self._kept_since(start, result)
        self._use(name, _short(str(rule.target)), saved, 0, _summary(rule.cpu_ops))
        return result

    def _attention(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale")
        bound = dict(zip(names, args, strict=False))
        bound.update(kwargs)
        q, k, v = bound["query"], bound["key"], bound["value"]
        mask = bound.get("attn_mask")
        dropout = float(bound.get("dropout_p", 0.0) or 0.0)
        causal = bool(bound.get("is_causal", False))
        scale = bound.get("scale")
        gqa = bool(bound.get("enable_gqa", False))
        choice = choose(
            q,
            k,
            v,
            mask,
            dropout,
            causal,
            gqa,
            capability=self.capability,
            torch_version=self.torch_version,
        )
        if choice.assumed:
            self.assumed.add(choice.assumed)
        if choice.backend == "error":
            raise RuntimeError(
                "No available kernel for scaled_dot_product_attention on the target GPU: "
                + "; ".join(choice.reasons)
            )
        backend, note = choice.backend, "; ".join(choice.reasons)
        start = self._records()
        try:
            out = run(
                backend, q, k, v, mask, dropout, causal, scale, gqa, legacy_flash=self.legacy_flash
            )
        except RuntimeError as exc:  # the fused kernel's fake implementation refuses the call
            if backend == "math":
                raise
            self.refused.add(f"{backend} ({str(exc).splitlines()[0][:100]})")
            note = f"{backend} chosen, its fake kernel refused the shapes: traced with math"
            backend = "math"
            start = self._records()
            out = run(backend, q, k, v, mask, dropout, causal, scale, gqa)
        self._use(_SDPA, backend, self._kept_since(start, out), 0, None, note=note)
        return out

    def _records(self) -> int:
        return len(self.trace.records) if self.trace is not None else 0

    def _kept_since(self, start: int, result: Any) -> int:
        """Bytes the call allocated that are still alive after it, besides its result's
        storage: what its backward keeps (a mask, a log-sum-exp, a padded copy). Nothing
        when autograd does not keep them (no gradient, or a checkpointed region)."""
        if self.trace is None:
            return 0
        mine = self.trace.live.get(id(result.untyped_storage()))
        return sum(
            r.nbytes
            for r in self.trace.records[start:]
            if r.free_index is None and r is not mine and r.target == "all"
        )

    # --- what kernels take inside -----------------------------------------------------------

    def on_op(
        self,
        trace: Any,
        func: Any,
        args: tuple[Any, ...],
        out: Any,
        kwargs: dict[str, Any] | None = None,
        *,
        name: str | None = None,
        tensors: list[torch.Tensor] | None = None,
    ) -> None:
        """Called by the tracer after each op: the workspace the target's kernel takes, and
        what an older torch's backward formula keeps. ``name`` (``str(func)``) and
        ``tensors`` (the tensors among ``out``) where the tracer has them already."""
        if name is None:
            name = op_name(func)
        if name.startswith("aten."):
            self.met[name] = self.met.get(name, 0) + 1
            self._funcs.setdefault(name, func)
            if tensors is None:
                tensors = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
            for item in tensors:
                dtype = item.dtype
                if dtype not in self._dtypes_met:
                    self._dtypes_met.add(dtype)
                    if dtype.is_floating_point:
                        self.dtypes.add(str(dtype).removeprefix("torch."))
        if self.older.active:
            self.older.on_op(trace, name, args, out)
        inside = kernel_scratch(name, args, kwargs)
        if inside is not None and inside.nbytes:
            # held at once, each its own block, and given back before the kernel returns
            held = [trace.add(n, "kernel_workspace", None, "cuda") for n in inside.blocks if n]
            for record in held:
                trace.release(record)
            self._use(name.removesuffix(".default"), inside.kernel, 0, inside.nbytes, None)
        if name in _CONV:
            if torch.backends.cudnn.benchmark:
                self.benchmark_seen = True
            found = conv_workspace(
                name, args, out, capability=self.capability, cudnn_major=self.cudnn_major
            )
            if found is None:
                return
            outputs = _conv_outputs(trace, name, out)
            for kind, size in found.kernels or ((found.kernel, found.nbytes),):
                if size:  # each kernel's workspace, in the order the op runs them
                    # (cudnn_convolution_backward: grad_input and its kernel, then
                    # grad_weight and its kernel; the corpus's order)
                    after = outputs.get(kind)
                    trace.add_transient_after(after, size, "kernel_workspace", "cuda")
            op = "aten.convolution" if name == _CONV[0] else "aten.convolution_backward"
            note = conv_note(found)
            self._use(op, found.kernel, 0, found.nbytes, None, bound=found.bound, note=note)
        elif name in REDUCE_OPS:
            sms, threads = self.reduce_sms
            size = reduce_buffer(name, args, sms=sms, threads_per_sm=threads)
            if size:
                trace.add_transient(size, "kernel_workspace", "cuda")
                self._use(name.removesuffix(".default"), REDUCE_KERNEL, 0, size, None)
        elif name in _ATTENTION_BACKWARD:
            scratch = backward_scratch(name, args, legacy_flash=self.legacy_flash)
            if scratch:
                trace.add_transient(scratch, "kernel_workspace", "cuda")
            kernel = name.removeprefix("aten._scaled_dot_product_").removesuffix(".default")
            self._use(
                "aten.scaled_dot_product_attention (backward)",
                kernel,
                0,
                scratch,
                None,
                bound=name == _ATTENTION_BACKWARD[2],
            )

    # --- reporting ------------------------------------------------------------------------

    def _use(
        self,
        op: str,
        kernel: str,
        saved: int,
        workspace: int,
        cpu: str | None,
        *,
        bound: bool = False,
        note: str = "",
    ) -> None:
        entry = self._uses.setdefault((op, kernel), [0, 0, 0, cpu, bound, note])
        entry[0] += 1
        entry[1] = max(entry[1], saved)
        entry[2] = max(entry[2], workspace)

    def uses(self) -> dict[str, tuple[KernelUse, ...]]:
        """Each op the target runs another kernel for, with the kernels and their bytes."""
        out: dict[str, list[KernelUse]] = {}
        for (op, kernel), (calls, saved, workspace, cpu, bound, note) in sorted(self._uses.items()):
            out.setdefault(op.removesuffix(".default"), []).append(
                KernelUse(kernel, calls, saved, workspace, cpu, bound, note)
            )
        return {op: tuple(kernels) for op, kernels in out.items()}

    def coverage(self) -> dict[str, int]:
        """How many distinct operators of the trace are followed from CUDA's source and how
        many assumed to take their outputs only
        (:func:`memfit.estimate.torch._cuda_dispatch.known`)."""
        followed, assumed = coverage(self.met, self._funcs)
        return {"followed": followed, "assumed": assumed}

    def notes(self) -> list[str]:
        """What the trace assumed about CUDA's kernels, and what it could not know."""
        out: list[str] = []
        if self.met:
            unknown = sorted(_short(n) for n in self.met if not known(n, self._funcs.get(n))[0])
            out.append(
                f"CUDA kernels: {len(self.met) - len(unknown)} of the {len(self.met)} distinct "
                "operators traced are followed from CUDA's source (est.kernel_coverage); the "
                "others are assumed to take their outputs only"
                + (": " + ", ".join(unknown[:12]) + (", ..." if len(unknown) > 12 else ""))
                if unknown
                else ""
            )
        out.extend(dtype_notes(self.capability, self.dtypes))
        if self.kept_whole:
            out.append(
                "run whole as CUDA's own kernel (a composite formula on the CPU): "
                + ", ".join(
                    f"{_short(n)} ({c} call(s))" for n, c in sorted(self.kept_whole.items())
                )
            )
        uses = self.uses()
        if uses:
            parts = []
            for op, kernels in uses.items():
                for use in kernels:
                    size = max(use.saved_bytes, use.workspace_bytes)
                    parts.append(
                        f"{op} -> {use.kernel} ({use.calls} call(s)"
                        + (f", {format_bytes(size)} per call" if size else "")
                        + ")"
                    )
            out.append(
                "CUDA's kernels traced in place of the CPU's (est.kernels): " + "; ".join(parts)
            )
        out.extend(sorted(self.assumed))
        if self.refused:
            out.append(
                "scaled_dot_product_attention: the fake kernel of the backend CUDA would run "
                "refused these calls, which were traced with the math path (more memory than "
                "the fused kernel keeps): " + "; ".join(sorted(self.refused))
            )
        out.extend(self.older.notes())
        if any(use.bound for kernels in uses.values() for use in kernels):
            out.append(
                "cuDNN attention's backward workspace is not published: counted as a bound "
                "(a float32 dQ accumulator), which the real kernel may undercut"
            )
        if any(use.note.startswith("basis: fitted") for ks in uses.values() for use in ks):
            out.append(CONV_FITTED_NOTE)
        if self.benchmark_seen:
            out.append(
                "torch.backends.cudnn.benchmark=True: the first step's algorithm search may "
                "take workspaces up to the largest block the allocator has free, more than "
                "the heuristic figure counted here"
            )
        if self.differs:
            out.append(
                "CUDA decomposes "
                + ", ".join(sorted(self.differs))
                + " into other operators than the CPU, not as one operator: traced the "
                "CPU's way"
            )
        if self.library_paths:
            paths = sorted({_CUDA_LIBRARY_PATHS[n] for n in self.library_paths})
            out.append(
                "a CUDA build runs "
                + ", ".join(paths)
                + " here, which a torch without CUDA cannot show: traced the CPU's way"
            )
        if self.unread:
            out.append(
                "whether CUDA decomposes "
                + ", ".join(sorted(self.unread))
                + " differently could not be read (the probe failed): traced the CPU's way"
            )
        return out
