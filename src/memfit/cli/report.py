"""``memfit report RUN.jsonl``: what a recorded run did with its memory.

Prints a summary table (peak, mean, growth, events); ``-o report.png`` draws memory over
steps with the budget line and the guard / cleanup events; ``-o report.html`` writes one
self-contained page with the figure and the tables.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from memfit.cli._common import JSON_OPTION, err_console, out_console, print_json
from memfit.errors import ConfigError
from memfit.monitor.report import load_run, summarize, summary_rows, write_html, write_png

__all__ = ["register", "report"]


def report(
    run_file: Path = typer.Argument(..., metavar="RUN.jsonl", help="File a Recorder wrote."),
    output: Path | None = typer.Option(
        None, "-o", "--output", help="Write the figure (.png) or the full page (.html)."
    ),
    as_json: bool = JSON_OPTION,
) -> None:
    """Summarise a recorded run; draw it to a PNG or a self-contained HTML page."""
    suffix = output.suffix.lower() if output is not None else ""
    if output is not None and suffix not in (".png", ".html", ".htm"):
        raise ConfigError(
            f"cannot tell the report format from {output.name!r}",
            key_path="--output",
            hint="name the output report.png (figure) or report.html (page)",
        )
    run = load_run(run_file)
    summary = summarize(run)
    if output is not None:
        if suffix == ".png":
            write_png(run, output)
        else:
            write_html(run, output)
        summary["output"] = str(output)
    if as_json:
        print_json(summary)
        return
    table = Table(title=f"memfit report: {escape(run_file.name)}", title_justify="left")
    table.add_column("")
    table.add_column("")
    table.show_header = False
    for label, text in summary_rows(summary):
        table.add_row(escape(label), escape(text))
    out_console.print(table)
    if run.events:
        events = Table(title="events", title_justify="left")
        for column in ("step", "kind", "source", "message"):
            events.add_column(column)
        for event in run.events[:50]:
            events.add_row(
                escape(str(event.get("step"))),
                escape(str(event.get("kind"))),
                escape(str(event.get("source"))),
                escape(str(event.get("message"))),
            )
        out_console.print(events)
        if len(run.events) > 50:
            out_console.print(f"... and {len(run.events) - 50} more events")
    if output is not None:
        err_console.print(f"wrote {escape(str(output))}")


def register(app: typer.Typer) -> None:
    """Add ``memfit report`` to ``app``."""
    app.command("report")(report)
