"""``memfit explain``'s output: the text report, and the timeline picture as PNG or HTML, drawn
from an :class:`~memfit.monitor.explanation.Explanation` (nothing here reads a snapshot)."""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path
from typing import Any

from memfit.monitor.explanation import (
    Explanation,
)
from memfit.units import MiB, format_bytes


def _when(event: int) -> str:
    return "at the first event" if event < 0 else f"after event {event}"


def render_text(e: Explanation) -> list[str]:
    """The explanation as lines of plain text (the CLI prints them)."""
    fb = format_bytes
    lines = [
        f"{e.source}: device {e.device}, {e.events} events, {e.frees} frees"
        + ("" if e.has_frames else ", no stack frames"),
        "",
        "1. Peaks",
        f"  reserved peak   {fb(e.peak_reserved_bytes)} ({_when(e.peak_reserved_event)})",
        f"  allocated peak  {fb(e.peak_allocated_bytes)} ({_when(e.peak_allocated_event)})",
    ]
    if e.start_reserved_bytes:
        lines.append(
            f"  at the first event: {fb(e.start_reserved_bytes)} reserved, "
            f"{fb(e.start_allocated_bytes)} allocated (recorded mid-run)"
        )
    lines.append(
        "  replay of the trace: "
        + (
            "exact (every reserved byte as recorded)"
            if e.replay_exact
            else f"up to {fb(e.replay_bytes_off)} off"
        )
    )
    if e.oom is not None:
        o = e.oom
        free = fb(o.device_free_bytes) if o.device_free_bytes is not None else "not recorded"
        lines += [
            f"  OUT OF MEMORY at event {o.event}: a request of {fb(o.requested_bytes)} failed",
            f"    driver's free memory {free}, "
            f"reserved {fb(o.reserved_bytes)}, allocated {fb(o.allocated_bytes)}, "
            f"largest free cached block {fb(o.largest_free_block_bytes)}",
        ]
    where = {"oom": "at the OOM", "peak": "at the peak", "end": "at the end"}.get(
        e.at, f"after event {e.at}"
    )
    lines += [
        "",
        f"2. Where the memory was {where} (event {e.at_event}): {fb(e.allocated_bytes)} live "
        f"of {fb(e.reserved_bytes)} reserved",
    ]
    for group in e.groups:
        lines.append(f"  by {group.by.replace('_', ' ')}:")
        for row in group.rows:
            lines.append(f"    {fb(row.bytes):>12}  {row.count:>6}  {row.name}")
        if group.other_count:
            lines.append(f"    {fb(group.other_bytes):>12}  {group.other_count:>6}  (the rest)")
    f = e.fragmentation
    lines += [
        "",
        "3. Fragmentation",
        f"  cached (reserved - allocated) {fb(f.cached_bytes)}: {fb(f.whole_segment_bytes)} in "
        f"free segments, {fb(f.split_bytes)} in segments live blocks keep split",
        f"  largest free block {fb(f.largest_free_block_bytes)}"
        + (
            f"; request {fb(f.request_bytes)}, {fb(f.too_small_bytes)} in free blocks too "
            "small for it"
            if f.request_bytes is not None
            else ""
        ),
    ]
    if f.split_by:
        lines.append("  keeping segments split:")
        for row in f.split_by[:5]:
            lines.append(f"    {fb(row.bytes):>12} free beside {row.count} blocks of {row.name}")
    lines += ["", "4. What if (the same requests replayed)"]
    cap = f" under {fb(e.capacity_bytes)}" if e.capacity_bytes is not None else ""
    if e.simulated:
        lines.append(
            "  (memfit.simulate_gpu counted allocated bytes only: the recorded run has no "
            "caching allocator to compare with; the rows are a real card of that size)"
        )
    for w in e.what_if:
        if e.simulated and w.name == "as recorded":
            continue  # the model's own placement of a run that had no allocator
        lines.append(f"  {w.name:<38} {_what_if_result(w, e.capacity_bytes, cap)}")
    lines += [f"  => {e.recommendation}", f"     {e.evidence}"]
    lines.append("  the replay cannot know: " + "; ".join(e.unknowns))
    lines += ["", "5. Leaks"]
    if e.steps < 3:
        lines.append(f"  {e.steps} repetitions of a step found: too few to tell growth")
    elif not e.leaks:
        lines.append(f"  none: no site grows over the {e.steps} repetitions of the step")
    for leak in e.leaks:
        lines.append(
            f"  {leak.site}: +{fb(leak.growth_per_step_bytes)} per step over {e.steps} steps"
        )
    if e.notes:
        lines += ["", "Notes"] + [f"  {n}" for n in e.notes]
    return lines


def _what_if_result(w: Any, capacity: int | None, cap: str) -> str:
    """One what-if row's outcome in words: its peak and whether every request fit."""
    fb = format_bytes
    peak = f"peak {fb(w.peak_reserved_bytes):>12}"
    if w.fits is None:
        return peak
    if w.fits:
        return f"{peak}  fits{cap}"
    if w.peak_reserved_bytes == 0:
        return f"{'':>17}  its first request does not fit{cap}"
    if capacity is not None and w.peak_reserved_bytes <= capacity:
        return f"{peak}  then a request does not fit{cap}"
    return f"{peak}  does not fit{cap}"


def _figure(e: Explanation) -> Any:
    """The timeline, drawn as ``memfit report`` draws a run (Agg canvas, MiB, its colours)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        from memfit.errors import BackendUnavailable

        raise BackendUnavailable(
            "memfit explain draws with matplotlib, which is not installed",
            hint="pip install 'memfit[plot]', or leave out -o",
        ) from exc
    from memfit.monitor.report import EVENT_COLOURS
    from memfit.monitor.report_plot import mib_ticks

    fig = Figure(figsize=(10, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    xs = [t[0] for t in e.timeline]
    allocated = [t[2] / MiB for t in e.timeline]
    if e.simulated:
        # a simulated GPU counts allocated bytes against its budget: no reserved line (the
        # model's placement past the card would draw memory the run never held)
        reserved = allocated
        peak_bytes, peak_x = e.peak_allocated_bytes, max(e.peak_allocated_event, 0)
        label = "allocated (memfit.simulate_gpu)"
    else:
        reserved = [t[1] / MiB for t in e.timeline]
        ax.plot(xs, reserved, color="#ff7f0e", label="reserved", linewidth=1.2)
        peak_bytes, peak_x = e.peak_reserved_bytes, max(e.peak_reserved_event, 0)
        label = "allocated"
    ax.plot(xs, allocated, color="#1f77b4", label=label, linewidth=1)
    ax.axvline(peak_x, color="#7f7f7f", linestyle=":", linewidth=1)
    ax.annotate(
        f"peak {format_bytes(peak_bytes)}",
        (peak_x, peak_bytes / MiB),
        textcoords="offset points",
        xytext=(6, -12),
        fontsize=8,
    )
    if e.oom is not None:
        at_oom = e.oom.allocated_bytes if e.simulated else e.oom.reserved_bytes
        ax.plot(
            [e.oom.event],
            [at_oom / MiB],
            marker="X",
            color=EVENT_COLOURS["oom"],
            markersize=10,
            linestyle="none",
            label="out of memory",
        )
    if e.capacity_bytes is not None and e.capacity_bytes <= 1.5 * peak_bytes:
        ax.axhline(
            e.capacity_bytes / MiB,
            color=EVENT_COLOURS["oom"],
            linestyle="--",
            linewidth=1,
            label="capacity",
        )
    group = e.group("site") or e.group("size")
    if group is not None and group.rows:
        prefix = "blocks of " if group.by == "size" else ""
        text = "\n".join(
            f"{format_bytes(r.bytes):>10}  {prefix}{r.name[:60]}" for r in group.rows[:5]
        )
        ax.text(
            0.01,
            0.98,
            f"live at the {e.at if not e.at.isdigit() else 'event ' + e.at}:\n{text}",
            transform=ax.transAxes,
            fontsize=7,
            va="top",
            family="monospace",
            bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "#cccccc"},
        )
    ax.set_xlabel("trace event")
    ax.set_ylabel("MiB")
    top = max(max(reserved, default=0.0), (e.capacity_bytes or 0) / MiB if e.simulated else 0.0)
    ax.set_ylim(bottom=0, top=max(top * 1.25, 1.0))
    mib_ticks(ax, top)
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title(f"{Path(e.source).name}: device {e.device}", fontsize=10)
    fig.tight_layout()
    return fig


def png_bytes(e: Explanation) -> bytes:
    """The timeline as PNG bytes (matplotlib, Agg)."""
    buffer = io.BytesIO()
    _figure(e).savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()


def render_html(e: Explanation) -> str:
    """One self-contained HTML page: the timeline (embedded PNG) and the text report."""
    image = base64.b64encode(png_bytes(e)).decode("ascii")
    body = html.escape("\n".join(render_text(e)))
    title = html.escape(f"memfit explain: {Path(e.source).name}")
    return (
        "<!DOCTYPE html>\n<html><head><meta charset='utf-8'>"
        f"<title>{title}</title>"
        "<style>body{font-family:sans-serif;margin:2em}pre{font-size:13px}</style></head>"
        f"<body><h1>{title}</h1>"
        f"<img alt='allocated and reserved over the trace' src='data:image/png;base64,{image}'>"
        f"<pre>{body}</pre></body></html>\n"
    )
