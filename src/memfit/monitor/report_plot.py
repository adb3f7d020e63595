"""``memfit report``'s picture: a recorded run's memory over steps or time, with its events,
the budget and a leak's trend (matplotlib, imported on first use)."""

from __future__ import annotations

import io
from collections import Counter
from pathlib import Path
from typing import Any

from memfit.monitor.report import (
    EVENT_COLOURS,
    SERIES,
    Run,
    event_steps,
    last_value,
    run_leak,
    size_text,
    write_file_bytes,
)
from memfit.units import MiB

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


#: The budget is drawn as a line when it is at most this many times the data's top; above,
#: a line would flatten the curves, so an inset gauge shows it instead.
_BUDGET_LINE_RATIO = 1.5


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


def mib_ticks(ax: Any, span: float) -> None:
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
        for key, label, colour in SERIES:
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

    limit = last_value(samples, "budget_bytes")
    limit_label = "budget"
    if limit is None:
        limit, limit_label = last_value(samples, "total_bytes"), "device total"
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

    leak = run_leak(run) if by_step and memory_drawn else None
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
    mib_ticks(ax, high - low)
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
    write_file_bytes(target, data)
    return target
