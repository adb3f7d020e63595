"""``memfit report RUN.jsonl``: what a recorded run did with its memory.

Prints a summary table (peak, mean, growth, events) in MiB, as ``nvidia-smi`` counts;
``-o report.png`` draws memory over steps with the budget and the guard / cleanup events;
``-o report.html`` writes one self-contained page with the figure and the tables. The run log
may be ``-`` (stdin). The output is a new file unless ``--force`` is given, never the run log
itself, and is written whole or not at all. A cut-off last line (the log of a killed run) is
skipped with a warning.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import typer
from rich.table import Table

from memfit.cli._common import JSON_OPTION, err_console, out_console, print_json, safe
from memfit.cli._files import FORCE_OPTION, STDIN, Output, read_input
from memfit.cli._progress import status
from memfit.errors import ConfigError
from memfit.monitor.report import Run, load_run, parse_run, summarize, summary_rows
from memfit.monitor.report_html import event_rows, render_html, step_text
from memfit.monitor.report_plot import png_bytes

__all__ = ["register", "report"]

_HINT = "pass a file written by memfit.Recorder(path) or `memfit watch --log FILE`"

#: Events listed in the terminal (all are in the HTML page and counted in the summary).
_MAX_EVENTS_SHOWN = 50


def report(
    run_file: str = typer.Argument(
        ..., metavar="RUN.jsonl", help="File a Recorder (or memfit watch --log) wrote; - for stdin."
    ),
    output: str | None = typer.Option(
        None,
        "-o",
        "--output",
        help="Write the figure (.png) or the full page (.html); a new file, or --force.",
    ),
    force: bool = FORCE_OPTION,
    title: str | None = typer.Option(
        None, "--title", help="Title of the figure and page (default: the run log's name)."
    ),
    run_number: int | None = typer.Option(
        None,
        "--run",
        metavar="N",
        help="Which run of a file several runs were appended to (1 is the first; default: "
        "the last).",
    ),
    as_json: bool = JSON_OPTION,
) -> None:
    """Summarise a recorded run; draw it to a PNG or a self-contained HTML page."""
    suffix = Path(output).suffix.lower() if output is not None else ""
    if output is not None and suffix not in (".png", ".html", ".htm"):
        raise ConfigError(
            f"cannot tell the report format from {Path(output).name!r}",
            key_path="--output",
            hint="name the output report.png (figure) or report.html (page)",
        )
    out = (
        Output.named(
            output,
            what="the report",
            option="--output",
            force=force,
            inputs=[run_file] if run_file != STDIN else [],
        )
        if output is not None
        else None
    )
    if out is not None:  # before reading: never the run log, never a file without --force
        out.check()
    with status(f"reading {run_file}", quiet=as_json) as say:
        if run_file != STDIN:
            run = _with_option(lambda: load_run(run_file, run=run_number))
        else:
            data, source = read_input(run_file, what="the run log", hint=_HINT, stdin=True)
            run = _with_option(lambda: parse_run(data, source=source, run=run_number))
        summary = summarize(run)
        if out is not None:
            say(f"drawing {out.path.name}")
            name = title or (run.path.name if run.path is not None else "memfit run")
            out.write(
                png_bytes(run, title=name) if suffix == ".png" else render_html(run, title=name)
            )
            summary["output"] = str(out.path)
    for warning in run.warnings:
        err_console.print(f"[yellow]warning:[/] {safe(warning)}")
    if as_json:
        print_json(summary)
        return
    label = title or (run.path.name if run.path is not None else "<stdin>")
    table = Table(title=f"memfit report: {safe(label)}", title_justify="left")
    table.add_column("")
    table.add_column("")
    table.show_header = False
    for row_label, text in summary_rows(summary):
        if row_label != "warning":
            table.add_row(safe(row_label), safe(text))
    out_console.print(table)
    rows = event_rows(run)
    if rows:
        events = Table(title="events", title_justify="left")
        for column in ("step", "kind", "source", "message"):
            events.add_column(column, justify="right" if column == "step" else "left")
        for row in rows[:_MAX_EVENTS_SHOWN]:
            events.add_row(
                safe(step_text(row)), safe(row["kind"]), safe(row["source"]), safe(row["message"])
            )
        out_console.print(events)
        if len(rows) > _MAX_EVENTS_SHOWN:
            out_console.print(f"... and {len(rows) - _MAX_EVENTS_SHOWN} more events")
    if output is not None:
        err_console.print(f"wrote {safe(output)}")


def _with_option(read: Callable[[], Run]) -> Run:
    """``read()``, its ``run`` errors named as the ``--run`` option."""
    try:
        return read()
    except ConfigError as exc:
        if exc.key_path != "run":
            raise
        message = exc.message.removeprefix("run: ")
        raise ConfigError(message, key_path="--run", hint=exc.hint) from None


def register(app: typer.Typer) -> None:
    """Add ``memfit report`` to ``app``."""
    app.command("report")(report)
