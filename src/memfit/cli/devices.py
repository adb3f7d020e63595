"""``memfit devices``: each GPU, its memory and its processes, now or from a saved snapshot.

With no GPU or no driver it says so in one line and exits 0 (with ``--json``: a snapshot
with zero devices and a note). ``--save FILE`` writes the snapshot as JSON so it can be
attached to a bug report (a new file, or ``--force``); ``--from-json FILE`` shows a saved one
(``-`` reads it from stdin).
"""

from __future__ import annotations

import json

import typer
from rich.table import Table

from memfit.backends import probe_all
from memfit.backends.base import DeviceSnapshot, SystemSnapshot
from memfit.cli._common import JSON_OPTION, err_console, out_console, print_json, safe
from memfit.cli._files import FORCE_OPTION, Output, read_input_text
from memfit.errors import ConfigError
from memfit.units import format_mib

_SNAPSHOT_HINT = "pass a file written by `memfit devices --save FILE`"

__all__ = ["devices", "register"]


def _mib(n: int | None) -> str:
    return format_mib(n) if n is not None else "?"


def _device_table(dev: DeviceSnapshot) -> Table:
    title = f"GPU {dev.index}: {safe(dev.name)}"
    table = Table(title=title, title_justify="left", show_header=False)
    table.add_column("field")
    table.add_column("value", justify="right")
    table.add_row("total", _mib(dev.total_bytes))
    table.add_row("used (nvidia-smi)", _mib(dev.device_used_bytes))
    table.add_row("free", _mib(dev.free_bytes))
    if dev.driver_reserved_bytes is not None:
        table.add_row("reserved by the driver", _mib(dev.driver_reserved_bytes))
    if dev.allocated_bytes is not None:
        table.add_row("allocated (this process)", _mib(dev.allocated_bytes))
    if dev.allocator_reserved_bytes is not None:
        table.add_row("held by the allocator", _mib(dev.allocator_reserved_bytes))
    if dev.limit_bytes is not None:
        table.add_row("allocator limit", _mib(dev.limit_bytes))
    if dev.utilization_percent is not None:
        table.add_row("utilization", f"{dev.utilization_percent}%")
    return table


def _process_table(dev: DeviceSnapshot) -> Table:
    table = Table(title=f"processes on GPU {dev.index}", title_justify="left")
    for column in ("pid", "user", "name", "type", "used", "note"):
        table.add_column(column, justify="right" if column in ("pid", "used") else "left")
    for proc in dev.processes:
        table.add_row(
            str(proc.pid) if proc.pid is not None else "-",
            safe(proc.user or "?"),
            safe(proc.name or "?"),
            safe(proc.kind or "?"),
            _mib(proc.used_bytes),
            safe(proc.note or ""),
        )
    return table


def _show(snap: SystemSnapshot) -> None:
    if not snap.devices:
        reason = "; ".join(snap.notes[1:]) if len(snap.notes) > 1 else ""
        line = snap.notes[0] if snap.notes else "no GPU found"
        out_console.print(safe(f"{line}" + (f" ({reason})" if reason else "")))
        return
    header = f"source: {snap.source}, taken {snap.taken_at}"
    if snap.driver_version:
        header += f", driver {snap.driver_version}"
    if snap.cuda_version:
        header += f", CUDA {snap.cuda_version}"
    out_console.print(safe(header))
    for dev in snap.devices:
        out_console.print(_device_table(dev))
        if dev.processes:
            out_console.print(_process_table(dev))
        for note in dev.notes:
            err_console.print(f"note: {safe(note)}")
    for note in snap.notes:
        err_console.print(f"note: {safe(note)}")


def _load(arg: str) -> SystemSnapshot:
    """A saved snapshot from a file, or from stdin for ``-``."""
    text, source = read_input_text(arg, what="snapshot", hint=_SNAPSHOT_HINT, stdin=True)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
            key_path=source,
            hint=_SNAPSHOT_HINT,
        ) from exc
    except RecursionError:
        raise ConfigError(
            "not a snapshot: the JSON is nested too deeply to read",
            key_path=source,
            hint=_SNAPSHOT_HINT,
        ) from None
    return SystemSnapshot.from_dict(data)


def devices(
    from_json: str | None = typer.Option(
        None,
        "--from-json",
        metavar="FILE",
        help="Show a snapshot saved earlier (- reads it from stdin).",
    ),
    save: str | None = typer.Option(
        None,
        "--save",
        metavar="FILE",
        help="Also save the snapshot as JSON to FILE (a new file, or --force).",
    ),
    force: bool = FORCE_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Show each GPU's memory and processes (NVML, else torch); no GPU is not an error."""
    out = (
        Output.named(save, what="the snapshot", option="--save", force=force, inputs=[from_json])
        if save is not None
        else None
    )
    if out is not None:
        out.check()
    snap = _load(from_json) if from_json is not None else probe_all()
    if out is not None:
        out.write(json.dumps(snap.to_dict(), indent=2) + "\n")
    if as_json:
        print_json(snap.to_dict())
    else:
        _show(snap)
    if save is not None:
        err_console.print(f"saved {safe(save)}")


def register(app: typer.Typer) -> None:
    """Add ``memfit devices`` to ``app``."""
    app.command("devices")(devices)
