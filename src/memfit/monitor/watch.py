"""The data side of ``memfit watch``: frames from a device probe, with a history per GPU.

A :class:`Watcher` asks a :class:`~memfit.backends.base.DeviceProbe` for a snapshot each tick
and keeps the last few used-memory fractions of every device for a sparkline. Everything
here is plain data; ``memfit.cli.watch`` draws it with Rich.

>>> from memfit.backends.simulated import SimulatedDevice
>>> dev = SimulatedDevice("8GiB")
>>> watcher = Watcher(dev, history=4)
>>> dev.allocate(2 * 2**30); _ = watcher.frame()
>>> dev.allocate(4 * 2**30); frame = watcher.frame()
>>> frame.history[0], sparkline(frame.history[0])
((0.25, 0.75), '▃▆')
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memfit._checks import require_count
from memfit._userfiles import file_error, file_kind, not_a_file_error
from memfit.backends.base import DeviceProbe, DeviceSnapshot, SystemSnapshot
from memfit.errors import ConfigError
from memfit.monitor._ranks import rank_imbalance

__all__ = [
    "SPARK_CHARS",
    "WatchFrame",
    "Watcher",
    "append_log",
    "field_note",
    "frame_record",
    "sparkline",
    "used_fraction",
]

#: Eight block heights, lowest first.
SPARK_CHARS = "▁▂▃▄▅▆▇█"

#: Words that tie a snapshot note to a field shown by ``memfit watch``.
_FIELD_WORDS: dict[str, tuple[str, ...]] = {
    "memory": ("memory", "mig"),
    "reserved": ("reserved", "v1 call"),
    "utilization": ("utilization", "utilisation", "mig"),
    "processes": ("process", "namespace", "wddm", "wsl", "mig"),
}


def used_fraction(device: DeviceSnapshot) -> float | None:
    """Used share of a device's memory in ``[0, 1]``, or ``None`` when either is unknown."""
    if device.device_used_bytes is None or not device.total_bytes:
        return None
    return min(1.0, max(0.0, device.device_used_bytes / device.total_bytes))


def sparkline(values: Sequence[float | None], width: int | None = None) -> str:
    """Fractions in ``[0, 1]`` as block characters; ``None`` is a space.

    Args:
        values: The fractions, oldest first.
        width: Keep only the last ``width`` values.

    Returns:
        One character per value.

    >>> sparkline([0.0, 0.5, 1.0, None])
    '▁▅█ '
    """
    if width is not None:
        values = values[-width:] if width > 0 else []
    top = len(SPARK_CHARS) - 1
    out = []
    for value in values:
        if value is None:
            out.append(" ")
        else:
            clipped = min(1.0, max(0.0, value))
            out.append(SPARK_CHARS[round(clipped * top)])
    return "".join(out)


def field_note(device: DeviceSnapshot, field: str) -> str | None:
    """The first note of ``device`` that explains a missing ``field``, or ``None``.

    Args:
        device: The device.
        field: ``"memory"``, ``"reserved"``, ``"utilization"`` or ``"processes"``.

    Returns:
        The note, or ``None`` when no note mentions the field.
    """
    words = _FIELD_WORDS.get(field, (field,))
    for note in device.notes:
        lowered = note.lower()
        if any(word in lowered for word in words):
            return note
    return None


@dataclass(frozen=True)
class WatchFrame:
    """One tick of ``memfit watch``.

    Attributes:
        snapshot: What the probe saw (processes already filtered by pid when asked).
        time: ``time.time()`` of the tick.
        history: Per device index, the used fractions of the last ticks, oldest first
            (``None`` where the used memory was unknown).
        imbalance: With ``Watcher(imbalance=...)``: each device whose peak used memory is
            more than the threshold above the other devices' (median): ``{"device",
            "peak_bytes", "others_bytes", "excess", "since" (time), "since_frame"}``.
    """

    snapshot: SystemSnapshot
    time: float
    history: dict[int, tuple[float | None, ...]]
    imbalance: tuple[dict[str, Any], ...] = ()


class Watcher:
    """Take frames from a probe and keep a short history per device.

    Args:
        probe: Where the snapshots come from.
        history: Ticks kept per device (the sparkline's length).
        pids: Show only these processes (all when ``None`` or empty).
        imbalance: Flag a device whose peak used memory (since the watch began) is more than
            this fraction above the other devices' median (one rank per GPU under torchrun:
            the rank that will run out first); ``None``: off.

    Raises:
        ConfigError: When ``history`` is smaller than 1 or ``imbalance`` is not positive.
    """

    def __init__(
        self,
        probe: DeviceProbe,
        *,
        history: int = 60,
        pids: Iterable[int] | None = None,
        imbalance: float | None = None,
    ) -> None:
        if imbalance is not None and not (imbalance > 0 and imbalance < float("inf")):
            raise ConfigError(
                f"imbalance must be a positive fraction, not {imbalance!r}",
                key_path="--imbalance",
                hint="use --imbalance 0.2 to flag a GPU 20% above the others",
            )
        require_count("history", history, lo=1)
        self.probe = probe
        self.history_length = history
        self.pids = frozenset(pids) if pids else frozenset()
        self._history: dict[int, deque[float | None]] = {}
        self.imbalance = imbalance
        self._peaks: dict[int, int] = {}
        self._since: dict[int, tuple[float, int]] = {}
        self._frames = 0

    def frame(self) -> WatchFrame:
        """Take one snapshot and add it to the history.

        Returns:
            The frame.

        Raises:
            BackendUnavailable: When the probe cannot look (driver gone).
        """
        snapshot = self.probe.snapshot()
        if self.pids:
            snapshot = _filter_processes(snapshot, self.pids)
        for device in snapshot.devices:
            line = self._history.setdefault(device.index, deque(maxlen=self.history_length))
            line.append(used_fraction(device))
        history = {index: tuple(values) for index, values in self._history.items()}
        now = time.time()
        self._frames += 1
        flagged = self._imbalanced(snapshot, now) if self.imbalance is not None else ()
        return WatchFrame(snapshot=snapshot, time=now, history=history, imbalance=flagged)

    def _imbalanced(self, snapshot: SystemSnapshot, now: float) -> tuple[dict[str, Any], ...]:
        """Devices whose peak is above the others' by more than the threshold."""
        assert self.imbalance is not None
        for device in snapshot.devices:
            if device.device_used_bytes is not None:
                seen = self._peaks.get(device.index, 0)
                self._peaks[device.index] = max(seen, device.device_used_bytes)
        indices = sorted(self._peaks)
        found = {
            indices[i.rank]: i
            for i in rank_imbalance([self._peaks[i] for i in indices], self.imbalance)
        }
        for index in [i for i in self._since if i not in found]:
            del self._since[index]
        out = []
        for index, item in sorted(found.items()):
            since, frame = self._since.setdefault(index, (now, self._frames))
            out.append(
                {
                    "device": index,
                    "peak_bytes": item.peak_bytes,
                    "others_bytes": item.others_bytes,
                    "excess": round(item.excess, 4),
                    "since": since,
                    "since_frame": frame,
                }
            )
        return tuple(out)


def _filter_processes(snapshot: SystemSnapshot, pids: frozenset[int]) -> SystemSnapshot:
    devices = tuple(
        dataclasses.replace(device, processes=tuple(p for p in device.processes if p.pid in pids))
        for device in snapshot.devices
    )
    return dataclasses.replace(snapshot, devices=devices)


def frame_record(frame: WatchFrame) -> dict[str, Any]:
    """A frame as one JSON object: the snapshot's ``to_dict()`` plus ``time``.

    ``memfit report`` reads these lines back (as background samples over time).
    """
    record = frame.snapshot.to_dict()
    record["time"] = frame.time
    if frame.imbalance:
        record["imbalance"] = [dict(i) for i in frame.imbalance]
    return record


def append_log(path: str | Path, frame: WatchFrame) -> None:
    """Append a frame to a JSON-lines file.

    Args:
        path: The file (created when missing).
        frame: The frame.

    Raises:
        ConfigError: When the file cannot be written, or is not a regular file (a pipe, a
            device, a folder).
    """
    target = Path(path)
    line = (json.dumps(frame_record(frame), separators=(",", ":")) + "\n").encode("utf-8")
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NONBLOCK", 0)
    try:
        # Non-blocking: a named pipe with no reader fails at once instead of waiting forever.
        fd = os.open(target, flags, 0o666)
    except OSError as exc:
        raise file_error(exc, target, action="append to the log") from exc
    try:
        kind = file_kind(os.fstat(fd).st_mode)
        if kind is not None:
            raise not_a_file_error(target, kind, action="append to the log")
        os.write(fd, line)
    except OSError as exc:
        raise file_error(exc, target, action="append to the log") from exc
    finally:
        os.close(fd)
