"""Turn a recorded run into a summary, a figure and a self-contained HTML page.

Reads the JSON lines a :class:`memfit.Recorder` writes (``{"type": "sample"|"event"|...}``)
and the snapshot lines ``memfit watch --log`` appends. :func:`summarize` gives plain data
(peak, mean, growth, events), :func:`plot` a matplotlib figure (Agg backend, no display needed)
of memory over steps with the budget line and the guard / cleanup events marked, and
:func:`write_html` one HTML file with the figure embedded as base64 and the tables.
"""

from __future__ import annotations

import base64
import html
import io
import json
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memfit.errors import ConfigError, file_error, read_user_text
from memfit.monitor.recorder import Leak, check_fragmentation, detect_leak
from memfit.units import MiB, format_bytes

__all__ = [
    "EVENT_COLOURS",
    "Run",
    "load_run",
    "plot",
    "render_html",
    "summarize",
    "summary_rows",
    "write_html",
    "write_png",
]

_HINT = "pass a file written by memfit.Recorder(path) or `memfit watch --log FILE`"

#: Colours of the event markers, by event kind.
EVENT_COLOURS: dict[str, str] = {
    "oom": "#d62728",
    "retry": "#ff7f0e",
    "split": "#e377c2",
    "grow_back": "#2ca02c",
    "cleanup": "#1f77b4",
    "give_up": "#000000",
    "restore": "#9467bd",
}

_SERIES = (
    ("allocated_bytes", "allocated", "#1f77b4"),
    ("reserved_bytes", "reserved", "#ff7f0e"),
    ("peak_allocated_bytes", "peak allocated", "#9467bd"),
    ("device_used_bytes", "device used", "#7f7f7f"),
)


@dataclass
class Run:
    """A recorded run, as loaded from its file.

    Attributes:
        path: The file it came from, or ``None``.
        samples: Step samples, in file order.
        background: Background (and ``memfit watch``) samples, in file order.
        events: Event records (``kind``, ``step``, ``source``, ``message``, ``data``, ``time``).
        meta: The ``start`` record, if there was one.
    """

    path: Path | None = None
    samples: list[dict[str, Any]] = field(default_factory=list)
    background: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)


def load_run(path: str | Path) -> Run:
    """Read a Recorder JSON-lines file (or a ``memfit watch --log`` file).

    Blank lines are skipped; ``start`` / ``end`` records fill :attr:`Run.meta`.

    Args:
        path: The file.

    Returns:
        The :class:`Run`.

    Raises:
        ConfigError: When the file is missing or unreadable, a line is not a JSON object
            (``key_path`` is ``FILE:LINE``), or the file holds neither a sample nor an event
            (a run that died before its first step still has its OOM events).
    """
    source = Path(path)
    if not source.exists():
        raise ConfigError("no such file", key_path=str(source), hint=_HINT)
    text = read_user_text(source, what="the file", hint=_HINT)
    run = Run(path=source)
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{source}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"line {number} is not JSON: {exc.msg} (column {exc.colno})",
                key_path=where,
                hint=_HINT + "; a run cut off mid-line can be repaired by deleting that line",
            ) from exc
        if not isinstance(record, dict):
            raise ConfigError(
                f"line {number} is not a JSON object but {type(record).__name__}",
                key_path=where,
                hint=_HINT,
            )
        _add_record(run, record, where)
    if not run.samples and not run.background and not run.events:
        raise ConfigError(
            "the file holds no memory samples and no events", key_path=str(source), hint=_HINT
        )
    return run


def _add_record(run: Run, record: dict[str, Any], where: str) -> None:
    kind = record.get("type")
    if kind == "start":
        run.meta.update(record)
    elif kind == "end":
        run.meta["end"] = record
    elif kind == "event":
        run.events.append(record)
    elif kind == "sample" or (kind is None and "step" in record and "devices" not in record):
        _check_sample(record, where)
        if record.get("mode") == "background":
            run.background.append(record)
        else:
            run.samples.append(record)
    elif kind is None and isinstance(record.get("devices"), list):
        run.background.extend(_snapshot_samples(record, where))
    else:
        raise ConfigError(f"unknown record type {kind!r}", key_path=where, hint=_HINT)


def _check_sample(record: dict[str, Any], where: str) -> None:
    for key in ("step", "allocated_bytes", "reserved_bytes", "device_used_bytes"):
        value = record.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConfigError(
                f"{key} must be a whole number or null, not {value!r}",
                key_path=f"{where}.{key}",
                hint=_HINT,
            )


def _snapshot_samples(record: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """Background samples from one ``memfit watch --log`` snapshot line."""
    from memfit.backends.base import SystemSnapshot

    try:
        snapshot = SystemSnapshot.from_dict(record)
    except ConfigError as exc:
        raise ConfigError(exc.message, key_path=f"{where}.{exc.key_path}", hint=_HINT) from exc
    when = record.get("time")
    out = []
    for dev in snapshot.devices:
        out.append(
            {
                "type": "sample",
                "mode": "background",
                "step": None,
                "time": when if isinstance(when, (int, float)) else None,
                "taken_at": snapshot.taken_at,
                "allocated_bytes": dev.allocated_bytes,
                "reserved_bytes": dev.allocator_reserved_bytes,
                "peak_allocated_bytes": dev.peak_allocated_bytes,
                "device_used_bytes": dev.device_used_bytes,
                "total_bytes": dev.total_bytes,
                "budget_bytes": dev.limit_bytes,
                "source": snapshot.source,
                "device_index": dev.index,
            }
        )
    return out


# -- summary --------------------------------------------------------------------------------


def _values(samples: list[dict[str, Any]], key: str) -> list[int]:
    return [int(s[key]) for s in samples if s.get(key) is not None]


def _last(samples: list[dict[str, Any]], key: str) -> int | None:
    for sample in reversed(samples):
        if sample.get(key) is not None:
            return int(sample[key])
    return None


def summarize(run: Run) -> dict[str, Any]:
    """The run in figures: peak, mean, growth, step time, budget and events.

    Args:
        run: A loaded run.

    Returns:
        Plain data: ``samples``, ``first_step``, ``last_step``, ``duration_seconds``,
        ``source``, ``budget_bytes``, ``total_bytes``, ``metrics`` (per series: ``peak``,
        ``mean``, ``first``, ``last``, ``change``), ``median_step_seconds``, ``growth`` (a
        :class:`~memfit.monitor.recorder.Leak` as a dict, or ``None``), ``fragmentation``
        and ``events`` (counts by kind).
    """
    samples = run.samples or run.background
    metrics: dict[str, dict[str, int | None]] = {}
    for key, _label, _colour in _SERIES:
        values = _values(samples, key)
        if not values:
            continue
        metrics[key] = {
            "peak": max(values),
            "mean": round(statistics.fmean(values)),
            "first": values[0],
            "last": values[-1],
            "change": values[-1] - values[0],
        }
    steps = [int(s["step"]) for s in run.samples if s.get("step") is not None]
    times = [float(s["time"]) for s in samples if isinstance(s.get("time"), (int, float))]
    step_seconds = [float(s["step_seconds"]) for s in run.samples if s.get("step_seconds")]
    budget = _last(samples, "budget_bytes")
    total = _last(samples, "total_bytes")
    growth = None
    if run.samples:
        leak = _leak(run)
        growth = leak.to_dict() if leak is not None else None
    frag = None
    for sample in reversed(run.samples):
        found = check_fragmentation(sample)
        if found is not None:
            frag = found.to_dict()
            break
    sources = sorted({str(s.get("source")) for s in samples if s.get("source") is not None})
    return {
        "file": str(run.path) if run.path is not None else None,
        "samples": len(run.samples),
        "background_samples": len(run.background),
        "first_step": min(steps) if steps else None,
        "last_step": max(steps) if steps else None,
        "duration_seconds": (max(times) - min(times)) if len(times) > 1 else None,
        "source": ", ".join(sources) if sources else None,
        "budget_bytes": budget,
        "total_bytes": total,
        "metrics": metrics,
        "median_step_seconds": statistics.median(step_seconds) if step_seconds else None,
        "growth": growth,
        "fragmentation": frag,
        "events": dict(Counter(str(e.get("kind")) for e in run.events)),
    }


def summary_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """The summary as ``(label, text)`` rows for a table (sizes in binary units).

    Args:
        summary: Output of :func:`summarize`.

    Returns:
        The rows.
    """
    rows: list[tuple[str, str]] = []
    first, last = summary["first_step"], summary["last_step"]
    if first is not None:
        rows.append(("steps", f"{first} to {last} ({summary['samples']} samples)"))
    elif summary["samples"]:
        rows.append(("steps", f"none (background samples only: {summary['samples']})"))
    else:
        rows.append(("steps", "none: no memory sample, only events (the run ended before a step)"))
    if summary["source"]:
        rows.append(("source", str(summary["source"])))
    if summary["duration_seconds"] is not None:
        rows.append(("duration", f"{summary['duration_seconds']:.1f} s"))
    if summary["median_step_seconds"] is not None:
        rows.append(("median step time", f"{summary['median_step_seconds'] * 1000:.2f} ms"))
    for key, label, _colour in _SERIES:
        m = summary["metrics"].get(key)
        if m is None:
            continue
        rows.append(
            (
                label,
                f"peak {format_bytes(m['peak'])}, mean {format_bytes(m['mean'])}, "
                f"last {format_bytes(m['last'])} ({_signed(m['change'])} over the run)",
            )
        )
    if summary["budget_bytes"] is not None:
        rows.append(("budget", format_bytes(summary["budget_bytes"])))
    if summary["total_bytes"] is not None:
        rows.append(("device total", format_bytes(summary["total_bytes"])))
    growth = summary["growth"]
    if growth is None:
        rows.append(("growth", "no steady growth found"))
    else:
        text = f"{format_bytes(growth['bytes_per_step'])}/step since step {growth['start_step']}"
        if growth["projected_oom_step"] is not None:
            text += f"; reaches the limit around step {growth['projected_oom_step']}"
        rows.append(("growth (leak?)", text))
    frag = summary["fragmentation"]
    if frag is not None:
        rows.append(
            (
                "fragmentation",
                f"{format_bytes(frag['slack_bytes'])} reserved but unused "
                f"({frag['fraction']:.0%}); try expandable_segments:True",
            )
        )
    events = summary["events"]
    rows.append(("events", ", ".join(f"{k} x{v}" for k, v in sorted(events.items())) or "none"))
    return rows


def _signed(value: int) -> str:
    return ("+" if value >= 0 else "") + format_bytes(value)


# -- figure ---------------------------------------------------------------------------------


def _event_x(event: dict[str, Any], samples: list[dict[str, Any]]) -> float | None:
    """Where an event goes on the step axis: its step, else the step of the nearest time."""
    step = event.get("step")
    if isinstance(step, int) and not isinstance(step, bool):
        return float(step)
    when = event.get("time")
    if not isinstance(when, (int, float)) or not samples:
        return None
    timed = [s for s in samples if isinstance(s.get("time"), (int, float))]
    if not timed:
        return None
    nearest = min(timed, key=lambda s: abs(float(s["time"]) - float(when)))
    return float(nearest["step"]) if nearest.get("step") is not None else None


def plot(run: Run, *, title: str | None = None) -> Any:
    """A matplotlib figure of memory over steps (or seconds, for background-only runs).

    Lines for allocated, reserved, peak allocated and device-used bytes (in MiB) where the
    run has them; a dashed line at the budget (or the device total); a vertical marker per
    guard / cleanup event, coloured by kind.

    Args:
        run: A loaded run.
        title: Figure title; default: the file name.

    Returns:
        A ``matplotlib.figure.Figure`` (Agg canvas, not shown).

    Raises:
        BackendUnavailable: When matplotlib is not installed.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        from memfit.errors import BackendUnavailable

        raise BackendUnavailable(
            "memfit report draws with matplotlib, which is not installed",
            hint="pip install 'memfit[plot]'",
        ) from exc

    fig = Figure(figsize=(9.0, 4.8), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    by_step = bool(run.samples)
    samples = run.samples if by_step else run.background
    start_time = min(
        (float(s["time"]) for s in samples if isinstance(s.get("time"), (int, float))),
        default=0.0,
    )
    groups: dict[Any, list[dict[str, Any]]] = {}
    for sample in samples:
        groups.setdefault(None if by_step else sample.get("device_index"), []).append(sample)
    for group_key, group in groups.items():
        suffix = f" (GPU {group_key})" if group_key is not None and len(groups) > 1 else ""
        for key, label, colour in _SERIES:
            points = [
                (_x(s, by_step, start_time), int(s[key]) / MiB)
                for s in group
                if s.get(key) is not None and _x(s, by_step, start_time) is not None
            ]
            if not points:
                continue
            xs, ys = zip(*points, strict=True)
            style = "--" if key == "peak_allocated_bytes" else "-"
            ax.plot(xs, ys, style, color=colour, linewidth=1.2, label=label + suffix)
    limit = _last(samples, "budget_bytes")
    limit_label = "budget"
    if limit is None:
        limit, limit_label = _last(samples, "total_bytes"), "device total"
    if limit is not None:
        ax.axhline(limit / MiB, color="#d62728", linestyle=":", linewidth=1.5, label=limit_label)
    leak = _leak(run) if by_step else None
    if leak is not None:
        x0, x1 = float(leak.start_step), float(leak.last_step)
        rate = leak.bytes_per_step
        y1 = leak.current_bytes
        label = f"growth {format_bytes(rate)}/step"
        if leak.projected_oom_step is not None:
            label += f", limit at step {leak.projected_oom_step}"
        ax.plot(
            [x0, x1],
            [(y1 - rate * (x1 - x0)) / MiB, y1 / MiB],
            color="#d62728",
            linestyle="-.",
            linewidth=1.0,
            label=label,
        )
    seen: set[str] = set()
    for event in run.events:
        x = _event_x(event, run.samples) if by_step else _event_time(event, start_time)
        if x is None:
            continue
        kind = str(event.get("kind"))
        ax.axvline(
            x,
            color=EVENT_COLOURS.get(kind, "#8c564b"),
            linewidth=0.9,
            alpha=0.7,
            label=kind if kind not in seen else None,
        )
        seen.add(kind)
    ax.set_xlabel("step" if by_step else "seconds since the first sample")
    ax.set_ylabel("MiB")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.set_title(title or (run.path.name if run.path is not None else "memfit run"))
    if ax.get_legend_handles_labels()[0]:
        ax.legend(
            loc="upper center",
            bbox_to_anchor=(0.5, -0.14),
            fontsize=8,
            ncol=5,
            frameon=False,
        )
    fig.tight_layout()
    return fig


def _leak(run: Run) -> Leak | None:
    samples = run.samples
    metric = "allocated_bytes"
    if not any(s.get(metric) is not None for s in samples):
        metric = "device_used_bytes"
    budget = _last(samples, "budget_bytes")
    return detect_leak(
        [s.get("step") for s in samples],
        [s.get(metric) for s in samples],
        metric=metric,
        limit_bytes=budget if budget is not None else _last(samples, "total_bytes"),
    )


def _x(sample: dict[str, Any], by_step: bool, start_time: float) -> float | None:
    if by_step:
        step = sample.get("step")
        return float(step) if step is not None else None
    when = sample.get("time")
    return float(when) - start_time if isinstance(when, (int, float)) else None


def _event_time(event: dict[str, Any], start_time: float) -> float | None:
    when = event.get("time")
    return float(when) - start_time if isinstance(when, (int, float)) else None


def _png_bytes(run: Run, title: str | None = None) -> bytes:
    fig = plot(run, title=title)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()


def write_png(run: Run, path: str | Path, *, title: str | None = None) -> Path:
    """Draw :func:`plot` into a PNG file.

    Args:
        run: A loaded run.
        path: Where to write.
        title: Figure title.

    Returns:
        The path written.

    Raises:
        ConfigError: When the file cannot be written.
        BackendUnavailable: When matplotlib is not installed.
    """
    target = Path(path)
    data = _png_bytes(run, title)
    _write_bytes(target, data)
    return target


def _write_bytes(target: Path, data: bytes) -> None:
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    except OSError as exc:
        raise file_error(exc, target, action="write the report") from exc


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;
max-width:980px;color:#222;padding:0 1em}
h1{font-size:1.4em}h2{font-size:1.1em;margin-top:1.6em}
table{border-collapse:collapse;margin:.5em 0;font-size:.92em}
th,td{border:1px solid #ccc;padding:.3em .6em;text-align:left;vertical-align:top}
th{background:#f3f3f3}img{max-width:100%;border:1px solid #ddd}
.note{color:#666;font-size:.88em}
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
    image = base64.b64encode(_png_bytes(run, name)).decode("ascii")
    esc = html.escape
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>memfit report: {esc(name)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>memfit report: {esc(name)}</h1>",
        f'<img alt="memory over steps" src="data:image/png;base64,{image}">',
        "<h2>Summary</h2><table>",
    ]
    for label, text in summary_rows(summary):
        parts.append(f"<tr><th>{esc(label)}</th><td>{esc(text)}</td></tr>")
    parts.append("</table>")
    if summary["growth"] is not None:
        g = summary["growth"]
        parts.append(
            '<p class="note">Growth test: Theil-Sen slope '
            f"{esc(format_bytes(g['bytes_per_step']))}/step, {g['confidence']:.0%} interval "
            f"{esc(format_bytes(g['lower_bytes_per_step']))} to "
            f"{esc(format_bytes(g['upper_bytes_per_step']))}/step over {g['samples']} "
            "samples.</p>"
        )
    parts.append(f"<h2>Events ({len(run.events)})</h2>")
    if run.events:
        parts.append("<table><tr><th>step</th><th>kind</th><th>source</th><th>message</th></tr>")
        for event in run.events[:max_events]:
            parts.append(
                "<tr>"
                f"<td>{esc(str(event.get('step')))}</td>"
                f"<td>{esc(str(event.get('kind')))}</td>"
                f"<td>{esc(str(event.get('source')))}</td>"
                f"<td>{esc(str(event.get('message')))}</td>"
                "</tr>"
            )
        parts.append("</table>")
        if len(run.events) > max_events:
            parts.append(
                f'<p class="note">{len(run.events) - max_events} more events not listed.</p>'
            )
    else:
        parts.append("<p>No guard or cleanup events were recorded.</p>")
    parts.append(
        '<p class="note">Sizes in binary units (1 MiB = 1,048,576 bytes). allocated: live '
        "tensors; reserved: held by the caching allocator; device used: as nvidia-smi shows "
        "it, contexts included.</p></body></html>"
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
    _write_bytes(target, render_html(run, title=title).encode("utf-8"))
    return target
