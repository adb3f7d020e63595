"""Survive out-of-memory in the middle of a run, losing nothing: TrainGuard and RolloutGuard.

:class:`TrainGuard` runs one optimisation step per call. When a step runs out of memory it
leaves the ``except`` block, clears the traceback's frames and the chained exceptions (which
pin the failed attempt's tensors), frees memory, and climbs a ladder: retry once at the same
number of micro-batches, then 2, 4, ... micro-batches up to ``max_splits``, then raise
:class:`memfit.OutOfMemory` with what was tried. The gradient stays the full-batch gradient:

* each micro-batch's mean loss is weighted by its share of the batch's items (or of
  ``count_fn``), so the accumulated gradient equals the full batch's;
* the first micro-batch of a step (the whole batch, in the common case) runs a plain
  ``backward()``, as a bare loop does; if it runs out of memory its partial gradients are
  dropped. Every later micro-batch computes its gradients with ``torch.autograd.grad`` and
  adds them to ``.grad`` in one operation only after its backward succeeded, so an
  out-of-memory in forward *or* backward leaves no partial gradient, and micro-batches that
  already succeeded are kept, not redone (so hooks that run when ``.grad`` is accumulated,
  such as ``register_post_accumulate_grad_hook``, fire for the first micro-batch only;
  tensor hooks fire for all);
* the loss is read (``.item()``) only at the end of the step, after ``optimizer.step()`` is
  queued, so on a GPU the host does not wait for the device in the middle of the step; the
  free-memory check of the snapshot policy reads CUDA's figures at most once a second;
* before ``optimizer.step()`` the parameters and the optimizer state can be copied to host
  memory (into buffers reused from step to step); an out-of-memory inside the step restores
  them before the step is retried (a retry turns ``foreach`` off, which needs fewer
  temporaries), so there is never a partial update. The copy costs memory bandwidth every
  step (a tenth of a small MLP's CPU step; a whole PCIe transfer of the model on a GPU), so
  the default policy, ``snapshot_optimizer="auto"``, takes it only when the step is at
  risk: when some parameter has no optimizer state yet (the step that creates it allocates
  the most), for ``grow_back_after`` steps after any out-of-memory, under
  :func:`memfit.testing.inject_oom`, and when the device's free memory (the simulated GPU's,
  or CUDA's free plus cached) is below twice the parameters' bytes (what a ``foreach`` step
  may need for temporaries). ``"always"`` (or ``True``) takes it every step, ``"never"`` (or
  ``False``) never. An out-of-memory inside a step taken without a snapshot stops the run
  with :class:`memfit.OutOfMemory` saying the parameters may be partly updated. Optimizers
  whose state holds anything but tensors and plain numbers cannot be snapshotted:
  TrainGuard refuses them with a :class:`memfit.ConfigError` (use ``"never"``).

With ``torch.amp.GradScaler`` the gradients are scaled per micro-batch, and unscaled, checked
for infs and the scale updated once per full step. Under DDP the backward passes run under
``model.no_sync()`` and the gradients are averaged with one all-reduce once every micro-batch
on every rank has succeeded; every rank takes the same decision through one small all-reduce
per step (:mod:`memfit.runtime.distributed`). After ``grow_back_after`` clean steps the guard
halves its number of micro-batches again, so a transient spike does not slow a run forever
(a step is clean when it did not have to split further; an out-of-memory that one retry
cured was transient).

:class:`RolloutGuard` does the same for inference and environment stepping: retry, then run
the call in chunks along the environment dimension and concatenate the results.
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import math
import sys
import time
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from memfit.errors import ConfigError, OutOfMemory, require_positive_int
from memfit.runtime import distributed
from memfit.runtime.events import EventSink, MemoryEvent, emit
from memfit.runtime.oom import forget_exception, is_oom

if TYPE_CHECKING:
    import torch

__all__ = ["RolloutGuard", "TrainGuard", "forget_exception", "memory_figures", "split_batch"]

T = TypeVar("T")


# ---------------------------------------------------------------------------------------------
# Freeing memory after an exception
# ---------------------------------------------------------------------------------------------
def memory_figures() -> dict[str, int | None]:
    """Allocated, peak and budget bytes of the device in use, ``None`` where unknown.

    The innermost :func:`memfit.simulate_gpu` when one is active, else the current CUDA
    device when torch has initialised CUDA, else unknown.
    """
    from memfit.runtime.simulate import active

    gpu = active()
    if gpu is not None:
        return {
            "allocated_bytes": gpu.allocated_bytes,
            "peak_bytes": gpu.peak_allocated_bytes,
            "budget_bytes": gpu.budget_bytes,
        }
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        index = torch.cuda.current_device()
        return {
            "allocated_bytes": int(torch.cuda.memory_allocated(index)),
            "peak_bytes": int(torch.cuda.max_memory_allocated(index)),
            "budget_bytes": int(torch.cuda.get_device_properties(index).total_memory),
        }
    return {"allocated_bytes": None, "peak_bytes": None, "budget_bytes": None}


def _free_memory() -> None:
    """Collect young garbage cycles and return cached CUDA blocks (after an out-of-memory).

    The failed attempt's objects are young: a collection of generations 0 and 1 finds any
    cycle among them in microseconds, where a full ``gc.collect()`` can take a quarter of a
    second in a process that has imported torch.
    """
    gc.collect(1)
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def _device_name() -> str | None:
    from memfit.runtime.simulate import active

    gpu = active()
    if gpu is not None:
        return gpu.device.name if gpu.device_kind == "cpu" else gpu.device_kind
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return f"cuda:{torch.cuda.current_device()}"
    return None


def _free_device_bytes() -> int | None:
    """Free bytes of the simulated GPU, or of the CUDA device (free plus cached), or None."""
    from memfit.runtime.simulate import active

    gpu = active()
    if gpu is not None:
        return gpu.free_bytes
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        from memfit.backends.torch_cuda import allocator_counts

        index = torch.cuda.current_device()
        free, _ = torch.cuda.mem_get_info(index)
        counts = allocator_counts(torch, index)
        return int(free) + counts.reserved - counts.allocated
    return None


# ---------------------------------------------------------------------------------------------
# Batch pytrees
# ---------------------------------------------------------------------------------------------
def _is_array(x: Any) -> bool:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return True
    np = sys.modules.get("numpy")
    return np is not None and isinstance(x, np.ndarray)


def _walk(tree: Any, path: str = "batch") -> Iterator[tuple[str, Any]]:
    if _is_array(tree):
        yield path, tree
    elif isinstance(tree, Mapping):  # dict, OrderedDict, UserDict, transformers' BatchEncoding
        for key, value in tree.items():
            yield from _walk(value, f"{path}[{key!r}]")
    elif isinstance(tree, (list, tuple)):
        for i, value in enumerate(tree):
            yield from _walk(value, f"{path}[{i}]")
    elif dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        for f in dataclasses.fields(tree):
            yield from _walk(getattr(tree, f.name), f"{path}.{f.name}")


def _map(tree: Any, fn: Callable[[Any], Any]) -> Any:
    if _is_array(tree):
        return fn(tree)
    if isinstance(tree, Mapping):
        mapped = {k: _map(v, fn) for k, v in tree.items()}
        if type(tree) is dict:
            return mapped
        if isinstance(tree, MutableMapping):
            # A copy keeps the type and its extra state (defaultdict's factory, a
            # BatchEncoding's encodings) that a constructor call would not get.
            copied = copy.copy(tree)
            for k, v in mapped.items():
                copied[k] = v
            return copied
        try:
            return type(tree)(mapped)  # type: ignore[call-arg]
        except TypeError:
            return mapped
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):  # namedtuple
        return type(tree)(*(_map(v, fn) for v in tree))
    if isinstance(tree, (list, tuple)):
        return type(tree)(_map(v, fn) for v in tree)
    if dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        new = copy.copy(tree)
        for f in dataclasses.fields(tree):
            object.__setattr__(new, f.name, _map(getattr(tree, f.name), fn))
        return new
    return tree


def _flat_batch_size(batch: Any, dim: int) -> int | None:
    """:func:`batch_size` of a tensor, or a plain tuple, list or dict of tensors that agree.

    ``None`` for anything else (nested containers, other leaves, sizes that disagree, no
    dimension ``dim``): the general walk then answers, with its error messages. This is the
    shape of most batches, checked every step, so it skips the walk's per-leaf paths.
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    tensor = torch.Tensor
    kind = type(batch)
    if isinstance(batch, tensor):
        leaves: Any = (batch,)
    elif kind is tuple or kind is list:
        leaves = batch
    elif kind is dict:
        leaves = batch.values()
    else:
        return None
    size: int | None = None
    for leaf in leaves:
        if not isinstance(leaf, tensor):
            return None
        if leaf.ndim <= dim:
            continue
        n = int(leaf.shape[dim])
        if size is None:
            size = n
        elif n != size:
            return None
    return size


def batch_size(batch: Any, dim: int = 0) -> int:
    """Size of the batch along ``dim``: the common size of every array leaf.

    Args:
        batch: Tensors (or arrays) in dicts, lists, tuples, namedtuples and dataclasses.
        dim: The dimension to split along.

    Returns:
        The batch size.

    Raises:
        ConfigError: When the batch has no array with that dimension, or two arrays
            disagree on its size (the message names both paths).
    """
    size = _flat_batch_size(batch, dim)
    if size is not None:
        return size
    first = ""
    for path, leaf in _walk(batch):
        if leaf.ndim <= dim:
            continue
        n = int(leaf.shape[dim])
        if size is None:
            size, first = n, path
        elif n != size:
            raise ConfigError(
                f"{path} has {n} items along dim {dim} but {first} has {size}",
                key_path=path,
                hint="every tensor in a batch must share its batch dimension",
            )
    if size is None:
        raise ConfigError(
            f"the batch holds no tensor with a dimension {dim} to split",
            key_path="batch",
            hint="pass tensors (in dicts, lists, tuples or dataclasses) with a batch dimension",
        )
    return size


def split_batch(batch: Any, start: int, stop: int, dim: int = 0) -> Any:
    """Items ``start:stop`` of every array leaf along ``dim`` (views; other leaves as they are).

    >>> import torch
    >>> part = split_batch({"x": torch.arange(6), "k": 3}, 2, 4)
    >>> part["x"].tolist(), part["k"]
    ([2, 3], 3)
    """
    index = (slice(None),) * dim + (slice(start, stop),)

    def cut(leaf: Any) -> Any:
        return leaf[index] if leaf.ndim > dim else leaf

    return _map(batch, cut)


def _chunks(total: int, done: int, splits: int) -> tuple[int, int]:
    """The next micro-batch ``[done, stop)`` when the batch is cut into ``splits`` parts."""
    size = math.ceil(total / splits)
    return done, min(total, done + size)


# ---------------------------------------------------------------------------------------------
# Optimizer snapshot
# ---------------------------------------------------------------------------------------------
_PLAIN = (int, float, bool, complex, str, type(None))


class _OptimizerSnapshot:
    """Parameters and optimizer state copied to host buffers reused from step to step.

    Policy: the copy lives in host memory (pinned when the tensors are on CUDA), so taking it
    never costs device memory; under :func:`memfit.simulate_gpu` it is not counted either.
    The buffers are allocated once and refilled with one ``_foreach_copy_`` per step while
    the set of tensors stays the same (it changes when the optimizer creates its state on
    the first step). Group hyper-parameters are kept by value (a tensor-valued one by
    reference: ``optimizer.step()`` does not change them).
    """

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self._src: list[torch.Tensor] = []
        self._dst: list[torch.Tensor] = []
        self._slots: list[tuple[torch.Tensor, str | None]] = []  # (param, state key or None)
        self._params: list[torch.Tensor] = []
        self._state_keys: dict[int, tuple[str, ...]] = {}
        self._plain: list[tuple[torch.Tensor, str, Any]] = []
        self._groups: list[dict[str, Any]] = []
        self._on_host = True

    def take(self) -> None:
        """Copy parameters, optimizer state and hyper-parameters to host memory.

        Raises:
            ConfigError: When the optimizer state holds a value memfit cannot copy.
        """
        import torch

        opt = self.optimizer
        state = opt.state
        tensor_type = torch.Tensor
        src: list[torch.Tensor] = []
        slots: list[tuple[torch.Tensor, str | None]] = []
        params: list[torch.Tensor] = []
        plain: list[tuple[torch.Tensor, str, Any]] = []
        state_keys: dict[int, tuple[str, ...]] = {}
        for group in opt.param_groups:
            for p in group["params"]:
                params.append(p)
                src.append(p)
                slots.append((p, None))
                st = state.get(p)
                if st is None:
                    continue
                state_keys[id(p)] = tuple(st)
                for key, value in st.items():
                    if isinstance(value, tensor_type):
                        src.append(value)
                        slots.append((p, key))
                    elif isinstance(value, _PLAIN):
                        plain.append((p, key, value))
                    else:
                        raise ConfigError(
                            f"optimizer state {key!r} of {type(opt).__name__} is a "
                            f"{type(value).__name__}, which memfit cannot snapshot",
                            key_path="optimizer",
                            hint="pass snapshot_optimizer='never' to TrainGuard; an "
                            "out-of-memory inside optimizer.step() then stops the run "
                            "with memfit.OutOfMemory instead of retrying",
                        )
        same = len(src) == len(self._src) and all(
            a is b for a, b in zip(src, self._src, strict=True)
        )
        if not same:
            self._dst = self._host_buffers(src)
            self._src = src
            self._slots = slots
            self._on_host = all(not t.is_cuda for t in src)
        self._params = params
        self._plain = plain
        self._state_keys = state_keys
        self._groups = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
        with torch.no_grad():
            if self._on_host:
                torch._foreach_copy_(self._dst, self._src)
            else:
                _copy_all(self._dst, self._src)

    @staticmethod
    def _host_buffers(src: list[torch.Tensor]) -> list[torch.Tensor]:
        import torch

        from memfit.runtime.simulate import active

        gpu = active()
        ctx: AbstractContextManager[None] = gpu.paused() if gpu is not None else nullcontext()
        with ctx:
            return [
                torch.empty(
                    t.shape,
                    dtype=t.dtype,
                    device="cpu",
                    pin_memory=bool(t.is_cuda and torch.cuda.is_available()),
                )
                for t in src
            ]

    def restore(self) -> None:
        """Put parameters, optimizer state and hyper-parameters back as :meth:`take` saw them."""
        import torch

        opt = self.optimizer
        for group, saved in zip(opt.param_groups, self._groups, strict=True):
            group.update(saved)
        for p in self._params:
            keys = self._state_keys.get(id(p))
            if keys is None:
                opt.state.pop(p, None)  # the failed step created it
                continue
            st = opt.state[p]
            for key in [k for k in st if k not in keys]:
                del st[key]
        for p, key, value in self._plain:
            opt.state[p][key] = value
        dst: list[torch.Tensor] = []
        src: list[torch.Tensor] = []
        with torch.no_grad():
            for (p, key), original, buf in zip(self._slots, self._src, self._dst, strict=True):
                if key is None:
                    dst.append(p)
                    src.append(buf)
                    continue
                st = opt.state[p]
                current = st.get(key)
                if current is not original:
                    # The failed step replaced the tensor: put the original object back.
                    st[key] = original
                dst.append(original)
                src.append(buf)
            _copy_all(dst, src)


def _copy_all(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
    """``dst[i].copy_(src[i])`` for all i: one foreach op on one device, else per tensor."""
    import torch

    if not dst:
        return
    if all(d.device == s.device for d, s in zip(dst, src, strict=True)):
        torch._foreach_copy_(dst, src)
        return
    for d, s in zip(dst, src, strict=True):
        d.copy_(s, non_blocking=True)
    if any(t.is_cuda for t in dst) or any(t.is_cuda for t in src):
        torch.cuda.synchronize()


# ---------------------------------------------------------------------------------------------
# TrainGuard
# ---------------------------------------------------------------------------------------------
class TrainGuard:
    """Run optimisation steps that survive out-of-memory without changing the result.

    Args:
        optimizer: The optimizer over the model's parameters.
        loss_fn: ``loss_fn(batch) -> loss``: the *mean* loss over the batch's items (a
            scalar tensor). TrainGuard calls it on the whole batch or on micro-batches.
        model: The module for ``no_sync()`` when it is DDP-wrapped (then the gradients are
            averaged across ranks by TrainGuard, once per step).
        count_fn: ``count_fn(batch) -> number``: what the mean in ``loss_fn`` is over (e.g.
            tokens); default: the batch's size along dim 0.
        max_splits: Most micro-batches per step before giving up.
        scaler: A ``torch.amp.GradScaler``: scale per micro-batch, unscale and update once
            per step.
        on_event: Called with every :class:`~memfit.runtime.events.MemoryEvent`.
        grow_back_after: Clean steps (steps that did not have to split further) after
            which the micro-batch count is halved again.
        snapshot_optimizer: When to copy parameters and optimizer state to host memory
            before ``optimizer.step()`` so an out-of-memory inside it can be undone:
            ``"auto"`` (when the step is at risk, see above), ``"always"``/``True`` or
            ``"never"``/``False``.

    Raises:
        ConfigError: When ``max_splits`` or ``grow_back_after`` is not a positive integer,
            ``optimizer`` is not an optimizer, ``loss_fn`` is not callable, the optimizer
            needs a closure (``LBFGS``), or the DDP model broadcasts buffers in
            forward (a collective whose count would differ between ranks).

    Attributes:
        splits: Micro-batches per step now.
        events: What happened, in order.
        steps: Steps completed.
    """

    source = "TrainGuard"
    #: Seconds between two reads of CUDA's free memory for the ``"auto"`` snapshot policy.
    free_check_seconds = 1.0

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        loss_fn: Callable[[Any], torch.Tensor],
        *,
        model: torch.nn.Module | None = None,
        count_fn: Callable[[Any], float] | None = None,
        max_splits: int = 64,
        scaler: torch.amp.GradScaler | None = None,
        on_event: EventSink | None = None,
        grow_back_after: int = 50,
        snapshot_optimizer: bool | str = "auto",
    ) -> None:
        import torch

        require_positive_int("max_splits", max_splits, hint="use a power of two such as 64")
        require_positive_int("grow_back_after", grow_back_after)
        if not all(hasattr(optimizer, a) for a in ("param_groups", "step", "zero_grad", "state")):
            raise ConfigError(
                f"optimizer must be a torch.optim.Optimizer, not {type(optimizer).__name__}",
                key_path="optimizer",
                hint="TrainGuard(torch.optim.AdamW(model.parameters()), loss_fn)",
            )
        for name, fn in (("loss_fn", loss_fn), ("count_fn", count_fn), ("on_event", on_event)):
            if not callable(fn) and not (name != "loss_fn" and fn is None):
                raise ConfigError(
                    f"{name} must be callable, not {type(fn).__name__}",
                    key_path=name,
                    hint="loss_fn(batch) returns the mean loss over the batch as a tensor"
                    if name == "loss_fn"
                    else None,
                )
        if isinstance(optimizer, torch.optim.LBFGS):
            raise ConfigError(
                "TrainGuard cannot drive LBFGS: its step re-evaluates the loss through a closure",
                key_path="optimizer",
                hint="use a first-order optimizer (SGD, Adam, ...) or guard the closure yourself",
            )
        self._ddp = model is not None and distributed.is_ddp(model)
        if self._ddp and model is not None:
            will_sync = getattr(model, "will_sync_module_buffers", None)
            if callable(will_sync) and will_sync():
                raise ConfigError(
                    "the DDP model broadcasts its buffers in every forward; with micro-batches "
                    "the number of forwards can differ between ranks and they would hang",
                    key_path="model",
                    hint="wrap the model with DistributedDataParallel(..., "
                    "broadcast_buffers=False)",
                )
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.model = model
        self.count_fn = count_fn
        self.max_splits = max_splits
        self.scaler = scaler
        self.on_event = on_event
        self.grow_back_after = grow_back_after
        self.snapshot_optimizer = snapshot_optimizer
        self.splits = 1
        self.steps = 0
        self._params_at_last_step = -1  # parameters the optimizer had after its last step
        self.events: list[MemoryEvent] = []
        self._clean_steps = 0
        if snapshot_optimizer is True:
            policy = "always"
        elif snapshot_optimizer is False:
            policy = "never"
        elif snapshot_optimizer in ("auto", "always", "never"):
            policy = str(snapshot_optimizer)
        else:
            raise ConfigError(
                "snapshot_optimizer must be 'auto', 'always' or 'never', "
                f"not {snapshot_optimizer!r}",
                key_path="snapshot_optimizer",
            )
        self._snapshot_policy: str = policy
        self._snapshot = _OptimizerSnapshot(optimizer) if policy != "never" else None
        self._steps_since_oom: int | None = None
        self._oom_in_step = False
        self._next_free_check = 0.0  # monotonic time of the next read of CUDA's free memory
        self._param_bytes = (-1, 0)  # (parameters counted, their bytes)

    # -- events ------------------------------------------------------------------------------
    def _event(self, kind: str, message: str, **data: Any) -> None:
        if kind == "oom":
            self._oom_in_step = True
            self._steps_since_oom = 0
        figures = memory_figures()
        figures.update(data)
        event = MemoryEvent(
            kind=kind, step=self.steps, source=self.source, message=message, data=figures
        )
        self.events.append(event)
        emit(self.on_event, event)

    def _retrying(self, what: str, fn: Callable[[], Any], attempts: int = 3) -> str | None:
        """Run ``fn`` (idempotent); on out-of-memory free and run it again, ``attempts`` times.

        Returns:
            ``None`` on success, else the last error message.
        """
        message: str | None = None
        for _ in range(attempts):
            message = self._attempt(fn)
            if message is None:
                return None
            self._event(
                "oom", f"out of memory in {what}; trying again", error=message.splitlines()[0]
            )
        return message

    @staticmethod
    def _attempt(fn: Callable[[], Any]) -> str | None:
        """Run ``fn`` once; on out-of-memory, leave the ``except`` block, free, and say why.

        Returns:
            ``None`` on success, else the out-of-memory message (the exception, its frames
            and chained exceptions already released, and cached memory freed).
        """
        try:
            fn()
        except Exception as exc:
            if not is_oom(exc):
                raise
            message = forget_exception(exc)
        else:
            return None
        _free_memory()
        return message

    def _step_optimizer(self) -> None:
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
        else:
            self.optimizer.step()

    # -- pieces of a step --------------------------------------------------------------------
    def _params(self) -> list[torch.nn.Parameter]:
        return [p for g in self.optimizer.param_groups for p in g["params"] if p.requires_grad]

    def _count(self, batch: Any) -> float:
        if self.count_fn is None:
            return float(batch_size(batch))
        count = float(self.count_fn(batch))
        if not math.isfinite(count) or count < 0:
            raise ConfigError(
                f"count_fn returned {count!r}; it must be a finite count >= 0",
                key_path="count_fn",
            )
        return count

    def _micro_step(
        self, chunk: Any, weight: float, params: list[torch.nn.Parameter], first: bool
    ) -> torch.Tensor:
        """Forward and backward of one micro-batch; add its gradient only if all succeeded.

        ``first``: no gradient has been accumulated in this step yet (every ``.grad`` is
        ``None``). Then ``backward()`` writes the gradients directly, in C++, as a bare loop
        does; an out-of-memory in it leaves a partial gradient that the caller drops
        (:meth:`_drop_grads`). Later micro-batches compute theirs with ``autograd.grad`` and
        add them in one operation, so the ones that already succeeded are never touched.

        Returns:
            The micro-batch's weighted loss, a detached tensor (read after the step is
            launched, so the device is not waited for in the middle of the step).
        """
        import torch

        sync: AbstractContextManager[Any] = (
            self.model.no_sync() if self._ddp and self.model is not None else nullcontext()  # type: ignore[operator]
        )
        with sync:
            loss = self.loss_fn(chunk)
            if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                got = (
                    f"a tensor of shape {tuple(loss.shape)}"
                    if isinstance(loss, torch.Tensor)
                    else f"a {type(loss).__name__}"
                )
                raise ConfigError(
                    f"loss_fn must return the mean loss as a one-element tensor, got {got}",
                    key_path="loss_fn",
                    hint="return loss.mean() (a tensor that requires grad), not loss.item() "
                    "or per-item losses",
                )
            if not loss.requires_grad:
                raise ConfigError(
                    "loss_fn returned a tensor that does not require grad, so there is "
                    "no gradient to step with",
                    key_path="loss_fn",
                    hint="compute the loss from the model's output, outside torch.no_grad()",
                )
            objective = loss if weight == 1.0 else loss * weight
            if self.scaler is not None:
                objective = self.scaler.scale(objective)
            if objective.dim():
                objective = objective.reshape(())
            if first:
                # Plain backward(), as a bare loop: restricting it with inputs=params makes
                # the engine walk the graph for them first (about 1% of a 5 ms CPU step).
                objective.backward()  # type: ignore[no-untyped-call]
                return loss.detach() if weight == 1.0 else loss.detach() * weight
            grads = torch.autograd.grad(objective, params, allow_unused=True)
        # Add to the accumulated gradient in one operation (atomic), then fill the empty ones.
        acc_dst: list[torch.Tensor] = []
        acc_src: list[torch.Tensor] = []
        fresh: list[tuple[torch.nn.Parameter, torch.Tensor]] = []
        for p, g in zip(params, grads, strict=True):
            if g is None:
                continue
            if p.grad is None:
                fresh.append((p, g))
            else:
                acc_dst.append(p.grad)
                acc_src.append(g)
        if acc_dst:
            torch._foreach_add_(acc_dst, acc_src)
        for p, g in fresh:
            p.grad = g
        return loss.detach() * weight

    @staticmethod
    def _drop_grads(params: list[torch.nn.Parameter]) -> None:
        """Forget every gradient (a first micro-batch's backward that ran out of memory)."""
        for p in params:
            p.grad = None

    def _zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def _give_up(self, message: str, tried: list[str], smallest: int) -> OutOfMemory:
        self._zero_grad()
        figures = memory_figures()
        self._event("give_up", message, tried=list(tried), splits=self.splits)
        return OutOfMemory(
            f"out of memory at step {self.steps} even after {', '.join(tried) or 'nothing'}: "
            f"{message.splitlines()[0] if message else 'no message'}",
            device=_device_name(),
            peak_bytes=figures["peak_bytes"],
            budget_bytes=figures["budget_bytes"],
            free_bytes=(
                figures["budget_bytes"] - figures["allocated_bytes"]
                if figures["budget_bytes"] is not None and figures["allocated_bytes"] is not None
                else None
            ),
            tried=tried,
            hint=(
                f"a micro-batch of {smallest} item(s) does not fit: shrink the model or the "
                "item (sequence length, image size), use activation checkpointing or lower "
                "precision, raise max_splits, or use a larger GPU (memfit plan tells how much)"
                if smallest
                else "the optimizer step itself does not fit next to the model: use an "
                "optimizer with less state (SGD, Adafactor, 8-bit Adam), foreach=False, "
                "or a larger GPU"
            ),
        )

    def _backward_all(
        self, batch: Any, params: list[torch.nn.Parameter], tried: list[str]
    ) -> tuple[list[torch.Tensor | float], bool, str | None, int]:
        """All micro-batches of a step.

        Returns:
            The micro-batches' weighted losses (a detached tensor for a whole batch, read
            at the end of the step; numbers for micro-batches), whether the batch had to
            be split further, the failure message when the ladder ran out (else ``None``),
            and the size of the micro-batch that failed.
        """
        if self.splits == 1:
            # The common case: the whole batch at once, without walking the batch first.
            message: str | None = None
            try:
                return [self._micro_step(batch, 1.0, params, True)], False, None, 0
            except Exception as exc:
                if not is_oom(exc):
                    raise
                message = forget_exception(exc)
            self._drop_grads(params)
            return self._ladder(batch, params, tried, message)
        return self._ladder(batch, params, tried, None)

    def _ladder(
        self,
        batch: Any,
        params: list[torch.nn.Parameter],
        tried: list[str],
        first_failure: str | None,
    ) -> tuple[list[torch.Tensor | float], bool, str | None, int]:
        """Micro-batches from ``self.splits`` on, climbing the ladder on each out-of-memory.

        ``first_failure`` is the message of a whole-batch attempt that already failed.
        """
        n = batch_size(batch)
        total = self._count(batch)
        splits = max(1, min(self.splits, n))
        first_splits = splits
        done = 0
        losses: list[torch.Tensor | float] = []
        retried = False
        pending = first_failure
        while done < n:
            start, stop = _chunks(n, done, splits)
            whole = start == 0 and stop == n
            message: str | None = pending
            if pending is None:
                try:
                    chunk = batch if whole else split_batch(batch, start, stop)
                    weight = 1.0 if whole else (self._count(chunk) / total if total else 0.0)
                    # Read now (the split path is the slow path anyway), so that only the
                    # gradients of the micro-batches that succeeded stay on the device.
                    losses.append(float(self._micro_step(chunk, weight, params, done == 0)))
                except Exception as exc:
                    if not is_oom(exc):
                        raise
                    message = forget_exception(exc)
                chunk = None
                if message is not None and done == 0:
                    self._drop_grads(params)
            pending = None
            if message is None:
                done = stop
                retried = False  # the next failure gets its own retry first
                continue
            # Out of the except block: the failed attempt's tensors can go now.
            _free_memory()
            self._event(
                "oom",
                f"out of memory in micro-batch [{start}:{stop}) of {n} items",
                splits=splits,
                start=start,
                stop=stop,
                error=message.splitlines()[0],
            )
            if not retried:
                retried = True
                tried.append(f"retry x{splits}")
                self._event("retry", f"retrying with {splits} micro-batch(es)", splits=splits)
            elif splits < self.max_splits and stop - start > 1:
                splits = min(self.max_splits, splits * 2, n)
                tried.append(f"split x{splits}")
                self._event(
                    "split",
                    f"splitting the batch into {splits} micro-batches ({n - done} items left)",
                    splits=splits,
                    done=done,
                )
            else:
                self.splits = splits
                return losses, splits > first_splits, message, stop - start
        self.splits = splits
        return losses, splits > first_splits, None, 0

    def _unscale(self) -> str | None:
        """``scaler.unscale_`` once per full step; retried only where it is atomic."""
        scaler = self.scaler
        if scaler is None:
            return None
        groups = {
            (p.grad.device, p.grad.dtype)
            for g in self.optimizer.param_groups
            for p in g["params"]
            if p.grad is not None
        }

        def unscale() -> None:
            # An out-of-memory before the (single, in-place) unscale op leaves the gradients
            # as they were; forget the scaler's half-done bookkeeping and do it again.
            self._reset_scaler_step()
            scaler.unscale_(self.optimizer)

        return self._retrying("GradScaler.unscale_", unscale, attempts=3 if len(groups) <= 1 else 1)

    def _snapshot_wanted(self) -> bool:
        """Whether this step's ``optimizer.step()`` should be snapshotted (the policy)."""
        if self._snapshot is None:
            return False
        if self._snapshot_policy == "always":
            return True
        state = self.optimizer.state
        n_params = sum(len(group["params"]) for group in self.optimizer.param_groups)
        if n_params != self._params_at_last_step:
            # The first step (or the first after add_param_group) may create optimizer state,
            # the step's biggest allocation. After one step, a parameter still without state
            # belongs to a stateless optimizer (SGD without momentum): no reason to copy.
            for group in self.optimizer.param_groups:
                for p in group["params"]:
                    if not state.get(p):
                        return True
        if self._steps_since_oom is not None and self._steps_since_oom < self.grow_back_after:
            return True
        testing = sys.modules.get("memfit.testing")
        if testing is not None and testing.chaos_active():
            return True
        return self._memory_low(n_params)

    def _memory_low(self, n_params: int) -> bool:
        """Whether free device memory is below twice the parameters' bytes (what a
        ``foreach`` step may need for temporaries).

        The simulated GPU's figure is a Python attribute, read every step. CUDA's costs a
        driver call and an allocator-statistics call (about 25 us on an H100, half a percent
        of a 5 ms step), so it is read at most every :attr:`free_check_seconds` while memory
        is not low, and every step once it is.
        """
        from memfit.runtime.simulate import active

        now = 0.0
        throttled = active() is None
        if throttled:
            torch = sys.modules.get("torch")
            if torch is None or not torch.cuda.is_initialized():
                return False
            now = time.monotonic()
            if now < self._next_free_check:
                return False
        free = _free_device_bytes()
        if free is None:
            return False
        if self._param_bytes[0] != n_params:
            total = sum(
                p.numel() * p.element_size()
                for g in self.optimizer.param_groups
                for p in g["params"]
            )
            self._param_bytes = (n_params, total)
        low = free < 2 * self._param_bytes[1]
        if throttled:
            self._next_free_check = now if low else now + self.free_check_seconds
        return low

    def _optimizer_step(self, tried: list[str]) -> str | None:
        """``optimizer.step()`` (through the scaler), undone and retried on out-of-memory."""
        failure = self._unscale()
        if failure is not None:
            return failure
        snapshot = self._snapshot if self._snapshot_wanted() else None
        if snapshot is not None:
            failure = self._retrying("the optimizer snapshot", snapshot.take)
            if failure is not None:
                return failure
        self.last_step_snapshotted = snapshot is not None
        saved_foreach: list[Any] | None = None
        # Retries are cheap (a copy back from host memory); a step that fails the same way
        # three times is retried without foreach, which needs fewer temporaries.
        attempts = [
            "step",
            "retry step",
            "retry step",
            "step foreach=False",
            "retry step foreach=False",
            "retry step foreach=False",
        ]
        message: str | None = None
        try:
            for attempt in attempts:
                if attempt == "step foreach=False":
                    if not any("foreach" in g for g in self.optimizer.param_groups):
                        break
                    saved_foreach = [g.get("foreach") for g in self.optimizer.param_groups]
                    for g in self.optimizer.param_groups:
                        if "foreach" in g:
                            g["foreach"] = False
                message = self._attempt(self._step_optimizer)
                if message is None:
                    return None
                self._event(
                    "oom", "out of memory inside optimizer.step()", error=message.splitlines()[0]
                )
                if snapshot is None:
                    return message
                failure = self._retrying(
                    "restoring the optimizer snapshot", snapshot.restore, attempts=10
                )
                if failure is not None:
                    raise OutOfMemory(
                        "could not restore the parameters after an out-of-memory inside "
                        f"optimizer.step(): {failure}",
                        device=_device_name(),
                        tried=[*tried, attempt],
                        hint="the model is in an undefined state; reload the last checkpoint",
                    )
                tried.append(attempt)
                self._event(
                    "restore",
                    "parameters and optimizer state restored to their pre-step values",
                    attempt=attempt,
                )
            return message
        finally:
            if saved_foreach is not None:
                for g, value in zip(self.optimizer.param_groups, saved_foreach, strict=True):
                    if "foreach" in g:
                        g["foreach"] = value

    def _reset_scaler_step(self) -> None:
        if self.scaler is None:
            return
        from torch.amp.grad_scaler import _refresh_per_optimizer_state

        self.scaler._per_optimizer_states[id(self.optimizer)] = _refresh_per_optimizer_state()

    # -- one step ------------------------------------------------------------------------------
    def __call__(self, batch: Any) -> float:
        """Run one optimisation step over ``batch``; return the batch's mean loss.

        Reading the loss as a number waits for the device to finish the step (as
        ``loss.item()`` does in a bare loop); :meth:`step` runs the same step and returns
        the loss as a tensor without waiting. Arguments and errors are :meth:`step`'s.

        >>> import torch
        >>> model = torch.nn.Linear(3, 1)
        >>> guard = TrainGuard(
        ...     torch.optim.SGD(model.parameters(), lr=0.1),
        ...     lambda b: torch.nn.functional.mse_loss(model(b[0]), b[1]),
        ... )
        >>> isinstance(guard((torch.ones(4, 3), torch.zeros(4, 1))), float)
        True
        """
        return math.fsum(float(t) for t in self._run(batch))

    def step(self, batch: Any) -> torch.Tensor:
        """Run one optimisation step over ``batch``; return the mean loss as a tensor.

        The same step as calling the guard, without reading the loss to the host: on a GPU
        the host goes on queueing the next step while the device works, as a bare loop
        that does not call ``loss.item()`` does.

        Args:
            batch: Tensors in dicts, lists, tuples, namedtuples or dataclasses, split along
                dim 0 when needed (non-tensor leaves are passed to every micro-batch).

        Returns:
            The batch's mean loss, detached: a 0-dim tensor on the loss's device when the
            batch ran whole, or a float64 CPU tensor when it ran in micro-batches (their
            losses were read as they finished).

        Raises:
            OutOfMemory: When even ``max_splits`` micro-batches (or micro-batches of one
                item) do not fit, or ``optimizer.step()`` runs out of memory and cannot be
                undone; on every rank at once under ``torch.distributed``.
            ConfigError: When the batch has no tensor to split, has 0 items or its tensors
                disagree on their batch size (checked before the step), or ``loss_fn`` does
                not return a one-element tensor that requires grad. Any error that is not an
                out-of-memory propagates with the gradients cleared and the parameters as
                they were.
        """
        import torch

        losses = self._run(batch)
        if len(losses) == 1 and isinstance(losses[0], torch.Tensor):
            return losses[0]
        return torch.tensor(math.fsum(float(t) for t in losses), dtype=torch.float64)

    def _run(self, batch: Any) -> list[torch.Tensor | float]:
        """One step; the micro-batches' weighted losses (see :meth:`_backward_all`)."""
        # Checked before the step, so that a batch the ladder could not split fails at the
        # first step, not at the first out-of-memory hours later.
        if batch_size(batch) == 0:
            raise ConfigError(
                "the batch has 0 items: there is no mean loss to step with",
                key_path="batch",
                hint="skip empty batches (drop_last=True in the DataLoader)",
            )
        params = self._params()
        tried: list[str] = []
        self._oom_in_step = False
        for p in params:  # start from no gradient (cheaper than optimizer.zero_grad here)
            p.grad = None
        splits_before = self.splits
        try:
            losses, split, failure, smallest = self._backward_all(batch, params, tried)
        except BaseException:
            # Not an out-of-memory (loss_fn raised, a bad batch): leave no partial gradient
            # behind for an optimizer.step() the caller might still make.
            self._zero_grad()
            self._reset_scaler_step()
            raise
        decision = distributed.agree(gave_up=failure is not None, splits=self.splits, split=split)
        if decision.gave_up:
            self._reset_scaler_step()
            raise self._give_up(failure or "another rank ran out of memory", tried, smallest)
        self.splits = decision.splits
        if self._ddp:
            distributed.average_gradients(params)
        failure = self._optimizer_step(tried)
        if failure is not None:
            self._reset_scaler_step()
            if distributed.is_distributed():
                # The other ranks are entering the next step's agreement: tell them to stop.
                distributed.agree(gave_up=True, splits=self.splits, split=True)
            if self._snapshot is None:
                what = "it could not be undone (snapshot_optimizer='never')"
            elif not self.last_step_snapshotted:
                what = (
                    "no snapshot was taken (free memory looked sufficient), so the parameters "
                    "may be partly updated; reload the last checkpoint, and use "
                    "snapshot_optimizer='always' if this happens again"
                )
            else:
                what = "restoring and retrying did not help"
            raise self._give_up(
                f"optimizer.step() ran out of memory and {what}: {failure}", tried, 0
            )
        if self.scaler is not None:
            scaler = self.scaler
            update_failure = self._retrying("GradScaler.update", scaler.update)
            if update_failure is not None:
                raise self._give_up(
                    f"GradScaler.update() ran out of memory: {update_failure}", tried, 0
                )
        self._zero_grad()
        self.steps += 1
        self._params_at_last_step = sum(len(g["params"]) for g in self.optimizer.param_groups)
        if decision.split:
            self._steps_since_oom = 0
        elif self._steps_since_oom is not None and not self._oom_in_step:
            self._steps_since_oom += 1
        # A step is clean when it did not have to split further: an out-of-memory that one
        # retry cured was transient and says nothing about the size that fits.
        if decision.split:
            self._clean_steps = 0
        else:
            self._clean_steps += 1
        if self.splits > 1 and self._clean_steps >= self.grow_back_after:
            previous = self.splits
            self.splits = max(1, self.splits // 2)
            self._clean_steps = 0
            self._event(
                "grow_back",
                f"{self.grow_back_after} clean steps: micro-batches {previous} -> {self.splits}",
                splits=self.splits,
                previous=previous,
            )
        elif self.splits != splits_before and not split:
            self._event(
                "split",
                f"following the other ranks: {self.splits} micro-batches",
                splits=self.splits,
            )
        # Read by the caller, last: everything of the step is queued on the device by then,
        # so waiting for the loss costs only the step's tail, not a stall in its middle.
        return losses

    def __repr__(self) -> str:
        return (
            f"TrainGuard(splits={self.splits}, steps={self.steps}, "
            f"events={len(self.events)}, max_splits={self.max_splits})"
        )


# ---------------------------------------------------------------------------------------------
# RolloutGuard
# ---------------------------------------------------------------------------------------------
def _concat(parts: Sequence[Any], dim: int) -> Any:
    """Join the per-chunk results: arrays along ``dim``, containers leaf by leaf."""
    first = parts[0]
    if _is_array(first):
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(first, torch.Tensor):
            if first.ndim <= dim:
                return torch.stack(list(parts)) if first.ndim == 0 else first
            return torch.cat(list(parts), dim=dim)
        import numpy as np

        if first.ndim <= dim:
            return np.stack(list(parts))
        return np.concatenate(list(parts), axis=dim)
    if isinstance(first, Mapping):
        joined = {k: _concat([p[k] for p in parts], dim) for k in first}
        if type(first) is dict or not isinstance(first, MutableMapping):
            return joined
        new = copy.copy(first)
        for k, v in joined.items():
            new[k] = v
        return new
    if isinstance(first, tuple) and hasattr(first, "_fields"):
        return type(first)(*(_concat([p[i] for p in parts], dim) for i in range(len(first))))
    if isinstance(first, (list, tuple)) and all(len(p) == len(first) for p in parts):
        return type(first)(_concat([p[i] for p in parts], dim) for i in range(len(first)))
    if all(p == first for p in parts):
        return first
    return list(parts)


class RolloutGuard(Generic[T]):
    """Guard inference and environment stepping: retry, then run in chunks along the envs.

    Args:
        fn: The call to guard (``policy.select_action``, ``env.step``).
        split_dim: The environment dimension of the array arguments and of the results.
        on_event: Called with every :class:`~memfit.runtime.events.MemoryEvent`.
        max_splits: Most chunks before giving up.
        grow_back_after: Clean calls after which the chunk count is halved again.

    Arguments whose size along ``split_dim`` equals the environment count are cut into
    chunks; other arguments are passed whole to every chunk. Results are concatenated along
    ``split_dim`` (arrays), leaf by leaf (dicts, tuples, lists); equal scalars are kept once,
    different ones are returned as a list.

    Raises:
        ConfigError: When ``max_splits`` or ``grow_back_after`` is not a positive integer,
            ``fn`` is not callable or ``split_dim`` is not an integer >= 0.
    """

    source = "RolloutGuard"

    def __init__(
        self,
        fn: Callable[..., T],
        *,
        split_dim: int = 0,
        on_event: EventSink | None = None,
        max_splits: int = 64,
        grow_back_after: int = 50,
    ) -> None:
        require_positive_int("max_splits", max_splits)
        require_positive_int("grow_back_after", grow_back_after)
        if not callable(fn):
            raise ConfigError(
                f"fn must be callable, not {type(fn).__name__}",
                key_path="fn",
                hint="RolloutGuard(policy.select_action) or RolloutGuard(env.step)",
            )
        if isinstance(split_dim, bool) or not isinstance(split_dim, int) or split_dim < 0:
            raise ConfigError(
                f"split_dim must be an integer >= 0, not {split_dim!r}",
                key_path="split_dim",
                hint="the environment dimension counted from the front, usually 0",
            )
        self.fn = fn
        self.split_dim = split_dim
        self.on_event = on_event
        self.max_splits = max_splits
        self.grow_back_after = grow_back_after
        self.splits = 1
        self.calls = 0
        self.events: list[MemoryEvent] = []
        self._clean_calls = 0

    def _event(self, kind: str, message: str, **data: Any) -> None:
        figures = memory_figures()
        figures.update(data)
        event = MemoryEvent(
            kind=kind, step=self.calls, source=self.source, message=message, data=figures
        )
        self.events.append(event)
        emit(self.on_event, event)

    def _envs(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
        for _, leaf in _walk((list(args), kwargs)):
            if leaf.ndim > self.split_dim:
                return int(leaf.shape[self.split_dim])
        return None

    def _run_chunked(self, args: tuple[Any, ...], kwargs: dict[str, Any], n: int, splits: int) -> T:
        size = math.ceil(n / splits)
        parts: list[Any] = []
        dim = self.split_dim
        for start in range(0, n, size):
            stop = min(n, start + size)
            index = (slice(None),) * dim + (slice(start, stop),)

            def cut(leaf: Any, index: tuple[slice, ...] = index) -> Any:
                if leaf.ndim > dim and int(leaf.shape[dim]) == n:
                    return leaf[index]
                return leaf

            parts.append(self.fn(*_map(list(args), cut), **_map(kwargs, cut)))
        result: T = _concat(parts, dim)
        return result

    def __call__(self, *args: Any, **kwargs: Any) -> T:
        """Call ``fn``; on out-of-memory free, retry, then run it in chunks and join them.

        Raises:
            OutOfMemory: When ``max_splits`` chunks (or chunks of one environment) still
                run out of memory.
        """
        n = self._envs(args, kwargs)
        splits = self.splits if n is not None else 1
        tried: list[str] = []
        retried = False
        first_splits = splits
        while True:
            message: str | None = None
            try:
                if splits == 1 or n is None:
                    result = self.fn(*args, **kwargs)
                else:
                    result = self._run_chunked(args, kwargs, n, splits)
            except Exception as exc:
                if not is_oom(exc):
                    raise
                message = forget_exception(exc)
            if message is None:
                break
            _free_memory()
            self._event(
                "oom",
                "out of memory in the guarded call",
                splits=splits,
                error=message.splitlines()[0],
            )
            if not retried:
                retried = True
                tried.append(f"retry x{splits}")
                self._event("retry", f"retrying with {splits} chunk(s)", splits=splits)
            elif n is not None and splits < min(self.max_splits, n):
                splits = min(self.max_splits, splits * 2, n)
                tried.append(f"split x{splits}")
                self._event(
                    "split", f"running in {splits} chunks of the environments", splits=splits
                )
            else:
                figures = memory_figures()
                self._event("give_up", "out of memory after " + ", ".join(tried), tried=tried)
                raise OutOfMemory(
                    f"out of memory in {getattr(self.fn, '__name__', 'the guarded call')} "
                    f"even after {', '.join(tried)}: {message.splitlines()[0]}",
                    device=_device_name(),
                    peak_bytes=figures["peak_bytes"],
                    budget_bytes=figures["budget_bytes"],
                    tried=tried,
                    hint="fewer environments per call, a smaller observation, or a larger GPU",
                )
        self.calls += 1
        self.splits = splits
        self._clean_calls = 0 if splits > first_splits else self._clean_calls + 1
        if self.splits > 1 and self._clean_calls >= self.grow_back_after:
            previous = self.splits
            self.splits = max(1, self.splits // 2)
            self._clean_calls = 0
            self._event("grow_back", f"chunks {previous} -> {self.splits}", splits=self.splits)
        return result
