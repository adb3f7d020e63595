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
:class:`memfit.core.allocator.AllocatorModel` to get what ``torch.cuda.max_memory_allocated``
and ``max_memory_reserved`` would read, and each storage is put in one category: parameters,
buffers, gradients, optimizer state, activations (made in the forward pass, attributed to the
innermost module running), temporaries (backward and optimizer intermediates), inputs (the
batch) and other (left over from ``build``).
"""

from __future__ import annotations

import math
import re
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from memfit.core.allocator import AllocatorModel, round_size
from memfit.core.measured import MeasuredTerms
from memfit.errors import ConfigError, EstimateError, MemfitError
from memfit.estimate.affine import AffineFit, check_batch_sizes, fit_affine
from memfit.units import format_bytes

__all__ = [
    "CATEGORIES",
    "AffineFit",
    "EstimatePoint",
    "TorchEstimate",
    "estimate_torch",
    "fit_affine",
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

_UNSUPPORTED_HINT = (
    "fake tensors have shapes but no data, so a step cannot branch on values or call ops "
    "whose output size depends on data (nonzero, unique, masked_select, boolean indexing, "
    ".item(), .tolist()); move logging and value-dependent code out of the traced step, or "
    "register a fake (meta) kernel for a custom op with torch.library.register_fake"
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
    """

    batch_size: int
    allocated_peak: int
    reserved_peak: int
    device_used_peak: int | None
    breakdown: dict[str, int]
    top_modules: list[tuple[str, int]]
    exact_peak: int
    num_allocations: int

    def to_dict(self) -> dict[str, Any]:
        """The point as plain data."""
        return {
            "batch_size": self.batch_size,
            "allocated_peak": self.allocated_peak,
            "reserved_peak": self.reserved_peak,
            "device_used_peak": self.device_used_peak,
            "breakdown": dict(self.breakdown),
            "top_modules": [{"module": name, "bytes": n} for name, n in self.top_modules],
            "exact_peak": self.exact_peak,
            "num_allocations": self.num_allocations,
        }


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
    """

    points: list[EstimatePoint]
    fit: AffineFit | None
    reserved_fit: AffineFit | None
    device: str
    gpu: str | None
    deviations: list[str]
    batch_knob: str = "batch_size"

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


@dataclass
class _Trace:
    """The allocation sequence of one traced run."""

    device_type: str
    records: list[_Storage] = field(default_factory=list)
    events: list[tuple[_Storage, bool]] = field(default_factory=list)  # (storage, is_alloc)
    live: dict[int, _Storage] = field(default_factory=dict)
    refs: dict[int, weakref.ref[Any]] = field(default_factory=dict)
    phase: str = "build"
    in_optimizer: int = 0
    module_stack: list[str] = field(default_factory=list)
    module_names: dict[int, str] = field(default_factory=dict)
    cublas_bytes: int | None = None  # set: add a workspace per thread that runs a matmul
    cublas_threads: set[int] = field(default_factory=set)
    matmul_passes: set[str] = field(default_factory=set)  # "forward" / "backward"
    closed: bool = False

    def add(self, nbytes: int, category: str, module: str | None) -> _Storage:
        record = _Storage(nbytes, category, module, alloc_index=len(self.events))
        self.records.append(record)
        self.events.append((record, True))
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

    def on_op(self, func: Any, out: Any) -> None:
        if func.overloadpacket.__name__ in _CUBLAS_OPS:
            backward = torch._C._current_graph_task_id() != -1
            self.matmul_passes.add("backward" if backward else "forward")
            thread = threading.get_ident()
            if self.cublas_bytes is not None and thread not in self.cublas_threads:
                self.cublas_threads.add(thread)
                self.add(self.cublas_bytes, "cublas_workspace", None)
        for item in tree_flatten(out)[0]:
            if isinstance(item, torch.Tensor):
                self.see(item)


class _TrackerMode(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Records the storage of every op output on the traced device."""

    def __init__(self, trace: _Trace) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.trace = trace

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        self.trace.on_op(func, out)
        return out


class _FakeDeepcopyMode(TorchFunctionMode):
    """``copy.deepcopy`` of a fake tensor inside the trace's own fake mode.

    ``Tensor.__deepcopy__`` copies the storage by a path that gives the copy a new fake mode,
    which the next op refuses ("Mixing fake modes"); modules cloned in ``__init__``
    (``nn.TransformerEncoder``) or target networks made with ``deepcopy`` would break the
    trace. Here the copy is a fresh tensor of the same shape, strides and dtype in the same
    mode, so its storage is allocated (and counted) as a real deepcopy allocates it.
    """

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        from torch._subclasses.fake_tensor import FakeTensor

        if func is torch.Tensor.__deepcopy__ and isinstance(args[0], FakeTensor):
            tensor, memo = args
            if id(tensor) in memo:
                return memo[id(tensor)]
            with torch.no_grad():
                data = torch.empty_strided(
                    tensor.size(), tensor.stride(), dtype=tensor.dtype, device=tensor.device
                )
            out: torch.Tensor
            if isinstance(tensor, torch.nn.Parameter):
                out = torch.nn.Parameter(data, requires_grad=tensor.requires_grad)
            else:
                out = data.requires_grad_(tensor.requires_grad)
            memo[id(tensor)] = out
            return out
        return func(*args, **(kwargs or {}))


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


def _run_trace(
    build: Callable[[], tuple[Any, Any]],
    step: Callable[[Any, Any, Any], Any],
    make_batch: Callable[[int], Any],
    batch_size: int,
    device: str,
    cublas_bytes: int | None,
    steps: int,
) -> _Trace:
    """Build and run ``steps`` steps under fake tensors; return the allocation sequence."""
    from torch._subclasses.fake_tensor import (
        DataDependentOutputException,
        DynamicOutputShapeException,
        FakeTensorMode,
        UnsupportedFakeTensorException,
        UnsupportedOperatorException,
    )

    trace = _Trace(device_type=torch.device(device).type, cublas_bytes=cublas_bytes)
    hook_handles: list[Any] = []
    try:
        with (
            _default_device(device),
            _no_distribution_validation(),
            FakeTensorMode(allow_non_fake_inputs=False),
            _TrackerMode(trace),
            _hooks(trace),
        ):
            with _FakeDeepcopyMode():
                built = build()
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
                    trace.module_names.setdefault(id(mod), name or type(root).__name__)
                for p in root.parameters():
                    trace.see(p)
                    trace.retag(p, "parameters")
                    if p.requires_grad:
                        hook = partial(_tag_grad, trace)
                        hook_handles.append(p.register_post_accumulate_grad_hook(hook))  # type: ignore[no-untyped-call]
                for b in root.buffers():
                    trace.see(b)
                    trace.retag(b, "buffers")
            for _ in range(steps):
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
            del model, optimizer, built, modules
    except (DynamicOutputShapeException, DataDependentOutputException) as exc:
        raise EstimateError(
            f"the step calls {_op_name(exc)}, whose output depends on tensor values, which "
            "a fake-tensor trace cannot know",
            hint=_UNSUPPORTED_HINT,
        ) from exc
    except UnsupportedOperatorException as exc:
        raise EstimateError(
            f"operator {_op_name(exc)} has no fake (meta) kernel, so it cannot be traced",
            hint=_UNSUPPORTED_HINT,
        ) from exc
    except UnsupportedFakeTensorException as exc:
        raise EstimateError(
            f"fake tensors cannot run this step: {exc}", hint=_UNSUPPORTED_HINT
        ) from exc
    except RuntimeError as exc:
        text = str(exc)
        match = _NO_FAKE_RE.search(text)
        if match is None and "doesn't have storage" not in text:
            raise _step_failed(exc) from exc
        op = match.group(1) if match is not None else "an operator that reads tensor data"
        raise EstimateError(
            f"operator {op} has no fake (meta) kernel, so it cannot be traced",
            hint=_UNSUPPORTED_HINT,
        ) from exc
    except MemfitError:
        raise
    except Exception as exc:  # the user's code failed; say so instead of an internal error
        raise _step_failed(exc) from exc
    finally:
        for handle in hook_handles:
            handle.remove()
        trace.closed = True
        trace.refs.clear()
    return trace


def _step_failed(exc: BaseException) -> EstimateError:
    return EstimateError(
        f"the step failed under the fake-tensor trace: {type(exc).__name__}: {exc}",
        hint="check that build/make_batch/step run as they are on this machine; rerun with "
        "--debug (or read the chained exception) for the traceback",
    )


def _tag_grad(trace: _Trace, param: torch.Tensor) -> None:
    trace.retag(param.grad, "gradients")


def _summarise(
    trace: _Trace,
    batch_size: int,
    allocator: Callable[[], AllocatorModel],
    extra_device_bytes: int | None,
) -> EstimatePoint:
    """Replay the trace through the allocator model and read the peak and its breakdown."""
    model = allocator()
    handles: dict[int, int] = {}
    peak_index = -1
    exact = exact_peak = 0
    for index, (record, is_alloc) in enumerate(trace.events):
        if is_alloc:
            handles[id(record)] = model.malloc(record.nbytes)
            exact += record.nbytes
            exact_peak = max(exact_peak, exact)
            if model.allocated_bytes == model.peak_allocated_bytes:
                peak_index = index
        else:
            model.free(handles.pop(id(record)))
            exact -= record.nbytes
    breakdown = dict.fromkeys(CATEGORIES, 0)
    by_module: dict[str, int] = {}
    for record in trace.records:
        alive = record.alloc_index <= peak_index and (
            record.free_index is None or record.free_index > peak_index
        )
        if not alive:
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
    device_used = (
        None if extra_device_bytes is None else model.peak_reserved_bytes + extra_device_bytes
    )
    return EstimatePoint(
        batch_size=batch_size,
        allocated_peak=model.peak_allocated_bytes,
        reserved_peak=model.peak_reserved_bytes,
        device_used_peak=device_used,
        breakdown=breakdown,
        top_modules=top,
        exact_peak=exact_peak,
        num_allocations=len(trace.records),
    )


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
    steps: int = 2,
    batch_knob: str = "batch_size",
) -> TorchEstimate:
    """Predict the peak GPU memory of a PyTorch step by tracing it with fake tensors.

    Args:
        build: ``build() -> (model, optimizer)``; called under fake tensors with the traced
            device as the default device.
        step: ``step(model, optimizer, batch)``: one full training (or inference) step.
        make_batch: ``make_batch(batch_size) -> batch``.
        batch_sizes: Batch sizes to trace (each traced from a fresh build).
        gpu: GPU name or size for the device-level figures (CUDA context, cuBLAS workspace
            by architecture), looked up in :mod:`memfit.core.catalog`; ``None`` for defaults.
        device: ``"cuda"`` or ``"cpu"``; by default ``"cuda"`` where torch has CUDA, else
            ``"cpu"`` (with the deviations listed in the result).
        expandable_segments: Replay the allocator with ``expandable_segments:True``.
        max_split_size: Replay it with ``max_split_size_mb`` (given here in bytes).
        steps: Steps to run per batch size (2: the second sees the optimizer state).
        batch_knob: The workload knob the batch size stands for.

    Returns:
        A :class:`TorchEstimate` with one point per batch size and the affine fit.

    Raises:
        ConfigError: When the batch sizes, the device, ``steps``, ``max_split_size`` or
            ``build``'s return value are invalid, or the GPU name is unknown.
        EstimateError: When the step calls an op fake tensors cannot run (data-dependent
            output, no fake kernel; the message names the op), or the user's code raises.
    """
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
        from memfit.core.catalog import gpu as lookup_gpu

        spec = lookup_gpu(gpu)
    from memfit.core.budget import cublas_workspace_bytes, cuda_context_bytes

    workspace = cublas_workspace_bytes(spec)
    context = cuda_context_bytes(spec)
    on_cuda = device == "cuda"
    deviations: list[str] = [
        "workspaces allocated inside kernels (cuDNN convolution algorithms, cuBLASLt, "
        "NCCL) are not seen by the dispatcher and are not counted",
        "the allocator replay models one stream; memory held for other streams "
        "(record_stream, side streams) is not modelled",
    ]
    if not on_cuda:
        deviations[:0] = [
            "traced on CPU because this torch has no CUDA: CUDA-only kernel choices (cuDNN "
            "convolution, flash and memory-efficient attention in scaled_dot_product_attention, "
            "fused optimizers) are seen as their CPU counterparts",
            "the cuBLAS workspace is not in allocated_peak; device_used_peak adds one "
            f"({format_bytes(workspace)} for each of the forward and backward passes that run a "
            "matmul: CUDA runs backward on its own thread, with its own cuBLAS handle)",
        ]
    points: list[EstimatePoint] = []
    for size in sizes:
        trace = _run_trace(
            build, step, make_batch, size, device, workspace if on_cuda else None, steps
        )
        extra = context
        if not on_cuda:
            extra += len(trace.matmul_passes) * workspace
        points.append(_summarise(trace, size, allocator, extra))
    xs = [p.batch_size for p in points]
    return TorchEstimate(
        points=points,
        fit=fit_affine(xs, [p.allocated_peak for p in points]),
        reserved_fit=fit_affine(xs, [p.reserved_peak for p in points]),
        device=device,
        gpu=None if spec is None else spec.name,
        deviations=deviations,
        batch_knob=batch_knob,
    )
