"""A smaller GPU for real PyTorch code: ``memfit.simulate_gpu(budget)``.

On the CPU (``device="cpu"``, the default) a ``TorchDispatchMode`` watches every operation
run inside the context. Each output whose storage is new (not one of the operation's
inputs' storages, not already counted) is an allocation: its size, rounded as the CUDA
caching allocator rounds blocks (:func:`memfit.allocator.model.round_size`), is taken from a
:class:`~memfit.backends.simulated.SimulatedDevice` of ``budget`` bytes. When the device has
not enough free bytes the operation's outputs are dropped and ``torch.OutOfMemoryError`` is
raised, as the caching allocator would. A storage's bytes are given back when the storage
dies (``weakref.finalize`` on the untyped storage, whose Python object PyTorch keeps alive as
long as the storage), so the count is of live bytes, whether the
storage dies inside the context or after it.

Only storages allocated inside the context count; tensors that existed before (a model built
outside) are not on the simulated device. Operations that run on other threads (a CUDA
backward) are not seen; CPU backward passes run on the calling thread and are seen.

On a CUDA machine ``device="cuda"`` (or ``"cuda:N"``) caps PyTorch's caching allocator with
``torch.cuda.set_per_process_memory_fraction(budget / total)`` and restores the previous
fraction on exit; the figures then come from the caching allocator's counters, read through
:func:`memfit.backends.live.allocator_counts` like every other reading. The cap limits
what the allocator *reserves* from the driver (new segments), not what it hands out of
segments it already holds: a segment that holds a live tensor cannot be returned by
``empty_cache()``, and its free part would be used beyond the budget without a word. So the
context empties the cache and refuses to start (``ConfigError``) while the process still
reserves more than the budget. The CUDA context itself (300-500 MB) is outside the cap, as
it is outside ``max_memory_reserved``.
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from memfit._checks import require, require_count
from memfit.allocator.model import round_size
from memfit.backends.live import allocator_counts, register_simulated, torch_reset_peak
from memfit.backends.simulated import SimulatedDevice
from memfit.errors import ConfigError, OutOfMemory
from memfit.units import format_bytes, parse_bytes

if TYPE_CHECKING:
    import torch

__all__ = ["SimulatedGpu", "active", "cuda_allocator_cap", "raised_by", "simulate_gpu"]

_STACK: list[SimulatedGpu] = []
_STACK_LOCK = threading.Lock()

#: Allocator events a simulated GPU keeps for its snapshot (the oldest go first).
HISTORY_ENTRIES = 100_000

#: Python frames kept per allocation (innermost first).
STACK_DEPTH = 16


class SimulatedGpu:
    """The live state of one :func:`simulate_gpu` context.

    Attributes:
        budget_bytes: Bytes the simulated GPU offers.
        device: The byte counter (:class:`~memfit.backends.simulated.SimulatedDevice`); on
            ``device="cuda"`` it mirrors the budget but the figures come from torch.
        device_kind: ``"cpu"`` (simulated) or the CUDA device string.
    """

    def __init__(self, budget_bytes: int, device_kind: str, history: int = HISTORY_ENTRIES) -> None:
        self.budget_bytes = budget_bytes
        self.device_kind = device_kind
        self.device = SimulatedDevice(budget_bytes, name=f"simulated-{format_bytes(budget_bytes)}")
        self._live: dict[int, tuple[int, weakref.finalize[Any, Any]]] = {}
        self._lock = threading.Lock()
        self._paused = 0
        self.oom_count = 0
        # Allocator history for snapshot(): (action, storage key, bytes, stack index).
        # history=0: none kept (no stack is taken per allocation, no snapshot).
        self._history: deque[tuple[str, int, int, int]] = deque(maxlen=max(history, 1))
        self._keep_history = history > 0
        self._stacks: dict[tuple[tuple[str, int, str], ...], int] = {}
        self._stack_list: list[tuple[tuple[str, int, str], ...]] = []

    # -- figures -----------------------------------------------------------------------
    @property
    def allocated_bytes(self) -> int:
        """Live bytes (rounded) of storages allocated inside the context."""
        if self.device_kind == "cpu":
            return self.device.allocated_bytes
        import torch

        return allocator_counts(torch, self.device_kind).allocated

    @property
    def peak_allocated_bytes(self) -> int:
        """Largest :attr:`allocated_bytes` since entry or the last :meth:`reset_peak`."""
        if self.device_kind == "cpu":
            return self.device.peak_allocated_bytes
        import torch

        return allocator_counts(torch, self.device_kind).peak_allocated

    @property
    def free_bytes(self) -> int:
        """Bytes left under the budget."""
        return self.budget_bytes - self.allocated_bytes

    @property
    def snapshot_history(self) -> int:
        """Allocator events kept for :meth:`snapshot` (0: none, no snapshot)."""
        return self._history.maxlen or 0 if self._keep_history else 0

    @property
    def live_storages(self) -> int:
        """Number of storages counted now (CPU simulation only; 0 on CUDA)."""
        return len(self._live)

    def reset_peak(self) -> None:
        """Start the peak again from the live bytes now."""
        if self.device_kind == "cpu":
            self.device.reset_peak()
            return
        import torch

        torch_reset_peak(torch, self.device_kind)

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Do not count allocations made inside this block (memory that lives off the GPU).

        memfit uses it for host-side snapshots (TrainGuard's optimizer snapshot), which a
        real run keeps in host memory, not on the GPU.
        """
        with self._lock:
            self._paused += 1
        try:
            yield
        finally:
            with self._lock:
                self._paused -= 1

    # -- bookkeeping used by the dispatch mode -------------------------------------------
    def _counting(self) -> bool:
        return self._paused == 0

    def _is_live(self, key: int) -> bool:
        return key in self._live

    def _take(self, items: list[tuple[int, torch.UntypedStorage, int]], op: object) -> None:
        """Count new storages, or raise ``torch.OutOfMemoryError`` if they do not fit."""
        import torch

        total = sum(n for _, _, n in items)
        stack = self._stack()
        try:
            self.device.allocate(total)
        except OutOfMemory:
            self.oom_count += 1
            free = self.device.free_bytes
            with self._lock:
                if self._keep_history:
                    self._history.append(("oom", 0, total, stack))
            error = torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {format_bytes(total)} on memfit's "
                f"simulated GPU (in {op}). The simulated GPU has a total capacity of "
                f"{format_bytes(self.budget_bytes)} of which {format_bytes(free)} is free; "
                f"{format_bytes(self.device.allocated_bytes)} is allocated by tensors created "
                "inside memfit.simulate_gpu."
            )
            # The Recorder's OOM dump may run after the context closed: it finds it here.
            error._memfit_simulated_gpu = weakref.ref(self)  # type: ignore[attr-defined]
            raise error from None
        with self._lock:
            for key, storage, nbytes in items:
                fin = weakref.finalize(storage, self._release, key, nbytes)
                fin.atexit = False
                self._live[key] = (nbytes, fin)
                if self._keep_history:
                    self._history.append(("alloc", key, nbytes, stack))

    def _grow(self, key: int, storage: torch.UntypedStorage, nbytes: int, op: object) -> None:
        """A counted storage was resized in place to ``nbytes`` (rounded)."""
        import torch

        old, fin = self._live[key]
        if nbytes <= old:
            return
        try:
            self.device.allocate(nbytes - old)
        except OutOfMemory:
            self.oom_count += 1
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {format_bytes(nbytes - old)} on "
                f"memfit's simulated GPU (resize in {op}). The simulated GPU has a total "
                f"capacity of {format_bytes(self.budget_bytes)} of which "
                f"{format_bytes(self.device.free_bytes)} is free."
            ) from None
        fin.detach()
        new_fin = weakref.finalize(storage, self._release, key, nbytes)
        new_fin.atexit = False
        stack = self._stack()
        with self._lock:
            self._live[key] = (nbytes, new_fin)
            if self._keep_history:
                self._history.append(("free", key, old, -1))
                self._history.append(("alloc", key, nbytes, stack))

    def _release(self, key: int, nbytes: int) -> None:
        with self._lock:
            entry = self._live.pop(key, None)
            if entry is not None and self._keep_history:
                self._history.append(("free", key, entry[0], -1))
        if entry is not None:
            self.device.release(entry[0])

    def _stack(self) -> int:
        """The caller's Python frames (innermost first), interned; -1 without history."""
        if not self._keep_history:
            return -1
        frame: Any = sys._getframe(2)
        frames: list[tuple[str, int, str]] = []
        while frame is not None and len(frames) < STACK_DEPTH:
            code = frame.f_code
            frames.append((code.co_filename, frame.f_lineno, code.co_name))
            frame = frame.f_back
        key = tuple(frames)
        with self._lock:
            index = self._stacks.get(key)
            if index is None:
                index = self._stacks[key] = len(self._stack_list)
                self._stack_list.append(key)
        return index

    def snapshot(self) -> dict[str, Any] | None:
        """The allocations made inside the context as a CUDA memory snapshot
        (``torch.cuda.memory._snapshot()``'s data, which ``memfit explain`` reads): the
        history replayed through memfit's model of the caching allocator, so segments and
        reserved bytes are the model's; an ``oom`` event marks each failed allocation, with
        the budget less the modelled reserved bytes as the device's free memory. Storages live
        before the kept history (:data:`HISTORY_ENTRIES` events) are live at its start.

        Returns:
            The snapshot's data, or ``None`` when the context keeps no history
            (``simulate_gpu(..., history=0)``).
        """
        from memfit.allocator.snapshot_build import TraceBuilder

        if not self._keep_history:
            return None

        with self._lock:
            history = list(self._history)
            live_now = {key: entry[0] for key, entry in self._live.items()}
            stacks = list(self._stack_list)
        before = dict(live_now)
        for action, key, nbytes, _stack in reversed(history):
            if action == "alloc":
                before.pop(key, None)
            elif action == "free":
                before[key] = nbytes
        # The card's size caps the model as it caps CUDA's allocator: at the limit it gives
        # its cached segments back before it fails, so reserved stays within the card as on
        # a real one. The simulated run counts allocated bytes only: where the model cannot
        # place a request the run did make (split segments), it is placed past the limit
        # (explain's note on simulated snapshots says so).
        builder = TraceBuilder(limit_bytes=self.budget_bytes)

        def place(nbytes: int, frames: tuple[tuple[str, int, str], ...] | None = None) -> int:
            try:
                return builder.malloc(nbytes, frames=frames)
            except OutOfMemory:
                builder.events.pop()  # the run went on: not an out-of-memory error of it
                builder.model.limit_bytes, cap = 1 << 62, builder.model.limit_bytes
                try:
                    return builder.malloc(nbytes, frames=frames)
                finally:
                    builder.model.limit_bytes = cap

        handles = {key: place(nbytes) for key, nbytes in before.items()}
        builder.events.clear()  # those were live when the kept history starts
        for action, key, nbytes, stack in history:
            frames = stacks[stack] if stack >= 0 else None
            if action == "alloc":
                handles[key] = place(nbytes, frames)
            elif action == "free":
                handle = handles.pop(key, None)
                if handle is not None:
                    builder.free(handle)
            else:
                event: dict[str, Any] = {
                    "action": "oom",
                    "addr": 0,
                    "size": nbytes,
                    "stream": 0,
                    "device_free": max(0, self.budget_bytes - builder.model.reserved_bytes),
                }
                if frames:
                    event["frames"] = builder_frames(frames)
                builder.events.append(event)
        data = builder.snapshot()
        data["memfit"] = {
            "format": 1,
            "origin": "memfit.simulate_gpu",
            "budget_bytes": self.budget_bytes,
            "note": "segments and reserved bytes are memfit's allocator model's",
        }
        return data

    def __repr__(self) -> str:
        return (
            f"SimulatedGpu(budget={format_bytes(self.budget_bytes)}, "
            f"allocated={format_bytes(self.allocated_bytes)}, "
            f"peak={format_bytes(self.peak_allocated_bytes)})"
        )


def builder_frames(frames: tuple[tuple[str, int, str], ...]) -> list[dict[str, Any]]:
    """Frames as a snapshot writes them."""
    return [{"filename": f, "line": n, "name": name} for f, n, name in frames]


def raised_by(exc: BaseException | None) -> SimulatedGpu | None:
    """The simulated GPU whose out-of-memory error ``exc`` is, while it is alive."""
    ref = getattr(exc, "_memfit_simulated_gpu", None)
    gpu = ref() if isinstance(ref, weakref.ref) else None
    return gpu if isinstance(gpu, SimulatedGpu) else None


def _tensors(tree: Any, tensor_type: type[torch.Tensor], strided: object) -> Iterator[Any]:
    """Strided tensors in nested tuples, lists and dicts (the shapes of op arguments)."""
    if isinstance(tree, tensor_type):
        if tree.layout is strided:
            yield tree
    elif isinstance(tree, (tuple, list)):
        for item in tree:
            yield from _tensors(item, tensor_type, strided)
    elif isinstance(tree, dict):
        for item in tree.values():
            yield from _tensors(item, tensor_type, strided)


def _make_mode(gpu: SimulatedGpu) -> Any:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    Tensor = torch.Tensor
    strided = torch.strided

    class _CountingMode(TorchDispatchMode):  # type: ignore[no-untyped-call]
        """Counts the storages each operation allocates against the simulated budget."""

        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            kwargs = kwargs or {}
            if not gpu._counting():
                return func(*args, **kwargs)
            inputs = {t.untyped_storage()._cdata for t in _tensors((args, kwargs), Tensor, strided)}
            out = func(*args, **kwargs)
            new: list[tuple[int, torch.UntypedStorage, int]] = []
            seen: set[int] = set()
            for tensor in _tensors(out, Tensor, strided):
                storage = tensor.untyped_storage()
                key = storage._cdata
                if key in seen:
                    continue
                seen.add(key)
                nbytes = round_size(storage.nbytes())
                if gpu._is_live(key):
                    gpu._grow(key, storage, nbytes, func)
                elif key not in inputs:  # else: a view of an input, or an in-place result
                    new.append((key, storage, nbytes))
            if new:
                try:
                    gpu._take(new, func)
                except torch.OutOfMemoryError:
                    # Drop the outputs before the error leaves, so nothing pins them.
                    del out, new, tensor, storage
                    raise
            return out

    return _CountingMode()  # type: ignore[no-untyped-call]


def active() -> SimulatedGpu | None:
    """The innermost active :func:`simulate_gpu` context, or ``None`` outside one."""
    with _STACK_LOCK:
        return _STACK[-1] if _STACK else None


register_simulated(active)  # the live-memory reader finds simulated GPUs through it


def _resolve_budget(budget: int | str) -> int:
    value = parse_bytes(budget)
    if value <= 0:
        raise ConfigError(
            f"a simulated GPU needs a positive budget, not {budget!r}",
            key_path="budget",
            hint="give a size such as 64MiB or 8GiB",
        )
    return value


@contextmanager
def simulate_gpu(
    budget: int | str, device: str = "cpu", *, history: int = HISTORY_ENTRIES
) -> Iterator[SimulatedGpu]:
    """Run PyTorch code as if on a GPU of ``budget`` bytes.

    Args:
        budget: The memory the simulated GPU offers (bytes or a size text, ``"64MiB"``).
        device: ``"cpu"`` to count allocations of CPU tensors made inside the context, or a
            CUDA device (``"cuda"``, ``"cuda:1"``) to cap the real caching allocator.
        history: On the CPU, allocator events kept (with the allocating Python frames) for
            :meth:`SimulatedGpu.snapshot`, which a Recorder's OOM dump writes and
            ``memfit explain`` reads; 0 keeps none (it costs about a fifth of the
            simulation's CPU time on many small operations: ``bench/simulate_history_cost.py``).

    Yields:
        The :class:`SimulatedGpu` with the live figures.

    Raises:
        ConfigError: When the budget is not a positive size, the device is neither ``cpu``
            nor ``cuda[:N]``, the budget is larger than the CUDA device, or (CUDA) the
            process already reserves more than the budget after ``empty_cache()``.
        BackendUnavailable: When ``device`` is CUDA and torch has no CUDA device.

    Inside the context an allocation that does not fit raises ``torch.OutOfMemoryError``.

    >>> import torch
    >>> with simulate_gpu("1MiB") as gpu:
    ...     x = torch.zeros(1000)
    ...     gpu.allocated_bytes
    4096
    """
    require("budget", budget, "size")
    require("device", device, "str")
    budget_bytes = _resolve_budget(budget)
    kind = device.strip().lower()
    if kind == "cpu":
        require_count(
            "history", history, what="a whole number of events", hint="use history=0 to keep none"
        )
        gpu = SimulatedGpu(budget_bytes, "cpu", history)
        mode = _make_mode(gpu)
        with _STACK_LOCK:
            _STACK.append(gpu)
        try:
            with mode:
                yield gpu
        finally:
            with _STACK_LOCK:
                _STACK.remove(gpu)
        return
    if kind == "cuda" or kind.startswith("cuda:"):
        with _cuda_cap(budget_bytes, kind) as gpu:
            yield gpu
        return
    raise ConfigError(
        f"unknown device {device!r} for simulate_gpu",
        key_path="device",
        hint='use "cpu" (simulated) or "cuda" / "cuda:N" (cap the real allocator)',
    )


@contextmanager
def cuda_allocator_cap(index: int, budget_bytes: int) -> Iterator[None]:
    """Cap torch's caching allocator on ``cuda:index`` at ``budget_bytes`` reserved.

    Empties the cache, checks that what the process still reserves is within the budget
    (the cap only limits new segments, see the module docstring), sets
    ``set_per_process_memory_fraction(budget / total)`` and restores the previous fraction
    on exit.

    Raises:
        ConfigError: When the budget is larger than the device, or the process still
            reserves more than the budget after ``empty_cache()``.
    """
    import torch

    total = int(torch.cuda.get_device_properties(index).total_memory)
    if budget_bytes > total:
        raise ConfigError(
            f"budget {format_bytes(budget_bytes)} is more than cuda:{index} "
            f"({format_bytes(total)})",
            key_path="budget",
            hint="give a budget no larger than the GPU",
        )
    previous = float(torch.cuda.get_per_process_memory_fraction(index))
    # Cached blocks would let the process keep more than the budget: give back what can go.
    torch.cuda.empty_cache()
    counts = allocator_counts(torch, index)
    reserved = counts.reserved
    if reserved > budget_bytes:
        allocated = counts.allocated
        raise ConfigError(
            f"this process already reserves {format_bytes(reserved)} on cuda:{index} "
            f"({format_bytes(allocated)} in live tensors), more than the budget "
            f"{format_bytes(budget_bytes)}: the allocator would hand out the free part of "
            "segments it holds without looking at the cap",
            key_path="budget",
            hint="cap the allocator before allocating on the GPU (or free the tensors "
            f"first), or give a budget above {format_bytes(reserved)}",
        )
    torch.cuda.set_per_process_memory_fraction(budget_bytes / total, index)
    try:
        yield
    finally:
        torch.cuda.set_per_process_memory_fraction(previous, index)


@contextmanager
def _cuda_cap(budget_bytes: int, kind: str) -> Iterator[SimulatedGpu]:
    import torch

    from memfit.errors import BackendUnavailable

    if not torch.cuda.is_available():
        raise BackendUnavailable(
            "simulate_gpu(device='cuda') needs a CUDA device and torch sees none",
            hint='use simulate_gpu(budget) (device="cpu") to simulate on the CPU',
        )
    dev = torch.device(kind)
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    with cuda_allocator_cap(index, budget_bytes):
        gpu = SimulatedGpu(budget_bytes, f"cuda:{index}")
        torch_reset_peak(torch, index)
        with _STACK_LOCK:
            _STACK.append(gpu)
        try:
            yield gpu
        finally:
            with _STACK_LOCK:
                _STACK.remove(gpu)
