"""``memfit report``'s HTML page: the summary, the picture and the event table in one file
with no outside resource."""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any

from memfit.monitor.report import (
    EVENT_COLOURS,
    Run,
    event_steps,
    size_text,
    summarize,
    summary_rows,
    write_file_bytes,
)
from memfit.monitor.report_plot import png_bytes


def event_rows(run: Run) -> list[dict[str, Any]]:
    """The events as rows for a table: where they are drawn, and what they said.

    Args:
        run: A loaded run.

    Returns:
        One dict per event, in order: ``step`` (from :func:`event_steps`; ``None`` when
        unknown), ``own_step`` (the step the event carried), ``kind``, ``source``,
        ``message`` (all text).
    """
    rows = []
    for event, step in zip(run.events, event_steps(run), strict=True):
        rows.append(
            {
                "step": step,
                "own_step": event.get("step"),
                "kind": str(event.get("kind")),
                "source": str(event.get("source")),
                "message": str(event.get("message")),
            }
        )
    return rows


def step_text(row: dict[str, Any]) -> str:
    """The step of an event row, and its own count when that differs (``"60 (own: 11)"``)."""
    step, own = row["step"], row["own_step"]
    text = "-" if step is None else str(step)
    if own is not None and own != step:
        text += f" (own count {own})"
    return text


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;
max-width:1020px;color:#222;padding:0 1em}
h1{font-size:1.4em}h2{font-size:1.1em;margin-top:1.6em}
table{border-collapse:collapse;margin:.5em 0;font-size:.92em}
th,td{border:1px solid #ccc;padding:.3em .6em;text-align:left;vertical-align:top}
th{background:#f3f3f3}img{max-width:100%;border:1px solid #ddd}
td.num{text-align:right;white-space:nowrap}
.note{color:#666;font-size:.88em}.warn{color:#a33}
.dot{display:inline-block;width:.7em;height:.7em;border-radius:50%;margin-right:.35em}
"""


def render_html(run: Run, *, title: str | None = None, max_events: int = 500) -> str:
    """The report as one self-contained HTML document (figure inlined as base64 PNG).

    Args:
        run: A loaded run.
        title: Page and figure title; default: the file name.
        max_events: Most events listed in the table (all are counted in the summary).

    Returns:
        The HTML text.

    Raises:
        BackendUnavailable: When matplotlib is not installed.
    """
    name = title or (run.path.name if run.path is not None else "memfit run")
    summary = summarize(run)
    image = base64.b64encode(png_bytes(run, title=name)).decode("ascii")
    esc = html.escape
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>memfit report: {esc(name)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>memfit report: {esc(name)}</h1>",
    ]
    for warning in summary["warnings"]:
        parts.append(f'<p class="warn">Warning: {esc(warning)}</p>')
    parts += [
        f'<img alt="memory over steps, with the events below" src="data:image/png;base64,{image}">',
        "<h2>Summary</h2><table>",
    ]
    for label, text in summary_rows(summary):
        if label != "warning":
            parts.append(f"<tr><th>{esc(label)}</th><td>{esc(text)}</td></tr>")
    parts.append("</table>")
    if summary["growth"] is not None:
        g = summary["growth"]
        parts.append(
            '<p class="note">Growth test: Theil-Sen slope '
            f"{esc(size_text(g['bytes_per_step']))}/step, {g['confidence']:.0%} interval "
            f"{esc(size_text(g['lower_bytes_per_step']))} to "
            f"{esc(size_text(g['upper_bytes_per_step']))}/step over {g['samples']} "
            "samples.</p>"
        )
    parts.append(f"<h2>Events ({len(run.events)})</h2>")
    rows = event_rows(run)
    if rows:
        parts.append("<table><tr><th>step</th><th>kind</th><th>source</th><th>message</th></tr>")
        for row in rows[:max_events]:
            colour = EVENT_COLOURS.get(row["kind"], "#8c564b")
            parts.append(
                "<tr>"
                f'<td class="num">{esc(step_text(row))}</td>'
                f'<td><span class="dot" style="background:{colour}"></span>'
                f"{esc(row['kind'])}</td>"
                f"<td>{esc(row['source'])}</td>"
                f"<td>{esc(row['message'])}</td>"
                "</tr>"
            )
        parts.append("</table>")
        if len(rows) > max_events:
            parts.append(f'<p class="note">{len(rows) - max_events} more events not listed.</p>')
        if any(r["own_step"] is not None and r["own_step"] != r["step"] for r in rows):
            parts.append(
                '<p class="note">An event whose own count disagrees with when it happened (a '
                "guard counting its updates, not the training steps) is shown at the step "
                "during which it happened, from its time; its own count is in brackets.</p>"
            )
    else:
        parts.append("<p>No guard or cleanup events were recorded.</p>")
    parts.append(
        '<p class="note">Sizes in MiB as nvidia-smi counts them (1 MiB = 1,048,576 bytes). '
        "allocated: live tensors; reserved: held by the caching allocator; device used: as "
        "nvidia-smi shows it, contexts included.</p></body></html>"
    )
    return "\n".join(parts) + "\n"


def write_html(run: Run, path: str | Path, *, title: str | None = None) -> Path:
    """Write :func:`render_html` to a file.

    Args:
        run: A loaded run.
        path: Where to write.
        title: Page title.

    Returns:
        The path written.

    Raises:
        ConfigError: When the file cannot be written.
        BackendUnavailable: When matplotlib is not installed.
    """
    target = Path(path)
    write_file_bytes(target, render_html(run, title=title).encode("utf-8"))
    return target
