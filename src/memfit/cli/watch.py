"""``memfit watch``: a live view of every GPU's memory and the processes holding it.

Replaces ``watch -n 1 nvidia-smi``: per GPU a used/total bar (NVML v2, so reserved memory is
shown apart), the driver's reserve, utilisation and a history sparkline; per process its
pid, user, command and GPU memory. Sizes are in MiB, as ``nvidia-smi`` shows them, so the two
can be compared at a glance. Figures a driver cannot give (containers, WSL, MIG) show
``N/A`` with the reason. ``--log FILE`` is checked before anything else (a file it can append
to, not a pipe or a device), also on a machine without a GPU.
"""

from __future__ import annotations

import math
import time
from typing import Any

import typer
from rich.console import Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from memfit.backends.base import DeviceProbe, DeviceSnapshot, SystemSnapshot
from memfit.cli._common import JSON_OPTION, err_console, out_console, print_json, safe
from memfit.cli._files import check_append
from memfit.errors import ConfigError
from memfit.monitor.watch import (
    Watcher,
    WatchFrame,
    append_log,
    field_note,
    frame_record,
    sparkline,
    used_fraction,
)
from memfit.units import format_mib

__all__ = ["make_probe", "register", "render_frame"]

_BAR_WIDTH = 20
_SPARK_WIDTH = 20


def make_probe() -> tuple[DeviceProbe | None, list[str]]:
    """The probe ``memfit watch`` reads (NVML, else torch), and why better ones were skipped."""
    from memfit.backends import local_probe

    return local_probe()


def _bar(fraction: float | None) -> Text:
    if fraction is None:
        return Text("N/A")
    filled = round(fraction * _BAR_WIDTH)
    colour = "green" if fraction < 0.7 else "yellow" if fraction < 0.9 else "red"
    bar = Text("█" * filled, style=colour)
    bar.append("░" * (_BAR_WIDTH - filled), style="dim")
    bar.append(f" {fraction:4.0%}")
    return bar


def _size(value: int | None) -> str:
    return format_mib(value) if value is not None else "N/A"


def _missing(device: DeviceSnapshot) -> list[tuple[str, str]]:
    """``(field, reason)`` for each shown field of ``device`` that is ``None``."""
    out: list[tuple[str, str]] = []
    checks = (
        ("memory", device.device_used_bytes is None or device.total_bytes is None),
        ("reserved", device.driver_reserved_bytes is None and device.backend == "nvml"),
        ("utilization", device.utilization_percent is None and device.backend == "nvml"),
        (
            "processes",
            any(p.used_bytes is None or p.name is None for p in device.processes),
        ),
    )
    for field, is_missing in checks:
        if is_missing:
            out.append((field, field_note(device, field) or "the driver did not report it"))
    return out


def render_frame(frame: WatchFrame) -> RenderableType:
    """Rich renderable of one frame: the GPU table, the process table, the N/A reasons."""
    snap = frame.snapshot
    title = f"memfit watch · {snap.source}"
    if snap.driver_version:
        title += f" · driver {snap.driver_version}"
    title += f" · {time.strftime('%H:%M:%S', time.localtime(frame.time))}"
    gpus = Table(title=title, title_justify="left", expand=False)
    gpus.add_column("GPU", max_width=20)
    gpus.add_column("memory (used / total)", no_wrap=True)
    gpus.add_column("util", justify="right", no_wrap=True)
    gpus.add_column("history", no_wrap=True)
    procs = Table(title="processes", title_justify="left", expand=False)
    procs.add_column("GPU", justify="right")
    procs.add_column("pid", justify="right")
    procs.add_column("user")
    procs.add_column("command", overflow="ellipsis", max_width=60)
    procs.add_column("GPU memory", justify="right")
    notes: list[str] = []
    for device in snap.devices:
        util = f"{device.utilization_percent}%" if device.utilization_percent is not None else "N/A"
        memory = _bar(used_fraction(device))
        memory.append(
            f"\n{_size(device.device_used_bytes)} / {_size(device.total_bytes)}", style="bold"
        )
        if device.backend == "nvml" or device.driver_reserved_bytes is not None:
            memory.append(f"\ndriver reserved {_size(device.driver_reserved_bytes)}", style="dim")
        if device.allocated_bytes is not None:
            memory.append(f"\nallocated {_size(device.allocated_bytes)}", style="dim")
        if device.allocator_reserved_bytes is not None:
            memory.append(
                f"\nallocator reserved {_size(device.allocator_reserved_bytes)}", style="dim"
            )
        gpus.add_row(
            f"{device.index}: {safe(device.name)}",
            memory,
            util,
            sparkline(frame.history.get(device.index, ()), _SPARK_WIDTH),
        )
        for proc in device.processes:
            procs.add_row(
                str(device.index),
                str(proc.pid) if proc.pid is not None else "N/A",
                safe(proc.user) if proc.user else "N/A",
                safe(proc.command or proc.name or "N/A"),
                _size(proc.used_bytes),
            )
        for field, reason in _missing(device):
            notes.append(f"GPU {device.index} {field}: N/A because {reason}")
    parts: list[RenderableType] = [gpus]
    if procs.row_count:
        parts.append(procs)
    else:
        parts.append(Text("no processes on the GPUs (or none visible)", style="dim"))
    for item in frame.imbalance:
        parts.append(
            Text(
                f"warning: GPU {item['device']}'s peak {_size(item['peak_bytes'])} is "
                f"{100 * item['excess']:.0f}% above the other GPUs' ({_size(item['others_bytes'])},"
                f" median) since {time.strftime('%H:%M:%S', time.localtime(item['since']))} "
                f"(frame {item['since_frame']})",
                style="bold yellow",
            )
        )
    for note in [*notes, *snap.notes]:
        parts.append(Text(note, style="dim"))
    return Group(*parts)


def _no_gpu(reasons: list[str], as_json: bool) -> None:
    if as_json:
        print_json(
            SystemSnapshot(source="none", devices=(), notes=("no GPU found", *reasons)).to_dict()
        )
        return
    why = "; ".join(reasons) if reasons else "no probe could look"
    out_console.print(f"No GPU to watch: {safe(why)}", soft_wrap=True)


def watch(
    interval: float = typer.Option(
        1.0, "--interval", "-n", help="Seconds between frames.", show_default=True
    ),
    once: bool = typer.Option(False, "--once", help="Print one frame and exit."),
    as_json: bool = JSON_OPTION,
    log: str | None = typer.Option(
        None, "--log", help="Append every frame as one JSON line to this file."
    ),
    pid: list[int] | None = typer.Option(
        None, "--pid", help="Show only this process (repeat for more)."
    ),
    count: int | None = typer.Option(
        None, "--count", help="Stop after this many frames (default: until Ctrl-C)."
    ),
    imbalance: float | None = typer.Option(
        None,
        "--imbalance",
        help="Warn when a GPU's peak is this fraction above the other GPUs' (0.2: 20%; "
        "one rank per GPU under torchrun).",
    ),
    prometheus: str | None = typer.Option(
        None,
        "--prometheus",
        help="Serve per-GPU and per-process memory as Prometheus metrics at this address "
        "while the live view runs (:9400 on every interface, 127.0.0.1:9400 on one; needs "
        "prometheus-client; not with --once or --json).",
    ),
) -> None:
    """Live view of GPU memory per device and per process (like `watch nvidia-smi`)."""
    if not math.isfinite(interval) or interval <= 0:
        raise ConfigError(
            f"must be a positive number of seconds, not {interval!r}",
            key_path="--interval",
            hint="use --interval 1 for one frame a second",
        )
    if count is not None and count < 1:
        raise ConfigError(
            f"must be at least 1, not {count}",
            key_path="--count",
            hint="leave --count out to watch until Ctrl-C, or use --once for one frame",
        )
    if imbalance is not None and not (math.isfinite(imbalance) and imbalance > 0):
        raise ConfigError(
            f"must be a positive fraction, not {imbalance!r}",
            key_path="--imbalance",
            hint="use --imbalance 0.2 to flag a GPU 20% above the others",
        )
    if log is not None:  # a bad --log is an error on any machine, GPU or not
        check_append(log, what="the watch log", option="--log")
    if prometheus is not None:
        if once or as_json:
            raise ConfigError(
                "--prometheus serves while the live view runs; --once and --json stop after "
                "one frame",
                key_path="--prometheus",
                hint="drop --once/--json (add --count N to stop after N frames)",
            )
        from memfit.integrations.prometheus import parse_address

        # a bad address is an error on any machine, GPU or not
        parse_address(prometheus, key_path="--prometheus")
    probe, reasons = make_probe()
    if probe is None:
        _no_gpu(reasons, as_json)
        return
    watcher = Watcher(probe, history=_SPARK_WIDTH, pids=pid or None, imbalance=imbalance)
    frame = watcher.frame()
    if not frame.snapshot.devices:
        _no_gpu([*reasons, *frame.snapshot.notes], as_json)
        return
    if log is not None:
        append_log(log, frame)
    if as_json:
        print_json(frame_record(frame))
        return
    if once:
        out_console.print(render_frame(frame))
        return
    exporter = _exporter(prometheus)
    shown = 1
    try:
        if exporter is not None:
            exporter.snapshot(frame.snapshot)
        with Live(render_frame(frame), console=out_console, auto_refresh=False) as live:
            while count is None or shown < count:
                time.sleep(interval)
                frame = watcher.frame()
                if log is not None:
                    append_log(log, frame)
                if exporter is not None:
                    exporter.snapshot(frame.snapshot)
                live.update(render_frame(frame), refresh=True)
                shown += 1
    except KeyboardInterrupt:
        return
    finally:
        if exporter is not None:
            exporter.close()


def _exporter(address: str | None) -> Any:
    """The Prometheus sink serving at ``address``, or ``None`` without one."""
    if address is None:
        return None
    from memfit.integrations.prometheus import PrometheusSink

    sink = PrometheusSink(address)
    err_console.print(
        f"serving Prometheus metrics on http://{sink.host or '0.0.0.0'}:{sink.port}/metrics"
    )
    return sink


def register(app: typer.Typer) -> None:
    """Add ``memfit watch`` to ``app``."""
    app.command("watch")(watch)
