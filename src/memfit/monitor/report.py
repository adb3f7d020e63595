"""Turn a recorded run into a summary (here), a figure (:mod:`memfit.monitor.report_plot`) and
a self-contained HTML page (:mod:`memfit.monitor.report_html`).

Reads the JSON lines a :class:`memfit.Recorder` writes (``{"type": "sample"|"event"|...}``)
and the snapshot lines ``memfit watch --log`` appends. :func:`summarize` gives plain data
(peak, mean, growth, events); the figure shows memory over steps in MiB (as ``nvidia-smi``
counts), scaled to the data, with the budget as a line when it is near the data and as an inset
gauge when it is far above, and the guard / cleanup events in a strip below, one row per kind;
the page embeds the figure as base64 next to the tables.

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

import bisect
import json
import math
import os
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memfit._checks import require_count
from memfit._userfiles import file_error, read_user_bytes
from memfit.errors import ConfigError
from memfit.monitor._leaks import Leak, check_fragmentation, detect_leak
from memfit.units import MAX_BYTES, MiB, format_bytes

__all__ = [
    "EVENT_COLOURS",
    "SERIES",
    "Run",
    "event_steps",
    "last_value",
    "load_run",
    "parse_run",
    "run_leak",
    "size_text",
    "summarize",
    "summary_rows",
    "write_file_bytes",
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


SERIES = (
    ("allocated_bytes", "allocated", "#1f77b4"),
    ("reserved_bytes", "reserved", "#ff7f0e"),
    ("peak_allocated_bytes", "peak allocated", "#9467bd"),
    ("device_used_bytes", "device used", "#7f7f7f"),
    ("resident_bytes", "resident (host)", "#2ca02c"),
)

#: The sample series a leak is looked for in, first one present wins (as the Recorder).
_LEAK_METRICS = ("allocated_bytes", "device_used_bytes", "resident_bytes")

#: Byte figures a sample may carry: whole numbers from 0 to 16 EiB, or null.
_BYTE_FIELDS = (
    "allocated_bytes",
    "reserved_bytes",
    "peak_allocated_bytes",
    "peak_reserved_bytes",
    "device_used_bytes",
    "total_bytes",
    "budget_bytes",
    "resident_bytes",
)

#: Steps are whole numbers within a signed 64-bit counter.
_MAX_STEP = 2**63


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
        index: Which run of its file this is (1 for the first); a file several Recorders
            appended to holds one run per ``start`` record.
        count: How many runs the file holds.
    """

    path: Path | None = None
    samples: list[dict[str, Any]] = field(default_factory=list)
    background: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    index: int = 1
    count: int = 1

    def has_records(self) -> bool:
        """Whether the run holds a sample or an event."""
        return bool(self.samples or self.background or self.events)


def load_run(path: str | Path, *, run: int | None = None) -> Run:
    """Read a Recorder JSON-lines file (or a ``memfit watch --log`` file).

    Blank lines are skipped; ``start`` / ``end`` records fill :attr:`Run.meta`; a cut-off
    last line is skipped with a warning (see :func:`parse_run`). A file several runs were
    appended to is split at their ``start`` records: the last run is returned unless ``run``
    picks one.

    Args:
        path: The file.
        run: Which run of the file (1 for the first); ``None`` for the last.

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
    loaded = parse_run(data, source=str(source), run=run)
    loaded.path = source
    return loaded


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


def parse_run(data: bytes | str, *, source: str = "<run>", run: int | None = None) -> Run:
    """Parse the bytes of a run log (see :func:`load_run`).

    A last line with no line break after it that is not a whole JSON object, after whole
    records, is the normal end of a log whose writer was stopped mid-line: it is skipped and
    said so in :attr:`Run.warnings`. A bad line anywhere else is an error. Each ``start``
    record after the first begins a new run (a Recorder appending to an existing file).

    Args:
        data: The log's content.
        source: Its name in messages (a path, or ``"<stdin>"``).
        run: Which run of the file (1 for the first); ``None`` for the last.

    Returns:
        The :class:`Run` (its ``path`` is ``None``), with :attr:`Run.index` and
        :attr:`Run.count`.

    Raises:
        ConfigError: As :func:`load_run` does, ``key_path`` ``SOURCE:LINE``; or when ``run``
            is not one of the file's runs.
    """
    require_count(
        "run",
        run,
        lo=1,
        optional=True,
        hint="pass 1 for the first run of the file; leave it out for the last",
    )
    raw = data.encode("utf-8") if isinstance(data, str) else data
    lines = raw.split(b"\n")
    cut_off = len(lines) if not raw.endswith(b"\n") else None
    runs = [Run()]
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{source}:{number}"
        current = runs[-1]
        try:
            record = _record(line, number, where)
        except ConfigError as exc:
            whole_before = any(r.has_records() or r.meta for r in runs)
            if number != cut_off or not whole_before:  # one bad line alone is no log
                raise
            current.warnings.append(
                f"{where}: the last line is cut off (its writer stopped mid-line); skipped "
                f"it ({exc.message.removeprefix(where + ': ')})"
            )
            continue
        if record.get("type") == "start" and (current.has_records() or current.meta):
            current = Run()
            runs.append(current)
        _add_record(current, record, where)
    if not any(r.has_records() for r in runs):
        raise ConfigError(
            "the file holds no memory samples and no events", key_path=source, hint=_HINT
        )
    for number, each in enumerate(runs, start=1):
        each.index, each.count = number, len(runs)
    if run is None:
        chosen = next(r for r in reversed(runs) if r.has_records())
    elif run > len(runs):
        raise ConfigError(
            f"the file holds {len(runs)} run(s), not {run}",
            key_path="run",
            hint=f"pick one of 1 to {len(runs)} (each Recorder start begins a run)",
        )
    else:
        chosen = runs[run - 1]
        if not chosen.has_records():
            raise ConfigError(
                f"run {run} of the file holds no memory samples and no events",
                key_path="run",
                hint=f"pick another of 1 to {len(runs)}",
            )
    if chosen is not runs[-1]:
        chosen.warnings.extend(runs[-1].warnings)
    return chosen


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


def last_value(samples: list[dict[str, Any]], key: str) -> int | None:
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
    for key, _label, _colour in SERIES:
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
    budget = last_value(samples, "budget_bytes")
    total = last_value(samples, "total_bytes")
    growth = None
    if run.samples:
        leak = run_leak(run)
        growth = leak.to_dict() if leak is not None else None
    readable = any(s.get(key) is not None for s in run.samples for key in _LEAK_METRICS)
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
        "growth_known": readable,
        "run": run.index,
        "runs": run.count,
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
    if summary.get("runs", 1) > 1:
        rows.append(
            (
                "run",
                f"{summary['run']} of {summary['runs']} in this file (each Recorder start "
                "begins one; --run N shows another)",
            )
        )
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
    for key, label, _colour in SERIES:
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
    if growth is None and not summary.get("growth_known", True):
        rows.append(("growth", "cannot tell: no step sample carries a memory figure"))
    elif growth is None:
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


def run_leak(run: Run) -> Leak | None:
    samples = run.samples
    metric = next(
        (m for m in _LEAK_METRICS if any(s.get(m) is not None for s in samples)),
        "allocated_bytes",
    )
    budget = last_value(samples, "budget_bytes")
    return detect_leak(
        [s.get("step") for s in samples],
        [s.get(metric) for s in samples],
        metric=metric,
        limit_bytes=budget if budget is not None else last_value(samples, "total_bytes"),
    )


def write_file_bytes(target: Path, data: bytes) -> None:
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    except OSError as exc:
        raise file_error(exc, target, action="write the report") from exc
