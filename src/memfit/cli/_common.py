"""What every CLI command shares: consoles, JSON output, errors.

Rules (DESIGN.md): with ``--json`` a command prints exactly one JSON document on stdout and
nothing else there; human output goes through Rich; problems are raised as
:class:`memfit.MemfitError` and printed by :func:`memfit.cli.main.main` as ``Error:`` /
``Hint:`` on stderr with exit status 1.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import math
import re
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any, cast

import typer
from rich.console import Console, ConsoleDimensions
from rich.markup import escape

from memfit.errors import ConfigError, MemfitError

__all__ = [
    "JSON_OPTION",
    "RUNTIME_OPTION",
    "err_console",
    "out_console",
    "plain",
    "print_json",
    "safe",
    "to_jsonable",
    "user_code",
    "write_stdout",
]

#: Width of stdout's text when it is not a terminal (a pipe, a file): wide enough that no
#: table cell is cut; a table is only as wide as its content, so this is a ceiling.
PIPE_WIDTH = 1000


def stdout_closed(exc: BaseException | None = None) -> MemfitError:
    """The error for output that has nowhere to go."""
    reason = f" ({exc})" if exc is not None else ""
    return MemfitError(
        f"cannot write the output: standard output is closed or not writable{reason}",
        hint="give the command a stdout to write to (a terminal, a file, a pipe)",
    )


class GuardedStdout:
    """``sys.stdout`` as it is at each write, written so that nothing leaks out as an
    internal error: a closed or missing stdout (``>&-``) and a failed write (``> /dev/full``)
    are a :class:`~memfit.errors.MemfitError` (``Error:`` / ``Hint:``, exit 1), and a closed
    pipe (``| head``) stays a ``BrokenPipeError``, on which :func:`memfit.cli.main.main`
    exits quietly. Every byte a command writes to stdout goes through it (:func:`write_stdout`,
    :data:`out_console`, :func:`print_json`)."""

    def _stream(self) -> Any:
        out = sys.stdout
        if out is None or getattr(out, "closed", False):
            raise stdout_closed()
        return out

    def write(self, text: str) -> int:
        """Write ``text`` to stdout (see the class)."""
        try:
            return int(self._stream().write(text) or 0)
        except BrokenPipeError:
            raise
        except (OSError, ValueError, AttributeError) as exc:
            raise stdout_closed(exc) from exc

    def flush(self) -> None:
        """Flush stdout (see the class)."""
        try:
            self._stream().flush()
        except BrokenPipeError:
            raise
        except (OSError, ValueError, AttributeError) as exc:
            raise stdout_closed(exc) from exc

    def isatty(self) -> bool:
        """Whether stdout is a terminal (``False`` when it is closed or missing)."""
        try:
            return bool(self._stream().isatty())
        except (MemfitError, OSError, ValueError, AttributeError):
            return False

    def fileno(self) -> int:
        """Stdout's descriptor."""
        return int(self._stream().fileno())

    @property
    def encoding(self) -> str:
        """Stdout's encoding (UTF-8 when it has none)."""
        return str(getattr(sys.stdout, "encoding", None) or "utf-8")

    def __getattr__(self, name: str) -> Any:
        # Anything else is stdout's own (an AttributeError when there is none).
        return getattr(sys.stdout, name)


#: The one way to stdout.
guarded_stdout = GuardedStdout()


def write_stdout(text: str) -> None:
    """Write ``text`` to stdout and flush it (see :class:`GuardedStdout`).

    Raises:
        MemfitError: When stdout is closed, missing or cannot be written.
        BrokenPipeError: When the reader of a pipe went away.
    """
    guarded_stdout.write(text)
    guarded_stdout.flush()


class _StdoutConsole(Console):
    """A Rich console that, when its output is not a terminal, lays text out
    :data:`PIPE_WIDTH` wide instead of 80 (or the width of a terminal on stderr): piped or
    redirected tables keep every word whole (``memfit plan ... --all-gpus | cat``). It writes
    through :data:`guarded_stdout`, and a closed pipe is a ``BrokenPipeError`` for
    :func:`memfit.cli.main.main` (Rich's own handling exits with status 1)."""

    def on_broken_pipe(self) -> None:
        """Leave a closed pipe to ``main``, which exits quietly."""
        self.quiet = True
        raise BrokenPipeError("the reader of standard output went away")

    @property
    def size(self) -> ConsoleDimensions:
        dims = Console.size.fget(self)  # type: ignore[attr-defined]
        if self._width is None and not self.is_terminal:
            return ConsoleDimensions(PIPE_WIDTH, dims.height)
        return dims  # type: ignore[no-any-return]

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        Console.size.fset(self, new_size)  # type: ignore[attr-defined]


#: Rich console for human output on stdout.
out_console: Console = _StdoutConsole(
    file=cast("IO[str]", guarded_stdout), highlight=False, soft_wrap=False
)
#: Rich console for notes and problems on stderr.
err_console = Console(stderr=True, highlight=False, soft_wrap=True)

#: The ``--json`` option every command takes.
JSON_OPTION: bool = typer.Option(
    False, "--json", help="Print machine-readable JSON on stdout and nothing else there."
)

#: The ``--runtime`` option of estimate, plan and fit: the target's software.
RUNTIME_OPTION: str | None = typer.Option(
    None,
    "--runtime",
    help="The target's software, which sizes the CUDA context: KEY=VALUE items joined by "
    "commas, from torch=2.5.1, cuda=12.1, driver=550.54, module_loading=lazy or eager "
    "(e.g. --runtime torch=2.5.1,cuda=12.1; every key optional; default: this machine's "
    "torch and its default module loading).",
)

#: Characters a terminal acts on instead of showing: C0 and C1 controls (ESC starts colour
#: and cursor sequences, BEL rings, CR overwrites the line) and the bidirectional overrides
#: that reorder what follows them; and lone surrogates (from a "\\ud800" escape in a YAML or
#: JSON file), which no terminal encoding can write.
_CONTROL = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)
_CONTROL_KEEP_NEWLINES = re.compile(
    "[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def plain(text: object, *, newlines: bool = False) -> str:
    r"""``str(text)`` with every control character written as an escape (``\x1b``).

    A name, a message or a process command line from a file or a driver is shown as text,
    never acted on by the terminal.

    Args:
        text: What to show.
        newlines: Keep line breaks (for multi-line text such as a shell snippet).

    >>> plain("\x1b[31mred\x07")
    '\\x1b[31mred\\x07'
    """
    pattern = _CONTROL_KEEP_NEWLINES if newlines else _CONTROL
    return pattern.sub(_escaped, str(text))


def safe(text: object, *, newlines: bool = False) -> str:
    r""":func:`plain`, then escaped for Rich markup: any user text inside a Rich string.

    >>> safe("[bold]x")
    '\\[bold]x'
    """
    return escape(plain(text, newlines=newlines))


@contextlib.contextmanager
def user_code(what: str) -> Iterator[None]:
    """Run the user's code (importing and calling a factory) without letting it break the CLI.

    Whatever it prints goes to stderr, so stdout keeps exactly what the command prints (one
    JSON document with ``--json``); a ``sys.exit()`` in it (at import or while it runs)
    becomes a :class:`ConfigError` instead of ending memfit quietly with its status.

    Args:
        what: The code, for the message (``"module:function"``).

    Raises:
        ConfigError: When the code calls ``sys.exit`` (or raises ``SystemExit``).
    """
    try:
        with contextlib.redirect_stdout(_Unclosable(sys.stderr)):
            yield
    except SystemExit as exc:
        raise ConfigError(
            f"{what} called sys.exit({exc.code!r}) while memfit imported or ran it",
            key_path="factory",
            hint="keep the module importable without side effects: put its script part "
            'under `if __name__ == "__main__":`',
        ) from exc
    except (KeyboardInterrupt, GeneratorExit):
        raise
    except BaseException as exc:
        if isinstance(exc, Exception):
            raise
        # A BaseException of the user's own (not an Exception): still the user's code.
        raise ConfigError(
            f"{what} raised {type(exc).__name__}: {exc}",
            key_path="factory",
            hint="the user code raised an exception that is not an Exception subclass; "
            "rerun with --debug for the traceback",
        ) from exc


class _Unclosable:
    """A stream that passes everything through but ``close()`` (user code that closes
    ``sys.stdout`` while memfit sends it to stderr must not take memfit's messages with it)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def close(self) -> None:
        """Do nothing: the stream is memfit's."""

    @property
    def closed(self) -> bool:
        return bool(getattr(self._stream, "closed", False))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def to_jsonable(obj: Any) -> Any:
    """Turn dataclasses, pydantic models, enums, paths and tuples into plain JSON data.

    Non-finite floats become ``None`` (JSON has no NaN), so unknown stays explicit.
    """
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, enum.Enum):
        return to_jsonable(obj.value)
    if isinstance(obj, Path):
        return str(obj)
    to_dict = getattr(obj, "to_dict", None)
    if callable(to_dict):
        return to_jsonable(to_dict())
    model_dump = getattr(obj, "model_dump", None)
    if callable(model_dump):
        return to_jsonable(model_dump(mode="json"))
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in obj]
    raise TypeError(f"cannot turn {type(obj).__name__} into JSON")


def print_json(obj: Any) -> None:
    """Print one JSON document on stdout (indented, keys in their given order).

    Raises:
        MemfitError: When stdout is closed (``memfit ... --json >&-``) or cannot be written
            (a full disk); a closed pipe (``| head``) stays a ``BrokenPipeError``.
    """
    write_stdout(json.dumps(to_jsonable(obj), indent=2) + "\n")
