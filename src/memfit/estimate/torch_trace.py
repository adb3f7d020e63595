"""Fake-tensor trace of a real PyTorch step: peak GPU memory without a GPU.

:func:`estimate_torch` builds the user's model and optimizer and runs their step twice (the
second step sees the optimizer state) under :class:`torch._subclasses.fake_tensor.FakeTensorMode`,
so every tensor has its real shape, dtype and device but no data: nothing is allocated, and a
model of any size traces in the memory of its metadata.

A :class:`torch.utils._python_dispatch.TorchDispatchMode` stacked on the fake mode sees every
ATen op after autograd and decomposition. Each output's untyped storage is recorded the first
time it is seen (views share their base's storage) and a weak reference on it records the free
when the last tensor using it dies; PyTorch keeps one Python object per storage, so the weak
reference fires exactly when the storage goes away. This is the same lifetime rule PyTorch's
own ``torch.distributed._tools.mem_tracker.MemTracker`` uses.

The sequence of allocations and frees is then replayed through
:class:`memfit.allocator.model.AllocatorModel` to get what ``torch.cuda.max_memory_allocated``
and ``max_memory_reserved`` would read, and each storage is put in one category: parameters,
buffers, gradients, optimizer state, activations (made in the forward pass, attributed to the
innermost module running), temporaries (backward and optimizer intermediates), inputs (the
batch) and other (left over from ``build``).

Besides the tensors, the sequence holds what kernels take inside an op, each for the device it
belongs to: the cuBLAS workspace of every (handle, stream) that runs a matmul (CUDA only; on a
CPU trace the backward pass stands for the autograd device thread's handle), and the scratch
that :mod:`memfit.estimate._kernels` measures (oneDNN convolutions and CPU attention for the
CPU's ``exact_peak``; losses' unreduced buffers for every figure). Ordinary model code that
fake tensors refuse as such (``module.to(device)``, initialisers that read values, logging
inside a library, an explicit ``"cuda"`` on a machine without one) is made to trace by
:mod:`memfit.estimate._fake_compat`; what cannot be traced is refused with the phase
(``build()``, ``make_batch()``, ``step()``), the line, and a hint. When the figures are for
a CUDA GPU, a CPU trace follows CUDA's rules for ``torch.autocast("cuda")`` regions and
``GradScaler("cuda")``, read from the installed torch (:mod:`memfit.estimate._autocast`).
"""

from __future__ import annotations

import contextlib
import math
import re
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from memfit._checks import require
from memfit._plain import plain_fields
from memfit.allocator.model import AllocatorModel, round_size
from memfit.core.measured import MeasuredTerms
from memfit.errors import ConfigError, EstimateError, MemfitError
from memfit.estimate import stand_in_scalars_active
from memfit.estimate._autocast import CudaAutocast
from memfit.estimate._fake_compat import (
    MAX_STAND_INS,
    TraceFunctionMode,
    fake_swap_tensors,
    locate_failure,
    scalar_stand_in,
)
from memfit.estimate._sequence import Fit, SequenceModel
from memfit.estimate._steady import STEADY_REPEATS, steady_program
from memfit.estimate._steady import Program as _Program
from memfit.estimate._steady import run_steady as _run_steady
from memfit.estimate.affine import AffineFit, check_batch_sizes, fit_affine
from memfit.hardware.runtime import ContextEstimate, Runtime
from memfit.units import format_bytes

__all__ = [
    "CATEGORIES",
    "AffineFit",
    "EstimatePoint",
    "Request",
    "TorchEstimate",
    "estimate_torch",
    "fit_affine",
    "trace_requests",
]

#: Breakdown keys, in the order reports show them.
CATEGORIES: tuple[str, ...] = (
    "parameters",
    "buffers",
    "gradients",
    "optimizer_state",
    "activations",
    "temporaries",
    "inputs",
    "cublas_workspace",
    "kernel_workspace",
    "other",
)

#: Categories that do not grow with the batch.
FIXED_CATEGORIES: tuple[str, ...] = (
    "parameters",
    "buffers",
    "gradients",
    "optimizer_state",
    "cublas_workspace",
)

# ATen ops that run through cuBLAS on a CUDA device and so make the thread's cuBLAS handle
# allocate its workspace from the caching allocator on first use.
_CUBLAS_OPS = frozenset(
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

_NO_FAKE_RE = re.compile(
    r"no fake impl(?:ementation)? registered for <?(?:CustomOpDef\()?([\w:.]+)"
)


@dataclass(frozen=True)
class EstimatePoint:
    """Predicted memory of one step at one batch size (bytes).

    Attributes:
        batch_size: The batch size traced.
        allocated_peak: Peak of ``torch.cuda.memory_allocated`` (blocks as the caching
            allocator rounds and splits them).
        reserved_peak: Peak of ``torch.cuda.memory_reserved`` from the allocator replay.
        device_used_peak: ``reserved_peak`` plus the CUDA context (and the cuBLAS workspace
            where the trace could not see it): what ``nvidia-smi`` would show for the process.
        breakdown: Allocated bytes by category (:data:`CATEGORIES`) at the allocated peak.
        top_modules: ``(module name, bytes)`` of the modules whose forward made the most
            activation memory still alive at the peak, largest first.
        exact_peak: Peak of the sum of exact storage sizes (no rounding), for comparison with
            allocators that do not round (the CPU allocator).
        num_allocations: Storages allocated in the whole trace.
        tensor_peak: Peak of the tensors' storages alone, each rounded to 512 B, without the
            memory libraries take inside kernels (cuBLAS workspace) or block slack: what
            :func:`memfit.simulate_gpu` counts.
    """

    batch_size: int
    allocated_peak: int
    reserved_peak: int
    device_used_peak: int | None
    breakdown: dict[str, int]
    top_modules: list[tuple[str, int]]
    exact_peak: int
    num_allocations: int
    tensor_peak: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The point as plain data."""
        return plain_fields(
            self,
            breakdown=dict(self.breakdown),
            top_modules=[{"module": name, "bytes": n} for name, n in self.top_modules],
        )


@dataclass(frozen=True)
class TorchEstimate:
    """What :func:`estimate_torch` measured.

    Attributes:
        points: One :class:`EstimatePoint` per batch size, in the order given.
        fit: Affine fit of ``allocated_peak`` over the batch sizes (``None`` with fewer than
            two distinct batch sizes).
        reserved_fit: The same for ``reserved_peak``.
        device: The device the step was traced on: ``"cuda"`` (fake) or ``"cpu"``.
        gpu: Name of the GPU the device-level figures are for, or ``None`` (defaults).
        deviations: Known ways this trace differs from a real run on the GPU.
        batch_knob: The knob the batch size stands for.
        sequence: The GPU-side allocation sequence as a function of the batch size, from
            the two largest sizes traced, or ``None`` (see :meth:`largest_fitting`).
        expandable_segments: The allocator setting the replays use.
        max_split_size: Likewise (bytes), or ``None``.
        tensor_fit: Affine fit of ``tensor_peak`` (what :func:`memfit.simulate_gpu`
            counts), or ``None`` with fewer than two distinct batch sizes.
        context: The CUDA context ``device_used_peak`` adds: its bytes, the runtime it
            assumed and its source (:class:`memfit.hardware.runtime.ContextEstimate`).
    """

    points: list[EstimatePoint]
    fit: AffineFit | None
    reserved_fit: AffineFit | None
    device: str
    gpu: str | None
    deviations: list[str]
    batch_knob: str = "batch_size"
    sequence: SequenceModel | None = field(default=None, repr=False, compare=False)
    expandable_segments: bool = False
    max_split_size: int | None = None
    tensor_fit: AffineFit | None = None
    context: ContextEstimate | None = None

    def replay(
        self,
        value: int,
        *,
        limit_bytes: int | None = None,
        target_bytes: int | None = None,
        extra_bytes: float = 0.0,
    ) -> Fit | None:
        """Replay the traced GPU-side allocations at ``value`` through the allocator model
        (see :meth:`memfit.estimate._sequence.SequenceModel.replay`); ``None`` without a
        sequence model."""
        if self.sequence is None:
            return None
        return self.sequence.replay(
            value,
            limit_bytes=limit_bytes,
            target_bytes=target_bytes,
            expandable_segments=self.expandable_segments,
            max_split_size=self.max_split_size,
            extra_bytes=extra_bytes,
        )

    def largest_fitting(
        self,
        limit_bytes: int,
        *,
        low: int,
        high: int,
        target_bytes: int | None = None,
    ) -> Fit | None:
        """The largest batch whose traced allocations fit under ``limit_bytes`` in the
        allocator model (and keep its reserved peak within ``target_bytes``), from the two
        largest batch sizes traced (:class:`memfit.estimate._sequence.SequenceModel`).

        Returns:
            The replay at that batch, or ``None`` when the traces cannot be interpolated
            (fewer than two sizes, or a step whose allocations change with the batch size)
            or ``low`` does not fit.
        """
        if self.sequence is None:
            return None
        return self.sequence.largest_fitting(
            low,
            high,
            limit_bytes=limit_bytes,
            target_bytes=target_bytes,
            expandable_segments=self.expandable_segments,
            max_split_size=self.max_split_size,
        )

    def to_dict(self) -> dict[str, Any]:
        """The estimate as plain data (for ``--json``)."""
        return {
            "framework": "torch",
            "device": self.device,
            "gpu": self.gpu,
            "batch_knob": self.batch_knob,
            "points": [p.to_dict() for p in self.points],
            "fit": None if self.fit is None else self.fit.to_dict(),
            "reserved_fit": None if self.reserved_fit is None else self.reserved_fit.to_dict(),
            "context": None if self.context is None else self.context.to_dict(),
            "deviations": list(self.deviations),
        }

    def to_measured(self) -> MeasuredTerms:
        """The estimate as the planner's :class:`MeasuredTerms` (allocated level).

        The batch-independent categories measured at the largest batch size become named
        fixed terms; the rest of the fitted intercept is ``activations_fixed``, so the terms
        add up to the fitted line.

        Raises:
            EstimateError: When there is no fit (fewer than two distinct batch sizes).
        """
        if self.fit is None:
            raise EstimateError(
                "a measured model needs at least two distinct batch sizes",
                hint="trace at two or more batch sizes, e.g. 16, 32, 64",
            )
        largest = max(self.points, key=lambda p: p.batch_size)
        fixed = {k: largest.breakdown.get(k, 0) for k in FIXED_CATEGORIES}
        fixed = {k: v for k, v in fixed.items() if v}
        fixed["activations_fixed"] = round(self.fit.intercept) - sum(fixed.values())
        return MeasuredTerms(
            knob=self.batch_knob,
            fixed_bytes=fixed,
            per_item_bytes=self.fit.slope,
            residual_bytes=math.ceil(self.fit.residual),
            source=f"torch fake-tensor trace on {self.device}",
            notes=tuple(self.deviations),
        )


# --- The tracker ------------------------------------------------------------------------------


@dataclass(eq=False)
class _Storage:
    """One storage's life in the trace."""

    nbytes: int
    category: str
    module: str | None
    alloc_index: int
    free_index: int | None = None
    # "all": a tensor's storage; "cuda" / "cpu": memory a library takes inside a kernel on
    # that device only (cuBLAS workspace, CPU convolution scratch), counted for that target.
    target: str = "all"
    op: str | None = None  # the ATen op whose output (or kernel) this is; None in build glue


@dataclass
class _Trace:
    """The allocation sequence of one traced run."""

    device_type: str
    records: list[_Storage] = field(default_factory=list)
    events: list[tuple[_Storage, bool]] = field(default_factory=list)  # (storage, is_alloc)
    live: dict[int, _Storage] = field(default_factory=dict)
    refs: dict[int, weakref.ref[Any]] = field(default_factory=dict)
    phase: str = "build"
    step_index: int = 0
    step_starts: list[int] = field(default_factory=list)  # index into events of each step
    done_index: int | None = None  # index into events where the teardown begins
    in_optimizer: int = 0
    module_stack: list[str] = field(default_factory=list)
    module_names: dict[int, str] = field(default_factory=dict)
    cublas_bytes: int = 0  # bytes of one cuBLAS workspace (0: none modelled)
    cublas_handles: set[object] = field(default_factory=set)
    stand_ins: int = 0
    retargeted: int = 0
    kernel_scratch: Any = None  # a memfit.estimate._kernels.ScratchRecorder, or None
    # CUDA's autocast rules on a CPU trace for a CUDA target (memfit.estimate._autocast)
    autocast: CudaAutocast = field(default_factory=lambda: CudaAutocast(active=False))
    current_op: str | None = None
    closed: bool = False

    def add(self, nbytes: int, category: str, module: str | None, target: str = "all") -> _Storage:
        record = _Storage(
            nbytes,
            category,
            module,
            alloc_index=len(self.events),
            target=target,
            op=self.current_op,
        )
        self.records.append(record)
        self.events.append((record, True))
        return record

    def add_transient(self, nbytes: int, category: str, target: str) -> _Storage:
        """Memory taken and given back inside one kernel (a workspace, a scratch buffer)."""
        record = self.add(nbytes, category, None, target)
        record.free_index = len(self.events)
        self.events.append((record, False))
        return record

    def on_free(self, key: int, _ref: object) -> None:
        if self.closed:
            return
        record = self.live.pop(key, None)
        self.refs.pop(key, None)
        if record is not None:
            record.free_index = len(self.events)
            self.events.append((record, False))

    def category_now(self) -> tuple[str, str | None]:
        if self.phase == "build":
            return "other", None
        if self.phase == "batch":
            return "inputs", None
        if self.in_optimizer or torch._C._current_graph_task_id() != -1:
            return "temporaries", None
        module = self.module_stack[-1] if self.module_stack else "(step)"
        return "activations", module

    def see(self, tensor: torch.Tensor) -> None:
        if tensor.device.type != self.device_type:
            return
        storage = tensor.untyped_storage()
        key = id(storage)
        if key in self.live:
            return
        nbytes = int(storage.nbytes())
        if nbytes == 0:
            return
        category, module = self.category_now()
        self.live[key] = self.add(nbytes, category, module)
        self.refs[key] = weakref.ref(storage, partial(self.on_free, key))

    def retag(self, tensor: torch.Tensor | None, category: str) -> None:
        if tensor is None or tensor.device.type != self.device_type:
            return
        record = self.live.get(id(tensor.untyped_storage()))
        if record is not None:
            record.category = category
            record.module = None

    def stand_in(self) -> None:
        """Count one value read given a stand-in; refuse a loop that never ends."""
        self.stand_ins += 1
        if self.stand_ins > MAX_STAND_INS:
            raise EstimateError(
                f"more than {MAX_STAND_INS:,} tensor values were read under the trace and "
                "given stand-ins (zero): a loop that waits on a value would never end",
                hint="take the loop out of the traced step, or leave the values it reads out "
                "of memfit.estimate.stand_in_scalars()",
            )

    def on_op(self, func: Any, args: tuple[Any, ...], out: Any) -> None:
        name = func.overloadpacket.__name__
        self.current_op = str(func)
        if self.cublas_bytes and name in _CUBLAS_OPS:
            self._cublas_workspace()
        for item in tree_flatten(out)[0]:
            if isinstance(item, torch.Tensor):
                self.see(item)
        if self.kernel_scratch is not None:
            self.kernel_scratch.on_op(self, func, args, out)
        self.current_op = None

    def _cublas_workspace(self) -> None:
        """The workspace cuBLAS takes per (handle, stream) at its first matmul.

        Handles come from per-thread pools. On a CUDA trace the backward pass runs on the
        autograd engine's device thread, so the thread tells the handle. On a CPU trace
        everything runs on the calling thread, but a CUDA run would run the backward on the
        device thread: there the pass (backward or not) tells the handle, and the workspace
        counts for the CUDA target only.
        """
        if self.device_type == "cuda":
            key: object = threading.get_ident()
            target = "all"
        else:
            key = "backward" if torch._C._current_graph_task_id() != -1 else "forward"
            target = "cuda"
        if key not in self.cublas_handles:
            self.cublas_handles.add(key)
            self.add(self.cublas_bytes, "cublas_workspace", None, target)


class _TrackerMode(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Records the storage of every op output on the traced device."""

    def __init__(self, trace: _Trace, functions: TraceFunctionMode) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.trace = trace
        self.functions = functions

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.ops.aten._local_scalar_dense.default and (
            self.functions.stand_ins_allowed or stand_in_scalars_active()
        ):
            from torch._subclasses.fake_tensor import DataDependentOutputException

            try:
                return func(*args, **(kwargs or {}))  # a constant fake tensor knows its value
            except DataDependentOutputException:
                self.trace.stand_in()
                return scalar_stand_in(args[0].dtype)
        out = func(*args, **(kwargs or {}))
        self.trace.on_op(func, args, out)
        return out


_T = TypeVar("_T")


def _instances_of(obj: Any, cls: type[_T]) -> list[_T]:
    """Every ``cls`` in ``obj``, looking inside dicts, lists and tuples (build() may return
    several models or optimizers)."""
    if isinstance(obj, cls):
        return [obj]
    if isinstance(obj, dict):
        return [m for v in obj.values() for m in _instances_of(v, cls)]
    if isinstance(obj, (list, tuple)):
        return [m for v in obj for m in _instances_of(v, cls)]
    return []


def _qualified_name(root: torch.nn.Module, name: str, mod: torch.nn.Module) -> str:
    """How a report names a module: its path from the model's class, with its own class
    where the path ends in a bare index (``"Sequential.0 (Linear)"``, ``"Net.head"``)."""
    if not name:
        return type(root).__name__
    path = f"{type(root).__name__}.{name}"
    if name.rsplit(".", 1)[-1].isdigit():
        path += f" ({type(mod).__name__})"
    return path


@contextmanager
def _hooks(trace: _Trace) -> Iterator[None]:
    """Global module and optimizer hooks that tell the trace where it is."""
    from torch.nn.modules import module as module_mod
    from torch.optim import optimizer as optimizer_mod

    def pre_forward(mod: torch.nn.Module, _args: Any) -> None:
        trace.module_stack.append(trace.module_names.get(id(mod), type(mod).__name__))

    def post_forward(_mod: torch.nn.Module, _args: Any, _out: Any) -> None:
        if trace.module_stack:
            trace.module_stack.pop()

    def pre_step(opt: torch.optim.Optimizer, _args: Any, _kwargs: Any) -> None:
        trace.in_optimizer += 1
        for group in opt.param_groups:
            for p in group["params"]:
                trace.retag(p.grad, "gradients")

    def post_step(opt: torch.optim.Optimizer, _args: Any, _kwargs: Any) -> None:
        trace.in_optimizer = max(0, trace.in_optimizer - 1)
        for state in opt.state.values():
            for value in tree_flatten(state)[0]:
                if isinstance(value, torch.Tensor):
                    trace.retag(value, "optimizer_state")

    handles = [
        module_mod.register_module_forward_pre_hook(pre_forward),
        module_mod.register_module_forward_hook(post_forward),
        optimizer_mod.register_optimizer_step_pre_hook(pre_step),
        optimizer_mod.register_optimizer_step_post_hook(post_step),
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def _default_device(device: str) -> Iterator[None]:
    previous = torch.get_default_device()
    torch.set_default_device(device)
    try:
        yield
    finally:
        torch.set_default_device(previous)


@contextmanager
def _no_distribution_validation() -> Iterator[None]:
    """``torch.distributions`` checks arguments by reading their values, which fake tensors
    do not have; the checks allocate a few bytes, so the trace runs without them."""
    from torch.distributions import Distribution

    previous = Distribution._validate_args
    Distribution.set_default_validate_args(False)
    try:
        yield
    finally:
        Distribution.set_default_validate_args(previous)


def _op_name(exc: BaseException) -> str:
    func = getattr(exc, "func", None)
    return str(func) if func is not None else type(exc).__name__


def _phase_name(trace: _Trace, steps: int) -> str:
    if trace.phase == "build":
        return "build()"
    if trace.phase == "batch":
        return "make_batch()"
    if trace.phase == "step":
        return f"step() (step {trace.step_index} of {steps})" if steps > 1 else "step()"
    return "the end of the trace"


def _run_trace(
    build: Callable[[], tuple[Any, Any]],
    step: Callable[[Any, Any, Any], Any],
    make_batch: Callable[[int], Any],
    batch_size: int,
    device: str,
    cublas_bytes: int,
    steps: int,
    kernel_scratch: Any = None,
    cuda_target: bool = False,
) -> _Trace:
    """Build and run ``steps`` steps under fake tensors; return the allocation sequence.

    With ``cuda_target`` a CPU trace makes the choices CUDA would where torch decides them
    by device (:mod:`memfit.estimate._cuda_defaults`).
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    from memfit.estimate._cuda_defaults import cuda_optimizer_defaults

    trace = _Trace(
        device_type=torch.device(device).type,
        cublas_bytes=cublas_bytes,
        kernel_scratch=kernel_scratch,
    )
    functions = TraceFunctionMode(
        retarget_cuda=trace.device_type == "cpu", on_stand_in=trace.stand_in
    )
    # A CPU trace for a CUDA target: CUDA's autocast rules (a CUDA trace has torch's own).
    trace.autocast = CudaAutocast(active=cuda_target and trace.device_type == "cpu")
    hook_handles: list[Any] = []
    try:
        with (
            cuda_optimizer_defaults() if cuda_target else contextlib.nullcontext(),
            _default_device(device),
            _no_distribution_validation(),
            fake_swap_tensors(),
            trace.autocast,
            FakeTensorMode(allow_non_fake_inputs=False),
            _TrackerMode(trace, functions),
            functions,
            _hooks(trace),
        ):
            functions.stand_ins_allowed = True  # initialisers read values while they sample
            built = build()
            functions.stand_ins_allowed = False
            if not isinstance(built, tuple) or len(built) != 2:
                raise ConfigError(
                    f"build() must return (model, optimizer), got {type(built).__name__}",
                    key_path="build",
                    hint="return the model and its optimizer (or None) as a pair",
                )
            model, optimizer = built
            modules = _instances_of(model, torch.nn.Module)
            for root in modules:
                for name, mod in root.named_modules():
                    trace.module_names.setdefault(id(mod), _qualified_name(root, name, mod))
                for p in root.parameters():
                    trace.see(p)
                    trace.retag(p, "parameters")
                    if p.requires_grad:
                        hook = partial(_tag_grad, trace)
                        hook_handles.append(p.register_post_accumulate_grad_hook(hook))  # type: ignore[no-untyped-call]
                for b in root.buffers():
                    trace.see(b)
                    trace.retag(b, "buffers")
            for index in range(steps):
                trace.step_index = index + 1
                trace.step_starts.append(len(trace.events))
                trace.phase = "batch"
                batch = make_batch(batch_size)
                trace.phase = "step"
                step(model, optimizer, batch)
                for opt in _instances_of(optimizer, torch.optim.Optimizer):
                    for state in opt.state.values():
                        for value in tree_flatten(state)[0]:
                            if isinstance(value, torch.Tensor):
                                trace.retag(value, "optimizer_state")
                del batch
            trace.phase = "done"
            trace.done_index = len(trace.events)
            del model, optimizer, built, modules
            trace.retargeted = functions.retargeted
    except MemfitError:
        raise
    except Exception as exc:  # the user's code (or a library it calls) failed under the trace
        raise _refusal(exc, _phase_name(trace, steps)) from exc
    finally:
        for handle in hook_handles:
            handle.remove()
        trace.closed = True
        trace.refs.clear()
    return trace


_STAND_IN_HINT = (
    "if the value only feeds logging, a progress bar or a check (as loss.item() inside a "
    "library's training loop), wrap that call in `with memfit.estimate.stand_in_scalars():` "
    "in your step: under the trace the read gives 0, and outside a trace nothing changes; if "
    "the value decides a shape, call the model's forward and loss in your own step instead "
    "of the code that reads it"
)
_SHAPE_HINT = (
    "fake tensors have shapes but no data, so an op whose output size depends on values "
    "(nonzero, unique, masked_select, boolean indexing) cannot be traced; compute such "
    "indices in make_batch (it may return them as tensors of a fixed size), or trace a step "
    "that calls the model's forward and loss directly instead of the library code that does "
    "this"
)
_NO_KERNEL_HINT = (
    "register a fake (meta) kernel for the op before estimating, with "
    "torch.library.register_fake('namespace::op') (this works for an op defined in a "
    "library too: the kernel only computes output shapes), or leave the op out of the traced "
    "step"
)
_BUILD_HINT = (
    "build() runs under fake tensors: it must create the model from code or a config, not "
    "load weights or data from files or from real tensors made before the trace (memory does "
    "not depend on the weights' values: build from the config, e.g. "
    "AutoModel.from_config(config), and load weights in the real run only)"
)


def _refusal(exc: BaseException, phase: str) -> EstimateError:
    """The error for a failure under the trace: what, in which phase, where, and a hint."""
    from torch._subclasses.fake_tensor import (
        DataDependentOutputException,
        DynamicOutputShapeException,
        UnsupportedFakeTensorException,
        UnsupportedOperatorException,
    )

    where, in_library = locate_failure(exc, "_run_trace")
    at = f" at {where}" if where else ""
    text = str(exc)
    op = _op_name(exc)
    building = phase == "build()"
    reads_value = (
        isinstance(exc, DataDependentOutputException) and "_local_scalar_dense" in op
    ) or ".numpy() is not supported for tensor subclasses" in text
    if reads_value:
        return EstimateError(
            f"{phase} reads a tensor's value to Python{at} (aten._local_scalar_dense: .item(), "
            "float(), bool(), .tolist() or .numpy()), which a fake-tensor trace cannot know",
            hint=_STAND_IN_HINT,
        )
    if isinstance(exc, (DynamicOutputShapeException, DataDependentOutputException)):
        return EstimateError(
            f"{phase} calls {op}{at}, whose output depends on tensor values, which a "
            "fake-tensor trace cannot know",
            hint=_BUILD_HINT if building else _SHAPE_HINT,
        )
    match = _NO_FAKE_RE.search(text)
    if isinstance(exc, UnsupportedOperatorException) or match is not None:
        name = match.group(1) if match is not None else op
        return EstimateError(
            f"operator {name} has no fake (meta) kernel, so {phase} cannot be traced{at}",
            hint=_NO_KERNEL_HINT,
        )
    if isinstance(exc, UnsupportedFakeTensorException) or (
        isinstance(exc, RuntimeError) and "doesn't have storage" in text
    ):
        return EstimateError(
            f"fake tensors cannot run {phase}{at}: {text}",
            hint=_BUILD_HINT if building else _NO_KERNEL_HINT,
        )
    lib = " (in a library it calls)" if in_library else ""
    return EstimateError(
        f"{phase} failed under the fake-tensor trace{at}{lib}: {type(exc).__name__}: {exc}",
        hint=(_BUILD_HINT + "; " if building else "")
        + "check that build/make_batch/step run as they are on this machine; rerun with "
        "--debug (or read the chained exception) for the traceback",
    )


def _tag_grad(trace: _Trace, param: torch.Tensor) -> None:
    trace.retag(param.grad, "gradients")


def _steady_program(trace: _Trace) -> _Program | None:
    """The last step as a program, if it repeats the step before it
    (:func:`memfit.estimate._steady.steady_program`, issue 32: three steps suffice)."""
    return steady_program(trace.events, trace.step_starts, trace.done_index)


def _summarise(
    trace: _Trace,
    batch_size: int,
    allocator: Callable[[], AllocatorModel],
    context_bytes: int | None,
) -> EstimatePoint:
    """Replay the trace through the allocator model and read the peaks and the breakdown.

    The CUDA allocator replay takes every tensor storage and what CUDA kernels take inside
    (``target`` ``"all"`` and ``"cuda"``); the exact peak of the traced device takes the
    storages and what that device's kernels take (``"all"`` and the device type).
    """
    model = allocator()
    handles: dict[int, int] = {}
    peak_index = -1
    exact = exact_peak = tensors = tensor_peak = 0
    program = _steady_program(trace)
    for index, (record, is_alloc) in enumerate(trace.events):
        if program is not None and index == trace.done_index:
            # The teardown only frees; in its place the last step runs on to steady state.
            # the last step's allocations still live (the ones the next step frees)
            live = [handles.get(id(r), -1) for r in program.last_allocs]
            _run_steady(model, program, live)
            break
        on_gpu = record.target in ("all", "cuda")
        on_device = record.target in ("all", trace.device_type)
        if record.target == "all" and record.category != "kernel_workspace" and record.nbytes:
            tensors += round_size(record.nbytes) if is_alloc else -round_size(record.nbytes)
            tensor_peak = max(tensor_peak, tensors)
        if is_alloc:
            if on_gpu:
                handles[id(record)] = model.malloc(record.nbytes)
                if model.allocated_bytes == model.peak_allocated_bytes:
                    peak_index = index
            if on_device:
                exact += record.nbytes
                exact_peak = max(exact_peak, exact)
        else:
            if on_gpu:
                model.free(handles.pop(id(record)))
            if on_device:
                exact -= record.nbytes
    breakdown = dict.fromkeys(CATEGORIES, 0)
    by_module: dict[str, int] = {}
    for record in trace.records:
        alive = record.alloc_index <= peak_index and (
            record.free_index is None or record.free_index > peak_index
        )
        if not alive or record.target not in ("all", "cuda") or not record.nbytes:
            continue
        size = round_size(record.nbytes)
        breakdown[record.category] = breakdown.get(record.category, 0) + size
        if record.category == "activations" and record.module is not None:
            by_module[record.module] = by_module.get(record.module, 0) + size
    # Slack of unsplit blocks counts as allocated too; keep the breakdown adding up.
    slack = model.peak_allocated_bytes - sum(breakdown.values())
    if slack > 0:
        breakdown["other"] += slack
    top = sorted(by_module.items(), key=lambda kv: kv[1], reverse=True)[:5]
    device_used = None if context_bytes is None else model.peak_reserved_bytes + context_bytes
    return EstimatePoint(
        batch_size=batch_size,
        allocated_peak=model.peak_allocated_bytes,
        reserved_peak=model.peak_reserved_bytes,
        device_used_peak=device_used,
        breakdown=breakdown,
        top_modules=top,
        exact_peak=exact_peak,
        num_allocations=sum(1 for r in trace.records if r.target == "all"),
        tensor_peak=tensor_peak,
    )


@dataclass(frozen=True)
class Request:
    """One allocation of a traced run, as the GPU truth corpus's traces list them.

    Attributes:
        nbytes: Bytes requested (exact, before the allocator rounds them).
        op: The ATen op whose output or kernel took it (``"aten.mm.default"``), or ``None``.
        target: ``"all"`` (a tensor), ``"cuda"`` or ``"cpu"`` (memory a library takes inside a
            kernel on that device only: cuBLAS workspace, CPU convolution scratch).
        transient: Given back inside the same op (scratch).
    """

    nbytes: int
    op: str | None
    target: str
    transient: bool


def trace_requests(
    build: Callable[[], tuple[Any, Any]],
    step: Callable[[Any, Any, Any], Any],
    make_batch: Callable[[int], Any],
    batch_size: int,
    *,
    device: str = "cpu",
    gpu: str | None = None,
    steps: int = 2,
    kernel_scratch: bool = True,
) -> list[Request]:
    """The allocation requests of one traced run (build and ``steps`` steps), in order.

    What :func:`estimate_torch` replays, for a diff against a real run's allocator trace
    (``memfit.estimate.truth.diff_requests``).

    Raises:
        ConfigError: When the GPU name is unknown or ``build`` returns the wrong thing.
        EstimateError: When the step cannot be traced.
    """
    spec = None
    if gpu is not None:
        from memfit.hardware.catalog import gpu as lookup_gpu

        spec = lookup_gpu(gpu)
    from memfit.hardware.cuda import cublas_workspace_bytes

    recorder = None
    if kernel_scratch:
        from memfit.estimate._kernels import ScratchRecorder

        recorder = ScratchRecorder()
    trace = _run_trace(
        build,
        step,
        make_batch,
        batch_size,
        device,
        cublas_workspace_bytes(spec),
        steps,
        kernel_scratch=recorder,
        cuda_target=device == "cuda" or gpu is not None,
    )
    if recorder is not None:
        recorder.measure()
    return [
        Request(
            r.nbytes,
            r.op,
            r.target,
            r.free_index is not None and r.free_index == r.alloc_index + 1,
        )
        for r, is_alloc in trace.events
        if is_alloc
    ]


def estimate_torch(
    build: Callable[[], tuple[Any, Any]],
    step: Callable[[Any, Any, Any], Any],
    make_batch: Callable[[int], Any],
    batch_sizes: Sequence[int],
    *,
    gpu: str | None = None,
    device: str | None = None,
    expandable_segments: bool = False,
    max_split_size: int | None = None,
    steps: int = 3,
    batch_knob: str = "batch_size",
    kernel_scratch: bool | None = None,
    runtime: Runtime | Mapping[str, str] | str | None = None,
    progress: Callable[[str], None] | None = None,
) -> TorchEstimate:
    """Predict the peak GPU memory of a PyTorch step by tracing it with fake tensors.

    Args:
        build: ``build() -> (model, optimizer)``; called under fake tensors with the traced
            device as the default device.
        step: ``step(model, optimizer, batch)``: one full training (or inference) step.
        make_batch: ``make_batch(batch_size) -> batch``.
        batch_sizes: Batch sizes to trace (each traced from a fresh build).
        gpu: GPU name or size for the device-level figures (CUDA context, cuBLAS workspace
            by architecture), looked up in :mod:`memfit.hardware.catalog`; ``None`` for defaults.
        device: ``"cuda"`` or ``"cpu"``; by default ``"cuda"`` where torch has CUDA, else
            ``"cpu"`` (with the deviations listed in the result).
        expandable_segments: Replay the allocator with ``expandable_segments:True``.
        max_split_size: Replay it with ``max_split_size_mb`` (given here in bytes).
        steps: Steps to run per batch size (3: the second sees the optimizer state; when the
            third repeats the second, the allocator replay runs it on to the steady state a
            long run reaches).
        batch_knob: The workload knob the batch size stands for.
        kernel_scratch: Measure the scratch memory kernels take inside an op by running each
            distinct call of such an op once for real on this machine's CPU (see
            :mod:`memfit.estimate._kernels`): oneDNN convolutions and CPU flash attention
            (``exact_peak`` of a CPU trace only) and the unreduced buffer of losses (every
            figure). ``None`` (default) or ``True``: measure; ``False``: skip (faster; those
            buffers are then not counted).
        runtime: The target's software, which sizes the CUDA context in
            ``device_used_peak``: ``{"torch": "1.10.0", "cuda": "11.2", "driver":
            "460.91.03", "module_loading": "eager"}`` (every key optional) or the same as
            ``"torch=1.10.0,cuda=11.2"``; ``None``: the installed torch's versions and its
            default loading mode (:func:`memfit.backends.software.target_runtime`).
        progress: Called with a short sentence as each batch size's trace starts, for a
            status line; ``None``: silent.

    Returns:
        A :class:`TorchEstimate` with one point per batch size and the affine fit.

    Raises:
        ConfigError: When the batch sizes, the device, ``steps``, ``max_split_size`` or
            ``build``'s return value are invalid, or the GPU name is unknown.
        EstimateError: When the step calls an op fake tensors cannot run (data-dependent
            output, no fake kernel; the message names the op), or the user's code raises.
    """
    for name, fn in (("build", build), ("step", step), ("make_batch", make_batch)):
        require(name, fn, "callable")
    require("gpu", gpu, "str", optional=True)
    require("device", device, "str", optional=True)
    require("expandable_segments", expandable_segments, "bool")
    require("max_split_size", max_split_size, "int", optional=True)
    require("steps", steps, "int")
    require("batch_knob", batch_knob, "str")
    require("kernel_scratch", kernel_scratch, "bool", optional=True)
    require("progress", progress, "callable", optional=True)
    sizes = check_batch_sizes(batch_sizes)

    def allocator() -> AllocatorModel:
        return AllocatorModel(expandable_segments, max_split_size)

    allocator()  # an invalid max_split_size fails here, before any tracing
    if steps < 1:
        raise ConfigError(f"steps must be at least 1, got {steps}", key_path="steps")
    has_cuda = bool(torch.cuda.is_available())
    if device is None:
        device = "cuda" if has_cuda else "cpu"
    if device not in ("cuda", "cpu"):
        raise ConfigError(
            f"unknown trace device {device!r}", key_path="device", hint="use 'cuda' or 'cpu'"
        )
    if device == "cuda" and not torch.backends.cuda.is_built():  # type: ignore[no-untyped-call]
        raise ConfigError(
            "this torch is built without CUDA, so it cannot make fake CUDA tensors",
            key_path="device",
            hint="trace on 'cpu' (the default here), or install a CUDA build of torch",
        )
    spec = None
    if gpu is not None:
        from memfit.hardware.catalog import gpu as lookup_gpu

        spec = lookup_gpu(gpu)
    from memfit.backends.software import target_runtime
    from memfit.hardware.cuda import cublas_workspace_bytes
    from memfit.hardware.runtime import cuda_context

    target = target_runtime(runtime)
    workspace = cublas_workspace_bytes(spec)
    context_estimate = cuda_context(spec, target)
    context = context_estimate.bytes
    on_cuda = device == "cuda"
    # The figures are for a CUDA GPU whenever one is named (a GPU, a runtime) or traced on.
    cuda_target = on_cuda or gpu is not None or runtime is not None
    measure_scratch = kernel_scratch is not False
    deviations: list[str] = [
        f"cuBLAS workspace: {format_bytes(workspace)} per cuBLAS handle that runs a matmul "
        "(one for the calling thread, one for the autograd engine's device thread that runs "
        "the backward pass on CUDA), counted in allocated_peak; cuBLASLt shares it (PyTorch's "
        "default unified workspace)",
        "workspaces cuDNN convolutions and NCCL take inside their kernels are not modelled "
        "yet (no GPU truth to size them from)",
        "the allocator replay models one stream; memory held for other streams "
        "(record_stream, side streams) is not modelled",
        f"device_used_peak adds a {context_estimate.describe()}; "
        + "; ".join(context_estimate.unknowns),
    ]
    if not on_cuda:
        deviations[:0] = [
            "traced on CPU because this torch has no CUDA: CUDA-only kernel choices (cuDNN "
            "convolution, flash and memory-efficient attention in scaled_dot_product_attention) "
            "are seen as their CPU counterparts",
        ]
        if cuda_target:
            deviations.append(
                "optimizers built without foreach= step with their multi-tensor (foreach) "
                "implementation, as torch chooses on CUDA, not with the CPU's per-parameter loop"
            )
    points: list[EstimatePoint] = []
    stand_ins = retargeted = kept = 0
    steady = False
    recorder = None
    gpu_events: dict[int, list[tuple[bool, int, int]]] = {}
    for index, size in enumerate(sizes, 1):
        if progress is not None:
            progress(f"tracing {batch_knob}={size} ({index} of {len(sizes)})")
        if measure_scratch:
            from memfit.estimate._kernels import ScratchRecorder

            recorder = ScratchRecorder()
        trace = _run_trace(
            build,
            step,
            make_batch,
            size,
            device,
            workspace,
            steps,
            kernel_scratch=recorder,
            cuda_target=cuda_target,
        )
        if recorder is not None:
            recorder.measure()
        stand_ins = max(stand_ins, trace.stand_ins)
        program = _steady_program(trace)
        if program is not None and program.kept_bytes:
            kept = max(kept, program.kept_bytes)
        steady = steady or program is not None
        retargeted = max(retargeted, trace.retargeted)
        points.append(_summarise(trace, size, allocator, context))
        gpu_events[size] = _gpu_events(trace)
    if recorder is not None:
        deviations += recorder.notes()
    if steady:
        deviations.append(
            "the last traced step repeats the one before it, so it was replayed on through the "
            f"allocator model (up to {STEADY_REPEATS} more times) until the reserved peak held: "
            "the fragmentation a long run reaches"
        )
    elif steps >= 3:
        deviations.append(
            "the traced steps differ from one another, so the reserved peak covers only the "
            f"{steps} traced steps, not the steady state of a long run"
        )
    if kept:
        deviations.append(
            f"each step keeps {format_bytes(kept)} more alive that no later step frees (a "
            "growing list of losses or outputs?): the replayed steps include it, a real run "
            "keeps growing"
        )
    if stand_ins:
        deviations.append(
            f"{stand_ins} tensor value(s) read to Python in build() (initialisers) or inside "
            "stand_in_scalars() were given stand-ins (zero); memory does not depend on them"
        )
    if retargeted:
        deviations.append(
            f"{retargeted} call(s) named a CUDA device explicitly and were traced on the CPU"
        )
    deviations += trace.autocast.notes()  # the last size's: the rules are the same at every size
    xs = [p.batch_size for p in points]
    sequence = None
    if len(gpu_events) >= 2:
        v1, v2 = sorted(gpu_events)[-2:]
        sequence = SequenceModel.from_traces(v1, gpu_events[v1], v2, gpu_events[v2])
    return TorchEstimate(
        points=points,
        fit=fit_affine(xs, [p.allocated_peak for p in points]),
        reserved_fit=fit_affine(xs, [p.reserved_peak for p in points]),
        device=device,
        gpu=None if spec is None else spec.name,
        deviations=deviations,
        batch_knob=batch_knob,
        sequence=sequence,
        expandable_segments=expandable_segments,
        max_split_size=max_split_size,
        tensor_fit=fit_affine(xs, [p.tensor_peak for p in points]),
        context=context_estimate,
    )


def _gpu_events(trace: _Trace) -> list[tuple[bool, int, int]]:
    """The trace's CUDA-side events as ``(is_alloc, record index, bytes)``."""
    index = {id(r): i for i, r in enumerate(trace.records)}
    return [
        (is_alloc, index[id(r)], r.nbytes)
        for r, is_alloc in trace.events
        if r.target in ("all", "cuda")
    ]
