"""Files the user names: reading them within a cap, and one translation of OS and decoding
errors into :class:`~memfit.errors.ConfigError` (with the path as the key path and a hint).

Every command and API that reads or writes a user's file goes through here, so a folder, a pipe,
a device, a missing file or an undecodable one gets the same clear answer everywhere.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Any

from memfit.errors import ConfigError
from memfit.units import format_bytes

__all__ = [
    "BOM",
    "MAX_USER_FILE_BYTES",
    "decode_user_text",
    "file_error",
    "file_kind",
    "not_a_file_error",
    "read_limited",
    "read_user_bytes",
    "read_user_text",
    "strip_bom",
    "too_large_error",
]


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
    return ConfigError(
        f"{what} is {format_bytes(size)}{' or more' if size > limit else ''}: more than the "
        f"{format_bytes(limit)} memfit reads from {what}",
        key_path=str(source),
        hint="check that this is the right file; memfit refuses larger inputs rather than "
        "look hung reading them",
    )


#: The most bytes one read asks for: a limit of any size (``max_bytes=2**62``) is never a
#: buffer of that size (a ``MemoryError``) or a length C cannot take (an ``OverflowError``).
_READ_CHUNK = 64 * 2**20


def read_limited(handle: Any, limit: int, *, source: str | Path, what: str) -> bytes:
    """Read at most ``limit`` bytes from a binary handle; more is a :class:`ConfigError`.
    Any ``limit`` may be given: the handle is read in pieces of at most 64 MiB."""
    first: bytes = handle.read(min(limit + 1, _READ_CHUNK))
    if len(first) <= limit and len(first) == min(limit + 1, _READ_CHUNK):
        pieces = [first]
        total = len(first)
        while total <= limit:
            piece: bytes = handle.read(min(limit + 1 - total, _READ_CHUNK))
            if not piece:
                break
            pieces.append(piece)
            total += len(piece)
        first = b"".join(pieces)
    if len(first) > limit:
        raise too_large_error(source, len(first), limit, what=what)
    return first


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

    One byte-order mark at the start (editors on Windows write it) is dropped; a second one
    after it is refused: no editor writes two, and the second would be read as part of the
    text (an invisible character in the first key).

    Raises:
        ConfigError: When the bytes are not UTF-8 (``key_path`` is ``SOURCE:LINE:COLUMN``),
            or start with two byte-order marks.
    """
    try:
        text = data.decode("utf-8")
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
    return strip_bom(text, source=source, what=what)


def strip_bom(text: str, *, source: str | Path, what: str = "the file") -> str:
    """``text`` without the one byte-order mark it may start with.

    Raises:
        ConfigError: When it starts with two (the second would be read as part of the text).
    """
    if not text.startswith(BOM):
        return text
    text = text[1:]
    if text.startswith(BOM):
        raise ConfigError(
            f"{what} starts with two byte-order marks (U+FEFF); the second would be read "
            "as part of the text",
            key_path=f"{source}:1:1",
            hint="save it again as UTF-8 (with one byte-order mark or none)",
        )
    return text


#: The byte-order mark (U+FEFF) as text.
BOM = "\ufeff"


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
