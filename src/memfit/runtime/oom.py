"""Is this exception an out-of-memory error?

One function, :func:`is_oom`, decides it for the whole of memfit. It looks at the exception's
type first:

* ``torch.OutOfMemoryError`` (alias ``torch.cuda.OutOfMemoryError``), when torch is already
  imported (memfit never imports a framework just to inspect an error);
* a JAX runtime error (``jax.errors.JaxRuntimeError``, older ``XlaRuntimeError``) whose message
  starts with ``RESOURCE_EXHAUSTED``, when jax is already imported;
* :class:`memfit.OutOfMemory`;
* Python's ``MemoryError`` (the host's allocator failed: NumPy, a Python list, a pinned
  buffer; memfit guards host-side work too, and a smaller chunk needs less host memory).

Then one table of real messages, :data:`OOM_MESSAGES`, for the paths that still raise a plain
``RuntimeError`` (or ``torch.AcceleratorError``): the driver's ``CUDA error: out of memory``,
cuDNN's ``CUDNN_STATUS_NOT_SUPPORTED`` / ``CUDNN_STATUS_ALLOC_FAILED``, ``HIP out of memory``,
``XPU out of memory`` and the CPU allocator's ``DefaultCPUAllocator`` messages. Nothing else
counts: a ``RuntimeError`` that merely mentions memory is not an out-of-memory.
"""

from __future__ import annotations

import gc
import re
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from memfit._checks import require
from memfit.errors import OutOfMemory

__all__ = [
    "OOM_MESSAGES",
    "allocate_retrying",
    "first_line",
    "forget_exception",
    "in_no_alloc_section",
    "is_oom",
    "no_alloc_section",
    "oom_message_kind",
]

#: The one table of out-of-memory messages: (kind, pattern). Each pattern is searched in
#: ``str(exc)`` of a ``RuntimeError`` (or subclass) that is not recognised by its type.
OOM_MESSAGES: tuple[tuple[str, re.Pattern[str]], ...] = (
    # Driver-level failure surfaced by a CUDA call (cudaErrorMemoryAllocation).
    ("cuda-driver", re.compile(r"CUDA error: out of memory")),
    # The caching allocator's message, for code paths that wrap it in a plain RuntimeError.
    ("cuda-allocator", re.compile(r"CUDA out of memory\. Tried to allocate")),
    # cuDNN asks for workspace and fails; NOT_SUPPORTED is what it reports for a failed
    # workspace allocation on large inputs, ALLOC_FAILED for a failed handle or buffer.
    ("cudnn", re.compile(r"CUDNN_STATUS_(?:NOT_SUPPORTED|ALLOC_FAILED)")),
    # ROCm builds.
    ("hip", re.compile(r"HIP out of memory")),
    # Intel GPUs.
    ("xpu", re.compile(r"XPU out of memory")),
    # The CPU allocator (Linux: "can't allocate memory", Windows: "not enough memory").
    (
        "cpu-allocator",
        re.compile(r"DefaultCPUAllocator: (?:can't allocate memory|not enough memory)"),
    ),
)


def _torch_oom_type() -> type[BaseException] | None:
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    oom = getattr(torch, "OutOfMemoryError", None)
    if oom is None:  # torch < 2.1
        oom = getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None)
    return oom if isinstance(oom, type) else None


def _is_jax_resource_exhausted(exc: BaseException) -> bool:
    jax = sys.modules.get("jax")
    if jax is None:
        return False
    types: list[type[BaseException]] = []
    errors = getattr(jax, "errors", None)
    for name in ("JaxRuntimeError", "XlaRuntimeError"):
        candidate = getattr(errors, name, None)
        if isinstance(candidate, type):
            types.append(candidate)
    xla_ext = sys.modules.get("jaxlib.xla_extension")
    candidate = getattr(xla_ext, "XlaRuntimeError", None)
    if isinstance(candidate, type):
        types.append(candidate)
    if not types or not isinstance(exc, tuple(types)):
        return False
    return str(exc).lstrip().startswith("RESOURCE_EXHAUSTED")


def oom_message_kind(message: str) -> str | None:
    """The kind of out-of-memory a message reports, from :data:`OOM_MESSAGES`.

    Args:
        message: An exception's text.

    Returns:
        The table's kind (``"cuda-driver"``, ``"cudnn"``, ...) or ``None`` when no entry
        matches.
    """
    for kind, pattern in OOM_MESSAGES:
        if pattern.search(message):
            return kind
    return None


def is_oom(exc: BaseException) -> bool:
    """Whether ``exc`` reports that a device (or the host) ran out of memory.

    Args:
        exc: Any exception.

    Returns:
        ``True`` for ``torch.OutOfMemoryError``, a JAX ``RESOURCE_EXHAUSTED`` runtime error,
        :class:`memfit.OutOfMemory`, ``MemoryError``, or a ``RuntimeError`` whose message is
        in :data:`OOM_MESSAGES`; ``False`` for everything else.

    >>> is_oom(RuntimeError("CUDA error: out of memory"))
    True
    >>> is_oom(RuntimeError("shape mismatch"))
    False
    """
    require("exc", exc, "exception")
    if isinstance(exc, (OutOfMemory, MemoryError)):
        return True
    torch_oom = _torch_oom_type()
    if torch_oom is not None and isinstance(exc, torch_oom):
        return True
    if _is_jax_resource_exhausted(exc):
        return True
    if not isinstance(exc, RuntimeError):
        return False
    return oom_message_kind(str(exc)) is not None


def forget_exception(exc: BaseException) -> str:
    """Drop everything ``exc`` keeps alive; return its message.

    Clears the local variables of every finished frame in the traceback of ``exc`` and of
    every chained exception (``__context__``, ``__cause__``), then unlinks the tracebacks and
    the chain. Call it inside the ``except`` block, and free memory after leaving the block
    (Python also drops the ``as`` name there).

    Args:
        exc: The caught exception.

    Returns:
        ``str(exc)``, taken before anything is cleared.
    """
    message = str(exc)
    pending: list[BaseException] = [exc]
    seen: set[int] = set()
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if current.__traceback__ is not None:
            traceback.clear_frames(current.__traceback__)
            current.__traceback__ = None
        for linked in (current.__context__, current.__cause__):
            if linked is not None:
                pending.append(linked)
        current.__context__ = None
        current.__cause__ = None
    return message


def first_line(message: str) -> str:
    """The first non-empty line of an error message, or ``"no message"`` (an exception's
    text may be empty, or only line breaks)."""
    for line in message.splitlines():
        if line.strip():
            return line
    return "no message"


T = TypeVar("T")


def allocate_retrying(make: Callable[[], T], attempts: int = 5) -> T:
    """Run a small allocation that no caller would catch an out-of-memory from; on one,
    release it, collect young garbage and try again, ``attempts`` times in all.

    For memfit's own bookkeeping between the guard's attempts (copies of buffers, the
    flags of an agreement before its collective: nothing has been sent yet, so the other
    ranks just wait a little longer).

    Raises:
        Exception: The last out-of-memory when every attempt failed, or any other error.
    """
    for attempt in range(attempts):
        failed = False
        try:
            return make()
        except Exception as exc:
            if not is_oom(exc) or attempt == attempts - 1:
                raise
            forget_exception(exc)
            failed = True
        if failed:
            gc.collect(1)
    raise AssertionError("unreachable")  # pragma: no cover


_SECTION = threading.local()


@contextmanager
def no_alloc_section() -> Iterator[None]:
    """Mark operations that only write into memory that already exists.

    memfit wraps its commit steps in it (copying an averaged gradient back, restoring a
    snapshot into existing tensors): an allocator cannot fail there, so
    :func:`memfit.testing.inject_oom` does not inject errors inside.
    """
    _SECTION.depth = getattr(_SECTION, "depth", 0) + 1
    try:
        yield
    finally:
        _SECTION.depth -= 1


def in_no_alloc_section() -> bool:
    """Whether the current thread is inside :func:`no_alloc_section`."""
    return bool(getattr(_SECTION, "depth", 0))
