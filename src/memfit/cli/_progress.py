"""A status line on stderr for long work (measuring a Brax env, tracing several batch sizes,
fit probes, reading a big log).

Shown only where a person watches: stderr is a terminal and the command was not asked for
``--json``. It is transient (it clears itself when the work ends), so what stays on the
screen is the command's output; stdout never receives it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from memfit.cli import _common

__all__ = ["status"]


@contextlib.contextmanager
def status(text: str, *, quiet: bool = False) -> Iterator[Callable[[str], None]]:
    """Show ``text`` with a spinner and the elapsed time on stderr while the block runs.

    Args:
        text: What is being done (``"planning brax_humanoid_ppo"``).
        quiet: Show nothing (``--json``).

    Yields:
        ``update(text)``: replaces the line's text as the work moves on (a no-op when
        nothing is shown).
    """
    console = _common.err_console
    if quiet or not console.is_terminal:
        yield lambda _text: None
        return
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task(text, total=None)

        def update(new: str) -> None:
            progress.update(task, description=new)

        yield update
