"""One exception hierarchy for memfit.

Every error memfit raises on purpose is a :class:`MemfitError`. Each carries a short
``message`` (what went wrong) and an optional ``hint`` (what to do about it); the CLI prints
them as ``Error: ...`` and ``Hint: ...`` on stderr and exits 1.

Errors from other libraries are translated at the boundary with ``raise ... from exc`` so the
original cause stays attached for ``--debug``.
"""

from __future__ import annotations

import difflib
import errno
import os
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "BackendUnavailable",
    "ConfigError",
    "EstimateError",
    "InfeasiblePlan",
    "MemfitError",
    "OutOfMemory",
    "decode_user_text",
    "did_you_mean",
    "file_error",
    "file_kind",
    "not_a_file_error",
    "read_user_bytes",
    "read_user_text",
    "require_callable",
    "require_positive_int",
]


class MemfitError(Exception):
    """Base class of every error memfit raises on purpose.

    Args:
        message: What went wrong, in one sentence.
        hint: What the user can do about it, or ``None``.
    """

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def to_dict(self) -> dict[str, Any]:
        """The error as plain data, for ``--json`` output."""
        return {"error": type(self).__name__, "message": self.message, "hint": self.hint}


class ConfigError(MemfitError, ValueError):
    """Bad user input: a size, a workload file, a setting, a knob value.

    Args:
        message: What is wrong.
        key_path: Where it is (``"knobs.num_envs.max"``, ``"PYTORCH_CUDA_ALLOC_CONF"``,
            ``"workload.yaml:12:3"``), or ``None``.
        hint: What to do about it.
    """

    def __init__(
        self, message: str, *, key_path: str | None = None, hint: str | None = None
    ) -> None:
        full = f"{key_path}: {message}" if key_path else message
        super().__init__(full, hint=hint)
        self.key_path = key_path

    def to_dict(self) -> dict[str, Any]:
        data = super().to_dict()
        data["key_path"] = self.key_path
        return data


class InfeasiblePlan(MemfitError):
    """No configuration of the workload fits the budget.

    Args:
        message: What does not fit.
        smallest_bytes: The footprint of the smallest valid configuration.
        budget_bytes: What the GPU leaves for the job.
        binding_term: The memory term (or rule) that breaks the budget.
        hint: What to change.
    """

    def __init__(
        self,
        message: str,
        *,
        smallest_bytes: int | None,
        budget_bytes: int,
        binding_term: str | None,
        hint: str | None = None,
    ) -> None:
        super().__init__(message, hint=hint)
        self.smallest_bytes = smallest_bytes
        self.budget_bytes = budget_bytes
        self.binding_term = binding_term

    def to_dict(self) -> dict[str, Any]:
        data = super().to_dict()
        data.update(
            smallest_bytes=self.smallest_bytes,
            budget_bytes=self.budget_bytes,
            binding_term=self.binding_term,
        )
        return data


class BackendUnavailable(MemfitError):
    """A hardware backend or framework is not there (no driver, no CUDA, package missing)."""


class EstimateError(MemfitError):
    """A step could not be traced or compiled for an estimate (names the op or the cause)."""


class OutOfMemory(MemfitError):
    """Out of memory even after everything memfit may try.

    Args:
        message: What ran out.
        device: The device (``"cuda:0"``, ``"simulated"``), or ``None``.
        requested_bytes: The allocation that failed, if known.
        free_bytes: Free memory on the device when it failed, if known.
        peak_bytes: The peak seen in the failing attempt, if known.
        budget_bytes: The budget in force, if known.
        tried: What was tried, in order (``["retry", "split x2", ...]``).
        hint: What the user can do.
    """

    def __init__(
        self,
        message: str,
        *,
        device: str | None = None,
        requested_bytes: int | None = None,
        free_bytes: int | None = None,
        peak_bytes: int | None = None,
        budget_bytes: int | None = None,
        tried: Sequence[str] = (),
        hint: str | None = None,
    ) -> None:
        super().__init__(message, hint=hint)
        self.device = device
        self.requested_bytes = requested_bytes
        self.free_bytes = free_bytes
        self.peak_bytes = peak_bytes
        self.budget_bytes = budget_bytes
        self.tried = list(tried)

    def to_dict(self) -> dict[str, Any]:
        data = super().to_dict()
        data.update(
            device=self.device,
            requested_bytes=self.requested_bytes,
            free_bytes=self.free_bytes,
            peak_bytes=self.peak_bytes,
            budget_bytes=self.budget_bytes,
            tried=list(self.tried),
        )
        return data


# --------------------------------------------------------------------------------------------
# Hints


def did_you_mean(
    word: str, known: Iterable[str], *, otherwise: str | None = None, cutoff: float = 0.6
) -> str | None:
    """A hint for a misspelt name: ``"did you mean 'num_envs'?"``, else ``otherwise``.

    >>> did_you_mean("num_env", ["batch_size", "num_envs"])
    "did you mean 'num_envs'?"
    >>> did_you_mean("zzz", ["num_envs"], otherwise="known: num_envs")
    'known: num_envs'
    """
    close = difflib.get_close_matches(word, sorted(known), n=1, cutoff=cutoff)
    return f"did you mean {close[0]!r}?" if close else otherwise


# --------------------------------------------------------------------------------------------
# Files the user names: one translation of OS and decoding errors into ConfigError


def _os_reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


def _default_file_hint(exc: OSError, path: Path, writing: bool) -> str:
    if exc.errno == errno.ENOENT:
        if writing:
            return f"the folder {path.parent} does not exist: create it, or choose another path"
        return "check the path (it is relative to the current directory)"
    if exc.errno == errno.EISDIR:
        return "give the path of a file, not of a folder"
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        action = "write to" if writing else "read"
        return f"choose a path you may {action}"
    return "check that the path is right and the folder exists and is writable"


def file_error(
    exc: OSError, path: str | Path, *, action: str, hint: str | None = None
) -> ConfigError:
    """A :class:`ConfigError` for an :class:`OSError` on a file the user named.

    Args:
        exc: The error from ``open``/``read``/``write``.
        path: The file (it becomes the ``key_path``).
        action: What failed, as it reads after "cannot": ``"write the report"``.
        hint: What to do; default: a hint for the kind of error (missing folder, a folder
            instead of a file, no permission).

    >>> err = file_error(FileNotFoundError(2, "No such file or directory"), "out/x.yaml",
    ...                  action="write x.yaml")
    >>> err.message
    'out/x.yaml: cannot write x.yaml: No such file or directory'
    >>> err.hint
    'the folder out does not exist: create it, or choose another path'
    """
    target = Path(path)
    writing = not action.startswith("read")
    return ConfigError(
        f"cannot {action}: {_os_reason(exc)}",
        key_path=str(target),
        hint=hint or _default_file_hint(exc, target, writing),
    )


def file_kind(mode: int) -> str | None:
    """What a file that is not a regular file is (``"a folder"``), or ``None`` for a file.

    Args:
        mode: ``st_mode`` from :func:`os.stat`.

    >>> import stat
    >>> file_kind(stat.S_IFIFO), file_kind(stat.S_IFREG)
    ('a named pipe (FIFO)', None)
    """
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def not_a_file_error(path: str | Path, kind: str, *, action: str) -> ConfigError:
    """A :class:`ConfigError` for a path that names a folder, a pipe or a device.

    memfit reads and writes only regular files: a named pipe with no writer, or a device such
    as ``/dev/zero``, would make it wait (or read) forever.

    Args:
        path: The path (it becomes the ``key_path``).
        kind: What it is (``"a named pipe (FIFO)"``).
        action: What failed, as it reads after "cannot" (``"read the workload file"``).
    """
    hint = (
        "give the path of a file, not of a folder"
        if kind == "a folder"
        else "give the path of a regular file (memfit does not read or write pipes and "
        "devices, which could make it wait forever)"
    )
    return ConfigError(f"cannot {action}: it is {kind}, not a file", key_path=str(path), hint=hint)


#: The largest file memfit reads by default (run logs); smaller caps for smaller formats.
MAX_USER_FILE_BYTES = 256 * 2**20


def too_large_error(source: str | Path, size: int, limit: int, *, what: str) -> ConfigError:
    """The error for an input over its size cap (said in MiB/KiB, with the cap)."""
    from memfit.units import format_bytes

    return ConfigError(
        f"{what} is {format_bytes(size)}{' or more' if size > limit else ''}: more than the "
        f"{format_bytes(limit)} memfit reads from {what}",
        key_path=str(source),
        hint="check that this is the right file; memfit refuses larger inputs rather than "
        "look hung reading them",
    )


def read_limited(handle: Any, limit: int, *, source: str | Path, what: str) -> bytes:
    """Read at most ``limit`` bytes from a binary handle; more is a :class:`ConfigError`."""
    data: bytes = handle.read(limit + 1)
    if len(data) > limit:
        raise too_large_error(source, len(data), limit, what=what)
    return data


def read_user_bytes(
    path: str | Path,
    *,
    what: str = "the file",
    hint: str | None = None,
    max_bytes: int = MAX_USER_FILE_BYTES,
) -> bytes:
    """Read a file the user named, refusing anything that is not a regular file.

    A folder, a named pipe (which would block until a writer comes) and a device file (which
    may never end) are refused before any read; the check is made on the opened file
    (non-blocking open, then ``fstat``), so nothing can be swapped in between.

    Args:
        path: The file.
        what: What the file is, for the message (``"the workload file"``).
        hint: What to do when it cannot be read; default: a hint for the kind of error.
        max_bytes: The most bytes read; a larger file is refused before it is read.

    Returns:
        The file's bytes.

    Raises:
        ConfigError: When the file is missing, unreadable, not a regular file, or larger
            than ``max_bytes``.
    """
    source = Path(path)
    action = f"read {what}"
    try:
        kind = file_kind(os.stat(source).st_mode)
        if kind is not None:
            raise not_a_file_error(source, kind, action=action)
        flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
        fd = os.open(source, flags)
    except OSError as exc:
        raise file_error(exc, source, action=action, hint=hint) from exc
    try:
        info = os.fstat(fd)
        kind = file_kind(info.st_mode)
        if kind is not None:
            raise not_a_file_error(source, kind, action=action)
        if info.st_size > max_bytes:
            raise too_large_error(source, info.st_size, max_bytes, what=what)
        with os.fdopen(fd, "rb", closefd=True) as handle:
            fd = -1
            return read_limited(handle, max_bytes, source=source, what=what)
    except OSError as exc:
        raise file_error(exc, source, action=action, hint=hint) from exc
    finally:
        if fd >= 0:
            os.close(fd)


def decode_user_text(
    data: bytes, *, source: str | Path, what: str = "the file", hint: str | None = None
) -> str:
    """Decode bytes the user gave as UTF-8; a bad byte names its line and column.

    Raises:
        ConfigError: When the bytes are not UTF-8 (``key_path`` is ``SOURCE:LINE:COLUMN``).
    """
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        before = data[: exc.start]
        line = before.count(b"\n") + 1
        column = exc.start - (before.rfind(b"\n") + 1) + 1
        raise ConfigError(
            f"{what} is not UTF-8 text (byte 0x{data[exc.start]:02x}; a binary file, or "
            "text saved in another encoding)",
            key_path=f"{source}:{line}:{column}",
            hint=hint or "save it as UTF-8 text, or check that this is the right file",
        ) from exc


def read_user_text(
    path: str | Path,
    *,
    what: str = "the file",
    hint: str | None = None,
    max_bytes: int = MAX_USER_FILE_BYTES,
) -> str:
    """Read a text file the user named, as UTF-8, with every failure a :class:`ConfigError`.

    A missing file, a folder, a named pipe or a device (refused before reading, see
    :func:`read_user_bytes`), no permission, and bytes that are not UTF-8 (a binary file, a
    file saved as Latin-1) each say what is wrong; a decoding error names the line and column
    of the first bad byte.

    Args:
        path: The file.
        what: What the file is, for the message (``"the workload file"``).
        hint: What to do; default: a hint for the kind of error.
        max_bytes: The most bytes read (see :func:`read_user_bytes`).

    Raises:
        ConfigError: When the file cannot be read, is not a regular file, is larger than
            ``max_bytes``, or is not UTF-8 text (``key_path`` is the file, or
            ``FILE:LINE:COLUMN`` for a bad byte).
    """
    data = read_user_bytes(path, what=what, hint=hint, max_bytes=max_bytes)
    return decode_user_text(data, source=Path(path), what=what, hint=hint)


def require_positive_int(name: str, value: object, *, hint: str | None = None) -> int:
    """Return ``value`` when it is an ``int`` of at least 1 (not a ``bool``).

    Raises:
        ConfigError: Otherwise, with ``name`` as the key path.

    >>> require_positive_int("max_splits", 64)
    64
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(
            f"{name} must be a positive integer, not {value!r}", key_path=name, hint=hint
        )
    return value


def require_callable(
    name: str, value: object, *, hint: str | None = None, optional: bool = False
) -> None:
    """Check that ``value`` can be called (or is ``None`` when ``optional``).

    Raises:
        ConfigError: Otherwise, with ``name`` as the key path.

    >>> require_callable("on_event", None, optional=True)
    >>> require_callable("loss_fn", 3)
    Traceback (most recent call last):
    ...
    memfit.errors.ConfigError: loss_fn: loss_fn must be callable, not int
    """
    if not callable(value) and not (optional and value is None):
        raise ConfigError(
            f"{name} must be callable, not {type(value).__name__}", key_path=name, hint=hint
        )
