"""The tracer: every storage a traced step allocates and frees, in order.

:func:`run_trace` builds the user's model and optimizer and runs their step under
:class:`torch._subclasses.fake_tensor.FakeTensorMode`, so every tensor has its real shape,
dtype and device but no data. A :class:`torch.utils._python_dispatch.TorchDispatchMode`
stacked on the fake mode sees every ATen op after autograd and decomposition. Each output's
untyped storage is recorded the first time it is seen (views share their base's storage) and
a weak reference on it records the free when the last tensor using it dies; PyTorch keeps one
Python object per storage, so the weak reference fires exactly when the storage goes away.
This is the same lifetime rule PyTorch's own ``torch.distributed._tools.mem_tracker.MemTracker``
uses. Module and optimizer hooks tell the trace where it is, so each storage gets a category
(:data:`memfit.estimate.torch._summary.CATEGORIES`).

Besides the tensors, the sequence holds what kernels take inside an op, each for the device
it belongs to (``target``): the cuBLAS and cuBLASLt workspaces of each handle
(:mod:`memfit.estimate.torch._cuda_blas`), what the CUDA kernel a CUDA target runs keeps or takes
inside (:mod:`memfit.estimate.torch._cuda_kernels`), and the scratch that
:mod:`memfit.estimate.torch._measured_scratch` measures on this machine's CPU.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import SUPPORTED_NODES, tree_flatten

from memfit.errors import ConfigError, EstimateError, MemfitError
from memfit.estimate import stand_in_scalars_active
from memfit.estimate.torch._autocast import CudaAutocast
from memfit.estimate.torch._cuda_probe import is_probing
from memfit.estimate.torch._fake_compat import (
    MAX_STAND_INS,
    TraceFunctionMode,
    fake_swap_tensors,
    op_name,
    scalar_stand_in,
)
from memfit.estimate.torch._refusal import refusal

__all__ = ["Storage", "TracedRun", "run_trace"]


@dataclass(eq=False)
class Storage:
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


#: Functional ops an autograd formula calls on a zeros tensor it just made, where the real run
#: calls the in-place twin: ``torch/csrc/autograd/FunctionsManual.cpp`` takes the out-of-place
#: branch when ``areAnyTensorSubclassLike`` holds, which it does for the trace's fake tensors
#: (``value_selecting_reduction_backward``: ``zeros.scatter_`` for sort, topk, max/min(dim),
#: median, kthvalue; ``gather_backward``: ``new_zeros.scatter_add_``; ``index_backward``:
#: ``_index_put_impl_`` into ``zeros_like(self)``). The real kernels write into the zeros
#: tensor: one tensor where the trace made two.
SUBCLASS_FUNCTIONAL_TWINS = frozenset(
    {
        "aten.scatter.src",
        "aten.scatter.value",
        "aten.scatter_add.default",
        "aten.index_put.default",
    }
)
#: The ops those formulas make their zeros tensor with.
ZEROS_MAKERS = frozenset(
    {"aten.zeros.default", "aten.new_zeros.default", "aten.zeros_like.default"}
)


@dataclass
class TracedRun:
    """The allocation sequence of one traced run."""

    device_type: str
    records: list[Storage] = field(default_factory=list)
    events: list[tuple[Storage, bool]] = field(default_factory=list)  # (storage, is_alloc)
    live: dict[int, Storage] = field(default_factory=dict)
    refs: dict[int, weakref.ref[Any]] = field(default_factory=dict)
    phase: str = "build"
    step_index: int = 0
    step_starts: list[int] = field(default_factory=list)  # index into events of each step
    done_index: int | None = None  # index into events where the teardown begins
    in_optimizer: int = 0
    optimizer_class: str | None = None  # the class of the optimizer stepping now
    module_stack: list[str] = field(default_factory=list)
    module_names: dict[int, str] = field(default_factory=dict)
    stand_ins: int = 0
    retargeted: int = 0
    kernel_scratch: Any = None  # a memfit.estimate.torch._measured_scratch.ScratchRecorder, or None
    # the workspaces of cuBLAS / cuBLASLt handles (memfit.estimate.torch._cuda_blas), or None
    blas: Any = None
    # the CUDA kernels a CUDA target runs (memfit.estimate.torch._cuda_kernels.CudaKernels), or None
    cuda_kernels: Any = None
    # CUDA's defaults on a CPU trace (memfit.estimate.torch._cuda_defaults.CudaDeviceDefaults)
    device_defaults: Any = None
    # CUDA's autocast rules on a CPU trace for a CUDA target (memfit.estimate.torch._autocast)
    autocast: CudaAutocast = field(default_factory=lambda: CudaAutocast(active=False))
    current_op: str | None = None
    closed: bool = False
    # the last gradient sum of the backward pass: (its output's record, its operands' records)
    last_sum: tuple[Storage, tuple[Storage, ...]] | None = None

    def add(self, nbytes: int, category: str, module: str | None, target: str = "all") -> Storage:
        record = Storage(
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

    def release(self, record: Storage) -> None:
        """Free a record added with :meth:`add` that no tensor's storage stands for."""
        if record.free_index is None:
            record.free_index = len(self.events)
            self.events.append((record, False))

    def add_transient(self, nbytes: int, category: str, target: str) -> Storage:
        """Memory taken and given back inside one kernel (a workspace, a scratch buffer)."""
        record = self.add(nbytes, category, None, target)
        record.free_index = len(self.events)
        self.events.append((record, False))
        return record

    def add_transient_after(
        self, after: Storage | None, nbytes: int, category: str, target: str
    ) -> Storage:
        """A transient (:meth:`add_transient`) taken right after ``after`` was allocated, when
        ``after`` is an output of the op being recorded (its kernel allocates that output,
        then runs with its workspace, then allocates the next output); else at the end."""
        tail = self.events[after.alloc_index + 1 :] if after is not None else []
        inside = (
            after is not None
            and after.free_index is None
            and after.op == self.current_op
            and self.events[after.alloc_index][0] is after
            and all(is_alloc and r.op == self.current_op for r, is_alloc in tail)
        )
        if not inside or after is None:
            return self.add_transient(nbytes, category, target)
        at = after.alloc_index + 1
        record = Storage(nbytes, category, None, alloc_index=at, target=target, op=self.current_op)
        record.free_index = at + 1
        self.records.append(record)
        self.events[at:at] = [(record, True), (record, False)]
        for moved, _ in tail:  # the op's later outputs, each allocated once
            moved.alloc_index += 2
        return record

    def on_free(self, key: int, _ref: object) -> None:
        if self.closed:
            return
        record = self.live.pop(key, None)
        self.refs.pop(key, None)
        if record is not None:
            if self._sum_in_place(record):
                return
            record.free_index = len(self.events)
            self.events.append((record, False))

    def note_sum(
        self,
        func: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any] | None,
        name: str | None = None,
    ) -> None:
        """Before a backward ``aten.add.Tensor`` of two tensors: remember its operands, for
        :meth:`_sum_in_place` (``name``: ``str(func)``, if known)."""
        self.last_sum = None
        if name is None:
            name = op_name(func)
        if name != "aten.add.Tensor" or kwargs or len(args) != 2 or not self.in_backward():
            return
        found = []
        for arg in args:
            if not isinstance(arg, torch.Tensor) or arg.device.type != self.device_type:
                return
            record = self.live.get(id(arg.untyped_storage()))
            if record is not None:
                found.append(record)
        if found and self.events:
            out = self.events[-1][0]
            if self.events[-1][1] and out.op == "aten.add.Tensor":
                self.last_sum = (out, tuple(found))

    def _sum_in_place(self, record: Storage) -> bool:
        """The autograd engine sums two gradients for one input (``InputBuffer::accumulate``,
        ``torch/csrc/autograd/input_buffer.cpp``) in place (``old_var.add_(var)``) when it
        holds the last reference, unless a tensor is a subclass, which the trace's fake
        tensors are: it runs ``old_var + var`` and drops ``old_var`` at once. An operand of
        the last backward ``add`` freed right after it is moved before the sum's output, so
        the two share one size, as the real in-place sum's do. Returns whether it was."""
        last, self.last_sum = self.last_sum, None
        if last is None or not self.events:
            return False
        out, operands = last
        if record not in operands or record.nbytes != out.nbytes or self.events[-1] != (out, True):
            return False
        index = len(self.events) - 1
        self.events[index] = (record, False)
        record.free_index = index
        out.alloc_index = len(self.events)
        self.events.append((out, True))
        return True

    def adopt_in_place(self, func: Any, args: tuple[Any, ...], name: str | None = None) -> None:
        """Before an autograd formula's functional op on the zeros tensor it has just made
        (:data:`SUBCLASS_FUNCTIONAL_TWINS`): that tensor's storage is given back here, so the
        op's output stands for it, as in the real run's in-place call. Only when the zeros
        tensor is the trace's last allocation, made in this backward pass."""
        if name is None:
            name = op_name(func)
        if name not in SUBCLASS_FUNCTIONAL_TWINS or not self.in_backward() or not args:
            return
        target = args[0]
        if not isinstance(target, torch.Tensor) or target.device.type != self.device_type:
            return
        key = id(target.untyped_storage())
        record = self.live.get(key)
        if record is None or record.op not in ZEROS_MAKERS or not self.events:
            return
        if self.events[-1] != (record, True):
            return
        self.live.pop(key, None)
        self.refs.pop(key, None)
        self.release(record)

    def category_now(self) -> tuple[str, str | None]:
        if self.phase == "build":
            return "other", None
        if self.phase == "batch":
            return "inputs", None
        if self.in_optimizer or self.in_backward():
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

    def on_op(
        self,
        func: Any,
        args: tuple[Any, ...],
        out: Any,
        kwargs: dict[str, Any] | None = None,
        name: str | None = None,
    ) -> None:
        self.current_op = name if name is not None else op_name(func)
        tensors = output_tensors(out)
        for item in tensors:
            self.see(item)
        if self.blas is not None:
            # After the outputs: the kernel allocates its result, then the cuBLAS call gets
            # the handle, which takes its workspace on first use (the corpus's order).
            self.blas.on_op(self, func, args)
            self.blas.after_op(self, func, args)
        if self.cuda_kernels is not None:
            self.cuda_kernels.on_op(
                self, func, args, out, kwargs, name=self.current_op, tensors=tensors
            )
        if self.kernel_scratch is not None:
            self.kernel_scratch.on_op(self, func, args, out)
        self.current_op = None

    def in_backward(self) -> bool:
        """Whether the autograd engine is running a backward pass now."""
        return bool(torch._C._current_graph_task_id() != -1)


def output_tensors(out: Any) -> list[torch.Tensor]:
    """The tensors among an op's outputs, in ``tree_flatten``'s order: an op returns a
    tensor or a flat tuple or list of them (and of ``None``) nearly always, which needs no
    walk of the tree."""
    items = out if type(out) is tuple or type(out) is list else (out,)
    found = []
    for item in items:
        if isinstance(item, torch.Tensor) and type(item) not in SUPPORTED_NODES:
            found.append(item)
        elif item is not None:  # anything else: the whole tree
            return [leaf for leaf in tree_flatten(out)[0] if isinstance(leaf, torch.Tensor)]
    return found


_LOCAL_SCALAR_DENSE = torch.ops.aten._local_scalar_dense.default


class _TrackerMode(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Records the storage of every op output on the traced device."""

    def __init__(self, trace: TracedRun, functions: TraceFunctionMode) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.trace = trace
        self.functions = functions

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is _LOCAL_SCALAR_DENSE and (
            self.functions.stand_ins_allowed or stand_in_scalars_active()
        ):
            from torch._subclasses.fake_tensor import DataDependentOutputException

            try:
                return func(*args, **(kwargs or {}))  # a constant fake tensor knows its value
            except DataDependentOutputException:
                self.trace.stand_in()
                return scalar_stand_in(args[0].dtype)
        kernels = self.trace.cuda_kernels
        if kernels is not None and kernels.is_composite(func) and not is_probing():
            # A composite op reaches the mode when autograd is off (inference_mode): run it
            # as the CUDA target would.
            out = kernels.composite(func, tuple(args), dict(kwargs or {}))
        else:
            out = func(*args, **(kwargs or {}))
        name = op_name(func)
        self.trace.adopt_in_place(func, tuple(args), name)
        self.trace.on_op(func, args, out, kwargs, name)
        self.trace.note_sum(func, tuple(args), kwargs, name)
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
def _hooks(trace: TracedRun) -> Iterator[None]:
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
        trace.optimizer_class = type(opt).__name__
        for group in opt.param_groups:
            for p in group["params"]:
                trace.retag(p.grad, "gradients")

    def post_step(opt: torch.optim.Optimizer, _args: Any, _kwargs: Any) -> None:
        trace.in_optimizer = max(0, trace.in_optimizer - 1)
        if not trace.in_optimizer:
            trace.optimizer_class = None
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


def _phase_name(trace: TracedRun, steps: int) -> str:
    if trace.phase == "build":
        return "build()"
    if trace.phase == "batch":
        return "make_batch()"
    if trace.phase == "step":
        return f"step() (step {trace.step_index} of {steps})" if steps > 1 else "step()"
    return "the end of the trace"


def run_trace(
    build: Callable[[], tuple[Any, Any]],
    step: Callable[[Any, Any, Any], Any],
    make_batch: Callable[[int], Any],
    batch_size: int,
    device: str,
    steps: int,
    *,
    kernel_scratch: Any = None,
    cuda: Any = None,
    cuda_target: bool = False,
) -> TracedRun:
    """Build and run ``steps`` steps under fake tensors; return the allocation sequence.

    Args:
        kernel_scratch: A
            :class:`memfit.estimate.torch._measured_scratch.ScratchRecorder`, or ``None``.
        cuda: The CUDA GPU and software the allocated figures are for
            (:class:`memfit.estimate.torch._cuda_target.CudaTarget`: the cuBLAS workspaces it
            takes), or ``None`` (no library workspaces).
        cuda_target: The figures are for a CUDA target named by the caller (a GPU, a
            runtime, or a trace on CUDA). A CPU trace for a CUDA target makes the choices
            CUDA would where torch decides them by device: the optimizers' defaults and
            autocast's device (:mod:`memfit.estimate.torch._cuda_defaults`), autocast's rules
            (:mod:`memfit.estimate.torch._autocast`) and the kernels each op runs
            (:mod:`memfit.estimate.torch._cuda_kernels`).
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    from memfit.estimate.torch._cuda_defaults import CudaDeviceDefaults

    trace = TracedRun(device_type=torch.device(device).type, kernel_scratch=kernel_scratch)
    functions = TraceFunctionMode(
        retarget_cuda=trace.device_type == "cpu", on_stand_in=trace.stand_in
    )
    emulate = cuda_target and trace.device_type == "cpu"
    # A CPU trace for a CUDA target: CUDA's autocast rules (a CUDA trace has torch's own).
    trace.autocast = CudaAutocast(active=emulate)
    kernels: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
    defaults: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
    if cuda is not None:
        trace.blas = cuda.blas_workspaces(trace.device_type)
    if emulate:
        trace.device_defaults = CudaDeviceDefaults()
        defaults = trace.device_defaults
    if cuda is not None and cuda_target:
        # On fake CUDA tensors torch makes CUDA's choices itself; what kernels take inside
        # is added either way.
        trace.cuda_kernels = cuda.kernels(emulate=emulate)
        trace.cuda_kernels.trace = trace
        kernels = trace.cuda_kernels
    hook_handles: list[Any] = []
    try:
        with (
            defaults,
            _default_device(device),
            _no_distribution_validation(),
            fake_swap_tensors(),
            trace.autocast,
            FakeTensorMode(allow_non_fake_inputs=False),
            kernels,
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
        raise refusal(exc, _phase_name(trace, steps)) from exc
    finally:
        for handle in hook_handles:
            handle.remove()
        trace.closed = True
        trace.refs.clear()
    return trace


def _tag_grad(trace: TracedRun, param: torch.Tensor) -> None:
    trace.retag(param.grad, "gradients")
