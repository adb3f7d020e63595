"""Turn a recorded run into a summary, a figure and a self-contained HTML page.

Reads the JSON lines a :class:`memfit.Recorder` writes (``{"type": "sample"|"event"|...}``)
and the snapshot lines ``memfit watch --log`` appends. :func:`summarize` gives plain data
(peak, mean, growth, events), :func:`plot` a matplotlib figure (Agg backend, no display needed)
of memory over steps in MiB (as ``nvidia-smi`` counts), scaled to the data, with the budget
as a line when it is near the data and as an inset gauge when it is far above, and the guard /
cleanup events in a strip below, one row per kind; :func:`write_html` one HTML file with the
figure embedded as base64 and the tables.

A run log is read as untrusted input: a value that is not what the Recorder writes (a string
or NaN where bytes go, a number beyond 16 EiB, JSON nested thousands deep) is an error that
names its line. The last line of a log whose writer was killed is often cut off; it is skipped
with a warning (:attr:`Run.warnings`), since the lines before it are whole.

Events are drawn at the training step during which they happened: their own ``step`` when it
agrees with their time (it lies between the steps of the samples taken just before and just
after), otherwise the step of the first sample taken after them. A guard that counts its own
updates, or an event with no step, is so still drawn where it happened (:func:`event_steps`).
"""

from __future__ import annotations

import base64
import bisect
import html
import io
import json
import math
import os
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memfit._userfiles import file_error, read_user_bytes
from memfit.errors import ConfigError
from memfit.monitor._leaks import Leak, check_fragmentation, detect_leak
from memfit.units import MAX_BYTES, MiB, format_bytes

__all__ = [
    "EVENT_COLOURS",
    "Run",
    "event_rows",
    "event_steps",
    "load_run",
    "parse_run",
    "plot",
    "png_bytes",
    "render_html",
    "size_text",
    "step_text",
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

#: Marker shapes by event kind, so kinds differ without colour too.
_EVENT_MARKERS: dict[str, str] = {
    "oom": "X",
    "retry": "o",
    "split": "v",
    "grow_back": "^",
    "cleanup": "s",
    "give_up": "P",
    "restore": "D",
}

_SERIES = (
    ("allocated_bytes", "allocated", "#1f77b4"),
    ("reserved_bytes", "reserved", "#ff7f0e"),
    ("peak_allocated_bytes", "peak allocated", "#9467bd"),
    ("device_used_bytes", "device used", "#7f7f7f"),
)

#: Byte figures a sample may carry: whole numbers from 0 to 16 EiB, or null.
_BYTE_FIELDS = (
    "allocated_bytes",
    "reserved_bytes",
    "peak_allocated_bytes",
    "peak_reserved_bytes",
    "device_used_bytes",
    "total_bytes",
    "budget_bytes",
)

#: Steps are whole numbers within a signed 64-bit counter.
_MAX_STEP = 2**63

#: The budget is drawn as a line when it is at most this many times the data's top; above,
#: a line would flatten the curves, so an inset gauge shows it instead.
_BUDGET_LINE_RATIO = 1.5


@dataclass
class Run:
    """A recorded run, as loaded from its file.

    Attributes:
        path: The file it came from, or ``None``.
        samples: Step samples, in file order.
        background: Background (and ``memfit watch``) samples, in file order.
        events: Event records (``kind``, ``step``, ``source``, ``message``, ``data``, ``time``).
        meta: The ``start`` record, if there was one.
        warnings: What was skipped while reading (a cut-off last line), for the reader.
    """

    path: Path | None = None
    samples: list[dict[str, Any]] = field(default_factory=list)
    background: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def load_run(path: str | Path) -> Run:
    """Read a Recorder JSON-lines file (or a ``memfit watch --log`` file).

    Blank lines are skipped; ``start`` / ``end`` records fill :attr:`Run.meta`; a cut-off
    last line is skipped with a warning (see :func:`parse_run`).

    Args:
        path: The file.

    Returns:
        The :class:`Run`.

    Raises:
        ConfigError: When the file is missing, unreadable or not a regular file (a pipe, a
            device, a folder), a line is not a JSON object or holds a value no Recorder
            writes (``key_path`` is ``FILE:LINE``), or the file holds neither a sample nor
            an event (a run that died before its first step still has its OOM events).
    """
    source = Path(path)
    if _missing(source):
        raise ConfigError("no such file", key_path=str(source), hint=_HINT)
    data = read_user_bytes(source, what="the run log", hint=_HINT)
    run = parse_run(data, source=str(source))
    run.path = source
    return run


def _missing(path: Path) -> bool:
    """Whether nothing is at ``path`` (a path the system cannot look up, such as a name too
    long, is left to the reader, which says what is wrong)."""
    try:
        os.stat(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return False


def parse_run(data: bytes | str, *, source: str = "<run>") -> Run:
    """Parse the bytes of a run log (see :func:`load_run`).

    A last line with no line break after it that is not a whole JSON object, after whole
    records, is the normal end of a log whose writer was stopped mid-line: it is skipped and
    said so in :attr:`Run.warnings`. A bad line anywhere else is an error.

    Args:
        data: The log's content.
        source: Its name in messages (a path, or ``"<stdin>"``).

    Returns:
        The :class:`Run` (its ``path`` is ``None``).

    Raises:
        ConfigError: As :func:`load_run` does, ``key_path`` ``SOURCE:LINE``.
    """
    raw = data.encode("utf-8") if isinstance(data, str) else data
    lines = raw.split(b"\n")
    cut_off = len(lines) if not raw.endswith(b"\n") else None
    run = Run()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{source}:{number}"
        try:
            record = _record(line, number, where)
        except ConfigError as exc:
            whole_before = run.samples or run.background or run.events or run.meta
            if number != cut_off or not whole_before:  # one bad line alone is no log
                raise
            run.warnings.append(
                f"{where}: the last line is cut off (its writer stopped mid-line); skipped "
                f"it ({exc.message.removeprefix(where + ': ')})"
            )
            continue
        _add_record(run, record, where)
    if not run.samples and not run.background and not run.events:
        raise ConfigError(
            "the file holds no memory samples and no events", key_path=source, hint=_HINT
        )
    return run


def _record(line: bytes, number: int, where: str) -> dict[str, Any]:
    """One line as a JSON object.

    Raises:
        ConfigError: When it is not UTF-8, not JSON, nested too deeply, or not an object.
    """
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"line {number} is not UTF-8 text (byte 0x{line[exc.start]:02x} at column "
            f"{exc.start + 1})",
            key_path=where,
            hint=_HINT,
        ) from None
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"line {number} is not JSON: {exc.msg} (column {exc.colno})",
            key_path=where,
            hint=_HINT + "; a run cut off mid-line can be repaired by deleting that line",
        ) from None
    except RecursionError:
        raise ConfigError(
            f"line {number} is nested too deeply to be a Recorder record",
            key_path=where,
            hint=_HINT,
        ) from None
    except ValueError as exc:  # e.g. an integer of thousands of digits
        raise ConfigError(f"line {number} is not JSON: {exc}", key_path=where, hint=_HINT) from None
    if not isinstance(record, dict):
        raise ConfigError(
            f"line {number} is not a JSON object but {type(record).__name__}",
            key_path=where,
            hint=_HINT,
        )
    return record


def _add_record(run: Run, record: dict[str, Any], where: str) -> None:
    kind = record.get("type")
    if kind == "start":
        run.meta.update(record)
    elif kind == "end":
        run.meta["end"] = record
    elif kind == "event":
        _check_event(record, where)
        run.events.append(record)
    elif kind == "sample" or (kind is None and "step" in record and "devices" not in record):
        _check_sample(record, where)
        if record.get("mode") == "background":
            run.background.append(record)
        else:
            run.samples.append(record)
    elif kind is None and isinstance(record.get("devices"), list):
        for sample in _snapshot_samples(record, where):
            _check_sample(sample, where)
            run.background.append(sample)
    else:
        raise ConfigError(f"unknown record type {_short(kind)}", key_path=where, hint=_HINT)


def _short(value: Any) -> str:
    """``repr(value)``, cut to 40 characters for a message."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _bad(key: str, value: Any, what: str, where: str) -> ConfigError:
    return ConfigError(
        f"{key} must be {what}, not {_short(value)}", key_path=f"{where}.{key}", hint=_HINT
    )


def _check_whole(record: dict[str, Any], key: str, where: str, low: int, high: int) -> None:
    value = record.get(key)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(key, value, "a whole number or null", where)
    if not low <= value <= high:
        limit = "16 EiB" if high == MAX_BYTES else "2**63"
        raise _bad(key, value, f"between {low} and {limit}", where)


def _check_real(record: dict[str, Any], key: str, where: str) -> None:
    value = record.get(key)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(key, value, "a number or null", where)
    if not math.isfinite(value) or abs(value) > 1e18:
        raise _bad(key, value, "a finite number", where)
    if key == "step_seconds" and value < 0:
        raise _bad(key, value, "a number of seconds, not negative", where)


def _check_sample(record: dict[str, Any], where: str) -> None:
    _check_whole(record, "step", where, -_MAX_STEP, _MAX_STEP)
    _check_whole(record, "device_index", where, 0, _MAX_STEP)
    for key in _BYTE_FIELDS:
        _check_whole(record, key, where, 0, MAX_BYTES)
    _check_real(record, "time", where)
    _check_real(record, "step_seconds", where)


def _check_event(record: dict[str, Any], where: str) -> None:
    _check_whole(record, "step", where, -_MAX_STEP, _MAX_STEP)
    _check_real(record, "time", where)
    kind = record.get("kind")
    if not isinstance(kind, str) or not kind.strip():
        raise _bad("kind", kind, "a name such as 'oom' or 'cleanup'", where)
    if record.get("step") is None and record.get("time") is None:
        raise ConfigError(
            "an event needs its step or its time (it has neither)",
            key_path=where,
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


def event_steps(run: Run) -> list[int | None]:
    """The step each event of ``run`` happened at, for drawing and listing it.

    An event's own ``step`` is used when it agrees with the event's time: the samples taken
    just before and just after the event bracket it (``before < step <= after``). Otherwise
    (a guard counting its updates rather than the training steps, a cleanup policy given no
    step) the event is placed at the step of the first sample taken after it, the step
    during which it happened. An event after the last sample happened in a step that was
    never sampled (the run ended or died in it): its own step when it is within the sampling
    interval after the last sample, else the step after the last sample. Without a time, or
    without step samples to place it by, an event keeps its own step (or ``None``).

    Args:
        run: A loaded run.

    Returns:
        One entry per event of ``run.events``, in order.
    """
    timed = [
        (float(s["time"]), int(s["step"]))
        for s in run.samples
        if s.get("time") is not None and s.get("step") is not None
    ]
    timed.sort()
    times = [t for t, _ in timed]
    every = run.meta.get("every")
    interval = every if isinstance(every, int) and not isinstance(every, bool) and every > 0 else 1
    out: list[int | None] = []
    for event in run.events:
        own = event.get("step")
        when = event.get("time")
        if when is None or not timed:
            out.append(own)
            continue
        after = bisect.bisect_left(times, float(when))
        if after < len(timed):
            after_step = timed[after][1]
            before_step = timed[after - 1][1] if after > 0 else None
            agrees = (
                own is not None and (before_step is None or before_step < own) and own <= after_step
            )
            out.append(own if agrees else after_step)
        else:
            last = timed[-1][1]
            agrees = own is not None and last < own <= last + interval
            out.append(own if agrees else last + 1)
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
        :class:`~memfit.monitor.recorder.Leak` as a dict, or ``None``), ``fragmentation``,
        ``events`` (counts by kind) and ``warnings`` (what reading skipped).
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
        "warnings": list(run.warnings),
    }


def size_text(nbytes: int | float) -> str:
    """A size as the report shows it: MiB with one decimal, as ``nvidia-smi`` counts
    (``"54.5 MiB"``, ``"3,529.0 MiB"``); below 1 MiB in KiB or bytes.

    >>> size_text(54.5 * 2**20), size_text(8 * 1024), size_text(-3 * 2**20)
    ('54.5 MiB', '8.00 KiB', '-3.0 MiB')
    """
    if abs(nbytes) < MiB:
        return format_bytes(nbytes)
    return f"{nbytes / MiB:,.1f} MiB"


def summary_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """The summary as ``(label, text)`` rows for a table (sizes in MiB, see :func:`size_text`).

    Args:
        summary: Output of :func:`summarize`.

    Returns:
        The rows.
    """
    rows: list[tuple[str, str]] = []
    first, last = summary["first_step"], summary["last_step"]
    if first is not None:
        rows.append(("steps", f"{first} to {last} ({summary['samples']} samples)"))
    elif summary["background_samples"]:
        rows.append(("steps", f"none (background samples only: {summary['background_samples']})"))
    else:
        rows.append(("steps", "none: no memory sample, only events (the run ended before a step)"))
    if summary["source"]:
        rows.append(("source", str(summary["source"])))
    if summary["duration_seconds"] is not None:
        rows.append(("duration", f"{summary['duration_seconds']:.1f} s"))
    if summary["median_step_seconds"] is not None:
        rows.append(("median step time", f"{summary['median_step_seconds'] * 1000:.2f} ms"))
    if not summary["metrics"] and (summary["samples"] or summary["background_samples"]):
        rows.append(
            (
                "memory",
                "none recorded: the memory source gave no figures (JAX on a CPU, or no GPU)",
            )
        )
    for key, label, _colour in _SERIES:
        m = summary["metrics"].get(key)
        if m is None:
            continue
        rows.append(
            (
                label,
                f"peak {size_text(m['peak'])}, mean {size_text(m['mean'])}, "
                f"last {size_text(m['last'])} ({_signed(m['change'])} over the run)",
            )
        )
    if summary["budget_bytes"] is not None:
        rows.append(("budget", size_text(summary["budget_bytes"])))
    if summary["total_bytes"] is not None:
        rows.append(("device total", size_text(summary["total_bytes"])))
    growth = summary["growth"]
    if growth is None:
        rows.append(("growth", "no steady growth found"))
    else:
        text = f"{size_text(growth['bytes_per_step'])}/step since step {growth['start_step']}"
        if growth["projected_oom_step"] is not None:
            text += f"; reaches the limit around step {growth['projected_oom_step']}"
        rows.append(("growth (leak?)", text))
    frag = summary["fragmentation"]
    if frag is not None:
        rows.append(
            (
                "fragmentation",
                f"{size_text(frag['slack_bytes'])} reserved but unused "
                f"({frag['fraction']:.0%}); try expandable_segments:True",
            )
        )
    events = summary["events"]
    rows.append(("events", ", ".join(f"{k} x{v}" for k, v in sorted(events.items())) or "none"))
    for warning in summary.get("warnings", ()):
        rows.append(("warning", warning))
    return rows


def _signed(value: int) -> str:
    if value == 0:
        return "+0 MiB"
    return ("+" if value > 0 else "") + size_text(value)


# -- figure ---------------------------------------------------------------------------------


def _series_points(
    samples: list[dict[str, Any]], key: str, by_step: bool, start_time: float
) -> list[tuple[float, float]]:
    """``(x, MiB)`` points of one series."""
    points = []
    for sample in samples:
        value = sample.get(key)
        x = _x(sample, by_step, start_time)
        if value is not None and x is not None:
            points.append((x, int(value) / MiB))
    return points


def _kind_order(kinds: set[str]) -> list[str]:
    """Event kinds in reading order: what went wrong first, then what memfit did."""
    known = ["oom", "give_up", "retry", "split", "restore", "grow_back", "cleanup"]
    return [k for k in known if k in kinds] + sorted(kinds - set(known))


def _mib_ticks(ax: Any, span: float) -> None:
    from matplotlib.ticker import FuncFormatter

    decimals = 0 if span >= 5 else 1 if span >= 0.5 else 2
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.{decimals}f}"))


def _inset_corner(
    points: list[tuple[float, float]], xlim: tuple[float, float], ylim: tuple[float, float]
) -> str:
    """The top corner of the axes with fewer data points under it: ``"left"`` or ``"right"``."""
    (x0, x1), (y0, y1) = xlim, ylim
    width, height = (x1 - x0) or 1.0, (y1 - y0) or 1.0
    left = right = 0
    for x, y in points:
        fx, fy = (x - x0) / width, (y - y0) / height
        if fy >= 0.72:
            if fx <= 0.42:
                left += 1
            elif fx >= 0.58:
                right += 1
    return "left" if left < right else "right"


def _budget_inset(ax: Any, corner: str, peak: float, limit: float, label: str) -> None:
    """A small gauge in a top corner: the whole budget, and the peak's share of it."""
    share = peak / limit if limit else 0.0
    x = 0.03 if corner == "left" else 0.57
    inset = ax.inset_axes((x, 0.84, 0.40, 0.045))
    inset.barh([0], [limit], color="#fbe3e3", height=1.0)
    inset.barh([0], [peak], color="#1f77b4", height=1.0)
    inset.axvline(peak, color="#1f77b4", linewidth=1.5)  # visible even at a tiny share
    inset.set_xlim(0, limit)
    inset.set_ylim(-0.5, 0.5)
    inset.set_xticks([])
    inset.set_yticks([])
    for spine in inset.spines.values():
        spine.set_color("#d62728")
        spine.set_linewidth(0.8)
    inset.set_title(
        f"{label} {limit:,.0f} MiB, off the scale: the peak ({peak:,.1f} MiB) is {share:.1%}",
        fontsize=8,
        loc="left",
        pad=2,
        color="#444444",
    )


def plot(run: Run, *, title: str | None = None) -> Any:
    """A matplotlib figure of memory over steps (or seconds, for background-only runs).

    The top axes hold allocated, reserved, peak allocated and device-used memory in MiB
    (where the run has them), scaled to the data. The budget (else the device total) is a
    dotted line when it is at most 1.5x the data's top; when it is far above, a line would
    squash the curves into a flat line at the bottom, so a gauge in a top corner shows the
    peak's share of it instead. A detected leak is a pale red band along the curve. Below, a
    strip with one
    row per event kind marks every event at the step it happened (:func:`event_steps`);
    events that share a step and a kind show their count. A run without memory figures (JAX
    on a CPU reports none) draws its step times instead.

    Args:
        run: A loaded run.
        title: Figure title; default: the file name.

    Returns:
        A ``matplotlib.figure.Figure`` (Agg canvas, not shown). ``fig.axes[0]`` is the memory
        axes; ``fig.axes[1]``, when there are events, the event strip.

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

    by_step = bool(run.samples)
    samples = run.samples if by_step else run.background
    start_time = min((float(s["time"]) for s in samples if s.get("time") is not None), default=0.0)
    placed = event_steps(run) if by_step else [_event_time(e, start_time) for e in run.events]
    drawn = [(e, x) for e, x in zip(run.events, placed, strict=True) if x is not None]
    kinds = _kind_order({str(e.get("kind")) for e, _ in drawn})

    fig = Figure(figsize=(10.0, 5.8 if kinds else 4.8), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    if kinds:
        grid = fig.add_gridspec(2, 1, height_ratios=[4.0, 0.5 + 0.32 * len(kinds)])
        ax = fig.add_subplot(grid[0])
        strip = fig.add_subplot(grid[1], sharex=ax)
    else:
        ax = fig.add_subplot(1, 1, 1)
        strip = None

    groups: dict[Any, list[dict[str, Any]]] = {}
    for sample in samples:
        groups.setdefault(None if by_step else sample.get("device_index"), []).append(sample)
    every_point: list[tuple[float, float]] = []
    for group_key, group in groups.items():
        suffix = f" (GPU {group_key})" if group_key is not None and len(groups) > 1 else ""
        for key, label, colour in _SERIES:
            points = _series_points(group, key, by_step, start_time)
            if not points:
                continue
            every_point.extend(points)
            xs, ys = zip(*points, strict=True)
            style = "--" if key == "peak_allocated_bytes" else "-"
            marker = "o" if len(points) == 1 else None
            ax.plot(xs, ys, style, color=colour, linewidth=1.4, marker=marker, label=label + suffix)

    ylabel = "memory (MiB, as nvidia-smi counts)"
    if not every_point:
        every_point = _step_time_points(samples, by_step, start_time)
        if every_point:
            xs, ys = zip(*every_point, strict=True)
            ax.plot(xs, ys, "-", color="#555555", linewidth=1.2, label="step time")
            ylabel = "step time (ms)"
            ax.text(
                0.5,
                0.96,
                "no memory figures in this run (the backend reported none, e.g. JAX on a "
                "CPU): step times shown",
                transform=ax.transAxes,
                ha="center",
                va="top",
                fontsize=8,
                color="#555555",
            )
    if not every_point and (run.samples or run.background):
        source = _last_text(samples, "source") or "unknown"
        ax.text(
            0.5,
            0.5,
            "Nothing to draw: the run recorded no memory figures and no step times\n"
            f"(memory source: {source}; JAX on a CPU, or a machine without a GPU, "
            "reports none).\nRecord it on the GPU to see its memory.",
            transform=ax.transAxes,
            ha="center",
            va="center",
            fontsize=10,
            color="#555555",
        )
        ax.set_yticks([])
        sampled = sorted({x for s in samples if (x := _x(s, by_step, start_time)) is not None})
        if sampled:  # the steps that were sampled, and nothing else
            ax.set_xticks(sampled)
            ax.set_xlim(sampled[0] - 1, sampled[-1] + 1)
    top = max((y for _, y in every_point), default=0.0)
    bottom = min((y for _, y in every_point), default=0.0)

    limit = _last(samples, "budget_bytes")
    limit_label = "budget"
    if limit is None:
        limit, limit_label = _last(samples, "total_bytes"), "device total"
    limit_mib = limit / MiB if limit is not None else None
    memory_drawn = ylabel.startswith("memory")
    line_limit = (
        memory_drawn
        and limit_mib is not None
        and (top <= 0 or limit_mib <= _BUDGET_LINE_RATIO * top)
    )
    if line_limit and limit_mib is not None:
        ax.axhline(limit_mib, color="#d62728", linestyle=":", linewidth=1.6, label=limit_label)
        top = max(top, limit_mib)

    leak = _leak(run) if by_step and memory_drawn else None
    if leak is not None:
        x0, x1 = float(leak.start_step), float(leak.last_step)
        rate = leak.bytes_per_step
        y1 = leak.current_bytes
        label = f"growth {size_text(rate)}/step"
        if leak.projected_oom_step is not None:
            label += f", limit at step {leak.projected_oom_step}"
        ax.plot(  # a wide pale band under the curve it fits, so both stay visible
            [x0, x1],
            [(y1 - rate * (x1 - x0)) / MiB, y1 / MiB],
            color="#d62728",
            linewidth=5.0,
            alpha=0.25,
            solid_capstyle="butt",
            zorder=1,
            label=label,
        )

    span_x = _span([x for _, x in drawn])
    for kind in ("oom", "give_up"):  # what went wrong, across the memory axes too
        marks = _binned([x for e, x in drawn if e.get("kind") == kind], span_x)
        if marks:  # one collection, thinned: a line per event took 1.5 ms each
            ax.vlines(
                sorted(marks),
                0.0,
                1.0,
                transform=ax.get_xaxis_transform(),
                colors=EVENT_COLOURS[kind],
                linewidth=0.8,
                alpha=0.35,
            )

    span = top - bottom
    low = 0.0 if bottom >= 0 and bottom <= 0.5 * top else bottom - 0.1 * (span or top or 1.0)
    high = top + 0.12 * (top - low or 1.0)
    if not line_limit and limit_mib is not None and memory_drawn and top > 0:
        high = top + 0.35 * (top - low or 1.0)  # room for the gauge above the curves
    ax.set_ylim(low, high)
    _mib_ticks(ax, high - low)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.set_title(title or (run.path.name if run.path is not None else "memfit run"), pad=22)
    if not line_limit and limit_mib is not None and memory_drawn and top > 0:
        peak = max(y for _, y in every_point)
        corner = _inset_corner(every_point, ax.get_xlim(), (low, high))
        _budget_inset(ax, corner, peak, limit_mib, limit_label)

    xlabel = "step" if by_step else "seconds since the first sample"
    if by_step:  # steps are whole numbers: no tick at 2.5
        from matplotlib.ticker import MaxNLocator

        (strip or ax).xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if strip is not None:
        _event_strip(strip, drawn, kinds)
        strip.set_xlabel(xlabel)
        ax.tick_params(axis="x", labelbottom=False)
    else:
        ax.set_xlabel(xlabel)
    if ax.get_legend_handles_labels()[0]:  # one row between the title and the axes
        ax.legend(
            loc="lower left",
            bbox_to_anchor=(0.0, 1.0),
            ncol=6,
            fontsize=8,
            frameon=False,
            borderaxespad=0.2,
        )
    return fig


#: Most markers (or lines) one event kind gets in the picture; more events are binned.
MAX_EVENT_MARKS = 400
#: Most "xN" count labels one kind gets (each is a text the renderer lays out).
MAX_EVENT_LABELS = 60


def _span(xs: list[float]) -> tuple[float, float]:
    return (min(xs), max(xs)) if xs else (0.0, 0.0)


def _binned(xs: list[float], span: tuple[float, float]) -> Counter[float]:
    """Events per position; when more than :data:`MAX_EVENT_MARKS` positions, per bin of
    ``span`` (at the bin's centre), so a run with 300,000 events draws in a second."""
    counts: Counter[float] = Counter(xs)
    lo, hi = span
    if len(counts) <= MAX_EVENT_MARKS or hi <= lo:
        return counts
    width = (hi - lo) / MAX_EVENT_MARKS
    binned: Counter[float] = Counter()
    for x, n in counts.items():
        index = min(int((x - lo) / width), MAX_EVENT_MARKS - 1)
        binned[lo + (index + 0.5) * width] += n
    return binned


def _event_strip(strip: Any, drawn: list[tuple[dict[str, Any], float]], kinds: list[str]) -> None:
    """One row per event kind; a marker per step with an event, its count when above one
    (binned when there are more than :data:`MAX_EVENT_MARKS` steps with events)."""
    rows = {kind: len(kinds) - 1 - i for i, kind in enumerate(kinds)}
    by_kind: dict[str, list[float]] = {kind: [] for kind in kinds}
    for e, x in drawn:
        by_kind.setdefault(str(e.get("kind")), []).append(x)
    span = _span([x for _, x in drawn])
    for kind in kinds:
        marks = _binned(by_kind[kind], span)
        xs = sorted(marks)
        colour = EVENT_COLOURS.get(kind, "#8c564b")
        strip.scatter(
            xs,
            [rows[kind]] * len(xs),
            marker=_EVENT_MARKERS.get(kind, "o"),
            color=colour,
            s=36,
            zorder=3,
        )
        labelled = [x for x in xs if marks[x] > 1]
        if len(labelled) > MAX_EVENT_LABELS:  # keep the largest counts
            labelled = sorted(sorted(labelled, key=lambda x: -marks[x])[:MAX_EVENT_LABELS])
        for x in labelled:
            n = marks[x]
            if n > 1:
                strip.annotate(
                    f"x{n}",
                    (x, rows[kind]),
                    xytext=(6, 2),
                    textcoords="offset points",
                    fontsize=8,
                    color=colour,
                )
    strip.set_yticks([rows[k] for k in kinds])
    strip.set_yticklabels(kinds, fontsize=8)
    for tick, kind in zip(strip.get_yticklabels(), kinds, strict=True):
        tick.set_color(EVENT_COLOURS.get(kind, "#8c564b"))
    strip.set_ylim(-0.7, len(kinds) - 0.3)
    strip.grid(True, axis="x", alpha=0.3)
    strip.set_ylabel("events", fontsize=8)


def _step_time_points(
    samples: list[dict[str, Any]], by_step: bool, start_time: float
) -> list[tuple[float, float]]:
    """``(x, milliseconds)`` of the step times, for a run without memory figures."""
    out = []
    for sample in samples:
        seconds = sample.get("step_seconds")
        x = _x(sample, by_step, start_time)
        if seconds is not None and x is not None:
            out.append((x, float(seconds) * 1000.0))
    return out


def _last_text(samples: list[dict[str, Any]], key: str) -> str | None:
    for sample in reversed(samples):
        if sample.get(key) is not None:
            return str(sample[key])
    return None


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
    return float(when) - start_time if when is not None else None


def _event_time(event: dict[str, Any], start_time: float) -> float | None:
    when = event.get("time")
    return float(when) - start_time if when is not None else None


def png_bytes(run: Run, *, title: str | None = None) -> bytes:
    """:func:`plot` as PNG bytes (for a writer of one's own, or an HTML page).

    Raises:
        BackendUnavailable: When matplotlib is not installed.
    """
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
    data = png_bytes(run, title=title)
    _write_bytes(target, data)
    return target


def _write_bytes(target: Path, data: bytes) -> None:
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    except OSError as exc:
        raise file_error(exc, target, action="write the report") from exc


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
    _write_bytes(target, render_html(run, title=title).encode("utf-8"))
    return target
