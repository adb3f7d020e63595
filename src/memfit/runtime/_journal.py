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
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from memfit.runtime.oom import allocate_retrying, forget_exception, is_oom, no_alloc_section

if TYPE_CHECKING:
    import torch

__all__ = ["DEFAULT_CAP_BYTES", "StepFailed", "StepJournal", "add_note", "chunkable"]

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

    __slots__ = ("dst", "groups", "params", "saved", "src")

    def __init__(self, groups: list[tuple[int, list[Any]]]) -> None:
        self.groups = groups  # (index of the param group, its parameters in this chunk)
        self.params = [p for _, ps in groups for p in ps]
        self.src: list[torch.Tensor] = []
        self.dst: list[torch.Tensor] = []
        self.saved: list[tuple[Any, dict[str, Any] | None]] = []


class StepJournal:
    """Steps an optimizer chunk by chunk, keeping a copy of the chunk being stepped.

    Args:
        optimizer: The optimizer.
        cap_bytes: Bytes of parameters and state a chunk may hold (at least the largest
            parameter's with its state); ignored (one chunk) when the optimizer is not
            :func:`chunkable`.
    """

    def __init__(self, optimizer: Any, cap_bytes: int = DEFAULT_CAP_BYTES) -> None:
        self.optimizer = optimizer
        self.cap_bytes = cap_bytes
        self.chunked = chunkable(optimizer)
        self._key: tuple[Any, ...] | None = None
        self._chunks: list[_Chunk] = []
        self._flat: dict[tuple[Any, Any], torch.Tensor] = {}
        #: Whether the last step's journal still holds the whole step's starting point.
        self.undoable = False
        #: Whether the last step was completed although an error ends it (several chunks).
        self.completed = False
        self._release = False  # give the buffers back after each step (device memory)

    # -- layout ----------------------------------------------------------------------------
    @property
    def held_bytes(self) -> int:
        """Bytes the journal's buffers hold now."""
        return sum(t.numel() * t.element_size() for t in self._flat.values())

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
            torch._foreach_copy_(chunk.dst, chunk.src)

    def _buffers(self, src: list[torch.Tensor]) -> list[torch.Tensor]:
        """Views for ``src`` into flat buffers per device and dtype, shared by the chunks."""
        import torch

        need: dict[tuple[Any, Any], int] = {}
        for t in src:
            k = (t.device, t.dtype)
            need[k] = need.get(k, 0) + _aligned(t)
        from memfit.runtime.simulate import active

        self._release = active() is not None or any(t.is_cuda for t in src)
        for k, n in need.items():
            flat = self._flat.get(k)
            if flat is None or flat.numel() < n:
                self._flat[k] = torch.empty(n, dtype=k[1], device=k[0])
                for other in self._chunks:  # their views pointed into the old buffer
                    other.src, other.dst = [], []
        offsets = dict.fromkeys(need, 0)
        views: list[torch.Tensor] = []
        for t in src:
            k = (t.device, t.dtype)
            start = offsets[k]
            offsets[k] = start + _aligned(t)
            views.append(self._flat[k][start : start + t.numel()].view(t.shape))
        return views

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
            torch._foreach_copy_(chunk.src, chunk.dst)

    def release(self) -> None:
        """After a step (and after the ranks settled it): give the buffers back when they
        take device memory (on CUDA the caching allocator keeps them for the next forward
        and hands them back at the next step), keep them in host memory (allocating them
        anew would cost page faults every step)."""
        if not self._release:
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
                try:
                    self._take(chunk)
                except Exception as exc:  # no memory for the journal: nothing changed yet
                    if not is_oom(exc):
                        raise
                    text = forget_exception(exc)
                    divided = None if index == 0 else self._divided(chunks, index)
                    raise StepFailed(
                        f"no memory for memfit's journal of the step: {text}", divided=divided
                    ) from None
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
                attempt += 1
                if attempt >= CHUNK_ATTEMPTS:
                    divided = None if index == 0 else self._divided(chunks, index)
                    raise StepFailed(message, divided=divided)
                from memfit.runtime._memory import free_memory

                free_memory()
                where = "" if whole else f" (chunk {index + 1} of {len(chunks)})"
                on_retry(message, f"optimizer.step(){where}, attempt {attempt + 1}")
        return None

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
