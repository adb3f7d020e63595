"""Files the CLI reads and writes: never hang, never harm a user's file.

Every command that reads a file the user names goes through :func:`read_input` (``-`` is
standard input where a command allows it); every command that writes one goes through
:class:`Output` (``check()`` early, before the work, then ``write(data)``). The rules:

* only regular files are read or written: a folder, a named pipe (which blocks until a
  writer or reader comes) or a device (``/dev/zero`` never ends) is refused before it is
  opened for reading or writing;
* an existing file is replaced only with ``--force``, and a file the command reads (its
  input) never, not even with ``--force``; the same file under another name (a symbolic or
  hard link, ``./x`` for ``x``) counts as the same file;
* a file is written whole or not at all: the data goes to a temporary file in the same
  folder, flushed to disk, which then takes the target's name in one ``rename``; without
  ``--force`` the rename is a hard link, which fails rather than replace a file created in
  the meantime.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import typer

from memfit._userfiles import (
    MAX_USER_FILE_BYTES,
    decode_user_text,
    file_error,
    file_kind,
    not_a_file_error,
    read_limited,
    read_user_bytes,
)
from memfit.errors import ConfigError

__all__ = [
    "FORCE_OPTION",
    "STDIN",
    "Output",
    "check_append",
    "read_input",
    "read_input_text",
    "same_file",
]

#: The argument that means "read standard input".
STDIN = "-"

#: The ``--force`` option of every command that writes a file.
FORCE_OPTION: bool = typer.Option(
    False, "--force", help="Replace the output file if it exists (never an input file)."
)


def read_input(
    arg: str | Path,
    *,
    what: str,
    hint: str | None = None,
    stdin: bool = False,
    max_bytes: int = MAX_USER_FILE_BYTES,
) -> tuple[bytes, str]:
    """The bytes of a file the user named, and the name to show for it.

    Args:
        arg: The path, or ``-`` for standard input when ``stdin`` is true.
        what: What the file is, for messages (``"the run log"``).
        hint: What to do when it cannot be read.
        stdin: Whether ``-`` means standard input.
        max_bytes: The most bytes read (more is a :class:`ConfigError`).

    Returns:
        ``(data, source)``; ``source`` is the path as given, or ``"<stdin>"``.

    Raises:
        ConfigError: When the file is missing, unreadable, or not a regular file.
    """
    if stdin and str(arg) == STDIN:
        stream = getattr(sys.stdin, "buffer", None)
        if stream is None or getattr(sys.stdin, "closed", False):
            raise ConfigError(
                f"cannot read {what} from standard input: it is closed",
                key_path=STDIN,
                hint="pipe the file in (`memfit ... - < FILE`) or give its path",
            )
        try:
            return read_limited(stream, max_bytes, source="<stdin>", what=what), "<stdin>"
        except (OSError, ValueError) as exc:  # a closed descriptor, a detached buffer
            raise ConfigError(
                f"cannot read {what} from standard input: {exc}",
                key_path=STDIN,
                hint="pipe the file in (`memfit ... - < FILE`) or give its path",
            ) from exc
    return read_user_bytes(arg, what=what, hint=hint, max_bytes=max_bytes), str(arg)


def read_input_text(
    arg: str | Path,
    *,
    what: str,
    hint: str | None = None,
    stdin: bool = False,
    max_bytes: int = MAX_USER_FILE_BYTES,
) -> tuple[str, str]:
    """Like :func:`read_input`, decoded as UTF-8 (a bad byte names its line and column)."""
    data, source = read_input(arg, what=what, hint=hint, stdin=stdin, max_bytes=max_bytes)
    return decode_user_text(data, source=source, what=what, hint=hint), source


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether two paths name the same existing file (links and spellings included)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


@dataclass(frozen=True)
class Output:
    """A file a command writes, checked early and written whole or not at all.

    Attributes:
        path: The output file.
        what: What is written, as it reads after "write" (``"the report"``).
        option: The option that named the file (``"--output"``), for messages.
        force: Whether an existing file may be replaced (``--force``).
        inputs: Files the command reads; none of them is ever replaced.
    """

    path: Path
    what: str
    option: str
    force: bool = False
    inputs: tuple[Path, ...] = ()

    @classmethod
    def named(
        cls,
        path: str | Path,
        *,
        what: str,
        option: str,
        force: bool,
        inputs: Iterable[str | Path | None] = (),
    ) -> Output:
        """The output at ``path``; ``None`` inputs (stdin, no file) are left out.

        Raises:
            ConfigError: When ``path`` ends with a path separator (it names a folder).
        """
        text = str(path)
        if text.endswith(("/", os.sep)) or (os.altsep and text.endswith(os.altsep)):
            raise ConfigError(
                f"cannot write {what} ({option}): {text!r} names a folder (it ends with "
                f"{text[-1]!r})",
                key_path=text,
                hint=f"give a file name, e.g. {option} {text.rstrip('/' + os.sep)}/out.yaml",
            )
        kept = tuple(Path(i) for i in inputs if i is not None)
        return cls(Path(path), what, option, force, kept)

    @property
    def _action(self) -> str:
        return f"write {self.what} ({self.option})"

    def check(self) -> Path:
        """Check that the file may be written, before the command does its work.

        Returns:
            The path.

        Raises:
            ConfigError: When the path is an input of the command, is a folder, a pipe or a
                device, exists and ``force`` is false, or its folder does not exist.
        """
        target = self.path
        action = self._action
        for source in self.inputs:
            if same_file(target, source):
                raise ConfigError(
                    f"cannot {action}: it is the file this command reads",
                    key_path=str(target),
                    hint="write to another file; memfit never replaces its input, even with "
                    "--force",
                )
        if _existing_regular_file(target, action) and not self.force:
            raise ConfigError(
                f"cannot {action}: the file exists",
                key_path=str(target),
                hint=f"add --force to replace it, or give {self.option} another file name",
            )
        parent = target.parent
        if not parent.is_dir():
            raise ConfigError(
                f"cannot {action}: the folder {parent} does not exist",
                key_path=str(target),
                hint="create the folder first, or choose another path",
            )
        return target

    def write(self, data: bytes | str) -> Path:
        """Write the file whole or not at all, keeping the rules of :meth:`check`.

        Args:
            data: What to write (``str`` is written as UTF-8).

        Returns:
            The path written.

        Raises:
            ConfigError: When :meth:`check` refuses the path, or the file cannot be written
                (no space, no permission); the target is then left as it was.
        """
        target = self.check()
        payload = data.encode("utf-8") if isinstance(data, str) else data
        action = self._action
        folder = target.parent
        try:
            fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
        except OSError as exc:
            raise file_error(exc, target, action=action) from exc
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(payload)
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(tmp, _new_file_mode(target))
            # Checked again right before the rename: the target may have appeared meanwhile.
            self.check()
            if self.force:
                os.replace(tmp, target)
            else:
                _link_new(tmp, target, action=action, option=self.option)
        except OSError as exc:
            raise file_error(exc, target, action=action) from exc
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink()
        _sync_folder(folder)
        return target


def _existing_regular_file(target: Path, action: str) -> bool:
    """Whether ``target`` exists (as a regular file); refuse a folder, pipe or device.

    Raises:
        ConfigError: When it exists and is not a regular file, or cannot be looked at.
    """
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise file_error(exc, target, action=action) from exc
    kind = file_kind(mode)
    if kind is not None:
        raise not_a_file_error(target, kind, action=action)
    return True


def check_append(path: str | Path, *, what: str, option: str) -> Path:
    """Check that lines can be appended to ``path`` (a log), before anything else runs.

    Appending never harms what is there, so an existing file is fine; a folder, a pipe (an
    append would wait for a reader) or a device is not, and neither is a missing folder.

    Raises:
        ConfigError: When the path is not a regular file, its folder does not exist, or it
            may not be written.
    """
    target = Path(path)
    action = f"append to {what} ({option})"
    exists = _existing_regular_file(target, action)
    if not exists and not target.parent.is_dir():
        raise ConfigError(
            f"cannot {action}: the folder {target.parent} does not exist",
            key_path=str(target),
            hint="create the folder first, or choose another path",
        )
    if not os.access(target if exists else target.parent, os.W_OK):
        raise ConfigError(
            f"cannot {action}: no permission to write there",
            key_path=str(target),
            hint="choose a path you may write to",
        )
    return target


def _new_file_mode(existing: Path) -> int:
    """The permission bits a plain ``open(..., "w")`` would give: the existing file's, or
    0o666 less the umask."""
    with contextlib.suppress(OSError):
        return os.stat(existing).st_mode & 0o7777
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


def _link_new(tmp: Path, target: Path, *, action: str, option: str) -> None:
    """Give ``tmp`` the name ``target`` without replacing a file that exists by then."""
    try:
        os.link(tmp, target)
    except FileExistsError:
        raise ConfigError(
            f"cannot {action}: the file exists",
            key_path=str(target),
            hint=f"add --force to replace it, or give {option} another file name",
        ) from None
    except OSError:
        # A file system without hard links (FAT, some network shares): the check just made
        # in Output.write is the best there is.
        os.replace(tmp, target)


def _sync_folder(folder: Path) -> None:
    """Flush the folder's entry for the new name to disk, where the system allows it."""
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
    try:
        fd = os.open(folder, flags)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)
