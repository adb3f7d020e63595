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
import traceback
from collections.abc import Sequence
from typing import Any

import typer
from rich.markup import escape

from memfit._version import __version__
from memfit.cli._common import err_console, print_json, safe
from memfit.errors import MemfitError

__all__ = ["COMMAND_MODULES", "app", "main", "run"]


def _click_exception_types() -> tuple[
    tuple[type[Exception], ...],
    tuple[type[Exception], ...],
    tuple[type[Exception], ...],
    tuple[type[Exception], ...],
]:
    """Click's UsageError, Abort, Exit and ClickException classes.

    Typer >= 0.29 bundles its own copy of click (``typer._click``) whose exceptions are not
    the installed click's; older Typer raises the installed click's. Catch whichever exist.
    """
    modules: list[Any] = []
    for name in ("typer._click.exceptions", "click.exceptions"):
        try:
            modules.append(importlib.import_module(name))
        except ImportError:
            continue

    def collect(attr: str) -> tuple[type[Exception], ...]:
        return tuple(getattr(m, attr) for m in modules if hasattr(m, attr))

    return collect("UsageError"), collect("Abort"), collect("Exit"), collect("ClickException")


_USAGE_ERRORS, _ABORTS, _EXITS, _CLICK_ERRORS = _click_exception_types()

#: Modules under ``memfit.cli`` that register commands, in the order ``--help`` lists them.
COMMAND_MODULES: tuple[str, ...] = (
    "devices",
    "gpus",
    "env",
    "watch",
    "report",
    "estimate",
    "plan",
    "fit",
)

app = typer.Typer(
    name="memfit",
    help="Keep ML and RL jobs inside the memory of their GPU: plan, estimate, guard, watch.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

_state: dict[str, bool] = {"debug": False}


def _version_callback(value: bool) -> None:
    if value:
        sys.stdout.write(f"memfit {__version__}\n")
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


def _register_commands() -> None:
    for name in COMMAND_MODULES:
        module = importlib.import_module(f"memfit.cli.{name}")
        module.register(app)


_register_commands()


def _wants_json(argv: Sequence[str]) -> bool:
    return "--json" in argv


def _report(exc: MemfitError, argv: Sequence[str]) -> None:
    if _wants_json(argv):
        with contextlib.suppress(MemfitError, OSError, ValueError):
            print_json(exc.to_dict())  # stdout may be what failed: stderr still says it
    err_console.print(f"[bold red]Error:[/] {safe(exc.message, newlines=True)}")
    command = next((a for a in argv if not a.startswith("-")), None)
    fallback = f"memfit {command} --help" if command else "memfit --help"
    hint = exc.hint or f"see `{fallback}`; rerun with --debug for the details"
    err_console.print(f"[bold]Hint:[/] {safe(hint, newlines=True)}")


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
        return 0
    except (OSError, ValueError, AttributeError):  # stderr closed too: nowhere to say more
        return 1


def _repeated_option(command: Any, args: Sequence[str]) -> MemfitError | None:
    """An option that takes one value given more than once (click keeps the last silently:
    ``--gpu A --gpu B`` planned for B)."""
    commands = getattr(command, "commands", {})
    name = next((a for a in args if not a.startswith("-")), None)
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
            traceback.print_exc()
        _report(exc, args)
        return 1
    except _USAGE_ERRORS as exc:
        exc.show()  # type: ignore[attr-defined]
        return 2
    except _ABORTS:
        err_console.print("Aborted.")
        return 1
    except _EXITS as exc:
        return int(getattr(exc, "exit_code", 0))
    except _CLICK_ERRORS as exc:
        exc.show()  # type: ignore[attr-defined]
        return int(getattr(exc, "exit_code", 1))
    except KeyboardInterrupt:
        err_console.print("Interrupted.")
        return 130
    except BrokenPipeError:
        return 0
    except (SystemExit, GeneratorExit):
        raise
    except BaseException as exc:  # an internal bug, not a user's mistake
        if debug:
            traceback.print_exc()
        hint = "rerun with --debug for the traceback and report it as a memfit bug"
        if _wants_json(args):
            with contextlib.suppress(MemfitError, OSError, ValueError):
                print_json(
                    {"error": "InternalError", "message": f"internal error: {exc!r}", "hint": hint}
                )
        err_console.print(f"[bold red]Error:[/] internal error: {escape(repr(exc))}")
        err_console.print(f"[bold]Hint:[/] {hint}")
        return 1
    return int(result) if isinstance(result, int) else 0


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())


if __name__ == "__main__":  # pragma: no cover
    run()
