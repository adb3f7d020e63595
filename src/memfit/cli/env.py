"""``memfit env``: recommended allocator settings for PyTorch and JAX, and a check of yours.

Prints the settings for a use (``--for training|inference|shared-gpu``) with a reason each,
as lines to paste into a shell (``--shell bash|fish|powershell``), then validates what the
environment already holds (``PYTORCH_ALLOC_CONF`` / ``PYTORCH_CUDA_ALLOC_CONF`` and
``XLA_PYTHON_CLIENT_*``): unknown options, bad values, conflicts, both torch names set
differently. ``--check FILE`` validates a shell snippet instead (catching a variable
exported twice). With ``--strict`` an error-level problem makes the exit status 1.
"""

from __future__ import annotations

import os
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from memfit.cli._common import JSON_OPTION, err_console, out_console, print_json
from memfit.errors import ConfigError, read_user_text
from memfit.runtime.allocator_env import (
    JAX_VARIABLES,
    PROFILES,
    SHELLS,
    TORCH_VARIABLES,
    check_environment,
    check_shell,
    recommend,
    render_shell,
)

__all__ = ["env", "register"]


def env(
    profile: str = typer.Option(
        "training", "--for", metavar="USE", help="training, inference or shared-gpu."
    ),
    shell: str = typer.Option("bash", "--shell", help="bash, fish or powershell."),
    check: Path | None = typer.Option(
        None,
        "--check",
        metavar="FILE",
        help="Validate the exports in a shell file instead of the current environment.",
    ),
    strict: bool = typer.Option(
        False, "--strict", help="Exit 1 when a setting has an error-level problem."
    ),
    gpu: str | None = typer.Option(
        None,
        "--gpu",
        help="The card (name or size) to size XLA's pool for; by default any card of 8 GB "
        "or more (the same rule memfit plan uses).",
    ),
    as_json: bool = JSON_OPTION,
) -> None:
    """Recommend PyTorch/JAX allocator settings and validate the ones already set."""
    if profile not in PROFILES:
        raise ConfigError(
            f"unknown use {profile!r}", key_path="--for", hint="use " + ", ".join(PROFILES)
        )
    if shell not in SHELLS:
        raise ConfigError(
            f"unknown shell {shell!r}", key_path="--shell", hint="use " + ", ".join(SHELLS)
        )
    from memfit.core.catalog import gpu as catalog_gpu

    spec = catalog_gpu(gpu) if gpu is not None else None
    rec = recommend(profile, gpu=spec)
    script = render_shell(rec.settings, shell)
    if check is not None:
        text = read_user_text(check, what="the shell file (--check)")
        try:
            problems = check_shell(text)
        except ConfigError as exc:
            # check_shell names the line; say which file it is in
            raise ConfigError(exc.message, key_path=str(check), hint=exc.hint) from exc
        checked = f"file {check}"
    else:
        problems = check_environment()
        checked = "environment"
    current = {
        name: os.environ[name] for name in (*TORCH_VARIABLES, *JAX_VARIABLES) if name in os.environ
    }
    errors = sum(1 for p in problems if p.severity == "error")
    if as_json:
        print_json(
            {
                **rec.to_dict(),
                "shell": shell,
                "script": script,
                "checked": checked,
                "current": current,
                "problems": [p.to_dict() for p in problems],
            }
        )
    else:
        table = Table(title=f"memfit env --for {profile}", title_justify="left")
        for column in ("variable / option", "value", "why"):
            table.add_column(column)
        for key, value, reason in rec.options:
            table.add_row(f"torch {escape(key)}", escape(value), escape(reason))
        for setting in rec.settings:
            if setting.framework == "jax":
                table.add_row(
                    escape(setting.variable), escape(setting.value), escape(setting.reason)
                )
        out_console.print(table)
        out_console.print(f"# paste into {shell}:")
        out_console.print(escape(script), soft_wrap=True)
        for note in rec.notes:
            err_console.print(f"note: {escape(note)}")
        if problems:
            out_console.print(f"problems in the {escape(checked)}:")
            for p in problems:
                where = p.variable + (f" {p.option}" if p.option else "")
                line = f"  {p.severity} [{p.code}] {where}: {p.message}"
                if p.hint:
                    line += f" (fix: {p.hint})"
                out_console.print(escape(line), soft_wrap=True)
        elif current or check is not None:
            out_console.print(f"no problems in the {escape(checked)}")
    if strict and errors:
        first = next(p for p in problems if p.severity == "error")
        err_console.print(
            f"[bold red]Error:[/] {errors} error-level problem(s) in the {escape(checked)}; "
            f"first: {escape(first.message)}"
        )
        err_console.print(f"[bold]Hint:[/] {escape(first.hint or 'see the problems listed above')}")
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add ``memfit env`` to ``app``."""
    app.command("env")(env)
