"""The ``memfit`` command: one Typer app, one module per command.

Each module in :data:`COMMAND_MODULES` defines ``register(app: typer.Typer) -> None`` and adds
its command(s). :func:`main` runs the app and turns problems into the CLI contract:

* a :class:`memfit.MemfitError` -> ``Error: ...`` / ``Hint: ...`` on stderr, exit 1;
* a usage error (unknown option, missing argument) -> click's usage message, exit 2;
* anything else -> ``Error: internal error`` with a hint to rerun with ``--debug`` (which shows
  the traceback), exit 1. A user's mistake never prints a traceback.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

from memfit._version import __version__
from memfit.errors import MemfitError

__all__ = ["COMMANDS", "COMMAND_MODULES", "app", "main", "run"]


def _click_exception_types() -> tuple[
    tuple[type[Exception], ...],
    tuple[type[Exception], ...],
    tuple[type[Exception], ...],
    tuple[type[Exception], ...],
]:
    """Click's UsageError, Abort, Exit and ClickException classes.

    Typer >= 0.29 bundles its own copy of click (``typer._click``) whose exceptions are not
    the installed click's; older Typer raises the installed click's. Catch Typer's copy where
    there is one (importing the installed click too costs ``memfit --help`` 10 ms), else
    click's.
    """
    modules: list[Any] = []
    for name in ("typer._click.exceptions", "click.exceptions"):
        try:
            modules.append(importlib.import_module(name))
        except ImportError:
            continue
        break  # Typer's own copy is the one it raises: the installed click is not imported

    def collect(attr: str) -> tuple[type[Exception], ...]:
        return tuple(getattr(m, attr) for m in modules if hasattr(m, attr))

    return collect("UsageError"), collect("Abort"), collect("Exit"), collect("ClickException")


_USAGE_ERRORS, _ABORTS, _EXITS, _CLICK_ERRORS = _click_exception_types()

#: Every command: name -> (module under ``memfit.cli`` that registers it, its one-line help),
#: in the order ``--help`` lists them: the order of the work (plan before the run, settle
#: the knobs, set the allocator up, watch the run, look back at it). ``memfit --help``
#: lists this table without importing a command's module; a command's module is imported
#: when the command runs (or shows its own help). Adding a command is one line here plus
#: ``register(app)`` in its module; a test checks that each line's help is the first line
#: of the command's own.
COMMANDS: dict[str, tuple[str, str]] = {
    # name: (module, help)
    "plan": ("plan", "Fit a workload to a GPU: the biggest knob values that fit and keep every "
             "rule."),
    "check": ("plan", "Check knob values against the workload's rules; exit 1 when one is broken."),
    "examples": ("plan", "List the workloads bundled with memfit."),
    "show": ("show", "Print a bundled workload's YAML (with its variants) to copy and edit."),
    "estimate": ("estimate", "Predict the peak GPU memory of a real PyTorch or JAX step, "
                 "without a GPU."),
    "fit": ("fit", "Find the largest batch (knob value) that fits, confirmed on the device in a "
            "few probes."),
    "gpus": ("gpus", "List the known GPUs and the memory their driver reports, or show one."),
    "env": ("env", "Recommend PyTorch/JAX allocator settings and validate the ones already set."),
    "devices": ("devices", "Show each GPU's memory and processes (NVML, else torch); no GPU "
                "is not an error."),
    "watch": ("watch", "Live view of GPU memory per device and per process (like `watch "
              "nvidia-smi`)."),
    "report": ("report", "Summarise a recorded run; draw it to a PNG or a self-contained HTML "
               "page."),
    "explain": ("explain", "Explain a CUDA memory snapshot: peaks, where the memory went, what "
                "would help."),
    "simulator": ("simulator", "Show the simulator figures a plan uses on a card; fit and store "
                  "your own from readings."),
}  # fmt: skip

#: Modules under ``memfit.cli`` that register commands (from :data:`COMMANDS`).
COMMAND_MODULES: tuple[str, ...] = tuple(dict.fromkeys(m for m, _ in COMMANDS.values()))


def unwrap_help(text: str | None) -> str | None:
    """A command's help with each paragraph on one line: Typer keeps a docstring's single
    line breaks after the first paragraph, and Rich then wraps each source line on its own
    (``memfit check --help`` broke "the workload's" from "search space"); paragraphs stay
    apart, and a paragraph that starts with ``\\b`` (click's "keep my lines") is kept."""
    if not text:
        return text
    import inspect

    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(
        p if p.startswith("\b") else " ".join(line.strip() for line in p.splitlines())
        for p in paragraphs
    )


class _Pending(TyperCommand):
    """A command whose module is not imported yet: its name and help, for listings."""


class _LazyGroup(TyperGroup):
    """The root group: lists :data:`COMMANDS` without importing them, imports a command's
    module when the command is resolved to run, and writes its own help as plain text."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name, (_module, text) in COMMANDS.items():
            if name not in self.commands:
                self.commands[name] = _Pending(name=name, help=text, callback=None)

    def load(self, name: str) -> None:
        """Import the module of command ``name`` and put its commands in place."""
        if not isinstance(self.commands.get(name), _Pending):
            return
        module = importlib.import_module(f"memfit.cli.{COMMANDS[name][0]}")
        holder = typer.Typer()
        module.register(holder)
        for info in holder.registered_commands:
            command = typer.main.get_command_from_info(
                info, pretty_exceptions_short=True, rich_markup_mode=self.rich_markup_mode
            )
            _flags_take_no_value(command)
            command.help = unwrap_help(command.help)
            self.commands[command.name or ""] = command

    def resolve_command(self, ctx: Any, args: list[str]) -> tuple[str | None, Any, list[str]]:
        if args and args[0] in COMMANDS:
            self.load(args[0])
        return super().resolve_command(ctx, args)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        formatter.write(_root_help(self, ctx))


def _root_help(group: TyperGroup, ctx: Any) -> str:
    """``memfit --help``: usage, the root options and the command table, laid out as Typer
    lays them out, from :data:`COMMANDS` alone, as plain text (Rich's renderer and Typer's
    help module cost more to import than the whole help is worth)."""
    import shutil
    import textwrap

    width = max(40, shutil.get_terminal_size(fallback=(80, 24)).columns)
    boxed = "╭─╮│╰╯"
    encoding = getattr(sys.stdout, "encoding", None) or "ascii"
    try:
        boxed.encode(encoding)
    except (UnicodeEncodeError, LookupError):
        boxed = "+-+|++"
    tl, dash, tr, bar, bl, br = (boxed[i] for i in range(6))

    def panel(title: str, rows: list[tuple[str, str, str]]) -> list[str]:
        first = max(len(r[0]) for r in rows)
        second = max(len(r[1]) for r in rows)
        lead = first + 2 + (second + 2 if second else 0)
        inner = width - 4
        out = [f"{tl}{dash} {title} " + dash * max(0, width - len(title) - 5) + tr]
        for name, short, text in rows:
            pieces = textwrap.wrap(text, max(10, inner - lead)) or [""]
            for i, piece in enumerate(pieces):
                left = name.ljust(first) + "  " + (short.ljust(second) + "  " if second else "")
                line = (left if i == 0 else " " * lead) + piece
                out.append(f"{bar} {line.ljust(inner)} {bar}")
        out.append(bl + dash * (width - 2) + br)
        return out

    options: list[tuple[str, str, str]] = []
    for param in group.get_params(ctx):
        opts = list(getattr(param, "opts", []))
        long = ", ".join(o for o in opts if o.startswith("--"))
        short = ", ".join(o for o in opts if not o.startswith("--"))
        options.append((long, short, getattr(param, "help", "") or ""))
    commands = [(name, "", text) for name, (_m, text) in COMMANDS.items()]
    commands += [
        (name, "", command.get_short_help_str(limit=200))
        for name, command in group.commands.items()
        if name not in COMMANDS and not command.hidden
    ]
    lines = ["", f" Usage: {ctx.command_path} [OPTIONS] COMMAND [ARGS]...", ""]
    lines += [" " + x for x in textwrap.wrap(group.help or "", width - 2)]
    lines += ["", *panel("Options", options), *panel("Commands", commands)]
    return "\n".join(lines) + "\n"


app = typer.Typer(
    name="memfit",
    cls=_LazyGroup,
    help="Keep ML and RL jobs inside the memory of their GPU: plan, estimate, guard, watch.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

_state: dict[str, bool] = {"debug": False}


def _version_callback(value: bool) -> None:
    if value:
        from memfit.cli._common import write_stdout

        write_stdout(f"memfit {__version__}\n")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(
        False,
        "--version",
        callback=_version_callback,
        is_eager=True,
        help="Print the version and exit.",
    ),
    debug: bool = typer.Option(
        False, "--debug", help="Show the full traceback when something fails."
    ),
) -> None:
    """Keep ML and RL jobs inside the memory of their GPU: plan, estimate, guard, watch."""
    _state["debug"] = debug or bool(os.environ.get("MEMFIT_DEBUG"))


def _err(text: str) -> None:
    """Print Rich markup on stderr (imported here: a command that succeeds never needs it)."""
    from memfit.cli._common import err_console

    err_console.print(text)


def _wants_json(argv: Sequence[str]) -> bool:
    return "--json" in argv


def _report(exc: MemfitError, argv: Sequence[str]) -> None:
    from memfit.cli._common import err_console, print_json, safe

    if _wants_json(argv):
        with contextlib.suppress(MemfitError, OSError, ValueError):
            print_json(exc.to_dict())  # stdout may be what failed: stderr still says it
    err_console.print(f"[bold red]Error:[/] {safe(_shortened(exc.message), newlines=True)}")
    command = next((a for a in argv if not a.startswith("-")), None)
    fallback = f"memfit {command[:40]} --help" if command else "memfit --help"
    hint = exc.hint or f"see `{fallback}`; rerun with --debug for the details"
    err_console.print(f"[bold]Hint:[/] {safe(_shortened(hint), newlines=True)}")


def _shortened(text: str, limit: int = 800) -> str:
    """A message of at most ``limit`` characters: a value a user pasted (5,000 digits, a name
    of 5,000 letters) is shown by its ends (``--json`` keeps the whole message)."""
    if len(text) <= limit:
        return text
    half = (limit - 40) // 2
    return f"{text[:half]} ...({len(text) - 2 * half:,} characters)... {text[-half:]}"


def _flags_take_no_value(command: Any) -> None:
    """Show on/off options (``--json``, ``--force``, ``--help``) without a value in the help.

    Typer >= 0.29 writes a type after every option, so a flag reads ``--json <bool>`` as if
    it took ``true`` or ``false``, which it refuses. An empty metavar leaves the type column
    blank for flags; their help text says what they do.
    """
    commands = [command]
    while commands:
        current = commands.pop()
        params = list(getattr(current, "params", ()))
        get_help_option = getattr(current, "get_help_option", None)
        context_class = getattr(current, "context_class", None)
        if callable(get_help_option) and context_class is not None:
            with contextlib.suppress(Exception):  # the help option is optional
                context = context_class(current, help_option_names=["-h", "--help"])
                params.append(get_help_option(context))
        for param in params:
            if getattr(param, "is_flag", False) and getattr(param, "metavar", "") is None:
                param.metavar = ""
        commands.extend(getattr(current, "commands", {}).values())


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI with ``argv`` (default: ``sys.argv[1:]``) and return the exit status.

    Reporting an error never raises: when stderr itself is closed, the status says it.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        return _main(args)
    except BrokenPipeError:
        return _pipe_closed()
    except (OSError, ValueError, AttributeError):  # stderr closed too: nowhere to say more
        return 1


def _pipe_closed() -> int:
    """The reader of stdout went away (``memfit ... | head``): exit quietly, as ``cat`` and
    ``grep`` do, with status 0. Stdout is pointed at ``/dev/null`` first, so that Python's
    last flush of what is still buffered does not fail at exit with a message of its own."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, sys.stdout.fileno())
        finally:
            os.close(devnull)
    return 0


def _repeated_option(command: Any, args: Sequence[str]) -> MemfitError | None:
    """An option that takes one value given more than once (click keeps the last silently:
    ``--gpu A --gpu B`` planned for B)."""
    name = next((a for a in args if not a.startswith("-")), None)
    load = getattr(command, "load", None)
    if name in COMMANDS and callable(load):
        load(name)  # a lazy command's options are known once its module is imported
    commands = getattr(command, "commands", {})
    sub = commands.get(name) if name is not None else None
    if sub is None:
        return None
    single: dict[str, str] = {}
    for param in getattr(sub, "params", ()):
        if getattr(param, "param_type_name", "") != "option":
            continue
        if getattr(param, "multiple", False) or getattr(param, "is_flag", False):
            continue
        for opt in [*param.opts, *param.secondary_opts]:
            single[opt] = param.opts[0]
    counts: dict[str, int] = {}
    for arg in args[args.index(name) + 1 :] if name is not None else ():
        if arg == "--":
            break
        opt = arg.split("=", 1)[0] if arg.startswith("--") else arg
        if opt in single:
            counts[single[opt]] = counts.get(single[opt], 0) + 1
    for opt, n in counts.items():
        if n > 1:
            from memfit.errors import ConfigError

            return ConfigError(
                f"{opt} is given {n} times; it takes one value",
                key_path=opt,
                hint=f"give {opt} once (only the last would be used)",
            )
    return None


def _main(args: list[str]) -> int:
    debug = "--debug" in args or bool(os.environ.get("MEMFIT_DEBUG"))
    command = typer.main.get_command(app)
    _flags_take_no_value(command)
    if not args:  # bare `memfit`: the help, as a request rather than a usage error
        args = ["--help"]
    repeated = _repeated_option(command, args)
    if repeated is not None:
        _report(repeated, args)
        return 1
    try:
        result = command.main(args=args, prog_name="memfit", standalone_mode=False)
    except MemfitError as exc:
        if debug:
            import traceback

            traceback.print_exc()
        _report(exc, args)
        return 1
    except _USAGE_ERRORS as exc:
        exc.show()  # type: ignore[attr-defined]
        return 2
    except _ABORTS:
        _err("Aborted.")
        return 1
    except _EXITS as exc:
        return int(getattr(exc, "exit_code", 0))
    except _CLICK_ERRORS as exc:
        exc.show()  # type: ignore[attr-defined]
        return int(getattr(exc, "exit_code", 1))
    except KeyboardInterrupt:
        _err("Interrupted.")
        return 130
    except BrokenPipeError:
        return _pipe_closed()
    except (SystemExit, GeneratorExit):
        raise
    except BaseException as exc:  # an internal bug, not a user's mistake
        if debug:
            import traceback

            traceback.print_exc()
        hint = "rerun with --debug for the traceback and report it as a memfit bug"
        if _wants_json(args):
            from memfit.cli._common import print_json

            with contextlib.suppress(MemfitError, OSError, ValueError):
                print_json(
                    {"error": "InternalError", "message": f"internal error: {exc!r}", "hint": hint}
                )
        from rich.markup import escape

        _err(f"[bold red]Error:[/] internal error: {escape(repr(exc))}")
        _err(f"[bold]Hint:[/] {hint}")
        return 1
    return int(result) if isinstance(result, int) else 0


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())


if __name__ == "__main__":  # pragma: no cover
    run()
