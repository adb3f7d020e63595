"""The default way TrainGuard makes ``optimizer.step()`` exact: a journal of the parameters
being updated.

A fault inside ``optimizer.step()`` (an out-of-memory at one of its allocations, another
error, a ``KeyboardInterrupt``) can strike after the step wrote some parameters or some of
their state (Adam's moments and step counts) and before it wrote the others. The journal
keeps a copy, on the parameters' own device, of the parameters and state the step is about
to write, so such a fault is undone exactly, whatever the update rule:

* Parameters are stepped in *chunks*. A chunk is a run of parameters (in the optimizer's
  order) whose parameters and state together take at most ``max(largest parameter with its
  state, cap_bytes)``; the journal holds one chunk at a time, so its memory is that bound,
  not the model's. A model whose parameters and state fit in ``cap_bytes`` (64 MiB by
  default) is one chunk, stepped by one plain ``optimizer.step()`` call.
* Chunks need an optimizer whose update of one parameter reads nothing of the others: the
  built-in per-parameter optimizers of ``torch.optim`` (SGD, Adam, AdamW, ...) whose step is
  not overridden and that have no step hooks of their own. Each chunk is stepped by the
  optimizer's own ``step()`` with its ``param_groups`` narrowed to the chunk (``foreach``
  resolved as the whole step would resolve it), so the result is bit for bit the whole
  step's. Any other optimizer is always one chunk.
* An out-of-memory in a chunk: the chunk is put back from the journal and stepped again
  (the chunks before it are done and stay done): the step completes exactly.
* Another error or an interrupt in a chunk: the chunk is put back. With one chunk the step
  is then undone as a whole; with several, the remaining chunks are stepped (the failed one
  again first), so the step is completed before the error propagates; only when that fails
  too is the step left divided, and the error's note names which parameters took it.

Where the copy lives: on the parameters' device while that device has room for
it next to the step, else in host memory (pinned when the parameters are on CUDA). At a new
layout (the first steps) and every :data:`PLACE_EVERY` steps the journal compares what the
device has free (:mod:`memfit.backends.live`, the one reader of this process's memory) with
its copy plus the step's own temporaries and any optimizer state the step creates
(:func:`step_headroom`); an out-of-memory inside a chunk
while the copy is on the device moves it to host memory and steps the chunk again, not
counted as a retry. The copy never makes a step that fits without it fail: once moved, it
stays in host memory for the guard's life (each step then costs a copy over the bus).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

from memfit.runtime._memory import free_device_bytes
from memfit.runtime._snapshot import copy_all
from memfit.runtime.oom import (
    allocate_retrying,
    first_line,
    forget_exception,
    is_oom,
    no_alloc_section,
)
from memfit.units import format_bytes

if TYPE_CHECKING:
    import torch

__all__ = [
    "DEFAULT_CAP_BYTES",
    "StepFailed",
    "StepJournal",
    "add_note",
    "chunkable",
    "step_headroom",
]

#: Parameters and state a chunk may hold beyond the largest parameter's own.
DEFAULT_CAP_BYTES = 64 * 2**20

#: Out-of-memory retries of one chunk (the last half with ``foreach=False``) before giving up.
CHUNK_ATTEMPTS = 6

_PER_PARAMETER = (
    "SGD",
    "Adam",
    "AdamW",
    "Adamax",
    "NAdam",
    "RAdam",
    "RMSprop",
    "Adagrad",
    "Adadelta",
    "Rprop",
)


def add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)`` (Python 3.11+; on 3.10 the note is kept in ``__notes__``)."""
    add = getattr(exc, "add_note", None)
    if callable(add):
        add(note)
    else:
        notes = getattr(exc, "__notes__", None)
        if not isinstance(notes, list):
            notes = []
        notes.append(note)
        exc.__notes__ = notes  # type: ignore[attr-defined]


def chunkable(optimizer: Any) -> bool:
    """Whether ``optimizer.step()`` may be run on chunks of the parameters.

    True for the built-in per-parameter optimizers of ``torch.optim`` whose ``step`` is the
    built-in one (not overridden by a subclass) and that have no step hooks of their own
    (they would run once per chunk). Global step hooks
    (``torch.optim.optimizer.register_optimizer_step_pre_hook``) do run once per chunk.
    """
    import torch

    step = inspect.unwrap(type(optimizer).step)
    for name in _PER_PARAMETER:
        cls = getattr(torch.optim, name, None)
        if cls is not None and isinstance(optimizer, cls):
            if step is not inspect.unwrap(cls.step):
                return False
            break
    else:
        return False
    hooks = (
        getattr(optimizer, "_optimizer_step_pre_hooks", None),
        getattr(optimizer, "_optimizer_step_post_hooks", None),
    )
    return not any(hooks)


#: Steps between two readings of the device's free memory for the copy's place (and at
#: every new layout).
PLACE_EVERY = 64

#: Temporaries ``optimizer.step()`` allocates, in bytes of the parameters it steps: measured
#: on ``memfit.simulate_gpu`` for the built-in optimizers of ``torch.optim`` (foreach and
#: for-loop; Rprop's foreach step is the largest, 2.24x; Adam's 1.0x foreach, 1.98x for-loop).
STEP_TEMPORARIES = 3

#: Optimizer state the first step creates, in bytes of the parameters that have none yet
#: (Adam's two moments, Rprop's two buffers; SGD's momentum is one).
NEW_STATE = 2


def step_headroom(param_bytes: int, stateless_bytes: int) -> int:
    """Device memory a chunk's ``optimizer.step()`` may take beyond what is allocated before
    it: its temporaries, and the state it creates for parameters that have none.

    Args:
        param_bytes: Bytes of the chunk's parameters.
        stateless_bytes: Bytes of its parameters that have no optimizer state yet.

    >>> step_headroom(100, 0), step_headroom(100, 100)
    (300, 500)
    """
    return STEP_TEMPORARIES * param_bytes + NEW_STATE * stateless_bytes


def _aligned(t: torch.Tensor) -> int:
    """Elements ``t`` takes in a flat buffer, rounded up to 64 bytes (views that start on a
    cache line copy faster: a one-element step count would misalign all that follow)."""
    per_line = max(1, 64 // t.element_size())
    return -(-t.numel() // per_line) * per_line


class StepFailed(Exception):
    """An out-of-memory that retrying a chunk did not cure (internal: the guard gives up)."""

    def __init__(self, message: str, *, divided: str | None) -> None:
        super().__init__(message)
        self.message = message
        #: ``None`` when the step was undone as a whole, else which parameters took it.
        self.divided = divided


class _Chunk:
    """One run of parameters stepped together, and the journal's copy of them."""

    __slots__ = ("copy_bytes", "dst", "groups", "headroom", "params", "saved", "src")

    def __init__(self, groups: list[tuple[int, list[Any]]]) -> None:
        self.groups = groups  # (index of the param group, its parameters in this chunk)
        self.params = [p for _, ps in groups for p in ps]
        self.src: list[torch.Tensor] = []
        self.dst: list[torch.Tensor] = []
        self.saved: list[tuple[Any, dict[str, Any] | None]] = []
        #: Bytes of its copy (parameters and state as the layout saw them).
        self.copy_bytes = 0
        #: What its step may take beyond that (:func:`step_headroom`).
        self.headroom = 0

    def measure(self, state: Any) -> None:
        """Size the chunk's copy and its step's headroom from its parameters and state."""
        copy = params = stateless = 0
        for p in self.params:
            nbytes = p.numel() * p.element_size()
            params += nbytes
            copy += nbytes
            st = state.get(p)
            if not st:
                stateless += nbytes
                continue
            for v in st.values():
                if hasattr(v, "element_size"):
                    copy += v.numel() * v.element_size()
        self.copy_bytes = copy
        self.headroom = step_headroom(params, stateless)


class StepJournal:
    """Steps an optimizer chunk by chunk, keeping a copy of the chunk being stepped.

    Args:
        optimizer: The optimizer.
        cap_bytes: Bytes of parameters and state a chunk may hold (at least the largest
            parameter's with its state); ignored (one chunk) when the optimizer is not
            :func:`chunkable`.
    """

    def __init__(
        self,
        optimizer: Any,
        cap_bytes: int = DEFAULT_CAP_BYTES,
        on_move: Callable[[str, dict[str, Any]], None] | None = None,
    ) -> None:
        self.optimizer = optimizer
        self.cap_bytes = cap_bytes
        self.chunked = chunkable(optimizer)
        self.on_move = on_move
        self._key: tuple[Any, ...] | None = None
        self._chunks: list[_Chunk] = []
        self._flat: dict[tuple[Any, Any], torch.Tensor] = {}
        #: Whether the last step's journal still holds the whole step's starting point.
        self.undoable = False
        #: Whether the last step was completed although an error ends it (several chunks).
        self.completed = False
        self._release = False  # give the buffers back after each step (device memory)
        #: Whether the copy lives in host memory (the device had no room for it).
        self.on_host = False
        #: Why it moved there (``None`` while it is on the device).
        self.moved_because: str | None = None
        #: Bytes of the last step's copy (its largest chunk's).
        self.copy_bytes = 0
        #: Device memory the copy took in the last step (0 in host memory).
        self.device_bytes = 0
        self._placed_key: tuple[Any, ...] | None = None  # the layout last placed
        self._since_placed = 0

    # -- layout ----------------------------------------------------------------------------
    @property
    def held_bytes(self) -> int:
        """Bytes the journal's buffers hold now (on the device or in host memory)."""
        return sum(t.numel() * t.element_size() for t in self._flat.values())

    def cost(self) -> str:
        """What the copy cost in the last step, for messages."""
        if not self.copy_bytes:
            return "memfit's journal took no copy"
        if self.on_host:
            return (
                f"memfit's journal kept its copy ({format_bytes(self.copy_bytes)}) in host "
                "memory, so the step does not fit without it either"
            )
        return (
            f"memfit's journal held {format_bytes(self.device_bytes)} of device memory "
            "(its copy of the chunk being stepped)"
        )

    @property
    def chunks(self) -> int:
        """Chunks in the last step (1: the journal is a copy of everything)."""
        return len(self._chunks)

    def _layout(self) -> list[_Chunk]:
        opt = self.optimizer
        groups = opt.param_groups
        state = opt.state
        key = (tuple(id(p) for g in groups for p in g["params"]), len(state))
        if key == self._key:
            return self._chunks
        if not self.chunked:
            chunks = [_Chunk([(i, list(g["params"])) for i, g in enumerate(groups)])]
        else:
            sizes: list[tuple[int, Any, int]] = []
            for i, g in enumerate(groups):
                for p in g["params"]:
                    nbytes = p.numel() * p.element_size()
                    for v in (state.get(p) or {}).values():
                        if hasattr(v, "element_size"):
                            nbytes += v.numel() * v.element_size()
                    sizes.append((i, p, nbytes))
            cap = max([self.cap_bytes, *(s for _, _, s in sizes)])
            chunks = []
            current: list[tuple[int, list[Any]]] = []
            used = 0
            for i, p, nbytes in sizes:
                if current and used + nbytes > cap:
                    chunks.append(_Chunk(current))
                    current, used = [], 0
                if current and current[-1][0] == i:
                    current[-1][1].append(p)
                else:
                    current.append((i, [p]))
                used += nbytes
            if current or not chunks:
                chunks.append(_Chunk(current))
        for chunk in chunks:
            chunk.measure(state)
        self._key = key
        self._chunks = chunks
        self._flat = {}
        return chunks

    # -- the journal -------------------------------------------------------------------------
    def _take(self, chunk: _Chunk) -> None:
        """Copy the chunk's parameters and state (tensors by value, the dicts by identity)."""
        import torch

        state = self.optimizer.state
        tensor = torch.Tensor
        src: list[torch.Tensor] = []
        saved: list[tuple[Any, dict[str, Any] | None]] = []
        for p in chunk.params:
            src.append(p)
            st = state.get(p)
            if st is None:
                saved.append((p, None))
                continue
            saved.append((p, dict(st)))
            src.extend(v for v in st.values() if isinstance(v, tensor))
        chunk.saved = saved
        if len(src) != len(chunk.src) or any(
            a is not b for a, b in zip(src, chunk.src, strict=True)
        ):
            chunk.dst = allocate_retrying(lambda: self._buffers(src))
            chunk.src = src
        with torch.no_grad(), no_alloc_section():
            if self.on_host:
                copy_all(chunk.dst, chunk.src)
            else:
                torch._foreach_copy_(chunk.dst, chunk.src)

    def _buffers(self, src: list[torch.Tensor]) -> list[torch.Tensor]:
        """Views for ``src`` into flat buffers per device and dtype, shared by the chunks (in
        host memory when :attr:`on_host`: pinned for CUDA tensors, not counted by a
        simulated GPU)."""
        import torch

        need: dict[tuple[Any, Any], int] = {}
        for t in src:
            k = (t.device, t.dtype)
            need[k] = need.get(k, 0) + _aligned(t)
        from memfit.runtime.simulate import active

        gpu = active()
        self._release = gpu is not None or any(t.is_cuda for t in src)
        for k, n in need.items():
            flat = self._flat.get(k)
            if flat is None or flat.numel() < n:
                self._flat.pop(k, None)  # the old buffer goes before the new one comes
                for other in self._chunks:  # their views pointed into the old buffer
                    other.src, other.dst = [], []
                if self.on_host:
                    pin = bool(k[0].type == "cuda" and torch.cuda.is_available())
                    ctx: AbstractContextManager[Any] = (
                        gpu.paused() if gpu is not None else nullcontext()
                    )
                    with ctx:
                        self._flat[k] = torch.empty(n, dtype=k[1], device="cpu", pin_memory=pin)
                else:
                    self._flat[k] = torch.empty(n, dtype=k[1], device=k[0])
        offsets = dict.fromkeys(need, 0)
        views: list[torch.Tensor] = []
        for t in src:
            k = (t.device, t.dtype)
            start = offsets[k]
            offsets[k] = start + _aligned(t)
            views.append(self._flat[k][start : start + t.numel()].view(t.shape))
        return views

    def _place(self, chunks: list[_Chunk]) -> None:
        """Before a step: keep the copy on the device only when the device has room for it
        next to the step's own needs, else move it to host memory (for good).

        The device is read when the layout is new (the first step, the step after the
        optimizer made its state) and every :data:`PLACE_EVERY` steps after (a read costs
        tens of microseconds on CUDA); between reads an out-of-memory with the copy on the
        device still moves it (:meth:`_advance`). On a CPU run there is no device to share.
        """
        if self.on_host:
            self.device_bytes = 0
            return
        self.device_bytes = self.copy_bytes
        self._since_placed += 1
        if self._placed_key == self._key and self._since_placed < PLACE_EVERY:
            return
        self._placed_key = self._key
        self._since_placed = 0
        from memfit.runtime.simulate import active

        on_device = active() is not None or any(
            p.is_cuda for chunk in chunks for p in chunk.params[:1]
        )
        if not on_device:
            return
        free = free_device_bytes()
        if free is None:
            return  # no device to share (a CPU run): the copy is in host memory anyway
        held = sum(t.numel() * t.element_size() for t in self._flat.values())
        need = max((c.copy_bytes + c.headroom for c in chunks), default=0)
        if free + held >= need:
            return
        self._to_host(
            f"the device had {format_bytes(free + held)} free before optimizer.step(); "
            f"the journal's copy ({format_bytes(self.copy_bytes)}) and the step's own needs "
            f"(up to {format_bytes(need - self.copy_bytes)}) would not fit"
        )

    def _to_host(self, why: str) -> None:
        """Move the copy to host memory from now on (its device buffers are given back)."""
        self.on_host = True
        self.moved_because = why
        self.device_bytes = 0
        self._flat = {}
        for chunk in self._chunks:
            chunk.src, chunk.dst = [], []
        if self.on_move is not None:
            self.on_move(
                f"memfit's journal moved to host memory: {why}; snapshot_optimizer='never' "
                "takes no copy",
                {"journal_bytes": self.copy_bytes},
            )

    def _restore(self, chunk: _Chunk) -> None:
        """Put the chunk's parameters and state back as :meth:`_take` saw them."""
        import torch

        state = self.optimizer.state
        for p, saved in chunk.saved:
            if saved is None:
                state.pop(p, None)  # the failed step created it
            else:
                state[p] = dict(saved)
        with torch.no_grad(), no_alloc_section():
            if self.on_host:
                copy_all(chunk.src, chunk.dst)
            else:
                torch._foreach_copy_(chunk.src, chunk.dst)

    def release(self) -> None:
        """After a step (and after the ranks settled it): give the buffers back when they
        take device memory (on CUDA the caching allocator keeps them for the next forward
        and hands them back at the next step), keep them in host memory (allocating them
        anew would cost page faults every step)."""
        if not self._release or self.on_host:
            return
        self._flat = {}
        self.undoable = False
        for chunk in self._chunks:
            chunk.src, chunk.dst = [], []

    def undo(self) -> bool:
        """Undo the last step as a whole, when the journal still holds its starting point.

        Returns:
            Whether it was undone (one chunk, and nothing stepped since).
        """
        if not self.undoable or len(self._chunks) != 1:
            return False
        self._restore(self._chunks[0])
        self.undoable = False
        return True

    # -- stepping ----------------------------------------------------------------------------
    def run(
        self,
        outer: Callable[[], Any],
        on_retry: Callable[[str, str], None],
    ) -> None:
        """Run ``outer()`` (``optimizer.step()`` or ``scaler.step(optimizer)``) with the
        optimizer's ``step`` replaced by the journalled, chunked step.

        Args:
            outer: What calls ``optimizer.step()``.
            on_retry: ``on_retry(message, what)`` after each out-of-memory that is retried.

        Raises:
            StepFailed: When an out-of-memory persisted through the retries.
            BaseException: Any other error, with a note saying what state it left.
        """
        opt = self.optimizer
        inner = opt.step
        had_own = "step" in vars(opt)
        own = vars(opt).get("step")
        self.undoable = False
        self.completed = False

        def journalled(*args: Any, **kwargs: Any) -> Any:
            return self._step(inner, args, kwargs, on_retry)

        opt.step = journalled
        try:
            outer()
        finally:
            if had_own:
                opt.step = own
            else:
                del opt.step

    def _step(
        self,
        inner: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        on_retry: Callable[[str, str], None],
    ) -> Any:
        chunks = self._layout()
        self.copy_bytes = max((c.copy_bytes for c in chunks), default=0)
        self._place(chunks)
        failed = self._advance(chunks, 0, inner, args, kwargs, on_retry)
        if failed is None:
            self.undoable = len(chunks) == 1
            return None
        index, exc = failed
        if len(chunks) == 1:
            add_note(
                exc,
                "memfit: parameters and optimizer state were restored to their values "
                "before this optimizer.step() (the step was undone as a whole)",
            )
            raise exc
        # Several chunks: the ones before `index` are stepped and cannot be undone, so the
        # step is completed instead (the failed chunk again first), then the error goes on.
        again = self._advance(chunks, index, inner, args, kwargs, on_retry, first_retry=True)
        if again is None:
            self.completed = True
            add_note(
                exc,
                "memfit: this optimizer.step() was completed before the error propagated "
                f"(parameters were stepped in {len(chunks)} chunks; chunk {index + 1} was put "
                "back from memfit's journal and stepped again): parameters and optimizer "
                "state hold the whole step, exactly; the guard did not count it in "
                "guard.steps",
            )
            raise exc
        stop, second = again
        if second is not exc and isinstance(second, Exception):
            forget_exception(second)
        add_note(exc, "memfit: " + self._divided(chunks, stop))
        raise exc

    def _divided(self, chunks: list[_Chunk], stop: int) -> str:
        done = sum(len(c.params) for c in chunks[:stop])
        total = sum(len(c.params) for c in chunks)
        return (
            f"this optimizer.step() is divided: the first {done} of {total} parameters (in "
            "the optimizer's order) took the step, the others were put back to their values "
            "and state before it (every parameter's state matches its values); reload the "
            "last checkpoint, or use snapshot_optimizer='always' to make such steps undoable "
            "as a whole"
        )

    def _advance(
        self,
        chunks: list[_Chunk],
        start: int,
        inner: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        on_retry: Callable[[str, str], None],
        *,
        first_retry: bool = False,
    ) -> tuple[int, BaseException] | None:
        """Step the chunks from ``start`` on; OOMs retried, other errors returned.

        Returns:
            ``None`` when every chunk stepped, else the chunk that failed (already put
            back) and its error.

        Raises:
            StepFailed: An out-of-memory the retries did not cure.
        """
        opt = self.optimizer
        whole = len(chunks) == 1
        originals = opt.param_groups
        foreach = self._foreach(originals) if not whole else []
        for index in range(start, len(chunks)):
            chunk = chunks[index]
            if not (first_retry and index == start):
                self._take_or_move(chunks, index)
            attempt = 0
            while True:
                if not whole:
                    opt.param_groups = [
                        {**originals[i], "params": ps, **foreach[i]} for i, ps in chunk.groups
                    ]
                if attempt >= CHUNK_ATTEMPTS // 2:
                    opt.param_groups = [
                        {**g, "foreach": False} if "foreach" in g else g for g in opt.param_groups
                    ]
                message: str | None = None
                try:
                    inner(*args, **kwargs)
                except BaseException as exc:
                    self._restore(chunk)
                    if not (isinstance(exc, Exception) and is_oom(exc)):
                        return index, exc
                    message = forget_exception(exc)
                finally:
                    opt.param_groups = originals
                if message is None:
                    break
                if not self.on_host and self._release:
                    # The copy may be what did not fit: move it off the device and step
                    # the chunk again (not counted as a retry).
                    from memfit.runtime._memory import free_memory

                    self._to_host(
                        "optimizer.step() ran out of memory with the copy "
                        f"({format_bytes(self.copy_bytes)}) on the device"
                    )
                    free_memory()
                    self._take_or_move(chunks, index)
                    continue
                attempt += 1
                if attempt >= CHUNK_ATTEMPTS:
                    divided = None if index == 0 else self._divided(chunks, index)
                    raise StepFailed(message, divided=divided)
                from memfit.runtime._memory import free_memory

                free_memory()
                where = "" if whole else f" (chunk {index + 1} of {len(chunks)})"
                on_retry(message, f"optimizer.step(){where}, attempt {attempt + 1}")
        return None

    def _take_or_move(self, chunks: list[_Chunk], index: int) -> None:
        """Copy chunk ``index``; with no device memory for the copy, copy it to host memory.

        Raises:
            StepFailed: When not even host memory could take it (nothing changed yet).
        """
        for _ in range(2):
            try:
                self._take(chunks[index])
                return
            except Exception as exc:  # no memory for the journal: nothing changed yet
                if not is_oom(exc):
                    raise
                text = forget_exception(exc)
            if self.on_host:
                break
            from memfit.runtime._memory import free_memory

            self._to_host(f"no device memory for its copy ({first_line(text)})")
            free_memory()
        divided = None if index == 0 else self._divided(chunks, index)
        raise StepFailed(f"no memory for memfit's journal of the step: {text}", divided=divided)

    @staticmethod
    def _foreach(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Each group's ``foreach`` as the whole step would resolve it (a chunk alone might
        resolve it otherwise: the choice looks at every parameter of the group)."""
        from torch.optim.optimizer import _default_to_fused_or_foreach

        resolved: list[dict[str, Any]] = []
        for g in groups:
            if "foreach" in g and g["foreach"] is None and not g.get("fused"):
                params = [p for p in g["params"] if p.grad is not None]
                _, foreach = _default_to_fused_or_foreach(
                    params, bool(g.get("differentiable", False)), use_fused=False
                )
                resolved.append({"foreach": foreach})
            else:
                resolved.append({})
        return resolved
